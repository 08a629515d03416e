//! The history checker: what every client sent and saw, against what the ledger and the
//! effect tables hold.
//!
//! A test that drives guarded tools under faults (killed processes, lost connections, a
//! restarted database) records each call in a [`Recorder`]: the operation id, the tool and
//! its arguments when the operation is first chosen ([`Recorder::register`]), then every
//! send ([`Recorder::sent`]) and what came back — a tool result ([`Recorder::replied`]) or a
//! transport loss while the call was in flight ([`Recorder::lost`]). Afterwards a
//! [`Checker`] takes the [`History`], the ledger's rows ([`LedgerCli::rows`], or any list of
//! [`LedgerRow`]s), the effects counted per operation id (a SQL query on the effect's
//! database — [`count_effects_sqlite`], [`count_effects_store`] — or any map the user
//! builds), optionally one more answer per operation from a fresh replay pass, and the
//! outcome of `toolledger audit` ([`LedgerCli::audit`]), and reports:
//!
//! - **duplicates**: an operation id with more than one effect;
//! - **changed results**: two definitive answers for one id that differ (after
//!   [`Checker::normalize`], which by default blanks only the `replayed` markers), a replay
//!   included;
//! - **acknowledged lost**: an operation answered with success whose ledger row is missing,
//!   or whose effect is missing when a success means one ([`Checker::expects_effect`]);
//! - **undecided**: an operation whose last answer is neither definitive nor an explicit
//!   `outcome_unknown` / `operation_in_progress` carrying its `status_ref` (the reason to
//!   query), or a ledger row left unfinished for an operation no client was told was unsure;
//! - **strays**: effects or ledger rows of no recorded operation, and effects of refused
//!   calls;
//! - **audit**: the audit's failure, when one was given.
//!
//! [`Report::assert_ok`] panics with every problem listed; [`Report::summary`] is the one-line
//! figure a run prints. Nothing here knows a particular tool: the tool results are read the
//! way the MCP contract writes them (`isError`, an in-band `{"error": {"code", "status_ref"}}`
//! in the first text content), and the effect is whatever the user's query counts.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::{Arc, Mutex};

use serde_json::{json, Value};
use toolledger::effect::{EffectTx, RowExt};
use toolledger::store::Store;

/// What one client saw of one send.
#[derive(Clone, Debug, PartialEq)]
pub enum Observation {
    /// A tool result (`CallToolResult`, `isError` included).
    Reply(Value),
    /// The connection was lost (or the process behind it died) while the call was in flight:
    /// the client does not know whether it ran.
    Lost,
}

/// One operation: the id chosen before its first send, and everything sent and seen for it.
#[derive(Clone, Debug, PartialEq)]
pub struct Operation {
    /// The operation id (the idempotency key).
    pub id: String,
    /// The tool called.
    pub tool: String,
    /// The arguments sent (the same on every send).
    pub arguments: Value,
    /// How often it was sent.
    pub sends: u32,
    /// What came back, in order.
    pub observations: Vec<Observation>,
}

impl Operation {
    /// The replies received, in order.
    pub fn replies(&self) -> impl Iterator<Item = &Value> {
        self.observations.iter().filter_map(|o| match o {
            Observation::Reply(v) => Some(v),
            Observation::Lost => None,
        })
    }

    /// The first definitive reply (a success or a refusal), if any.
    pub fn first_definitive(&self) -> Option<&Value> {
        self.replies().find(|v| read_reply(v).is_definitive())
    }

    /// How the last observation reads (`None`: never answered).
    pub fn last_reading(&self) -> Option<Reading> {
        match self.observations.last()? {
            Observation::Reply(v) => Some(read_reply(v)),
            Observation::Lost => None,
        }
    }

    /// How many sends were lost in flight.
    pub fn losses(&self) -> usize {
        self.observations
            .iter()
            .filter(|o| **o == Observation::Lost)
            .count()
    }
}

/// Everything every client sent and saw, by operation id.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct History {
    /// The operations, by id.
    pub operations: BTreeMap<String, Operation>,
}

/// A thread-safe recorder of a [`History`]; clones share one history.
#[derive(Clone, Debug, Default)]
pub struct Recorder {
    inner: Arc<Mutex<History>>,
}

impl Recorder {
    /// An empty history.
    pub fn new() -> Recorder {
        Recorder::default()
    }

