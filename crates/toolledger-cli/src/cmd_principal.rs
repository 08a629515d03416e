//! `toolledger principal add|revoke|list`: the principal store from the command line.
//!
//! Output is one JSON object on stdout. Bad input or an unusable database exits 2 with a
//! stable, path-free `{"error":{"code":…}}` on stderr, and writes nothing.

use std::process::ExitCode;

use serde_json::json;
use toolledger::authz::PrincipalStore;
use toolledger::Error;

use crate::common::{self, StoreArgs};

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

fn fail_error(e: &Error) -> ExitCode {
    common::fail(&e.code.as_str().to_ascii_uppercase())
}

fn open(store: &StoreArgs) -> Result<PrincipalStore, ExitCode> {
    store
        .open_with(false)
        .map(PrincipalStore::new)
        .map_err(|e| common::fail_store(&e))
}

/// Runs one `principal` subcommand.
pub fn run(cmd: PrincipalCmd) -> ExitCode {
    let Ok(rt) = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    else {
        return common::fail("RUNTIME_ERROR");
    };
    rt.block_on(async move {
        match cmd {
            PrincipalCmd::Add {
                name,
                tenant,
                roles,
                scopes,
                token,
                store,
            } => {
                let ps = match open(&store) {
                    Ok(ps) => ps,
                    Err(code) => return code,
                };
                let issued = match ps.add(&name, &tenant, &roles, &scopes, token).await {
                    Ok(t) => t,
                    Err(e) => return fail_error(&e),
                };
                match ps.entry(&name).await {
                    Ok(Some(entry)) => {
                        let mut out = json!({ "principal": entry });
                        if let Some(t) = issued {
                            out["token"] = json!(t);
                        }
                        common::print_json(&out);
                        ExitCode::SUCCESS
                    }
                    Ok(None) => common::fail("NOT_FOUND"),
                    Err(e) => fail_error(&e),
                }
            }
            PrincipalCmd::Revoke {
                name,
                roles,
                scopes,
                all,
                store,
            } => {
                let ps = match open(&store) {
                    Ok(ps) => ps,
                    Err(code) => return code,
                };
                match ps.revoke(&name, &roles, &scopes, all).await {
                    Ok(entry) => {
                        common::print_json(&json!({ "principal": entry }));
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail_error(&e),
                }
            }
            PrincipalCmd::List { store } => {
                let ps = match open(&store) {
                    Ok(ps) => ps,
                    Err(code) => return code,
                };
                match ps.list().await {
                    Ok(list) => {
                        common::print_json(&json!({ "principals": list }));
                        ExitCode::SUCCESS
                    }
                    Err(e) => fail_error(&e),
                }
            }
        }
    })
}
