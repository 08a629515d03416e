//! Random SIGKILLs under concurrent load, on both backends, checked by the testkit's history
//! checker: at most one effect per operation id, no acknowledged operation lost, no answer
//! that changes, nothing left undecided, `audit` passes.
//!
//! On one ledger (a SQLite file, or a PostgreSQL schema) run: two `toolledger serve --http`,
//! two `toolledger worker`s, one `toolledger proxy --http` in front of the charge server on
//! streamable HTTP (its own SQLite file of charges), and a `toolledger serve` on stdio per
//! stdio client connection, each started through a wrapper that records its pid. Nine
//! clients call at once: raw JSON-RPC over stdio and over HTTP (`create_issue`, two rounds:
//! the body by `inputResponses`; an issue row is its effect), raw JSON-RPC over HTTP to the
//! proxy (`charge`; a charge row), and the Python SDK and the TypeScript SDK, each over stdio
//! and HTTP (`refund_order`, deferred: a refund in the payments stand-in's own SQLite file).
//! A seeded killer SIGKILLs a random one of these processes at random moments for a bounded
//! number of cycles (a supervised process is started again; a stdio server is started again
//! by its client's next connection). On PostgreSQL the server itself is restarted
//! (`pg_ctlcluster … restart`) and every backend of the database is terminated mid-load; the
//! test holds the test-server lock exclusively for that.
//!
//! Each client resends every call not answered definitively, under the same operation id,
//! until it is (an `outcome_unknown` is resent a few times, then kept, with its status
//! reference). Afterwards every unfinished operation is settled with `toolledger resolve`,
//! every operation is asked once more (a replay, which must repeat the first definitive
//! answer), and the checker runs over what the clients saw, the ledger rows and the effects
//! counted per operation id in the three effect tables. One JSON summary line per run: seed,
//! clients, calls, kills, replies lost after commit, duplicates, acknowledged operations lost.
//! `TOOLLEDGER_KILL_SEED` replays a run's plan; `TOOLLEDGER_KILL_KEEP=1` keeps its files.

#![cfg(unix)]

#[macro_use]
mod support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::clients;
use support::wire::{add_principal, approve, Db, Ledger};
use toolledger_testkit::db::{restart_server, test_database_url, RestoreServer, ServerLock};
use toolledger_testkit::history::{
    blank_members, count_effects_sqlite, count_effects_store, read_reply, Checker, LedgerCli,
    LedgerRow, Reading, Recorder,
};
use toolledger_testkit::kill::{
    drive, free_port, killer, pid_wrapper, start_run, Call, Client, DrivePolicy, KillPlan,
    RawHttpClient, RawStdioClient, Ready, Rng, ScriptClient, Supervised, Target,
};
use toolledger_testkit::reference::add_order;

/// The two backends' runs share the machine's cores: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Calls per client.
const CALLS_PER_CLIENT: usize = 40;
/// SIGKILLs of processes per run.
const KILL_CYCLES: usize = 16;

const PROXY_CONFIG: &str = r#"
call_timeout_seconds = 2

[tools.charge]
forward_operation_id = "_meta"
"#;

#[test]
fn sqlite_history_holds_under_random_sigkills() {
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    run(Db::sqlite(), None);
}

#[test]
fn postgres_history_holds_under_random_sigkills_and_server_restarts() {
    if test_database_url().is_none() {
        return;
    }
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let exclusive = ServerLock::acquire(true).unwrap();
    let restore = RestoreServer;
    let db = Db::postgres_while_holding(&exclusive).expect("a PostgreSQL schema");
    run(db, Some(&restore));
}

/// Everything the processes of one run share.
struct World<'a> {
    db: &'a Db,
    dir: PathBuf,
    /// `NAME=value` in the environment of every process of this run.
    mark: (String, String),
    payments: PathBuf,
    charges: PathBuf,
    token: String,
}