    fn with<T>(&self, f: impl FnOnce(&mut History) -> T) -> T {
        let mut h = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        f(&mut h)
    }

    /// Declares an operation before its first send. Registering an id twice with other
    /// arguments or another tool panics: one id is one intent.
    pub fn register(&self, id: &str, tool: &str, arguments: Value) {
        self.with(|h| {
            if let Some(op) = h.operations.get(id) {
                assert!(
                    op.tool == tool && op.arguments == arguments,
                    "operation {id} registered twice with different intents"
                );
                return;
            }
            h.operations.insert(
                id.to_string(),
                Operation {
                    id: id.to_string(),
                    tool: tool.to_string(),
                    arguments,
                    sends: 0,
                    observations: Vec::new(),
                },
            );
        })
    }

    fn op<T>(&self, id: &str, f: impl FnOnce(&mut Operation) -> T) -> T {
        self.with(|h| {
            let op = h
                .operations
                .get_mut(id)
                .unwrap_or_else(|| panic!("operation {id} was not registered"));
            f(op)
        })
    }

    /// One send of `id`.
    pub fn sent(&self, id: &str) {
        self.op(id, |op| op.sends += 1)
    }

    /// A tool result came back for `id`.
    pub fn replied(&self, id: &str, reply: Value) {
        self.op(id, |op| op.observations.push(Observation::Reply(reply)))
    }

    /// The connection was lost while `id` was in flight.
    pub fn lost(&self, id: &str) {
        self.op(id, |op| op.observations.push(Observation::Lost))
    }

    /// The operation as recorded so far.
    pub fn operation(&self, id: &str) -> Option<Operation> {
        self.with(|h| h.operations.get(id).cloned())
    }

    /// A copy of the history so far.
    pub fn history(&self) -> History {
        self.with(|h| h.clone())
    }
}

/// How a tool result reads under the MCP contract.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Reading {
    /// `isError` is not true: the tool's result. Definitive.
    Success,
    /// An in-band error other than the unsure ones below (`code` from the error object, `None`
    /// for an error text that is not the ledger's JSON). Definitive.
    Refused {
        /// The error code.
        code: Option<String>,
    },
    /// `outcome_unknown`: the effect may or may not have happened; `status_ref` says what to
    /// query.
    OutcomeUnknown {
        /// The operation's status reference, when the reply carried one.
        status_ref: Option<String>,
    },
    /// `operation_in_progress`: another attempt holds the operation.
    InProgress {
        /// The operation's status reference, when the reply carried one.
        status_ref: Option<String>,
    },
    /// `unavailable`: nothing was decided; retry.
    Unavailable,
}

impl Reading {
    /// A success or a refusal: the answer every retry must repeat.
    pub fn is_definitive(&self) -> bool {
        matches!(self, Reading::Success | Reading::Refused { .. })
    }

    /// Unsure, but explicitly so, with the reference to query.
    pub fn is_explicitly_unsure(&self) -> bool {
        matches!(
            self,
            Reading::OutcomeUnknown {
                status_ref: Some(_)
            } | Reading::InProgress {
                status_ref: Some(_)
            }
        )
    }
}

/// The ledger's in-band error object of a tool result, if its first text content holds one.
pub fn error_object(reply: &Value) -> Option<Value> {
    let text = reply["content"][0]["text"].as_str()?;
    let v: Value = serde_json::from_str(text).ok()?;
    v.get("error").filter(|e| e.is_object()).cloned()
}

/// Reads a tool result (see [`Reading`]).
pub fn read_reply(reply: &Value) -> Reading {
    if reply["isError"] != true {
        return Reading::Success;
    }
    let Some(error) = error_object(reply) else {
        return Reading::Refused { code: None };
    };
    let status_ref = error["status_ref"].as_str().map(str::to_string);
    match error["code"].as_str() {
        Some("outcome_unknown") => Reading::OutcomeUnknown { status_ref },
        Some("operation_in_progress") => Reading::InProgress { status_ref },
        Some("unavailable") => Reading::Unavailable,
        code => Reading::Refused {
            code: code.map(str::to_string),
        },
    }
}

