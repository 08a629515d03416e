//! The vocabulary of the ledger: principals, scopes, tool contracts, operation states and the
//! stable error codes every caller sees.

use std::collections::BTreeSet;
use std::fmt;

use serde::{Deserialize, Serialize};

/// A stable, machine-readable error code. The string form (`as_str`) is part of the public
/// contract: MCP tool errors, CLI output and tests all compare against it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ErrorCode {
    /// The request is malformed: wrong type, out of range, unknown field.
    InvalidArguments,
    /// The current principal lacks the role or scope the action needs.
    PermissionDenied,
    /// The resource does not exist or the caller may not see it (same shape for both).
    NotFound,
    /// The same idempotency scope was used for a different intent.
    OperationConflict,
    /// The operation exists but has not finished; observe it with a status query.
    OperationInProgress,
    /// The operation's authority deadline has passed: no write, not even an exact replay.
    OperationAuthorityExpired,
    /// The operation's retention deadline has passed: it can no longer be replayed.
    OperationRetentionExpired,
    /// A continuation token is malformed, tampered, expired or bound to someone else.
    RequestStateInvalid,
    /// Input responses arrived without the continuation state they answer.
    ContinuationUnsupported,
    /// An optimistic version check failed; reload before forming a new intent.
    VersionConflict,
    /// The action needs a human approval that was not supplied.
    ApprovalRequired,
    /// The supplied approval is unknown, expired, used or bound to another intent.
    ApprovalInvalid,
    /// The effect may have happened without a receipt; reconcile with a status query.
    OutcomeUnknown,
    /// The business state the intent was accepted against no longer holds.
    BusinessStateChanged,
    /// The tool contract revisions changed since the intent was accepted.
    ContractDrift,
    /// The store is unreachable or busy; the call may be retried.
    Unavailable,
    /// A call under a new key whose intent equals an earlier, unsettled operation of the same
    /// caller and tool (whose reply may have been lost): nothing was recorded; ask about the
    /// earlier one, or say it is a new intent.
    PossibleDuplicate,
}

impl ErrorCode {
    /// Every code, in declaration order.
    pub const ALL: [ErrorCode; 17] = [
        ErrorCode::InvalidArguments,
        ErrorCode::PermissionDenied,
        ErrorCode::NotFound,
        ErrorCode::OperationConflict,
        ErrorCode::OperationInProgress,
        ErrorCode::OperationAuthorityExpired,
        ErrorCode::OperationRetentionExpired,
        ErrorCode::RequestStateInvalid,
        ErrorCode::ContinuationUnsupported,
        ErrorCode::VersionConflict,
        ErrorCode::ApprovalRequired,
        ErrorCode::ApprovalInvalid,
        ErrorCode::OutcomeUnknown,
        ErrorCode::BusinessStateChanged,
        ErrorCode::ContractDrift,
        ErrorCode::Unavailable,
        ErrorCode::PossibleDuplicate,
    ];

    /// The stable snake_case name of the code.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorCode::InvalidArguments => "invalid_arguments",
            ErrorCode::PermissionDenied => "permission_denied",
            ErrorCode::NotFound => "not_found",
            ErrorCode::OperationConflict => "operation_conflict",
            ErrorCode::OperationInProgress => "operation_in_progress",
            ErrorCode::OperationAuthorityExpired => "operation_authority_expired",
            ErrorCode::OperationRetentionExpired => "operation_retention_expired",
            ErrorCode::RequestStateInvalid => "request_state_invalid",
            ErrorCode::ContinuationUnsupported => "continuation_unsupported",
            ErrorCode::VersionConflict => "version_conflict",
            ErrorCode::ApprovalRequired => "approval_required",
            ErrorCode::ApprovalInvalid => "approval_invalid",
            ErrorCode::OutcomeUnknown => "outcome_unknown",
            ErrorCode::BusinessStateChanged => "business_state_changed",
            ErrorCode::ContractDrift => "contract_drift",
            ErrorCode::Unavailable => "unavailable",
            ErrorCode::PossibleDuplicate => "possible_duplicate",
        }
    }
}