impl World<'_> {
    fn mark(&self) -> String {
        format!("{}={}", self.mark.0, self.mark.1)
    }

    /// The environment every process of the run gets.
    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            self.mark.clone(),
            ("CHARGE_DB".into(), self.charges.display().to_string()),
            ("CHARGE_DELAY_MS".into(), "150".into()),
        ];
        for (k, v) in self.db.key_env() {
            env.push((k.into(), v.into()));
        }
        env
    }

    /// `toolledger CMD` on the run's ledger and payments stand-in.
    fn toolledger(&self, cmd: &str) -> Command {
        let mut c = Command::new(support::BIN);
        c.arg(cmd)
            .args(self.db.store_args())
            .env_remove("TOOLLEDGER_STATE_KEY_HEX")
            .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
            .envs(self.env());
        match cmd {
            "proxy" => {}
            // Operator commands name no demo: they find the payments stand-in's file through
            // the environment.
            "resolve" | "console" => {
                c.env("TOOLLEDGER_DOWNSTREAM_DB", &self.payments);
            }
            _ => {
                c.arg("--downstream-db").arg(&self.payments);
            }
        }
        c
    }

    /// The words of a stdio `serve` as `alice`, wrapped to record its pid in `pidfile`.
    fn stdio_serve_script(&self, pidfile: &Path) -> String {
        let mut words = vec![support::BIN.to_string(), "serve".to_string()];
        words.extend(self.db.store_args());
        words.extend([
            "--downstream-db".into(),
            self.payments.display().to_string(),
            "--principal".into(),
            "alice".into(),
        ]);
        pid_wrapper(pidfile, &words)
    }

    fn pidfile(&self, client: &str) -> PathBuf {
        self.dir.join(format!("{client}.serve.pid"))
    }

    fn log(&self, name: &str) -> PathBuf {
        self.dir.join(format!("{name}.log"))
    }

    fn cli(&self) -> LedgerCli {
        let mut cli = LedgerCli::new(support::BIN, self.db.store_args());
        cli.env = self.env();
        cli
    }
}

/// A client program of the repository's (Python SDK or TypeScript SDK driver).
#[derive(Clone, Copy, PartialEq)]
enum Sdk {
    Python,
    TypeScript,
}

fn sdk_client(world: &World, sdk: Sdk, name: &str, http: Option<&str>) -> ScriptClient {
    let (program, script) = match sdk {
        Sdk::Python => (
            clients::python().unwrap(),
            clients::proxy_fixture("py_client.py"),
        ),
        Sdk::TypeScript => (clients::node().unwrap(), clients::ts_client()),
    };
    let server = match http {
        Some(_) => Value::Null,
        None => {
            let env: serde_json::Map<String, Value> = world
                .env()
                .into_iter()
                .map(|(k, v)| (k, Value::String(v)))
                .collect();
            json!({"command": "sh",
                   "args": ["-c", world.stdio_serve_script(&world.pidfile(name))],
                   "env": env})
        }
    };
    let (url, token) = (http.map(|a| format!("http://{a}/mcp")), world.token.clone());
    ScriptClient::new(
        name,
        &program,
        vec![script.display().to_string()],
        &world.log(name),
        move |calls: &[Call]| {
            let calls: Vec<Value> = calls
                .iter()
                .map(|c| json!({"name": c.tool, "arguments": c.arguments}))
                .collect();
            let mut spec = json!({"list_tools": false, "calls": calls});
            match sdk {
                Sdk::Python => {
                    spec["api"] = json!("client");
                    spec["lifecycle"] = json!("auto");
                }
                Sdk::TypeScript => {
                    spec["lifecycle"] = json!("legacy");
                    spec["timeout_ms"] = json!(60_000);
                }
            }
            match &url {
                Some(url) => {
                    spec["transport"] = json!("http");
                    spec["url"] = json!(url);
                    spec["token"] = json!(token);
                }
                None => {
                    spec["transport"] = json!("stdio");
                    spec["server"] = server.clone();
                }
            }
            spec
        },
    )
}

fn raw_stdio_client(world: &World, name: &str) -> RawStdioClient {
    let script = world.stdio_serve_script(&world.pidfile(name));
    let env = world.env();
    let mut client = RawStdioClient::new(name, move || {
        let mut c = Command::new("sh");
        c.args(["-c", &script])
            .env_remove("TOOLLEDGER_STATE_KEY_HEX")
            .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
            .envs(env.iter().cloned());
        c
    });
    client.reply_timeout = Duration::from_secs(120);
    client
}

