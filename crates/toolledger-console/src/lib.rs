//! The operator console: server-rendered HTML pages under `/console` that list the ledger's
//! unsure operations, show one operation's whole timeline, and let an operator settle it.
//!
//! [`Console::router`] builds the pages as an axum router that `toolledger console`,
//! `toolledger serve --http --console` and `toolledger proxy --http --console` serve. The
//! console knows no SQL: it reads through `toolledger::operations` (the unsure list, its
//! counts, the timeline) and `toolledger::authz::PrincipalStore` (bearer tokens, principals),
//! and settles through a [`Resolver`] — the binary's resolution code path, the one
//! `toolledger resolve` runs.
//!
//! **Security.**
//! - Login exchanges a bearer token (`toolledger principal token add`) for a session: a random
//!   id in an `HttpOnly`, `SameSite=Strict` cookie, bound to the token it was opened with.
//!   Sessions live in memory: they end after 8 hours, on sign-out, when the process restarts,
//!   and when their token is revoked or their principal deactivated. The principal and the
//!   token are re-read on every request, so a revocation takes effect at once. One principal
//!   holds at most [`session::MAX_SESSIONS_PER_PRINCIPAL`] sessions; a further login ends its
//!   own oldest one, never another principal's.
//! - Every form that changes something (login, sign-out, resolve) carries a CSRF token,
//!   compared with the session's (login: with a cookie set by the login page, and accepted
//!   only if this process issued it, once); a request without it is refused with 403 and
//!   changes nothing. Requests pass the servers' Host and Origin rules
//!   (`toolledger_mcp::wire::http::guard_host_and_origin`), and a request that carries
//!   `Origin` must name the console's own origin — scheme, host and port — or is refused with
//!   403 `origin_not_allowed`: a page on another port of the same host is another origin.
//! - A form's body is read only after the checks that need no body (a session, the login
//!   cookie), at most [`FORM_LIMIT`] bytes, within the listener's body deadline.
//! - A principal sees only the operations of its own tenant, unless it holds
//!   [`ALL_TENANTS_ROLE`]. Argument values are shown only to the operation's own principal;
//!   the stored result, event details, intent and receipt only to it and to principals holding
//!   the role `operator`. Only operators are shown the resolve form, and a resolve request
//!   from anyone else is refused (403) before the runtime is asked.
//! - Pages are rendered with maud, which escapes every value; responses carry a
//!   Content-Security-Policy that allows no script, `Cache-Control: no-store` and
//!   `X-Frame-Options: DENY`. Tokens never reach a log, an error or a page.

#![warn(missing_docs)]

pub mod pages;
pub mod session;

use std::sync::Arc;

use axum::body::Body;
use axum::extract::{Path, Query, State};
use axum::http::{header, HeaderMap, HeaderValue, StatusCode};
use axum::response::{IntoResponse, Redirect, Response};
use axum::routing::{get, post};
use axum::Router;
use maud::Markup;
use serde::Deserialize;
use toolledger::authz::{token_hash, token_id, PrincipalStore};
use toolledger::clock::SharedClock;
use toolledger::downstream::BoxFuture;
use toolledger::operations::{self, Found, Selector, Unsure, UnsureQuery};
use toolledger::runtime::{Answer, Resolution, ResolveAs, RuntimeError, OPERATOR_ROLE};
use toolledger::store::Store;
use toolledger::{ErrorCode, Principal};
use toolledger_mcp::wire::http::{guard_host_and_origin, read_body, AllowedHosts, BodyFailure};

use pages::{Filters, Shown};
use session::{
    cookie, same, set_cookie, LoginForms, Sessions, LOGIN_COOKIE, LOGIN_FORM_SECS, SESSION_COOKIE,
    SESSION_SECS,
};

/// The role that lets a principal see the operations of every tenant (resolving stays
/// limited to the operator's own tenant).
pub const ALL_TENANTS_ROLE: &str = "operator_all_tenants";

