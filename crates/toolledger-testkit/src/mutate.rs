//! Byte-string mutation for property tests: random edits ([`Edit`]) of a valid input — a
//! JSON document, a JSON-RPC line, a sealed token — made with bytes from a strategy of the
//! test's own (the characters that matter to the parser under test, say).
//!
//! ```
//! use proptest::prelude::*;
//! use proptest::test_runner::TestRunner;
//! use toolledger_testkit::mutate::edits;
//!
//! let strategy = edits(prop::sample::select(b"{}[],:\"0".to_vec()), 1..6);
//! TestRunner::default()
//!     .run(&strategy, |edits| {
//!         let mut bytes = br#"{"a":[1,2]}"#.to_vec();
//!         for e in &edits {
//!             e.apply(&mut bytes);
//!             let _ = serde_json::from_slice::<serde_json::Value>(&bytes);
//!         }
//!         Ok(())
//!     })
//!     .unwrap();
//! ```

use proptest::prelude::*;
use proptest::sample::SizeRange;

/// One edit of a byte string. Positions are taken modulo the length at the time of the edit,
/// so every edit applies to any string; replacing or deleting in an empty one does nothing.
#[derive(Clone, Debug)]
pub enum Edit {
    /// The byte at the position becomes this one.
    Replace(usize, u8),
    /// This byte is inserted at the position (the end included).
    Insert(usize, u8),
    /// The byte at the position is removed.
    Delete(usize),
    /// Everything from the position on (the end included) is cut off.
    Truncate(usize),
}

impl Edit {
    /// Applies the edit to `bytes`.
    pub fn apply(&self, bytes: &mut Vec<u8>) {
        let n = bytes.len();
        match *self {
            Edit::Replace(i, b) if n > 0 => bytes[i % n] = b,
            Edit::Insert(i, b) => bytes.insert(i % (n + 1), b),
            Edit::Delete(i) if n > 0 => {
                bytes.remove(i % n);
            }
            Edit::Truncate(i) => bytes.truncate(i % (n + 1)),
            _ => {}
        }
    }
}

/// One edit at any position, of the four kinds alike, inserting or writing bytes `byte`
/// generates.
pub fn edit<S>(byte: S) -> impl Strategy<Value = Edit>
where
    S: Strategy<Value = u8> + Clone,
{
    prop_oneof![
        (any::<usize>(), byte.clone()).prop_map(|(i, b)| Edit::Replace(i, b)),
        (any::<usize>(), byte).prop_map(|(i, b)| Edit::Insert(i, b)),
        any::<usize>().prop_map(Edit::Delete),
        any::<usize>().prop_map(Edit::Truncate),
    ]
}

/// A sequence of [`edit`]s, as many as `count` allows (`1..6`, say).
pub fn edits<S>(byte: S, count: impl Into<SizeRange>) -> impl Strategy<Value = Vec<Edit>>
where
    S: Strategy<Value = u8> + Clone,
{
    prop::collection::vec(edit(byte), count)
}
