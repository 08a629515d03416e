//! The ids of the keys a ledger was written with (the `key_ids` table).
//!
//! A key's id names it without revealing it (callers use a hash prefix). The fingerprint key's
//! id is recorded once: the ledger's fingerprints are only comparable under that key. Every
//! state key that was ever active is recorded, so a rotation (a new key configured beside a
//! recorded one) is recognised. [`check_and_record`] checks before it writes: on a mismatch
//! nothing is written.

use crate::effect::{EffectTx, RowExt};
use crate::model::Error;

/// What [`check_and_record`] found.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyCheck {
    /// No keys were recorded: these are now the ledger's keys.
    Recorded,
    /// The keys are the ledger's (a rotated-in state key may have been recorded).
    Matched,
    /// The fingerprint key is not the ledger's; `expected` is the recorded id.
    FingerprintMismatch {
        /// The recorded fingerprint key id.
        expected: String,
    },
    /// None of the state keys is one the ledger has recorded.
    StateMismatch,
}

/// Checks the key ids `fingerprint` and `state` against the ledger's and records what is new
/// (the first fingerprint key, state keys not seen before) at `now`. Run it in a write
/// transaction; it writes only when the answer is `Recorded` or `Matched`.
pub fn check_and_record(
    tx: &mut dyn EffectTx,
    fingerprint: &str,
    state: &[String],
    now: i64,
) -> Result<KeyCheck, Error> {
    let mut known_fingerprint = Vec::new();
    let mut known_state = Vec::new();
    for row in tx.query("SELECT purpose, key_id FROM key_ids", &[])? {
        match row.text(0)?.as_str() {
            "fingerprint" => known_fingerprint.push(row.text(1)?),
            _ => known_state.push(row.text(1)?),
        }
    }
    if let Some(expected) = known_fingerprint.first() {
        if !known_fingerprint.iter().any(|id| id == fingerprint) {
            return Ok(KeyCheck::FingerprintMismatch {
                expected: expected.clone(),
            });
        }
    }
    if !known_state.is_empty() && !state.iter().any(|id| known_state.contains(id)) {
        return Ok(KeyCheck::StateMismatch);
    }
    let fresh = known_fingerprint.is_empty();
    let mut record = |purpose: &str, id: &str| {
        tx.execute(
            "INSERT INTO key_ids(purpose, key_id, recorded_at) VALUES (?1, ?2, ?3)",
            &[purpose.into(), id.into(), now.into()],
        )
    };
    if fresh {
        record("fingerprint", fingerprint)?;
    }
    for id in state.iter().filter(|id| !known_state.contains(id)) {
        record("state", id)?;
    }
    Ok(if fresh {
        KeyCheck::Recorded
    } else {
        KeyCheck::Matched
    })
}
