//! The requestState opener: opening arbitrary or mutated tokens never panics and never
//! accepts a token this sealer did not seal; a sealed binding opens only for its own caller,
//! tool and operation id within its lifetime, and never under a key outside the keyring.
#![no_main]

use std::sync::OnceLock;

use libfuzzer_sys::arbitrary::{Arbitrary, Result as ArbitraryResult, Unstructured};
use libfuzzer_sys::fuzz_target;
use toolledger::model::ErrorCode;
use toolledger_mcp::{StateBinding, StateSealer};

const TTL: i64 = 600;

struct Sealers {
    /// The server's keyring: a current key and a previous one.
    ring: StateSealer,
    /// The previous key alone: its tokens open in the ring.
    previous: StateSealer,
    /// A key outside the ring.
    stranger: StateSealer,
    /// Tokens the ring sealed, with what they bind.
    genuine: Vec<(StateBinding, String)>,
}

fn binding(n: u8) -> StateBinding {
    StateBinding {
        tenant: "acme".into(),
        subject: "alice".into(),
        tool: "create_issue".into(),
        operation_id: format!("op-{n}"),
        args_digest: "00".repeat(32),
        nonce: format!("nonce-{n}"),
        step: "awaiting-body".into(),
        issued_at: 1_000,
        authority_deadline: 2_000,
        retention_deadline: 3_000,
        upstream_state: (n % 2 == 1).then(|| "rs2.upstream".to_string()),
    }
}

fn sealers() -> &'static Sealers {
    static SEALERS: OnceLock<Sealers> = OnceLock::new();
    SEALERS.get_or_init(|| {
        let ring = StateSealer::new(&[vec![7u8; 32], vec![9u8; 32]], TTL).unwrap();
        let previous = StateSealer::new(&[vec![9u8; 32]], TTL).unwrap();
        let stranger = StateSealer::new(&[vec![8u8; 32]], TTL).unwrap();
        let mut genuine = Vec::new();
        for n in 0..2 {
            let b = binding(n);
            genuine.push((b.clone(), ring.seal(&b).unwrap()));
            genuine.push((b.clone(), previous.seal(&b).unwrap()));
        }
        Sealers {
            ring,
            previous,
            stranger,
            genuine,
        }
    })
}

fn open(s: &StateSealer, token: &str, b: &StateBinding, now: i64) -> Option<StateBinding> {
    match s.open(token, &b.tenant, &b.subject, &b.tool, &b.operation_id, now) {
        Ok(opened) => Some(opened),
        Err(e) => {
            assert_eq!(e.code, ErrorCode::RequestStateInvalid);
            None
        }
    }
}

/// Asserts that `token` opens under `b`'s identity only if it is a token the ring sealed for
/// exactly that binding.
fn never_forged(s: &Sealers, token: &str, b: &StateBinding, now: i64) {
    if let Some(opened) = open(&s.ring, token, b, now) {
        assert!(
            s.genuine.iter().any(|(g, t)| t == token && *g == opened),
            "accepted a token it did not seal: {token:?}"
        );
        assert!(now < opened.issued_at + TTL);
    }
}

const TOKEN_BYTES: &[u8] =
    b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.=+/ rs12";

/// A genuine token with a few edits (replace, insert, delete, cut, swap a section).
fn mutated(u: &mut Unstructured<'_>, s: &Sealers) -> ArbitraryResult<(usize, String)> {
    let which = u.choose_index(s.genuine.len())?;
    let mut token = s.genuine[which].1.clone().into_bytes();
    for _ in 0..u.int_in_range(1..=4)? {
        let n = token.len();
        match u.int_in_range(0..=4)? {
            0 if n > 0 => {
                let at = u.choose_index(n)?;
                token[at] = *u.choose(TOKEN_BYTES)?;
            }
            1 => {
                let at = u.int_in_range(0..=n)?;
                token.insert(at, *u.choose(TOKEN_BYTES)?);
            }
            2 if n > 0 => {
                token.remove(u.choose_index(n)?);
            }
            3 => token.truncate(u.int_in_range(0..=n)?),
            4 => {
                // A section taken from another genuine token.
                let other = &s.genuine[u.choose_index(s.genuine.len())?].1;
                let parts: Vec<&str> = other.split('.').collect();
                let mine: Vec<String> = String::from_utf8_lossy(&token)
                    .split('.')
                    .map(str::to_string)
                    .collect();
                let at = u.choose_index(parts.len())?;
                let mut mixed = mine.clone();
                if at < mixed.len() {
                    mixed[at] = parts[at].to_string();
                }
                token = mixed.join(".").into_bytes();
            }
            _ => {}
        }
    }
    Ok((which, String::from_utf8_lossy(&token).into_owned()))
}

