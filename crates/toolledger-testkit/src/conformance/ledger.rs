//! The ledger itself: insert ids, a reservation committing with its effect, replay across
//! handles, conflicts, deadlines and tombstones, the shared key namespace, and stored JSON that
//! is not canonical.

use std::sync::Arc;

use serde_json::{json, Value};
use toolledger::effect::{Dialect, EffectTx, RowExt, SqlValue};
use toolledger::engine::{Engine, InlineEffect};
use toolledger::model::{Error, ErrorCode, OperationState, Principal};

use super::harness::{code, engine, widget, widget_call, Harness, T0};
use crate::calls::{inline_call, principal};
use crate::db::count;

/// `EffectTx::insert_id` answers the id of the row it inserted (the same id a read finds),
/// and `None` when `ON CONFLICT … DO NOTHING` inserted nothing.
pub async fn insert_id_returns_the_inserted_rows_id(h: &Harness) {
    let store = h.open();
    let ids = store
        .write(|tx: &mut dyn EffectTx| -> Result<_, Error> {
            let insert = "INSERT INTO widgets(tenant, name) VALUES (?1, ?2)";
            let a = tx.insert_id(insert, &["t".into(), "a".into()])?;
            let b = tx.insert_id(insert, &["t".into(), "b".into()])?;
            let taken = tx.insert_id(
                "INSERT INTO widgets(id, tenant, name) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO NOTHING",
                &[a.unwrap_or(0).into(), "t".into(), "c".into()],
            )?;
            let chosen = tx.insert_id(
                "INSERT INTO widgets(id, tenant, name) VALUES (?1, ?2, ?3)
                 ON CONFLICT (id) DO NOTHING",
                &[1_000_000.into(), "t".into(), "d".into()],
            )?;
            Ok((a, b, taken, chosen))
        })
        .await
        .expect("inserts");
    let (Some(a), Some(b), taken, chosen) = ids else {
        panic!("no id for a plain insert: {ids:?}");
    };
    assert_ne!(a, b);
    assert_eq!(taken, None, "a conflicting insert reports no id");
    assert_eq!(chosen, Some(1_000_000));
    let names = store
        .read(|tx: &mut dyn EffectTx| -> Result<_, Error> {
            tx.query("SELECT id, name FROM widgets ORDER BY id", &[])
        })
        .await
        .expect("read back");
    let found: Vec<(i64, String)> = names
        .iter()
        .map(|r| (r.int(0).unwrap(), r.text(1).unwrap()))
        .collect();
    assert_eq!(
        found,
        vec![(a, "a".into()), (b, "b".into()), (1_000_000, "d".into())]
    );
}

/// A write whose commit does not wait for the disk ([`Store::write_unflushed`]) commits like
/// any other: its rows are read back, by this handle and by a new one, and it leaves the next
/// write's commit waiting for the disk as the store's own setting says (SQLite's
/// `synchronous`, PostgreSQL's `synchronous_commit`, read inside that write).
///
/// [`Store::write_unflushed`]: toolledger::store::Store::write_unflushed
pub async fn an_unflushed_write_commits_and_the_next_one_waits_for_the_disk(h: &Harness) {
    let store = h.open();
    let setting = match store.dialect() {
        Dialect::Sqlite => "PRAGMA synchronous",
        Dialect::Postgres => "SELECT current_setting('synchronous_commit')",
    };
    let read_setting = move |tx: &mut dyn EffectTx| -> Result<String, Error> {
        let rows = tx.query(setting, &[])?;
        Ok(match rows[0].first() {
            Some(SqlValue::Integer(i)) => i.to_string(),
            Some(SqlValue::Text(t)) => t.clone(),
            other => format!("{other:?}"),
        })
    };
    // A write inserting widget `name`, answering the setting it ran with.
    let insert = move |name: &'static str| {
        move |tx: &mut dyn EffectTx| -> Result<String, Error> {
            tx.execute(
                "INSERT INTO widgets(tenant, name) VALUES (?1, ?2)",
                &["t".into(), name.into()],
            )?;
            read_setting(tx)
        }
    };
    let before = store
        .write(read_setting)
        .await
        .expect("the store's setting");
    let inside = store
        .write_unflushed(insert("unflushed"))
        .await
        .expect("the unflushed write");
    if store.dialect() == Dialect::Sqlite {
        assert_eq!(
            inside, "1",
            "the unflushed write commits with synchronous=NORMAL"
        );
    }
    let after = store
        .write(insert("flushed"))
        .await
        .expect("the flushed write");
    assert_eq!(after, before, "the next write waits for the disk as before");
    assert_ne!(after, "1", "the store's own writes wait for the disk");
    assert_ne!(after, "off", "the store's own writes wait for the disk");
    drop(store);
    let other = h.open();
    assert_eq!(count(&other, "widgets").await, 2);
}