impl fmt::Display for ErrorCode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// An error a caller may see: a stable code plus a message that never contains paths, SQL or
/// secrets.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{code}: {message}")]
pub struct Error {
    /// The stable code.
    pub code: ErrorCode,
    /// A human-readable, redacted explanation.
    pub message: String,
    /// The earlier operation a [`ErrorCode::PossibleDuplicate`] refusal names (`None` for
    /// every other error).
    pub earlier: Option<Box<EarlierOperation>>,
}

/// The earlier, unsettled operation a `possible_duplicate` refusal names, so the caller can
/// ask about it (`get_operation_status` with its operation id) instead of acting again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EarlierOperation {
    /// Its operation id (the caller's idempotency key).
    pub operation_id: String,
    /// Its status reference.
    pub status_ref: String,
    /// Its state (`outcome_unknown`, `processing`, `accepted`, `in_progress`).
    pub state: String,
}

impl Error {
    /// Builds an error from a code and a safe message.
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        Error {
            code,
            message: message.into(),
            earlier: None,
        }
    }

    /// The `possible_duplicate` refusal of a call whose intent equals the unsettled
    /// operation `earlier`'s.
    pub fn possible_duplicate(earlier: EarlierOperation) -> Self {
        Error {
            code: ErrorCode::PossibleDuplicate,
            message: format!(
                "an earlier call of this tool with the same arguments (operation id {}) is {} \
                 and may have acted; nothing was done. Ask get_operation_status about it, retry \
                 under its operation id, or send _meta \"io.toolledger/new_intent\": true if \
                 this is another intent",
                earlier.operation_id, earlier.state
            ),
            earlier: Some(Box::new(earlier)),
        }
    }

    /// Shorthand for [`ErrorCode::InvalidArguments`].
    pub fn invalid(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::InvalidArguments, message)
    }

    /// Shorthand for [`ErrorCode::PermissionDenied`].
    pub fn denied(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::PermissionDenied, message)
    }

    /// The generic `not_found` used both for absent resources and for resources the caller may
    /// not see, so the two are indistinguishable.
    pub fn not_found() -> Self {
        Error::new(ErrorCode::NotFound, "resource not found")
    }

    /// Shorthand for [`ErrorCode::OperationConflict`].
    pub fn conflict(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::OperationConflict, message)
    }

    /// Shorthand for [`ErrorCode::Unavailable`].
    pub fn unavailable(message: impl Into<String>) -> Self {
        Error::new(ErrorCode::Unavailable, message)
    }
}

/// The trusted caller as the principal store says it is *now*.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Principal {
    /// Tenant (workspace) the principal belongs to.
    pub tenant: String,
    /// Stable subject name within the tenant.
    pub subject: String,
    /// Current roles, e.g. `editor`, `support_admin`.
    pub roles: BTreeSet<String>,
    /// Current scopes, e.g. `automation:write`.
    pub scopes: BTreeSet<String>,
}

impl Principal {
    /// Whether the principal currently holds `role`.
    pub fn has_role(&self, role: &str) -> bool {
        self.roles.contains(role)
    }

    /// Whether the principal currently holds `scope`.
    pub fn has_scope(&self, scope: &str) -> bool {
        self.scopes.contains(scope)
    }
}

/// The idempotency scope `(tenant, subject, tool, key)`: unique in the ledger.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Scope {
    /// Tenant of the calling principal.
    pub tenant: String,
    /// Subject of the calling principal.
    pub subject: String,
    /// Tool name.
    pub tool: String,
    /// Caller-chosen idempotency key (MCP operation id).
    pub key: String,
}

