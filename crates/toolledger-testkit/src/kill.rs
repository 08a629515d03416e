//! The kill harness: processes SIGKILLed at seeded random moments and started again, and
//! clients that resend every call not yet answered definitively, under the same operation id,
//! recording everything into a [`Recorder`] for the [`history`](crate::history) checker.
//!
//! The pieces:
//!
//! - [`Rng`] and [`seed`]: a small seeded generator (the same seed, the same plan);
//! - [`Supervised`]: a process the harness runs itself (a `serve --http`, a `worker`, a
//!   proxy), started until it is [`Ready`] and started again after each kill;
//! - [`pid_wrapper`] and [`kill_pidfile`]: processes a client starts itself (a stdio server
//!   launched by an MCP SDK), which write their pid to a file through a small `sh` wrapper and
//!   are killed through it — only when their environment carries the run's mark;
//! - [`Target`] and [`killer`]: what may be killed, and the thread that kills a random target
//!   at random moments for a bounded number of cycles;
//! - [`Client`] and [`drive`]: one client (a raw JSON-RPC client over stdio
//!   ([`RawStdioClient`]) or HTTP ([`RawHttpClient`]), or a client program such as an MCP SDK
//!   driver ([`ScriptClient`])) and the loop that resends what is unanswered until every call
//!   is definitive.
//!
//! Nothing here knows a particular tool; see `docs/testing.md` for a whole run.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Receiver, RecvTimeoutError};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{json, Value};

use crate::history::{read_reply, Reading, Recorder};
use crate::stdio::line_reader;

/// A small seeded generator (splitmix64): the same seed, the same kill plan.
#[derive(Clone, Debug)]
pub struct Rng(pub u64);

impl Rng {
    /// The next 64 random bits.
    pub fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// Uniform in `lo..hi` (`lo` when the range is empty).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        if hi <= lo {
            return lo;
        }
        lo + self.next_u64() % (hi - lo)
    }

    /// A random element index of a slice of `len` (`len` > 0).
    pub fn index(&mut self, len: usize) -> usize {
        self.range(0, len as u64) as usize
    }
}

/// The seed of a run: the number in the environment variable `var` (to replay a run), or the
/// clock. Print it.
pub fn seed(var: &str) -> u64 {
    match std::env::var(var) {
        Ok(s) => s
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("{var} must be a number")),
        Err(_) => std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(1),
    }
}

/// The environment variable that replays a run's plan ([`start_run`]).
pub const SEED_ENV: &str = "TOOLLEDGER_KILL_SEED";

/// The environment variable that keeps a run's directory ([`start_run`]).
pub const KEEP_ENV: &str = "TOOLLEDGER_KILL_KEEP";

/// The start of a run called `label` (`about` says more, e.g. the backend): its seed
/// ([`seed`] of [`SEED_ENV`]) and a fresh directory for its logs, pid files and databases,
/// removed at the end unless [`KEEP_ENV`] is set. Both are printed on stderr.
pub fn start_run(label: &str, about: &str) -> (u64, tempfile::TempDir) {
    let seed = seed(SEED_ENV);
    eprintln!("{label}: {about}, seed {seed} ({SEED_ENV}={seed} replays the plan)");
    let mut dir = tempfile::tempdir().expect("a temporary directory");
    dir.disable_cleanup(std::env::var_os(KEEP_ENV).is_some());
    eprintln!(
        "{label}: files in {} ({KEEP_ENV}=1 keeps them)",
        dir.path().display()
    );
    (seed, dir)
}

/// One word quoted for `sh`.
pub fn sh_quote(s: &str) -> String {
    format!("'{}'", s.replace('\'', r"'\''"))
}

/// An `sh -c` script that writes its pid to `pidfile` and `exec`s `words` (so the pid is the
/// program's).
pub fn pid_wrapper(pidfile: &Path, words: &[String]) -> String {
    let mut script = format!(
        "echo $$ > {}; exec",
        sh_quote(&pidfile.display().to_string())
    );
    for w in words {
        script.push(' ');
        script.push_str(&sh_quote(w));
    }
    script
}