fn issue_calls(client: &str, seed: u64) -> Vec<Call> {
    (0..CALLS_PER_CLIENT)
        .map(|i| {
            let id = format!("{client}-{seed:x}-{i}");
            let mut c = Call::new(
                &id,
                "create_issue",
                json!({"operation_id": id, "title": format!("issue {i} of {client}")}),
            );
            c.input_responses = Some(json!({"body": {"action": "accept",
                                                     "content": {"body": format!("body {i}")}}}));
            c
        })
        .collect()
}

fn charge_calls(client: &str, seed: u64) -> Vec<Call> {
    (0..CALLS_PER_CLIENT)
        .map(|i| {
            let id = format!("{client}-{seed:x}-{i}");
            Call::new(
                &id,
                "charge",
                // Every call its own intent (a customer per client and call): equal
                // arguments under two ids would be a re-plan to the proxy's guard.
                json!({"customer": format!("cus-{client}-{i}"), "amount_cents": 100 + i as i64,
                       "operation_id": id}),
            )
        })
        .collect()
}

/// Refund calls, each with its own order (owned by `alice`) and its approval by `ed`.
fn refund_calls(world: &World, client: &str, seed: u64) -> Vec<Call> {
    (0..CALLS_PER_CLIENT)
        .map(|i| {
            let id = format!("{client}-{seed:x}-{i}");
            let order = format!("ord-{id}");
            add_order(&world.db.store(), "acme", &order, "alice", 5000);
            let business = json!({"order_id": order, "amount_cents": 1200});
            let approval = approve(world.db, "refund_order", &id, &business, &[]);
            Call::new(
                &id,
                "refund_order",
                json!({"idempotency_key": id, "order_id": order, "amount_cents": 1200,
                       "approval": approval}),
            )
        })
        .collect()
}

/// Settles every unfinished ledger row with `resolve`: `failed` unless the downstream holds
/// a receipt (then `succeeded`); inline rows as `applied`. Waits for live leases and for
/// workers to claim what is only accepted. Returns how many it settled.
fn settle(world: &World) -> usize {
    let cli = world.cli();
    let deadline = Instant::now() + Duration::from_secs(120);
    let mut settled = 0;
    loop {
        let open: Vec<LedgerRow> = cli
            .rows()
            .unwrap()
            .into_iter()
            .filter(LedgerRow::is_unfinished)
            .collect();
        if open.is_empty() {
            return settled;
        }
        assert!(
            Instant::now() < deadline,
            "still unfinished after 120 s: {open:?} (files in {})",
            world.dir.display()
        );
        for row in &open {
            let attempts: &[&str] = if row.state == "in_progress" {
                &["applied"]
            } else {
                &["failed", "succeeded"]
            };
            for outcome in attempts {
                let out = world
                    .toolledger("resolve")
                    .args(["--status-ref", &row.status_ref, "--as", outcome])
                    .args(["--reason", "kill test: settled after the run"])
                    .args(["--operator", "olga"])
                    .output()
                    .unwrap();
                if out.status.success() {
                    settled += 1;
                    break;
                }
            }
        }
        std::thread::sleep(Duration::from_millis(1000));
    }
}

