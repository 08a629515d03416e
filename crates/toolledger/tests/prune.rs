//! Compaction after retention and the tombstone horizon (`toolledger::prune`) on each driver:
//! what is compacted and what is never touched, how a tombstone answers a replay, a new intent
//! and a status read, the horizon and its `never`, dry runs, limits, and concurrent pruners.

use std::sync::Arc;

use serde_json::json;
use toolledger::audit;
use toolledger::clock::SharedClock;
use toolledger::engine::{Engine, InlineCall};
use toolledger::prune::{self, PruneOptions, PruneReport};
use toolledger::runtime::{Answer, Deadlines, Runtime, RuntimeError, StatusQuery};
use toolledger::store::Store;
use toolledger::{ErrorCode, OperationState, Principal};
use toolledger_testkit::both_drivers;
use toolledger_testkit::calls::principal;
use toolledger_testkit::conformance::harness::accept_new;
use toolledger_testkit::conformance::{
    engine, ship, widget_call, Harness, WidgetEffect, World, T0,
};
use toolledger_testkit::db::{count, scalar};

/// Retention of the operations the tests make: 100 seconds.
const RETENTION: i64 = 100;

fn widget(name: &str) -> Arc<WidgetEffect> {
    Arc::new(WidgetEffect {
        name: name.into(),
        fail_after_insert: false,
    })
}

/// A widget call under `key` whose retention deadline is `retention`.
fn call(p: &Principal, key: &str, name: &str, retention: Option<i64>) -> InlineCall {
    let mut c = widget_call(p, key, name);
    c.retention_deadline = retention;
    c
}

fn opts(ttl: Option<i64>) -> PruneOptions {
    PruneOptions {
        tombstone_ttl: ttl,
        ..PruneOptions::default()
    }
}

/// Widget calls under `keys`, each kept until `T0 + RETENTION`.
async fn expiring(e: &Engine, p: &Principal, keys: impl Iterator<Item = String>) {
    for key in keys {
        let c = call(p, &key, "gear", Some(T0 + RETENTION));
        e.execute_inline(c, widget("gear")).await.unwrap();
    }
}

async fn run(e: &Engine, o: &PruneOptions) -> PruneReport {
    prune::prune(e.store(), e.clock(), o).await.expect("prune")
}

async fn no_violations(store: &Store) {
    let v = store
        .read(|tx: &mut dyn toolledger::effect::EffectTx| audit::violations(tx))
        .await
        .expect("audit");
    assert!(v.is_empty(), "{v:?}");
}

