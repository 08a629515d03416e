//! What an I/O failure on a SQLite ledger means, said without the path: after a command failed
//! with `DATABASE_IO_ERROR` (or `serve` with the key file's `KEY_ERROR`), the binary looks at
//! the files `--db` names and says which one is the problem — a missing directory, a file that
//! cannot be read or written, a directory SQLite cannot create its `-wal`/`-shm` files in, or a
//! key file that cannot be read.

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use toolledger_cli::common::StoreConfig;
use toolledger_cli::exit::Failure;

/// Whether the calling process may access `path` in `mode` (`libc::R_OK`, `libc::W_OK`).
fn may(path: &Path, mode: libc::c_int) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
    unsafe { libc::access(c.as_ptr(), mode) == 0 }
}

/// Whether the file system holding `path` is mounted read-only.
fn read_only_file_system(path: &Path) -> bool {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return false;
    };
    let mut buf: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: `c` is a valid NUL-terminated path and `buf` a properly sized out-parameter.
    let rc = unsafe { libc::statvfs(c.as_ptr(), &mut buf) };
    rc == 0 && buf.f_flag & libc::ST_RDONLY != 0
}

/// The directory a file of `path` lives in (`.` for a bare file name).
fn dir_of(path: &Path) -> &Path {
    match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    }
}

/// Why the SQLite ledger `db` cannot be opened or created, as a path-free sentence; `None`
/// when the files look usable (the failure was elsewhere).
pub fn database_file(db: &Path) -> Option<&'static str> {
    let dir = dir_of(db);
    if !dir.exists() {
        return Some(
            "the directory --db names does not exist; create it first (the ledger file is \
             created on first use, its directory is not)",
        );
    }
    if !dir.is_dir() {
        return Some("the parent of --db is not a directory");
    }
    if db.is_dir() {
        return Some("--db names a directory; name the ledger file inside it");
    }
    if db.exists() {
        if !may(db, libc::R_OK) {
            return Some("the database file is not readable by this user");
        }
        if read_only_file_system(dir) {
            return Some(
                "the file system holding the database is mounted read-only; the read-only \
                 commands (operations, status, audit) still work",
            );
        }
        if !may(db, libc::W_OK) {
            return Some("the database file is not writable by this user");
        }
        if !may(dir, libc::W_OK) {
            return Some(
                "the database's directory is not writable by this user; SQLite keeps its -wal \
                 and -shm files beside the database",
            );
        }
        return None;
    }
    if !may(dir, libc::W_OK) {
        return Some(
            "the database file does not exist and its directory is not writable by this user, \
             so it cannot be created",
        );
    }
    None
}

/// Why the key file beside the SQLite ledger `db` cannot be used, as a path-free sentence.
pub fn key_file(db: &Path) -> Option<&'static str> {
    let keys = toolledger_mcp::KeyMaterial::file_path(db);
    if keys.exists() {
        if keys.is_dir() || !may(&keys, libc::R_OK) {
            return Some("the key file beside the database is not readable by this user");
        }
        return Some(
            "the key file beside the database could not be parsed; restore it from a backup \
             (its keys sealed this database's continuations and fingerprints)",
        );
    }
    if !may(dir_of(db), libc::W_OK) {
        return Some(
            "there is no key file beside the database and its directory is not writable, so \
             one cannot be created",
        );
    }
    None
}

/// `failure` with a sentence saying which file is the problem when it is an I/O failure on
/// the SQLite ledger `config` names (or, for `serve`, on its key file).
pub fn explain(failure: Failure, config: &StoreConfig, serving: bool) -> Failure {
    let Some(db) = config.sqlite_path() else {
        return failure;
    };
    match &failure {
        Failure::Code(code) if code == "DATABASE_IO_ERROR" => {
            let why = database_file(db).or_else(|| serving.then(|| key_file(db)).flatten());
            match why {
                Some(message) => Failure::explained("DATABASE_IO_ERROR", message),
                None => failure,
            }
        }
        Failure::Explained { code, message }
            if *code == "KEY_ERROR"
                && serving
                && *message == toolledger_mcp::KeyError::File.to_string() =>
        {
            match database_file(db).or_else(|| key_file(db)) {
                Some(message) => Failure::explained("KEY_ERROR", message),
                None => failure,
            }
        }
        _ => failure,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_directory_and_a_directory_given_as_the_file_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let missing = dir.path().join("nope").join("ledger.sqlite");
        assert!(database_file(&missing).unwrap().contains("does not exist"));
        assert!(database_file(dir.path())
            .unwrap()
            .contains("names a directory"));
        assert_eq!(database_file(&dir.path().join("new.sqlite")), None);
    }

    #[test]
    fn a_damaged_key_file_is_named_without_its_path() {
        let dir = tempfile::tempdir().unwrap();
        let db = dir.path().join("ledger.sqlite");
        assert_eq!(key_file(&db), None);
        std::fs::write(toolledger_mcp::KeyMaterial::file_path(&db), b"not json").unwrap();
        let why = key_file(&db).unwrap();
        assert!(why.contains("could not be parsed"), "{why}");
        assert!(!why.contains(dir.path().to_str().unwrap()));
    }
}
