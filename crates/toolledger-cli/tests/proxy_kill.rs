//! The proxy under random SIGKILLs: at most one upstream effect per operation id, and every
//! answer a client got is the one every retry gets.
//!
//! One upstream database (`CHARGE_DB`, the charge server's SQLite file) behind two shapes of
//! proxy and two shapes of upstream: three stdio clients (Python SDK `Client`, Python
//! `ClientSession`, TypeScript SDK), each launching its own `toolledger proxy` as its server
//! command (which starts its own charge server on stdio); the same three clients over
//! streamable HTTP to one `proxy --http` process the test runs (with its own stdio charge
//! server); and the same three clients again on stdio, each launching its own proxy with
//! `--upstream-url`, all in front of one charge server on streamable HTTP that the test runs.
//! Every proxy and stdio upstream is started through a small `sh` wrapper that writes its pid
//! to a file, so a killer thread can SIGKILL, at seeded random moments, a proxy, an upstream,
//! or both (the HTTP proxy comes back on the same port). A second killer SIGKILLs the HTTP
//! upstream a few charges after each of its starts and starts it again on the same port; a
//! proxy in front of it connects again at its next call, and one that starts while it is
//! down exits, which its client sees as a lost connection. The charge server waits a little
//! between its commit and its reply, so some kills land in that window.
//!
//! Each client calls `charge` for its own list of operation ids. A client whose connection
//! is lost starts again and sends every call not yet answered definitively, with the same
//! operation id: a result, or an in-band error other than `operation_in_progress` and
//! `unavailable` (an `outcome_unknown` answer is definitive for now; its status ref is kept).
//! A call the proxy cannot send because the HTTP upstream is down is `unavailable`: nothing was
//! sent, and the client's retry forwards it.
//!
//! Afterwards: no operation id has two charge rows; a fresh proxy replays every first
//! definitive answer byte for byte (but for `replayed`); every unsure operation is listed
//! by `operations list` and settled with `resolve --as failed`; `audit` passes. One summary
//! line says what happened. The seed is printed; `TOOLLEDGER_KILL_SEED` replays one.

#![cfg(unix)]

#[macro_use]
mod support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};
use support::clients;
use support::wire::{add_principal, Db, Ledger};
use toolledger_testkit::history::without_replayed;
use toolledger_testkit::kill::{
    free_port, kill_pidfile, pid_wrapper, start_run, Call, Client, Ready, Rng, ScriptClient,
    Supervised,
};

on_both_backends!(at_most_one_upstream_effect_under_random_sigkills);

/// The two backends' runs share the machine's cores and the upstream's timing: one at a time.
static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());

/// Charges per client.
const CALLS_PER_CLIENT: usize = 20;
/// Kill cycles (each kills a proxy, an upstream, or both).
const KILL_CYCLES: usize = 8;
/// Kills of the HTTP upstream, on top.
const HTTP_UPSTREAM_KILLS: usize = 2;
/// How long one run of a driver may go without finishing before the test calls it a hang.
const HANG: Duration = Duration::from_secs(120);
/// How often one operation may be sent before the test gives up on it.
const MAX_SENDS: u32 = 200;
/// How long one client may take for all its calls before the test gives up on it.
const CLIENT_DEADLINE: Duration = Duration::from_secs(300);

/// The `_meta` key of the proxy's ledger block.
const LEDGER_META: &str = "io.toolledger/ledger";

const CONFIG: &str = r#"
call_timeout_seconds = 2

[tools.charge]
forward_operation_id = "_meta"
"#;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Driver {
    PyClient,
    PySession,
    Ts,
}

/// How a client reaches its proxy.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Shape {
    Stdio,
    Http,
}

/// What a proxy forwards to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Upstream {
    /// Its own charge server, a child process on stdio.
    Child,
    /// The one charge server on streamable HTTP (`--upstream-url`).
    Url,
}

struct Op {
    id: String,
    customer: String,
    amount: i64,
}

struct Plan {
    name: String,
    driver: Driver,
    shape: Shape,
    upstream: Upstream,
    ops: Vec<Op>,
}

impl Plan {
    fn lifecycle(&self) -> &'static str {
        match self.driver {
            Driver::PyClient => "auto",
            Driver::PySession | Driver::Ts => "legacy",
        }
    }
}