fn run(u: &mut Unstructured<'_>) -> ArbitraryResult<()> {
    let s = sealers();
    match u.int_in_range(0..=3u8)? {
        // Arbitrary text as a token, for a genuine binding's identity.
        0 => {
            let b = &s.genuine[u.choose_index(s.genuine.len())?].0;
            let token = <&str>::arbitrary(u)?;
            never_forged(s, token, b, 1_100);
        }
        // A mutated genuine token.
        1 => {
            let (which, token) = mutated(u, s)?;
            let b = &s.genuine[which].0;
            never_forged(s, &token, b, 1_100);
            if s.genuine.iter().all(|(_, t)| *t != token) {
                assert!(open(&s.ring, &token, b, 1_100).is_none(), "{token:?}");
            }
        }
        // A genuine token presented with another identity or at another time.
        2 => {
            let (b, token) = &s.genuine[u.choose_index(s.genuine.len())?];
            let mut other = b.clone();
            if u.arbitrary()? {
                other.tenant = String::arbitrary(u)?;
            }
            if u.arbitrary()? {
                other.subject = String::arbitrary(u)?;
            }
            if u.arbitrary()? {
                other.tool = String::arbitrary(u)?;
            }
            if u.arbitrary()? {
                other.operation_id = String::arbitrary(u)?;
            }
            let now = i64::arbitrary(u)?;
            let same = other.tenant == b.tenant
                && other.subject == b.subject
                && other.tool == b.tool
                && other.operation_id == b.operation_id;
            let live = now < b.issued_at + TTL;
            match open(&s.ring, token, &other, now) {
                Some(opened) => {
                    assert!(same && live, "opened for {other:?} at {now}");
                    assert_eq!(&opened, b);
                }
                None => assert!(!(same && live), "refused its own token at {now}"),
            }
        }
        // An arbitrary binding: sealed, it opens as itself for its own identity only.
        _ => {
            let b = StateBinding {
                tenant: String::arbitrary(u)?,
                subject: String::arbitrary(u)?,
                tool: String::arbitrary(u)?,
                operation_id: String::arbitrary(u)?,
                args_digest: String::arbitrary(u)?,
                nonce: String::arbitrary(u)?,
                step: String::arbitrary(u)?,
                issued_at: i64::arbitrary(u)?,
                authority_deadline: i64::arbitrary(u)?,
                retention_deadline: i64::arbitrary(u)?,
                upstream_state: Option::<String>::arbitrary(u)?,
            };
            let token = s.ring.seal(&b).expect("any binding seals");
            let now = b
                .issued_at
                .saturating_add(i64::from(u.int_in_range(0..=700u16)?));
            let live = now < b.issued_at.saturating_add(TTL);
            assert_eq!(open(&s.ring, &token, &b, now).is_some(), live);
            if let Some(opened) = open(&s.ring, &token, &b, now) {
                assert_eq!(opened, b);
            }
            // Only keys of the ring open it; a key outside never does.
            assert!(open(&s.stranger, &token, &b, now).is_none());
            let theirs = s.stranger.seal(&b).expect("seals");
            assert!(open(&s.ring, &theirs, &b, now).is_none());
            // The previous key's token opens in the ring, not the other way round.
            let previous = s.previous.seal(&b).expect("seals");
            assert_eq!(open(&s.ring, &previous, &b, now).is_some(), live);
            assert!(open(&s.previous, &token, &b, now).is_none());
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
