//! Raw access to `toolledger serve` for the wire-entry tests: a stdio server fed arbitrary
//! bytes (not only valid UTF-8 lines), and an HTTP server spoken to with hand-written HTTP/1.1
//! requests carrying any headers and any body.
//!
//! A test file takes it beside `support` with `#[path = "support/raw.rs"] mod raw;`.

#![allow(dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::process::{Child, ChildStdin, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::Value;

use crate::support::wire::{serve_command, Ledger};
use toolledger_testkit::stdio::wait_listening;

/// A `toolledger serve` on stdio, written to byte for byte.
pub struct RawStdio {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
}

impl RawStdio {
    /// Starts the server on `db` as `principal` with `extra` flags.
    pub fn start<L: Ledger + ?Sized>(db: &L, principal: &str, extra: &[&str]) -> RawStdio {
        let mut args = vec!["--principal".to_string(), principal.to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child = serve_command(db, &args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let stdout = child.stdout.take().unwrap();
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        RawStdio {
            stdin: child.stdin.take(),
            child,
            lines: rx,
        }
    }

    /// Writes `bytes` as they are (no newline added).
    pub fn write(&mut self, bytes: &[u8]) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(bytes).unwrap();
        stdin.flush().unwrap();
    }

    /// Writes `bytes` and a newline.
    pub fn line(&mut self, bytes: &[u8]) {
        self.write(bytes);
        self.write(b"\n");
    }

    /// Writes `message` as one JSON line.
    pub fn send(&mut self, message: &Value) {
        self.line(message.to_string().as_bytes());
    }

    /// The next line from the server, parsed (panics after 60 s without one).
    pub fn recv(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .expect("no reply from the server");
        serde_json::from_str(&line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}"))
    }

    /// Closes stdin and waits for the exit code.
    pub fn finish(mut self) -> i32 {
        self.stdin.take();
        self.child.wait().unwrap().code().unwrap_or(-1)
    }
}

impl Drop for RawStdio {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// A `toolledger serve --http` process.
pub struct RawHttp {
    /// The process.
    pub child: Child,
    /// `127.0.0.1:PORT`, where it listens.
    pub addr: String,
}

impl Drop for RawHttp {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl RawHttp {
    /// Stops the server as an operator does (SIGTERM: it finishes what is in flight and writes
    /// its last log lines) and returns its exit code.
    pub fn stop(mut self) -> i32 {
        // SAFETY: a signal to our own child process.
        unsafe { libc::kill(self.child.id() as i32, libc::SIGTERM) };
        self.child.wait().unwrap().code().unwrap_or(-1)
    }

    /// Starts `serve --http 127.0.0.1:0` on `db` with `extra` flags and `env` variables.
    pub fn start<L: Ledger + ?Sized>(db: &L, extra: &[&str], env: &[(&str, &str)]) -> RawHttp {
        RawHttp::start_logging(db, extra, env).0
    }

    /// [`RawHttp::start`], with every stderr line after the listening address sent to the
    /// receiver (the server's log; stderr is drained whether or not it is read).
    pub fn start_logging<L: Ledger + ?Sized>(
        db: &L,
        extra: &[&str],
        env: &[(&str, &str)],
    ) -> (RawHttp, Receiver<String>) {
        let mut args = vec!["--http".to_string(), "127.0.0.1:0".to_string()];
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut child = serve_command(db, &args)
            .env_remove("TOOLLEDGER_ALLOWED_HOSTS")
            .envs(env.iter().copied())
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let (url, rx) = wait_listening(child.stderr.take().unwrap());
        let addr = url
            .trim_start_matches("http://")
            .trim_end_matches("/mcp")
            .to_string();
        (RawHttp { child, addr }, rx)
    }

    /// Sends `method path` with `headers` (a `Host` naming the listening address unless
    /// `headers` has one) and `body`; returns the response.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> HttpResponse {
        exchange(&self.addr, method, path, headers, body)
            .unwrap_or_else(|| panic!("no HTTP response from {}", self.addr))
    }