fn run(db: Db, pg: Option<&RestoreServer>) {
    let (Some(python), Some(_node)) = (clients::python(), clients::node()) else {
        return;
    };
    let backend = if db.is_postgres() {
        "postgres"
    } else {
        "sqlite"
    };
    let (seed, work) = start_run("torture_kill", &format!("backend {backend}"));
    let mut rng = Rng(seed);
    let dir = work.path().to_path_buf();
    let config = dir.join("proxy.toml");
    std::fs::write(&config, PROXY_CONFIG).unwrap();

    let token = add_principal(
        &db,
        "alice",
        "acme",
        &["editor"],
        &["automation:write"],
        true,
    )
    .expect("a token");
    add_principal(&db, "ed", "acme", &["approver"], &[], false);
    add_principal(&db, "olga", "acme", &["operator"], &[], false);
    let world = World {
        db: &db,
        dir: dir.clone(),
        mark: ("TOOLLEDGER_TORTURE_RUN".into(), dir.display().to_string()),
        payments: dir.join("payments.sqlite"),
        charges: dir.join("charges.sqlite"),
        token,
    };

    // The processes the harness runs itself.
    let serve_addrs = [
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    ];
    let proxy_addr = format!("127.0.0.1:{}", free_port());
    let charge_port = free_port();
    let mut supervised = Vec::new();
    for (i, addr) in serve_addrs.iter().enumerate() {
        let command = {
            let mut c = world.toolledger("serve");
            c.args(["--http", addr]);
            c
        };
        supervised.push(supervised_from(
            &format!("serve-http-{}", i + 1),
            Ready::StderrContains("\"listening\"".into()),
            &world.log(&format!("serve-http-{}", i + 1)),
            command,
        ));
    }
    for i in 1..=2 {
        let command = {
            let mut c = world.toolledger("worker");
            c.args(["--lease-seconds", "5", "--poll-interval", "200"])
                .args(["--worker-id", &format!("w{i}")]);
            c
        };
        supervised.push(supervised_from(
            &format!("worker-{i}"),
            Ready::Spawned,
            &world.log(&format!("worker-{i}")),
            command,
        ));
    }
    let charge_server = {
        let mut c = Command::new(&python);
        c.arg(clients::proxy_fixture("charge_server.py"))
            .args(["--http", &charge_port.to_string()])
            .envs(world.env());
        c
    };
    supervised.push(supervised_from(
        "charge-http",
        Ready::Port(charge_port),
        &world.log("charge-http"),
        charge_server,
    ));
    let proxy = {
        let mut c = world.toolledger("proxy");
        c.arg("--config")
            .arg(&config)
            .args(["--http", &proxy_addr])
            .args([
                "--upstream-url",
                &format!("http://127.0.0.1:{charge_port}/mcp"),
            ])
            .args(["--upstream-header", "Authorization: Bearer upstream-secret"]);
        c
    };
    supervised.push(supervised_from(
        "proxy-http",
        Ready::StderrContains("\"listening\"".into()),
        &world.log("proxy-http"),
        proxy,
    ));
    // The ledger and the charges file exist before anything races to create them.
    for p in &supervised {
        p.start().unwrap();
    }

    // The clients and their calls.
    let mut plans: Vec<(Box<dyn Client>, Vec<Call>)> = Vec::new();
    for name in ["raw-stdio-1", "raw-stdio-2"] {
        plans.push((
            Box::new(raw_stdio_client(&world, name)),
            issue_calls(name, seed),
        ));
    }
    for (name, addr) in [
        ("raw-http-1", &serve_addrs[0]),
        ("raw-http-2", &serve_addrs[1]),
    ] {
        plans.push((
            Box::new(RawHttpClient::new(name, addr, &world.token)),
            issue_calls(name, seed),
        ));
    }
    plans.push((
        Box::new(RawHttpClient::new(
            "raw-http-proxy",
            &proxy_addr,
            &world.token,
        )),
        charge_calls("raw-http-proxy", seed),
    ));
    for (sdk, name, http) in [
        (Sdk::Python, "py-stdio", None),
        (Sdk::Python, "py-http", Some(serve_addrs[0].as_str())),
        (Sdk::TypeScript, "ts-stdio", None),
        (Sdk::TypeScript, "ts-http", Some(serve_addrs[1].as_str())),
    ] {
        plans.push((
            Box::new(sdk_client(&world, sdk, name, http)),
            refund_calls(&world, name, seed),
        ));
    }
    let clients_n = plans.len();
    let calls_n: usize = plans.iter().map(|(_, c)| c.len()).sum();

    // What may be killed: every supervised process, and each stdio client's server.
    let mut targets: Vec<Target> = supervised.iter().map(Target::Process).collect();
    for name in ["raw-stdio-1", "raw-stdio-2", "py-stdio", "ts-stdio"] {
        targets.push(Target::PidFile {
            name: format!("{name}:serve"),
            pidfile: world.pidfile(name),
            mark: world.mark(),
        });
    }

    let recorder = Recorder::new();
    let policy = DrivePolicy::default();
    let done = AtomicBool::new(false);
    let finished = AtomicUsize::new(0);
    let mut pg_rng = Rng(rng.next_u64());
    let started = Instant::now();
    let (kills, pg_faults) = std::thread::scope(|s| {
        let mut drivers = Vec::new();
        for (client, calls) in &mut plans {
            let (recorder, policy, done, finished) = (&recorder, &policy, &done, &finished);
            drivers.push(s.spawn(move || {
                let r = drive(client.as_mut(), calls, recorder, policy);
                if finished.fetch_add(1, Ordering::Relaxed) + 1 == clients_n || r.is_err() {
                    done.store(true, Ordering::Relaxed);
                }
                r
            }));
        }
        let pg_thread = pg.map(|_| {
            let done = &done;
            let pg_rng = &mut pg_rng;
            let store_url = match &db {
                Db::Postgres { url, .. } => url.clone(),
                Db::Sqlite(_) => unreachable!(),
            };
            s.spawn(move || postgres_faults(pg_rng, &store_url, done))
        });
        let plan = KillPlan {
            cycles: KILL_CYCLES,
            pause_ms: (200, 1200),
            down_ms: (0, 500),
        };
        let kills = killer("torture_kill", &mut rng, &targets, &plan, &|_| true, &done);
        let mut failures = Vec::new();
        for d in drivers {
            if let Err(e) = d.join().unwrap() {
                failures.push(e);
            }
        }
        let pg_faults = pg_thread.map(|t| t.join().unwrap()).unwrap_or_default();
        assert!(
            failures.is_empty(),
            "clients failed (files in {}):\n{}",
            dir.display(),
            failures.join("\n")
        );
        (kills.unwrap(), pg_faults)
    });
    let chaos = started.elapsed();
    for p in &supervised {
        p.revive().unwrap();
        p.start().unwrap();
    }

    // Every unsure operation is settled by an operator, then every operation is asked again.
    let settled = settle(&world);
    let history = recorder.history();
    let mut replayer_stdio = raw_stdio_client(&world, "replay-stdio");
    let mut replayer_proxy = RawHttpClient::new("replay-proxy", &proxy_addr, &world.token);
    let mut replays = BTreeMap::new();
    for (_, calls) in &plans {
        let replayer: &mut dyn Client = if calls[0].tool == "charge" {
            &mut replayer_proxy
        } else {
            &mut replayer_stdio
        };
        // `unavailable` (a store still reconnecting after the last fault) is asked again.
        let mut pending: Vec<&Call> = calls.iter().collect();
        for _ in 0..20 {
            let batch: Vec<Call> = pending.iter().map(|c| (*c).clone()).collect();
            let run = replayer.run(&batch);
            assert!(
                run.lost_at.is_none() && !run.lost_idle && run.unexpected.is_empty(),
                "the replay pass loses nothing: {run:?}"
            );
            for (i, reply) in run.answers {
                match read_reply(&reply) {
                    Reading::Unavailable => continue,
                    r => assert!(r.is_definitive(), "{}: settled, yet {reply}", batch[i].id),
                }
                replays.insert(batch[i].id.clone(), reply);
            }
            pending.retain(|c| !replays.contains_key(&c.id));
            if pending.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_millis(500));
        }
        assert!(pending.is_empty(), "still unavailable: {pending:?}");
    }

    // What the databases hold.
    let cli = world.cli();
    let rows = cli.rows().unwrap();
    // The read-back handle's connections may have died with the server: a few tries.
    let mut effects = (0..20)
        .find_map(|_| {
            let r = count_effects_store(
                &db.store(),
                "SELECT operation_key, count(*) FROM issues GROUP BY operation_key",
            );
            if r.is_err() {
                std::thread::sleep(Duration::from_millis(500));
            }
            r.ok()
        })
        .expect("the issues are counted");
    // The charge server records each charge under the operation's upstream key (derived from
    // alice's scope), never the raw id: read back to the ids.
    let by_upstream_key: BTreeMap<String, String> = rows
        .iter()
        .filter(|r| r.tool == "charge")
        .map(|r| {
            (
                support::wire::upstream_key("acme", "alice", "charge", &r.key),
                r.key.clone(),
            )
        })
        .collect();
    for (reference, n) in count_effects_sqlite(
        &world.charges,
        "SELECT reference, count(*) FROM charges GROUP BY reference",
    )
    .unwrap()
    {
        let key = by_upstream_key
            .get(&reference)
            .cloned()
            .unwrap_or(reference);
        *effects.entry(key).or_default() += n;
    }
    let by_ref: BTreeMap<&str, &str> = rows
        .iter()
        .map(|r| (r.status_ref.as_str(), r.key.as_str()))
        .collect();
    let refunds = count_effects_sqlite(
        &world.payments,
        "SELECT r.status_ref, count(*) FROM downstream_receipts r \
         JOIN downstream_refunds f ON f.scope_digest = r.scope_digest GROUP BY r.status_ref",
    )
    .unwrap();
    for (status_ref, n) in refunds {
        let key = by_ref.get(status_ref.as_str()).copied().unwrap_or("");
        *effects.entry(key.to_string()).or_default() += n;
    }
    drop(targets);
    drop(supervised);

    let mut checker = Checker::new(&history)
        .ledger(rows)
        .effects(effects)
        .audit(cli.audit())
        // A deferred replay says how it was delivered (`local_replay`, `receipt_reconciled`).
        .normalize(|v| blank_members(v, &["replayed", "delivery"]));
    for (id, reply) in replays {
        checker = checker.replay(&id, reply);
    }
    let report = checker.check();
    let unknown_answers = history
        .operations
        .values()
        .filter(|o| {
            o.replies()
                .any(|r| matches!(read_reply(r), Reading::OutcomeUnknown { .. }))
        })
        .count();
    println!(
        "{}",
        json!({"torture_kill": {
            "backend": backend,
            "seed": seed,
            "clients": clients_n,
            "calls": calls_n,
            "sends": report.sends,
            "kills": kills.len() + pg_faults.len(),
            "killed": kills,
            "postgres_faults": pg_faults,
            "transport_losses": report.transport_losses,
            "replies_lost_after_commit": report.replies_lost_after_commit,
            "outcome_unknown_answers": unknown_answers,
            "settled_by_operator": settled,
            "duplicates": report.duplicates.len(),
            "acknowledged_lost": report.acknowledged_lost.len(),
            "changed_results": report.changed_results.len(),
            "undecided": report.undecided.len(),
            "audit": report.summary()["audit"],
            "chaos_seconds": chaos.as_secs(),
        }})
    );
    report.assert_ok();
    assert_eq!(report.operations, calls_n, "every call was recorded");
    assert!(!kills.is_empty(), "the run killed something");
    if pg.is_some() {
        assert!(
            pg_faults.iter().any(|f| f == "postgres-restart"),
            "the PostgreSQL server was restarted mid-load"
        );
    }
}

