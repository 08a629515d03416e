//! Errors a user can act on, through the built binary: command-line usage errors in the exit-2
//! JSON shape (help and the version still print normally), hints that name the flag or the
//! command to run and never a path or a typed secret, I/O failures that say which file is the
//! problem, and `approve`, whose every failure leaves the ledger file byte-identical.

mod support;

use serde_json::Value;
use sha2::Digest;
use support::runtime::*;

/// The `(code, message)` of an exit-2 run: nothing on stdout, one JSON object on stderr.
fn exit_2(r: &Run) -> (String, String) {
    assert_eq!(r.code, 2, "stdout {:?} stderr {:?}", r.stdout, r.stderr);
    assert_eq!(r.stdout, "");
    assert_eq!(r.stderr.lines().count(), 1, "{:?}", r.stderr);
    let v: Value = serde_json::from_str(r.stderr.trim())
        .unwrap_or_else(|e| panic!("stderr is not JSON ({e}): {:?}", r.stderr));
    (
        v["error"]["code"].as_str().unwrap().to_string(),
        v["error"]["message"]
            .as_str()
            .unwrap_or_default()
            .to_string(),
    )
}

#[test]
fn usage_errors_are_json_with_the_command_to_ask_for_help() {
    let cases: &[(&[&str], &str, &str)] = &[
        (&[], "a subcommand is required", "`toolledger --help`"),
        (
            &["frobnicate"],
            "unknown subcommand 'frobnicate'",
            "`toolledger --help`",
        ),
        (
            &["worker", "--batch", "many"],
            "invalid value for --batch",
            "`toolledger worker --help`",
        ),
        (
            &["principal", "add", "alice"],
            "missing required argument --tenant",
            "`toolledger principal add --help`",
        ),
        (
            &["principal", "token", "revoke", "alice"],
            "missing required argument <TOKEN_ID>",
            "`toolledger principal token revoke --help`",
        ),
        (
            &["audit", "--no-such-flag"],
            "unexpected argument '--no-such-flag'",
            "`toolledger audit --help`",
        ),
        (
            &["serve", "--sqlite-synchronous", "sometimes"],
            "invalid value for --sqlite-synchronous",
            "`toolledger serve --help`",
        ),
    ];
    for (args, what, help) in cases {
        let (code, message) = exit_2(&run(args));
        assert_eq!(code, "USAGE_ERROR", "{args:?}");
        assert!(message.contains(what), "{args:?}: {message}");
        assert!(message.contains(help), "{args:?}: {message}");
    }
}

#[test]
fn usage_errors_never_echo_a_value_the_user_typed() {
    let secret_url = "postgres://admin:hunter2@db.internal/ledger";
    for args in [
        &["audit", secret_url][..],
        &["worker", "--batch", "/home/someone/private"],
        &[
            "audit",
            "--db",
            "/tmp/x",
            "--database-url",
            secret_url,
            "--sqlite-synchronous",
            "normal",
        ],
    ] {
        let r = run(args);
        let (code, message) = exit_2(&r);
        assert_eq!(code, "USAGE_ERROR", "{args:?}");
        for private in ["hunter2", "db.internal", "/home/someone", "/tmp/x"] {
            assert!(!r.stderr.contains(private), "{args:?}: {message}");
        }
    }
}

