//! `toolledger principal add|revoke|list`: the principal store from the command line.
//!
//! Output is one JSON object on stdout. Bad input or an unusable database exits 2 with a
//! stable, path-free `{"error":{"code":…}}` on stderr, and writes nothing.

use serde_json::json;
use toolledger::authz::PrincipalStore;
use toolledger::Error;

use crate::common::{self, StoreArgs, StoreConfig};
use crate::exit::{Failure, Outcome};

/// The `principal` subcommands.
#[derive(clap::Subcommand, Debug)]
pub enum PrincipalCmd {
    /// Add a principal, or replace an existing one's tenant, roles and scopes and re-activate
    /// it.
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
        /// Issue a bearer token; it is printed once and only its hash is stored.
        #[arg(long)]
        token: bool,
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
}

impl PrincipalCmd {
    /// The ledger flags of the subcommand.
    pub fn store(&self) -> &StoreArgs {
        match self {
            PrincipalCmd::Add { store, .. }
            | PrincipalCmd::Revoke { store, .. }
            | PrincipalCmd::List { store } => store,
        }
    }
}

/// A refusal of the principal store, as its upper-case code (exit 2).
fn refused(e: Error) -> Failure {
    Failure::Code(e.code.as_str().to_ascii_uppercase().into())
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
                ..
            } => {
                let issued = ps
                    .add(&name, &tenant, &roles, &scopes, token)
                    .await
                    .map_err(refused)?;
                let entry = ps
                    .entry(&name)
                    .await
                    .map_err(refused)?
                    .ok_or(Failure::code("NOT_FOUND"))?;
                let mut out = json!({ "principal": entry });
                if let Some(t) = issued {
                    out["token"] = json!(t);
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
                let entry = ps
                    .revoke(&name, &roles, &scopes, all)
                    .await
                    .map_err(refused)?;
                json!({ "principal": entry })
            }
            PrincipalCmd::List { .. } => json!({ "principals": ps.list().await.map_err(refused)? }),
        };
        common::print_json(&out);
        Ok(Outcome::Pass)
    })
}
