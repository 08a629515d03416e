//! Approvals: a human's consent bound to one exact intent, valid on a half-open interval and
//! consumed at most once by the transaction that accepts the intent.
//!
//! An approval is issued for an [`ApprovalTarget`]: the requester's scope `(tenant, subject,
//! tool, idempotency_key)` plus a tool-defined `binding` object (for `refund_order` the request
//! digest, the six contract revisions and the provider call context; for `create_draft` the
//! payload digest and the operation). Its `binding_digest` is SHA-256 over the canonical
//! envelope `{binding, idempotency_key, subject, tenant, tool}`, so changing any bound item —
//! another key, another subject, another provider path, another digest — makes the approval
//! refuse with `approval_invalid`.
//!
//! Rules:
//! - the approver must be an active principal of the same tenant holding the role
//!   [`APPROVER_ROLE`] *now*, and must not be the requester;
//! - `approved_at < expires_at`; the approval is valid at `now` when
//!   `approved_at <= now < expires_at`;
//! - it is consumed once: [`consume`] marks it with the accepting operation in the same
//!   transaction that writes the operation, so a rollback leaves it unused;
//! - no approval → `approval_required`; unknown, expired, substituted, consumed or no longer
//!   eligible → `approval_invalid`.
//!
//! Every function takes the caller's open transaction as an [`EffectTx`], so it works inside an
//! inline effect (`create_draft`) as well as inside the deferred runtime's transaction A.

use serde::Serialize;
use serde_json::{json, Value};

use crate::effect::{EffectTx, SqlValue};
use crate::json;
use crate::model::{Error, ErrorCode, Principal};

/// The role an approver must currently hold.
pub const APPROVER_ROLE: &str = "approver";

/// The longest validity window an approval may have, in seconds (30 days).
pub const MAX_APPROVAL_TTL: i64 = 30 * 24 * 3600;

/// The largest timestamp accepted anywhere in the runtime: 9999-12-31T23:59:59Z. Larger values
/// are not portable across databases and languages and are refused before any write.
pub const MAX_PORTABLE_TIMESTAMP: i64 = 253_402_300_799;

/// The exact intent an approval is for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct ApprovalTarget {
    /// Tenant of the requester.
    pub tenant: String,
    /// Subject of the requester (the approver must be someone else).
    pub subject: String,
    /// Tool the intent calls.
    pub tool: String,
    /// Idempotency key (operation id) of the intent.
    pub idempotency_key: String,
    /// Tool-defined canonical object binding the intent (digests, revisions, provider context).
    pub binding: Value,
}

impl ApprovalTarget {
    /// The canonical envelope the digest covers.
    pub fn envelope(&self) -> Value {
        json!({
            "binding": self.binding,
            "idempotency_key": self.idempotency_key,
            "subject": self.subject,
            "tenant": self.tenant,
            "tool": self.tool,
        })
    }

    /// SHA-256 (lowercase hex) of the canonical envelope.
    pub fn digest(&self) -> Result<String, Error> {
        if !self.binding.is_object() {
            return Err(Error::invalid("approval binding must be a JSON object"));
        }
        let text = json::canonical_string(&self.envelope())
            .map_err(|e| Error::invalid(format!("approval binding: {}", e.message)))?;
        Ok(crate::digest::sha256_hex(text.as_bytes()))
    }
}

impl ApprovalTarget {
    /// The target of a guarded tool's intent: the requester's scope for `operation_id` of
    /// `tool`, bound to the digest of the canonical `intent` (what the tool records as the
    /// operation's business intent). What an approving human computes from the same four
    /// values (`toolledger approve --tool TOOL --requester NAME --key ID --arguments INTENT`)
    /// and what the tool's effect consumes.
    pub fn for_intent(
        requester: &Principal,
        tool: &str,
        operation_id: &str,
        intent: &Value,
    ) -> Result<ApprovalTarget, Error> {
        let text = json::canonical_string(intent)
            .map_err(|e| Error::invalid(format!("the intent: {}", e.message)))?;
        Ok(ApprovalTarget {
            tenant: requester.tenant.clone(),
            subject: requester.subject.clone(),
            tool: tool.to_string(),
            idempotency_key: operation_id.to_string(),
            binding: json!({"intent_digest": crate::digest::sha256_hex(text.as_bytes())}),
        })
    }
}

/// One stored approval.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Approval {
    /// Opaque id the requester presents.
    pub approval_id: String,
    /// What it approves.
    pub target: ApprovalTarget,
    /// Principal name of the approver.
    pub approver: String,
    /// Digest of the target's envelope at issue time.
    pub binding_digest: String,
    /// When it was granted (Unix seconds).
    pub approved_at: i64,
    /// First second at which it is no longer valid.
    pub expires_at: i64,
    /// When it was consumed, if it was.
    pub consumed_at: Option<i64>,
    /// The operation that consumed it, if recorded.
    pub consumed_operation: Option<i64>,
}