/// Rows per page of the unsure list.
pub const PAGE_ROWS: u32 = 50;

/// The most bytes a form's body may hold (a resolve form's reason, evidence, a 64 KiB result
/// and its output schema fit, URL-encoded); a longer one is refused with 413 `too_large`.
pub const FORM_LIMIT: usize = 256 * 1024;

/// Settles one operation for an operator: the binary's resolution code path (the runtime
/// with the tools and downstreams the process knows), shared with `toolledger resolve`. The
/// second argument is the tool's result the operator gives with a confirmed success, if any.
pub type Resolver = Arc<
    dyn Fn(Resolution, Option<ConfirmedResult>) -> BoxFuture<'static, Result<Answer, RuntimeError>>
        + Send
        + Sync,
>;

/// The tool's result an operator gives with a confirmed success (`succeeded` with evidence),
/// and the output schema it is checked against: stored with the confirmation, so every retry
/// is a success carrying it. The resolver refuses it (`invalid_arguments`, nothing changed)
/// where it does not apply or does not fit.
#[derive(Clone, Debug, PartialEq)]
pub struct ConfirmedResult {
    /// The result, as given.
    pub result: serde_json::Value,
    /// The tool's output schema (its `outputSchema` as the upstream lists it), as given.
    pub output_schema: Option<serde_json::Value>,
}

/// Asks the downstream what it holds for a deferred operation, for an operator
/// (`Runtime::downstream_evidence`; nothing is written), or says why this process cannot.
/// Arguments: the operator's principal name, the status reference.
pub type Evidence =
    Arc<dyn Fn(String, String) -> BoxFuture<'static, Result<Held, RuntimeError>> + Send + Sync>;

/// What an [`Evidence`] found out about a deferred operation's downstream.
#[derive(Clone, Debug, PartialEq)]
pub enum Held {
    /// The downstream was asked: its receipt (the effect happened), or `None` (no receipt).
    Asked(Option<serde_json::Value>),
    /// This process cannot ask that downstream (its tool is not one it serves); the text,
    /// shown as it is, says how the operation is settled instead.
    NotHere(String),
}

/// The console over one ledger.
#[derive(Clone)]
pub struct Console {
    inner: Arc<Inner>,
}

struct Inner {
    store: Store,
    principals: PrincipalStore,
    clock: SharedClock,
    resolver: Resolver,
    evidence: std::sync::OnceLock<Evidence>,
    sessions: Sessions,
    login_forms: LoginForms,
    secure_cookies: std::sync::atomic::AtomicBool,
}

impl Inner {
    /// Whether `request`'s headers say it reached the console over TLS: `--secure-cookies`,
    /// or `X-Forwarded-Proto: https` from a TLS-terminating proxy.
    fn tls(&self, headers: &HeaderMap) -> bool {
        headers
            .get("x-forwarded-proto")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.trim().eq_ignore_ascii_case("https"))
            || self
                .secure_cookies
                .load(std::sync::atomic::Ordering::Relaxed)
    }
}

/// Middleware: adds `Secure` to every cookie the response sets when the console says so
/// ([`Console::with_secure_cookies`]) or the request came through TLS
/// (`X-Forwarded-Proto: https`).
async fn secure_cookies(
    State(c): State<Console>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let secure = c.inner.tls(request.headers());
    let mut response = next.run(request).await;
    if secure {
        let cookies: Vec<HeaderValue> = response
            .headers()
            .get_all(header::SET_COOKIE)
            .iter()
            .cloned()
            .collect();
        response.headers_mut().remove(header::SET_COOKIE);
        for v in cookies {
            let marked = format!("{}; Secure", v.to_str().unwrap_or_default());
            if let Ok(v) = HeaderValue::from_str(&marked) {
                response.headers_mut().append(header::SET_COOKIE, v);
            }
        }
    }
    response
}

/// The logged-in principal of a request.
struct Viewer {
    name: String,
    csrf: String,
    principal: Principal,
}