/// SIGKILLs the process `pidfile` names, when it is alive and its environment holds the entry
/// `mark` (`NAME=value`, set on every process of one run, so a stale pid file never kills a
/// stranger). Returns whether a signal was sent. Linux only (`/proc`); elsewhere `false`.
pub fn kill_pidfile(pidfile: &Path, mark: &str) -> bool {
    let Ok(text) = std::fs::read_to_string(pidfile) else {
        return false;
    };
    let Ok(pid) = text.trim().parse::<i32>() else {
        return false;
    };
    sigkill_marked(pid, mark)
}

#[cfg(target_os = "linux")]
fn sigkill_marked(pid: i32, mark: &str) -> bool {
    let Ok(environ) = std::fs::read(format!("/proc/{pid}/environ")) else {
        return false;
    };
    if !environ.split(|b| *b == 0).any(|kv| kv == mark.as_bytes()) {
        return false;
    }
    // SAFETY: kill(2) with a pid of this run (checked above) and SIGKILL.
    unsafe { libc::kill(pid, libc::SIGKILL) == 0 }
}

#[cfg(not(target_os = "linux"))]
fn sigkill_marked(_pid: i32, _mark: &str) -> bool {
    false
}

/// A child process SIGKILLed and reaped when dropped — when its test ends, passed or not.
#[derive(Debug)]
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A free TCP port on 127.0.0.1 (free when asked; a start that loses a race is retried by
/// [`Supervised::start`]).
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("a free port")
}

/// Builds a target of the workspace at `manifest_dir` with `cargo build --quiet
/// --message-format=json ARGS` (an example server, say: `["-p", "my-server", "--example",
/// "notes"]`) and returns the path of the executable named `name`. Uses the `cargo` that
/// runs the tests (`$CARGO`), else `cargo` on the path. Panics, with cargo's output, when the
/// build fails.
pub fn cargo_build(manifest_dir: &Path, args: &[&str], name: &str) -> PathBuf {
    let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
    let out = Command::new(cargo)
        .args(["build", "--quiet", "--message-format=json"])
        .args(args)
        .current_dir(manifest_dir)
        .output()
        .expect("cargo runs");
    assert!(
        out.status.success(),
        "building {name} failed:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l).ok())
        .filter(|m| m["reason"] == "compiler-artifact" && m["target"]["name"] == name)
        .find_map(|m| m["executable"].as_str().map(PathBuf::from))
        .unwrap_or_else(|| panic!("cargo names no executable {name}"))
}

/// When a [`Supervised`] process counts as started.
#[derive(Clone, Debug)]
pub enum Ready {
    /// As soon as it is spawned.
    Spawned,
    /// When 127.0.0.1:PORT accepts connections.
    Port(u16),
    /// When a line of its stderr contains this text.
    StderrContains(String),
}

type MakeCommand = Box<dyn Fn() -> Command + Send + Sync>;

/// A process the harness runs itself: started until [`Ready`] (a start that exits first — a
/// port not yet free — is tried again, for up to 60 s), SIGKILLed, started again. Its stderr
/// is appended to `log`. Dropping it kills it.
pub struct Supervised {
    name: String,
    make: MakeCommand,
    ready: Ready,
    log: PathBuf,
    child: Mutex<Option<Child>>,
}

impl Supervised {
    /// A process called `name` (in kill lists), made by `make` each time it starts.
    pub fn new(
        name: &str,
        ready: Ready,
        log: &Path,
        make: impl Fn() -> Command + Send + Sync + 'static,
    ) -> Supervised {
        Supervised {
            name: name.to_string(),
            make: Box::new(make),
            ready,
            log: log.to_path_buf(),
            child: Mutex::new(None),
        }
    }

    /// Its name.
    pub fn name(&self) -> &str {
        &self.name
    }

    fn spawn_ready(&self) -> Result<Child, String> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&self.log)
                .map_err(|e| format!("{}: log: {e}", self.name))?;
            let mut command = (self.make)();
            command.stdin(Stdio::null()).stdout(Stdio::null());
            let wants_line = matches!(self.ready, Ready::StderrContains(_));
            if wants_line {
                command.stderr(Stdio::piped());
            } else {
                command.stderr(log.try_clone().map_err(|e| e.to_string())?);
            }
            let mut child = command
                .spawn()
                .map_err(|e| format!("{}: does not start: {e}", self.name))?;
            let ready = match &self.ready {
                Ready::Spawned => true,
                Ready::Port(port) => loop {
                    if TcpStream::connect(("127.0.0.1", *port)).is_ok() {
                        break true;
                    }
                    if matches!(child.try_wait(), Ok(Some(_))) || Instant::now() > deadline {
                        break false;
                    }
                    std::thread::sleep(Duration::from_millis(25));
                },
                Ready::StderrContains(text) => {
                    let stderr = child.stderr.take().expect("piped");
                    let (tx, rx) = channel();
                    let (text, mut log) = (text.clone(), log);
                    std::thread::spawn(move || {
                        for line in BufReader::new(stderr).lines() {
                            let Ok(line) = line else { break };
                            let _ = writeln!(log, "{line}");
                            if line.contains(&text) {
                                let _ = tx.send(());
                            }
                        }
                    });
                    rx.recv_timeout(Duration::from_secs(60)).is_ok()
                }
            };
            if ready {
                return Ok(child);
            }
            let _ = child.kill();
            let _ = child.wait();
            if Instant::now() > deadline {
                return Err(format!(
                    "{}: not ready after 60 s (log in {})",
                    self.name,
                    self.log.display()
                ));
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Starts it (if it is not running) and waits until it is ready.
    pub fn start(&self) -> Result<(), String> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        if child.is_none() {
            *child = Some(self.spawn_ready()?);
        }
        Ok(())
    }

    /// SIGKILLs it and reaps it; `false` when it was not running.
    pub fn kill(&self) -> bool {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        match child.take() {
            Some(mut c) => {
                let _ = c.kill();
                let _ = c.wait();
                true
            }
            None => false,
        }
    }

    /// Starts it again when it ended by itself (a worker that gave up on a lost database,
    /// say); returns whether it had ended.
    pub fn revive(&self) -> Result<bool, String> {
        let mut child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        let ended = match child.as_mut() {
            Some(c) => matches!(c.try_wait(), Ok(Some(_))),
            None => false,
        };
        if ended {
            *child = Some(self.spawn_ready()?);
        }
        Ok(ended)
    }

    /// Its pid, while it runs.
    pub fn pid(&self) -> Option<u32> {
        let child = self.child.lock().unwrap_or_else(|e| e.into_inner());
        child.as_ref().map(Child::id)
    }
}

