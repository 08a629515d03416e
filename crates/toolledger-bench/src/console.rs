//! The `console-list` workload: what the operator console's list page costs on a large ledger.
//!
//! The ledger is seeded first (untimed) exactly as for `operations-list` ([`listing::seed`]):
//! `--list-rows` operations (default 100,000), one in a thousand left `in_progress`, the rest
//! `applied`. The console serves it on a loopback port in this process, its clock set past
//! the in-progress expiry so the unfinished operations are listed as stuck; an operator
//! signs in once. Then `ops` requests of the first list page (`GET /console`: the counts per
//! kind and the oldest ages, and the newest 50 unsure operations, rendered as HTML), one
//! keep-alive HTTP/1.1 connection per caller. A request counts as succeeded when it answered
//! 200 with the rows the seed implies. The line carries `rows` (the operations in the ledger).

use std::sync::Arc;

use http_body_util::{BodyExt, Full};
use hyper::body::Bytes;
use toolledger::authz::PrincipalStore;
use toolledger::clock::{Clock, ManualClock, SharedClock, SystemClock};
use toolledger::runtime::{Resolution, RuntimeError};
use toolledger::Error;
use toolledger_console::{Console, Resolver, PAGE_ROWS};
use toolledger_mcp::wire::http::AllowedHosts;

use super::listing;
use super::mcp::{http_connection, HttpConnection};
use super::report::Report;
use super::run::drive;
use super::{bench_engine, Tuning};

/// The cookies a response sets, as `name=value` pairs.
fn cookies(response: &hyper::Response<hyper::body::Incoming>) -> Vec<String> {
    response
        .headers()
        .get_all(hyper::header::SET_COOKIE)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .filter_map(|v| v.split(';').next())
        .map(str::to_string)
        .collect()
}

/// Signs the operator in over `conn`; returns the session cookie.
async fn sign_in(conn: &mut HttpConnection, host: &str, token: &str) -> Option<String> {
    let page = hyper::Request::get("/console/login")
        .header("host", host)
        .body(Full::new(Bytes::new()))
        .ok()?;
    // The connection takes its next request only once it has finished the last one.
    conn.ready().await.ok()?;
    let response = conn.send_request(page).await.ok()?;
    let login_cookie = cookies(&response)
        .into_iter()
        .find(|c| c.starts_with("toolledger_console_login="))?;
    let _ = response.into_body().collect().await.ok()?;
    let nonce = login_cookie.split_once('=')?.1.to_string();
    let form = format!(
        "csrf={nonce}&token={}",
        toolledger_console::pages::encode(token)
    );
    let post = hyper::Request::post("/console/login")
        .header("host", host)
        .header("cookie", login_cookie)
        .header("content-type", "application/x-www-form-urlencoded")
        .body(Full::new(Bytes::from(form)))
        .ok()?;
    conn.ready().await.ok()?;
    let response = conn.send_request(post).await.ok()?;
    let Some(session) = cookies(&response)
        .into_iter()
        .find(|c| c.starts_with("toolledger_console="))
    else {
        // Said on stderr, so a failed run says why.
        eprintln!(
            "{}",
            serde_json::json!({"phase": "login", "status": response.status().as_u16()})
        );
        return None;
    };
    let _ = response.into_body().collect().await.ok()?;
    Some(session)
}

/// One request of the first list page; whether it showed `expected` rows.
async fn list(conn: &mut HttpConnection, host: &str, cookie: &str, expected: usize) -> bool {
    let Ok(req) = hyper::Request::get("/console")
        .header("host", host)
        .header("cookie", cookie)
        .body(Full::new(Bytes::new()))
    else {
        return false;
    };
    if conn.ready().await.is_err() {
        return false;
    }
    let Ok(response) = conn.send_request(req).await else {
        return false;
    };
    let ok = response.status() == hyper::StatusCode::OK;
    let Ok(body) = response.into_body().collect().await else {
        return false;
    };
    let body = body.to_bytes();
    ok && String::from_utf8_lossy(&body)
        .matches("data-status-ref=")
        .count()
        == expected
}

/// Seeds `rows` operations, then measures the list page with `concurrency` callers.
pub async fn run(
    db: std::path::PathBuf,
    concurrency: usize,
    ops: usize,
    rows: usize,
    tuning: Tuning,
) -> Result<Vec<Report>, &'static str> {
    let engine = bench_engine(&db, tuning)?;
    let unsure = listing::seed(&engine, rows).await?;
    let store = engine.store().clone();
    let later = SystemClock.now() + 2 * toolledger::operations::IN_PROGRESS_EXPIRY_SECS;
    let clock: SharedClock = Arc::new(ManualClock::new(later));
    let principals = PrincipalStore::new(store.clone()).with_clock(clock.clone());
    let token = principals
        .add("bench-operator", "bench", &["operator".into()], &[], true)
        .await
        .ok()
        .flatten()
        .ok_or("BENCH_SEED_FAILED")?;
    let resolver: Resolver = Arc::new(|_: Resolution, _| {
        Box::pin(async {
            Err(RuntimeError::Refused(Error::denied(
                "the benchmark resolves nothing",
            )))
        })
    });
    let app = Console::new(store, principals, clock, resolver).router(AllowedHosts::loopback());
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .map_err(|_| "BIND_ERROR")?;
    let addr = listener.local_addr().map_err(|_| "BIND_ERROR")?.to_string();
    let server = tokio::spawn(async move { axum::serve(listener, app).await });
    let mut first = http_connection(&addr).await.ok_or("BENCH_CONNECT_FAILED")?;
    let cookie = sign_in(&mut first, &addr, &token)
        .await
        .ok_or("BENCH_LOGIN_FAILED")?;
    let pool = Arc::new(tokio::sync::Mutex::new(vec![first]));
    for _ in 1..concurrency {
        let conn = http_connection(&addr).await.ok_or("BENCH_CONNECT_FAILED")?;
        pool.lock().await.push(conn);
    }
    let expected = unsure.min(PAGE_ROWS as usize);
    let measured = drive("console-list", concurrency, ops, {
        let (pool, addr, cookie) = (pool.clone(), addr.clone(), cookie.clone());
        move |_| {
            let (pool, addr, cookie) = (pool.clone(), addr.clone(), cookie.clone());
            async move {
                let Some(mut conn) = pool.lock().await.pop() else {
                    return false;
                };
                let ok = list(&mut conn, &addr, &cookie, expected).await;
                if ok {
                    pool.lock().await.push(conn);
                }
                ok
            }
        }
    })
    .await;
    server.abort();
    let mut r = Report::new("console-list", concurrency, ops, measured);
    r.rows = Some(rows);
    Ok(vec![r])
}
