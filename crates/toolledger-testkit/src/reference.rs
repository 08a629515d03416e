//! The reference domain's state as tests set it up: an order `refund_order` may refund
//! ([`add_order`]) and an approval recorded by `toolledger approve` ([`approve`]).

use std::process::Command;

use serde_json::Value;
use toolledger::store::Store;

/// Adds a refundable order `id` of `amount` cents owned by `owner` in `tenant` (unless one
/// with that id is there). Runs on a thread of its own, so a caller inside a tokio runtime may
/// use it too. Panics when it fails.
pub fn add_order(store: &Store, tenant: &str, id: &str, owner: &str, amount: i64) {
    let (store, tenant, id, owner) = (
        store.clone(),
        tenant.to_string(),
        id.to_string(),
        owner.to_string(),
    );
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime");
        rt.block_on(toolledger_reference::refunds::ensure_order(
            &store, &tenant, &id, &owner, amount, true,
        ))
        .expect("the order");
    })
    .join()
    .expect("the order's thread");
}

/// Runs `command` — the built `toolledger` with its `approve` subcommand and the flags that
/// select a ledger (and any others: `--ttl`, `--now`) — recording `approver`'s approval of
/// `requester`'s call of `tool` under `key` with `arguments`. Returns the approval id it
/// prints; panics, with its stderr, when it fails.
pub fn approve(
    mut command: Command,
    approver: &str,
    requester: &str,
    tool: &str,
    key: &str,
    arguments: &Value,
) -> String {
    let out = command
        .args(["--approver", approver, "--tool", tool])
        .args(["--requester", requester, "--key", key])
        .args(["--arguments", &arguments.to_string()])
        .output()
        .expect("toolledger approve runs");
    assert!(
        out.status.success(),
        "approve {tool}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let v: Value = serde_json::from_slice(&out.stdout).expect("one JSON object");
    v["approval_id"]
        .as_str()
        .expect("an approval id")
        .to_string()
}
