//! The backend conformance suite (`toolledger::store::conformance`), run against SQLite and
//! against PostgreSQL (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud line when unset,
//! failing when unset in CI).

mod sqlite {
    toolledger::conformance_suite!(Some(toolledger::store::conformance::Harness::sqlite()));
}

mod postgres {
    toolledger::conformance_suite!(toolledger::store::conformance::Harness::postgres());
}