/// What one client saw of one operation.
#[derive(Clone, Default)]
struct Seen {
    /// The first definitive answer: the result as the driver printed it.
    first: Option<String>,
    /// The same, parsed.
    value: Option<Value>,
    /// A connection was lost while this call was in flight.
    lost_in_flight: bool,
    /// The last answer was `operation_in_progress`.
    in_progress: bool,
    /// How often it was sent.
    sends: u32,
}

/// How a tool result reads.
#[derive(Debug, PartialEq)]
enum Reading {
    Success,
    /// An in-band error with this code (`None`: the upstream's own tool error text).
    Error(Option<String>),
}

fn reading(result: &Value) -> Reading {
    if result["isError"] != true {
        return Reading::Success;
    }
    let text = result["content"][0]["text"].as_str().unwrap_or("");
    let code = serde_json::from_str::<Value>(text)
        .ok()
        .and_then(|v| v["error"]["code"].as_str().map(str::to_string));
    Reading::Error(code)
}

fn status_ref(result: &Value) -> Option<String> {
    let text = result["content"][0]["text"].as_str()?;
    let v: Value = serde_json::from_str(text).ok()?;
    v["error"]["status_ref"].as_str().map(str::to_string)
}

/// Everything the processes of one run share.
struct World<'a> {
    db: &'a Db,
    dir: PathBuf,
    python: PathBuf,
    node: PathBuf,
    config: PathBuf,
    charge_db: PathBuf,
    delay_ms: u64,
    http_addr: String,
    /// The port of the charge server on streamable HTTP.
    upstream_port: u16,
    token: String,
}

impl World<'_> {
    fn env(&self) -> Vec<(String, String)> {
        let mut env = vec![
            ("CHARGE_DB".into(), self.charge_db.display().to_string()),
            ("CHARGE_DELAY_MS".into(), self.delay_ms.to_string()),
        ];
        for (k, v) in self.db.key_env() {
            env.push((k.into(), v.into()));
        }
        env
    }

    /// The upstream command, wrapped to record its pid in `pidfile`.
    fn upstream(&self, pidfile: &Path) -> String {
        let charge_server = clients::proxy_fixture("charge_server.py");
        pid_wrapper(
            pidfile,
            &[
                self.python.display().to_string(),
                charge_server.display().to_string(),
            ],
        )
    }

    /// `toolledger proxy` on this ledger with this config, before `--`.
    fn proxy_args(&self) -> Vec<String> {
        let mut a = vec!["proxy".to_string()];
        a.extend(self.db.store_args());
        a.extend(["--config".into(), self.config.display().to_string()]);
        a
    }

    /// The stdio server command of a client: its own proxy (pid in `tag.proxy.pid`) in
    /// front of its own upstream (pid in `tag.upstream.pid`) or of the HTTP upstream.
    fn stdio_server(&self, tag: &str, upstream: Upstream) -> Value {
        let mut words: Vec<String> = vec![support::BIN.to_string()];
        words.extend(self.proxy_args());
        words.extend(["--principal".into(), "alice".into()]);
        match upstream {
            Upstream::Child => {
                words.extend(["--".into(), "sh".into(), "-c".into()]);
                words.push(self.upstream(&self.pidfile(tag, "upstream")));
            }
            Upstream::Url => words.extend([
                "--upstream-url".into(),
                format!("http://127.0.0.1:{}/mcp", self.upstream_port),
                "--upstream-header".into(),
                "Authorization: Bearer upstream-secret".into(),
            ]),
        }
        let script = pid_wrapper(&self.pidfile(tag, "proxy"), &words);
        let env: serde_json::Map<String, Value> = self
            .env()
            .into_iter()
            .map(|(k, v)| (k, Value::String(v)))
            .collect();
        json!({"command": "sh", "args": ["-c", script], "env": env})
    }

    fn pidfile(&self, tag: &str, what: &str) -> PathBuf {
        self.dir.join(format!("{tag}.{what}.pid"))
    }

    fn spec(&self, plan: &Plan, tag: &str, ops: &[&Op]) -> Value {
        let calls: Vec<Value> = ops
            .iter()
            .map(|o| {
                json!({"name": "charge", "arguments": {
                    "customer": o.customer, "amount_cents": o.amount, "operation_id": o.id}})
            })
            .collect();
        let mut spec = json!({"lifecycle": plan.lifecycle(), "list_tools": false, "calls": calls});
        match plan.driver {
            Driver::PyClient => spec["api"] = json!("client"),
            Driver::PySession => spec["api"] = json!("session"),
            Driver::Ts => spec["timeout_ms"] = json!(60_000),
        }
        match plan.shape {
            Shape::Stdio => {
                spec["transport"] = json!("stdio");
                spec["server"] = self.stdio_server(tag, plan.upstream);
            }
            Shape::Http => {
                spec["transport"] = json!("http");
                spec["url"] = json!(format!("http://{}/mcp", self.http_addr));
                spec["token"] = json!(self.token);
            }
        }
        spec
    }
}

