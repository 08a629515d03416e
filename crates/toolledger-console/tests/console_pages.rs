//! The console's pages over HTTP requests (no browser), on SQLite and PostgreSQL: login and
//! sessions, CSRF, tenants, what each viewer is shown, resolution through the resolver,
//! pagination, and escaping.

use std::sync::Arc;

use axum::body::Body;
use axum::http::{header, Request, StatusCode};
use axum::Router;
use http_body_util::BodyExt;
use serde_json::{json, Value};
use tower::ServiceExt;

use toolledger::authz::PrincipalStore;
use toolledger::clock::{ManualClock, SharedClock};
use toolledger::effect::EffectTx;
use toolledger::engine::{Begun, Engine, InlineEffect};
use toolledger::runtime::{Registry, Resolution, Runtime};
use toolledger::store::Store;
use toolledger::{Error, OperationState, Principal};
use toolledger_console::{ConfirmedResult, Console, Resolver};
use toolledger_mcp::wire::http::AllowedHosts;
use toolledger_testkit::calls::{inline_call, principal};
use toolledger_testkit::db::{PgSchema, SqliteFile};

const NOW: i64 = 1_767_225_600;
const XSS_TOOL: &str = "<script>alert('tool')</script>";

struct Step;

impl InlineEffect for Step {
    fn apply(&self, _tx: &mut dyn EffectTx, _p: &Principal) -> Result<Value, Error> {
        Ok(json!({"step": 1}))
    }
}

struct World {
    store: Store,
    clock: ManualClock,
    app: Router,
    tokens: std::collections::HashMap<&'static str, String>,
}

async fn world(store: Store) -> World {
    let clock = ManualClock::new(NOW);
    let shared: SharedClock = Arc::new(clock.clone());
    let principals = PrincipalStore::new(store.clone()).with_clock(shared.clone());
    let mut tokens = std::collections::HashMap::new();
    for (name, tenant, roles) in [
        ("olga", "acme", vec!["operator"]),
        ("alice", "acme", vec![]),
        ("bob", "acme", vec![]),
        ("zed", "globex", vec!["operator"]),
        ("root", "ops", vec!["operator_all_tenants"]),
    ] {
        let roles: Vec<String> = roles.into_iter().map(String::from).collect();
        let t = principals
            .add(name, tenant, &roles, &[], true)
            .await
            .unwrap()
            .unwrap();
        tokens.insert(name, t);
    }
    // The resolver: the runtime's resolution (inline operations need no tool).
    let rt = Runtime::new(store.clone(), shared.clone(), Registry::new());
    let resolver: Resolver = Arc::new(move |r: Resolution, _: Option<ConfirmedResult>| {
        let rt = rt.clone();
        Box::pin(async move { rt.resolve(&r).await })
    });
    let console = Console::new(store.clone(), principals, shared, resolver);
    World {
        store,
        clock,
        app: console.router(AllowedHosts::loopback()),
        tokens,
    }
}

/// A partial inline operation of `tool` by `who` in `tenant`.
async fn partial(w: &World, tenant: &str, who: &str, tool: &str, key: &str) -> String {
    let engine = Engine::new(w.store.clone(), Arc::new(w.clock.clone()));
    let call = inline_call(
        &principal(tenant, who),
        tool,
        key,
        json!({"order_id": "o-1", "note": "alice-private-value"}),
    );
    let Begun::Started {
        operation_id,
        status_ref,
        ..
    } = engine.begin_steps(call, Arc::new(Step)).await.unwrap()
    else {
        panic!("started")
    };
    engine
        .finish_steps(
            operation_id,
            OperationState::Partial,
            json!({"step": 1, "watcher": "failed"}),
            vec![],
        )
        .await
        .unwrap();
    status_ref
}

/// An inline operation left `in_progress` by `who`.
async fn in_progress(w: &World, who: &str, key: &str) -> String {
    let engine = Engine::new(w.store.clone(), Arc::new(w.clock.clone()));
    let call = inline_call(
        &principal("acme", who),
        "create_issue",
        key,
        json!({"n": 1}),
    );
    match engine.begin_steps(call, Arc::new(Step)).await.unwrap() {
        Begun::Started { status_ref, .. } => status_ref,
        other => panic!("{other:?}"),
    }
}