impl Drop for Supervised {
    fn drop(&mut self) {
        self.kill();
    }
}

/// Something the [`killer`] may kill.
pub enum Target<'a> {
    /// A supervised process: SIGKILLed, then started again after a random pause.
    Process(&'a Supervised),
    /// The process a pid file names (started by a client; see [`pid_wrapper`]), when its
    /// environment holds `mark`. Its client notices the loss and starts it again.
    PidFile {
        /// The name in kill lists.
        name: String,
        /// The pid file.
        pidfile: PathBuf,
        /// The `NAME=value` entry its environment must hold.
        mark: String,
    },
    /// Anything else (restarting a database server, say): the closure does the whole fault
    /// and says whether it happened.
    Custom {
        /// The name in kill lists.
        name: String,
        /// The fault.
        fault: Box<dyn Fn(&mut Rng) -> bool + Send + Sync + 'a>,
    },
}

impl Target<'_> {
    /// Its name in kill lists.
    pub fn name(&self) -> &str {
        match self {
            Target::Process(p) => p.name(),
            Target::PidFile { name, .. } | Target::Custom { name, .. } => name,
        }
    }
}

/// How the [`killer`] kills.
#[derive(Clone, Debug)]
pub struct KillPlan {
    /// How many kills at most.
    pub cycles: usize,
    /// The pause before each kill, in milliseconds (`lo..hi`).
    pub pause_ms: (u64, u64),
    /// How long a killed supervised process stays down, in milliseconds (`lo..hi`).
    pub down_ms: (u64, u64),
}

