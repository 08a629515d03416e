//! Key material: the `requestState` sealing keyring and the fingerprint key.
//!
//! Keys come from `TOOLLEDGER_STATE_KEY_HEX` and `TOOLLEDGER_FINGERPRINT_KEY_HEX` (hex, at least
//! 32 bytes each). `TOOLLEDGER_STATE_KEY_HEX` may list several comma-separated keys: the first
//! seals new continuation tokens, every listed key still opens the tokens it sealed, so keys
//! rotate without breaking live continuations. When a variable is unset, the key is read from a
//! key file beside the database (`<db>.keys`, mode 0600), which is created once with fresh random
//! keys and reused afterwards, so continuations survive restarts.
//!
//! Keys are bound to the database when a [`crate::LedgerGuard`] is opened: the first server records the ids of its keys
//! ([`key_id`]: a hash prefix that names a key without revealing it) in the ledger's `key_ids`
//! table, and every later start checks them. A server whose fingerprint key is not the
//! database's refuses to start (`KEY_MISMATCH`) — its fingerprints would never match the
//! stored ones, and every exact replay would be a false `operation_conflict` — and so does a
//! server none of whose state keys the database has seen. State keys rotate: list the new key
//! before the old one (`TOOLLEDGER_STATE_KEY_HEX=new,old`) for one start, and the new key is
//! recorded; afterwards it may stand alone. The fingerprint key does not rotate: it is the
//! database's for its lifetime, kept in the key file beside it or in the environment.

use std::io::Write;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use toolledger::effect::EffectTx;
use toolledger::model::Error;
use toolledger::store::Store;
use toolledger_core::key_ids::KeyCheck;

/// Environment variable holding the state-sealing key(s).
pub(crate) const STATE_KEY_ENV: &str = "TOOLLEDGER_STATE_KEY_HEX";
/// Environment variable holding the fingerprint key.
pub(crate) const FINGERPRINT_KEY_ENV: &str = "TOOLLEDGER_FINGERPRINT_KEY_HEX";
/// Smallest accepted key, in bytes.
pub(crate) const MIN_KEY_BYTES: usize = 32;

/// Why keys could not be loaded. Messages name no paths and no key bytes.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum KeyError {
    /// A key was not valid hex.
    #[error("{0} is not valid hex")]
    NotHex(&'static str),
    /// A key was shorter than 32 bytes.
    #[error("{0} must hold at least 32 bytes")]
    TooShort(&'static str),
    /// The key file could not be read, created or parsed.
    #[error("the key file beside the database could not be read or created")]
    File,
    /// A key variable is unset and there is no key file to fall back on (a PostgreSQL ledger
    /// has none): names the unset variables and how to make a key.
    #[error("{}", unset_message(*.state, *.fingerprint))]
    Unset {
        /// `TOOLLEDGER_STATE_KEY_HEX` is unset.
        state: bool,
        /// `TOOLLEDGER_FINGERPRINT_KEY_HEX` is unset.
        fingerprint: bool,
    },
    /// The key file is readable by others.
    #[error("the key file beside the database must have mode 0600")]
    Permissions,
    /// The fingerprint key is not the one the database was written with.
    #[error(
        "the fingerprint key is not the one this database was written with (its key id is \
         {expected}); start with the key file or TOOLLEDGER_FINGERPRINT_KEY_HEX the database \
         was created with"
    )]
    FingerprintMismatch {
        /// The id the database recorded.
        expected: String,
    },
    /// None of the state keys is one the database has seen.
    #[error(
        "none of the requestState keys is one this database has seen; to rotate, list the new \
         key before the old one in TOOLLEDGER_STATE_KEY_HEX for one start"
    )]
    StateMismatch,
    /// The key ids could not be read or recorded.
    #[error("the key ids could not be read or recorded in the database")]
    Store,
}

fn unset_message(state: bool, fingerprint: bool) -> String {
    let unset = match (state, fingerprint) {
        (true, true) => format!("{STATE_KEY_ENV} and {FINGERPRINT_KEY_ENV} are"),
        (true, false) => format!("{STATE_KEY_ENV} is"),
        _ => format!("{FINGERPRINT_KEY_ENV} is"),
    };
    format!(
        "{unset} not set, and there is no key file to fall back on (a PostgreSQL ledger has \
         none): set each to 32 random bytes in hex (`openssl rand -hex 32` makes one), the same \
         on every server of the ledger"
    )
}

