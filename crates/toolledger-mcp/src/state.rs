//! Sealed `requestState` for multi-round tools.
//!
//! The token is sealed with rmcp's [`RequestStateCodec`] keyring (`rs2`, HMAC-SHA256) and carries
//! its own binding: principal, tool, operation id, a digest of the first round's arguments, a
//! nonce, the issue time and the operation's authority and retention deadlines. The principal,
//! tool and operation id are also mixed in as associated data, so a token presented by anyone
//! else, for another tool or another operation id does not even open. Expiry is checked against
//! the server's injectable clock. Every failure is reported as one generic
//! `request_state_invalid`; the details stay internal.
//!
//! The token only proves that this server issued it to this caller. It is *not* the single-use
//! guard: the ledger enforces one effect per operation (the token's nonce is part of the
//! fingerprint stored on the operation).

use rmcp::model::RequestStateCodec;
use serde::{Deserialize, Serialize};
use toolledger::model::{Error, ErrorCode};

use crate::keys::key_id;

/// What a sealed continuation token binds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateBinding {
    /// Tenant of the principal the token was issued to.
    pub tenant: String,
    /// Subject of the principal the token was issued to.
    pub subject: String,
    /// Tool name.
    pub tool: String,
    /// Operation id (the idempotency key).
    pub operation_id: String,
    /// Hex SHA-256 of the canonical first-round arguments.
    pub args_digest: String,
    /// Random nonce; two first rounds never produce the same token.
    pub nonce: String,
    /// Which round the continuation answers, e.g. `awaiting-body`.
    pub step: String,
    /// Issue time, Unix seconds (server clock).
    pub issued_at: i64,
    /// The operation's authority deadline, Unix seconds.
    pub authority_deadline: i64,
    /// The operation's retention deadline, Unix seconds.
    pub retention_deadline: i64,
    /// The state another server gave for this round, carried for it inside the seal (a
    /// proxy's upstream's `requestState`); absent for the ledger's own tools.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub upstream_state: Option<String>,
}

/// Seals and opens continuation tokens.
#[derive(Clone, Debug)]
pub struct StateSealer {
    codec: RequestStateCodec,
    ttl_secs: i64,
}

fn invalid() -> Error {
    Error::new(
        ErrorCode::RequestStateInvalid,
        "the continuation state is invalid, expired or not yours",
    )
}

fn associated_data(tenant: &str, subject: &str, tool: &str, operation_id: &str) -> Vec<u8> {
    let mut ad = Vec::new();
    for part in ["toolledger-mcp/v1", tenant, subject, tool, operation_id] {
        ad.extend_from_slice(&(part.len() as u64).to_be_bytes());
        ad.extend_from_slice(part.as_bytes());
    }
    ad
}

impl StateSealer {
    /// A sealer whose first key seals and every key opens; tokens live `ttl_secs` seconds.
    pub fn new(keys: &[Vec<u8>], ttl_secs: i64) -> Result<Self, Error> {
        let first = keys
            .first()
            .ok_or_else(|| Error::unavailable("no request-state key configured"))?;
        let ring: Vec<(String, Vec<u8>)> = keys.iter().map(|k| (key_id(k), k.clone())).collect();
        let codec = RequestStateCodec::new_with_keyring(key_id(first), ring)
            .map_err(|_| Error::unavailable("request-state keyring is invalid"))?;
        Ok(StateSealer { codec, ttl_secs })
    }

    /// Token lifetime in seconds.
    pub fn ttl_secs(&self) -> i64 {
        self.ttl_secs
    }

    /// Seals `binding` into an opaque `requestState` string.
    pub fn seal(&self, binding: &StateBinding) -> Result<String, Error> {
        let ad = associated_data(
            &binding.tenant,
            &binding.subject,
            &binding.tool,
            &binding.operation_id,
        );
        self.codec
            .seal_json_with(
                binding,
                &rmcp::model::SealOptions::new().associated_data(&ad),
            )
            .map_err(|_| Error::unavailable("request state could not be sealed"))
    }

    /// Opens `token` for the given caller, tool and operation id at time `now`, checking the
    /// binding and the token's lifetime. Every failure is `request_state_invalid`.
    pub fn open(
        &self,
        token: &str,
        tenant: &str,
        subject: &str,
        tool: &str,
        operation_id: &str,
        now: i64,
    ) -> Result<StateBinding, Error> {
        let ad = associated_data(tenant, subject, tool, operation_id);
        let binding: StateBinding = self
            .codec
            .open_json_with(token, &ad)
            .map_err(|_| invalid())?;
        if binding.tenant != tenant
            || binding.subject != subject
            || binding.tool != tool
            || binding.operation_id != operation_id
        {
            return Err(invalid());
        }
        if now >= binding.issued_at.saturating_add(self.ttl_secs) {
            return Err(invalid());
        }
        Ok(binding)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn binding() -> StateBinding {
        StateBinding {
            tenant: "acme".into(),
            subject: "alice".into(),
            tool: "create_issue".into(),
            operation_id: "op-1".into(),
            args_digest: "00".repeat(32),
            nonce: "n1".into(),
            step: "awaiting-body".into(),
            issued_at: 1_000,
            authority_deadline: 2_000,
            retention_deadline: 3_000,
            upstream_state: None,
        }
    }

    #[test]
    fn opens_only_for_the_same_caller_tool_and_operation_within_its_lifetime() {
        let s = StateSealer::new(&[vec![7u8; 32]], 600).unwrap();
        let t = s.seal(&binding()).unwrap();
        assert_eq!(
            s.open(&t, "acme", "alice", "create_issue", "op-1", 1_100)
                .unwrap(),
            binding()
        );
        for (tenant, subject, tool, op, now) in [
            ("acme", "bob", "create_issue", "op-1", 1_100),
            ("other", "alice", "create_issue", "op-1", 1_100),
            ("acme", "alice", "create_draft", "op-1", 1_100),
            ("acme", "alice", "create_issue", "op-2", 1_100),
            ("acme", "alice", "create_issue", "op-1", 1_600),
        ] {
            let e = s.open(&t, tenant, subject, tool, op, now).unwrap_err();
            assert_eq!(e.code, ErrorCode::RequestStateInvalid);
        }
        let mut tampered = t.clone().into_bytes();
        let i = tampered.len() / 2;
        tampered[i] = if tampered[i] == b'A' { b'B' } else { b'A' };
        let tampered = String::from_utf8(tampered).unwrap();
        assert_eq!(
            s.open(&tampered, "acme", "alice", "create_issue", "op-1", 1_100)
                .unwrap_err()
                .code,
            ErrorCode::RequestStateInvalid
        );
    }

    #[test]
    fn rotated_keyring_still_opens_tokens_of_the_previous_key() {
        let old = StateSealer::new(&[vec![1u8; 32]], 600).unwrap();
        let t = old.seal(&binding()).unwrap();
        let rotated = StateSealer::new(&[vec![2u8; 32], vec![1u8; 32]], 600).unwrap();
        assert!(rotated
            .open(&t, "acme", "alice", "create_issue", "op-1", 1_100)
            .is_ok());
        let retired = StateSealer::new(&[vec![2u8; 32]], 600).unwrap();
        assert!(retired
            .open(&t, "acme", "alice", "create_issue", "op-1", 1_100)
            .is_err());
    }
}
