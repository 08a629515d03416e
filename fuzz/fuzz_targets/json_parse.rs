//! The strict JSON parser on arbitrary bytes: never panics, refuses with a documented code,
//! and whatever it accepts re-parses equal (see `toolledger_fuzz::check_parse`). A document
//! accepted under the fixture limits is accepted under the default ones as the same value.
#![no_main]

use libfuzzer_sys::fuzz_target;
use toolledger::json::Limits;
use toolledger_fuzz::check_parse;

const TIGHT: Limits = Limits {
    max_bytes: 64,
    max_depth: 2,
};

fuzz_target!(|data: &[u8]| {
    let default = check_parse(data, &Limits::DEFAULT);
    let fixture = check_parse(data, &Limits::FIXTURE);
    let tight = check_parse(data, &TIGHT);
    if let Some(v) = &fixture {
        assert_eq!(default.as_ref(), Some(v), "fixture limits are the tighter");
    }
    if let Some(v) = &tight {
        assert_eq!(fixture.as_ref(), Some(v), "tight limits are the tightest");
    }
});