impl Approval {
    /// Whether `now` lies in `[approved_at, expires_at)`.
    pub fn is_valid_at(&self, now: i64) -> bool {
        self.approved_at <= now && now < self.expires_at
    }
}

fn invalid_approval(message: &str) -> Error {
    Error::new(ErrorCode::ApprovalInvalid, message)
}

/// Checks the shape of an approval id: 8–128 characters from `[A-Za-z0-9_.:-]`.
pub fn check_approval_id(id: &str) -> Result<(), Error> {
    let ok = (8..=128).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::invalid(
            "approval id must be 8 to 128 characters from [A-Za-z0-9_.:-]",
        ))
    }
}

/// A fresh random approval id (`apr_` + 32 hex digits).
pub fn new_approval_id() -> Result<String, Error> {
    let mut bytes = [0u8; 16];
    getrandom::fill(&mut bytes)
        .map_err(|_| Error::unavailable("no randomness available for an approval id"))?;
    Ok(format!("apr_{}", hex::encode(bytes)))
}

/// Whether `approver` may approve `target` now: active principal (the caller resolved it from
/// the principal store), same tenant, role [`APPROVER_ROLE`], not the requester.
pub fn check_approver(approver: &Principal, target: &ApprovalTarget) -> Result<(), Error> {
    if approver.tenant != target.tenant || !approver.has_role(APPROVER_ROLE) {
        return Err(Error::denied(
            "the approver is not eligible for this intent",
        ));
    }
    if approver.subject == target.subject {
        return Err(Error::denied("an approver cannot approve their own intent"));
    }
    Ok(())
}

/// Checks an approval window before it is stored: `0 <= approved_at < expires_at`, at most
/// [`MAX_APPROVAL_TTL`] long, within [`MAX_PORTABLE_TIMESTAMP`].
pub fn check_window(approved_at: i64, expires_at: i64) -> Result<(), Error> {
    if approved_at < 0 || expires_at > MAX_PORTABLE_TIMESTAMP {
        return Err(Error::invalid(
            "approval timestamps are outside the portable range",
        ));
    }
    if approved_at >= expires_at {
        return Err(Error::invalid(
            "an approval must expire after it is granted",
        ));
    }
    if expires_at - approved_at > MAX_APPROVAL_TTL {
        return Err(Error::invalid(
            "an approval may be valid for at most 30 days",
        ));
    }
    Ok(())
}

/// Stores a new approval for `target` granted by `approver` (already resolved as the current
/// principal). Issuing the same id again for the same target and approver returns the stored
/// approval unchanged; the same id for anything else is `invalid_arguments`.
pub fn issue(
    tx: &mut dyn EffectTx,
    approval_id: &str,
    target: &ApprovalTarget,
    approver_name: &str,
    approver: &Principal,
    approved_at: i64,
    expires_at: i64,
) -> Result<Approval, Error> {
    check_approval_id(approval_id)?;
    check_window(approved_at, expires_at)?;
    check_approver(approver, target)?;
    let digest = target.digest()?;
    let binding_text = json::canonical_string(&target.binding)
        .map_err(|e| Error::invalid(format!("approval binding: {}", e.message)))?;
    if let Some(existing) = load(tx, approval_id)? {
        if existing.binding_digest == digest
            && existing.approver == approver_name
            && existing.approved_at == approved_at
            && existing.expires_at == expires_at
        {
            return Ok(existing);
        }
        return Err(Error::invalid("approval id is already in use"));
    }
    tx.execute(
        "INSERT INTO approvals (approval_id, tenant, subject, tool, idempotency_key, approver,
             binding, binding_digest, approved_at, expires_at)
         VALUES (?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8, ?9, ?10)",
        &[
            approval_id.into(),
            target.tenant.as_str().into(),
            target.subject.as_str().into(),
            target.tool.as_str().into(),
            target.idempotency_key.as_str().into(),
            approver_name.into(),
            binding_text.into(),
            digest.as_str().into(),
            approved_at.into(),
            expires_at.into(),
        ],
    )?;
    Ok(Approval {
        approval_id: approval_id.to_string(),
        target: target.clone(),
        approver: approver_name.to_string(),
        binding_digest: digest,
        approved_at,
        expires_at,
        consumed_at: None,
        consumed_operation: None,
    })
}

fn text(v: &SqlValue) -> Result<String, Error> {
    v.as_str()
        .map(str::to_string)
        .ok_or_else(|| Error::unavailable("stored approval is malformed"))
}

fn int(v: &SqlValue) -> Result<i64, Error> {
    v.as_i64()
        .ok_or_else(|| Error::unavailable("stored approval is malformed"))
}

