//! `toolledger principal add|revoke|list|token`: the principal store from the command line.
//!
//! Output is one JSON object on stdout. Bad input or an unusable database exits 2 with a
//! stable, path-free `{"error":{"code":…,"message":…}}` on stderr, and writes nothing.
//!
//! `principal add` never changes an existing principal unasked: other roles, scopes or tenant
//! need `--replace`, and its tokens are only ever issued and revoked by `principal token
//! add|revoke` (a token is printed once, and only its hash is stored).

use serde_json::json;
use toolledger::authz::{Ensured, IfExists, PrincipalStore, PutOutcome, TokenIssue, TokenRevoke};
use toolledger::Error;

use crate::common::{self, Access, StoreArgs, StoreConfig};
use crate::exit::{Failure, Outcome};

/// The `principal` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum PrincipalCmd {
    /// Add a principal. An existing one is left as it is unless the command names exactly its
    /// tenant, roles and scopes (an inactive one is then re-activated) or `--replace` is given;
    /// its tokens are never touched.
    Add {
        /// Principal name (the subject).
        name: String,
        /// Tenant (workspace) of the principal.
        #[arg(long)]
        tenant: String,
        /// A role to grant (repeatable).
        #[arg(long = "role")]
        roles: Vec<String>,
        /// A scope to grant (repeatable).
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// Issue the new principal's first bearer token; it is printed once and only its hash
        /// is stored (for an existing principal use `principal token add`).
        #[arg(long)]
        token: bool,
        /// Replace an existing principal's tenant, roles and scopes with exactly these, and
        /// re-activate it.
        #[arg(long, conflicts_with = "token")]
        replace: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Remove roles or scopes from a principal, or deactivate it and delete its tokens.
    Revoke {
        /// Principal name.
        name: String,
        /// A role to remove (repeatable).
        #[arg(long = "role")]
        roles: Vec<String>,
        /// A scope to remove (repeatable).
        #[arg(long = "scope")]
        scopes: Vec<String>,
        /// Deactivate the principal and delete its tokens.
        #[arg(long)]
        all: bool,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List every principal (never tokens).
    List {
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Issue, list and revoke a principal's bearer tokens.
    Token {
        #[command(subcommand)]
        cmd: TokenCmd,
    },
}

/// The `principal token` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum TokenCmd {
    /// Issue another bearer token for an active principal; it is printed once and only its
    /// hash is stored.
    Add {
        /// Principal name.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// List a principal's tokens: their ids and issue times, never the tokens or their hashes.
    List {
        /// Principal name.
        name: String,
        #[command(flatten)]
        store: StoreArgs,
    },
    /// Revoke one token of a principal by its id (from `principal token list`); it stops
    /// authenticating at once.
    Revoke {
        /// Principal name.
        name: String,
        /// The token's id (`tok_…`).
        token_id: String,
        #[command(flatten)]
        store: StoreArgs,
    },
}

impl PrincipalCmd {
    /// The ledger flags of the subcommand.
    pub fn store(&self) -> &StoreArgs {
        match self {
            PrincipalCmd::Add { store, .. }
            | PrincipalCmd::Revoke { store, .. }
            | PrincipalCmd::List { store } => store,
            PrincipalCmd::Token { cmd } => match cmd {
                TokenCmd::Add { store, .. }
                | TokenCmd::List { store, .. }
                | TokenCmd::Revoke { store, .. } => store,
            },
        }
    }

    /// What the subcommand needs of the ledger: only `add` may create one; the others act on
    /// principals that must already exist, so a missing SQLite file is `DATABASE_NOT_FOUND`
    /// and nothing is created.
    pub fn access(&self) -> Access {
        match self {
            PrincipalCmd::Add { .. } => Access::OpenOrCreate,
            PrincipalCmd::List { .. } => Access::ReadOnly,
            PrincipalCmd::Revoke { .. } | PrincipalCmd::Token { .. } => Access::Existing,
        }
    }
}

/// The principal a stdio `toolledger proxy` acts for when no `--principal` is given: stdio is
/// trusted configuration (whoever launches the process owns the ledger file), so it needs no
/// setup. Created on first use with no roles or scopes.
pub(crate) const LOCAL_PRINCIPAL: &str = "local";

/// The tenant [`LOCAL_PRINCIPAL`] is created in.
pub(crate) const LOCAL_TENANT: &str = "local";

/// The local principal for a stdio session of `command`: created as `principal add local
/// --tenant local` would create it when the ledger has none, used as it is when it is active
/// (whatever grants it was given since), and refused (`PRINCIPAL_INACTIVE`) when it was
/// deactivated: re-activating it is the operator's decision, not a launch's.
pub(crate) async fn local_principal(ps: &PrincipalStore, command: &str) -> Result<String, Failure> {
    let inactive = || {
        Failure::explained(
            "PRINCIPAL_INACTIVE",
            format!(
                "`{command}` on stdio without --principal acts for the principal \
                 {LOCAL_PRINCIPAL:?}, which is deactivated in this ledger; re-activate it with \
                 `toolledger principal add {LOCAL_PRINCIPAL} --tenant {LOCAL_TENANT} --replace`, \
                 or pass --principal NAME"
            ),
        )
    };
    match ps
        .ensure(LOCAL_PRINCIPAL, LOCAL_TENANT)
        .await
        .map_err(refused)?
    {
        Ensured::Active => Ok(LOCAL_PRINCIPAL.to_string()),
        Ensured::Created => {
            tracing::info!(
                principal = LOCAL_PRINCIPAL,
                tenant = LOCAL_TENANT,
                "created the local principal the stdio session acts for"
            );
            Ok(LOCAL_PRINCIPAL.to_string())
        }
        Ensured::Inactive => Err(inactive()),
    }
}

/// A refusal of the principal store, as its upper-case code with its message (exit 2).
fn refused(e: Error) -> Failure {
    Failure::Explained {
        code: match e.code.as_str() {
            "invalid_arguments" => "INVALID_ARGUMENTS",
            "not_found" => "NOT_FOUND",
            "permission_denied" => "PERMISSION_DENIED",
            "unavailable" => "UNAVAILABLE",
            _ => "PRINCIPAL_STORE_ERROR",
        },
        message: e.message,
    }
}

fn no_principal(name: &str) -> Failure {
    Failure::explained(
        "NOT_FOUND",
        format!("there is no principal {name:?}; add it with `toolledger principal add`"),
    )
}

/// Runs one `principal` subcommand on the ledger `store` resolves to.
pub fn run(cmd: PrincipalCmd, store: &StoreConfig) -> Result<Outcome, Failure> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|_| Failure::code("RUNTIME_ERROR"))?;
    rt.block_on(async move {
        let ps = PrincipalStore::new(store.open()?);
        let out = match cmd {
            PrincipalCmd::Add {
                name,
                tenant,
                roles,
                scopes,
                token,
                replace,
                ..
            } => {
                let if_exists = if replace {
                    IfExists::Replace
                } else {
                    IfExists::Keep
                };
                let outcome = ps
                    .put(&name, &tenant, &roles, &scopes, if_exists, token)
                    .await
                    .map_err(refused)?;
                let (action, issued) = match outcome {
                    PutOutcome::Created(issued) => ("created", issued),
                    PutOutcome::Unchanged => ("unchanged", None),
                    PutOutcome::Reactivated => ("reactivated", None),
                    PutOutcome::Replaced => ("replaced", None),
                    PutOutcome::Exists(_) if token => {
                        return Err(Failure::explained(
                            "PRINCIPAL_EXISTS",
                            format!(
                                "principal {name:?} exists; `principal add --token` only issues \
                                 a new principal's first token: use `toolledger principal token \
                                 add {name}`"
                            ),
                        ))
                    }
                    PutOutcome::Exists(_) => {
                        return Err(Failure::explained(
                            "PRINCIPAL_EXISTS",
                            format!(
                                "principal {name:?} exists with another tenant, roles or scopes; \
                                 nothing was changed: pass --replace to replace them with \
                                 exactly these, or grant nothing new and use `toolledger \
                                 principal revoke` to remove grants"
                            ),
                        ))
                    }
                };
                let entry = ps
                    .entry(&name)
                    .await
                    .map_err(refused)?
                    .ok_or_else(|| no_principal(&name))?;
                let mut out = json!({ "action": action, "principal": entry });
                if let Some(t) = issued {
                    out["token"] = json!(t.token);
                    out["token_id"] = json!(t.id);
                }
                out
            }
            PrincipalCmd::Revoke {
                name,
                roles,
                scopes,
                all,
                ..
            } => {
                let entry = ps.revoke(&name, &roles, &scopes, all).await.map_err(|e| {
                    match e.code.as_str() {
                        "not_found" => no_principal(&name),
                        _ => refused(e),
                    }
                })?;
                json!({ "principal": entry })
            }
            PrincipalCmd::List { .. } => list(&ps).await?,
            PrincipalCmd::Token { cmd } => token(&ps, cmd).await?,
        };
        common::print_json(&out);
        Ok(Outcome::Pass)
    })
}