/// Kills a random target (one of those `eligible` allows at that moment) after a random pause,
/// [`KillPlan::cycles`] times or until `done`; starts a killed [`Supervised`] process again,
/// and one that ended by itself.
/// Returns the names of what it killed, in order. Prints one line per kill on stderr with
/// `label`.
pub fn killer(
    label: &str,
    rng: &mut Rng,
    targets: &[Target],
    plan: &KillPlan,
    eligible: &dyn Fn(&Target) -> bool,
    done: &AtomicBool,
) -> Result<Vec<String>, String> {
    let started = Instant::now();
    let mut kills = Vec::new();
    while kills.len() < plan.cycles && !done.load(Ordering::Relaxed) {
        // Sleep in small steps, so the end of the run is not held up.
        let pause = Duration::from_millis(rng.range(plan.pause_ms.0, plan.pause_ms.1));
        let until = Instant::now() + pause;
        while Instant::now() < until && !done.load(Ordering::Relaxed) {
            std::thread::sleep(Duration::from_millis(20));
        }
        if done.load(Ordering::Relaxed) {
            break;
        }
        for t in targets {
            if let Target::Process(p) = t {
                if p.revive()? {
                    eprintln!("{label}: {} had ended by itself: started again", p.name());
                }
            }
        }
        let live: Vec<&Target> = targets.iter().filter(|t| eligible(t)).collect();
        if live.is_empty() {
            continue;
        }
        let target = live[rng.index(live.len())];
        let killed = match target {
            Target::Process(p) => {
                let killed = p.kill();
                if killed {
                    std::thread::sleep(Duration::from_millis(
                        rng.range(plan.down_ms.0, plan.down_ms.1),
                    ));
                    p.start()?;
                }
                killed
            }
            Target::PidFile { pidfile, mark, .. } => kill_pidfile(pidfile, mark),
            Target::Custom { fault, .. } => fault(rng),
        };
        if killed {
            eprintln!(
                "{label}: {:>6} ms SIGKILL {}",
                started.elapsed().as_millis(),
                target.name()
            );
            kills.push(target.name().to_string());
        }
    }
    Ok(kills)
}

/// One call of a client: the operation id and what is sent under it.
#[derive(Clone, Debug, PartialEq)]
pub struct Call {
    /// The operation id (the idempotency key, also inside `arguments`).
    pub id: String,
    /// The tool.
    pub tool: String,
    /// The arguments (the same on every send).
    pub arguments: Value,
    /// For a multi-round tool: the `inputResponses` a raw client answers an
    /// `input_required` first round with (sending the continuation with the round's
    /// `requestState`). `None`: single round.
    pub input_responses: Option<Value>,
}

impl Call {
    /// A single-round call.
    pub fn new(id: &str, tool: &str, arguments: Value) -> Call {
        Call {
            id: id.to_string(),
            tool: tool.to_string(),
            arguments,
            input_responses: None,
        }
    }
}

/// The continuation a raw client sends after `result`, when it asks for input and the call
/// has its answers.
fn continuation(call: &Call, result: &Value) -> Option<(String, Value)> {
    if result["resultType"] != "input_required" {
        return None;
    }
    let state = result["requestState"].as_str()?.to_string();
    Some((state, call.input_responses.clone()?))
}

/// What one connection of a client did with a list of calls, made in order.
#[derive(Debug, Default)]
pub struct ClientRun {
    /// `(index into the calls, tool result)` per answered call.
    pub answers: Vec<(usize, Value)>,
    /// The call in flight when the connection was lost (later calls were not sent).
    pub lost_at: Option<usize>,
    /// The connection could not be opened, or was lost between calls (nothing in flight).
    pub lost_idle: bool,
    /// Anything that is neither an answer nor a loss (a protocol error): the run fails.
    pub unexpected: Vec<String>,
}

/// One client: makes `calls` in order over one fresh connection (starting its own server,
/// for a stdio client) and says what happened.
pub trait Client: Send {
    /// Its name.
    fn name(&self) -> &str;
    /// One connection's run.
    fn run(&mut self, calls: &[Call]) -> ClientRun;
}

/// How [`drive`] retries.
#[derive(Clone, Debug)]
pub struct DrivePolicy {
    /// How often one operation may be sent before the run fails.
    pub max_sends: u32,
    /// How often an `outcome_unknown` answer is sent again (with `unknown_pause` between
    /// rounds) before it is taken as the answer, to settle afterwards.
    pub unknown_retries: u32,
    /// The pause before the next round after an `outcome_unknown` or `operation_in_progress`.
    pub unsure_pause: Duration,
    /// The pause before the next round after a lost connection.
    pub loss_pause: Duration,
    /// How long the client may take for all its calls.
    pub deadline: Duration,
}