/// A statement whose answer nobody waits for (`execute_unanswered`) commits with its
/// transaction, alone or before other statements; one that fails fails its transaction, which
/// keeps nothing, even when the closure goes on; and a closure that answers after a failed
/// statement commits nothing the server refused.
pub async fn an_unanswered_statement_commits_or_fails_with_its_transaction(h: &Harness) {
    let store = h.open();
    let insert = "INSERT INTO widgets(tenant, name) VALUES (?1, ?2)";
    let names = |store: &toolledger::store::Store| {
        let store = store.clone();
        async move {
            store
                .read(|tx| {
                    let rows = tx.query("SELECT name FROM widgets ORDER BY id", &[])?;
                    rows.iter()
                        .map(|r| r.text(0))
                        .collect::<Result<Vec<_>, _>>()
                })
                .await
                .expect("read the widgets")
        }
    };
    // Alone in its transaction, then before a query that reads it back, then before another.
    store
        .write(move |tx| tx.execute_unanswered(insert, &["t".into(), "alone".into()]))
        .await
        .expect("an unanswered statement alone");
    let seen = store
        .write(move |tx| {
            tx.execute_unanswered(insert, &["t".into(), "read-back".into()])?;
            let rows = tx.query(
                "SELECT count(*) FROM widgets WHERE name = ?1",
                &["read-back".into()],
            )?;
            rows[0].int(0)
        })
        .await
        .expect("an unanswered statement, then a query");
    assert_eq!(
        seen, 1,
        "the next statement sees what the unanswered one wrote"
    );
    store
        .write(move |tx| {
            tx.execute_unanswered(insert, &["t".into(), "first".into()])?;
            tx.execute_unanswered(insert, &["t".into(), "second".into()])
        })
        .await
        .expect("two unanswered statements");
    assert_eq!(
        names(&store).await,
        ["alone", "read-back", "first", "second"],
        "each committed, in order"
    );
    // A refused one (the name's CHECK) fails its transaction, whether it was the last
    // statement or another one followed it; what ran before it is undone.
    let too_long = "x".repeat(40);
    for then_query in [false, true] {
        let too_long = too_long.clone();
        let out = store
            .write(move |tx| {
                tx.execute(insert, &["t".into(), "undone".into()])?;
                tx.execute_unanswered(insert, &["t".into(), too_long.as_str().into()])?;
                if then_query {
                    tx.query("SELECT count(*) FROM widgets", &[])?;
                }
                Ok::<_, Error>(())
            })
            .await;
        assert!(
            out.is_err(),
            "a refused unanswered statement fails the write ({then_query})"
        );
    }
    // A closure that goes on after a refused statement: SQLite undid that statement alone;
    // PostgreSQL aborted the transaction, which must not be reported committed.
    let out = store
        .write(move |tx| {
            tx.execute(insert, &["t".into(), "before-refusal".into()])?;
            let refused = tx.execute(insert, &["t".into(), "y".repeat(40).as_str().into()]);
            assert!(refused.is_err(), "the name's CHECK refuses it");
            Ok::<_, Error>(())
        })
        .await;
    let after = names(&store).await;
    match store.dialect() {
        Dialect::Sqlite => {
            out.expect("SQLite keeps the transaction");
            assert_eq!(after.last().map(String::as_str), Some("before-refusal"));
        }
        Dialect::Postgres => {
            assert!(
                out.is_err(),
                "an aborted transaction is not reported committed"
            );
            assert_eq!(after.len(), 4, "nothing of it committed: {after:?}");
        }
    }
}

