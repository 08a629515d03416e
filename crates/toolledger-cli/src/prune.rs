//! The pruning flags `prune`, `serve`, `proxy` and `worker` share: the tombstone horizon
//! (`--tombstone-ttl DUR|never`) and the background pruner's interval (`--prune-interval`).
//! What pruning does is the library's ([`toolledger::prune`]).

use std::time::Duration;

use toolledger::clock::SharedClock;
use toolledger::prune::{PruneOptions, DEFAULT_INTERVAL_SECS};
use toolledger::store::Store;

/// A tombstone horizon: seconds after the retention deadline, or never.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct TombstoneTtl(pub Option<i64>);

/// Parses a tombstone horizon: `never`, whole seconds, or a number with a unit `s`, `m`, `h`
/// or `d` (`30d`, `12h`).
pub fn parse_ttl(text: &str) -> Result<TombstoneTtl, String> {
    if text == "never" {
        return Ok(TombstoneTtl(None));
    }
    let (digits, unit) = match text.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => (&text[..i], c),
        _ => (text, 's'),
    };
    let factor = match unit {
        's' => 1,
        'm' => 60,
        'h' => 3_600,
        'd' => 86_400,
        _ => return Err("the unit must be s, m, h or d".into()),
    };
    let n: i64 = digits.parse().ok().filter(|n| *n >= 0).ok_or(
        "expected `never`, or a whole number of seconds with an optional unit s, m, h or d",
    )?;
    n.checked_mul(factor)
        .filter(|s| *s <= toolledger::runtime::MAX_TTL_SECONDS)
        .map(|s| TombstoneTtl(Some(s)))
        .ok_or_else(|| "at most ten years".into())
}

/// The background pruner of a long-running command (`serve`, `proxy`, `worker`).
#[derive(clap::Args, Debug, Clone)]
pub struct PruneFlags {
    /// Seconds from the start of one pass of the background pruner to the start of the next;
    /// it compacts settled operations past their retention deadline to tombstones and deletes
    /// tombstones past the horizon (the first pass runs one interval after start, a pass that
    /// runs longer than the interval is followed at once by the next; 0 turns it off). One
    /// pruner works at a time per ledger; the others' passes end at once.
    #[arg(long, value_name = "SECONDS", default_value_t = DEFAULT_INTERVAL_SECS)]
    pub prune_interval: u64,
    /// How long a tombstone keeps its key after the retention deadline: seconds, or with a
    /// unit (`30d`, `12h`), or `never`. After it, the key is forgotten and may be used again.
    #[arg(long, value_name = "DUR|never", default_value = "30d", value_parser = parse_ttl)]
    pub tombstone_ttl: TombstoneTtl,
}

/// A running background pruner (or none, with `--prune-interval 0`).
#[must_use = "stop it before the command returns, so that its ledger handle is released"]
pub struct Pruner(Option<tokio::task::JoinHandle<()>>);

impl Pruner {
    /// No pruner.
    pub fn none() -> Pruner {
        Pruner(None)
    }

    /// Stops the pruner (a pass in flight is abandoned: its open transaction rolls back) and
    /// waits until its ledger handle is dropped, so the ledger closes cleanly on exit.
    pub async fn stop(self) {
        if let Some(task) = self.0 {
            task.abort();
            let _ = task.await;
        }
    }
}

impl PruneFlags {
    /// Starts the background pruner on the current tokio runtime (unless the interval is 0).
    pub fn spawn(&self, store: &Store, clock: &SharedClock) -> Pruner {
        if self.prune_interval == 0 {
            return Pruner(None);
        }
        let opts = PruneOptions::background(self.tombstone_ttl.0);
        Pruner(Some(tokio::spawn(toolledger::prune::run_every(
            store.clone(),
            clock.clone(),
            opts,
            Duration::from_secs(self.prune_interval),
            std::future::pending::<()>(),
        ))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn horizons_parse_with_units_and_never() {
        assert_eq!(parse_ttl("never"), Ok(TombstoneTtl(None)));
        assert_eq!(parse_ttl("90"), Ok(TombstoneTtl(Some(90))));
        assert_eq!(parse_ttl("90s"), Ok(TombstoneTtl(Some(90))));
        assert_eq!(parse_ttl("2m"), Ok(TombstoneTtl(Some(120))));
        assert_eq!(parse_ttl("3h"), Ok(TombstoneTtl(Some(10_800))));
        assert_eq!(parse_ttl("30d"), Ok(TombstoneTtl(Some(2_592_000))));
        for bad in ["", "d", "-1", "1w", "1.5h", "Never", "99999d"] {
            assert!(parse_ttl(bad).is_err(), "{bad}");
        }
    }
}