impl Default for DrivePolicy {
    fn default() -> Self {
        DrivePolicy {
            max_sends: 200,
            unknown_retries: 5,
            unsure_pause: Duration::from_millis(1000),
            loss_pause: Duration::from_millis(200),
            deadline: Duration::from_secs(300),
        }
    }
}

/// What [`drive`] counted.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DriveStats {
    /// Connections opened.
    pub rounds: usize,
    /// Connections lost (with a call in flight or not).
    pub losses: usize,
}

/// Makes every call of `calls` through `client` until each is definitive (a success or a
/// refusal) or an `outcome_unknown` with its status reference resent
/// [`DrivePolicy::unknown_retries`] times: a lost connection means a fresh one, which sends
/// every call not yet settled again, with the same operation id and arguments. Registers each
/// call in `recorder` and records every send and what came back.
pub fn drive(
    client: &mut dyn Client,
    calls: &[Call],
    recorder: &Recorder,
    policy: &DrivePolicy,
) -> Result<DriveStats, String> {
    for c in calls {
        recorder.register(&c.id, &c.tool, c.arguments.clone());
    }
    let started = Instant::now();
    let mut stats = DriveStats::default();
    let mut unknown_sends = vec![0u32; calls.len()];
    loop {
        let settled = |i: usize| -> bool {
            let op = recorder.operation(&calls[i].id).expect("registered");
            match op.last_reading() {
                Some(r) if r.is_definitive() => true,
                Some(Reading::OutcomeUnknown {
                    status_ref: Some(_),
                }) => unknown_sends[i] > policy.unknown_retries,
                _ => false,
            }
        };
        let pending: Vec<usize> = (0..calls.len()).filter(|&i| !settled(i)).collect();
        if pending.is_empty() {
            return Ok(stats);
        }
        if started.elapsed() > policy.deadline {
            return Err(format!(
                "{}: {} call(s) not settled after {} s ({} rounds)",
                client.name(),
                pending.len(),
                policy.deadline.as_secs(),
                stats.rounds
            ));
        }
        stats.rounds += 1;
        let batch: Vec<Call> = pending.iter().map(|&i| calls[i].clone()).collect();
        let run = client.run(&batch);
        if !run.unexpected.is_empty() {
            return Err(format!(
                "{}: unexpected: {:?}",
                client.name(),
                run.unexpected
            ));
        }
        let mut unsure = false;
        for (k, reply) in &run.answers {
            let i = pending[*k];
            recorder.sent(&calls[i].id);
            match read_reply(reply) {
                Reading::OutcomeUnknown { .. } => {
                    unknown_sends[i] += 1;
                    unsure = true;
                }
                Reading::InProgress { .. } | Reading::Unavailable => unsure = true,
                _ => {}
            }
            recorder.replied(&calls[i].id, reply.clone());
        }
        if let Some(k) = run.lost_at {
            recorder.sent(&calls[pending[k]].id);
            recorder.lost(&calls[pending[k]].id);
        }
        for &i in &pending {
            let op = recorder.operation(&calls[i].id).expect("registered");
            if op.sends > policy.max_sends {
                return Err(format!(
                    "{}: {} sent {} times without settling",
                    client.name(),
                    calls[i].id,
                    op.sends
                ));
            }
        }
        if run.lost_at.is_some() || run.lost_idle {
            stats.losses += 1;
            std::thread::sleep(policy.loss_pause);
        } else if unsure {
            std::thread::sleep(policy.unsure_pause);
        }
    }
}

fn tools_call(id: u64, call: &Call, round: Option<&(String, Value)>) -> Value {
    let mut params = json!({"name": call.tool, "arguments": call.arguments,
                            "_meta": crate::stdio::meta()});
    if let Some((state, responses)) = round {
        params["requestState"] = json!(state);
        params["inputResponses"] = responses.clone();
    }
    json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params})
}

