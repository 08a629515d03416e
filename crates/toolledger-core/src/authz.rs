//! The principal store: who a caller is *now*.
//!
//! Principals (tenant, roles, scopes) live in the `principals` table and bearer tokens, stored
//! only as SHA-256 hex, in `principal_tokens`; operators name a token by its [`token_id`],
//! derived from that hash without revealing it. Nothing is cached: every [`PrincipalStore::resolve`]
//! re-reads the row, so a revocation takes effect at the next check. Inside an effect's
//! transaction, [`resolve_in`] reads the same row through the transaction itself.

use std::collections::BTreeSet;
use std::future::Future;
use std::pin::Pin;

use serde::Serialize;

use crate::clock::{SharedClock, SystemClock};
use crate::effect::{EffectTx, RowExt, SqlValue};
use crate::model::{Error, Principal};
use crate::store::{Store, StoreError};

/// One principal as listed by operators (never includes tokens).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct PrincipalEntry {
    /// Principal name (the subject).
    pub name: String,
    /// Tenant (workspace).
    pub tenant: String,
    /// Current roles.
    pub roles: BTreeSet<String>,
    /// Current scopes.
    pub scopes: BTreeSet<String>,
    /// Whether the principal may act at all.
    pub active: bool,
    /// Number of live bearer tokens.
    pub tokens: i64,
}

/// How [`PrincipalStore::put`] treats a principal that already exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IfExists {
    /// Leave it as it is unless the request names exactly its tenant, roles and scopes (then
    /// only re-activate it).
    Keep,
    /// Replace its tenant, roles and scopes and re-activate it.
    Replace,
}

/// What [`PrincipalStore::put`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum PutOutcome {
    /// A new principal; with a token when one was asked for.
    Created(Option<IssuedToken>),
    /// It existed with exactly these grants and was active: nothing changed.
    Unchanged,
    /// It existed with exactly these grants and was inactive: it is active again.
    Reactivated,
    /// It existed with other grants, and [`IfExists::Replace`] replaced them.
    Replaced,
    /// It exists, and the request would have changed its grants without
    /// [`IfExists::Replace`], or asked for a token (tokens of an existing principal are
    /// issued by [`PrincipalStore::issue_token`]). Nothing was written.
    Exists(PrincipalEntry),
}

/// What [`PrincipalStore::ensure`] found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Ensured {
    /// The principal existed and is active.
    Active,
    /// The principal did not exist and was created now.
    Created,
    /// The principal exists but is deactivated: it was left so.
    Inactive,
}

/// A bearer token as operators see it: never its value or its hash.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct TokenEntry {
    /// The token's id ([`token_id`]): names it without revealing it or its stored hash.
    pub id: String,
    /// When it was issued (Unix seconds).
    pub created_at: i64,
}

/// A newly issued bearer token: the only time its value is visible.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IssuedToken {
    /// The token's id ([`token_id`]).
    pub id: String,
    /// The token itself (`tl_` + 64 hex digits); only its hash is stored.
    pub token: String,
    /// When it was issued (Unix seconds).
    pub created_at: i64,
}

/// What [`PrincipalStore::issue_token`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum TokenIssue {
    /// A new token for the principal.
    Issued(IssuedToken),
    /// No such principal; nothing was written.
    PrincipalMissing,
    /// The principal is inactive (a token would not authenticate); nothing was written.
    PrincipalInactive,
}

/// What [`PrincipalStore::revoke_token`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum TokenRevoke {
    /// The token is deleted; `remaining` tokens of the principal are left.
    Revoked {
        /// Live tokens the principal still has.
        remaining: i64,
    },
    /// No such principal; nothing was written.
    PrincipalMissing,
    /// The principal has no token with that id; nothing was written.
    TokenMissing,
}

/// Resolves the current principal for a name, re-read at every call.
pub trait CurrentPrincipal: Send + Sync {
    /// The active principal called `name`, or `None` when absent or inactive.
    fn current<'a>(
        &'a self,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Principal>, Error>> + Send + 'a>>;
}

/// The principal store over a ledger database.
#[derive(Clone, Debug)]
pub struct PrincipalStore {
    store: Store,
    clock: SharedClock,
}

const TOKEN_PREFIX: &str = "tl_";