/// The check-and-record of [`bind_blocking`] as a transaction body (retried as a whole on a transient
/// error; it checks everything before writing anything).
fn bind_job(
    keys: &KeyMaterial,
    now: i64,
) -> impl FnMut(&mut dyn EffectTx) -> Result<Result<(), KeyError>, Error> + Send + 'static {
    let fingerprint = key_id(&keys.fingerprint_key);
    let state: Vec<String> = keys.state_keys.iter().map(|k| key_id(k)).collect();
    move |tx| {
        Ok(
            match toolledger_core::key_ids::check_and_record(tx, &fingerprint, &state, now)? {
                KeyCheck::Recorded | KeyCheck::Matched => Ok(()),
                KeyCheck::FingerprintMismatch { expected } => {
                    Err(KeyError::FingerprintMismatch { expected })
                }
                KeyCheck::StateMismatch => Err(KeyError::StateMismatch),
            },
        )
    }
}

/// Binds `keys` to the database of `store` at time `now`: records their ids when the database
/// has none, else checks them (see the module docs). Nothing is written on a mismatch. It
/// waits on a thread of its own, so it may also be called from a thread that drives an async
/// runtime (e.g. while a server is being built).
pub(crate) fn bind_blocking(store: &Store, keys: &KeyMaterial, now: i64) -> Result<(), KeyError> {
    let job = bind_job(keys, now);
    std::thread::scope(|s| {
        s.spawn(|| store.write_blocking(job))
            .join()
            .unwrap_or(Ok(Err(KeyError::Store)))
    })
    .map_err(|_: Error| KeyError::Store)?
}

/// The keys a guarded server needs.
#[derive(Clone)]
pub struct KeyMaterial {
    /// State-sealing keys, the active one first.
    pub state_keys: Vec<Vec<u8>>,
    /// The fingerprint HMAC key.
    pub fingerprint_key: Vec<u8>,
}

impl std::fmt::Debug for KeyMaterial {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyMaterial")
            .field("state_keys", &self.state_keys.len())
            .field("fingerprint_key", &"<redacted>")
            .finish()
    }
}

#[derive(Serialize, Deserialize)]
struct KeyFile {
    state_key_hex: String,
    fingerprint_key_hex: String,
}

fn parse_hex(name: &'static str, value: &str) -> Result<Vec<u8>, KeyError> {
    let bytes = hex::decode(value.trim()).map_err(|_| KeyError::NotHex(name))?;
    if bytes.len() < MIN_KEY_BYTES {
        return Err(KeyError::TooShort(name));
    }
    Ok(bytes)
}

/// A stable key id for a state key: the first 8 bytes of its SHA-256, in hex.
pub(crate) fn key_id(key: &[u8]) -> String {
    hex::encode(&Sha256::digest(key)[..8])
}

/// The key file that belongs to database `db`.
pub(crate) fn key_file_path(db: &Path) -> PathBuf {
    let mut name = db.file_name().map(|n| n.to_os_string()).unwrap_or_default();
    name.push(".keys");
    db.with_file_name(name)
}

fn random_key() -> String {
    let mut key = [0u8; 32];
    getrandom::fill(&mut key).expect("the operating system's random source");
    hex::encode(key)
}

#[cfg(unix)]
fn check_mode(path: &Path) -> Result<(), KeyError> {
    use std::os::unix::fs::PermissionsExt;
    let meta = std::fs::metadata(path).map_err(|_| KeyError::File)?;
    if meta.permissions().mode() & 0o077 != 0 {
        return Err(KeyError::Permissions);
    }
    Ok(())
}

#[cfg(not(unix))]
fn check_mode(_path: &Path) -> Result<(), KeyError> {
    Ok(())
}

/// Reads the key file beside `db`, creating it (mode 0600) on first use. Creation is atomic:
/// the keys are written to a private temporary file that is then hard-linked into place, so two
/// processes starting at once end up with the same keys.
pub(crate) fn load_or_create_key_file(db: &Path) -> Result<(Vec<u8>, Vec<u8>), KeyError> {
    let path = key_file_path(db);
    if !path.exists() {
        let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
        let dir = dir.unwrap_or_else(|| Path::new("."));
        let mut tmp = tempfile::Builder::new()
            .prefix(".toolledger-keys")
            .tempfile_in(dir)
            .map_err(|_| KeyError::File)?;
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            std::fs::set_permissions(tmp.path(), std::fs::Permissions::from_mode(0o600))
                .map_err(|_| KeyError::File)?;
        }
        let body = serde_json::to_vec(&KeyFile {
            state_key_hex: random_key(),
            fingerprint_key_hex: random_key(),
        })
        .map_err(|_| KeyError::File)?;
        tmp.write_all(&body).map_err(|_| KeyError::File)?;
        tmp.as_file().sync_all().map_err(|_| KeyError::File)?;
        // Losing the race is fine: the winner's file is read below.
        let _ = std::fs::hard_link(tmp.path(), &path);
    }
    check_mode(&path)?;
    let text = std::fs::read(&path).map_err(|_| KeyError::File)?;
    let file: KeyFile = serde_json::from_slice(&text).map_err(|_| KeyError::File)?;
    Ok((
        parse_hex("the key file's state key", &file.state_key_hex)?,
        parse_hex("the key file's fingerprint key", &file.fingerprint_key_hex)?,
    ))
}