/// A raw JSON-RPC client over stdio: each run spawns the server command `make` builds
/// (wrap it with [`pid_wrapper`] to make it a [`Target::PidFile`]) and sends MCP 2026-07-28
/// `tools/call` lines (per-request `_meta`, no handshake), one at a time.
pub struct RawStdioClient {
    name: String,
    make: MakeCommand,
    /// How long one reply may take before the run fails.
    pub reply_timeout: Duration,
}

impl RawStdioClient {
    /// A client called `name` of the servers `make` builds.
    pub fn new(name: &str, make: impl Fn() -> Command + Send + Sync + 'static) -> Self {
        RawStdioClient {
            name: name.to_string(),
            make: Box::new(make),
            reply_timeout: Duration::from_secs(120),
        }
    }
}

struct Spawned {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl Drop for Spawned {
    fn drop(&mut self) {
        self.stdin.take();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Client for RawStdioClient {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&mut self, calls: &[Call]) -> ClientRun {
        let mut run = ClientRun::default();
        let mut command = (self.make)();
        command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        let Ok(mut child) = command.spawn() else {
            run.lost_idle = true;
            return run;
        };
        let rx = line_reader(child.stdout.take().expect("piped"));
        let mut s = Spawned {
            stdin: child.stdin.take(),
            child,
            lines: rx,
        };
        let mut next_id = 0u64;
        for (i, call) in calls.iter().enumerate() {
            let mut round = None;
            'rounds: loop {
                next_id += 1;
                let id = next_id;
                let line = format!("{}\n", tools_call(id, call, round.as_ref()));
                let stdin = s.stdin.as_mut().expect("open");
                if stdin
                    .write_all(line.as_bytes())
                    .and_then(|()| stdin.flush())
                    .is_err()
                {
                    run.lost_at = Some(i);
                    return run;
                }
                loop {
                    match s.lines.recv_timeout(self.reply_timeout) {
                        Ok(line) => {
                            let Ok(v) = serde_json::from_str::<Value>(&line) else {
                                run.unexpected.push(line);
                                return run;
                            };
                            if v.get("id").is_none() {
                                continue; // a notification
                            }
                            if v["id"] != id || v.get("result").is_none() {
                                run.unexpected.push(line);
                                return run;
                            }
                            if let Some(next) = continuation(call, &v["result"]) {
                                round = Some(next);
                                continue 'rounds;
                            }
                            run.answers.push((i, v["result"].clone()));
                            break 'rounds;
                        }
                        Err(RecvTimeoutError::Disconnected) => {
                            run.lost_at = Some(i);
                            return run;
                        }
                        Err(RecvTimeoutError::Timeout) => {
                            run.unexpected
                                .push(format!("no reply to {} within the timeout", call.id));
                            return run;
                        }
                    }
                }
            }
        }
        run
    }
}

/// A raw JSON-RPC client over streamable HTTP: one hand-written HTTP/1.1 `POST` per call to
/// `http://ADDR/mcp` (MCP 2026-07-28, per-request `_meta`, a bearer token), JSON or
/// server-sent-event answers. A refused connection, a cut response or a 5xx without a
/// JSON-RPC body is a loss.
pub struct RawHttpClient {
    name: String,
    addr: String,
    token: String,
    /// How long one exchange may take before it counts as lost.
    pub timeout: Duration,
}

impl RawHttpClient {
    /// A client called `name` of the server at `addr` (`HOST:PORT`) with a bearer `token`.
    pub fn new(name: &str, addr: &str, token: &str) -> Self {
        RawHttpClient {
            name: name.to_string(),
            addr: addr.to_string(),
            token: token.to_string(),
            timeout: Duration::from_secs(120),
        }
    }

