//! Which upstream tools require task execution (`execution.taskSupport: "required"`).
//!
//! Such a tool answers a plain `tools/call` with an error, so the proxy cannot guard it: the
//! ledger's forward is always a plain call. rmcp's `Tool` does not keep `execution`, so the
//! proxy reads the upstream's own `tools/list` answers: over stdio by watching the child's
//! output lines while the tools are listed ([`Tapped`]), over HTTP by listing them once more
//! itself ([`list_over_http`]).

use std::collections::BTreeSet;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use rmcp::service::{RxJsonRpcMessage, TxJsonRpcMessage};
use rmcp::transport::async_rw::AsyncRwTransport;
use rmcp::transport::Transport;
use rmcp::RoleClient;
use serde_json::{json, Value};
use tokio::io::{AsyncRead, ReadBuf};
use tokio::process::{Child, ChildStdin, ChildStdout};

/// The longest output line kept while listing (a larger `tools/list` page is not read).
const MAX_LINE: usize = 16 << 20;

/// What the upstream's `tools/list` answers said, gathered while [`TaskRequired::listing`].
#[derive(Debug, Default)]
pub struct TaskRequired {
    listing: AtomicBool,
    names: Mutex<BTreeSet<String>>,
}

impl TaskRequired {
    /// Starts watching for `tools/list` answers (clearing what an earlier listing found).
    pub fn start(&self) {
        if let Ok(mut names) = self.names.lock() {
            names.clear();
        }
        self.listing.store(true, Ordering::Release);
    }

    /// Stops watching; the names of the tools that require task execution.
    pub fn finish(&self) -> BTreeSet<String> {
        self.listing.store(false, Ordering::Release);
        self.names.lock().map(|n| n.clone()).unwrap_or_default()
    }

    fn listing(&self) -> bool {
        self.listing.load(Ordering::Acquire)
    }

    /// Records the tools of one JSON-RPC message, if it is a `tools/list` answer.
    fn record(&self, message: &Value) {
        let Some(tools) = message.pointer("/result/tools").and_then(Value::as_array) else {
            return;
        };
        let required = tools.iter().filter(|t| {
            t.pointer("/execution/taskSupport").and_then(Value::as_str) == Some("required")
        });
        if let Ok(mut names) = self.names.lock() {
            names.extend(
                required.filter_map(|t| t.get("name").and_then(Value::as_str).map(str::to_owned)),
            );
        }
    }
}

/// The child's stdout, read line by line by rmcp; while the tools are being listed, each
/// complete line that mentions `taskSupport` is also read here. Outside a listing it only
/// passes bytes on.
pub struct Tapped<R> {
    inner: R,
    seen: Arc<TaskRequired>,
    line: Vec<u8>,
    /// The current line grew beyond [`MAX_LINE`]: skipped to its end.
    skipping: bool,
}

impl<R> Tapped<R> {
    /// Wraps `inner`, reporting to `seen`.
    pub fn new(inner: R, seen: Arc<TaskRequired>) -> Self {
        Tapped {
            inner,
            seen,
            line: Vec::new(),
            skipping: false,
        }
    }

    fn take(&mut self, mut bytes: &[u8]) {
        if !self.seen.listing() {
            self.line.clear();
            self.skipping = false;
            return;
        }
        while !bytes.is_empty() {
            let end = bytes.iter().position(|&b| b == b'\n');
            let (part, rest) = match end {
                Some(i) => (&bytes[..i], &bytes[i + 1..]),
                None => (bytes, &[][..]),
            };
            if !self.skipping {
                if self.line.len() + part.len() > MAX_LINE {
                    self.skipping = true;
                    self.line = Vec::new();
                } else {
                    self.line.extend_from_slice(part);
                }
            }
            if end.is_some() {
                if !self.skipping && contains(&self.line, b"taskSupport") {
                    if let Ok(message) = serde_json::from_slice::<Value>(&self.line) {
                        self.seen.record(&message);
                    }
                }
                self.line.clear();
                self.skipping = false;
            }
            bytes = rest;
        }
    }
}

fn contains(haystack: &[u8], needle: &[u8]) -> bool {
    haystack.windows(needle.len()).any(|w| w == needle)
}

impl<R: AsyncRead + Unpin> AsyncRead for Tapped<R> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        let polled = Pin::new(&mut this.inner).poll_read(cx, buf);
        if let Poll::Ready(Ok(())) = polled {
            // Outside a listing (every call's answer) this is one atomic load.
            if this.seen.listing() || !this.line.is_empty() || this.skipping {
                this.take(&buf.filled()[before..]);
            }
        }
        polled
    }
}

/// Seconds the child has to exit after its stdin closes, and again after `SIGTERM`.
const EXIT_WAIT: Duration = Duration::from_secs(3);