struct Reply {
    status: StatusCode,
    headers: axum::http::HeaderMap,
    body: String,
}

async fn send(app: &Router, req: Request<Body>) -> Reply {
    let r = app.clone().oneshot(req).await.unwrap();
    let status = r.status();
    let headers = r.headers().clone();
    let body = r.into_body().collect().await.unwrap().to_bytes();
    Reply {
        status,
        headers,
        body: String::from_utf8(body.to_vec()).unwrap(),
    }
}

fn get(path: &str, cookie: Option<&str>) -> Request<Body> {
    let mut b = Request::get(path).header(header::HOST, "127.0.0.1");
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    b.body(Body::empty()).unwrap()
}

fn post(path: &str, cookie: Option<&str>, form: &[(&str, &str)]) -> Request<Body> {
    let body: Vec<String> = form
        .iter()
        .map(|(k, v)| format!("{k}={}", toolledger_console::pages::encode(v)))
        .collect();
    let mut b = Request::post(path)
        .header(header::HOST, "127.0.0.1")
        .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded");
    if let Some(c) = cookie {
        b = b.header(header::COOKIE, c);
    }
    b.body(Body::from(body.join("&"))).unwrap()
}

fn csrf_of(body: &str) -> String {
    let at = body.find("name=\"csrf\" value=\"").expect("a csrf field") + 19;
    body[at..at + 64].to_string()
}

fn set_cookies(r: &Reply) -> Vec<String> {
    r.headers
        .get_all(header::SET_COOKIE)
        .iter()
        .map(|v| v.to_str().unwrap().to_string())
        .collect()
}

/// Logs `who` in; returns (session cookie, csrf token of its forms).
async fn login(w: &World, who: &str) -> (String, String) {
    login_with(w, &w.tokens[who]).await
}

