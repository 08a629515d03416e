//! The driver conformance suite (`toolledger_testkit::conformance`), run against SQLite and
//! against PostgreSQL (`TOOLLEDGER_TEST_DATABASE_URL`; skipped with one loud line when unset,
//! failing when unset in CI).

mod sqlite {
    toolledger_testkit::conformance_suite!(
        Some(toolledger_testkit::conformance::Harness::sqlite())
    );
}

mod postgres {
    toolledger_testkit::conformance_suite!(toolledger_testkit::conformance::Harness::postgres());
}