#[test]
fn help_and_version_still_print_normally_and_exit_0() {
    for args in [
        &["--help"][..],
        &["worker", "--help"],
        &["principal", "token", "--help"],
        &["principal", "add", "-h"],
    ] {
        let r = run(args);
        assert_eq!(r.code, 0, "{args:?}: {}", r.stderr);
        assert!(r.stdout.contains("Usage: toolledger"), "{args:?}");
        assert_eq!(r.stderr, "");
    }
    let r = run(&["--version"]);
    assert_eq!(r.code, 0);
    // The version, then the commit the binary was built from (this checkout's, in tests).
    let version = r.stdout.trim();
    let commit = version
        .strip_prefix(&format!(
            "toolledger {} (commit ",
            env!("CARGO_PKG_VERSION")
        ))
        .and_then(|rest| rest.strip_suffix(')'))
        .unwrap_or_else(|| panic!("--version: {version}"));
    let head = std::process::Command::new("git")
        .args(["rev-parse", "HEAD"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .ok()
        .filter(|o| o.status.success())
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    match head {
        Some(head) => assert!(head.starts_with(commit) && commit.len() == 12, "{version}"),
        None => eprintln!("SKIPPED: no git checkout; --version said {version}"),
    }
}

#[test]
fn completions_and_the_man_page_name_every_command() {
    for shell in ["bash", "zsh", "fish"] {
        let r = run(&["completions", shell]);
        assert_eq!(r.code, 0, "{shell}: {}", r.stderr);
        for command in ["proxy", "serve", "operations", "resolve"] {
            assert!(
                r.stdout.contains(command),
                "{shell} completion lacks {command}"
            );
        }
    }
    let r = run(&["completions", "tcsh"]);
    assert_eq!(r.code, 2, "an unknown shell is a usage error");
    let r = run(&["manpage"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(
        r.stdout.starts_with(".ie") || r.stdout.contains(".TH toolledger"),
        "roff"
    );
    for command in ["proxy", "serve", "operations", "resolve", "completions"] {
        assert!(r.stdout.contains(command), "the man page lacks {command}");
    }
}

#[test]
fn a_database_io_error_says_which_file_without_the_path() {
    let d = Db::new();
    let missing_dir = d.dir.path().join("no-such-dir").join("ledger.sqlite");
    let r = run(&["migrate", "--db", missing_dir.to_str().unwrap()]);
    let (code, message) = exit_2(&r);
    assert_eq!(code, "DATABASE_IO_ERROR");
    assert!(
        message.contains("directory --db names does not exist"),
        "{message}"
    );
    assert!(!r.stderr.contains(d.dir.path().to_str().unwrap()));
    assert!(!missing_dir.parent().unwrap().exists());

    let r = run(&[
        "principal",
        "add",
        "alice",
        "--tenant",
        "t",
        "--db",
        d.dir.path().to_str().unwrap(),
    ]);
    let (code, message) = exit_2(&r);
    assert_eq!(code, "DATABASE_IO_ERROR");
    assert!(message.contains("--db names a directory"), "{message}");
    assert!(!r.stderr.contains(d.dir.path().to_str().unwrap()));
}

#[test]
fn store_codes_carry_a_hint() {
    let d = Db::new();
    let (code, message) = exit_2(&d.run("audit", &[]));
    assert_eq!(code, "DATABASE_NOT_FOUND");
    assert!(message.contains("toolledger migrate"), "{message}");
    std::fs::write(&d.db, vec![0x42u8; 8192]).unwrap();
    let r = d.run("audit", &[]);
    let (code, message) = exit_2(&r);
    assert_eq!(code, "NOT_A_LEDGER");
    assert!(message.contains("not a toolledger ledger"), "{message}");
    assert!(!r.stderr.contains(d.dir.path().to_str().unwrap()));
}

fn file_hash(path: &std::path::Path) -> String {
    hex::encode(sha2::Sha256::digest(std::fs::read(path).unwrap()))
}

#[test]
fn approve_with_a_fixture_without_an_approval_id_issues_a_random_one() {
    let d = Db::new();
    let f = variant(
        d.dir.path(),
        "no-approval.json",
        &[(
            r#""amount_cents": 1250,
    "approval": "approval-ord-1001-a""#,
            r#""amount_cents": 1250"#,
        )],
    );
    let a = d.approve(&f, "bob");
    assert_eq!(a.code, 0, "{} {}", a.stdout, a.stderr);
    let id = a.json()["approval_id"].as_str().unwrap().to_string();
    assert!(id.starts_with("apr_") && id.len() == 36, "{id}");
    let again = d.approve(&f, "bob");
    assert_eq!(again.code, 0);
    assert_ne!(
        again.json()["approval_id"],
        id.as_str(),
        "a fresh id each time"
    );
    assert_eq!(d.int("SELECT count(*) FROM approvals"), 2);
}

#[test]
fn every_failed_approve_leaves_the_ledger_byte_identical() {
    let d = Db::new();
    let f = example("refund-order.json");
    assert_eq!(d.run("migrate", &[]).code, 0);
    let before = file_hash(&d.db);
    let other_intent = variant(
        d.dir.path(),
        "other.json",
        &[(r#""amount_cents": 1250"#, r#""amount_cents": 1300"#)],
    );
    let bad_arguments = variant(
        d.dir.path(),
        "bad.json",
        &[(r#""amount_cents": 1250"#, r#""amount_cents": -1"#)],
    );
    let fixture = f.to_str().unwrap();
    let max_ttl = i64::MAX.to_string();
    let refusals: Vec<(Vec<&str>, i32)> = vec![
        // Refusals inside the transaction (exit 1): nothing of the setup stays.
        (vec!["--fixture", fixture, "--approver", "mallory"], 1),
        (vec!["--fixture", fixture, "--approver", "alice"], 1),
        (
            vec![
                "--fixture",
                other_intent.to_str().unwrap(),
                "--approver",
                "alice",
            ],
            1,
        ),
        // Refusals before the ledger is opened.
        (
            vec![
                "--fixture",
                bad_arguments.to_str().unwrap(),
                "--approver",
                "bob",
            ],
            1,
        ),
        (
            vec![
                "--fixture",
                fixture,
                "--approver",
                "bob",
                "--approval-id",
                "x",
            ],
            1,
        ),
        (
            vec!["--fixture", fixture, "--approver", "bob", "--ttl", "0"],
            1,
        ),
        (
            vec!["--fixture", fixture, "--approver", "bob", "--ttl", &max_ttl],
            1,
        ),
        (vec!["--approver", "bob"], 2),
        (
            vec![
                "--approver",
                "bob",
                "--tool",
                "refund_order",
                "--requester",
                "alice",
                "--key",
                "k-1",
                "--arguments",
                "{not json",
            ],
            2,
        ),
        (
            vec![
                "--approver",
                "bob",
                "--tool",
                "refund_order",
                "--requester",
                "alice",
                "--key",
                "k-1",
                "--arguments",
                r#"{"order_id":"ord-1001","amount_cents":1250}"#,
            ],
            1,
        ),
    ];
    for (args, code) in &refusals {
        let r = d.run("approve", args);
        assert_eq!(r.code, *code, "{args:?}: {} {}", r.stdout, r.stderr);
        assert_eq!(file_hash(&d.db), before, "{args:?} changed the ledger");
    }
    assert_eq!(d.int("SELECT count(*) FROM principals"), 0);
    assert_eq!(d.int("SELECT count(*) FROM approvals"), 0);

    // An approval id already used for another intent is refused, and changes nothing either.
    assert_eq!(d.approve(&f, "bob").code, 0);
    let granted = file_hash(&d.db);
    let r = d.approve(&other_intent, "bob");
    assert_eq!(r.code, 1, "{}", r.stdout);
    assert_eq!(r.json()["code"], "INVALID_ARGUMENTS");
    assert_eq!(file_hash(&d.db), granted);
    assert_eq!(d.int("SELECT count(*) FROM approvals"), 1);
}

#[test]
fn approve_without_a_fixture_needs_an_existing_ledger() {
    let d = Db::new();
    let r = d.run(
        "approve",
        &[
            "--approver",
            "bob",
            "--tool",
            "refund_order",
            "--requester",
            "alice",
            "--key",
            "k-1",
            "--arguments",
            r#"{"order_id":"ord-1001","amount_cents":1250}"#,
        ],
    );
    assert_eq!(exit_2(&r).0, "DATABASE_NOT_FOUND");
    assert!(!d.db.exists(), "no ledger is created");
}

/// Every command that opens the ledger, with the flags it needs besides the store's.
/// `REF` and `FIXTURE` are filled in per run; the store flags come last, except for `proxy`,
/// whose upstream command follows them.
fn store_commands() -> Vec<Vec<&'static str>> {
    const REF: &str = "op_00000000000000000000000000000000";
    vec![
        vec!["migrate"],
        vec!["audit"],
        vec!["operations", "list"],
        vec!["operations", "show", REF],
        vec!["status", "--status-ref", REF],
        vec!["status", "--status-ref", REF, "--fixture", "FIXTURE"],
        vec![
            "resolve",
            "--status-ref",
            REF,
            "--as",
            "failed",
            "--reason",
            "r",
            "--operator",
            "olga",
        ],
        vec!["worker", "--once"],
        vec!["prune"],
        vec!["prune", "--dry-run"],
        vec!["principal", "list"],
        vec!["principal", "add", "alice", "--tenant", "t"],
        vec!["principal", "revoke", "alice", "--all"],
        vec!["principal", "token", "list", "alice"],
        vec![
            "approve",
            "--approver",
            "bob",
            "--tool",
            "refund_order",
            "--requester",
            "alice",
            "--key",
            "k-1",
            "--arguments",
            "{}",
        ],
        vec!["approve", "--fixture", "FIXTURE", "--approver", "bob"],
        vec!["dispatch", "--fixture", "FIXTURE"],
        vec![
            "call",
            "set_interval",
            "--principal",
            "alice",
            "--args",
            "{}",
        ],
        vec![
            "call",
            "create_issue",
            "--principal",
            "alice",
            "--args",
            "{}",
        ],
        vec!["serve", "--principal", "alice"],
        vec!["serve", "--http", "127.0.0.1:0"],
        vec!["console", "--http", "127.0.0.1:0"],
        vec!["proxy", "--", "true"],
    ]
}

/// `command` with the store flags `store` (before a `--`), the fixture path filled in.
fn with_store(command: &[&str], store: &[&str], fixture: &str) -> Vec<String> {
    let split = command
        .iter()
        .position(|a| *a == "--")
        .unwrap_or(command.len());
    let fill = |a: &&str| {
        if *a == "FIXTURE" {
            fixture.to_string()
        } else {
            a.to_string()
        }
    };
    let mut args: Vec<String> = command[..split].iter().map(fill).collect();
    args.extend(store.iter().map(|s| s.to_string()));
    args.extend(command[split..].iter().map(fill));
    args
}

/// Every file in `dir` with its SHA-256: what a refused command must leave as it was.
fn dir_state(dir: &std::path::Path) -> Vec<(String, String)> {
    let mut files: Vec<(String, String)> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .map(|p| {
            (
                p.file_name().unwrap().to_string_lossy().into_owned(),
                file_hash(&p),
            )
        })
        .collect();
    files.sort();
    files
}

/// One error per cause, the same in every command: a malformed `--database-url` is
/// `DATABASE_URL_INVALID`; a server that cannot be reached is `DATABASE_UNREACHABLE`, naming
/// the connection error without the URL's password; a file that is not a ledger (not SQLite,
/// plain text, another application's SQLite database) is `NOT_A_LEDGER`, and the file and its
/// directory are left exactly as they were.
#[test]
fn each_bad_store_gets_one_error_in_every_command() {
    let fixture = example("refund-order.json");
    let fixture = fixture.to_str().unwrap();
    let urls: &[(&str, &str, &[&str])] = &[
        ("postgres//hunter2@x/db", "DATABASE_URL_INVALID", &[]),
        (
            "mysql://admin:hunter2@db.internal/ledger",
            "DATABASE_URL_INVALID",
            &[],
        ),
        (
            "postgres://admin:hunter2@127.0.0.1:1/ledger",
            "DATABASE_UNREACHABLE",
            &["refused"],
        ),
    ];
    for command in store_commands() {
        for (url, want, names) in urls {
            let args = with_store(&command, &["--database-url", url], fixture);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let r = run(&args);
            let (code, message) = exit_2(&r);
            assert_eq!(code, *want, "{command:?} with {url}: {message}");
            for name in *names {
                assert!(
                    message.to_lowercase().contains(name),
                    "{command:?} with {url}: {message}"
                );
            }
            for private in ["hunter2", "db.internal", "127.0.0.1:1"] {
                assert!(!r.stderr.contains(private), "{command:?}: {}", r.stderr);
            }
        }
    }

    let foreign = |path: &std::path::Path| {
        let c = rusqlite::Connection::open(path).unwrap();
        c.execute_batch("CREATE TABLE notes(body TEXT); INSERT INTO notes VALUES ('mine');")
            .unwrap();
    };
    type Make = fn(&std::path::Path);
    let files: &[(&str, Make)] = &[
        ("bytes", |p| std::fs::write(p, vec![0x42u8; 8192]).unwrap()),
        ("text", |p| std::fs::write(p, "not a database\n").unwrap()),
        ("foreign", foreign),
    ];
    for command in store_commands() {
        for (what, make) in files {
            let dir = tempfile::tempdir().unwrap();
            let db = dir.path().join("ledger.sqlite");
            make(&db);
            let before = dir_state(dir.path());
            let args = with_store(&command, &["--db", db.to_str().unwrap()], fixture);
            let args: Vec<&str> = args.iter().map(String::as_str).collect();
            let r = run(&args);
            let (code, message) = exit_2(&r);
            assert_eq!(code, "NOT_A_LEDGER", "{command:?} on {what}: {message}");
            assert!(!r.stderr.contains(dir.path().to_str().unwrap()));
            assert_eq!(
                dir_state(dir.path()),
                before,
                "{command:?} on {what} changed the directory"
            );
        }
    }
}

/// A JSON-valued flag whose value is not JSON is a usage error in every command (exit 2, one
/// JSON line on stderr naming the flag, nothing on stdout), and the ledger is left as it was.
#[test]
fn a_json_flag_that_is_not_json_is_a_usage_error_in_every_command() {
    let d = Db::new();
    assert_eq!(d.run("migrate", &[]).code, 0);
    let before = file_hash(&d.db);
    let op = "op_00000000000000000000000000000000";
    let cases: &[(&[&str], &str)] = &[
        (
            &[
                "call",
                "set_interval",
                "--principal",
                "alice",
                "--args",
                "{bad",
            ],
            "--args",
        ),
        (
            &[
                "call",
                "set_interval",
                "--principal",
                "alice",
                "--args",
                r#"{"request_id":"a","request_id":"b"}"#,
            ],
            "--args",
        ),
        (
            &[
                "call",
                "create_issue",
                "--principal",
                "alice",
                "--args",
                "{}",
                "--request-state",
                "s",
                "--input-responses",
                "[1",
            ],
            "--input-responses",
        ),
        (
            &[
                "approve",
                "--approver",
                "bob",
                "--tool",
                "refund_order",
                "--requester",
                "alice",
                "--key",
                "k-1",
                "--arguments",
                "{not json",
            ],
            "--arguments",
        ),
        (
            &[
                "resolve",
                "--status-ref",
                op,
                "--as",
                "succeeded",
                "--reason",
                "r",
                "--operator",
                "olga",
                "--evidence",
                "{not json",
            ],
            "--evidence",
        ),
    ];
    for (args, flag) in cases {
        let mut args = args.to_vec();
        args.extend(["--db", d.db()]);
        let r = run(&args);
        let (code, message) = exit_2(&r);
        assert_eq!(code, "USAGE_ERROR", "{args:?}: {message}");
        assert!(message.contains(flag), "{args:?}: {message}");
        assert!(message.contains("not valid JSON"), "{args:?}: {message}");
        assert_eq!(file_hash(&d.db), before, "{args:?} changed the ledger");
    }
}