/// Logs in with bearer token `token`; returns (session cookie, csrf token of its forms).
async fn login_with(w: &World, token: &str) -> (String, String) {
    let page = send(&w.app, get("/console/login", None)).await;
    let nonce = csrf_of(&page.body);
    let login_cookie = format!("toolledger_console_login={nonce}");
    let r = send(
        &w.app,
        post(
            "/console/login",
            Some(&login_cookie),
            &[("csrf", &nonce), ("token", token)],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    let session = set_cookies(&r)
        .into_iter()
        .find(|c| c.starts_with("toolledger_console="))
        .expect("a session cookie");
    assert!(session.contains("HttpOnly"), "{session}");
    assert!(session.contains("SameSite=Strict"), "{session}");
    let cookie = session.split(';').next().unwrap().to_string();
    let list = send(&w.app, get("/console", Some(&cookie))).await;
    assert_eq!(list.status, StatusCode::OK);
    let csrf = csrf_of(&list.body);
    (cookie, csrf)
}

async fn state_of(store: &Store, status_ref: &str) -> String {
    let r = status_ref.to_string();
    store
        .read(move |tx| {
            let row = tx.query_opt(
                "SELECT state FROM operations WHERE status_ref = ?1",
                &[r.as_str().into()],
            )?;
            Ok::<_, Error>(row.map(|r| toolledger::effect::RowExt::text(&r, 0).unwrap()))
        })
        .await
        .unwrap()
        .unwrap()
}

async fn events(store: &Store) -> i64 {
    toolledger_testkit::db::count(store, "operation_events").await
}

async fn scenario(store: Store) {
    let w = world(store).await;

    // Without a session every page leads to the login form.
    let r = send(&w.app, get("/console", None)).await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    assert_eq!(r.headers[header::LOCATION], "/console/login");
    // A foreign Host is refused before anything else.
    let foreign = Request::get("/console/login")
        .header(header::HOST, "evil.example")
        .body(Body::empty())
        .unwrap();
    assert_eq!(send(&w.app, foreign).await.status, StatusCode::FORBIDDEN);

    // Login: a form without its CSRF token, or with a wrong token, opens no session.
    let r = send(
        &w.app,
        post("/console/login", None, &[("token", &w.tokens["olga"])]),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.body.contains("csrf_invalid"));
    assert!(set_cookies(&r)
        .iter()
        .all(|c| !c.starts_with("toolledger_console=")));
    let page = send(&w.app, get("/console/login", None)).await;
    let nonce = csrf_of(&page.body);
    let r = send(
        &w.app,
        post(
            "/console/login",
            Some(&format!("toolledger_console_login={nonce}")),
            &[("csrf", &nonce), ("token", "tl_not_a_token")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNAUTHORIZED);
    assert!(
        !r.body.contains("tl_not_a_token"),
        "the token is never echoed"
    );

    let mine = partial(&w, "acme", "alice", XSS_TOOL, "k-1").await;
    let theirs = partial(&w, "globex", "gina", "create_issue", "k-2").await;
    let young = in_progress(&w, "alice", "k-3").await;

    // The operator of acme sees acme's partial operation, escaped, and not globex's.
    let (olga, olga_csrf) = login(&w, "olga").await;
    let list = send(&w.app, get("/console", Some(&olga))).await;
    assert!(list.body.contains(&mine), "{}", list.body);
    assert!(!list.body.contains(&theirs));
    assert!(!list.body.contains(XSS_TOOL));
    assert!(list
        .body
        .contains("&lt;script&gt;alert('tool')&lt;/script&gt;"));
    assert!(
        !list.body.contains(&young),
        "in_progress is listed only once stuck"
    );
    assert!(list.headers[header::CONTENT_SECURITY_POLICY]
        .to_str()
        .unwrap()
        .contains("default-src 'none'"));
    // Once past the in-progress expiry it is listed as stuck, with its count and age.
    w.clock.advance(400);
    let list = send(&w.app, get("/console?kind=stuck", Some(&olga))).await;
    assert!(list.body.contains(&young), "{}", list.body);
    assert!(!list.body.contains(&mine), "the kind filter");
    assert!(list.body.contains("oldest 6m 40s"), "{}", list.body);
    let list = send(&w.app, get("/console?older_than=bad", Some(&olga))).await;
    assert_eq!(list.status, StatusCode::BAD_REQUEST);

    // The operator sees the result and the resolve form, but not alice's argument values.
    let path = format!("/console/operations/{mine}");
    let op = send(&w.app, get(&path, Some(&olga))).await;
    assert_eq!(op.status, StatusCode::OK);
    assert!(op.body.contains("id=\"resolve\""));
    assert!(!op.body.contains("alice-private-value"));
    assert!(!op.body.contains("o-1"));
    assert!(
        op.body.contains("order_id, note") || op.body.contains("note, order_id"),
        "member names are shown"
    );
    assert!(op.body.contains("watcher"), "the stored result is shown");
    // Another tenant's operation is not found for olga, but visible to an all-tenants
    // principal, who cannot resolve it.
    let other = send(
        &w.app,
        get(&format!("/console/operations/{theirs}"), Some(&olga)),
    )
    .await;
    assert_eq!(other.status, StatusCode::NOT_FOUND);
    let (root, _) = login(&w, "root").await;
    let everywhere = send(&w.app, get("/console", Some(&root))).await;
    assert!(everywhere.body.contains(&mine) && everywhere.body.contains(&theirs));
    let seen = send(
        &w.app,
        get(&format!("/console/operations/{theirs}"), Some(&root)),
    )
    .await;
    assert_eq!(seen.status, StatusCode::OK);
    assert!(!seen.body.contains("id=\"resolve\""));

    // alice, its principal, sees her arguments; bob, same tenant, sees neither them nor
    // the result, and no resolve form.
    let (alice, _) = login(&w, "alice").await;
    let own = send(&w.app, get(&path, Some(&alice))).await;
    assert!(own.body.contains("alice-private-value"));
    assert!(!own.body.contains("id=\"resolve\""));
    let (bob, bob_csrf) = login(&w, "bob").await;
    let theirs_page = send(&w.app, get(&path, Some(&bob))).await;
    assert!(!theirs_page.body.contains("alice-private-value"));
    assert!(!theirs_page.body.contains("watcher"));
    assert!(!theirs_page.body.contains("id=\"resolve\""));

    let resolve_path = format!("{path}/resolve");
    let before = events(&w.store).await;
    // A forged POST by a non-operator is refused.
    let r = send(
        &w.app,
        post(
            &resolve_path,
            Some(&bob),
            &[("csrf", &bob_csrf), ("as", "applied"), ("reason", "x")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.body.contains("permission_denied"));
    // A POST without the CSRF token, or with another session's, is refused.
    let r = send(
        &w.app,
        post(
            &resolve_path,
            Some(&olga),
            &[("as", "applied"), ("reason", "x")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    assert!(r.body.contains("csrf_invalid"));
    let r = send(
        &w.app,
        post(
            &resolve_path,
            Some(&olga),
            &[("csrf", &bob_csrf), ("as", "applied"), ("reason", "x")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    // The runtime's refusals reach the page: a deferred outcome for an inline operation,
    // an empty reason.
    let r = send(
        &w.app,
        post(
            &resolve_path,
            Some(&olga),
            &[("csrf", &olga_csrf), ("as", "succeeded"), ("reason", "x")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
    assert!(r.body.contains("invalid_arguments"));
    let r = send(
        &w.app,
        post(
            &resolve_path,
            Some(&olga),
            &[("csrf", &olga_csrf), ("as", "applied"), ("reason", "")],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY);
    // A result that is not JSON, or an output schema without the result it checks, is
    // refused before anything is asked of the runtime.
    for (fields, why) in [
        (
            vec![("result", "{not json"), ("output_schema", "{}")],
            "the result must be JSON",
        ),
        (
            vec![("result", "{}"), ("output_schema", "{not json")],
            "the output schema must be JSON",
        ),
        (
            vec![("output_schema", "{\"type\": \"object\"}")],
            "an output schema goes with a result",
        ),
    ] {
        let mut form = vec![
            ("csrf", olga_csrf.as_str()),
            ("as", "applied"),
            ("reason", "checked by hand"),
        ];
        form.extend(fields);
        let r = send(&w.app, post(&resolve_path, Some(&olga), &form)).await;
        assert_eq!(r.status, StatusCode::UNPROCESSABLE_ENTITY, "{}", r.body);
        assert!(r.body.contains(why), "{why}: {}", r.body);
    }
    assert_eq!(events(&w.store).await, before, "refusals change nothing");
    assert_eq!(state_of(&w.store, &mine).await, "partial");

    // The operator resolves it; the reason is shown as text; it leaves the list.
    let reason = "watcher added by hand <script>alert('reason')</script>";
    let r = send(
        &w.app,
        post(
            &resolve_path,
            Some(&olga),
            &[("csrf", &olga_csrf), ("as", "applied"), ("reason", reason)],
        ),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
    assert_eq!(state_of(&w.store, &mine).await, "applied");
    assert_eq!(events(&w.store).await, before + 1);
    let op = send(&w.app, get(&path, Some(&olga))).await;
    assert!(op
        .body
        .contains("&lt;script&gt;alert('reason')&lt;/script&gt;"));
    assert!(!op.body.contains("<script>"));
    assert!(!op.body.contains("Not resolved by an operator"));
    let list = send(&w.app, get("/console", Some(&olga))).await;
    assert!(!list.body.contains(&mine));

    // Sign-out needs the CSRF token, then ends the session.
    let r = send(&w.app, post("/console/logout", Some(&olga), &[])).await;
    assert_eq!(r.status, StatusCode::FORBIDDEN);
    let r = send(
        &w.app,
        post("/console/logout", Some(&olga), &[("csrf", &olga_csrf)]),
    )
    .await;
    assert_eq!(r.status, StatusCode::SEE_OTHER);
    let r = send(&w.app, get("/console", Some(&olga))).await;
    assert_eq!(r.headers[header::LOCATION], "/console/login");
}

async fn pagination(store: Store) {
    let w = world(store).await;
    let mut refs = Vec::new();
    for i in 0..55 {
        refs.push(partial(&w, "acme", "alice", "create_issue", &format!("p-{i:03}")).await);
    }
    let (olga, _) = login(&w, "olga").await;
    let first = send(&w.app, get("/console?kind=partial", Some(&olga))).await;
    assert!(first.body.contains(&refs[54]), "newest first");
    assert!(first.body.contains(&refs[5]));
    assert!(!first.body.contains(&refs[4]));
    assert!(first.body.contains(">55<"), "the count: {}", first.body);
    let at = first.body.find("id=\"next\" href=\"").unwrap() + 16;
    let end = first.body[at..].find('"').unwrap();
    let next = first.body[at..at + end].replace("&amp;", "&");
    let second = send(&w.app, get(&next, Some(&olga))).await;
    for r in &refs[..5] {
        assert!(second.body.contains(r));
    }
    assert!(!second.body.contains(&refs[5]));
    assert!(!second.body.contains("id=\"next\""));
}

fn block_on(fut: impl std::future::Future<Output = ()>) {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap()
        .block_on(fut)
}

fn sqlite() -> (SqliteFile, Store) {
    let f = SqliteFile::new("ledger.sqlite");
    let store = Store::from(f.open_with(SqliteFile::options(None, &[])).unwrap());
    (f, store)
}

#[test]
fn pages_sessions_and_resolution_on_sqlite() {
    let (_f, store) = sqlite();
    block_on(scenario(store));
}

#[test]
fn pages_sessions_and_resolution_on_postgres() {
    let Some(pg) = PgSchema::new() else { return };
    let store = pg.open(pg.options(None, &[])).unwrap();
    block_on(scenario(store));
}

#[test]
fn the_list_is_paginated_on_sqlite() {
    let (_f, store) = sqlite();
    block_on(pagination(store));
}

#[test]
fn the_list_is_paginated_on_postgres() {
    let Some(pg) = PgSchema::new() else { return };
    let store = pg.open(pg.options(None, &[])).unwrap();
    block_on(pagination(store));
}

/// Cookies are `Secure` when the operator says the console is reached over TLS, or when the
/// request came through a TLS-terminating proxy (`X-Forwarded-Proto: https`); not otherwise.
#[test]
fn cookies_are_secure_behind_tls() {
    let (_f, store) = sqlite();
    block_on(async move {
        let w = world(store).await;
        let login_cookie = |r: &Reply| {
            set_cookies(r)
                .into_iter()
                .find(|c| c.starts_with("toolledger_console_login="))
                .expect("a login cookie")
        };
        let plain = send(&w.app, get("/console/login", None)).await;
        assert!(
            !login_cookie(&plain).contains("Secure"),
            "{plain:?}",
            plain = plain.headers
        );
        let forwarded = Request::get("/console/login")
            .header(header::HOST, "127.0.0.1")
            .header("x-forwarded-proto", "https")
            .body(Body::empty())
            .unwrap();
        let r = send(&w.app, forwarded).await;
        assert!(login_cookie(&r).ends_with("; Secure"), "{:?}", r.headers);
        let rt = Runtime::new(w.store.clone(), Arc::new(w.clock.clone()), Registry::new());
        let resolver: Resolver = Arc::new(move |r: Resolution, _: Option<ConfirmedResult>| {
            let rt = rt.clone();
            Box::pin(async move { rt.resolve(&r).await })
        });
        let principals = PrincipalStore::new(w.store.clone());
        let secure = Console::new(
            w.store.clone(),
            principals,
            Arc::new(w.clock.clone()),
            resolver,
        )
        .with_secure_cookies(true)
        .router(AllowedHosts::loopback());
        let r = send(&secure, get("/console/login", None)).await;
        assert!(login_cookie(&r).ends_with("; Secure"), "{:?}", r.headers);
    });
}

/// Whether `cookie` opens the list (a live session) rather than leading to the login form.
async fn signed_in(w: &World, cookie: &str) -> bool {
    let r = send(&w.app, get("/console", Some(cookie))).await;
    match r.status {
        StatusCode::OK => true,
        StatusCode::SEE_OTHER => {
            assert_eq!(r.headers[header::LOCATION], "/console/login");
            false
        }
        other => panic!("unexpected {other}: {}", r.body),
    }
}

/// A session is bound to the token it was opened with: revoking that token ends it at the
/// next request, while a session opened with another token of the same principal goes on
/// until the principal is deactivated.
#[test]
fn a_session_ends_with_its_token() {
    let (_f, store) = sqlite();
    block_on(async move {
        let w = world(store).await;
        let principals = PrincipalStore::new(w.store.clone());
        let first = w.tokens["olga"].clone();
        let toolledger::authz::TokenIssue::Issued(second) =
            principals.issue_token("olga").await.unwrap()
        else {
            panic!("a second token")
        };
        let (by_first, _) = login_with(&w, &first).await;
        let (by_second, _) = login_with(&w, &second.token).await;
        assert!(signed_in(&w, &by_first).await && signed_in(&w, &by_second).await);

        let first_id = toolledger::authz::token_id(&toolledger::authz::token_hash(&first));
        let revoked = principals.revoke_token("olga", &first_id).await.unwrap();
        assert!(matches!(
            revoked,
            toolledger::authz::TokenRevoke::Revoked { .. }
        ));
        assert!(
            !signed_in(&w, &by_first).await,
            "the revoked token's session is over"
        );
        assert!(
            signed_in(&w, &by_second).await,
            "the other token's session stays"
        );
        // Signing the revoked token's session out needs a session: it leads to the login form.
        let r = send(&w.app, get("/console", Some(&by_first))).await;
        assert_eq!(r.status, StatusCode::SEE_OTHER);

        principals.revoke("olga", &[], &[], true).await.unwrap();
        assert!(
            !signed_in(&w, &by_second).await,
            "a deactivated principal's sessions are over"
        );
    });
}

/// A login form posted from a page of another origin — another port of the same host, the
/// other scheme — is refused before anything is read; and a login CSRF token is one the console
/// issued, once: a cookie and form field another page made up together open no session.
#[test]
fn login_csrf_needs_the_consoles_own_origin_and_token() {
    let (_f, store) = sqlite();
    block_on(async move {
        let w = world(store).await;
        let sessions_opened = |r: &Reply| {
            set_cookies(r)
                .iter()
                .any(|c| c.starts_with("toolledger_console=") && !c.contains("Max-Age=0"))
        };
        let login_post = |host: &str, origin: Option<&str>, cookie: &str, csrf: &str| {
            let mut b = Request::post("/console/login")
                .header(header::HOST, host)
                .header(header::CONTENT_TYPE, "application/x-www-form-urlencoded")
                .header(header::COOKIE, format!("toolledger_console_login={cookie}"));
            if let Some(o) = origin {
                b = b.header(header::ORIGIN, o);
            }
            let form = format!("csrf={csrf}&token={}", w.tokens["zed"]);
            b.body(Body::from(form)).unwrap()
        };

        // A page on another port (or over the other scheme) of the console's host.
        for origin in [
            "http://localhost:9999",
            "http://localhost",
            "https://localhost:8090",
        ] {
            let page = send(&w.app, get("/console/login", None)).await;
            let nonce = csrf_of(&page.body);
            let r = send(
                &w.app,
                login_post("localhost:8090", Some(origin), &nonce, &nonce),
            )
            .await;
            assert_eq!(r.status, StatusCode::FORBIDDEN, "{origin}: {}", r.body);
            assert!(r.body.contains("origin_not_allowed"), "{}", r.body);
            assert!(!sessions_opened(&r), "{origin}");
        }

        // A cookie tossed by another page, with the same made-up value in the form.
        let made_up = "ab".repeat(32);
        let r = send(
            &w.app,
            login_post("localhost:8090", None, &made_up, &made_up),
        )
        .await;
        assert_eq!(r.status, StatusCode::FORBIDDEN, "{}", r.body);
        assert!(r.body.contains("csrf_invalid"));
        assert!(!sessions_opened(&r));

        // The console's own origin, with a token it issued: signed in, once.
        let page = send(&w.app, get("/console/login", None)).await;
        let nonce = csrf_of(&page.body);
        let r = send(
            &w.app,
            login_post(
                "localhost:8090",
                Some("http://localhost:8090"),
                &nonce,
                &nonce,
            ),
        )
        .await;
        assert_eq!(r.status, StatusCode::SEE_OTHER, "{}", r.body);
        assert!(sessions_opened(&r));
        let again = send(&w.app, login_post("localhost:8090", None, &nonce, &nonce)).await;
        assert_eq!(
            again.status,
            StatusCode::FORBIDDEN,
            "a login token is used once"
        );
        assert!(!sessions_opened(&again));
    });
}