fn check_name(what: &str, s: &str) -> Result<(), Error> {
    let n = s.chars().count();
    if n == 0 || n > 128 {
        return Err(Error::invalid(format!(
            "{what} must be 1 to 128 characters"
        )));
    }
    if s.chars().any(|c| c.is_control() || c.is_whitespace()) {
        return Err(Error::invalid(format!(
            "{what} may not contain whitespace or control characters"
        )));
    }
    Ok(())
}

fn check_names(what: &str, items: &[String]) -> Result<BTreeSet<String>, Error> {
    let mut out = BTreeSet::new();
    for item in items {
        check_name(what, item)?;
        out.insert(item.clone());
    }
    Ok(out)
}

fn encode_set(set: &BTreeSet<String>) -> String {
    let v = serde_json::Value::Array(
        set.iter()
            .map(|s| serde_json::Value::String(s.clone()))
            .collect(),
    );
    crate::json::canonical_string(&v).unwrap_or_else(|_| "[]".to_string())
}

fn decode_set(text: &str) -> Result<BTreeSet<String>, Error> {
    let contract = || {
        Error::from(StoreError::Contract(
            "principal store row is malformed".into(),
        ))
    };
    let value = crate::json::parse_canonical(text.as_bytes()).map_err(|_| contract())?;
    let items = value.as_array().ok_or_else(contract)?;
    let mut out = BTreeSet::new();
    for item in items {
        out.insert(item.as_str().ok_or_else(contract)?.to_string());
    }
    Ok(out)
}

/// The key writers of one principal serialize on.
fn principal_lock(name: &str) -> String {
    format!("principal\u{1f}{name}")
}

/// SHA-256 hex of a bearer token, as stored.
pub fn token_hash(token: &str) -> String {
    crate::digest::sha256_hex(token.as_bytes())
}

/// The id of a stored token, from its stored SHA-256 hex: `tok_` and the first 8 bytes, in
/// hex, of SHA-256 over a fixed label and that hash. It names the token in listings and
/// revocations without revealing the token or the hash it is looked up by.
pub fn token_id(token_sha256: &str) -> String {
    let digest =
        crate::digest::sha256_hex(format!("toolledger token id\0{token_sha256}").as_bytes());
    format!("tok_{}", &digest[..16])
}

fn new_token() -> Result<String, Error> {
    let mut bytes = [0u8; 32];
    getrandom::fill(&mut bytes)
        .map_err(|_| Error::unavailable("no randomness available for a token"))?;
    Ok(format!("{TOKEN_PREFIX}{}", hex::encode(bytes)))
}

fn principal_from(
    name: String,
    tenant: String,
    roles: &str,
    scopes: &str,
) -> Result<Principal, Error> {
    Ok(Principal {
        tenant,
        subject: name,
        roles: decode_set(roles)?,
        scopes: decode_set(scopes)?,
    })
}

/// Reads the active principal `name` through an effect's transaction (the same snapshot the
/// effect writes in). `None` when absent or inactive.
pub fn resolve_in(tx: &mut dyn EffectTx, name: &str) -> Result<Option<Principal>, Error> {
    let rows = tx.query(
        "SELECT tenant, roles, scopes FROM principals WHERE name = ?1 AND active = 1",
        &[SqlValue::from(name)],
    )?;
    let Some(row) = rows.into_iter().next() else {
        return Ok(None);
    };
    let text = |i: usize| -> Result<String, Error> {
        row.get(i)
            .and_then(|v| v.as_str())
            .map(str::to_string)
            .ok_or_else(|| Error::from(StoreError::Contract("principal row is malformed".into())))
    };
    principal_from(name.to_string(), text(0)?, &text(1)?, &text(2)?).map(Some)
}

/// Adds principal `name` in `tenant` with these roles and scopes inside the caller's
/// transaction, unless a principal of that name exists (active or not; it is then left as it
/// is). `true` when it was added. The names are checked as [`PrincipalStore::put`] checks them.
pub fn insert_in(
    tx: &mut dyn EffectTx,
    name: &str,
    tenant: &str,
    roles: &[String],
    scopes: &[String],
    now: i64,
) -> Result<bool, Error> {
    check_name("principal name", name)?;
    check_name("tenant", tenant)?;
    let roles = encode_set(&check_names("role", roles)?);
    let scopes = encode_set(&check_names("scope", scopes)?);
    tx.lock_key(&principal_lock(name))?;
    let n = tx.execute(
        "INSERT INTO principals(name, tenant, roles, scopes, active, created_at, updated_at)
         VALUES (?1, ?2, ?3, ?4, 1, ?5, ?5) ON CONFLICT(name) DO NOTHING",
        &[
            name.into(),
            tenant.into(),
            roles.as_str().into(),
            scopes.as_str().into(),
            now.into(),
        ],
    )?;
    Ok(n == 1)
}