/// What one run of a driver printed.
struct DriverRun {
    /// `(index into the calls sent, the answer without its `replayed` markers, result)` per
    /// answered call.
    answers: Vec<(usize, String, Value)>,
    /// The call in flight when the connection was lost.
    lost_at: Option<usize>,
    /// Lines that are neither results nor lost connections.
    other: Vec<String>,
    /// 0, or 3 for a lost connection.
    code: i32,
}

fn run_driver(world: &World, plan: &Plan, tag: &str, ops: &[&Op]) -> DriverRun {
    let spec = world.spec(plan, tag, ops);
    let (program, script) = match plan.driver {
        Driver::PyClient | Driver::PySession => {
            (&world.python, clients::proxy_fixture("py_client.py"))
        }
        Driver::Ts => (&world.node, clients::ts_client()),
    };
    let mut client = ScriptClient::new(
        &plan.name,
        program,
        vec![script.display().to_string()],
        &world.dir.join(format!("{tag}.log")),
        move |_| spec.clone(),
    );
    client.hang = HANG;
    let calls: Vec<Call> = ops
        .iter()
        .map(|o| Call::new(&o.id, "charge", Value::Null))
        .collect();
    let run = client.run(&calls);
    DriverRun {
        answers: run
            .answers
            .into_iter()
            .map(|(i, v)| (i, without_replayed(&v), v))
            .collect(),
        code: if run.lost_at.is_some() || run.lost_idle {
            3
        } else {
            0
        },
        lost_at: run.lost_at,
        other: run.unexpected,
    }
}

/// Runs `plan` until every call has a definitive answer.
fn drive(world: &World, plan: &Plan, seen: &Mutex<Vec<Seen>>, restarts: &AtomicUsize) {
    let started = Instant::now();
    let (mut round, mut lost, mut waits) = (0usize, 0usize, 0usize);
    loop {
        let pending: Vec<usize> = {
            let seen = seen.lock().unwrap();
            // Calls still in flight elsewhere go last: the others need not wait for them.
            let mut p: Vec<usize> = (0..plan.ops.len())
                .filter(|&i| seen[i].first.is_none())
                .collect();
            p.sort_by_key(|&i| seen[i].in_progress);
            p
        };
        if pending.is_empty() {
            eprintln!(
                "proxy_kill: {} done after {} ms: {round} runs, {lost} lost connections, \
                 {waits} waits for a lease",
                plan.name,
                started.elapsed().as_millis()
            );
            return;
        }
        round += 1;
        let ops: Vec<&Op> = pending.iter().map(|&i| &plan.ops[i]).collect();
        let run = run_driver(world, plan, &plan.name, &ops);
        let mut waiting = false;
        {
            let mut seen = seen.lock().unwrap();
            for &i in &pending {
                seen[i].in_progress = false;
            }
            for (k, line, result) in &run.answers {
                let s = &mut seen[pending[*k]];
                s.sends += 1;
                // Not definitive: the forward is running elsewhere, or it never left (the
                // upstream was down or restarting; nothing was sent). Both are retried.
                let read = reading(result);
                if read == Reading::Error(Some("operation_in_progress".into()))
                    || read == Reading::Error(Some("unavailable".into()))
                {
                    s.in_progress = true;
                    waiting = true;
                    continue;
                }
                s.first = Some(line.clone());
                s.value = Some(result.clone());
            }
            if let Some(k) = run.lost_at {
                let s = &mut seen[pending[k]];
                s.sends += 1;
                s.lost_in_flight = true;
            }
            for &i in &pending {
                assert!(
                    seen[i].sends <= MAX_SENDS,
                    "{}: {} sent {} times without a definitive answer",
                    plan.name,
                    plan.ops[i].id,
                    seen[i].sends
                );
            }
        }
        assert!(
            run.other.is_empty(),
            "{}: unexpected lines: {:?}",
            plan.name,
            run.other
        );
        if run.code != 0 {
            assert_eq!(
                run.code, 3,
                "{}: a driver fails only by a lost connection",
                plan.name
            );
            restarts.fetch_add(1, Ordering::Relaxed);
            lost += 1;
            std::thread::sleep(Duration::from_millis(200));
        } else if waiting {
            waits += 1;
            // A forward of a killed proxy holds its lease until it expires.
            std::thread::sleep(Duration::from_millis(1500));
        }
        assert!(
            started.elapsed() < CLIENT_DEADLINE,
            "{}: not done after {} s ({round} runs; logs in {})",
            plan.name,
            CLIENT_DEADLINE.as_secs(),
            world.dir.display()
        );
    }
}