/// A fresh call commits the effect row and the ledger row together; the result is stored.
pub async fn reservation_commits_effect_and_ledger_together(h: &Harness) {
    let (e, _) = engine(h);
    let p = principal("t1", "alice");
    let out = e
        .execute_inline(widget_call(&p, "k1", "a"), widget("a"))
        .await
        .unwrap();
    assert!(!out.replayed);
    assert_eq!(out.state, OperationState::Applied);
    assert_eq!(count(e.store(), "widgets").await, 1);
    assert_eq!(count(e.store(), "operations").await, 1);
    let rec = e
        .lookup("t1", "alice", "make_widget", "k1")
        .await
        .unwrap()
        .unwrap();
    assert_eq!(rec.result, Some(out.result));
    assert_eq!(rec.state, OperationState::Applied);
    assert_eq!(rec.status_ref, out.status_ref);
}

/// An exact retry — through the same handle, a new handle, and after the first handle is
/// gone — returns the stored result with `replayed: true` and never runs the effect again.
pub async fn replay_returns_the_stored_result_across_handles(h: &Harness) {
    let (e, clock) = engine(h);
    let p = principal("t1", "alice");
    let first = e
        .execute_inline(widget_call(&p, "k1", "a"), widget("a"))
        .await
        .unwrap();
    let again = e
        .execute_inline(widget_call(&p, "k1", "a"), widget("a"))
        .await
        .unwrap();
    assert!(again.replayed);
    assert_eq!(again.result, first.result);
    drop(e);
    let other = Engine::new(h.open(), Arc::new(clock));
    let third = other
        .execute_inline(widget_call(&p, "k1", "a"), widget("a"))
        .await
        .unwrap();
    assert!(third.replayed);
    assert_eq!(third.result, first.result);
    assert_eq!(third.operation_id, first.operation_id);
    assert_eq!(count(other.store(), "widgets").await, 1);
}

/// The same scope with a different intent is `operation_conflict` and writes nothing.
pub async fn conflict_writes_nothing(h: &Harness) {
    let (e, _) = engine(h);
    let p = principal("t1", "alice");
    e.execute_inline(widget_call(&p, "k1", "a"), widget("a"))
        .await
        .unwrap();
    let before = (
        count(e.store(), "widgets").await,
        count(e.store(), "operations").await,
    );
    let err = e
        .execute_inline(widget_call(&p, "k1", "b"), widget("b"))
        .await;
    assert_eq!(code(err), ErrorCode::OperationConflict);
    let after = (
        count(e.store(), "widgets").await,
        count(e.store(), "operations").await,
    );
    assert_eq!(before, after);
    // The key is per principal: another subject may use it for anything.
    let q = principal("t1", "bob");
    assert!(
        !e.execute_inline(widget_call(&q, "k1", "b"), widget("b"))
            .await
            .unwrap()
            .replayed
    );
}

/// Deadlines: authority before retention, `now >= deadline` has passed, a conflict is
/// reported before any deadline, and an expired row stays as a tombstone whose key can never
/// carry another intent.
pub async fn deadlines_and_tombstones(h: &Harness) {
    let (e, clock) = engine(h);
    let p = principal("t1", "alice");
    let mut call = widget_call(&p, "k1", "a");
    call.authority_deadline = Some(T0 + 10);
    call.retention_deadline = Some(T0 + 20);
    e.execute_inline(call.clone(), widget("a")).await.unwrap();
    clock.set(T0 + 9);
    assert!(
        e.execute_inline(call.clone(), widget("a"))
            .await
            .unwrap()
            .replayed
    );
    clock.set(T0 + 10);
    assert_eq!(
        code(e.execute_inline(call.clone(), widget("a")).await),
        ErrorCode::OperationAuthorityExpired
    );
    let mut other = widget_call(&p, "k1", "b");
    other.authority_deadline = call.authority_deadline;
    other.retention_deadline = call.retention_deadline;
    assert_eq!(
        code(e.execute_inline(other.clone(), widget("b")).await),
        ErrorCode::OperationConflict
    );
    // Retention alone (no authority deadline).
    let mut kept = widget_call(&p, "k2", "c");
    kept.retention_deadline = Some(T0 + 30);
    clock.set(T0);
    e.execute_inline(kept.clone(), widget("c")).await.unwrap();
    clock.set(T0 + 30);
    assert_eq!(
        code(e.execute_inline(kept.clone(), widget("c")).await),
        ErrorCode::OperationRetentionExpired
    );
    // Tombstone: the rows stay, the key never carries a new intent.
    clock.set(T0 + 1_000_000);
    assert_eq!(
        code(
            e.execute_inline(widget_call(&p, "k2", "d"), widget("d"))
                .await
        ),
        ErrorCode::OperationConflict
    );
    assert_eq!(count(e.store(), "operations").await, 2);
    assert_eq!(count(e.store(), "widgets").await, 2);
    // A fresh call whose own deadline has already passed writes nothing.
    let mut late = widget_call(&p, "k3", "e");
    late.authority_deadline = Some(T0);
    assert_eq!(
        code(e.execute_inline(late, widget("e")).await),
        ErrorCode::OperationAuthorityExpired
    );
    assert_eq!(count(e.store(), "operations").await, 2);
}