impl Viewer {
    fn pair(&self) -> (&str, &str) {
        (&self.name, &self.csrf)
    }

    fn all_tenants(&self) -> bool {
        self.principal.has_role(ALL_TENANTS_ROLE)
    }

    fn operator(&self) -> bool {
        self.principal.has_role(OPERATOR_ROLE)
    }

    fn sees_tenant(&self, tenant: &str) -> bool {
        self.all_tenants() || self.principal.tenant == tenant
    }
}

impl Console {
    /// A console over `store`, authenticating against `principals`, measuring ages with
    /// `clock`, settling through `resolver`.
    pub fn new(
        store: Store,
        principals: PrincipalStore,
        clock: SharedClock,
        resolver: Resolver,
    ) -> Self {
        Console {
            inner: Arc::new(Inner {
                store,
                principals,
                clock,
                resolver,
                evidence: std::sync::OnceLock::new(),
                sessions: Sessions::default(),
                login_forms: LoginForms::default(),
                secure_cookies: std::sync::atomic::AtomicBool::new(false),
            }),
        }
    }

    /// Shows operators, on a deferred operation's page, what its downstream holds now
    /// (asked at each view of the page; nothing is written). Without it the page shows only
    /// the ledger's own evidence. Set once; a later call changes nothing.
    pub fn with_evidence(self, evidence: Evidence) -> Self {
        let _ = self.inner.evidence.set(evidence);
        self
    }

    /// Marks every cookie `Secure` (sent back over HTTPS only), for a console reached through a
    /// TLS-terminating proxy. Without it, a request that arrives with
    /// `X-Forwarded-Proto: https` gets `Secure` cookies all the same.
    pub fn with_secure_cookies(self, on: bool) -> Self {
        self.inner
            .secure_cookies
            .store(on, std::sync::atomic::Ordering::Relaxed);
        self
    }

    /// The pages, at `/console` and below, behind the Host/Origin rules of `hosts`.
    pub fn router(&self, hosts: AllowedHosts) -> Router {
        Router::new()
            .route("/console", get(list_page))
            .route("/console/", get(|| async { Redirect::to("/console") }))
            .route("/console/login", get(login_page).post(login))
            .route("/console/logout", post(logout))
            .route("/console/operations/{status_ref}", get(operation_page))
            .route("/console/operations/{status_ref}/resolve", post(resolve))
            .with_state(self.clone())
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                secure_cookies,
            ))
            .layer(axum::middleware::from_fn_with_state(
                self.clone(),
                same_origin,
            ))
            .layer(axum::middleware::from_fn(secure_headers))
            .layer(axum::middleware::from_fn_with_state(
                Arc::new(hosts),
                guard_host_and_origin,
            ))
    }

    /// The logged-in viewer of `headers`, re-read from the principal store; `None` without a
    /// live session, or when the token the session was opened with is revoked or the
    /// principal is no longer active (the session then ends).
    async fn viewer(&self, headers: &HeaderMap) -> Result<Option<Viewer>, Response> {
        let Some(id) = cookie(headers, SESSION_COOKIE) else {
            return Ok(None);
        };
        let Some(s) = self.inner.sessions.get(id) else {
            return Ok(None);
        };
        match self
            .inner
            .principals
            .resolve_with_token(&s.principal, &s.token_id)
            .await
        {
            Ok(Some(principal)) => Ok(Some(Viewer {
                name: s.principal,
                csrf: s.csrf,
                principal,
            })),
            Ok(None) => {
                self.inner.sessions.end(id);
                Ok(None)
            }
            Err(_) => Err(unavailable(None)),
        }
    }
}