fn opt_int(v: &SqlValue) -> Result<Option<i64>, Error> {
    if v.is_null() {
        Ok(None)
    } else {
        int(v).map(Some)
    }
}

/// Loads an approval by id. The stored binding must be canonical JSON whose digest matches
/// the stored digest; anything else is a storage-contract failure (`unavailable`) and the
/// approval is never used.
pub fn load(tx: &mut dyn EffectTx, approval_id: &str) -> Result<Option<Approval>, Error> {
    let rows = tx.query(
        "SELECT approval_id, tenant, subject, tool, idempotency_key, approver, binding,
                binding_digest, approved_at, expires_at, consumed_at, consumed_operation
         FROM approvals WHERE approval_id = ?1",
        &[approval_id.into()],
    )?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(None);
    };
    let binding_text = text(&row[6])?;
    let binding = json::parse_canonical(binding_text.as_bytes())
        .map_err(|_| Error::unavailable("stored approval binding is not canonical"))?;
    let approval = Approval {
        approval_id: text(&row[0])?,
        target: ApprovalTarget {
            tenant: text(&row[1])?,
            subject: text(&row[2])?,
            tool: text(&row[3])?,
            idempotency_key: text(&row[4])?,
            binding,
        },
        approver: text(&row[5])?,
        binding_digest: text(&row[7])?,
        approved_at: int(&row[8])?,
        expires_at: int(&row[9])?,
        consumed_at: opt_int(&row[10])?,
        consumed_operation: opt_int(&row[11])?,
    };
    if approval.target.digest()? != approval.binding_digest {
        return Err(Error::unavailable(
            "stored approval does not match its binding digest",
        ));
    }
    Ok(Some(approval))
}

/// Checks, without writing, that `approval_id` names an unconsumed approval for exactly
/// `expected` that is valid at `now`. Returns the stored approval.
pub fn verify(
    tx: &mut dyn EffectTx,
    approval_id: Option<&str>,
    expected: &ApprovalTarget,
    now: i64,
) -> Result<Approval, Error> {
    let Some(id) = approval_id else {
        return Err(Error::new(
            ErrorCode::ApprovalRequired,
            "this action needs an approval",
        ));
    };
    if check_approval_id(id).is_err() {
        return Err(invalid_approval("approval is not valid for this intent"));
    }
    let Some(approval) = load(tx, id)? else {
        return Err(invalid_approval("approval is not valid for this intent"));
    };
    let expected_digest = expected.digest()?;
    // The digest covers the scope and the canonical binding; comparing canonical digests
    // rather than parsed values keeps number representations out of the question.
    if approval.binding_digest != expected_digest
        || approval.target.tenant != expected.tenant
        || approval.target.subject != expected.subject
        || approval.target.tool != expected.tool
        || approval.target.idempotency_key != expected.idempotency_key
    {
        return Err(invalid_approval("approval is bound to another intent"));
    }
    if approval.consumed_at.is_some() {
        return Err(invalid_approval("approval was already used"));
    }
    if !approval.is_valid_at(now) {
        return Err(invalid_approval("approval is not valid at this time"));
    }
    Ok(approval)
}

/// Marks a verified approval consumed by `operation_id` at `now`. Refuses with
/// `approval_invalid` when someone consumed it in between.
pub fn mark_consumed(
    tx: &mut dyn EffectTx,
    approval: &Approval,
    now: i64,
    operation_id: Option<i64>,
) -> Result<(), Error> {
    let n = tx.execute(
        "UPDATE approvals SET consumed_at = ?1, consumed_operation = ?2
         WHERE approval_id = ?3 AND consumed_at IS NULL AND binding_digest = ?4",
        &[
            now.into(),
            operation_id.into(),
            approval.approval_id.as_str().into(),
            approval.binding_digest.as_str().into(),
        ],
    )?;
    if n != 1 {
        return Err(invalid_approval("approval was already used"));
    }
    Ok(())
}

/// The current-principal resolver [`consume`] re-reads the approver with (`None`: unknown or
/// inactive). [`crate::authz::resolve_in`] fits.
pub type ApproverResolver<'a> =
    dyn FnMut(&mut dyn EffectTx, &str) -> Result<Option<Principal>, Error> + 'a;

/// Verifies and consumes an approval in the caller's transaction: [`verify`], then the
/// approver is re-resolved through `resolve_approver` (the current-principal resolver; `None`
/// means unknown or revoked) and must still be eligible, then [`mark_consumed`].
pub fn consume(
    tx: &mut dyn EffectTx,
    approval_id: Option<&str>,
    expected: &ApprovalTarget,
    now: i64,
    operation_id: Option<i64>,
    resolve_approver: &mut ApproverResolver<'_>,
) -> Result<Approval, Error> {
    let approval = verify(tx, approval_id, expected, now)?;
    let current = resolve_approver(tx, &approval.approver)?;
    match current {
        Some(p) if check_approver(&p, expected).is_ok() => {}
        _ => return Err(invalid_approval("the approver is no longer eligible")),
    }
    mark_consumed(tx, &approval, now, operation_id)?;
    Ok(approval)
}