/// The `proxy --http` process the test runs (its stderr in `tag.log`), started again after
/// each kill.
fn http_proxy(world: &World, tag: &str) -> Supervised {
    let (args, addr, env) = (world.proxy_args(), world.http_addr.clone(), world.env());
    let upstream = world.upstream(&world.pidfile(tag, "upstream"));
    let proxy = Supervised::new(
        tag,
        Ready::StderrContains("\"listening\"".into()),
        &world.dir.join(format!("{tag}.log")),
        move || {
            let mut command = Command::new(support::BIN);
            command
                .args(&args)
                .args(["--http", &addr, "--", "sh", "-c"])
                .arg(&upstream)
                .env_remove("TOOLLEDGER_STATE_KEY_HEX")
                .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
                .envs(env.clone());
            command
        },
    );
    proxy
        .start()
        .unwrap_or_else(|e| panic!("the HTTP proxy does not start: {e}"));
    proxy
}

/// The charge server on streamable HTTP the test runs (its stderr in `http-upstream.log`),
/// started again after each kill; ready when its port accepts connections.
fn http_upstream(world: &World) -> Supervised {
    let (python, port, env) = (world.python.clone(), world.upstream_port, world.env());
    let upstream = Supervised::new(
        "http-upstream",
        Ready::Port(port),
        &world.dir.join("http-upstream.log"),
        move || {
            let mut command = Command::new(&python);
            command
                .arg(clients::proxy_fixture("charge_server.py"))
                .args(["--http", &port.to_string()])
                .envs(env.clone());
            command
        },
    );
    upstream
        .start()
        .unwrap_or_else(|e| panic!("the HTTP upstream does not start: {e}"));
    upstream
}

#[derive(Clone, Copy, Debug)]
enum Victim {
    Proxy,
    Upstream,
    Both,
}

/// Kills [`KILL_CYCLES`] times at random moments, each time a proxy, an upstream or both of
/// a shape whose clients are still at work, until every client is `done`; returns what it
/// killed. (A client in front of the HTTP upstream has no upstream of its own here: only its
/// proxy is killed; [`upstream_killer`] kills the HTTP upstream.)
fn killer(
    world: &World,
    rng: &mut Rng,
    stdio_tags: &[(String, &AtomicBool)],
    http: (&Supervised, &[&AtomicBool]),
    done: &AtomicBool,
) -> Vec<String> {
    let mark = format!("CHARGE_DB={}", world.charge_db.display());
    let mut kills = Vec::new();
    let started = Instant::now();
    while kills.len() < KILL_CYCLES && !done.load(Ordering::Relaxed) {
        std::thread::sleep(Duration::from_millis(rng.range(200, 1500)));
        let victim = [Victim::Proxy, Victim::Upstream, Victim::Both][rng.range(0, 3) as usize];
        let mut targets: Vec<Option<&str>> = stdio_tags
            .iter()
            .filter(|(_, active)| active.load(Ordering::Relaxed))
            .map(|(tag, _)| Some(tag.as_str()))
            .collect();
        if http.1.iter().any(|a| a.load(Ordering::Relaxed)) {
            targets.push(None);
        }
        if targets.is_empty() {
            continue;
        }
        let http = http.0;
        let target = targets[rng.range(0, targets.len() as u64) as usize];
        let killed = if let Some(tag) = target {
            let proxy = matches!(victim, Victim::Proxy | Victim::Both)
                && kill_pidfile(&world.pidfile(tag, "proxy"), &mark);
            let up = matches!(victim, Victim::Upstream | Victim::Both)
                && kill_pidfile(&world.pidfile(tag, "upstream"), &mark);
            // What was killed (a proxy in front of the HTTP upstream has none of its own).
            match (proxy, up) {
                (true, true) => Some(format!("{tag}:Both")),
                (true, false) => Some(format!("{tag}:Proxy")),
                (false, true) => Some(format!("{tag}:Upstream")),
                (false, false) => None,
            }
        } else {
            let upstream = world.pidfile("http", "upstream");
            let up =
                matches!(victim, Victim::Upstream | Victim::Both) && kill_pidfile(&upstream, &mark);
            let mut proxy = false;
            if matches!(victim, Victim::Proxy | Victim::Both) && http.kill() {
                proxy = true;
                std::thread::sleep(Duration::from_millis(rng.range(0, 500)));
                http.start()
                    .unwrap_or_else(|e| panic!("the HTTP proxy does not start: {e}"));
            }
            (proxy || up).then(|| format!("http:{victim:?}"))
        };
        if let Some(k) = killed {
            eprintln!(
                "proxy_kill: {:>6} ms SIGKILL {k}",
                started.elapsed().as_millis()
            );
            kills.push(k);
        }
    }
    kills
}