/// `principal list`.
async fn list(ps: &PrincipalStore) -> Result<serde_json::Value, Failure> {
    Ok(json!({ "principals": ps.list().await.map_err(refused)? }))
}

/// `principal token add|list|revoke`.
async fn token(ps: &PrincipalStore, cmd: TokenCmd) -> Result<serde_json::Value, Failure> {
    Ok(match cmd {
        TokenCmd::Add { name, .. } => match ps.issue_token(&name).await.map_err(refused)? {
            TokenIssue::Issued(t) => json!({
                "created_at": t.created_at,
                "principal": name,
                "token": t.token,
                "token_id": t.id,
            }),
            TokenIssue::PrincipalMissing => return Err(no_principal(&name)),
            TokenIssue::PrincipalInactive => {
                return Err(Failure::explained(
                    "PRINCIPAL_INACTIVE",
                    format!(
                        "principal {name:?} is deactivated, so a token would not authenticate; \
                         re-activate it with `toolledger principal add` first"
                    ),
                ))
            }
        },
        TokenCmd::List { name, .. } => match ps.tokens(&name).await.map_err(refused)? {
            Some(tokens) => json!({ "principal": name, "tokens": tokens }),
            None => return Err(no_principal(&name)),
        },
        TokenCmd::Revoke { name, token_id, .. } => {
            match ps.revoke_token(&name, &token_id).await.map_err(refused)? {
                TokenRevoke::Revoked { remaining } => json!({
                    "principal": name,
                    "revoked": token_id,
                    "tokens": remaining,
                }),
                TokenRevoke::PrincipalMissing => return Err(no_principal(&name)),
                TokenRevoke::TokenMissing => {
                    return Err(Failure::explained(
                        "TOKEN_NOT_FOUND",
                        format!(
                            "principal {name:?} has no token with that id; `toolledger principal \
                             token list {name}` shows its tokens"
                        ),
                    ))
                }
            }
        }
    })
}
