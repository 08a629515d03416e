//! The reference server (`toolledger serve`'s tools) on a SQLite ledger in a temporary
//! directory, served one session at a time over the strict stdio transport on in-memory
//! pipes: a fuzz input goes in as one line, and whatever the server writes comes back.

use std::sync::{Arc, OnceLock};
use std::time::Duration;

use rmcp::ServiceExt;
use serde_json::Value;
use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::model::Error;
use toolledger::store::Store;
use toolledger_mcp::wire::StdioTransport;
use toolledger_mcp::{CallerSource, GuardConfig, GuardedServer, KeyMaterial, LedgerGuard};
use toolledger_reference::tools::{Faults, ReferenceTools, ToolEnv};

/// A reply to a request the server accepted is awaited at most this long (a hang is a bug
/// the fuzzer reports by this panic, not by its own timeout).
const REPLY_WAIT: Duration = Duration::from_secs(20);

/// The server and its ledger, built once per fuzzing process.
pub struct Harness {
    server: GuardedServer<ReferenceTools>,
    store: Store,
    _dir: tempfile::TempDir,
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("a runtime")
}

/// The one harness of this process.
pub fn harness() -> &'static Harness {
    static HARNESS: OnceLock<Harness> = OnceLock::new();
    HARNESS.get_or_init(|| runtime().block_on(Harness::new()))
}

impl Harness {
    async fn new() -> Harness {
        // A memory-backed directory where there is one: the ledger's fsyncs cost nothing.
        let dir = match std::path::Path::new("/dev/shm").is_dir() {
            true => tempfile::tempdir_in("/dev/shm"),
            false => tempfile::tempdir(),
        }
        .expect("a temporary directory");
        let db = dir.path().join("ledger.sqlite");
        let store: Store = toolledger_cli::common::open_store(&db, None, true)
            .expect("the ledger opens")
            .into();
        let clock: SharedClock = Arc::new(ManualClock::new(1_767_225_600));
        let keys = KeyMaterial::from_values(Some("07".repeat(32)), Some("09".repeat(32)), None)
            .expect("keys");
        let ledger = LedgerGuard::builder()
            .store(store.clone())
            .keys(keys)
            .clock(clock.clone())
            .config(GuardConfig::default())
            .open()
            .expect("keys bound");
        let guard = ledger.guard().clone();
        let principals = PrincipalStore::new(store.clone()).with_clock(clock.clone());
        principals
            .add(
                "alice",
                "acme",
                &["editor".to_string()],
                &[toolledger_reference::automations::SCOPE.to_string()],
                false,
            )
            .await
            .expect("alice");
        let env = ToolEnv {
            guard,
            faults: Faults::default(),
            unguarded: false,
            principals: principals.clone(),
            runtime: None,
        };
        let server = ReferenceTools::new(env)
            .server(CallerSource::Configured("alice".into()))
            .expect("the reference tools");
        Harness {
            server,
            store,
            _dir: dir,
        }
    }

    /// Every row of every table of the ledger, after every write sent before the call has
    /// committed (the writer runs jobs in order, so an empty write job is a barrier).
    pub fn rows(&self) -> i64 {
        self.store
            .write_blocking(|_: &mut dyn EffectTx| Ok::<(), Error>(()))
            .expect("the barrier");
        self.store
            .read_blocking(|tx: &mut dyn EffectTx| {
                let tables = tx.query(
                    "SELECT name FROM sqlite_master WHERE type = 'table' ORDER BY name",
                    &[],
                )?;
                let mut total = 0;
                for table in tables {
                    let name = table.text(0)?;
                    let sql = format!("SELECT count(*) FROM \"{name}\"");
                    total += tx.query_opt(&sql, &[])?.unwrap_or_default().int(0)?;
                }
                Ok::<i64, Error>(total)
            })
            .expect("the count")
    }

    /// One session: `line` (without its newline) is written to the server, then, if it is a
    /// request the wire entry accepted (`awaited` is its id), its reply is awaited; then the
    /// input ends. Returns every line the server wrote.
    pub fn session(&self, line: &[u8], awaited: Option<&Value>) -> Vec<Vec<u8>> {
        let server = self.server.clone();
        runtime().block_on(async move {
            let (client, server_io) = tokio::io::duplex(1 << 16);
            let (read, write) = tokio::io::split(server_io);
            let serving = tokio::spawn(async move {
                if let Ok(running) = server.serve(StdioTransport::new(read, write)).await {
                    let _ = running.waiting().await;
                }
            });
            let (from_server, mut to_server) = tokio::io::split(client);
            let mut lines = BufReader::new(from_server).split(b'\n');
            let mut out = Vec::new();
            to_server.write_all(line).await.expect("written");
            to_server.write_all(b"\n").await.expect("written");
            if let Some(id) = awaited {
                let replied = tokio::time::timeout(REPLY_WAIT, async {
                    while let Some(reply) = lines.next_segment().await.expect("read") {
                        let value: Value = serde_json::from_slice(&reply).expect("JSON out");
                        out.push(reply);
                        if value.get("id") == Some(id) && value.get("method").is_none() {
                            return;
                        }
                    }
                    panic!("the session ended without a reply to {id}");
                })
                .await;
                assert!(replied.is_ok(), "no reply to request {id}");
            }
            to_server.shutdown().await.expect("end of input");
            while let Some(reply) = lines.next_segment().await.expect("read") {
                out.push(reply);
            }
            serving.await.expect("the session ends cleanly");
            out
        })
    }
}
