//! Hostile sockets against `serve --http` and the `--metrics` listener: connections that send
//! nothing, send their request head slowly, idle between requests, or send their body slowly
//! are closed after their timeouts (set small here); a listener whose connection cap is full of
//! idle sockets serves a valid caller once they time out; a slow body frees its request slot,
//! on `/mcp` and on the console's forms alike; one principal cannot take every slot from
//! another; `/metrics` answers the hosts `/mcp` answers, within its in-flight limit, and reads
//! the ledger at most once per window however often it is scraped. No duration is asserted
//! beyond "before the test's own bound".

#[macro_use]
mod support;
#[path = "support/raw.rs"]
mod raw;

use std::io::{ErrorKind, Read, Write};
use std::net::TcpStream;
use std::process::Stdio;
use std::time::{Duration, Instant};

use raw::{HttpResponse, RawHttp};
use serde_json::json;
use support::wire::*;

/// How long a test waits for the server to close a connection it should close.
const BOUND: Duration = Duration::from_secs(20);

/// Whether the server closed `stream` (end of stream or reset) before [`BOUND`], reading and
/// discarding whatever it sends first.
fn closed_by_server(stream: &mut TcpStream) -> bool {
    stream.set_read_timeout(Some(BOUND)).unwrap();
    let mut buf = [0u8; 4096];
    loop {
        match stream.read(&mut buf) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn health(addr: &str) -> String {
    format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\n\r\n")
}

fn tools_list(addr: &str, token: &str) -> String {
    let mut meta = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/list", "params": {}});
    meta["params"]["_meta"] = support::wire::meta();
    let body = meta.to_string();
    format!(
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n\
         Content-Length: {}\r\n\r\n{body}",
        body.len()
    )
}

/// Sends `request` on a new connection and reads the whole answer.
fn exchange(addr: &str, request: &str) -> String {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(BOUND)).unwrap();
    s.write_all(request.as_bytes()).unwrap();
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    String::from_utf8_lossy(&out).into_owned()
}

/// A `tools/list` POST whose body never arrives in full: `Content-Length` says 200, 10 bytes
/// are sent. Returns the open connection.
fn slow_body(addr: &str, token: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nAuthorization: Bearer {token}\r\n\
         Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
         MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/list\r\n\
         Content-Length: 200\r\n\r\n{{\"jsonrpc\""
    )
    .unwrap();
    s
}

fn principal(db: &Db, name: &str) -> String {
    add_principal(db, name, "acme", &["editor"], &["automation:write"], true).unwrap()
}

/// `/metrics` answers a loopback name or an allowed host in `Host` (as `/mcp` does), and
/// refuses another name or address (a page that rebinds its DNS name to the server sends its own
/// name); `10.20.30.40` is allowed by the caller.
fn assert_metrics_readers(addr: &str) {
    let get = |host: &str, origin: Option<&str>| {
        let origin = origin.map_or(String::new(), |o| format!("Origin: {o}\r\n"));
        exchange(
            addr,
            &format!("GET /metrics HTTP/1.1\r\nHost: {host}\r\n{origin}Connection: close\r\n\r\n"),
        )
    };
    assert!(get(addr, None).starts_with("HTTP/1.1 200"));
    assert!(get("10.20.30.40:9100", None).starts_with("HTTP/1.1 200"));
    let address = get("[fd00::1]:9100", None);
    assert!(address.starts_with("HTTP/1.1 403"), "{address}");
    let rebound = get("evil.example:9100", None);
    assert!(rebound.starts_with("HTTP/1.1 403"), "{rebound}");
    assert!(rebound.contains("host_not_allowed"), "{rebound}");
    let foreign = get(addr, Some("http://evil.example"));
    assert!(foreign.starts_with("HTTP/1.1 403"), "{foreign}");
}

#[test]
fn metrics_on_the_http_listener_refuse_foreign_host_names() {
    let db = Db::sqlite();
    let server = RawHttp::start(&db, &["--allowed-host", "10.20.30.40"], &[]);
    assert_metrics_readers(&server.addr);
}

#[test]
fn idle_slow_and_kept_alive_connections_are_closed() {
    let db = Db::sqlite();
    let server = RawHttp::start(&db, &["--header-timeout", "1"], &[]);
    // A connection that sends nothing.
    let mut silent = TcpStream::connect(&server.addr).unwrap();
    assert!(
        closed_by_server(&mut silent),
        "an idle connection stays open"
    );
    // A head sent a byte at a time: the timeout covers the whole head, not each byte.
    let mut slow = TcpStream::connect(&server.addr).unwrap();
    let head = health(&server.addr);
    let started = Instant::now();
    let mut refused = false;
    for b in head.as_bytes().iter().take(head.len() - 2) {
        if slow.write_all(&[*b]).is_err() || started.elapsed() > BOUND {
            refused = true;
            break;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(
        refused || closed_by_server(&mut slow),
        "a slow head keeps its connection"
    );
    // A kept-alive connection: served, then closed once it idles.
    let mut kept = TcpStream::connect(&server.addr).unwrap();
    kept.write_all(head.as_bytes()).unwrap();
    kept.set_read_timeout(Some(BOUND)).unwrap();
    let mut first = [0u8; 12];
    kept.read_exact(&mut first).unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");
    assert!(closed_by_server(&mut kept), "an idle kept-alive connection");
}

#[test]
fn a_cap_full_of_idle_sockets_serves_a_caller_once_they_time_out() {
    let db = Db::sqlite();
    let server = RawHttp::start(
        &db,
        &["--header-timeout", "2", "--max-connections", "4"],
        &[],
    );
    let idle: Vec<TcpStream> = (0..4)
        .map(|_| TcpStream::connect(&server.addr).unwrap())
        .collect();
    let answer = exchange(
        &server.addr,
        &format!(
            "GET /healthz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            server.addr
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer:?}");
    drop(idle);
}

#[test]
fn a_slow_body_is_refused_and_frees_its_slot() {
    let db = Db::sqlite();
    let token = principal(&db, "alice");
    let server = RawHttp::start(&db, &["--body-timeout", "1", "--max-in-flight", "1"], &[]);
    let mut s = slow_body(&server.addr, &token);
    s.set_read_timeout(Some(BOUND)).unwrap();
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    let r = String::from_utf8_lossy(&raw);
    assert!(r.starts_with("HTTP/1.1 408"), "{r}");
    assert!(r.contains("body_timeout"), "{r}");
    // The only request slot is free again.
    let served = exchange(&server.addr, &tools_list(&server.addr, &token));
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    assert!(served.contains("get_operation_status"), "{served}");
}

#[test]
fn one_principal_cannot_take_every_slot() {
    let db = Db::sqlite();
    let alice = principal(&db, "alice");
    let bob = principal(&db, "bob");
    let server = RawHttp::start(
        &db,
        &["--max-in-flight-per-principal", "1", "--body-timeout", "30"],
        &[],
    );
    // Alice's one share is held by a body that is still arriving. Until the server has read
    // that request's head her share is free, and a request of hers that comes first takes it
    // (the slow one is then refused and closed). On a busy machine that can outlast any fixed
    // pause, so a probe that is served starts over with a new slow body and a longer pause.
    let until = Instant::now() + BOUND;
    let mut pause = Duration::from_millis(300);
    let (holding, refused) = loop {
        let holding = slow_body(&server.addr, &alice);
        std::thread::sleep(pause);
        let answer = exchange(&server.addr, &tools_list(&server.addr, &alice));
        if !answer.starts_with("HTTP/1.1 200") {
            break (holding, answer);
        }
        assert!(
            Instant::now() < until,
            "alice's second request was never refused: {answer}"
        );
        pause *= 2;
    };
    let r = HttpResponse::parse_text(&refused);
    assert_eq!(r.status, 503, "{refused}");
    assert_eq!(r.header("retry-after"), Some("1"), "{refused}");
    assert_eq!(r.json()["error"]["code"], "unavailable", "{refused}");
    // Bob is served meanwhile.
    let served = exchange(&server.addr, &tools_list(&server.addr, &bob));
    assert!(served.starts_with("HTTP/1.1 200"), "{served}");
    drop(holding);
    // Once alice's request is gone, her share is back.
    let until = Instant::now() + BOUND;
    loop {
        let again = exchange(&server.addr, &tools_list(&server.addr, &alice));
        if again.starts_with("HTTP/1.1 200") {
            break;
        }
        assert!(
            Instant::now() < until,
            "alice's share never came back: {again}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

#[test]
fn the_metrics_listener_is_bounded_and_answers_health() {
    let db = Db::sqlite();
    principal(&db, "alice");
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let addr = format!("127.0.0.1:{port}");
    let mut child = serve_command(
        &db,
        &[
            "--principal".into(),
            "alice".into(),
            "--metrics".into(),
            addr.clone(),
            "--header-timeout".into(),
            "1".into(),
        ],
    )
    .env("TOOLLEDGER_ALLOWED_HOSTS", "10.20.30.40")
    .stdin(Stdio::piped())
    .stdout(Stdio::null())
    .stderr(Stdio::null())
    .spawn()
    .unwrap();
    let until = Instant::now() + BOUND;
    while TcpStream::connect(&addr).is_err() {
        assert!(
            Instant::now() < until,
            "the metrics listener never listened"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let answer = exchange(
        &addr,
        &format!("GET /healthz HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"ok\""), "{answer}");
    assert_metrics_readers(&addr);
    let mut silent = TcpStream::connect(&addr).unwrap();
    assert!(closed_by_server(&mut silent), "an idle metrics connection");
    let _ = child.kill();
    let _ = child.wait();
}

/// A console login form whose body never arrives in full (`Content-Length` says 200; a byte
/// is sent now and then until the server closes the connection).
fn slow_console_form(addr: &str) -> TcpStream {
    let mut s = TcpStream::connect(addr).unwrap();
    write!(
        s,
        "POST /console/login HTTP/1.1\r\nHost: {addr}\r\n\
         Cookie: toolledger_console_login=x\r\n\
         Content-Type: application/x-www-form-urlencoded\r\n\
         Content-Length: 200\r\n\r\ncsrf="
    )
    .unwrap();
    let mut trickle = s.try_clone().unwrap();
    std::thread::spawn(move || {
        let until = Instant::now() + BOUND;
        while Instant::now() < until && trickle.write_all(b"a").is_ok() {
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    s
}

/// Every connection the listener allows held by a console form sent a byte at a time: the
/// console's bodies have the listener's body deadline, so the connections are answered 408 and
/// closed, and `/mcp` is answered.
#[test]
fn slow_console_bodies_do_not_hold_the_listener() {
    let db = Db::sqlite();
    let token = principal(&db, "alice");
    let server = RawHttp::start(
        &db,
        &["--console", "--max-connections", "3", "--body-timeout", "1"],
        &[],
    );
    let mut slow: Vec<TcpStream> = (0..3).map(|_| slow_console_form(&server.addr)).collect();
    let served = exchange(&server.addr, &tools_list(&server.addr, &token));
    assert!(served.starts_with("HTTP/1.1 200"), "{served:?}");
    assert!(served.contains("get_operation_status"), "{served}");
    let health = exchange(
        &server.addr,
        &format!(
            "GET /healthz HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
            server.addr
        ),
    );
    assert!(health.starts_with("HTTP/1.1 200"), "{health:?}");
    // A slow form was answered 408 `body_timeout` and closed.
    let first = &mut slow[0];
    first.set_read_timeout(Some(BOUND)).unwrap();
    let mut raw = Vec::new();
    let _ = first.read_to_end(&mut raw);
    let r = String::from_utf8_lossy(&raw);
    assert!(r.starts_with("HTTP/1.1 408"), "{r}");
    assert!(r.contains("body_timeout"), "{r}");
}

/// The sum of the `toolledger_operations` gauges of a `/metrics` answer.
fn operations_gauge(metrics: &str) -> i64 {
    metrics
        .lines()
        .filter(|l| l.starts_with("toolledger_operations{"))
        .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap() as i64)
        .sum()
}

fn scrape(addr: &str) -> String {
    let answer = exchange(
        addr,
        &format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    answer
}

fn create_automation(addr: &str, token: &str, request_id: &str) {
    let mut call = json!({"jsonrpc": "2.0", "id": 1, "method": "tools/call", "params": {
        "name": "create_automation",
        "arguments": {"request_id": request_id, "interval_minutes": 30},
    }});
    call["params"]["_meta"] = support::wire::meta();
    let body = call.to_string();
    let answer = exchange(
        addr,
        &format!(
            "POST /mcp HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nAuthorization: Bearer {token}\r\n\
             Content-Type: application/json\r\nAccept: application/json, text/event-stream\r\n\
             MCP-Protocol-Version: 2026-07-28\r\nMcp-Method: tools/call\r\nMcp-Name: create_automation\r\n\
             Content-Length: {}\r\n\r\n{body}",
            body.len()
        ),
    );
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.contains("\"isError\":false"), "{answer}");
}

/// Two scrapes within the gauges' window read the ledger once: an operation made between them
/// shows only at a scrape after the window.
#[test]
fn metrics_read_the_ledger_at_most_once_per_window() {
    /// `LEDGER_GAUGES_EVERY`: a pair of scrapes further apart than this proves nothing.
    const WINDOW: Duration = Duration::from_secs(5);
    let db = Db::sqlite();
    let token = principal(&db, "alice");
    let server = RawHttp::start(&db, &[], &[]);
    let mut made = 0;
    let mut attempts = 0;
    let before = loop {
        attempts += 1;
        assert!(attempts <= 5, "no two scrapes came within the window");
        let started = Instant::now();
        let first = operations_gauge(&scrape(&server.addr));
        made += 1;
        create_automation(&server.addr, &token, &format!("auto-{made}"));
        let second = operations_gauge(&scrape(&server.addr));
        if started.elapsed() < WINDOW {
            assert_eq!(
                second, first,
                "the second scrape within the window read the ledger again"
            );
            break first;
        }
        // Too slow a machine for this pair: a scrape after the window, and another pair.
        std::thread::sleep(WINDOW);
    };
    // After the window, a scrape reads the ledger again and shows the new operation.
    let until = Instant::now() + BOUND;
    loop {
        let now = operations_gauge(&scrape(&server.addr));
        if now > before {
            assert_eq!(now, made, "every operation made is counted");
            break;
        }
        assert!(Instant::now() < until, "the gauges were never read again");
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// `/metrics` is served within the in-flight limit `/mcp` is: while a slow body holds the only
/// slot, a scrape is answered 503 `unavailable` with `Retry-After: 1`.
#[test]
fn metrics_share_the_in_flight_limit() {
    let db = Db::sqlite();
    let token = principal(&db, "alice");
    let server = RawHttp::start(&db, &["--max-in-flight", "1", "--body-timeout", "30"], &[]);
    // Until the server has read the slow request's head the slot is free, and the scrape takes
    // it; a scrape that is served starts over with a longer pause.
    let until = Instant::now() + BOUND;
    let mut pause = Duration::from_millis(300);
    let (holding, refused) = loop {
        let holding = slow_body(&server.addr, &token);
        std::thread::sleep(pause);
        let answer = exchange(
            &server.addr,
            &format!(
                "GET /metrics HTTP/1.1\r\nHost: {}\r\nConnection: close\r\n\r\n",
                server.addr
            ),
        );
        if !answer.starts_with("HTTP/1.1 200") {
            break (holding, answer);
        }
        assert!(
            Instant::now() < until,
            "a scrape was never refused: {answer}"
        );
        pause *= 2;
    };
    let r = HttpResponse::parse_text(&refused);
    assert_eq!(r.status, 503, "{refused}");
    assert_eq!(r.header("retry-after"), Some("1"), "{refused}");
    assert_eq!(r.json()["error"]["code"], "unavailable", "{refused}");
    drop(holding);
}