/// Middleware: a request that carries `Origin` is served only when it names the console's own
/// origin — the scheme the request came by (`https` over TLS, see [`Inner::tls`]), and the host
/// and port of its `Host` header; otherwise 403 `origin_not_allowed` before anything is read.
/// A page on another port of the same host is another origin: it could set a cookie for this
/// host, but not send a request this console accepts.
async fn same_origin(
    State(c): State<Console>,
    request: axum::extract::Request,
    next: axum::middleware::Next,
) -> Response {
    let headers = request.headers();
    if let Some(origin) = headers.get(header::ORIGIN) {
        let host = headers.get(header::HOST).and_then(|v| v.to_str().ok());
        let tls = c.inner.tls(headers);
        if !origin
            .to_str()
            .is_ok_and(|o| host.is_some_and(|h| own_origin(o, h, tls)))
        {
            return refused(
                None,
                StatusCode::FORBIDDEN,
                "origin_not_allowed",
                "the request came from a page of another origin (scheme, host and port)",
            );
        }
    }
    next.run(request).await
}

/// Whether `origin` is `http://HOST` (`https://HOST` when `tls`), the host and port of `host`
/// (a `Host` header value), a missing port being the scheme's default.
fn own_origin(origin: &str, host: &str, tls: bool) -> bool {
    let (scheme, default_port) = if tls { ("https", 443) } else { ("http", 80) };
    let Ok(uri) = origin.parse::<axum::http::Uri>() else {
        return false;
    };
    let (Some(seen), Some(from)) = (uri.scheme_str(), uri.authority()) else {
        return false;
    };
    let Ok(own) = host.parse::<axum::http::uri::Authority>() else {
        return false;
    };
    let normal = |h: &str| {
        h.trim_start_matches('[')
            .trim_end_matches(']')
            .trim_end_matches('.')
            .to_ascii_lowercase()
    };
    seen.eq_ignore_ascii_case(scheme)
        && (uri.path().is_empty() || uri.path() == "/")
        && from.as_str().rsplit_once('@').is_none()
        && normal(from.host()) == normal(own.host())
        && from.port_u16().unwrap_or(default_port) == own.port_u16().unwrap_or(default_port)
}

/// The headers of every console response.
async fn secure_headers(request: axum::extract::Request, next: axum::middleware::Next) -> Response {
    let mut response = next.run(request).await;
    let h = response.headers_mut();
    h.insert(
        header::CONTENT_SECURITY_POLICY,
        HeaderValue::from_static(
            "default-src 'none'; style-src 'unsafe-inline'; img-src 'self'; \
             form-action 'self'; frame-ancestors 'none'; base-uri 'none'",
        ),
    );
    h.insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    h.insert(header::X_FRAME_OPTIONS, HeaderValue::from_static("DENY"));
    h.insert(
        header::X_CONTENT_TYPE_OPTIONS,
        HeaderValue::from_static("nosniff"),
    );
    h.insert(
        header::REFERRER_POLICY,
        HeaderValue::from_static("same-origin"),
    );
    response
}

fn html(status: StatusCode, page: Markup) -> Response {
    (
        status,
        [(header::CONTENT_TYPE, "text/html; charset=utf-8")],
        page.into_string(),
    )
        .into_response()
}

fn refused(viewer: Option<&Viewer>, status: StatusCode, code: &str, text: &str) -> Response {
    html(
        status,
        pages::message(viewer.map(Viewer::pair), "Refused", code, text),
    )
}

fn unavailable(viewer: Option<&Viewer>) -> Response {
    refused(
        viewer,
        StatusCode::SERVICE_UNAVAILABLE,
        "store_unavailable",
        "the ledger did not answer; try again",
    )
}

fn to_login() -> Response {
    Redirect::to("/console/login").into_response()
}

/// The list's query string.
#[derive(Deserialize, Default)]
struct ListParams {
    kind: Option<String>,
    tool: Option<String>,
    older_than: Option<String>,
    after: Option<String>,
}