/// The tool's answer in a tool result, whatever client library printed it: `isError`
/// (absent is `false`), `content`, `structuredContent` (absent when `null`) and `_meta` —
/// without the members the protocol version or the library adds around it (`resultType`
/// of MCP 2026-07-28, say).
pub fn tool_answer(reply: &Value) -> Value {
    let mut out = serde_json::Map::new();
    out.insert("isError".into(), Value::Bool(reply["isError"] == true));
    for name in ["content", "structuredContent", "_meta"] {
        match reply.get(name) {
            None | Some(Value::Null) => {}
            Some(v) => {
                out.insert(name.into(), v.clone());
            }
        }
    }
    Value::Object(out)
}

/// The default normalization: the [`tool_answer`] as compact JSON with every `replayed`
/// marker blanked, in the structured content and in JSON carried inside text content alike.
/// Nothing else may differ between two answers for one operation.
pub fn without_replayed(reply: &Value) -> String {
    blank_members(reply, &["replayed"])
}

/// The [`tool_answer`] as compact JSON with the values of the named members blanked wherever
/// they appear, in nested objects and in JSON text inside strings (a replay of a deferred
/// operation, for one, says `"delivery": "local_replay"` where the first answer said
/// `"fresh"`).
pub fn blank_members(reply: &Value, names: &[&str]) -> String {
    fn walk(v: &Value, names: &[&str]) -> Value {
        match v {
            Value::Object(m) => Value::Object(
                m.iter()
                    .map(|(k, v)| {
                        if names.contains(&k.as_str()) {
                            (k.clone(), Value::String("_".into()))
                        } else {
                            (k.clone(), walk(v, names))
                        }
                    })
                    .collect(),
            ),
            Value::Array(a) => Value::Array(a.iter().map(|v| walk(v, names)).collect()),
            Value::String(s) => match serde_json::from_str::<Value>(s) {
                Ok(inner @ (Value::Object(_) | Value::Array(_))) => {
                    Value::String(walk(&inner, names).to_string())
                }
                _ => v.clone(),
            },
            _ => v.clone(),
        }
    }
    walk(&tool_answer(reply), names).to_string()
}

/// One row of the ledger, as `toolledger operations list --json` prints it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LedgerRow {
    /// The tool.
    pub tool: String,
    /// The idempotency key (the operation id).
    pub key: String,
    /// The state (`applied`, `succeeded`, `outcome_unknown`, …).
    pub state: String,
    /// The status reference.
    pub status_ref: String,
}

impl LedgerRow {
    /// Whether the row is unfinished, waiting for a worker, a status query or an operator:
    /// `in_progress`, `accepted`, `processing`, `outcome_unknown` or `dead`.
    pub fn is_unfinished(&self) -> bool {
        matches!(
            self.state.as_str(),
            "in_progress" | "accepted" | "processing" | "outcome_unknown" | "dead"
        )
    }
}

/// The `toolledger` binary pointed at one ledger: its rows and its audit, on either backend.
#[derive(Clone, Debug)]
pub struct LedgerCli {
    /// The binary.
    pub bin: PathBuf,
    /// The store flags (`--db PATH`, or `--database-url URL --backend-id ID`, …).
    pub store_args: Vec<String>,
    /// Environment variables to set (the key variables, say).
    pub env: Vec<(String, String)>,
}

impl LedgerCli {
    /// `bin` with `store_args` and no extra environment.
    pub fn new(bin: impl Into<PathBuf>, store_args: Vec<String>) -> LedgerCli {
        LedgerCli {
            bin: bin.into(),
            store_args,
            env: Vec::new(),
        }
    }

    /// A command running `toolledger ARGS` on this ledger.
    pub fn command(&self, args: &[&str]) -> Command {
        let mut c = Command::new(&self.bin);
        c.args(args).args(&self.store_args);
        for (k, v) in &self.env {
            c.env(k, v);
        }
        c
    }