/// With a shared key namespace, the same `(tool, key)` under another principal conflicts.
pub async fn shared_key_namespace(h: &Harness) {
    let (e, _) = engine(h);
    let mut a = widget_call(&principal("t1", "alice"), "op-1", "a");
    a.shared_key_namespace = true;
    e.execute_inline(a.clone(), widget("a")).await.unwrap();
    let mut b = widget_call(&principal("t2", "bob"), "op-1", "a");
    b.shared_key_namespace = true;
    assert_eq!(
        code(e.execute_inline(b, widget("a")).await),
        ErrorCode::OperationConflict
    );
    assert_eq!(count(e.store(), "operations").await, 1);
    assert_eq!(
        e.lookup_by_key_any_principal("make_widget", "op-1")
            .await
            .unwrap()
            .len(),
        1
    );
}

/// Spoils the stored arguments of every operation of `e`'s store: from now on a read of one
/// from the store is a storage-contract error (`unavailable`).
async fn spoil_stored_rows(e: &Engine) {
    e.store()
        .write(|tx: &mut dyn EffectTx| {
            tx.execute(
                "UPDATE operations SET arguments = ?1",
                &[SqlValue::from(r#"{ "name":"a"}"#)],
            )
        })
        .await
        .unwrap();
}

/// A settled row an engine has read from the store answers the exact retries of its scope
/// from memory, with the same checks (conflict, deadlines): after the stored row is spoiled,
/// the engine that read it still replays and refuses as before while a new engine is refused
/// by the store. A fresh call's own row is not kept; the copy stops answering once the
/// retention deadline is within `KEPT_ROW_MARGIN_SECS`, and a clock set back does not revive
/// it.
pub async fn settled_rows_answer_retries_from_memory(h: &Harness) {
    use toolledger::engine::KEPT_ROW_MARGIN_SECS as MARGIN;
    let (e, clock) = engine(h);
    let p = principal("t1", "alice");
    let mut call = widget_call(&p, "k1", "a");
    call.retention_deadline = Some(T0 + 3600);
    let fresh = e.execute_inline(call.clone(), widget("a")).await.unwrap();
    let replayed = e.execute_inline(call.clone(), widget("a")).await.unwrap();
    assert!(replayed.replayed);
    spoil_stored_rows(&e).await;
    let from_memory = e.execute_inline(call.clone(), widget("a")).await.unwrap();
    assert!(from_memory.replayed);
    assert_eq!(from_memory.result, fresh.result);
    assert_eq!(from_memory.status_ref, fresh.status_ref);
    assert_eq!(from_memory.operation_id, fresh.operation_id);
    let mut other = widget_call(&p, "k1", "b");
    other.retention_deadline = call.retention_deadline;
    assert_eq!(
        code(e.execute_inline(other, widget("b")).await),
        ErrorCode::OperationConflict
    );
    // The store itself now refuses the row.
    let (reader, _) = engine(h);
    assert_eq!(
        code(reader.execute_inline(call.clone(), widget("a")).await),
        ErrorCode::Unavailable
    );
    // Near the retention deadline the store answers, and keeps answering after the clock
    // is set back.
    clock.set(T0 + 3600 - MARGIN - 1);
    assert!(
        e.execute_inline(call.clone(), widget("a"))
            .await
            .unwrap()
            .replayed
    );
    clock.set(T0 + 3600 - MARGIN);
    assert_eq!(
        code(e.execute_inline(call.clone(), widget("a")).await),
        ErrorCode::Unavailable
    );
    clock.set(T0);
    assert_eq!(
        code(e.execute_inline(call.clone(), widget("a")).await),
        ErrorCode::Unavailable
    );
    // A fresh call's own row is not kept: a spoiled row is refused at its first retry.
    let (e, _) = engine(h);
    let second = widget_call(&p, "k2", "c");
    e.execute_inline(second.clone(), widget("c")).await.unwrap();
    spoil_stored_rows(&e).await;
    assert_eq!(
        code(e.execute_inline(second, widget("c")).await),
        ErrorCode::Unavailable
    );
    assert_eq!(count(e.store(), "widgets").await, 2);
}

/// The widget effect whose access check reads the store: the caller's tenant must own a
/// widget row.
struct OwnersOnly;

impl InlineEffect for OwnersOnly {
    fn authorize(&self, tx: &mut dyn EffectTx, principal: &Principal) -> Result<(), Error> {
        let owned = tx.query(
            "SELECT id FROM widgets WHERE tenant = ?1",
            &[SqlValue::from(principal.tenant.as_str())],
        )?;
        if owned.is_empty() {
            return Err(Error::new(ErrorCode::PermissionDenied, "not an owner"));
        }
        Ok(())
    }

    fn apply(&self, _tx: &mut dyn EffectTx, _principal: &Principal) -> Result<Value, Error> {
        Ok(json!({"granted": true}))
    }
}

/// Retries whose effect's access check reads the store, and retries in a shared key
/// namespace, are answered by the store every time: a revoked access is refused at the next
/// retry, and a spoiled row is refused.
pub async fn retries_the_store_must_answer_read_it(h: &Harness) {
    let (e, _) = engine(h);
    let p = principal("t1", "alice");
    e.execute_inline(widget_call(&p, "w", "a"), widget("a"))
        .await
        .unwrap();
    let call = inline_call(&p, "grant", "g1", json!({}));
    let owners: Arc<dyn InlineEffect> = Arc::new(OwnersOnly);
    e.execute_inline(call.clone(), owners.clone())
        .await
        .unwrap();
    assert!(
        e.execute_inline(call.clone(), owners.clone())
            .await
            .unwrap()
            .replayed
    );
    assert!(
        e.execute_inline(call.clone(), owners.clone())
            .await
            .unwrap()
            .replayed
    );
    e.store()
        .write(|tx: &mut dyn EffectTx| tx.execute("DELETE FROM widgets", &[]))
        .await
        .unwrap();
    assert_eq!(
        code(e.execute_inline(call, owners).await),
        ErrorCode::PermissionDenied
    );
    let mut shared = widget_call(&p, "s1", "b");
    shared.shared_key_namespace = true;
    e.execute_inline(shared.clone(), widget("b")).await.unwrap();
    assert!(
        e.execute_inline(shared.clone(), widget("b"))
            .await
            .unwrap()
            .replayed
    );
    spoil_stored_rows(&e).await;
    assert_eq!(
        code(e.execute_inline(shared, widget("b")).await),
        ErrorCode::Unavailable
    );
}

/// Stored JSON that is not canonical never reaches a caller: it is a storage-contract error.
pub async fn non_canonical_stored_json_is_refused(h: &Harness) {
    let (e, _) = engine(h);
    let p = principal("t1", "alice");
    e.execute_inline(widget_call(&p, "k1", "a"), widget("a"))
        .await
        .unwrap();
    spoil_stored_rows(&e).await;
    assert_eq!(
        code(
            e.execute_inline(widget_call(&p, "k1", "a"), widget("a"))
                .await
        ),
        ErrorCode::Unavailable
    );
    assert_eq!(count(e.store(), "widgets").await, 1);
}