/// Issues an approval in its own write transaction: the approver is resolved through the
/// principal store inside that transaction and must be eligible now (see [`issue`]). This is
/// what `toolledger approve` runs.
pub async fn grant<S: Clone + Into<crate::store::Store>>(
    store: &S,
    approval_id: &str,
    target: &ApprovalTarget,
    approver_name: &str,
    approved_at: i64,
    expires_at: i64,
) -> Result<Approval, Error> {
    let approval_id = approval_id.to_string();
    let target = target.clone();
    let approver_name = approver_name.to_string();
    let store: crate::store::Store = store.clone().into();
    store
        .write(move |tx: &mut dyn EffectTx| {
            let Some(approver) = crate::authz::resolve_in(tx, &approver_name)? else {
                return Err(Error::denied(
                    "the approver is not eligible for this intent",
                ));
            };
            issue(
                tx,
                &approval_id,
                &target,
                &approver_name,
                &approver,
                approved_at,
                expires_at,
            )
        })
        .await
}

/// Reads one approval (operators and tests).
pub async fn fetch<S: Clone + Into<crate::store::Store>>(
    store: &S,
    approval_id: &str,
) -> Result<Option<Approval>, Error> {
    let approval_id = approval_id.to_string();
    let store: crate::store::Store = store.clone().into();
    store
        .read(move |tx: &mut dyn EffectTx| load(tx, &approval_id))
        .await
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeSet;

    fn target() -> ApprovalTarget {
        ApprovalTarget {
            tenant: "acme".into(),
            subject: "alice".into(),
            tool: "create_draft".into(),
            idempotency_key: "op-1".into(),
            binding: json!({"payload_digest": "ab", "operation": "op-1"}),
        }
    }

    fn principal(name: &str, tenant: &str, roles: &[&str]) -> Principal {
        Principal {
            tenant: tenant.into(),
            subject: name.into(),
            roles: roles.iter().map(|r| r.to_string()).collect(),
            scopes: BTreeSet::new(),
        }
    }

    #[test]
    fn every_bound_item_changes_the_digest() {
        let base = target().digest().unwrap();
        let mut changed = Vec::new();
        for i in 0..5 {
            let mut t = target();
            match i {
                0 => t.tenant = "other".into(),
                1 => t.subject = "bob".into(),
                2 => t.tool = "refund_order".into(),
                3 => t.idempotency_key = "op-2".into(),
                _ => t.binding["payload_digest"] = json!("cd"),
            }
            changed.push(t.digest().unwrap());
        }
        assert!(changed.iter().all(|d| *d != base));
        let mut not_object = target();
        not_object.binding = json!("x");
        assert_eq!(
            not_object.digest().unwrap_err().code,
            ErrorCode::InvalidArguments
        );
    }

    #[test]
    fn windows_are_half_open_bounded_and_portable() {
        assert!(check_window(10, 11).is_ok());
        assert!(check_window(10, 10).is_err());
        assert!(check_window(10, 9).is_err());
        assert!(check_window(-1, 10).is_err());
        assert!(check_window(0, MAX_APPROVAL_TTL + 1).is_err());
        assert!(check_window(MAX_PORTABLE_TIMESTAMP - 5, MAX_PORTABLE_TIMESTAMP + 1).is_err());
        let a = Approval {
            approval_id: "approval-1".into(),
            target: target(),
            approver: "bob".into(),
            binding_digest: String::new(),
            approved_at: 10,
            expires_at: 20,
            consumed_at: None,
            consumed_operation: None,
        };
        assert!(!a.is_valid_at(9));
        assert!(a.is_valid_at(10));
        assert!(a.is_valid_at(19));
        assert!(!a.is_valid_at(20));
    }

    #[test]
    fn approvers_need_the_role_the_tenant_and_another_identity() {
        let t = target();
        assert!(check_approver(&principal("bob", "acme", &[APPROVER_ROLE]), &t).is_ok());
        assert!(check_approver(&principal("bob", "acme", &["editor"]), &t).is_err());
        assert!(check_approver(&principal("bob", "globex", &[APPROVER_ROLE]), &t).is_err());
        assert!(check_approver(&principal("alice", "acme", &[APPROVER_ROLE]), &t).is_err());
    }

    #[test]
    fn approval_ids_have_a_fixed_shape() {
        assert!(check_approval_id("approval-1").is_ok());
        assert!(check_approval_id(&new_approval_id().unwrap()).is_ok());
        for bad in ["short", "has space 123", "semi;colon1", &"x".repeat(129)] {
            assert!(check_approval_id(bad).is_err(), "{bad}");
        }
    }
}
