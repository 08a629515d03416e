//! Read-only opens ([`OpenOptions::read_only`]): inspecting a ledger without changing the file
//! system.
//!
//! A read-only open creates no file, writes nothing and runs no migration: the file must
//! exist, start with SQLite's header and hold a ledger at exactly the schema this program
//! knows ([`migrate::check`]); an empty file, a file that is not a database and a database of
//! another application are [`StoreError::NotALedger`]. There is no write connection; a write
//! job is refused.
//!
//! A WAL database is read through its shared-memory index (`-shm`), which SQLite creates
//! beside the file when it is missing — even for a read-only connection. So the connection
//! depends on what is there ([`ReadMode`]): when the write-ahead log exists (a process has
//! the ledger open, or left its log), the connection reads with `mode=ro` and uses the files
//! that are there; when it does not, nothing is writing the file and it is read with
//! `immutable=1`, which needs no side file. Before every read an immutable store checks that
//! no log has appeared since (a writer opened the ledger meanwhile: `unavailable`, run the
//! command again).

use std::io::Read;

use super::*;

/// How a read-only store's connections read the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ReadMode {
    /// The write-ahead log exists: `mode=ro` over the existing log and index.
    Shared,
    /// No write-ahead log: `mode=ro&immutable=1`, no side file needed or created.
    Immutable,
}

/// The file's write-ahead log.
fn wal_path(path: &Path) -> PathBuf {
    let mut p = path.as_os_str().to_os_string();
    p.push("-wal");
    PathBuf::from(p)
}

impl ReadMode {
    fn of(path: &Path) -> ReadMode {
        if wal_path(path).exists() {
            ReadMode::Shared
        } else {
            ReadMode::Immutable
        }
    }
}