/// The upstream child as rmcp's client transport: newline-delimited JSON-RPC on its stdin and
/// (tapped) stdout. Closing it closes stdin and waits for the child to exit, then sends
/// `SIGTERM`, then kills it; dropping it kills the child.
pub struct ChildTransport {
    child: Child,
    transport: AsyncRwTransport<RoleClient, Tapped<ChildStdout>, ChildStdin>,
}

impl ChildTransport {
    /// The transport over `child`, whose stdin and stdout must be piped.
    pub fn new(mut child: Child, seen: Arc<TaskRequired>) -> std::io::Result<Self> {
        let stdin = child.stdin.take();
        let stdout = child.stdout.take();
        let (Some(stdin), Some(stdout)) = (stdin, stdout) else {
            return Err(std::io::Error::other("the child's stdio is not piped"));
        };
        Ok(ChildTransport {
            child,
            transport: AsyncRwTransport::new_client(Tapped::new(stdout, seen), stdin),
        })
    }

    /// The child's process id.
    pub fn id(&self) -> Option<u32> {
        self.child.id()
    }
}

impl Transport<RoleClient> for ChildTransport {
    type Error = std::io::Error;

    fn send(
        &mut self,
        item: TxJsonRpcMessage<RoleClient>,
    ) -> impl std::future::Future<Output = Result<(), Self::Error>> + Send + 'static {
        self.transport.send(item)
    }

    fn receive(
        &mut self,
    ) -> impl std::future::Future<Output = Option<RxJsonRpcMessage<RoleClient>>> + Send {
        self.transport.receive()
    }

    async fn close(&mut self) -> Result<(), Self::Error> {
        self.transport.close().await?;
        if tokio::time::timeout(EXIT_WAIT, self.child.wait())
            .await
            .is_ok()
        {
            return Ok(());
        }
        #[cfg(unix)]
        if let Some(pid) = self.child.id() {
            // SAFETY: kill(2) on the pid of a child this process has not yet reaped.
            unsafe { libc::kill(pid as libc::pid_t, libc::SIGTERM) };
            if tokio::time::timeout(EXIT_WAIT, self.child.wait())
                .await
                .is_ok()
            {
                return Ok(());
            }
        }
        self.child.kill().await
    }
}