fn entry_in(tx: &mut dyn EffectTx, name: &str) -> Result<Option<PrincipalEntry>, Error> {
    let row = tx.query_opt(
        "SELECT tenant, roles, scopes, active,
                (SELECT count(*) FROM principal_tokens t WHERE t.principal = p.name)
         FROM principals p WHERE name = ?1",
        &[SqlValue::from(name)],
    )?;
    row.map(|r| {
        Ok(PrincipalEntry {
            name: name.to_string(),
            tenant: r.text(0)?,
            roles: decode_set(&r.text(1)?)?,
            scopes: decode_set(&r.text(2)?)?,
            active: r.int(3)? == 1,
            tokens: r.int(4)?,
        })
    })
    .transpose()
}

fn insert_token(tx: &mut dyn EffectTx, name: &str, now: i64) -> Result<IssuedToken, Error> {
    let token = new_token()?;
    let hash = token_hash(&token);
    tx.execute(
        "INSERT INTO principal_tokens(token_sha256, principal, created_at) VALUES (?1, ?2, ?3)",
        &[hash.as_str().into(), name.into(), now.into()],
    )?;
    Ok(IssuedToken {
        id: token_id(&hash),
        token,
        created_at: now,
    })
}

/// The tokens of principal `name` as `(stored hash, entry)`, oldest first.
fn tokens_in(tx: &mut dyn EffectTx, name: &str) -> Result<Vec<(String, TokenEntry)>, Error> {
    let rows = tx.query(
        "SELECT token_sha256, created_at FROM principal_tokens WHERE principal = ?1
         ORDER BY created_at, token_sha256",
        &[SqlValue::from(name)],
    )?;
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        let hash = row.text(0)?;
        let entry = TokenEntry {
            id: token_id(&hash),
            created_at: row.int(1)?,
        };
        out.push((hash, entry));
    }
    // Sorted by id within one second, so the order does not follow the hashes.
    out.sort_by(|a, b| (a.1.created_at, &a.1.id).cmp(&(b.1.created_at, &b.1.id)));
    Ok(out)
}

impl PrincipalStore {
    /// A principal store over `store` (a [`Store`] or a backend handle), stamping rows with
    /// wall-clock time.
    pub fn new(store: impl Into<Store>) -> Self {
        PrincipalStore {
            store: store.into(),
            clock: std::sync::Arc::new(SystemClock),
        }
    }

    /// Uses `clock` for `created_at`/`updated_at`.
    pub fn with_clock(mut self, clock: SharedClock) -> Self {
        self.clock = clock;
        self
    }