async fn list_page(
    State(c): State<Console>,
    headers: HeaderMap,
    Query(p): Query<ListParams>,
) -> Response {
    let viewer = match c.viewer(&headers).await {
        Ok(Some(v)) => v,
        Ok(None) => return to_login(),
        Err(r) => return r,
    };
    let nonempty = |s: Option<String>| s.filter(|s| !s.trim().is_empty());
    let kind =
        match nonempty(p.kind) {
            None => None,
            Some(k) => match Unsure::parse(&k) {
                Some(k) => Some(k),
                None => return refused(
                    Some(&viewer),
                    StatusCode::BAD_REQUEST,
                    "invalid_arguments",
                    "kind must be outcome_unknown, lease_expired, stuck, partial, dead or accepted",
                ),
            },
        };
    let older_than = match nonempty(p.older_than) {
        None => None,
        Some(o) => match o.trim().parse::<i64>() {
            Ok(n) if n >= 0 => Some(n),
            _ => {
                return refused(
                    Some(&viewer),
                    StatusCode::BAD_REQUEST,
                    "invalid_arguments",
                    "older_than must be a number of seconds",
                )
            }
        },
    };
    let filters = Filters {
        kind,
        tool: nonempty(p.tool).filter(|t| t.len() <= 256),
        older_than,
    };
    let after = nonempty(p.after).filter(|a| a.len() <= 128);
    let tenant = (!viewer.all_tenants()).then(|| viewer.principal.tenant.clone());
    let now = c.inner.clock.now();
    let query = UnsureQuery {
        kinds: filters.kind.into_iter().collect(),
        tenant: tenant.clone(),
        tool: filters.tool.clone(),
        older_than: filters.older_than,
        now,
        limit: PAGE_ROWS,
        after: after.clone(),
    };
    let read = c
        .inner
        .store
        .read(move |tx| {
            let counts = operations::unsure_counts(tx, tenant.as_deref(), now)?;
            let page = operations::unsure(tx, &query)?;
            Ok::<_, toolledger::store::StoreError>((counts, page))
        })
        .await;
    let Ok((counts, page)) = read else {
        return unavailable(Some(&viewer));
    };
    let scope = if viewer.all_tenants() {
        "in every tenant".to_string()
    } else {
        format!("in tenant {}", viewer.principal.tenant)
    };
    html(
        StatusCode::OK,
        pages::list(
            viewer.pair(),
            &scope,
            &counts,
            &filters,
            &page,
            after.is_none(),
        ),
    )
}

async fn login_page(State(c): State<Console>, headers: HeaderMap) -> Response {
    if let Ok(Some(_)) = c.viewer(&headers).await {
        return Redirect::to("/console").into_response();
    }
    login_form(&c, StatusCode::OK, false)
}