    fn run(&self, args: &[&str]) -> Result<String, String> {
        let out = self
            .command(args)
            .output()
            .map_err(|e| format!("`toolledger {}` does not start: {e}", args[0]))?;
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        if !out.status.success() {
            return Err(format!(
                "`toolledger {}` exited with {:?}: {} {}",
                args.join(" "),
                out.status.code(),
                stdout.trim(),
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        Ok(stdout)
    }

    /// Every ledger row (`operations list --json`, at most 10 000; more is an error).
    pub fn rows(&self) -> Result<Vec<LedgerRow>, String> {
        let out = self.run(&["operations", "list", "--limit", "10000", "--json"])?;
        let mut rows = Vec::new();
        for line in out.lines().filter(|l| !l.trim().is_empty()) {
            let v: Value =
                serde_json::from_str(line).map_err(|e| format!("not a JSON line ({e}): {line}"))?;
            let field = |name: &str| {
                v[name]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("a row without `{name}`: {line}"))
            };
            rows.push(LedgerRow {
                tool: field("tool")?,
                key: field("key")?,
                state: field("state")?,
                status_ref: field("status_ref")?,
            });
        }
        if rows.len() >= 10_000 {
            return Err("the ledger holds 10 000 operations or more: too many to check".into());
        }
        Ok(rows)
    }

    /// `toolledger audit`: `Ok` when it exits 0 with the gate `PASS`, its output otherwise.
    pub fn audit(&self) -> Result<(), String> {
        let out = self.run(&["audit"])?;
        let v: Value =
            serde_json::from_str(out.trim()).map_err(|e| format!("audit output ({e}): {out}"))?;
        if v["gate"] == "PASS" {
            Ok(())
        } else {
            Err(out)
        }
    }
}

/// Effects per operation id, from a SQL query on a SQLite file that returns rows of
/// `(operation id TEXT, count INTEGER)` — e.g.
/// `SELECT reference, count(*) FROM charges GROUP BY reference`. Rows with a `NULL` id are
/// counted under the empty id (an effect of no call).
pub fn count_effects_sqlite(path: &Path, sql: &str) -> Result<BTreeMap<String, u64>, String> {
    let conn = rusqlite::Connection::open_with_flags(
        path,
        rusqlite::OpenFlags::SQLITE_OPEN_READ_ONLY | rusqlite::OpenFlags::SQLITE_OPEN_NO_MUTEX,
    )
    .map_err(|e| format!("the effect database does not open: {e}"))?;
    conn.busy_timeout(std::time::Duration::from_secs(10))
        .map_err(|e| e.to_string())?;
    let mut stmt = conn.prepare(sql).map_err(|e| format!("the query: {e}"))?;
    let rows = stmt
        .query_map([], |r| {
            Ok((r.get::<_, Option<String>>(0)?, r.get::<_, i64>(1)?))
        })
        .map_err(|e| format!("the query: {e}"))?;
    let mut out = BTreeMap::new();
    for row in rows {
        let (id, n) = row.map_err(|e| format!("the query: {e}"))?;
        *out.entry(id.unwrap_or_default()).or_default() += n.max(0) as u64;
    }
    Ok(out)
}

/// Effects per operation id, from a SQL query run through a [`Store`] (either backend; the
/// effect's tables live in the store's database), returning `(operation id, count)` rows.
/// Runs on a thread of its own, so it may be called from anywhere.
pub fn count_effects_store(store: &Store, sql: &str) -> Result<BTreeMap<String, u64>, String> {
    let (store, sql) = (store.clone(), sql.to_string());
    std::thread::spawn(move || {
        store.read_blocking(move |tx: &mut dyn EffectTx| {
            let mut out: BTreeMap<String, u64> = BTreeMap::new();
            for row in tx.query(&sql, &[])? {
                *out.entry(row.opt_text(0)?.unwrap_or_default()).or_default() +=
                    row.int(1)?.max(0) as u64;
            }
            Ok::<_, toolledger::Error>(out)
        })
    })
    .join()
    .map_err(|_| "the effect query panicked".to_string())?
    .map_err(|e| format!("the effect query: {}", e.code.as_str()))
}

type Normalize = Box<dyn Fn(&Value) -> String>;
type ExpectsEffect = Box<dyn Fn(&Operation, &Value) -> bool>;

/// The checks over one [`History`] (see the module documentation). Build it, give it what the
/// databases hold, call [`Checker::check`].
pub struct Checker<'a> {
    history: &'a History,
    ledger: Option<Vec<LedgerRow>>,
    effects: Option<BTreeMap<String, u64>>,
    replays: BTreeMap<String, Value>,
    audit: Option<Result<(), String>>,
    normalize: Normalize,
    expects_effect: ExpectsEffect,
}

impl<'a> Checker<'a> {
    /// A checker of `history`, with nothing read yet.
    pub fn new(history: &'a History) -> Checker<'a> {
        Checker {
            history,
            ledger: None,
            effects: None,
            replays: BTreeMap::new(),
            audit: None,
            normalize: Box::new(without_replayed),
            expects_effect: Box::new(|_, _| true),
        }
    }

    /// The ledger's rows (every row of the ledger the clients used).
    pub fn ledger(mut self, rows: Vec<LedgerRow>) -> Self {
        self.ledger = Some(rows);
        self
    }

    /// The effects per operation id (every effect in the effect's tables).
    pub fn effects(mut self, counts: BTreeMap<String, u64>) -> Self {
        self.effects = Some(counts);
        self
    }

    /// One more answer for an operation, asked for after the run (a replay pass): it must be
    /// the operation's first definitive answer.
    pub fn replay(mut self, id: &str, reply: Value) -> Self {
        self.replays.insert(id.to_string(), reply);
        self
    }

    /// The outcome of the ledger's audit ([`LedgerCli::audit`]).
    pub fn audit(mut self, outcome: Result<(), String>) -> Self {
        self.audit = Some(outcome);
        self
    }

    /// How two answers are compared: they are the same when this gives the same text
    /// (default [`without_replayed`]).
    pub fn normalize(mut self, f: impl Fn(&Value) -> String + 'static) -> Self {
        self.normalize = Box::new(f);
        self
    }

    /// Whether a successful answer means an effect exists (default: always). A tool whose
    /// success may be a business refusal with no effect says so here.
    pub fn expects_effect(mut self, f: impl Fn(&Operation, &Value) -> bool + 'static) -> Self {
        self.expects_effect = Box::new(f);
        self
    }

    /// Runs every check.
    pub fn check(self) -> Report {
        let mut r = Report {
            operations: self.history.operations.len(),
            ..Report::default()
        };
        let mut rows: BTreeMap<(&str, &str), Vec<&LedgerRow>> = BTreeMap::new();
        for row in self.ledger.iter().flatten() {
            rows.entry((&row.tool, &row.key)).or_default().push(row);
        }
        let empty = BTreeMap::new();
        let effects = self.effects.as_ref().unwrap_or(&empty);

        for (id, n) in effects {
            if *n > 1 {
                r.duplicates
                    .push(format!("{id}: {n} effects for one operation id"));
            }
            if *n > 0 && !self.history.operations.contains_key(id) {
                r.strays
                    .push(format!("{id:?}: {n} effect(s) of no recorded call"));
            }
        }
        let recorded: BTreeSet<(&str, &str)> = self
            .history
            .operations
            .values()
            .map(|o| (o.tool.as_str(), o.id.as_str()))
            .collect();
        for ((tool, key), _) in rows.iter() {
            if !recorded.contains(&(*tool, *key)) {
                r.strays
                    .push(format!("{tool}/{key}: a ledger row of no recorded call"));
            }
        }

        for op in self.history.operations.values() {
            r.sends += op.sends as usize;
            r.transport_losses += op.losses();
            let effect_count = effects.get(&op.id).copied().unwrap_or(0);
            let op_rows = rows.get(&(op.tool.as_str(), op.id.as_str()));

            // No two different definitive answers (a replay pass included).
            let first = op.first_definitive();
            if let Some(first) = first {
                let want = (self.normalize)(first);
                let later = op
                    .replies()
                    .filter(|v| read_reply(v).is_definitive())
                    .chain(self.replays.get(&op.id));
                for other in later {
                    let got = (self.normalize)(other);
                    if got != want {
                        r.changed_results
                            .push(format!("{}: first {want}\n   then {got}", op.id));
                        break;
                    }
                }
            }

            // Every acknowledged success is in the ledger, with its effect.
            if let Some(first) = first.filter(|v| read_reply(v) == Reading::Success) {
                if self.ledger.is_some() && op_rows.is_none() {
                    r.acknowledged_lost
                        .push(format!("{}: acknowledged, but no ledger row", op.id));
                } else if self.effects.is_some()
                    && effect_count == 0
                    && (self.expects_effect)(op, first)
                {
                    r.acknowledged_lost
                        .push(format!("{}: acknowledged, but no effect", op.id));
                }
            }
            if let Some(first) = first.filter(|v| read_reply(v) != Reading::Success) {
                if effect_count > 0 {
                    r.strays.push(format!(
                        "{}: refused ({}), yet {effect_count} effect(s)",
                        op.id,
                        (self.normalize)(first)
                    ));
                }
            }

            // Definitive, or explicitly unsure with a reason; nothing lost in between.
            let last = op.last_reading();
            let undecided_before = r.undecided.len();
            match &last {
                Some(l) if l.is_definitive() => {}
                Some(l) if l.is_explicitly_unsure() => {
                    if let Reading::OutcomeUnknown {
                        status_ref: Some(sr),
                    }
                    | Reading::InProgress {
                        status_ref: Some(sr),
                    } = l
                    {
                        r.unsure.push((op.id.clone(), sr.clone()));
                    }
                }
                _ if op.sends == 0 && op.observations.is_empty() => {
                    r.never_sent += 1;
                }
                other => r.undecided.push(format!(
                    "{}: the last answer is {}",
                    op.id,
                    match other {
                        None => "a transport loss (or none)".to_string(),
                        Some(l) => format!("{l:?} without a status reference"),
                    }
                )),
            }
            if let Some(op_rows) = op_rows.filter(|_| r.undecided.len() == undecided_before) {
                let told_unsure = last.as_ref().is_some_and(Reading::is_explicitly_unsure);
                for row in op_rows.iter().filter(|row| row.is_unfinished()) {
                    if !told_unsure {
                        r.undecided.push(format!(
                            "{}: the ledger row is {} but the client was told {:?}",
                            op.id, row.state, last
                        ));
                    }
                }
            }

            // A commit whose reply the client did not get.
            let committed = effect_count > 0
                || op_rows.is_some_and(|rs| rs.iter().any(|row| !row.is_unfinished()));
            if op.losses() > 0 && committed {
                r.replies_lost_after_commit += 1;
            }
        }
        r.audit = self.audit;
        r
    }
}

/// What a [`Checker`] found.
#[derive(Clone, Debug, Default)]
pub struct Report {
    /// Operations recorded.
    pub operations: usize,
    /// Sends, retries included.
    pub sends: usize,
    /// Sends lost in flight.
    pub transport_losses: usize,
    /// Operations registered but never sent.
    pub never_sent: usize,
    /// Operations with a lost send that committed all the same (the case the ledger is for).
    pub replies_lost_after_commit: usize,
    /// Operation ids with more than one effect.
    pub duplicates: Vec<String>,
    /// Operation ids with two different definitive answers.
    pub changed_results: Vec<String>,
    /// Acknowledged successes with no ledger row or no effect.
    pub acknowledged_lost: Vec<String>,
    /// Operations left neither definitive nor explicitly unsure.
    pub undecided: Vec<String>,
    /// Effects or ledger rows of no recorded call, effects of refused calls.
    pub strays: Vec<String>,
    /// Operations whose last answer was an explicit `outcome_unknown` / `operation_in_progress`:
    /// `(operation id, status_ref)`, to settle.
    pub unsure: Vec<(String, String)>,
    /// The audit's outcome, when one was given.
    pub audit: Option<Result<(), String>>,
}

impl Report {
    /// Every problem found, one line each (empty: the history is good).
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        let mut add = |what: &str, list: &[String]| {
            out.extend(list.iter().map(|p| format!("{what}: {p}")));
        };
        add("duplicate effect", &self.duplicates);
        add("changed result", &self.changed_results);
        add("acknowledged operation lost", &self.acknowledged_lost);
        add("undecided operation", &self.undecided);
        add("stray", &self.strays);
        if let Some(Err(e)) = &self.audit {
            out.push(format!("audit failed: {e}"));
        }
        out
    }