    /// Adds principal `name` in `tenant` with exactly these roles and scopes, or, if it
    /// exists, replaces its tenant, roles and scopes and re-activates it. With `issue_token`
    /// a new bearer token is created and returned; only its hash is stored, so this is the
    /// only time it is visible. Operators' tools use [`PrincipalStore::put`], which never
    /// changes an existing principal unasked.
    pub async fn add(
        &self,
        name: &str,
        tenant: &str,
        roles: &[String],
        scopes: &[String],
        issue_token: bool,
    ) -> Result<Option<String>, Error> {
        check_name("principal name", name)?;
        check_name("tenant", tenant)?;
        let roles = encode_set(&check_names("role", roles)?);
        let scopes = encode_set(&check_names("scope", scopes)?);
        let token = if issue_token {
            Some(new_token()?)
        } else {
            None
        };
        let hash = token.as_deref().map(token_hash);
        let (name, tenant) = (name.to_string(), tenant.to_string());
        let clock = self.clock.clone();
        self.store
            .write(move |tx: &mut dyn EffectTx| -> Result<(), Error> {
                let now = clock.now();
                tx.lock_key(&principal_lock(&name))?;
                tx.execute(
                    "INSERT INTO principals(name, tenant, roles, scopes, active, created_at,
                         updated_at)
                     VALUES (?1, ?2, ?3, ?4, 1, ?5, ?5)
                     ON CONFLICT(name) DO UPDATE SET tenant = excluded.tenant,
                         roles = excluded.roles, scopes = excluded.scopes, active = 1,
                         updated_at = excluded.updated_at",
                    &[
                        name.as_str().into(),
                        tenant.as_str().into(),
                        roles.as_str().into(),
                        scopes.as_str().into(),
                        now.into(),
                    ],
                )?;
                if let Some(hash) = &hash {
                    tx.execute(
                        "INSERT INTO principal_tokens(token_sha256, principal, created_at)
                         VALUES (?1, ?2, ?3)",
                        &[hash.as_str().into(), name.as_str().into(), now.into()],
                    )?;
                }
                Ok(())
            })
            .await?;
        Ok(token)
    }

    /// Adds principal `name` in `tenant` with exactly these roles and scopes; with
    /// `issue_token` a first bearer token is issued with it (see [`IssuedToken`]).
    ///
    /// A principal that exists is never changed behind its operator's back: with
    /// [`IfExists::Keep`] the request must name exactly its tenant, roles and scopes (an
    /// inactive one is then re-activated), otherwise nothing is written and the answer is
    /// [`PutOutcome::Exists`]; with [`IfExists::Replace`] its tenant, roles and scopes are
    /// replaced and it is re-activated. Tokens of an existing principal are never touched:
    /// `issue_token` for one is [`PutOutcome::Exists`] too.
    pub async fn put(
        &self,
        name: &str,
        tenant: &str,
        roles: &[String],
        scopes: &[String],
        if_exists: IfExists,
        issue_token: bool,
    ) -> Result<PutOutcome, Error> {
        check_name("principal name", name)?;
        check_name("tenant", tenant)?;
        let role_set = check_names("role", roles)?;
        let scope_set = check_names("scope", scopes)?;
        let (name, tenant) = (name.to_string(), tenant.to_string());
        let clock = self.clock.clone();
        self.store
            .write(move |tx: &mut dyn EffectTx| -> Result<PutOutcome, Error> {
                let now = clock.now();
                tx.lock_key(&principal_lock(&name))?;
                let roles = encode_set(&role_set);
                let scopes = encode_set(&scope_set);
                let Some(existing) = entry_in(tx, &name)? else {
                    tx.execute(
                        "INSERT INTO principals(name, tenant, roles, scopes, active, created_at,
                             updated_at)
                         VALUES (?1, ?2, ?3, ?4, 1, ?5, ?5)",
                        &[
                            name.as_str().into(),
                            tenant.as_str().into(),
                            roles.as_str().into(),
                            scopes.as_str().into(),
                            now.into(),
                        ],
                    )?;
                    let token = if issue_token {
                        Some(insert_token(tx, &name, now)?)
                    } else {
                        None
                    };
                    return Ok(PutOutcome::Created(token));
                };
                let same = existing.tenant == tenant
                    && existing.roles == role_set
                    && existing.scopes == scope_set;
                if issue_token || (!same && if_exists == IfExists::Keep) {
                    return Ok(PutOutcome::Exists(existing));
                }
                if same && existing.active {
                    return Ok(PutOutcome::Unchanged);
                }
                tx.execute(
                    "UPDATE principals SET tenant = ?1, roles = ?2, scopes = ?3, active = 1,
                         updated_at = ?4
                     WHERE name = ?5",
                    &[
                        tenant.as_str().into(),
                        roles.as_str().into(),
                        scopes.as_str().into(),
                        now.into(),
                        name.as_str().into(),
                    ],
                )?;
                Ok(if same {
                    PutOutcome::Reactivated
                } else {
                    PutOutcome::Replaced
                })
            })
            .await
    }

    /// Issues another bearer token for the active principal `name`. Only its hash is stored;
    /// the returned value is the only time the token is visible.
    pub async fn issue_token(&self, name: &str) -> Result<TokenIssue, Error> {
        check_name("principal name", name)?;
        let name = name.to_string();
        let clock = self.clock.clone();
        self.store
            .write(move |tx: &mut dyn EffectTx| -> Result<TokenIssue, Error> {
                let now = clock.now();
                tx.lock_key(&principal_lock(&name))?;
                Ok(match entry_in(tx, &name)? {
                    None => TokenIssue::PrincipalMissing,
                    Some(e) if !e.active => TokenIssue::PrincipalInactive,
                    Some(_) => TokenIssue::Issued(insert_token(tx, &name, now)?),
                })
            })
            .await
    }

    /// The tokens of principal `name`, oldest first (ids and issue times only); `None` when
    /// there is no such principal.
    pub async fn tokens(&self, name: &str) -> Result<Option<Vec<TokenEntry>>, Error> {
        check_name("principal name", name)?;
        let name = name.to_string();
        self.store
            .read(
                move |tx: &mut dyn EffectTx| -> Result<Option<Vec<TokenEntry>>, Error> {
                    if entry_in(tx, &name)?.is_none() {
                        return Ok(None);
                    }
                    Ok(Some(
                        tokens_in(tx, &name)?.into_iter().map(|(_, e)| e).collect(),
                    ))
                },
            )
            .await
    }

    /// Deletes the token of principal `name` whose [`token_id`] is `id`; it stops
    /// authenticating at once. The principal's other tokens, roles and scopes stay.
    pub async fn revoke_token(&self, name: &str, id: &str) -> Result<TokenRevoke, Error> {
        check_name("principal name", name)?;
        let (name, id) = (name.to_string(), id.to_string());
        self.store
            .write(move |tx: &mut dyn EffectTx| -> Result<TokenRevoke, Error> {
                tx.lock_key(&principal_lock(&name))?;
                if entry_in(tx, &name)?.is_none() {
                    return Ok(TokenRevoke::PrincipalMissing);
                }
                let tokens = tokens_in(tx, &name)?;
                let Some((hash, _)) = tokens.iter().find(|(_, e)| e.id == id) else {
                    return Ok(TokenRevoke::TokenMissing);
                };
                tx.execute(
                    "DELETE FROM principal_tokens WHERE token_sha256 = ?1 AND principal = ?2",
                    &[hash.as_str().into(), name.as_str().into()],
                )?;
                Ok(TokenRevoke::Revoked {
                    remaining: tokens.len() as i64 - 1,
                })
            })
            .await
    }

    /// Removes `roles` and `scopes` from principal `name`; with `all`, deactivates it and
    /// deletes its tokens. `not_found` if there is no such principal; `invalid_arguments` if
    /// nothing is to be revoked.
    pub async fn revoke(
        &self,
        name: &str,
        roles: &[String],
        scopes: &[String],
        all: bool,
    ) -> Result<PrincipalEntry, Error> {
        check_name("principal name", name)?;
        let roles = check_names("role", roles)?;
        let scopes = check_names("scope", scopes)?;
        if !all && roles.is_empty() && scopes.is_empty() {
            return Err(Error::invalid("name a role, a scope, or --all to revoke"));
        }
        let name = name.to_string();
        let clock = self.clock.clone();
        self.store
            .write(
                move |tx: &mut dyn EffectTx| -> Result<PrincipalEntry, Error> {
                    let now = clock.now();
                    // Read-modify-write of the sets: concurrent revocations of one principal
                    // must not lose each other's removals where writers run in parallel.
                    tx.lock_key(&principal_lock(&name))?;
                    let Some(entry) = entry_in(tx, &name)? else {
                        return Err(Error::not_found());
                    };
                    let kept_roles: BTreeSet<String> =
                        entry.roles.difference(&roles).cloned().collect();
                    let kept_scopes: BTreeSet<String> =
                        entry.scopes.difference(&scopes).cloned().collect();
                    let active = if all { 0 } else { i64::from(entry.active) };
                    tx.execute(
                    "UPDATE principals SET roles = ?1, scopes = ?2, active = ?3, updated_at = ?4
                     WHERE name = ?5",
                    &[
                        encode_set(&kept_roles).into(),
                        encode_set(&kept_scopes).into(),
                        active.into(),
                        now.into(),
                        name.as_str().into(),
                    ],
                )?;
                    if all {
                        tx.execute(
                            "DELETE FROM principal_tokens WHERE principal = ?1",
                            &[name.as_str().into()],
                        )?;
                    }
                    entry_in(tx, &name)?.ok_or_else(Error::not_found)
                },
            )
            .await
    }

    /// Every principal, by name.
    pub async fn list(&self) -> Result<Vec<PrincipalEntry>, Error> {
        self.store
            .read(
                |tx: &mut dyn EffectTx| -> Result<Vec<PrincipalEntry>, Error> {
                    let names = tx.query("SELECT name FROM principals ORDER BY name", &[])?;
                    let mut out = Vec::with_capacity(names.len());
                    for row in names {
                        if let Some(e) = entry_in(tx, &row.text(0)?)? {
                            out.push(e);
                        }
                    }
                    Ok(out)
                },
            )
            .await
    }

    /// The operator view of principal `name` (active or not); `None` when absent.
    pub async fn entry(&self, name: &str) -> Result<Option<PrincipalEntry>, Error> {
        let name = name.to_string();
        self.store
            .read(move |tx: &mut dyn EffectTx| entry_in(tx, &name))
            .await
    }

    /// Makes sure principal `name` can act: an active one is left as it is, a missing one is
    /// created in `tenant` with no roles, scopes or tokens, and a deactivated one stays
    /// deactivated ([`Ensured::Inactive`]): only an operator re-activates it. For a caller
    /// named by trusted configuration (a stdio session); two processes that ensure the same
    /// name at once both find it active.
    pub async fn ensure(&self, name: &str, tenant: &str) -> Result<Ensured, Error> {
        let created = match self.entry(name).await? {
            Some(entry) if entry.active => return Ok(Ensured::Active),
            Some(_) => return Ok(Ensured::Inactive),
            None => matches!(
                self.put(name, tenant, &[], &[], IfExists::Keep, false)
                    .await?,
                PutOutcome::Created(_)
            ),
        };
        Ok(match self.resolve(name).await? {
            None => Ensured::Inactive,
            Some(_) if created => Ensured::Created,
            Some(_) => Ensured::Active,
        })
    }

    /// The active principal called `name`, re-read now; `None` when absent or inactive.
    pub async fn resolve(&self, name: &str) -> Result<Option<Principal>, Error> {
        let name = name.to_string();
        self.store
            .read(move |tx: &mut dyn EffectTx| resolve_in(tx, &name))
            .await
    }

    /// The principal a bearer token belongs to, as `(name, principal)`; `None` for an unknown
    /// token or an inactive principal. Looked up by the token's SHA-256.
    pub async fn resolve_token(&self, token: &str) -> Result<Option<(String, Principal)>, Error> {
        if !token.starts_with(TOKEN_PREFIX) || token.len() > 256 {
            return Ok(None);
        }
        let hash = token_hash(token);
        self.store
            .read(
                move |tx: &mut dyn EffectTx| -> Result<Option<(String, Principal)>, Error> {
                    let row = tx.query_opt(
                        "SELECT principal FROM principal_tokens WHERE token_sha256 = ?1",
                        &[hash.as_str().into()],
                    )?;
                    match row {
                        Some(row) => {
                            let name = row.text(0)?;
                            Ok(resolve_in(tx, &name)?.map(|p| (name, p)))
                        }
                        None => Ok(None),
                    }
                },
            )
            .await
    }

    /// The active principal `name` while it still holds the token whose [`token_id`] is `id`:
    /// `None` once that token is revoked, or the principal is absent or inactive. For a
    /// session opened with that token, re-checked on every request.
    pub async fn resolve_with_token(
        &self,
        name: &str,
        id: &str,
    ) -> Result<Option<Principal>, Error> {
        let (name, id) = (name.to_string(), id.to_string());
        self.store
            .read(
                move |tx: &mut dyn EffectTx| -> Result<Option<Principal>, Error> {
                    if !tokens_in(tx, &name)?.iter().any(|(_, e)| e.id == id) {
                        return Ok(None);
                    }
                    resolve_in(tx, &name)
                },
            )
            .await
    }

    /// The store the principals live in.
    pub fn store(&self) -> &Store {
        &self.store
    }
}

impl CurrentPrincipal for PrincipalStore {
    fn current<'a>(
        &'a self,
        name: &'a str,
    ) -> Pin<Box<dyn Future<Output = Result<Option<Principal>, Error>> + Send + 'a>> {
        Box::pin(self.resolve(name))
    }
}