/// How many charges the HTTP upstream has logged (its log spans its restarts).
fn upstream_charges(world: &World) -> usize {
    std::fs::read_to_string(world.dir.join("http-upstream.log"))
        .map(|log| log.matches("]: charge ").count())
        .unwrap_or(0)
}

/// Kills the HTTP upstream [`HTTP_UPSTREAM_KILLS`] times, each once it has charged a random
/// few more times since it last started (so calls are flowing through it, and some kills
/// land between a commit and its reply), while its clients are at work; starts it again on
/// the same port after a random pause. Returns what it killed.
fn upstream_killer(
    world: &World,
    rng: &mut Rng,
    upstream: &Supervised,
    active: &[&AtomicBool],
    done: &AtomicBool,
) -> Vec<String> {
    let mut kills = Vec::new();
    let started = Instant::now();
    let at_work =
        || !done.load(Ordering::Relaxed) && active.iter().any(|a| a.load(Ordering::Relaxed));
    let mut since = 0;
    while kills.len() < HTTP_UPSTREAM_KILLS && at_work() {
        let due = since + rng.range(1, 12) as usize;
        while at_work() && upstream_charges(world) < due {
            std::thread::sleep(Duration::from_millis(20));
        }
        if !at_work() {
            break;
        }
        let pause = Duration::from_millis(rng.range(0, 1000));
        if !upstream.kill() {
            break;
        }
        eprintln!(
            "proxy_kill: {:>6} ms SIGKILL http-upstream (down for {} ms)",
            started.elapsed().as_millis(),
            pause.as_millis()
        );
        kills.push("http-upstream".to_string());
        std::thread::sleep(pause);
        upstream
            .start()
            .unwrap_or_else(|e| panic!("the HTTP upstream does not start: {e}"));
        since = upstream_charges(world);
    }
    kills
}

/// Runs `toolledger ARGS` with the ledger's store flags and key variables.
fn cli(db: &Db, args: &[&str]) -> support::Run {
    let mut c = Command::new(support::BIN);
    c.args(args)
        .args(db.store_args())
        .env_remove("TOOLLEDGER_STATE_KEY_HEX")
        .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
        .envs(db.key_env());
    c.output().unwrap().into()
}

/// The charge rows per reference (operation id).
fn charges(path: &Path) -> BTreeMap<Option<String>, Vec<(i64, String, i64)>> {
    let conn = rusqlite::Connection::open(path).unwrap();
    let mut stmt = conn
        .prepare("SELECT id, customer, amount_cents, reference FROM charges ORDER BY id")
        .unwrap();
    let rows = stmt
        .query_map([], |r| {
            Ok((
                r.get::<_, Option<String>>(3)?,
                (r.get::<_, i64>(0)?, r.get(1)?, r.get(2)?),
            ))
        })
        .unwrap();
    let mut out: BTreeMap<Option<String>, Vec<(i64, String, i64)>> = BTreeMap::new();
    for row in rows {
        let (reference, row) = row.unwrap();
        out.entry(reference).or_default().push(row);
    }
    out
}