fn supervised_from(name: &str, ready: Ready, log: &Path, command: Command) -> Supervised {
    let program = command.get_program().to_owned();
    let args: Vec<_> = command.get_args().map(|a| a.to_owned()).collect();
    let envs: Vec<_> = command
        .get_envs()
        .map(|(k, v)| (k.to_owned(), v.map(|v| v.to_owned())))
        .collect();
    Supervised::new(name, ready, log, move || {
        let mut c = Command::new(&program);
        c.args(&args);
        for (k, v) in &envs {
            match v {
                Some(v) => c.env(k, v),
                None => c.env_remove(k),
            };
        }
        c
    })
}

/// The PostgreSQL faults of a run, while the clients are at work: the server restarted, every
/// backend of the test database terminated, the server restarted once more — each after a
/// random pause. Returns what it did.
fn postgres_faults(rng: &mut Rng, url: &str, done: &AtomicBool) -> Vec<String> {
    let mut faults = Vec::new();
    for fault in [
        "postgres-restart",
        "postgres-terminate-backends",
        "postgres-restart",
    ] {
        let until = Instant::now() + Duration::from_millis(rng.range(3000, 9000));
        while Instant::now() < until && !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(50));
        }
        if done.load(Ordering::Relaxed) {
            break;
        }
        let ok = if fault == "postgres-restart" {
            restart_server().map(|()| true).unwrap()
        } else {
            let base = url.split('?').next().unwrap_or(url);
            // The server may have no connection slot free for a moment: a few tries.
            (0..5).any(|_| {
                let out = Command::new("psql")
                    .args([base, "-qAtc"])
                    .arg(
                        "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity \
                         WHERE datname = current_database() AND pid <> pg_backend_pid()",
                    )
                    .output()
                    .expect("psql runs");
                if !out.status.success() {
                    eprintln!(
                        "torture_kill: {fault} failed: {}",
                        String::from_utf8_lossy(&out.stderr).trim()
                    );
                    std::thread::sleep(Duration::from_millis(500));
                }
                out.status.success()
            })
        };
        if ok {
            eprintln!("torture_kill: {fault}");
            faults.push(fault.to_string());
        }
    }
    faults
}
