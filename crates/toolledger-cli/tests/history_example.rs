//! The example of docs/testing.md: the testkit's kill harness and history checker pointed at
//! a user's own guarded tool — `create_note` of `crates/toolledger-mcp/examples/guarded_tool.rs`,
//! whose effect is a row in the application's own `notes` table.
//!
//! Three clients call at once, each over stdio to a server process of its own on one SQLite
//! file; a seeded killer SIGKILLs those servers at random moments; each client resends every
//! call not answered definitively, under the same operation id, from a fresh server. Then the
//! checker reads the ledger (`toolledger operations list`), counts notes per operation id
//! (each note's text is its operation id, so a `GROUP BY` counts them), replays every call
//! once more, runs `toolledger audit`, and finds no duplicate, no lost acknowledged note and
//! no changed answer. `TOOLLEDGER_KILL_SEED` replays a run.

#![cfg(unix)]

mod support;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

use serde_json::json;
use toolledger_testkit::history::{count_effects_sqlite, Checker, LedgerCli, Recorder};
use toolledger_testkit::kill::{
    cargo_build, drive, killer, pid_wrapper, start_run, Call, Client, DrivePolicy, KillPlan,
    RawStdioClient, Rng, Target,
};

const CLIENTS: usize = 3;
const CALLS_PER_CLIENT: usize = 200;

#[test]
fn a_guarded_tool_keeps_its_history_under_random_sigkills() {
    // The user's server, built by cargo, and the database all its processes share.
    let server = cargo_build(
        Path::new(env!("CARGO_MANIFEST_DIR")),
        &["-p", "toolledger-mcp", "--example", "guarded_tool"],
        "guarded_tool",
    );
    let (seed, dir) = start_run("history_example", "notes");
    let database = dir.path().join("notes.sqlite");
    // Every server process carries this mark, so the killer never hits a stranger.
    let mark = ("NOTES_KILL_RUN", dir.path().display().to_string());
    // One start before the run creates the database and its key file (no race for them).
    // (It ends at once, its stdin being empty.)
    let _ = Command::new(&server)
        .env("TOOLLEDGER_DB", &database)
        .env("TOOLLEDGER_PRINCIPAL", "alice")
        .stdin(std::process::Stdio::null())
        .stderr(std::process::Stdio::null())
        .status()
        .unwrap();
    assert!(database.exists());
    let mut rng = Rng(seed);

    // One client per server process; each process records its pid for the killer.
    let mut clients = Vec::new();
    let mut targets = Vec::new();
    for c in 0..CLIENTS {
        let pidfile = dir.path().join(format!("server-{c}.pid"));
        let script = pid_wrapper(&pidfile, &[server.display().to_string()]);
        let (env, database) = (mark.clone(), database.clone());
        clients.push(RawStdioClient::new(&format!("client-{c}"), move || {
            let mut command = Command::new("sh");
            command
                .args(["-c", &script])
                .env(env.0, &env.1)
                .env("TOOLLEDGER_DB", &database)
                .env("TOOLLEDGER_PRINCIPAL", "alice");
            command
        }));
        targets.push(Target::PidFile {
            name: format!("server-{c}"),
            pidfile,
            mark: format!("{}={}", mark.0, mark.1),
        });
    }
    let calls: Vec<Vec<Call>> = (0..CLIENTS)
        .map(|c| {
            (0..CALLS_PER_CLIENT)
                .map(|i| {
                    let id = format!("note-{seed:x}-{c}-{i}");
                    Call::new(&id, "create_note", json!({"operation_id": id, "text": id}))
                })
                .collect()
        })
        .collect();

    // The run: clients at work, the killer at random moments, until every call is settled.
    let recorder = Recorder::new();
    let (done, finished) = (AtomicBool::new(false), AtomicUsize::new(0));
    let kills = std::thread::scope(|s| {
        for (client, calls) in clients.iter_mut().zip(&calls) {
            let (recorder, done, finished) = (&recorder, &done, &finished);
            s.spawn(move || {
                let r = drive(client, calls, recorder, &DrivePolicy::default());
                if finished.fetch_add(1, Ordering::Relaxed) + 1 == CLIENTS || r.is_err() {
                    done.store(true, Ordering::Relaxed);
                }
                r.unwrap()
            });
        }
        let plan = KillPlan {
            cycles: 6,
            pause_ms: (20, 120),
            down_ms: (0, 0),
        };
        killer(
            "history_example",
            &mut rng,
            &targets,
            &plan,
            &|_| true,
            &done,
        )
        .unwrap()
    });

    // The check: the ledger, the notes per operation id, one replay per call, the audit.
    let ledger = LedgerCli::new(
        support::BIN,
        vec!["--db".into(), database.display().to_string()],
    );
    let notes =
        count_effects_sqlite(&database, "SELECT text, count(*) FROM notes GROUP BY text").unwrap();
    let history = recorder.history();
    let mut checker = Checker::new(&history)
        .ledger(ledger.rows().unwrap())
        .effects(notes)
        .audit(ledger.audit());
    for (client, calls) in clients.iter_mut().zip(&calls) {
        let run = client.run(calls);
        assert_eq!(run.answers.len(), calls.len(), "{run:?}");
        for (i, reply) in run.answers {
            checker = checker.replay(&calls[i].id, reply);
        }
    }
    let report = checker.check();
    println!(
        "{}",
        json!({"history_example": {"seed": seed, "kills": kills.len(), "report": report.summary()}})
    );
    report.assert_ok();
    assert_eq!(report.operations, CLIENTS * CALLS_PER_CLIENT);
    assert!(!kills.is_empty(), "the run killed a server");
}