    /// Panics listing every problem, when there is one.
    pub fn assert_ok(&self) {
        let problems = self.problems();
        assert!(
            problems.is_empty(),
            "the history checker found {} problem(s):\n{}",
            problems.len(),
            problems.join("\n")
        );
    }

    /// The figures as one JSON object: operations, sends, never sent, transport losses, replies
    /// lost after commit, duplicates, changed results, acknowledged lost, undecided, strays,
    /// unsure, audit.
    pub fn summary(&self) -> Value {
        json!({
            "operations": self.operations,
            "sends": self.sends,
            "never_sent": self.never_sent,
            "transport_losses": self.transport_losses,
            "replies_lost_after_commit": self.replies_lost_after_commit,
            "duplicates": self.duplicates.len(),
            "changed_results": self.changed_results.len(),
            "acknowledged_lost": self.acknowledged_lost.len(),
            "undecided": self.undecided.len(),
            "strays": self.strays.len(),
            "unsure": self.unsure.len(),
            "audit": match &self.audit {
                None => "not run",
                Some(Ok(())) => "PASS",
                Some(Err(_)) => "FAIL",
            },
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ok(id: &str, effect: i64, replayed: bool) -> Value {
        let s = json!({"operationId": id, "effectId": effect, "replayed": replayed,
                       "state": "applied"});
        json!({"isError": false, "structuredContent": s,
               "content": [{"type": "text", "text": s.to_string()}]})
    }

    fn err(code: &str, status_ref: Option<&str>) -> Value {
        let mut e = json!({"code": code, "message": "m"});
        if let Some(sr) = status_ref {
            e["status_ref"] = json!(sr);
        }
        json!({"isError": true,
               "content": [{"type": "text", "text": json!({"error": e}).to_string()}]})
    }

    fn row(key: &str, state: &str) -> LedgerRow {
        LedgerRow {
            tool: "create_issue".into(),
            key: key.into(),
            state: state.into(),
            status_ref: format!("op_{key}"),
        }
    }

    /// Two operations: `a` answered at once, `b` lost in flight, retried, replayed.
    fn good() -> (Recorder, Vec<LedgerRow>, BTreeMap<String, u64>) {
        let rec = Recorder::new();
        rec.register("a", "create_issue", json!({"title": "a"}));
        rec.register("b", "create_issue", json!({"title": "b"}));
        rec.sent("a");
        rec.replied("a", ok("a", 1, false));
        rec.sent("b");
        rec.lost("b");
        rec.sent("b");
        rec.replied("b", ok("b", 2, true));
        let rows = vec![row("a", "applied"), row("b", "applied")];
        let effects = BTreeMap::from([("a".to_string(), 1), ("b".to_string(), 1)]);
        (rec, rows, effects)
    }

    #[test]
    fn a_good_history_passes() {
        let (rec, rows, effects) = good();
        let h = rec.history();
        let report = Checker::new(&h)
            .ledger(rows)
            .effects(effects)
            .replay("a", ok("a", 1, true))
            .audit(Ok(()))
            .check();
        report.assert_ok();
        assert_eq!(report.sends, 3);
        assert_eq!(report.transport_losses, 1);
        assert_eq!(report.replies_lost_after_commit, 1);
        assert_eq!(report.summary()["duplicates"], 0);
        assert_eq!(report.summary()["audit"], "PASS");
    }

    #[test]
    fn a_duplicated_effect_fails() {
        let (rec, rows, mut effects) = good();
        effects.insert("b".into(), 2);
        let h = rec.history();
        let report = Checker::new(&h).ledger(rows).effects(effects).check();
        assert_eq!(report.duplicates.len(), 1, "{:?}", report.problems());
        assert!(report.duplicates[0].starts_with("b:"));
        assert_eq!(report.problems().len(), 1);
    }

    #[test]
    fn a_changed_result_fails_in_a_retry_and_in_a_replay() {
        let (rec, rows, effects) = good();
        rec.sent("a");
        rec.replied("a", ok("a", 7, true));
        let h = rec.history();
        let report = Checker::new(&h)
            .ledger(rows.clone())
            .effects(effects.clone())
            .check();
        assert_eq!(report.changed_results.len(), 1, "{:?}", report.problems());

        let (rec, ..) = good();
        let h = rec.history();
        let report = Checker::new(&h)
            .ledger(rows)
            .effects(effects)
            .replay("b", ok("b", 3, true))
            .check();
        assert_eq!(report.changed_results.len(), 1, "{:?}", report.problems());
        assert!(report.changed_results[0].starts_with("b:"));
    }

    #[test]
    fn a_lost_acknowledged_operation_fails() {
        // No ledger row.
        let (rec, mut rows, effects) = good();
        rows.retain(|r| r.key != "a");
        let h = rec.history();
        let report = Checker::new(&h).ledger(rows).effects(effects).check();
        assert_eq!(report.acknowledged_lost.len(), 1, "{:?}", report.problems());
        // No effect.
        let (rec, rows, mut effects) = good();
        effects.remove("a");
        let h = rec.history();
        let report = Checker::new(&h)
            .ledger(rows.clone())
            .effects(effects.clone())
            .check();
        assert_eq!(report.acknowledged_lost.len(), 1, "{:?}", report.problems());
        // ... unless a success of this tool need not have one.
        let report = Checker::new(&h)
            .ledger(rows)
            .effects(effects)
            .expects_effect(|op, _| op.id != "a")
            .check();
        report.assert_ok();
    }

    #[test]
    fn an_operation_left_undecided_fails_and_an_explicit_unknown_does_not() {
        let (rec, mut rows, effects) = good();
        rec.register("c", "create_issue", json!({"title": "c"}));
        rec.sent("c");
        rec.lost("c");
        let h = rec.history();
        let report = Checker::new(&h)
            .ledger(rows.clone())
            .effects(effects.clone())
            .check();
        assert_eq!(report.undecided.len(), 1, "{:?}", report.problems());

        rec.sent("c");
        rec.replied("c", err("outcome_unknown", Some("op_c")));
        rows.push(row("c", "outcome_unknown"));
        let h = rec.history();
        let report = Checker::new(&h)
            .ledger(rows.clone())
            .effects(effects.clone())
            .check();
        report.assert_ok();
        assert_eq!(report.unsure, vec![("c".to_string(), "op_c".to_string())]);

        // An unknown without the reference to query is not explicit.
        rec.sent("c");
        rec.replied("c", err("outcome_unknown", None));
        let h = rec.history();
        let report = Checker::new(&h).ledger(rows).effects(effects).check();
        assert_eq!(report.undecided.len(), 1, "{:?}", report.problems());
    }

    #[test]
    fn an_unfinished_ledger_row_the_client_was_not_told_of_fails() {
        let (rec, mut rows, effects) = good();
        rows[0].state = "in_progress".into();
        let h = rec.history();
        let report = Checker::new(&h).ledger(rows).effects(effects).check();
        assert_eq!(report.undecided.len(), 1, "{:?}", report.problems());
    }

    #[test]
    fn strays_and_a_failed_audit_fail() {
        let (rec, mut rows, mut effects) = good();
        rec.register("r", "create_issue", json!({"title": ""}));
        rec.sent("r");
        rec.replied("r", err("invalid_arguments", None));
        effects.insert("r".into(), 1);
        effects.insert("zzz".into(), 1);
        rows.push(row("nobody", "applied"));
        let h = rec.history();
        let report = Checker::new(&h)
            .ledger(rows)
            .effects(effects)
            .audit(Err("gate FAIL".into()))
            .check();
        assert_eq!(report.strays.len(), 3, "{:?}", report.problems());
        assert!(report.problems().iter().any(|p| p.starts_with("audit")));
        assert_eq!(report.summary()["audit"], "FAIL");
    }

    #[test]
    fn readings_follow_the_contract() {
        assert_eq!(read_reply(&ok("a", 1, false)), Reading::Success);
        assert_eq!(
            read_reply(&err("outcome_unknown", Some("op_1"))),
            Reading::OutcomeUnknown {
                status_ref: Some("op_1".into())
            }
        );
        assert_eq!(read_reply(&err("unavailable", None)), Reading::Unavailable);
        assert!(!read_reply(&err("unavailable", None)).is_definitive());
        assert_eq!(
            read_reply(&json!({"isError": true, "content": [{"type": "text", "text": "boom"}]})),
            Reading::Refused { code: None }
        );
        // Blanking touches the marker only, in structured content and in JSON text.
        assert_eq!(
            without_replayed(&ok("a", 1, false)),
            without_replayed(&ok("a", 1, true))
        );
        assert_ne!(
            without_replayed(&ok("a", 1, false)),
            without_replayed(&ok("a", 2, false))
        );
        // The envelope a protocol version or a client library adds is not the answer.
        let mut enveloped = ok("a", 1, true);
        enveloped["resultType"] = json!("complete");
        enveloped["structuredContent"]["replayed"] = json!(true);
        assert_eq!(
            without_replayed(&ok("a", 1, false)),
            without_replayed(&enveloped)
        );
    }
}
