//! Runs `examples/approved_tool.rs` in-process with an rmcp client: without an approval the
//! call is `approval_required` and writes nothing; an approval granted for another intent is
//! `approval_invalid`; the approval for exactly this intent (the target `toolledger approve`
//! computes for a user's tool) publishes once, is consumed, replays on a retry, and cannot be
//! used again for another operation.

#[allow(dead_code)]
#[path = "../examples/approved_tool.rs"]
mod example;

use rmcp::service::{RoleClient, RunningService};
use serde_json::{json, Value};
use toolledger::approval::{self, ApprovalTarget};
use toolledger_mcp::LedgerGuard;
use toolledger_testkit::replies::body_of;

struct Session {
    ledger: LedgerGuard,
    client: RunningService<RoleClient, ()>,
    _dir: tempfile::TempDir,
}

async fn session() -> Session {
    let dir = tempfile::tempdir().unwrap();
    let db = dir.path().join("posts.sqlite");
    let (ledger, posts) = example::open(db.to_str().unwrap(), "alice").unwrap();
    let principals = ledger.principals();
    principals
        .add("alice", "acme", &[], &[], false)
        .await
        .unwrap();
    let approver = ["approver".to_string()];
    principals
        .add("bob", "acme", &approver, &[], false)
        .await
        .unwrap();
    let client = toolledger_testkit::replies::connect(posts).await;
    Session {
        ledger,
        client,
        _dir: dir,
    }
}

impl Session {
    async fn call(&self, args: Value) -> (bool, Value) {
        let r = toolledger_testkit::replies::call_tool(&self.client, "publish_post", args).await;
        body_of(&r)
    }

    /// Bob approves `intent` of alice's operation `key` (what `toolledger approve --tool
    /// publish_post --requester alice --key KEY --arguments INTENT` grants).
    async fn approve(&self, id: &str, key: &str, intent: Value) {
        let alice = self
            .ledger
            .principals()
            .resolve("alice")
            .await
            .unwrap()
            .unwrap();
        let target = ApprovalTarget::for_intent(&alice, "publish_post", key, &intent).unwrap();
        let now = self.ledger.guard().clock().now();
        approval::grant(self.ledger.store(), id, &target, "bob", now, now + 3600)
            .await
            .unwrap();
    }

    async fn posts(&self) -> i64 {
        toolledger_testkit::db::count(self.ledger.store(), "posts").await
    }
}

fn code(reply: &(bool, Value)) -> &str {
    assert!(reply.0, "expected a refusal: {}", reply.1);
    reply.1["error"]["code"].as_str().unwrap_or_default()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_post_is_published_once_with_the_approval_for_exactly_its_intent() {
    let s = session().await;
    let post = json!({"operation_id": "post-1", "slug": "hello", "text": "Hello"});
    assert_eq!(code(&s.call(post.clone()).await), "approval_required");
    assert_eq!(s.posts().await, 0);

    s.approve(
        "apr_other_text",
        "post-1",
        json!({"slug": "hello", "text": "Bye"}),
    )
    .await;
    let mut wrong = post.clone();
    wrong["approval"] = json!("apr_other_text");
    assert_eq!(code(&s.call(wrong).await), "approval_invalid");
    assert_eq!(
        s.posts().await,
        0,
        "an approval of another intent publishes nothing"
    );

    s.approve(
        "apr_hello",
        "post-1",
        json!({"slug": "hello", "text": "Hello"}),
    )
    .await;
    let mut approved = post.clone();
    approved["approval"] = json!("apr_hello");
    let (error, first) = s.call(approved.clone()).await;
    assert!(!error, "{first}");
    assert_eq!(first["slug"], "hello");
    assert_eq!(first["replayed"], false);
    let used = approval::fetch(s.ledger.store(), "apr_hello")
        .await
        .unwrap();
    assert!(
        used.unwrap().consumed_at.is_some(),
        "consumed with the post"
    );

    let (error, retry) = s.call(approved).await;
    assert!(!error, "{retry}");
    assert_eq!(
        retry["replayed"], true,
        "the exact retry replays after its approval was used"
    );
    let (error, again) = s.call(post).await;
    assert!(
        !error && again["replayed"] == true,
        "the approval id is not part of the intent"
    );
    assert_eq!(s.posts().await, 1);

    let other = json!({"operation_id": "post-2", "slug": "hello-2", "text": "Hello",
                       "approval": "apr_hello"});
    assert_eq!(code(&s.call(other).await), "approval_invalid");
    assert_eq!(
        s.posts().await,
        1,
        "an approval is used once, for its own operation"
    );
}