/// A tool's contract: its name and the six revisions an intent is bound to.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct ToolContract {
    /// Tool name.
    pub name: String,
    /// Revision of the input schema.
    pub input_rev: String,
    /// Revision of the output schema.
    pub output_rev: String,
    /// Revision of the effect semantics.
    pub effect_rev: String,
    /// Revision of the handler code.
    pub handler_rev: String,
    /// Revision of the result producer.
    pub producer_rev: String,
    /// Revision of the authorization/approval policy.
    pub policy_rev: String,
}

impl ToolContract {
    /// A contract whose six revisions all equal `rev`.
    pub fn uniform(name: impl Into<String>, rev: impl Into<String>) -> Self {
        let rev = rev.into();
        ToolContract {
            name: name.into(),
            input_rev: rev.clone(),
            output_rev: rev.clone(),
            effect_rev: rev.clone(),
            handler_rev: rev.clone(),
            producer_rev: rev.clone(),
            policy_rev: rev,
        }
    }
}

/// The state of one operation row (docs/contract.md has the transitions).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OperationState {
    /// Inline effect: reserved, effect not yet committed (only visible if a multi-step effect
    /// committed its reservation separately).
    InProgress,
    /// Inline effect committed together with the ledger row.
    Applied,
    /// First step committed, a later step failed; an operator decides.
    Partial,
    /// Deferred effect: intent and outbox event committed, not yet claimed.
    Accepted,
    /// Deferred effect: claimed by a worker under a lease.
    Processing,
    /// Deferred effect: downstream receipt reconciled locally.
    Succeeded,
    /// The effect may have happened without a local receipt.
    OutcomeUnknown,
    /// Terminal business refusal, replayable.
    Failed,
    /// Attempts exhausted; an operator decides.
    Dead,
}

impl OperationState {
    /// Every state, in declaration order.
    pub const ALL: [OperationState; 9] = [
        OperationState::InProgress,
        OperationState::Applied,
        OperationState::Partial,
        OperationState::Accepted,
        OperationState::Processing,
        OperationState::Succeeded,
        OperationState::OutcomeUnknown,
        OperationState::Failed,
        OperationState::Dead,
    ];

    /// The stable snake_case name stored in the database.
    pub fn as_str(self) -> &'static str {
        match self {
            OperationState::InProgress => "in_progress",
            OperationState::Applied => "applied",
            OperationState::Partial => "partial",
            OperationState::Accepted => "accepted",
            OperationState::Processing => "processing",
            OperationState::Succeeded => "succeeded",
            OperationState::OutcomeUnknown => "outcome_unknown",
            OperationState::Failed => "failed",
            OperationState::Dead => "dead",
        }
    }

    /// Parses the stored name.
    pub fn parse(s: &str) -> Option<Self> {
        OperationState::ALL.into_iter().find(|st| st.as_str() == s)
    }

    /// Whether the state is final: a replay may return the stored result.
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            OperationState::Applied
                | OperationState::Partial
                | OperationState::Succeeded
                | OperationState::Failed
        )
    }

    /// Whether the state is settled for good, with nothing left for an operator: `applied`,
    /// `succeeded`, `failed`. Only a settled operation is compacted after its retention
    /// deadline (`partial` waits for an operator, like every unfinished state).
    pub fn is_settled(self) -> bool {
        matches!(
            self,
            OperationState::Applied | OperationState::Succeeded | OperationState::Failed
        )
    }
}

impl fmt::Display for OperationState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_codes_round_trip_through_serde_and_as_str() {
        for code in ErrorCode::ALL {
            let json = serde_json::to_string(&code).unwrap();
            assert_eq!(json, format!("\"{}\"", code.as_str()));
            let back: ErrorCode = serde_json::from_str(&json).unwrap();
            assert_eq!(back, code);
        }
    }

    #[test]
    fn states_parse_their_own_names_only() {
        for st in OperationState::ALL {
            assert_eq!(OperationState::parse(st.as_str()), Some(st));
        }
        assert_eq!(OperationState::parse("APPLIED"), None);
        assert_eq!(OperationState::parse(""), None);
    }
}