/// A `file:` URI for `path` with the query `query` (bytes outside the unreserved set
/// percent-encoded, so `?`, `#` and `%` in a path stay part of it).
fn uri(path: &Path, query: &str) -> String {
    use std::os::unix::ffi::OsStrExt;
    let mut out = String::from("file:");
    for &b in path.as_os_str().as_bytes() {
        if b.is_ascii_alphanumeric() || b"/-_.~".contains(&b) {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out.push('?');
    out.push_str(query);
    out
}

/// Opens one read-only connection in `mode` with the ledger's reading pragmas.
pub(crate) fn connect(path: &Path, mode: ReadMode) -> Result<Connection, StoreError> {
    let query = match mode {
        ReadMode::Shared => "mode=ro",
        ReadMode::Immutable => "mode=ro&immutable=1",
    };
    let conn = Connection::open_with_flags(
        uri(path, query),
        OpenFlags::SQLITE_OPEN_READ_ONLY
            | OpenFlags::SQLITE_OPEN_NO_MUTEX
            | OpenFlags::SQLITE_OPEN_URI,
    )
    .map_err(|e| match map_err(e) {
        StoreError::Failed { .. } => StoreError::Io,
        other => other,
    })?;
    conn.busy_timeout(Duration::from_millis(5000))
        .map_err(map_err)?;
    conn.execute_batch("PRAGMA query_only=ON; PRAGMA synchronous=FULL; PRAGMA foreign_keys=ON;")
        .map_err(map_err)?;
    conn.set_db_config(
        rusqlite::config::DbConfig::SQLITE_DBCONFIG_ENABLE_QPSG,
        true,
    )
    .map_err(map_err)?;
    conn.set_prepared_statement_cache_capacity(64);
    Ok(conn)
}

/// Refuses a read on an immutable store once a write-ahead log has appeared: a writer opened
/// the ledger after this store did, and the file may change under the read.
pub(crate) fn still_readable(path: &Path, mode: Option<ReadMode>) -> Result<(), StoreError> {
    if mode == Some(ReadMode::Immutable) && wal_path(path).exists() {
        return Err(StoreError::Unavailable(
            "a writer opened the ledger meanwhile; run the command again".into(),
        ));
    }
    Ok(())
}

/// The error a write job on a read-only store gets.
pub(crate) fn refused_write() -> StoreError {
    StoreError::Failed {
        backend: Dialect::Sqlite,
        reason: "the store is open read-only".into(),
    }
}

/// The journal mode as the file's header says (bytes 18 and 19 are 2 in WAL mode), for an
/// immutable connection, which reports `delete` whatever the file says; `None` otherwise.
pub(crate) fn journal_mode(path: &Path, mode: Option<ReadMode>) -> Option<String> {
    if mode != Some(ReadMode::Immutable) {
        return None;
    }
    let header = read_header(path).ok()?;
    Some(if header[18] == 2 && header[19] == 2 {
        "wal".into()
    } else {
        "delete".into()
    })
}

/// The first 100 bytes of the file; `NotALedger` when it is shorter or not a SQLite file.
pub(crate) fn read_header(path: &Path) -> Result<[u8; 100], StoreError> {
    let mut f = std::fs::File::open(path).map_err(|_| StoreError::Io)?;
    let mut header = [0u8; 100];
    let mut filled = 0;
    while filled < header.len() {
        match f.read(&mut header[filled..]) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(_) => return Err(StoreError::Io),
        }
    }
    if filled < header.len() || &header[..16] != b"SQLite format 3\0" {
        return Err(StoreError::NotALedger("not a SQLite database".into()));
    }
    Ok(header)
}

/// Refuses, before a writable open touches it, a file that exists and holds no ledger: one
/// that is not SQLite, or a SQLite database in rollback-journal mode (a ledger is always in
/// WAL mode) with tables but without the ledger's bookkeeping — another application's. Its
/// schema is read over a read-only connection, closed before the writable open, so the file
/// is left exactly as it was. A missing or empty file (a new ledger), a directory (an I/O
/// error for the open to report) and a file in WAL mode (checked by the bootstrap, which
/// changes nothing when it refuses) pass.
pub(crate) fn refuse_foreign(path: &Path) -> Result<(), StoreError> {
    let Ok(meta) = std::fs::metadata(path) else {
        return Ok(());
    };
    if !meta.is_file() || meta.len() == 0 {
        return Ok(());
    }
    let header = read_header(path)?;
    if header[18] == 2 && header[19] == 2 {
        return Ok(());
    }
    let conn = Connection::open_with_flags(
        path,
        OpenFlags::SQLITE_OPEN_READ_ONLY | OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(map_err)?;
    let count = |sql: &str| -> Result<i64, StoreError> {
        conn.query_row(sql, [], |r| r.get(0))
            .map_err(|e| match map_err(e) {
                StoreError::Failed { .. } => StoreError::Corrupt("unreadable schema".into()),
                other => other,
            })
    };
    let tables = count("SELECT count(*) FROM sqlite_schema WHERE type='table'")?;
    let bookkeeping =
        count("SELECT count(*) FROM sqlite_schema WHERE type='table' AND name='store_metadata'")?;
    if tables > 0 && bookkeeping == 0 {
        return Err(StoreError::NotALedger(
            "a database of another application".into(),
        ));
    }
    Ok(())
}

/// The reading hooks of [`migrate::check`] over a read-only connection.
fn check(conn: &Connection, opts: &OpenOptions) -> Result<String, StoreError> {
    let mut all: Vec<Migration> = CORE_MIGRATIONS.to_vec();
    all.extend(opts.shared.migrations.iter().copied());
    conn.execute_batch("BEGIN").map_err(map_err)?;
    let report = migrate::check(
        &mut SqliteMigrator { tx: conn },
        &MigrationRequest {
            backend_id: opts.shared.backend_id.as_deref(),
            default_backend_id: DEFAULT_BACKEND_ID,
            migrations: &all,
            allow_migrate: false,
        },
    );
    let _ = conn.execute_batch("COMMIT");
    Ok(report?.backend_id)
}

/// Opens the ledger at `path` read-only (see the module docs).
pub(crate) fn open(path: PathBuf, opts: &OpenOptions) -> Result<SqliteStore, StoreError> {
    let meta = std::fs::metadata(&path).map_err(|_| StoreError::Io)?;
    if !meta.is_file() {
        return Err(StoreError::NotALedger("not a file".into()));
    }
    read_header(&path)?;
    if let Some(fs) = detect_network_filesystem(&path) {
        return Err(StoreError::NetworkFilesystem(fs));
    }
    let mode = ReadMode::of(&path);
    let conn = connect(&path, mode)?;
    let backend_id = check(&conn, opts).map_err(|e| match e {
        // A header that looks right over a body SQLite cannot read is damaged, not foreign.
        StoreError::Failed { .. } => StoreError::Corrupt("unreadable schema".into()),
        other => other,
    })?;
    Ok(SqliteStore {
        inner: Arc::new(Inner {
            path,
            backend_id,
            sender: Mutex::new(None),
            writer: Mutex::new(None),
            max_readers: opts.readers.max(1),
            stats: Arc::new(StatCounters::default()),
            reader_threads: Mutex::new(ReaderThreads::default()),
            read_only: Some(mode),
            limits: opts.shared.queue,
        }),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listing(dir: &Path) -> Vec<(String, Vec<u8>)> {
        let mut v: Vec<_> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| {
                let e = e.unwrap();
                (
                    e.file_name().to_string_lossy().into_owned(),
                    std::fs::read(e.path()).unwrap(),
                )
            })
            .collect();
        v.sort();
        v
    }

    #[test]
    fn a_read_only_open_reads_a_ledger_and_leaves_its_directory_unchanged() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ledger?#%.sqlite");
        drop(SqliteStore::open(&path, OpenOptions::new("ro")).unwrap());
        let before = listing(dir.path());
        let store =
            SqliteStore::open(&path, OpenOptions::any_backend().with_read_only(true)).unwrap();
        assert_eq!(store.backend_id(), "ro");
        let store = toolledger_core::store::Store::from(store);
        let n: i64 = store
            .read_blocking(|tx| {
                use toolledger_core::effect::RowExt;
                tx.query("SELECT count(*) FROM operations", &[])
                    .and_then(|r| r[0].int(0))
                    .map_err(|_| StoreError::Io)
            })
            .unwrap();
        assert_eq!(n, 0);
        let err = store
            .write_blocking(|tx| {
                tx.execute("DELETE FROM operations", &[])
                    .map(|_| ())
                    .map_err(|_| StoreError::Io)
            })
            .unwrap_err();
        assert!(matches!(err, StoreError::Failed { .. }), "{err:?}");
        drop(store);
        assert_eq!(listing(dir.path()), before, "nothing created or changed");
    }

    #[test]
    fn what_is_not_a_ledger_is_refused_without_creating_anything() {
        let dir = tempfile::tempdir().unwrap();
        let empty = dir.path().join("empty.sqlite");
        std::fs::write(&empty, b"").unwrap();
        let text = dir.path().join("text.sqlite");
        std::fs::write(&text, vec![b'x'; 4096]).unwrap();
        let foreign = dir.path().join("foreign.sqlite");
        {
            let c = Connection::open(&foreign).unwrap();
            c.execute_batch("CREATE TABLE other(x)").unwrap();
        }
        let before = listing(dir.path());
        for p in [&empty, &text, &foreign] {
            let err =
                SqliteStore::open(p, OpenOptions::any_backend().with_read_only(true)).unwrap_err();
            assert_eq!(err.code(), "NOT_A_LEDGER", "{p:?}: {err:?}");
        }
        let missing = dir.path().join("missing.sqlite");
        let err = SqliteStore::open(&missing, OpenOptions::any_backend().with_read_only(true))
            .unwrap_err();
        assert!(matches!(err, StoreError::Io), "{err:?}");
        assert_eq!(listing(dir.path()), before);
    }
}