fn at_most_one_upstream_effect_under_random_sigkills(db: Db) {
    let (Some(python), Some(node)) = (clients::python(), clients::node()) else {
        return;
    };
    let _one = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let backend = if db.is_postgres() {
        "postgres"
    } else {
        "sqlite"
    };
    let (seed, work) = start_run("proxy_kill", &format!("backend {backend}"));
    let mut rng = Rng(seed);
    let dir = work.path().to_path_buf();
    let config = dir.join("proxy.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let token = add_principal(&db, "hank", "acme", &["editor"], &[], true).unwrap();
    add_principal(&db, "olga", "acme", &["operator"], &[], false);
    let world = World {
        db: &db,
        dir: dir.clone(),
        python,
        node,
        config,
        charge_db: dir.join("charges.sqlite"),
        delay_ms: rng.range(150, 450),
        http_addr: format!("127.0.0.1:{}", free_port()),
        upstream_port: free_port(),
        token,
    };

    let drivers = [Driver::PyClient, Driver::PySession, Driver::Ts];
    let mut plans = Vec::new();
    let shapes = [
        (Shape::Stdio, Upstream::Child, "stdio"),
        (Shape::Http, Upstream::Child, "http"),
        (Shape::Stdio, Upstream::Url, "httpup"),
    ];
    for (shape, upstream, prefix) in shapes {
        for driver in drivers {
            let name = format!(
                "{prefix}-{}",
                match driver {
                    Driver::PyClient => "py-client",
                    Driver::PySession => "py-session",
                    Driver::Ts => "ts",
                }
            );
            let ops = (0..CALLS_PER_CLIENT)
                .map(|i| Op {
                    id: format!("{name}-{seed:x}-{i}"),
                    customer: format!("cus-{name}-{i}"),
                    // One call in each list is the upstream's own tool error (no row).
                    amount: if i == 5 { 0 } else { 100 + i as i64 },
                })
                .collect();
            plans.push(Plan {
                name,
                driver,
                shape,
                upstream,
                ops,
            });
        }
    }

    // The upstream's database exists before anything races to create it.
    let http = http_proxy(&world, "http");
    let http_upstream = http_upstream(&world);

    let seen: Vec<Mutex<Vec<Seen>>> = plans
        .iter()
        .map(|p| Mutex::new(vec![Seen::default(); p.ops.len()]))
        .collect();
    let active: Vec<AtomicBool> = plans.iter().map(|_| AtomicBool::new(true)).collect();
    let stdio_tags: Vec<(String, &AtomicBool)> = plans
        .iter()
        .zip(&active)
        .filter(|(p, _)| p.shape == Shape::Stdio)
        .map(|(p, a)| (p.name.clone(), a))
        .collect();
    let url_active: Vec<&AtomicBool> = plans
        .iter()
        .zip(&active)
        .filter(|(p, _)| p.upstream == Upstream::Url)
        .map(|(_, a)| a)
        .collect();
    let mut upstream_rng = Rng(rng.next_u64());
    let http_active: Vec<&AtomicBool> = plans
        .iter()
        .zip(&active)
        .filter(|(p, _)| p.shape == Shape::Http)
        .map(|(_, a)| a)
        .collect();
    let restarts = AtomicUsize::new(0);
    let done = AtomicBool::new(false);
    let finished = AtomicUsize::new(0);
    let started = Instant::now();
    let (kills, upstream_kills) = std::thread::scope(|s| {
        for ((plan, seen), active) in plans.iter().zip(&seen).zip(&active) {
            let (world, restarts, finished, done) = (&world, &restarts, &finished, &done);
            let n = plans.len();
            s.spawn(move || {
                let r = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
                    drive(world, plan, seen, restarts)
                }));
                active.store(false, Ordering::Relaxed);
                if finished.fetch_add(1, Ordering::Relaxed) + 1 == n {
                    done.store(true, Ordering::Relaxed);
                }
                if let Err(e) = r {
                    done.store(true, Ordering::Relaxed);
                    std::panic::resume_unwind(e);
                }
            });
        }
        let (world, http_upstream, url_active, done) = (&world, &http_upstream, &url_active, &done);
        let upstream_rng = &mut upstream_rng;
        let up =
            s.spawn(move || upstream_killer(world, upstream_rng, http_upstream, url_active, done));
        let kills = killer(world, &mut rng, &stdio_tags, (&http, &http_active), done);
        (kills, up.join().unwrap())
    });
    let chaos = started.elapsed();
    drop(http);

    let seen: Vec<Vec<Seen>> = seen.into_iter().map(|m| m.into_inner().unwrap()).collect();
    let calls: usize = plans.iter().map(|p| p.ops.len()).sum();

    // (2) A fresh proxy replays every first definitive answer as it was.
    let final_http = http_proxy(&world, "http-final");
    let mut mismatched = Vec::new();
    for (plan, seen) in plans.iter().zip(&seen) {
        let ops: Vec<&Op> = plan.ops.iter().collect();
        let tag = format!("{}-final", plan.name);
        let run = run_driver(&world, plan, &tag, &ops);
        assert_eq!(
            run.code, 0,
            "{}: the final pass loses no connection",
            plan.name
        );
        assert!(run.other.is_empty(), "{}: {:?}", plan.name, run.other);
        assert_eq!(
            run.answers.len(),
            ops.len(),
            "{}: every call answered",
            plan.name
        );
        for (k, line, _) in &run.answers {
            let first = seen[*k].first.as_deref().unwrap();
            if line != first {
                mismatched.push(format!(
                    "{}: first {first}\n   replay {}",
                    plan.ops[*k].id, line
                ));
            }
        }
    }
    drop(final_http);

    // (1) At most one charge row per operation id, and each acknowledged charge is its row.
    // The upstream knows each operation by its upstream key (derived from the scope: the
    // stdio clients act as alice, the HTTP ones as hank), never by the raw id: read back
    // through the keys of the ids sent.
    let by_upstream_key: BTreeMap<String, String> = plans
        .iter()
        .flat_map(|p| p.ops.iter())
        .flat_map(|o| {
            ["alice", "hank"].map(|who| {
                (
                    support::wire::upstream_key("acme", who, "charge", &o.id),
                    o.id.clone(),
                )
            })
        })
        .collect();
    let by_id = |charged: BTreeMap<Option<String>, Vec<(i64, String, i64)>>| {
        let mut rows: BTreeMap<Option<String>, Vec<(i64, String, i64)>> = BTreeMap::new();
        for (reference, found) in charged {
            let id = reference.map(|r| by_upstream_key.get(&r).cloned().unwrap_or(r));
            rows.entry(id).or_default().extend(found);
        }
        rows
    };
    let rows = by_id(charges(&world.charge_db));
    assert!(
        !rows.contains_key(&None),
        "every charge carries its operation id"
    );
    let known: BTreeSet<&str> = plans
        .iter()
        .flat_map(|p| p.ops.iter().map(|o| o.id.as_str()))
        .collect();
    for reference in rows.keys().flatten() {
        assert!(
            known.contains(reference.as_str()),
            "a charge of no call: {reference}"
        );
    }
    let duplicates: usize = rows.values().map(|r| r.len() - 1).sum();
    let mut acknowledged_lost = Vec::new();
    let mut unknown: Vec<(String, String)> = Vec::new();
    let mut replies_lost_after_commit = 0;
    for (plan, seen) in plans.iter().zip(&seen) {
        for (op, s) in plan.ops.iter().zip(seen) {
            let value = s.value.as_ref().unwrap();
            let row = rows.get(&Some(op.id.clone())).map(|r| &r[0]);
            let read = reading(value);
            let is_unknown = read == Reading::Error(Some("outcome_unknown".into()));
            // Only this client sends this id, one call at a time: a first definitive answer
            // that is a replay (an answer from the ledger, not from this send's forward) means
            // an earlier send of it forwarded: its answer was lost, or it was still running
            // (`operation_in_progress`) and this send found its end.
            let replayed = value["_meta"][LEDGER_META]["replayed"] == true;
            assert!(
                !replayed || s.lost_in_flight || s.sends > 1,
                "{}: a replay with no lost reply before it: {value}",
                op.id
            );
            if row.is_some() && (replayed || is_unknown) {
                replies_lost_after_commit += 1;
            }
            match read {
                Reading::Success => {
                    let charged = &value["structuredContent"];
                    let ok = row.is_some_and(|(id, customer, amount)| {
                        charged["charge_id"] == *id
                            && *customer == op.customer
                            && *amount == op.amount
                    });
                    if !ok {
                        acknowledged_lost.push(format!("{}: {value} vs row {row:?}", op.id));
                    }
                }
                Reading::Error(None) => {
                    assert_eq!(op.amount, 0, "{}: {value}", op.id);
                    assert!(row.is_none(), "{}: a refused charge left a row", op.id);
                }
                Reading::Error(Some(code)) => {
                    assert_eq!(code, "outcome_unknown", "{}: {value}", op.id);
                    unknown.push((op.id.clone(), status_ref(value).unwrap()));
                }
            }
        }
    }
    acknowledged_lost.extend(mismatched);

    // (3) Every unsure operation is listed, and an operator settles it.
    let listed = cli(
        &db,
        &[
            "operations",
            "list",
            "--state",
            "outcome_unknown",
            "--state",
            "processing",
            "--limit",
            "10000",
            "--json",
        ],
    );
    assert_eq!(listed.code, 0, "{}", listed.stderr);
    let listed: BTreeMap<String, String> = listed
        .stdout
        .lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            (
                v["status_ref"].as_str().unwrap().to_string(),
                v["state"].as_str().unwrap().to_string(),
            )
        })
        .collect();
    let mut processing = 0;
    for (id, sr) in &unknown {
        let state = listed
            .get(sr)
            .unwrap_or_else(|| panic!("{id} ({sr}) answered outcome_unknown and is not listed"));
        if state == "processing" {
            // A forward whose proxy was killed: its lease has expired, which the proxy
            // reads as outcome_unknown; the row stays processing until it is settled.
            processing += 1;
            let shown = cli(&db, &["operations", "show", sr]);
            assert_eq!(shown.code, 0, "{}", shown.stderr);
            assert_eq!(
                shown.json()["outbox"]["lease_live"],
                false,
                "{id}: {}",
                shown.stdout
            );
        }
    }
    assert_eq!(
        listed.len(),
        unknown.len(),
        "nothing else is unsure: {listed:?} vs {unknown:?}"
    );
    for (id, sr) in &unknown {
        let r = cli(
            &db,
            &[
                "resolve",
                "--status-ref",
                sr,
                "--as",
                "failed",
                "--reason",
                "kill test: settled by the operator",
                "--operator",
                "olga",
            ],
        );
        assert_eq!(r.code, 0, "{id}: {} {}", r.stdout, r.stderr);
        assert_eq!(r.json()["status"], "failed", "{id}: {}", r.stdout);
    }
    // A settled operation answers with the operator's word from now on, and still is not
    // forwarded again.
    let settled: BTreeMap<&str, &str> = unknown
        .iter()
        .map(|(id, sr)| (id.as_str(), sr.as_str()))
        .collect();
    let settled_http = plans
        .iter()
        .any(|p| p.shape == Shape::Http && p.ops.iter().any(|o| settled.contains_key(&*o.id)));
    let settled_proxy = settled_http.then(|| http_proxy(&world, "http-settled"));
    for plan in &plans {
        let ops: Vec<&Op> = plan
            .ops
            .iter()
            .filter(|o| settled.contains_key(&*o.id))
            .collect();
        if ops.is_empty() {
            continue;
        }
        let run = run_driver(&world, plan, &format!("{}-settled", plan.name), &ops);
        assert_eq!(run.code, 0, "{}: {:?}", plan.name, run.other);
        assert_eq!(run.answers.len(), ops.len(), "{}", plan.name);
        for (k, _, result) in &run.answers {
            let id = &*ops[*k].id;
            assert_eq!(
                reading(result),
                Reading::Error(Some("resolved_failed".into())),
                "{id}: {result}"
            );
            assert_eq!(status_ref(result).as_deref(), Some(settled[id]), "{id}");
            assert_eq!(result["_meta"][LEDGER_META]["state"], "failed", "{id}");
        }
    }
    drop(settled_proxy);
    drop(http_upstream);
    assert_eq!(
        by_id(charges(&world.charge_db)),
        rows,
        "settling and asking again charged nothing"
    );

    // (4) The ledger is consistent.
    let audit = cli(&db, &["audit"]);
    assert_eq!(audit.code, 0, "{} {}", audit.stdout, audit.stderr);
    assert_eq!(audit.json()["gate"], "PASS", "{}", audit.stdout);

    // (5) What happened.
    let upstream_shapes: BTreeMap<&str, usize> = plans.iter().fold(BTreeMap::new(), |mut m, p| {
        let shape = match p.upstream {
            Upstream::Child => "stdio",
            Upstream::Url => "http",
        };
        *m.entry(shape).or_default() += 1;
        m
    });
    println!(
        "{}",
        json!({"proxy_kill": {
            "backend": backend,
            "seed": seed,
            "clients": plans.len(),
            "upstream_shapes": upstream_shapes,
            "calls": calls,
            "kills": kills.len() + upstream_kills.len(),
            "killed": kills,
            "http_upstream_kills": upstream_kills.len(),
            "client_restarts": restarts.load(Ordering::Relaxed),
            "charge_delay_ms": world.delay_ms,
            "chaos_seconds": chaos.as_secs(),
            "replies_lost_after_commit": replies_lost_after_commit,
            "duplicates": duplicates,
            "acknowledged_lost": acknowledged_lost.len(),
            "outcome_unknown": unknown.len(),
            "outcome_unknown_still_processing": processing,
        }})
    );
    assert_eq!(duplicates, 0, "charged twice: {rows:?}");
    assert!(
        acknowledged_lost.is_empty(),
        "acknowledged answers lost:\n{}",
        acknowledged_lost.join("\n")
    );
}
