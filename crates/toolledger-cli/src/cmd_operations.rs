//! `toolledger operations list|show`: find and explain operations, read-only.
//!
//! **`list`** prints the operations a filter selects, newest first (by creation order;
//! `--oldest-first` reverses it): status reference, tool, key, principal (`tenant/subject`),
//! state and age in seconds. On a terminal it prints an aligned table; otherwise, or with
//! `--json`, one JSON object per line. `--state` takes the ledger's state names
//! (`in_progress`, `applied`, `partial`, `accepted`, `processing`, `succeeded`,
//! `outcome_unknown`, `failed`, `dead`); another name is `UNKNOWN_STATE` (exit 2).
//!
//! **`show`** prints one operation's timeline as one JSON object (see
//! [`toolledger::operations::timeline`]): the ledger row, every event, every claim with its
//! lease and fencing token, the deferred intent, the outbox event, the local receipt and an
//! operator's resolution. Arguments and results are shown, with the values of members named
//! like secrets redacted. An unknown operation is `NOT_FOUND` (exit 1); a key held by several
//! principals without `--tenant`/`--subject` is `AMBIGUOUS_OPERATION` (exit 2).
//!
//! Both open the ledger read-only (`common::Access::ReadOnly`): they never create, migrate
//! or write anything.

use std::io::IsTerminal;
use std::sync::Arc;

use serde_json::json;
use toolledger::clock::{ManualClock, SharedClock, SystemClock};
use toolledger::operations::{self, Found, ListQuery, OperationSummary, Selector};
use toolledger::{Error, OperationState};
use toolledger_cli::common::{self, StoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};

use crate::cmd_dispatch::block_on;

/// The state names, in the order of the ledger's vocabulary.
const STATES: &str = "in_progress, applied, partial, accepted, processing, succeeded, \
                      outcome_unknown, failed, dead";

/// The `operations` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum OperationsCmd {
    /// List operations (newest first): status_ref, tool, key, principal, state, age.
    List(ListArgs),
    /// Show one operation's timeline (JSON): row, events, claims, leases and fencing tokens,
    /// intent, outbox event, receipt, resolution.
    Show(ShowArgs),
}

impl OperationsCmd {
    /// The ledger flags of the subcommand.
    pub fn store(&self) -> &StoreArgs {
        match self {
            OperationsCmd::List(a) => &a.store,
            OperationsCmd::Show(a) => &a.store,
        }
    }
}

/// `operations list` options.
#[derive(clap::Args, Debug)]
pub struct ListArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Only operations in this state (repeatable): in_progress, applied, partial, accepted,
    /// processing, succeeded, outcome_unknown, failed, dead.
    #[arg(long = "state", value_name = "STATE")]
    pub states: Vec<String>,
    /// Only operations of this tool.
    #[arg(long)]
    pub tool: Option<String>,
    /// Only operations created at least this many seconds ago.
    #[arg(long, value_name = "SECS")]
    pub older_than: Option<i64>,
    /// At most this many operations (1 to 10000).
    #[arg(long, default_value_t = 100)]
    pub limit: i64,
    /// Oldest first instead of newest first.
    #[arg(long)]
    pub oldest_first: bool,
    /// One JSON object per line even on a terminal.
    #[arg(long)]
    pub json: bool,
    /// Measure ages at this Unix time instead of the wall clock (tests).
    #[arg(long)]
    pub clock_epoch: Option<i64>,
}

/// `operations show` options.
#[derive(clap::Args, Debug)]
pub struct ShowArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// The operation's status reference (or use --tool and --key).
    #[arg(value_name = "REF")]
    pub status_ref: Option<String>,
    /// The operation's tool (with --key).
    #[arg(long)]
    pub tool: Option<String>,
    /// The operation's idempotency key (with --tool).
    #[arg(long)]
    pub key: Option<String>,
    /// The principal's tenant, when several principals hold the key.
    #[arg(long)]
    pub tenant: Option<String>,
    /// The principal's name, when several principals hold the key.
    #[arg(long)]
    pub subject: Option<String>,
    /// Measure ages and leases at this Unix time instead of the wall clock (tests).
    #[arg(long)]
    pub clock_epoch: Option<i64>,
}

fn clock(epoch: Option<i64>) -> SharedClock {
    match epoch {
        Some(t) => Arc::new(ManualClock::new(t)),
        None => Arc::new(SystemClock),
    }
}

/// The list query of `args`, or the usage error its flags make.
fn query(args: &ListArgs, now: i64) -> Result<ListQuery, Failure> {
    let mut states = Vec::new();
    for s in &args.states {
        let state = OperationState::parse(s).ok_or_else(|| {
            Failure::explained("UNKNOWN_STATE", format!("--state must be one of {STATES}"))
        })?;
        if !states.contains(&state) {
            states.push(state);
        }
    }
    let max = i64::from(operations::MAX_LIST_LIMIT);
    if !(1..=max).contains(&args.limit) {
        return Err(Failure::explained(
            "USAGE_ERROR",
            format!("--limit must be 1 to {max}"),
        ));
    }
    if args.older_than.is_some_and(|s| s < 0) {
        return Err(Failure::explained(
            "USAGE_ERROR",
            "--older-than must be 0 or more seconds",
        ));
    }
    Ok(ListQuery {
        states,
        tool: args.tool.clone(),
        older_than: args.older_than,
        now,
        limit: u32::try_from(args.limit).unwrap_or(operations::MAX_LIST_LIMIT),
        oldest_first: args.oldest_first,
    })
}

