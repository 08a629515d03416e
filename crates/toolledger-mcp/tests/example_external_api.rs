//! Runs `examples/external_api.rs` in-process with an rmcp client: the external call is made
//! once per operation and its answer replayed; a lost answer is `outcome_unknown`, is never
//! sent again by a retry, and `get_operation_status` reconciles it from the service's lookup,
//! after which a retry replays what the service did.

#[allow(dead_code)]
#[path = "../examples/external_api.rs"]
mod example;

use rmcp::service::{RoleClient, RunningService};
use serde_json::{json, Value};

struct Session {
    client: RunningService<RoleClient, ()>,
    spool: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

async fn session(lose_reply: bool) -> Session {
    session_with(lose_reply, std::time::Duration::ZERO).await
}

async fn session_with(lose_reply: bool, reply_delay: std::time::Duration) -> Session {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("mail.sqlite");
    let spool = dir.path().join("mail.jsonl");
    let mailer = example::Mailer {
        spool: spool.clone(),
        lose_reply,
        reply_delay,
    };
    let (_ledger, mail) = example::open(db.to_str().unwrap(), "billing", mailer)
        .await
        .unwrap();
    let client = toolledger_testkit::replies::connect(mail).await;
    Session {
        client,
        spool,
        _dir: dir,
    }
}

impl Session {
    /// `(isError, structuredContent or the parsed text)` of one call (an unknown outcome is
    /// an error result whose structured content is the deferred reply).
    async fn call(&self, tool: &str, args: Value) -> (bool, Value) {
        let r = toolledger_testkit::replies::call_tool(&self.client, tool, args).await;
        let body = r.structured_content.clone().unwrap_or_else(|| {
            let text = r.content[0].as_text().unwrap().text.clone();
            serde_json::from_str(&text).unwrap()
        });
        (r.is_error == Some(true), body)
    }

    /// The messages the mail service sent.
    fn sent(&self) -> usize {
        std::fs::read_to_string(&self.spool)
            .unwrap_or_default()
            .lines()
            .count()
    }
}

fn email(op: &str) -> Value {
    json!({"operation_id": op, "to": "ap@example.com", "subject": "Invoice 7"})
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_email_is_sent_once_and_the_retry_replays_it() {
    let s = session(false).await;
    let (err, first) = s.call("send_email", email("mail-1")).await;
    assert!(!err, "{first}");
    assert_eq!(first["code"], "OK");
    assert_eq!(first["delivery"], "fresh");
    assert_eq!(first["status"], "succeeded");
    let key = first["status_ref"].as_str().unwrap().to_string();
    assert_eq!(
        first["result"],
        json!({"message_id": format!("msg-{key}"), "to": "ap@example.com"})
    );
    assert_eq!(s.sent(), 1);

    let (err, again) = s.call("send_email", email("mail-1")).await;
    assert!(!err, "{again}");
    assert_eq!(again["delivery"], "local_replay");
    assert_eq!(again["result"], first["result"]);
    assert_eq!(s.sent(), 1, "a retry must not send again");

    // Another operation is another message, under another key.
    let (err, other) = s.call("send_email", email("mail-2")).await;
    assert!(!err, "{other}");
    assert_ne!(other["status_ref"], first["status_ref"]);
    assert_eq!(s.sent(), 2);

    // The same operation id with another intent is a conflict, and sends nothing.
    let (err, conflict) = s
        .call(
            "send_email",
            json!({"operation_id": "mail-1", "to": "ap@example.com", "subject": "Other"}),
        )
        .await;
    assert!(err);
    assert_eq!(
        conflict["error"]["code"], "operation_conflict",
        "{conflict}"
    );
    assert_eq!(s.sent(), 2);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_answer_is_unknown_until_the_lookup_finds_the_message() {
    let s = session(true).await;
    let (err, lost) = s.call("send_email", email("mail-1")).await;
    assert!(err, "a lost answer is never dressed as success: {lost}");
    assert_eq!(lost["code"], "OUTCOME_UNKNOWN", "{lost}");
    assert_eq!(lost["status"], "outcome_unknown");
    let status_ref = lost["status_ref"].as_str().unwrap().to_string();
    assert_eq!(s.sent(), 1);

    // A retry does not call the service again: the message may have been sent.
    let (err, retry) = s.call("send_email", email("mail-1")).await;
    assert!(err);
    assert_eq!(retry["code"], "OUTCOME_UNKNOWN", "{retry}");
    assert_eq!(s.sent(), 1, "an unknown outcome must not be sent again");

    // The status query runs the lookup, which finds the message under the operation's key.
    let (err, status) = s
        .call("get_operation_status", json!({"operation_id": "mail-1"}))
        .await;
    assert!(!err, "{status}");
    assert_eq!(status["ledgerState"], "succeeded", "{status}");
    assert_eq!(
        status["state"], "succeeded",
        "one word for one state: {status}"
    );
    assert_eq!(status["authoritative"], true);
    assert_eq!(
        status["storedResult"],
        json!({"message_id": format!("msg-{status_ref}"), "to": "ap@example.com"})
    );
    assert_eq!(status["statusRef"], status_ref.as_str());

    // Now the retry replays what the service did.
    let (err, replay) = s.call("send_email", email("mail-1")).await;
    assert!(!err, "{replay}");
    assert_eq!(replay["code"], "OK");
    assert_eq!(replay["delivery"], "local_replay");
    assert_eq!(
        replay["result"],
        json!({"message_id": format!("msg-{status_ref}"), "to": "ap@example.com"})
    );
    assert_eq!(s.sent(), 1);
}

/// The client cancels its call (`notifications/cancelled`, as the official SDKs do when their
/// read timeout fires) after the service sent the message and before it answered: the call
/// runs to its recorded end, and the retry replays the answer — one message, nothing unsure.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_call_still_records_the_answer_and_the_retry_replays_it() {
    let s = session_with(false, std::time::Duration::from_millis(1_500)).await;
    let params = rmcp::model::CallToolRequestParams::new("send_email")
        .with_arguments(email("mail-c").as_object().cloned().unwrap());
    let handle = s
        .client
        .send_cancellable_request(
            rmcp::model::ClientRequest::CallToolRequest(rmcp::model::CallToolRequest::new(params)),
            rmcp::service::PeerRequestOptions::no_options(),
        )
        .await
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while s.sent() == 0 {
        assert!(
            std::time::Instant::now() < until,
            "the message was never sent"
        );
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    handle
        .cancel(Some("the caller gave up".into()))
        .await
        .unwrap();
    let until = std::time::Instant::now() + std::time::Duration::from_secs(30);
    let replay = loop {
        let (err, answer) = s.call("send_email", email("mail-c")).await;
        if !err || std::time::Instant::now() > until {
            break answer;
        }
        // While the call still runs, a retry is told it is unfinished (never sent again).
        assert_eq!(answer["status"], "processing", "{answer}");
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    };
    assert_eq!(replay["code"], "OK", "{replay}");
    assert_eq!(replay["delivery"], "local_replay", "{replay}");
    assert_eq!(s.sent(), 1);
}
