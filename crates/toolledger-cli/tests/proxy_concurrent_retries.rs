//! Several clients send the same operation ids at the same time through one `proxy --http`
//! (what a client does when it retries while its first call is still running): each id is
//! forwarded once, and every other call of it answers `operation_in_progress` or the stored
//! result, never `outcome_unknown` (nothing was lost).

#![cfg(unix)]

#[macro_use]
mod support;

use std::collections::BTreeMap;
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::clients;
use support::wire::{add_principal, Db, Ledger};
use toolledger_testkit::kill::{free_port, Killed};
use toolledger_testkit::stdio::wait_listening;

on_both_backends!(concurrent_calls_of_one_operation_forward_it_once);

const IDS: usize = 40;
const CLIENTS: usize = 3;

const CONFIG: &str = r#"
[tools.charge]
forward_operation_id = "_meta"
"#;

fn concurrent_calls_of_one_operation_forward_it_once(db: Db) {
    let Some(python) = clients::python() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("proxy.toml");
    std::fs::write(&config, CONFIG).unwrap();
    let charge_db = dir.path().join("charges.sqlite");
    let token = add_principal(&db, "hank", "acme", &["editor"], &[], true).unwrap();
    let addr = format!("127.0.0.1:{}", free_port());
    let mut proxy = Killed(
        Command::new(support::BIN)
            .arg("proxy")
            .args(db.store_args())
            .args(["--config", config.to_str().unwrap(), "--http", &addr, "--"])
            .arg(&python)
            .arg(clients::proxy_fixture("charge_server.py"))
            .env_remove("TOOLLEDGER_STATE_KEY_HEX")
            .env_remove("TOOLLEDGER_FINGERPRINT_KEY_HEX")
            .envs(db.key_env())
            .env("CHARGE_DB", &charge_db)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap(),
    );
    wait_listening(proxy.0.stderr.take().unwrap());

    let calls: Vec<Value> = (0..IDS)
        .map(|i| {
            json!({"name": "charge", "arguments": {
                "customer": format!("cus-{i}"), "amount_cents": 100 + i, "operation_id": format!("same-{i}")}})
        })
        .collect();
    let spec = json!({"transport": "http", "url": format!("http://{addr}/mcp"), "token": token,
        "lifecycle": "auto", "api": "client", "calls": calls});
    let drivers: Vec<_> = (0..CLIENTS)
        .map(|_| {
            Command::new(&python)
                .arg(clients::proxy_fixture("py_client.py"))
                .arg(spec.to_string())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .stderr(Stdio::null())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut answers: BTreeMap<usize, Vec<Value>> = BTreeMap::new();
    for d in drivers {
        let out = d.wait_with_output().unwrap();
        assert_eq!(out.status.code(), Some(0));
        for line in String::from_utf8(out.stdout).unwrap().lines() {
            let v: Value = serde_json::from_str(line).unwrap();
            if let Some(i) = v["i"].as_u64() {
                answers
                    .entry(i as usize)
                    .or_default()
                    .push(v["result"].clone());
            }
        }
    }

    let mut in_progress = 0;
    for (i, results) in &answers {
        assert_eq!(results.len(), CLIENTS, "same-{i}: every call answered");
        let mut stored = Vec::new();
        for r in results {
            if r["isError"] == true {
                let text = r["content"][0]["text"].as_str().unwrap();
                let code = serde_json::from_str::<Value>(text).unwrap()["error"]["code"].clone();
                assert_eq!(code, "operation_in_progress", "same-{i}: {r}");
                in_progress += 1;
            } else {
                let mut r = r.clone();
                let ledger = &mut r["_meta"]["io.toolledger/ledger"];
                let replayed = ledger["replayed"].as_bool().unwrap();
                ledger["replayed"] = Value::Null;
                stored.push((replayed, r));
            }
        }
        assert_eq!(
            stored.iter().filter(|(replayed, _)| !replayed).count(),
            1,
            "same-{i}: one answer is the forward's own: {results:?}"
        );
        assert!(
            stored.windows(2).all(|w| w[0].1 == w[1].1),
            "same-{i}: the others replay it: {results:?}"
        );
    }
    assert_eq!(answers.len(), IDS);

    let conn = rusqlite::Connection::open(&charge_db).unwrap();
    let (rows, references): (i64, i64) = conn
        .query_row(
            "SELECT count(*), count(DISTINCT reference) FROM charges",
            [],
            |r| Ok((r.get(0)?, r.get(1)?)),
        )
        .unwrap();
    assert_eq!(
        (rows, references),
        (IDS as i64, IDS as i64),
        "one charge per id"
    );
    eprintln!("{CLIENTS} clients x {IDS} ids: {in_progress} answers operation_in_progress");
}