impl KeyMaterial {
    /// The key file [`KeyMaterial::load`] reads (and creates on first use) beside the SQLite
    /// database `db`: `db`'s file name with `.keys` appended, in the same directory.
    pub fn file_path(db: &Path) -> PathBuf {
        key_file_path(db)
    }

    /// Keys from the environment, falling back to the key file beside `db` for any that is
    /// unset. With `db = None` both variables are required ([`KeyError::Unset`] names the
    /// missing ones).
    pub fn load(db: Option<&Path>) -> Result<Self, KeyError> {
        Self::from_values(
            std::env::var(STATE_KEY_ENV).ok(),
            std::env::var(FINGERPRINT_KEY_ENV).ok(),
            db,
        )
    }

    /// Keys from explicit values (as the environment would give them), falling back to the key
    /// file beside `db`.
    pub fn from_values(
        state_hex: Option<String>,
        fingerprint_hex: Option<String>,
        db: Option<&Path>,
    ) -> Result<Self, KeyError> {
        let state_hex = state_hex.filter(|s| !s.trim().is_empty());
        let fingerprint_hex = fingerprint_hex.filter(|s| !s.trim().is_empty());
        let file = if state_hex.is_none() || fingerprint_hex.is_none() {
            match db {
                Some(db) => Some(load_or_create_key_file(db)?),
                None => {
                    return Err(KeyError::Unset {
                        state: state_hex.is_none(),
                        fingerprint: fingerprint_hex.is_none(),
                    })
                }
            }
        } else {
            None
        };
        let state_keys = match state_hex {
            Some(list) => list
                .split(',')
                .map(|k| parse_hex(STATE_KEY_ENV, k))
                .collect::<Result<Vec<_>, _>>()?,
            None => vec![file.as_ref().map(|f| f.0.clone()).unwrap_or_default()],
        };
        let fingerprint_key = match fingerprint_hex {
            Some(k) => parse_hex(FINGERPRINT_KEY_ENV, &k)?,
            None => file.map(|f| f.1).unwrap_or_default(),
        };
        Ok(KeyMaterial {
            state_keys,
            fingerprint_key,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_file_is_created_once_private_and_reused() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.sqlite");
        let a = KeyMaterial::from_values(None, None, Some(&db)).unwrap();
        let b = KeyMaterial::from_values(None, None, Some(&db)).unwrap();
        assert_eq!(a.state_keys, b.state_keys);
        assert_eq!(a.fingerprint_key, b.fingerprint_key);
        assert_eq!(a.fingerprint_key.len(), 32);
        assert_ne!(a.state_keys[0], a.fingerprint_key);
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(key_file_path(&db))
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o600);
        }
    }

    #[test]
    fn environment_keys_win_and_short_or_bad_keys_are_refused() {
        let good = "ab".repeat(32);
        let k = KeyMaterial::from_values(
            Some(format!("{good},{}", "cd".repeat(40))),
            Some(good.clone()),
            None,
        )
        .unwrap();
        assert_eq!(k.state_keys.len(), 2);
        assert_eq!(
            KeyMaterial::from_values(Some("ab".repeat(31)), Some(good.clone()), None).unwrap_err(),
            KeyError::TooShort(STATE_KEY_ENV)
        );
        assert_eq!(
            KeyMaterial::from_values(Some(good.clone()), Some("zz".repeat(32)), None).unwrap_err(),
            KeyError::NotHex(FINGERPRINT_KEY_ENV)
        );
        let unset = KeyMaterial::from_values(Some(good), None, None).unwrap_err();
        assert_eq!(
            unset,
            KeyError::Unset {
                state: false,
                fingerprint: true
            }
        );
        let message = unset.to_string();
        assert!(
            message.starts_with("TOOLLEDGER_FINGERPRINT_KEY_HEX is not set"),
            "{message}"
        );
        assert!(!message.contains(STATE_KEY_ENV), "{message}");
        let both = KeyMaterial::from_values(None, Some(String::new()), None)
            .unwrap_err()
            .to_string();
        assert!(
            both.starts_with(
                "TOOLLEDGER_STATE_KEY_HEX and TOOLLEDGER_FINGERPRINT_KEY_HEX are not set"
            ),
            "{both}"
        );
        assert!(both.contains("`openssl rand -hex 32`"), "{both}");
    }

    #[cfg(unix)]
    #[test]
    fn a_key_file_readable_by_others_is_refused() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.sqlite");
        KeyMaterial::from_values(None, None, Some(&db)).unwrap();
        std::fs::set_permissions(key_file_path(&db), std::fs::Permissions::from_mode(0o644))
            .unwrap();
        assert_eq!(
            KeyMaterial::from_values(None, None, Some(&db)).unwrap_err(),
            KeyError::Permissions
        );
    }
}