/// The login form with a CSRF token this console issued, also set as the login cookie.
fn login_form(c: &Console, status: StatusCode, error: bool) -> Response {
    let nonce = c.inner.login_forms.issue();
    let mut r = html(status, pages::login(&nonce, error));
    if let Ok(v) = HeaderValue::from_str(&set_cookie(LOGIN_COOKIE, &nonce, LOGIN_FORM_SECS)) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

/// A form that changes something: its CSRF token and fields.
#[derive(Deserialize, Default)]
struct ChangeForm {
    #[serde(default)]
    csrf: Option<String>,
    #[serde(default)]
    token: Option<String>,
    #[serde(default, rename = "as")]
    outcome: Option<String>,
    #[serde(default)]
    reason: Option<String>,
    #[serde(default)]
    evidence: Option<String>,
    #[serde(default)]
    result: Option<String>,
    #[serde(default)]
    output_schema: Option<String>,
}

/// The form in `body`, at most [`FORM_LIMIT`] bytes, or the page refusing it: 413
/// `too_large`, 408 `body_timeout` (past the listener's body deadline; the connection is
/// closed), 400 `body_unreadable` or `invalid_arguments`.
async fn read_form(viewer: Option<&Viewer>, body: Body) -> Result<ChangeForm, Response> {
    match read_body(body, FORM_LIMIT).await {
        Ok(bytes) => serde_urlencoded::from_bytes(&bytes).map_err(|_| {
            refused(
                viewer,
                StatusCode::BAD_REQUEST,
                "invalid_arguments",
                "the form could not be read",
            )
        }),
        Err(BodyFailure::TooLarge) => Err(refused(
            viewer,
            StatusCode::PAYLOAD_TOO_LARGE,
            "too_large",
            "the form is larger than the console accepts",
        )),
        Err(BodyFailure::TimedOut) => {
            let mut r = refused(
                viewer,
                StatusCode::REQUEST_TIMEOUT,
                "body_timeout",
                "the form did not arrive in time",
            );
            r.headers_mut()
                .insert(header::CONNECTION, HeaderValue::from_static("close"));
            Err(r)
        }
        Err(BodyFailure::Unreadable) => Err(refused(
            viewer,
            StatusCode::BAD_REQUEST,
            "body_unreadable",
            "the form could not be read",
        )),
    }
}

fn csrf_refused(viewer: Option<&Viewer>) -> Response {
    refused(
        viewer,
        StatusCode::FORBIDDEN,
        "csrf_invalid",
        "the form's CSRF token is missing or wrong; reload the page and try again",
    )
}

async fn login(State(c): State<Console>, headers: HeaderMap, body: Body) -> Response {
    // Without the login page's cookie there is nothing the form could match: refused unread.
    let Some(expected) = cookie(&headers, LOGIN_COOKIE) else {
        return csrf_refused(None);
    };
    let f = match read_form(None, body).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    // The form's token must be the cookie's and one this console issued (used up here): a
    // cookie set by another page of the same host names no form of ours.
    let ok = f
        .csrf
        .as_deref()
        .is_some_and(|g| same(expected, g) && c.inner.login_forms.take(g));
    if !ok {
        return csrf_refused(None);
    }
    let token = f.token.unwrap_or_default();
    let token = token.trim();
    match c.inner.principals.resolve_token(token).await {
        Ok(Some((name, _))) => {
            let id = c.inner.sessions.start(&name, &token_id(&token_hash(token)));
            tracing::info!(target: "toolledger::console", principal = %name, "signed in");
            let mut r = Redirect::to("/console").into_response();
            let h = r.headers_mut();
            for v in [
                set_cookie(SESSION_COOKIE, &id, SESSION_SECS),
                set_cookie(LOGIN_COOKIE, "", 0),
            ] {
                if let Ok(v) = HeaderValue::from_str(&v) {
                    h.append(header::SET_COOKIE, v);
                }
            }
            r
        }
        Ok(None) => login_form(&c, StatusCode::UNAUTHORIZED, true),
        Err(_) => unavailable(None),
    }
}

async fn logout(State(c): State<Console>, headers: HeaderMap, body: Body) -> Response {
    let viewer = match c.viewer(&headers).await {
        Ok(Some(v)) => v,
        Ok(None) => return to_login(),
        Err(r) => return r,
    };
    let f = match read_form(Some(&viewer), body).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    if !f.csrf.as_deref().is_some_and(|g| same(&viewer.csrf, g)) {
        return csrf_refused(Some(&viewer));
    }
    if let Some(id) = cookie(&headers, SESSION_COOKIE) {
        c.inner.sessions.end(id);
    }
    let mut r = Redirect::to("/console/login").into_response();
    if let Ok(v) = HeaderValue::from_str(&set_cookie(SESSION_COOKIE, "", 0)) {
        r.headers_mut().append(header::SET_COOKIE, v);
    }
    r
}

/// The timeline of `status_ref` if `viewer` may see it.
async fn load(
    c: &Console,
    viewer: &Viewer,
    status_ref: &str,
) -> Result<serde_json::Value, Response> {
    if status_ref.is_empty() || status_ref.len() > 128 {
        return Err(not_found(viewer));
    }
    let now = c.inner.clock.now();
    let selector = Selector::StatusRef(status_ref.to_string());
    let found = c
        .inner
        .store
        .read(move |tx| -> Result<Found, toolledger::store::StoreError> {
            operations::timeline(tx, &selector, now)
        })
        .await
        .map_err(|_| unavailable(Some(viewer)))?;
    match found {
        Found::One(t)
            if t["operation"]["tenant"]
                .as_str()
                .is_some_and(|tenant| viewer.sees_tenant(tenant)) =>
        {
            Ok(*t)
        }
        _ => Err(not_found(viewer)),
    }
}

fn not_found(viewer: &Viewer) -> Response {
    refused(
        Some(viewer),
        StatusCode::NOT_FOUND,
        "not_found",
        "no operation with this status reference is visible to you",
    )
}

/// The outcomes an operation of `effect_kind` in `state` may be resolved as, or why none.
fn outcomes(effect_kind: &str, state: &str) -> Result<&'static [&'static str], &'static str> {
    match state {
        "succeeded" | "failed" | "applied" => {
            Err("This operation is finished; nothing to resolve.")
        }
        _ if effect_kind == "deferred" => Ok(&["failed", "succeeded"]),
        _ => Ok(&["applied", "partial"]),
    }
}