/// The selector of `args`, or the usage error its flags make.
fn selector(args: &ShowArgs) -> Result<Selector, Failure> {
    match (&args.status_ref, &args.tool, &args.key) {
        (Some(r), None, None) if args.tenant.is_none() && args.subject.is_none() => {
            Ok(Selector::StatusRef(r.clone()))
        }
        (None, Some(tool), Some(key)) => Ok(Selector::ToolKey {
            tool: tool.clone(),
            key: key.clone(),
            tenant: args.tenant.clone(),
            subject: args.subject.clone(),
        }),
        _ => Err(Failure::explained(
            "USAGE_ERROR",
            "give a status reference, or --tool and --key (with --tenant and --subject \
             when several principals hold the key)",
        )),
    }
}

/// The aligned table a terminal gets.
fn table(rows: &[OperationSummary]) -> String {
    let header = ["STATUS_REF", "TOOL", "KEY", "PRINCIPAL", "STATE", "AGE_S"];
    let cells: Vec<[String; 6]> = rows
        .iter()
        .map(|r| {
            [
                r.status_ref.clone(),
                r.tool.clone(),
                r.key.clone(),
                format!("{}/{}", r.tenant, r.subject),
                r.state.as_str().to_string(),
                r.age_seconds.to_string(),
            ]
        })
        .collect();
    let mut widths = header.map(|h| h.chars().count());
    for row in &cells {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cols: [&str; 6]| {
        let mut out = String::new();
        for (i, (c, w)) in cols.iter().zip(widths).enumerate() {
            if i == 5 {
                out.push_str(&format!("{c:>w$}"));
            } else {
                out.push_str(&format!("{c:<w$}  "));
            }
        }
        out.trim_end().to_string()
    };
    let mut out = line(header);
    out.push('\n');
    for row in &cells {
        out.push_str(&line([
            &row[0], &row[1], &row[2], &row[3], &row[4], &row[5],
        ]));
        out.push('\n');
    }
    out
}

/// Runs one `operations` subcommand on the ledger `store` resolves to.
pub fn run(cmd: OperationsCmd, store: StoreConfig) -> Result<Outcome, Failure> {
    match cmd {
        OperationsCmd::List(args) => {
            let now = clock(args.clock_epoch).now();
            let q = query(&args, now)?;
            let rows = block_on(async move {
                let ledger = store.open()?;
                ledger
                    .read(move |tx| operations::list(tx, &q))
                    .await
                    .map_err(Failure::from)
            })?;
            if !args.json && std::io::stdout().is_terminal() {
                print!("{}", table(&rows));
            } else {
                for r in &rows {
                    println!("{}", json!(r));
                }
            }
            Ok(Outcome::Pass)
        }
        OperationsCmd::Show(args) => {
            let now = clock(args.clock_epoch).now();
            let sel = selector(&args)?;
            let found = block_on(async move {
                let ledger = store.open()?;
                ledger
                    .read(move |tx| operations::timeline(tx, &sel, now))
                    .await
                    .map_err(Failure::from)
            })?;
            match found {
                Found::One(timeline) => {
                    common::print_json(&timeline);
                    Ok(Outcome::Pass)
                }
                Found::Absent => Err(Failure::Refused(Error::not_found())),
                Found::Ambiguous(n) => Err(Failure::explained(
                    "AMBIGUOUS_OPERATION",
                    format!("{n} principals hold this key; add --tenant and --subject"),
                )),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn row(key: &str, subject: &str, age: i64) -> OperationSummary {
        OperationSummary {
            status_ref: format!("op_{key}"),
            tool: "create_issue".into(),
            key: key.into(),
            tenant: "acme".into(),
            subject: subject.into(),
            effect_kind: "inline".into(),
            state: OperationState::InProgress,
            created_at: 0,
            updated_at: 0,
            age_seconds: age,
            lease_until: None,
        }
    }

    #[test]
    fn the_table_aligns_every_column_and_right_aligns_ages() {
        let t = table(&[row("case-73", "alice", 5), row("k", "bartholomew", 12345)]);
        let lines: Vec<&str> = t.lines().collect();
        assert_eq!(lines.len(), 3);
        assert_eq!(
            lines[0],
            "STATUS_REF  TOOL          KEY      PRINCIPAL         STATE        AGE_S"
        );
        assert_eq!(
            lines[1],
            "op_case-73  create_issue  case-73  acme/alice        in_progress      5"
        );
        assert_eq!(
            lines[2],
            "op_k        create_issue  k        acme/bartholomew  in_progress  12345"
        );
    }
}