    fn exchange(&self, body: &str, tool: &str) -> Option<Value> {
        let mut stream = TcpStream::connect(&self.addr).ok()?;
        stream.set_read_timeout(Some(self.timeout)).ok()?;
        let head = format!(
            "POST /mcp HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             Authorization: Bearer {}\r\nMCP-Protocol-Version: 2026-07-28\r\n\
             Mcp-Method: tools/call\r\nMcp-Name: {tool}\r\nContent-Length: {}\r\n\r\n",
            self.addr,
            self.token,
            body.len()
        );
        stream.write_all(head.as_bytes()).ok()?;
        stream.write_all(body.as_bytes()).ok()?;
        let mut raw = Vec::new();
        stream.read_to_end(&mut raw).ok()?;
        let raw = String::from_utf8_lossy(&raw);
        let (head, rest) = raw.split_once("\r\n\r\n")?;
        let body = if head
            .to_ascii_lowercase()
            .contains("transfer-encoding: chunked")
        {
            dechunk(rest)?
        } else {
            rest.to_string()
        };
        if let Ok(v) = serde_json::from_str::<Value>(&body) {
            return Some(v);
        }
        body.lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("jsonrpc").is_some())
    }
}

fn dechunk(mut raw: &str) -> Option<String> {
    let mut out = String::new();
    loop {
        let (size, rest) = raw.split_once("\r\n")?;
        let n = usize::from_str_radix(size.trim(), 16).ok()?;
        if n == 0 {
            return Some(out);
        }
        out.push_str(rest.get(..n)?);
        raw = rest.get(n + 2..)?;
    }
}

impl Client for RawHttpClient {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&mut self, calls: &[Call]) -> ClientRun {
        let mut run = ClientRun::default();
        for (i, call) in calls.iter().enumerate() {
            let mut round = None;
            loop {
                let body = tools_call(i as u64 + 1, call, round.as_ref()).to_string();
                match self.exchange(&body, &call.tool) {
                    Some(v) if v.get("result").is_some() => {
                        if let Some(next) = continuation(call, &v["result"]) {
                            round = Some(next);
                            continue;
                        }
                        run.answers.push((i, v["result"].clone()));
                        break;
                    }
                    Some(v)
                        if v.get("jsonrpc").is_none() && v["error"]["code"] == "unavailable" =>
                    {
                        // The HTTP layer's own 503 (a store still reconnecting, a full
                        // server): nothing was decided, as for an exchange that was lost.
                        run.lost_at = Some(i);
                        return run;
                    }
                    Some(v) => {
                        // A JSON-RPC error with no result: the server is shutting down or the
                        // request was refused before the tool ran.
                        run.unexpected.push(v.to_string());
                        return run;
                    }
                    None => {
                        run.lost_at = Some(i);
                        return run;
                    }
                }
            }
        }
        run
    }
}

type MakeSpec = Box<dyn Fn(&[Call]) -> Value + Send + Sync>;

/// A client program (an MCP SDK driver) run once per connection as
/// `PROGRAM ARGS… SPEC_JSON`, where `spec` builds the JSON argument from the calls. It prints
/// one JSON line per event: `{"i": N, "result": …}` for an answer, `{"i": N,
/// "transport_error": …}` (or `{"transport_error": …}`) for a loss, and `{"connected": …}`;
/// exit 3 means a lost connection. The repository's Python SDK (`tests/proxy/py_client.py`)
/// and TypeScript SDK (`tests/js/proxy/ts_client.mjs`) drivers speak it.
pub struct ScriptClient {
    name: String,
    program: PathBuf,
    args: Vec<String>,
    spec: MakeSpec,
    log: PathBuf,
    /// How long one run may take before it counts as hung and fails.
    pub hang: Duration,
}

impl ScriptClient {
    /// A client called `name`: `program args…` with the spec `spec` makes; stderr to `log`.
    pub fn new(
        name: &str,
        program: &Path,
        args: Vec<String>,
        log: &Path,
        spec: impl Fn(&[Call]) -> Value + Send + Sync + 'static,
    ) -> Self {
        ScriptClient {
            name: name.to_string(),
            program: program.to_path_buf(),
            args,
            spec: Box::new(spec),
            log: log.to_path_buf(),
            hang: Duration::from_secs(180),
        }
    }
}

impl Client for ScriptClient {
    fn name(&self) -> &str {
        &self.name
    }

