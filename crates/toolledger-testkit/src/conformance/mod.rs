//! The backend conformance suite: every store-level behaviour of the ledger, written once and
//! run against every backend (like River's shared driver test suite).
//!
//! Each behaviour is a `pub async fn` taking a [`Harness`], which opens fresh, independent
//! databases of one backend: a temporary SQLite file, or a PostgreSQL schema of its own
//! (`tl_<random>`, dropped afterwards) in the database named by
//! `TOOLLEDGER_TEST_DATABASE_URL` (both through [`crate::db`]). The behaviours live in one
//! module per area:
//!
//! - [`ledger`]: insert ids, reservations, replay, conflicts, deadlines and tombstones, the
//!   shared key namespace, stored JSON that is not canonical, settled rows answered from memory;
//! - [`inline`]: multi-step operations, rollback on failure, contention;
//! - [`deferred`]: the deferred-effect runtime from intent to receipt;
//! - [`outbox`]: claims, leases, fencing, backlogs, exhausted attempts;
//! - [`approvals`]: single consumption under contention;
//! - [`principals`]: the principal store and the worker's recheck;
//! - [`migrations`]: schema binding, migrations, concurrent first opens;
//!
//! and what they run on — the [`Harness`], the suite's tables and effects — in [`harness`].
//! [`conformance_suite!`](crate::conformance_suite) turns them into `#[tokio::test]`s for one
//! backend, one test module per area:
//!
//! ```text
//! mod sqlite { toolledger_testkit::conformance_suite!(Some(toolledger_testkit::conformance::Harness::sqlite())); }
//! mod postgres { toolledger_testkit::conformance_suite!(toolledger_testkit::conformance::Harness::postgres()); }
//! ```
//!
//! Without `TOOLLEDGER_TEST_DATABASE_URL` the PostgreSQL tests are skipped with one loud line
//! on stderr — unless `TOOLLEDGER_CI` is set, where they fail. A URL that is set but
//! unreachable fails.
//!
//! An integration test's own behaviours (written against a [`Harness`] too) run on every
//! driver through [`both_drivers!`](crate::both_drivers): one test per behaviour and driver.

pub mod approvals;
pub mod deferred;
pub mod harness;
pub mod inline;
pub mod ledger;
pub mod migrations;
pub mod outbox;
pub mod principals;

pub use crate::calls::principal;
pub use crate::db::{
    count, fresh_schema_name, test_database_url, ServerLock, CI_ENV, DATABASE_URL_ENV,
    SERVER_LOCK_PATH,
};
pub use crate::downstream::CountingDownstream;
pub use harness::{
    engine, ship, widget_call, Harness, ShipParcel, WidgetEffect, World, PG_MIGRATIONS,
    SQLITE_MIGRATIONS, T0,
};

/// Expands to one `#[tokio::test]` per conformance behaviour, in one module per area
/// (`ledger::conflict_writes_nothing`, …). The argument is an expression of type
/// `Option<Harness>` evaluated afresh for each test (`None` skips); it is expanded inside the
/// area modules, which see the caller's module through `use super::*`.
#[macro_export]
macro_rules! conformance_suite {
    ($harness:expr) => {
        $crate::conformance_suite!(@areas $harness;
            ledger {
                insert_id_returns_the_inserted_rows_id,
                reservation_commits_effect_and_ledger_together,
                replay_returns_the_stored_result_across_handles,
                conflict_writes_nothing,
                deadlines_and_tombstones,
                shared_key_namespace,
                non_canonical_stored_json_is_refused,
                settled_rows_answer_retries_from_memory,
                retries_the_store_must_answer_read_it,
                an_unflushed_write_commits_and_the_next_one_waits_for_the_disk,
                an_unanswered_statement_commits_or_fails_with_its_transaction,
            }
            inline {
                multi_step_operations,
                racing_finishes_of_one_operation_have_one_winner,
                rollback_on_injected_failure,
                contention_eight_handles,
                contention_shared_namespace,
            }
            deferred {
                intent_and_outbox_commit_together,
                dispatch_of_unfinished_only_observes_and_status_reconciles,
                transaction_c_rolls_back_as_a_unit,
                eight_handles_accept_one_intent,
                a_replan_of_an_unsettled_intent_is_a_possible_duplicate,
                worker_and_status_query_reconcile_once,
            }
            outbox {
                claims_leases_and_fencing,
                eight_workers_claim_one_event,
                worker_pass_delivers_the_backlog,
                attempts_exhausted_go_dead,
            }
            approvals {
                an_approval_is_consumed_once_under_contention,
            }
            principals {
                principal_store_is_reread,
                concurrent_revocations_lose_nothing,
                worker_rechecks_the_principal_before_the_downstream,
            }
            migrations {
                schema_binding_and_migrations,
                concurrent_first_opens_do_not_race,
            }
        );
    };
    (@areas $harness:expr; $($area:ident { $($name:ident),* $(,)? })*) => {
        $(
            mod $area {
                #[allow(unused_imports)]
                use super::*;

                $(
                    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                    async fn $name() {
                        let harness: Option<$crate::conformance::Harness> = $harness;
                        if let Some(h) = harness {
                            $crate::conformance::$area::$name(&h).await;
                        }
                    }
                )*
            }
        )*
    };
}

/// Runs behaviours of a test file of its own on every driver, as [`conformance_suite!`] does
/// for the suite: for each `name` given, the caller's `async fn name(h: &Harness)` becomes a
/// module `name` with two `#[tokio::test]`s, `sqlite` ([`Harness::sqlite`]) and `postgres`
/// ([`Harness::postgres`]: skipped with one loud line without a test database, failing in
/// CI). Each test runs the behaviour on a fresh harness of its own.
///
/// ```text
/// async fn replays_the_stored_result(h: &Harness) { … }
/// toolledger_testkit::both_drivers!(replays_the_stored_result);
/// ```
#[macro_export]
macro_rules! both_drivers {
    ($($name:ident),* $(,)?) => {
        $(
            mod $name {
                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn sqlite() {
                    super::$name(&$crate::conformance::Harness::sqlite()).await;
                }

                #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
                async fn postgres() {
                    if let Some(h) = $crate::conformance::Harness::postgres() {
                        super::$name(&h).await;
                    }
                }
            }
        )*
    };
}