/// Lists an HTTP upstream's tools with a session of its own (the `initialize` handshake, every
/// `tools/list` page, then the session's end) and returns the names of those that require
/// task execution. Best effort: `Err` says why it could not tell.
pub async fn list_over_http(
    url: &str,
    headers: &[(String, String)],
) -> Result<BTreeSet<String>, String> {
    let client = reqwest::Client::builder()
        .timeout(Duration::from_secs(30))
        .build()
        .map_err(|e| e.to_string())?;
    let mut session = Session {
        client,
        url: url.to_owned(),
        headers: headers.to_vec(),
        id: None,
        version: None,
    };
    let init = session
        .request(
            1,
            "initialize",
            json!({
                "protocolVersion": "2025-06-18",
                "capabilities": {},
                "clientInfo": {"name": "toolledger-proxy", "version": env!("CARGO_PKG_VERSION")},
            }),
        )
        .await?;
    session.version = init
        .pointer("/result/protocolVersion")
        .and_then(Value::as_str)
        .map(str::to_owned);
    session.notify("notifications/initialized").await?;
    let seen = TaskRequired::default();
    let mut cursor: Option<String> = None;
    for page in 0..crate::upstream::MAX_LIST_PAGES as u64 {
        let params = match &cursor {
            Some(c) => json!({"cursor": c}),
            None => json!({}),
        };
        let answer = session.request(2 + page, "tools/list", params).await?;
        seen.record(&answer);
        cursor = answer
            .pointer("/result/nextCursor")
            .and_then(Value::as_str)
            .map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    session.end().await;
    Ok(seen.names.into_inner().unwrap_or_default())
}

/// One side session with an HTTP upstream.
struct Session {
    client: reqwest::Client,
    url: String,
    headers: Vec<(String, String)>,
    id: Option<String>,
    version: Option<String>,
}

impl Session {
    fn post(&self, body: &Value) -> reqwest::RequestBuilder {
        let mut request = self
            .client
            .post(&self.url)
            .header("accept", "application/json, text/event-stream")
            .header("content-type", "application/json")
            .body(body.to_string());
        for (name, value) in &self.headers {
            request = request.header(name, value);
        }
        if let Some(id) = &self.id {
            request = request.header("mcp-session-id", id);
        }
        if let Some(v) = &self.version {
            request = request.header("mcp-protocol-version", v);
        }
        request
    }

    /// One request and its answer (a JSON body, or the matching event of an SSE stream).
    async fn request(&mut self, id: u64, method: &str, params: Value) -> Result<Value, String> {
        let body = json!({"jsonrpc": "2.0", "id": id, "method": method, "params": params});
        let response = self
            .post(&body)
            .send()
            .await
            .map_err(|e| format!("{method}: {}", without_url(e)))?;
        if !response.status().is_success() {
            return Err(format!("{method}: HTTP {}", response.status().as_u16()));
        }
        if let Some(session) = response.headers().get("mcp-session-id") {
            self.id = session.to_str().ok().map(str::to_owned);
        }
        let sse = response
            .headers()
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .is_some_and(|v| v.starts_with("text/event-stream"));
        // Read up to the largest message the proxy takes, never the whole of a flood.
        let mut response = response;
        let mut body = Vec::new();
        while let Some(chunk) = response
            .chunk()
            .await
            .map_err(|e| format!("{method}: {}", without_url(e)))?
        {
            if body.len() + chunk.len() > MAX_LINE {
                return Err(format!(
                    "{method}: the answer exceeds {} MiB",
                    MAX_LINE >> 20
                ));
            }
            body.extend_from_slice(&chunk);
        }
        let text = String::from_utf8_lossy(&body);
        let messages: Vec<Value> = if sse {
            text.lines()
                .filter_map(|l| l.strip_prefix("data:"))
                .filter_map(|d| serde_json::from_str(d.trim()).ok())
                .collect()
        } else {
            serde_json::from_str(&text).into_iter().collect()
        };
        let answer = messages
            .into_iter()
            .find(|m| m.get("id") == Some(&json!(id)))
            .ok_or_else(|| format!("{method}: no answer"))?;
        if answer.get("error").is_some() {
            return Err(format!("{method}: the upstream answered with an error"));
        }
        Ok(answer)
    }

    async fn notify(&self, method: &str) -> Result<(), String> {
        let body = json!({"jsonrpc": "2.0", "method": method});
        let response = self
            .post(&body)
            .send()
            .await
            .map_err(|e| format!("{method}: {}", without_url(e)))?;
        if response.status().is_success() {
            Ok(())
        } else {
            Err(format!("{method}: HTTP {}", response.status().as_u16()))
        }
    }

    /// Ends the side session (an upstream without sessions answers 405; either is fine).
    async fn end(&self) {
        if let Some(id) = &self.id {
            let mut request = self.client.delete(&self.url).header("mcp-session-id", id);
            for (name, value) in &self.headers {
                request = request.header(name, value);
            }
            let _ = request.send().await;
        }
    }
}

/// A reqwest error's text without the URL it names.
fn without_url(e: reqwest::Error) -> String {
    e.without_url().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    #[tokio::test]
    async fn a_listing_records_the_tools_that_require_tasks_even_across_reads() {
        let seen = Arc::new(TaskRequired::default());
        let page = json!({"jsonrpc": "2.0", "id": 3, "result": {"tools": [
            {"name": "research", "inputSchema": {}, "execution": {"taskSupport": "required"}},
            {"name": "maybe", "inputSchema": {}, "execution": {"taskSupport": "optional"}},
            {"name": "plain", "inputSchema": {}},
        ]}});
        let mut bytes = format!("{}\n{page}\n", json!({"jsonrpc": "2.0", "method": "x"}));
        bytes.push_str(r#"{"jsonrpc":"2.0","id":4,"result":{"tools":[{"name":"later","execution":{"taskSupport":"required"}}]}}"#);
        bytes.push('\n');
        // One byte at a time: a line split over many reads is still one line.
        let reader = tokio_test_reader(bytes.clone().into_bytes());
        let mut tapped = Tapped::new(reader, seen.clone());
        seen.start();
        let mut out = Vec::new();
        tapped.read_to_end(&mut out).await.unwrap();
        assert_eq!(out, bytes.as_bytes(), "the bytes pass through unchanged");
        let names: Vec<_> = seen.finish().into_iter().collect();
        assert_eq!(names, ["later", "research"]);

        // Outside a listing nothing is recorded.
        let mut tapped = Tapped::new(tokio_test_reader(bytes.into_bytes()), seen.clone());
        tapped.read_to_end(&mut Vec::new()).await.unwrap();
        seen.start();
        assert!(seen.finish().is_empty());
    }

    /// A reader that hands out one byte per read.
    fn tokio_test_reader(bytes: Vec<u8>) -> impl AsyncRead + Unpin {
        struct OneByte(std::collections::VecDeque<u8>);
        impl AsyncRead for OneByte {
            fn poll_read(
                mut self: Pin<&mut Self>,
                _cx: &mut Context<'_>,
                buf: &mut ReadBuf<'_>,
            ) -> Poll<std::io::Result<()>> {
                if let Some(b) = self.0.pop_front() {
                    buf.put_slice(&[b]);
                }
                Poll::Ready(Ok(()))
            }
        }
        OneByte(bytes.into())
    }
}