    fn run(&mut self, calls: &[Call]) -> ClientRun {
        let mut run = ClientRun::default();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .map(Stdio::from)
            .unwrap_or_else(|_| Stdio::null());
        let spawned = Command::new(&self.program)
            .args(&self.args)
            .arg((self.spec)(calls).to_string())
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(log)
            .spawn();
        let mut child = match spawned {
            Ok(c) => c,
            Err(e) => {
                run.unexpected.push(format!("does not start: {e}"));
                return run;
            }
        };
        let rx = line_reader(child.stdout.take().expect("piped"));
        let started = Instant::now();
        loop {
            match rx.recv_timeout(Duration::from_millis(500)) {
                Ok(line) => {
                    let Ok(v) = serde_json::from_str::<Value>(&line) else {
                        run.unexpected.push(line);
                        continue;
                    };
                    let i = v["i"].as_u64().map(|i| i as usize);
                    if let (Some(i), Some(result)) = (i, v.get("result")) {
                        run.answers.push((i, result.clone()));
                    } else if v.get("transport_error").is_some() {
                        match i {
                            Some(i) => run.lost_at = Some(i),
                            None => run.lost_idle = true,
                        }
                    } else if v.get("connected").is_none() {
                        run.unexpected.push(line);
                    }
                }
                Err(RecvTimeoutError::Timeout) => {
                    if started.elapsed() > self.hang {
                        let _ = child.kill();
                        let _ = child.wait();
                        run.unexpected.push(format!(
                            "no end after {} s ({} answers)",
                            self.hang.as_secs(),
                            run.answers.len()
                        ));
                        return run;
                    }
                }
                Err(RecvTimeoutError::Disconnected) => break,
            }
        }
        let code = child.wait().ok().and_then(|s| s.code()).unwrap_or(-1);
        match code {
            0 => {}
            3 => {
                if run.lost_at.is_none() {
                    run.lost_idle = true;
                }
            }
            other => run.unexpected.push(format!("exit {other}")),
        }
        run
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_seed_gives_the_same_plan() {
        let (mut a, mut b) = (Rng(42), Rng(42));
        let x: Vec<u64> = (0..8).map(|_| a.range(10, 20)).collect();
        let y: Vec<u64> = (0..8).map(|_| b.range(10, 20)).collect();
        assert_eq!(x, y);
        assert!(x.iter().all(|v| (10..20).contains(v)));
        assert_ne!(Rng(43).next_u64(), Rng(42).next_u64());
        assert_eq!(a.range(5, 5), 5);
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(sh_quote("a'b"), r"'a'\''b'");
        let script = pid_wrapper(Path::new("/tmp/x.pid"), &["echo".into(), "it's".into()]);
        assert_eq!(script, r"echo $$ > '/tmp/x.pid'; exec 'echo' 'it'\''s'");
    }

    /// A client that answers the first call of each connection and loses the next, until
    /// every call is answered: `drive` resends the lost ones under the same id.
    struct Flaky {
        replies: usize,
    }

    impl Client for Flaky {
        fn name(&self) -> &str {
            "flaky"
        }
        fn run(&mut self, calls: &[Call]) -> ClientRun {
            let mut run = ClientRun::default();
            for (i, c) in calls.iter().enumerate() {
                if i == 1 {
                    run.lost_at = Some(1);
                    break;
                }
                self.replies += 1;
                let s = json!({"id": c.id, "replayed": false});
                run.answers.push((
                    i,
                    json!({"isError": false, "structuredContent": s,
                           "content": [{"type": "text", "text": s.to_string()}]}),
                ));
            }
            run
        }
    }

    #[test]
    fn drive_resends_what_a_lost_connection_left_unanswered() {
        let calls: Vec<Call> = (0..4)
            .map(|i| Call::new(&format!("op-{i}"), "t", json!({"i": i})))
            .collect();
        let rec = Recorder::new();
        let policy = DrivePolicy {
            loss_pause: Duration::ZERO,
            ..DrivePolicy::default()
        };
        let stats = drive(&mut Flaky { replies: 0 }, &calls, &rec, &policy).unwrap();
        assert_eq!(stats.rounds, 4);
        assert_eq!(stats.losses, 3);
        let h = rec.history();
        let report = crate::history::Checker::new(&h).check();
        report.assert_ok();
        assert_eq!(report.operations, 4);
        // op-1..op-3 were each lost once before their answer.
        assert_eq!(report.transport_losses, 3);
        assert_eq!(report.sends, 7);
    }
}
