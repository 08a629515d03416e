//! Micro-benchmarks of the per-call CPU work that is not SQL: canonical JSON encoding, strict
//! canonical parsing of stored JSON, and the digests every call computes.
//!
//! Run with `cargo bench -p toolledger --bench canonical`.

use std::hint::black_box;

use criterion::{criterion_group, criterion_main, Criterion, Throughput};
use serde_json::{json, Value};
use toolledger::digest::{self, FingerprintInput, FingerprintKey};
use toolledger::json::{self, Limits};
use toolledger::ToolContract;

/// Arguments of a typical tool call.
fn small_arguments() -> Value {
    json!({"title": "Refund order 1042", "order_id": "ord_1042", "amount_cents": 1999,
           "notify": true})
}

/// A larger stored result: nested objects, an array, escapes and non-ASCII text.
fn large_result() -> Value {
    let items: Vec<Value> = (0..20)
        .map(|i| {
            json!({"id": i, "sku": format!("sku-{i:04}"), "qty": i % 3 + 1,
                   "note": "line \"quoted\"\nnext — ünïcödé", "tags": ["a", "b", "c"]})
        })
        .collect();
    json!({"operationId": "op-7f3a", "state": "applied", "replayed": false,
           "result": {"items": items, "total_cents": 123456, "currency": "EUR"}})
}

fn encode(c: &mut Criterion) {
    let mut g = c.benchmark_group("canonical_encode");
    for (name, value) in [("small", small_arguments()), ("large", large_result())] {
        let bytes = json::canonical_string(&value).unwrap().len();
        g.throughput(Throughput::Bytes(bytes as u64));
        g.bench_function(name, |b| {
            b.iter(|| json::canonical_string(black_box(&value)).unwrap())
        });
    }
    g.finish();
}

fn parse_stored(c: &mut Criterion) {
    let mut g = c.benchmark_group("parse_canonical");
    for (name, value) in [("small", small_arguments()), ("large", large_result())] {
        let text = json::canonical_string(&value).unwrap();
        g.throughput(Throughput::Bytes(text.len() as u64));
        g.bench_function(name, |b| {
            b.iter(|| json::parse_canonical(black_box(text.as_bytes())).unwrap())
        });
        g.bench_function(format!("{name}_parse_only"), |b| {
            b.iter(|| json::parse(black_box(text.as_bytes()), &Limits::DEFAULT).unwrap())
        });
    }
    g.finish();
}

fn digests(c: &mut Criterion) {
    let mut g = c.benchmark_group("digest");
    let contract = ToolContract::uniform("refund_order", "3");
    let args = small_arguments();
    g.bench_function("request_digest", |b| {
        b.iter(|| {
            digest::request_digest(
                black_box("tenant-a"),
                black_box("alice"),
                &contract,
                black_box(&args),
            )
            .unwrap()
        })
    });
    let result = large_result();
    g.bench_function("result_digest_large", |b| {
        b.iter(|| digest::result_digest(black_box(&result)).unwrap())
    });
    let text = json::canonical_string(&result).unwrap();
    g.bench_function("sha256_hex_stored_result", |b| {
        b.iter(|| digest::sha256_hex(black_box(text.as_bytes())))
    });
    let short = [7u8; 64];
    g.bench_function("sha256_hex_64_bytes", |b| {
        b.iter(|| digest::sha256_hex(black_box(&short)))
    });
    let key = FingerprintKey::from_bytes(b"test-only-cross-language-key-32b").unwrap();
    let input = FingerprintInput::from_json(
        br#"{"principal":"alice","tool_id":"create_issue","tool_version":"1.0","arguments":{"title":"spec"},"continuation_state":"awaiting-body","input_responses":{"body":{"action":"accept","content":{"body":"alpha"}}}}"#,
        &Limits::DEFAULT,
    )
    .unwrap();
    g.bench_function("fingerprint", |b| {
        b.iter(|| digest::fingerprint(black_box(&key), black_box(&input)).unwrap())
    });
    g.finish();
}

criterion_group!(benches, encode, parse_stored, digests);
criterion_main!(benches);