async fn render_operation(
    c: &Console,
    viewer: &Viewer,
    status_ref: &str,
    status: StatusCode,
    refusal: Option<(&str, &str)>,
) -> Response {
    let t = match load(c, viewer, status_ref).await {
        Ok(t) => t,
        Err(r) => return r,
    };
    let op = &t["operation"];
    let tenant = op["tenant"].as_str().unwrap_or_default();
    let own = tenant == viewer.principal.tenant
        && op["subject"].as_str() == Some(viewer.principal.subject.as_str());
    let operator_here = viewer.operator() && tenant == viewer.principal.tenant;
    let kind = op["effect_kind"].as_str().unwrap_or_default();
    let state = op["state"].as_str().unwrap_or_default();
    let (resolve_as, note): (&[&str], Option<&str>) = if !viewer.operator() {
        (&[], None)
    } else if !operator_here {
        (
            &[],
            Some("Only an operator of this operation's tenant can resolve it."),
        )
    } else {
        match outcomes(kind, state) {
            Ok(a) => (a, None),
            Err(n) => (&[], Some(n)),
        }
    };
    let downstream = match c.inner.evidence.get() {
        Some(ask) if operator_here && kind == "deferred" => Some(
            ask(viewer.name.clone(), status_ref.to_string())
                .await
                .map_err(|e| e.to_string()),
        ),
        _ => None,
    };
    let shown = Shown {
        timeline: &t,
        downstream: downstream.as_ref(),
        arguments: own,
        result: own || viewer.operator(),
        resolve_as,
        resolve_note: note,
        refusal,
    };
    html(status, pages::operation(viewer.pair(), &shown))
}

async fn operation_page(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(status_ref): Path<String>,
) -> Response {
    match c.viewer(&headers).await {
        Ok(Some(v)) => render_operation(&c, &v, &status_ref, StatusCode::OK, None).await,
        Ok(None) => to_login(),
        Err(r) => r,
    }
}

fn refusal_status(code: ErrorCode) -> StatusCode {
    match code {
        ErrorCode::PermissionDenied => StatusCode::FORBIDDEN,
        ErrorCode::NotFound => StatusCode::NOT_FOUND,
        ErrorCode::InvalidArguments => StatusCode::UNPROCESSABLE_ENTITY,
        ErrorCode::Unavailable => StatusCode::SERVICE_UNAVAILABLE,
        _ => StatusCode::CONFLICT,
    }
}

/// A form's JSON field: `None` when empty; the parsed value (an object when `object`), or
/// `why` when it is not.
fn json_field(
    text: Option<&str>,
    object: bool,
    why: &'static str,
) -> Result<Option<serde_json::Value>, &'static str> {
    match text.map(str::trim) {
        None | Some("") => Ok(None),
        Some(text) => {
            match toolledger::json::parse(text.as_bytes(), &toolledger::json::Limits::DEFAULT) {
                Ok(v) if v.is_object() || !object => Ok(Some(v)),
                _ => Err(why),
            }
        }
    }
}

