//! The fixture loader: arbitrary bytes never panic; a refusal has a documented, path-free
//! code that agrees with the strict parser's verdict; an accepted fixture satisfies every
//! documented rule, and the canonical encoding of the same document is the same fixture.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolledger::approval::MAX_PORTABLE_TIMESTAMP;
use toolledger::json::{self, Limits};
use toolledger_cli::fixture::{self, Fixture};
use toolledger_reference::refunds;

const CODES: &[&str] = &[
    "FIXTURE_TOO_LARGE",
    "FIXTURE_NOT_UTF8",
    "FIXTURE_TOO_DEEP",
    "FIXTURE_DUPLICATE_KEY",
    "FIXTURE_NON_FINITE",
    "FIXTURE_INVALID_JSON",
    "FIXTURE_CONTRACT_ERROR",
];

fn short(s: &str) -> bool {
    (1..=128).contains(&s.chars().count())
}

fn check_accepted(f: &Fixture) {
    assert!((0..=MAX_PORTABLE_TIMESTAMP).contains(&f.now));
    assert_eq!(f.tool, refunds::TOOL);
    assert!(short(&f.principal));
    assert!(f.arguments.is_object());
    let p = &f.provider;
    for field in [
        &p.provider,
        &p.api_family,
        &p.adapter_revision,
        &p.turn_id,
        &p.call_id,
        &p.response_id,
    ] {
        assert!(short(field));
    }
    assert!(refunds::provider_profiles().contains(&p.profile()));
    for principal in &f.setup.principals {
        assert!(short(&principal.name) && short(&principal.tenant));
    }
    for order in &f.setup.orders {
        assert!(short(&order.id) && short(&order.tenant) && short(&order.owner_subject));
        assert!((1..=refunds::MAX_AMOUNT_CENTS).contains(&order.amount_cents));
    }
}

fuzz_target!(|data: &[u8]| {
    let strict = json::parse(data, &Limits::FIXTURE);
    match fixture::parse(data) {
        Ok(f) => {
            let value = strict.expect("an accepted fixture is strict JSON");
            check_accepted(&f);
            let canonical = json::canonical_string(&value).expect("in the canonical domain");
            if canonical.len() <= Limits::FIXTURE.max_bytes {
                assert_eq!(fixture::parse(canonical.as_bytes()).as_ref(), Ok(&f));
            }
        }
        Err(e) => {
            assert!(CODES.contains(&e.code), "undocumented code {e:?}");
            assert!(e.message.len() <= 200, "long message: {e:?}");
            // The JSON codes come from the parser; the contract code only for strict JSON.
            assert_eq!(e.code == "FIXTURE_CONTRACT_ERROR", strict.is_ok(), "{e:?}");
        }
    }
});
