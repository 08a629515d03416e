//! Reading the acknowledgement stream of `toolledger bench --ack-db/--ack-schema` (shared by
//! the crash tests).

use std::collections::HashSet;
use std::io::{BufRead, BufReader, Read};

/// Reads acknowledged keys from `out` until it ends, and calls `kill` once, as soon as
/// `threshold` keys are in. A line cut by the kill was never fully acknowledged and is not
/// counted; lines already in the pipe at the kill are. Returns the keys and whether `kill`
/// was called.
pub fn read_acks(
    out: impl Read,
    threshold: usize,
    mut kill: impl FnMut(),
) -> (HashSet<String>, bool) {
    let mut reader = BufReader::new(out);
    let mut acked = HashSet::new();
    let mut line = String::new();
    let mut killed = false;
    loop {
        line.clear();
        if reader.read_line(&mut line).unwrap() == 0 {
            break;
        }
        if let Some(key) = line.strip_suffix('\n') {
            assert!(key.starts_with("ack-"), "unexpected output {key:?}");
            acked.insert(key.to_string());
        }
        if !killed && acked.len() >= threshold {
            kill();
            killed = true;
        }
    }
    (acked, killed)
}