fn refused(r: Result<Answer, RuntimeError>) -> ErrorCode {
    match r {
        Err(RuntimeError::Refused(e)) => e.code,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

/// A runtime of `w` whose operations keep their results for [`RETENTION`] seconds.
fn runtime(w: &World, h: &Harness) -> Runtime {
    w.runtime(h).with_deadlines(Deadlines {
        authority_ttl: None,
        retention_ttl: Some(RETENTION),
    })
}

async fn compaction_touches_only_settled_operations_past_retention(h: &Harness) {
    let (e, clock) = engine(h);
    let alice = principal("t1", "alice");
    for (key, retention) in [
        ("old", Some(T0 + RETENTION)),
        ("young", Some(T0 + 10 * RETENTION)),
        ("forever", None),
    ] {
        e.execute_inline(call(&alice, key, key, retention), widget(key))
            .await
            .unwrap();
    }
    let w = World::new(h).await;
    let rt = runtime(&w, h);
    let delivered = rt.dispatch(&ship("shipped", "p1"), None).await.unwrap();
    assert!(matches!(
        delivered,
        Answer::Done {
            state: OperationState::Succeeded,
            ..
        }
    ));
    let (_, waiting) = accept_new(&rt, &ship("waiting", "p2")).await;

    clock.set(T0 + 2 * RETENTION);
    w.clock.set(T0 + 2 * RETENTION);
    let r = run(&e, &opts(None)).await;
    assert_eq!(
        (r.compacted, r.deleted, r.kept_unsettled),
        (2, 0, 1),
        "{r:?}"
    );
    assert_eq!(r.oldest_unsettled_age_seconds, Some(2 * RETENTION));
    assert!(!r.busy);

    // Kept whole: the young, the unlimited and the unsettled operation.
    let young = e.execute_inline(
        call(&alice, "young", "young", Some(T0 + 10 * RETENTION)),
        widget("young"),
    );
    let young = young.await.unwrap();
    assert!(young.replayed);
    let forever = e
        .lookup("t1", "alice", "make_widget", "forever")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        (forever.compacted_at, forever.result.is_some()),
        (None, true)
    );
    let w8 = rt.inspect(&waiting).await.unwrap().unwrap();
    assert_eq!(
        (w8.state, w8.compacted_at),
        (OperationState::Accepted, None)
    );
    assert_eq!(w8.arguments, json!({"parcel": "p2"}));

    // The tombstones: nothing but the scope, digest, state, deadlines and reference.
    let old = e
        .lookup("t1", "alice", "make_widget", "old")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(old.state, OperationState::Applied);
    assert_eq!((old.result, old.arguments.clone()), (None, json!(null)));
    assert_eq!(old.compacted_at, Some(T0 + 2 * RETENTION));
    assert_eq!(old.retention_deadline, Some(T0 + RETENTION));
    let store = e.store();
    let ids = "(SELECT id FROM operations WHERE compacted_at IS NOT NULL)";
    for table in [
        "operation_events",
        "outbox",
        "deferred_intents",
        "local_receipts",
    ] {
        let sql = format!("SELECT count(*) FROM {table} WHERE operation_id IN {ids}");
        assert_eq!(scalar(store, &sql).await, 0, "{table}");
    }
    assert_eq!(
        count(store, "outbox").await,
        1,
        "the waiting operation's event stays"
    );
    no_violations(store).await;
    let counts = store
        .read(|tx: &mut dyn toolledger::effect::EffectTx| audit::counts(tx))
        .await
        .expect("counts");
    assert_eq!(
        counts["tombstones"],
        json!(2),
        "audit counts the tombstones"
    );
}

both_drivers!(compaction_touches_only_settled_operations_past_retention);

async fn a_tombstone_refuses_replays_and_new_intents_and_shows_its_state(h: &Harness) {
    let (e, clock) = engine(h);
    let alice = principal("t1", "alice");
    e.execute_inline(
        call(&alice, "k", "gear", Some(T0 + RETENTION)),
        widget("gear"),
    )
    .await
    .unwrap();
    let w = World::new(h).await;
    let rt = runtime(&w, h);
    let shipped = rt.dispatch(&ship("d", "p1"), None).await.unwrap();
    clock.set(T0 + RETENTION);
    w.clock.set(T0 + RETENTION);
    let r = run(&e, &opts(None)).await;
    assert_eq!(r.compacted, 2, "{r:?}");

    // Inline: an exact replay, then another intent under the key.
    let replay = e.execute_inline(
        call(&alice, "k", "gear", Some(T0 + RETENTION)),
        widget("gear"),
    );
    assert_eq!(
        replay.await.unwrap_err().code,
        ErrorCode::OperationRetentionExpired
    );
    let other = e.execute_inline(
        call(&alice, "k", "cog", Some(T0 + 9 * RETENTION)),
        widget("cog"),
    );
    assert_eq!(other.await.unwrap_err().code, ErrorCode::OperationConflict);
    // The clock set back does not bring the result back.
    clock.set(T0);
    let back = e.execute_inline(
        call(&alice, "k", "gear", Some(T0 + RETENTION)),
        widget("gear"),
    );
    assert_eq!(
        back.await.unwrap_err().code,
        ErrorCode::OperationRetentionExpired
    );
    clock.set(T0 + RETENTION);
    let tombstone = e.lookup("t1", "alice", "make_widget", "k").await.unwrap();
    let status_ref = tombstone.unwrap().status_ref;
    let status = e.lookup_status_ref(&status_ref).await.unwrap().unwrap();
    // The first round of a multi-round request has no digest to compare yet: a tombstone
    // answers it by its deadlines, never by a comparison with arguments it no longer keeps.
    let first = e.replay_for_first_round(&alice, "make_widget", "k", false, |_| false);
    assert_eq!(
        first.await.unwrap_err().code,
        ErrorCode::OperationRetentionExpired
    );
    assert_eq!(
        (status.state, status.result),
        (OperationState::Applied, None)
    );

    // Deferred: the same three answers.
    assert_eq!(
        refused(rt.dispatch(&ship("d", "p1"), None).await),
        ErrorCode::OperationRetentionExpired
    );
    assert_eq!(
        refused(rt.dispatch(&ship("d", "p2"), None).await),
        ErrorCode::OperationConflict
    );
    let query = StatusQuery {
        principal: "alice".into(),
        tool: "ship_parcel".into(),
        key: "d".into(),
        arguments: json!({"parcel": "p1"}),
        provider: ship("d", "p1").provider,
        status_ref: shipped.status_ref().to_string(),
    };
    assert_eq!(
        refused(rt.status(&query).await),
        ErrorCode::OperationRetentionExpired
    );
    let d = rt.inspect(shipped.status_ref()).await.unwrap().unwrap();
    assert_eq!((d.state, d.result), (OperationState::Succeeded, None));
    assert_eq!(w.downstream.submits(), 1);
    no_violations(e.store()).await;
}

both_drivers!(a_tombstone_refuses_replays_and_new_intents_and_shows_its_state);

async fn the_horizon_forgets_tombstones_and_never_keeps_them(h: &Harness) {
    let (e, clock) = engine(h);
    let alice = principal("t1", "alice");
    expiring(&e, &alice, ["a", "b"].into_iter().map(String::from)).await;
    clock.set(T0 + RETENTION);
    let ttl = 50;
    let r = run(&e, &opts(Some(ttl))).await;
    assert_eq!((r.compacted, r.deleted), (2, 0), "{r:?}");
    clock.set(T0 + RETENTION + ttl - 1);
    assert_eq!(run(&e, &opts(Some(ttl))).await.deleted, 0);
    clock.set(T0 + RETENTION + ttl);
    assert_eq!(run(&e, &opts(None)).await.deleted, 0, "never keeps them");
    assert_eq!(count(e.store(), "operations").await, 2);
    let r = run(&e, &opts(Some(ttl))).await;
    assert_eq!((r.compacted, r.deleted), (0, 2), "{r:?}");
    assert_eq!(count(e.store(), "operations").await, 0);

    // The key is forgotten: another intent under it is a new operation.
    let fresh = e
        .execute_inline(call(&alice, "a", "cog", None), widget("cog"))
        .await
        .unwrap();
    assert!(!fresh.replayed);
    let totals = prune::totals(e.store()).await.unwrap();
    assert_eq!((totals.compacted_total, totals.deleted_total), (2, 2));
    no_violations(e.store()).await;
}

both_drivers!(the_horizon_forgets_tombstones_and_never_keeps_them);

async fn the_background_pruner_works_in_small_transactions(h: &Harness) {
    let (e, clock) = engine(h);
    let alice = principal("t1", "alice");
    let n = prune::ALONE_ROWS * 15 + 47;
    expiring(&e, &alice, (0..n).map(|i| format!("k{i}"))).await;
    clock.set(T0 + RETENTION);
    let opts = PruneOptions::background(None);
    assert!(opts.pace > 0 && opts.beside_writes, "{opts:?}");
    let r = run(&e, &opts).await;
    // Every expired operation compacted, in short transactions: on SQLite steps of ALONE_ROWS
    // the writer does while it has nothing else to do, on PostgreSQL paced batches of
    // BACKGROUND_BATCH.
    let steps = match h.sqlite_path() {
        Some(_) => 16,
        None => n.div_ceil(prune::BACKGROUND_BATCH) as u64,
    };
    assert_eq!((r.compacted, r.batches), (n as u64, steps), "{r:?}");
    no_violations(e.store()).await;
}

both_drivers!(the_background_pruner_works_in_small_transactions);

async fn the_background_pruner_works_beside_live_calls(h: &Harness) {
    let (e, clock) = engine(h);
    let alice = principal("t1", "alice");
    let n = 300;
    expiring(&e, &alice, (0..n).map(|i| format!("k{i}"))).await;
    clock.set(T0 + RETENTION);
    // Live calls keep the writer busy while the pass runs (on SQLite the pruner's steps ride
    // at the end of their transactions).
    let live: Vec<_> = (0..8)
        .map(|w| {
            let (e, alice) = (e.clone(), alice.clone());
            tokio::spawn(async move {
                for i in 0..40 {
                    let c = call(&alice, &format!("live-{w}-{i}"), "cog", None);
                    e.execute_inline(c, widget("cog")).await.unwrap();
                }
            })
        })
        .collect();
    // Two passes at once, with a horizon of 0: what is compacted is deleted in the same pass.
    let o = PruneOptions::background(Some(0));
    let (a, b) = tokio::join!(run(&e, &o), run(&e, &o));
    for task in live {
        task.await.unwrap();
    }
    let both = (a.compacted + b.compacted, a.deleted + b.deleted);
    assert_eq!(both, (n as u64, n as u64), "{a:?} {b:?}");
    if h.sqlite_path().is_some() {
        // The store's writer holds one pruner's work at a time: the second pass is busy.
        assert!(!a.busy && a.compacted == n as u64, "{a:?}");
        assert!(b.busy && b.compacted + b.deleted == 0, "{b:?}");
    }
    // Every live call kept, with its payload; nothing else left.
    let live = "SELECT count(*) FROM operations WHERE compacted_at IS NULL";
    assert_eq!(scalar(e.store(), live).await, 320);
    assert_eq!(count(e.store(), "operations").await, 320);
    let totals = prune::totals(e.store()).await.unwrap();
    assert_eq!(
        (totals.compacted_total, totals.deleted_total),
        (n as i64, n as i64)
    );
    // A limit bounds a background run as it bounds a run in batches.
    for i in 0..30 {
        let c = call(&alice, &format!("m{i}"), "gear", Some(T0 + 2 * RETENTION));
        e.execute_inline(c, widget("gear")).await.unwrap();
    }
    clock.set(T0 + 2 * RETENTION);
    let limited = PruneOptions {
        limit: Some(10),
        ..PruneOptions::background(None)
    };
    let r = run(&e, &limited).await;
    assert_eq!((r.compacted, r.deleted), (10, 0), "{r:?}");
    no_violations(e.store()).await;
}

both_drivers!(the_background_pruner_works_beside_live_calls);

async fn a_dry_run_changes_nothing_and_a_limit_bounds_the_run(h: &Harness) {
    let (e, clock) = engine(h);
    let alice = principal("t1", "alice");
    expiring(&e, &alice, (0..5).map(|i| format!("k{i}"))).await;
    clock.set(T0 + RETENTION);
    let dry = run(
        &e,
        &PruneOptions {
            dry_run: true,
            ..opts(Some(0))
        },
    )
    .await;
    assert_eq!(
        (dry.compacted, dry.deleted, dry.batches),
        (5, 0, 0),
        "{dry:?}"
    );
    let live = "SELECT count(*) FROM operations WHERE compacted_at IS NULL";
    assert_eq!(scalar(e.store(), live).await, 5);

    let limited = PruneOptions {
        limit: Some(2),
        batch: 1,
        ..opts(None)
    };
    let r = run(&e, &limited).await;
    assert_eq!((r.compacted, r.batches), (2, 2), "{r:?}");
    assert_eq!(scalar(e.store(), live).await, 3);
    let r = run(&e, &opts(None)).await;
    assert_eq!(r.compacted, 3, "{r:?}");
    let dry = run(
        &e,
        &PruneOptions {
            dry_run: true,
            limit: Some(4),
            ..opts(Some(0))
        },
    )
    .await;
    assert_eq!((dry.compacted, dry.deleted), (0, 4), "{dry:?}");
    assert_eq!(count(e.store(), "operations").await, 5);
}

both_drivers!(a_dry_run_changes_nothing_and_a_limit_bounds_the_run);

async fn concurrent_pruners_never_prune_twice(h: &Harness) {
    let small = PruneOptions {
        batch: 3,
        ..opts(None)
    };
    concurrent_pruners(h, small, "k", 1).await;
    // Background pruners too, each on a store of its own (on SQLite a writer each, whose
    // steps the file's one write lock serializes).
    let background = PruneOptions {
        batch: 3,
        ..PruneOptions::background(None)
    };
    concurrent_pruners(h, background, "b", 2).await;
}

/// Four pruners with `small` at once over 40 expired operations under keys `prefix…`: each
/// compacted once; the `round`-th such run on the ledger.
async fn concurrent_pruners(h: &Harness, small: PruneOptions, prefix: &str, round: i64) {
    let (e, clock) = engine(h);
    let alice = principal("t1", "alice");
    let n = 40;
    expiring(&e, &alice, (0..n).map(|i| format!("{prefix}{i}"))).await;
    clock.set(T0 + RETENTION);
    let clock: SharedClock = Arc::new(clock);
    let mut tasks = Vec::new();
    for _ in 0..4 {
        let (store, clock, o) = (h.open(), clock.clone(), small.clone());
        tasks.push(tokio::spawn(async move {
            let mut done = 0;
            loop {
                let r = prune::prune(&store, &clock, &o).await.expect("prune");
                done += r.compacted;
                if !r.busy {
                    return done;
                }
                tokio::task::yield_now().await;
            }
        }));
    }
    let mut total = 0;
    for t in tasks {
        total += t.await.unwrap();
    }
    assert_eq!(total, n);
    let totals = prune::totals(e.store()).await.unwrap();
    assert_eq!(totals.compacted_total, round * n as i64);
    no_violations(e.store()).await;
}

both_drivers!(concurrent_pruners_never_prune_twice);

/// A new SQLite ledger of 300 calls with long keys, all pruned (compacted and deleted) by one
/// run with `o`: the harness, its engine and the run's report.
async fn all_pruned_with(o: &PruneOptions) -> (Harness, Engine, PruneReport) {
    let h = Harness::sqlite();
    let (e, clock) = engine(&h);
    let mode = "SELECT auto_vacuum FROM pragma_auto_vacuum";
    assert_eq!(scalar(e.store(), mode).await, 2, "INCREMENTAL");
    let alice = principal("t1", "alice");
    let keys: Vec<String> = (0..300)
        .map(|i| format!("key-{i:04}-{}", "x".repeat(200)))
        .collect();
    expiring(&e, &alice, keys.into_iter()).await;
    clock.set(T0 + RETENTION);
    let r = run(&e, o).await;
    assert_eq!((r.compacted, r.deleted), (300, 300), "{r:?}");
    (h, e, r)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_sqlite_file_gives_pruned_pages_back() {
    let (_h, e, r) = all_pruned_with(&opts(Some(0))).await;
    assert!(r.reclaimed_pages > 0, "{r:?}");
    let free = "SELECT freelist_count FROM pragma_freelist_count";
    assert_eq!(scalar(e.store(), free).await, 0);
    no_violations(e.store()).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_background_pruner_keeps_free_pages_for_new_rows() {
    let background = PruneOptions::background(Some(0));
    assert_eq!(background.keep_free_percent, 25);
    let (_h, e, r) = all_pruned_with(&background).await;
    let alice = principal("t1", "alice");
    assert!(
        r.reclaimed_pages > 0,
        "most of the free pages go back: {r:?}"
    );
    let free = scalar(
        e.store(),
        "SELECT freelist_count FROM pragma_freelist_count",
    )
    .await;
    let pages = scalar(e.store(), "SELECT page_count FROM pragma_page_count").await;
    let in_use = pages - free;
    assert!(free > 0, "some are kept for new rows ({free} of {pages})");
    assert_eq!(
        free,
        in_use * 25 / 100,
        "a quarter of the pages in use ({pages})"
    );
    // The next rows take the kept pages instead of growing the file.
    for i in 0..20 {
        let c = call(
            &alice,
            &format!("more-{i:02}"),
            "gear",
            Some(T0 + 2 * RETENTION),
        );
        e.execute_inline(c, widget("gear")).await.unwrap();
    }
    let grown = scalar(e.store(), "SELECT page_count FROM pragma_page_count").await;
    assert_eq!(grown, pages, "the file did not grow");
    assert!(
        scalar(
            e.store(),
            "SELECT freelist_count FROM pragma_freelist_count"
        )
        .await
            < free
    );
    no_violations(e.store()).await;
}