async fn resolve(
    State(c): State<Console>,
    headers: HeaderMap,
    Path(status_ref): Path<String>,
    body: Body,
) -> Response {
    let viewer = match c.viewer(&headers).await {
        Ok(Some(v)) => v,
        Ok(None) => return to_login(),
        Err(r) => return r,
    };
    let f = match read_form(Some(&viewer), body).await {
        Ok(f) => f,
        Err(r) => return r,
    };
    if !f.csrf.as_deref().is_some_and(|g| same(&viewer.csrf, g)) {
        return csrf_refused(Some(&viewer));
    }
    if !viewer.operator() {
        return refused(
            Some(&viewer),
            StatusCode::FORBIDDEN,
            "permission_denied",
            "only principals holding the role operator can resolve operations",
        );
    }
    if let Err(r) = load(&c, &viewer, &status_ref).await {
        return r;
    }
    let Some(outcome) = f.outcome.as_deref().and_then(ResolveAs::parse) else {
        return render_operation(
            &c,
            &viewer,
            &status_ref,
            StatusCode::UNPROCESSABLE_ENTITY,
            Some(("invalid_arguments", "choose the outcome to record")),
        )
        .await;
    };
    let fields = (
        json_field(
            f.evidence.as_deref(),
            true,
            "the evidence must be a JSON object",
        ),
        json_field(f.result.as_deref(), false, "the result must be JSON"),
        json_field(
            f.output_schema.as_deref(),
            false,
            "the output schema must be JSON",
        ),
    );
    let (evidence, result, output_schema) = match fields {
        (Ok(e), Ok(r), Ok(o)) => (e, r, o),
        (Err(why), _, _) | (_, Err(why), _) | (_, _, Err(why)) => {
            return render_operation(
                &c,
                &viewer,
                &status_ref,
                StatusCode::UNPROCESSABLE_ENTITY,
                Some(("invalid_arguments", why)),
            )
            .await
        }
    };
    if output_schema.is_some() && result.is_none() {
        return render_operation(
            &c,
            &viewer,
            &status_ref,
            StatusCode::UNPROCESSABLE_ENTITY,
            Some((
                "invalid_arguments",
                "an output schema goes with a result, which it checks",
            )),
        )
        .await;
    }
    let confirmed = result.map(|result| ConfirmedResult {
        result,
        output_schema,
    });
    let resolution = Resolution {
        status_ref: status_ref.clone(),
        outcome,
        reason: f.reason.unwrap_or_default().replace("\r\n", "\n"),
        operator: viewer.name.clone(),
        evidence,
    };
    match (c.inner.resolver)(resolution, confirmed).await {
        Ok(Answer::Done { .. }) => Redirect::to(&format!(
            "/console/operations/{}",
            pages::encode(&status_ref)
        ))
        .into_response(),
        Ok(Answer::Unknown { .. }) => {
            render_operation(
                &c,
                &viewer,
                &status_ref,
                StatusCode::CONFLICT,
                Some(("outcome_unknown", "the operation is still unresolved")),
            )
            .await
        }
        Err(RuntimeError::Refused(e)) => {
            let code = e.code.as_str();
            render_operation(
                &c,
                &viewer,
                &status_ref,
                refusal_status(e.code),
                Some((code, &e.message)),
            )
            .await
        }
        Err(RuntimeError::Fenced(_)) => {
            render_operation(
                &c,
                &viewer,
                &status_ref,
                StatusCode::CONFLICT,
                Some((
                    "operation_in_progress",
                    "a worker claimed the operation meanwhile; nothing was changed",
                )),
            )
            .await
        }
        Err(RuntimeError::Store(_)) => unavailable(Some(&viewer)),
    }
}