    /// A JSON POST to `/mcp` with `headers` (after the content negotiation headers).
    pub fn post(&self, headers: &[(&str, &str)], body: &[u8]) -> HttpResponse {
        let mut all = vec![
            ("Content-Type", "application/json"),
            ("Accept", "application/json, text/event-stream"),
        ];
        all.extend_from_slice(headers);
        self.request("POST", "/mcp", &all, body)
    }
}

/// Sends `method path` with `headers` (a `Host` naming `addr` unless `headers` has one) and
/// `body` on a new connection to `addr`, and reads the response to the connection's end;
/// `None` when nothing listens there or the answer is not HTTP.
pub fn exchange(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Option<HttpResponse> {
    let mut head = format!("{method} {path} HTTP/1.1\r\nConnection: close\r\n");
    if !headers.iter().any(|(k, _)| k.eq_ignore_ascii_case("host")) {
        head.push_str(&format!("Host: {addr}\r\n"));
    }
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut stream = TcpStream::connect(addr).ok()?;
    stream
        .set_read_timeout(Some(Duration::from_secs(60)))
        .ok()?;
    stream.write_all(head.as_bytes()).ok()?;
    // The server may answer (413) before it has read all of a large body.
    let _ = stream.write_all(body);
    let mut raw = Vec::new();
    let _ = stream.read_to_end(&mut raw);
    HttpResponse::try_parse(&raw)
}

/// The CSRF token the first form of a console page carries.
pub fn console_csrf(page: &str) -> String {
    let at = page
        .find("name=\"csrf\" value=\"")
        .expect("a form with a CSRF token")
        + 19;
    let end = page[at..].find('"').expect("the token's end");
    page[at..at + end].to_string()
}

/// A console session on `addr` (`host:port`) for the principal whose bearer token is `token`,
/// signed in through the login form: the `Cookie` header's value that carries it.
pub fn console_sign_in(addr: &str, token: &str) -> String {
    let form = exchange(addr, "GET", "/console/login", &[], b"").expect("the login form");
    let nonce = console_csrf(&form.body);
    let cookie = format!("toolledger_console_login={nonce}");
    let signed = exchange(
        addr,
        "POST",
        "/console/login",
        &[
            ("Cookie", &cookie),
            ("Content-Type", "application/x-www-form-urlencoded"),
        ],
        format!("csrf={nonce}&token={token}").as_bytes(),
    )
    .expect("an answer to the login");
    assert_eq!(signed.status, 303, "{}", signed.body);
    signed
        .headers
        .iter()
        .find(|(k, v)| k.eq_ignore_ascii_case("set-cookie") && v.starts_with("toolledger_console="))
        .map(|(_, v)| v.split(';').next().unwrap().to_string())
        .expect("a session cookie")
}

/// `fields` as an `application/x-www-form-urlencoded` body.
pub fn form_body(fields: &[(&str, &str)]) -> String {
    fields
        .iter()
        .map(|(k, v)| format!("{k}={}", toolledger_console::pages::encode(v)))
        .collect::<Vec<_>>()
        .join("&")
}

/// One HTTP response.
#[derive(Debug)]
pub struct HttpResponse {
    /// The status code.
    pub status: u16,
    /// The headers, in order.
    pub headers: Vec<(String, String)>,
    /// The body (de-chunked).
    pub body: String,
}

impl HttpResponse {
    /// The response in `raw`, as read from a connection.
    pub fn parse_text(raw: &str) -> HttpResponse {
        HttpResponse::parse(raw.as_bytes())
    }

    fn parse(raw: &[u8]) -> HttpResponse {
        HttpResponse::try_parse(raw)
            .unwrap_or_else(|| panic!("no HTTP response: {:?}", String::from_utf8_lossy(raw)))
    }

    fn try_parse(raw: &[u8]) -> Option<HttpResponse> {
        let raw = String::from_utf8_lossy(raw).into_owned();
        let (head, rest) = raw.split_once("\r\n\r\n")?;
        let mut lines = head.lines();
        let status = lines
            .next()
            .filter(|l| l.starts_with("HTTP/"))
            .and_then(|l| l.split(' ').nth(1))
            .and_then(|s| s.parse().ok())?;
        let headers: Vec<(String, String)> = lines
            .filter_map(|l| l.split_once(':'))
            .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
            .collect();
        let chunked = headers
            .iter()
            .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
        let body = if chunked {
            dechunk(rest)
        } else {
            rest.to_string()
        };
        Some(HttpResponse {
            status,
            headers,
            body,
        })
    }

    /// The value of header `name`.
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    /// The JSON body, or the JSON-RPC message of an SSE response.
    pub fn json(&self) -> Value {
        if let Ok(v) = serde_json::from_str(&self.body) {
            return v;
        }
        self.body
            .lines()
            .filter_map(|l| l.strip_prefix("data:"))
            .filter_map(|d| serde_json::from_str::<Value>(d.trim()).ok())
            .find(|v| v.get("jsonrpc").is_some())
            .unwrap_or_else(|| panic!("no JSON-RPC message in: {}", self.body))
    }
}

fn dechunk(mut raw: &str) -> String {
    let mut out = String::new();
    while let Some((size, rest)) = raw.split_once("\r\n") {
        let n = usize::from_str_radix(size.trim(), 16).unwrap_or(0);
        if n == 0 {
            break;
        }
        out.push_str(&rest[..n]);
        raw = &rest[n + 2..];
    }
    out
}
