//! The canonical encoder's round trip: parse → canonical → parse → canonical is
//! byte-identical, the canonical form is exactly what an independent encoder written from the
//! published rules produces, `parse_canonical` accepts exactly the canonical bytes, and values
//! read leniently by serde_json (floats, large integers) are encoded or refused by the rules.
#![no_main]

use libfuzzer_sys::fuzz_target;
use serde_json::Value;
use toolledger::json::{self, Limits};
use toolledger_fuzz::{check_json_error, oracle_canonical, roomy};

fuzz_target!(|data: &[u8]| {
    let limits = Limits::DEFAULT;
    match json::parse(data, &limits) {
        Ok(value) => {
            let first = json::canonical_string(&value).expect("an accepted value encodes");
            assert_eq!(oracle_canonical(&value).as_deref(), Some(first.as_str()));
            assert_eq!(
                json::canonicalize(data, &limits).as_deref(),
                Ok(first.as_str())
            );
            let again = json::parse(first.as_bytes(), &roomy(&limits)).expect("re-parses");
            assert_eq!(again, value);
            let second = json::canonical_string(&again).expect("encodes again");
            assert_eq!(first, second, "the round trip is byte-identical");
            assert_eq!(
                json::parse_canonical_with(first.as_bytes(), &roomy(&limits)).as_ref(),
                Ok(&value)
            );
            // The input itself is canonical exactly when it is its own canonical form.
            match json::parse_canonical(data) {
                Ok(v) => {
                    assert_eq!(data, first.as_bytes());
                    assert_eq!(v, value);
                }
                Err(e) => {
                    check_json_error(&e);
                    assert_ne!(data, first.as_bytes());
                    assert_eq!(e.code, "non_canonical");
                }
            }
        }
        Err(e) => {
            check_json_error(&e);
            assert!(json::parse_canonical(data).is_err());
        }
    }
    // Values from a lenient reader: the encoder decides the domain itself.
    if let Ok(lenient) = serde_json::from_slice::<Value>(data) {
        match json::canonical_string(&lenient) {
            Ok(text) => {
                assert_eq!(oracle_canonical(&lenient).as_deref(), Some(text.as_str()));
                let back = json::parse_canonical_with(text.as_bytes(), &roomy(&limits))
                    .expect("the encoder's output is canonical");
                assert_eq!(json::canonical_string(&back).as_deref(), Ok(text.as_str()));
            }
            Err(e) => {
                check_json_error(&e);
                assert_eq!(oracle_canonical(&lenient), None, "refused: {e}");
            }
        }
    }
});
