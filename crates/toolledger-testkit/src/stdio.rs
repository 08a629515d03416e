//! A spawned MCP server speaking newline-delimited JSON-RPC over its stdio, driven with raw
//! lines: the one server spawner the wire tests of every server use (`toolledger serve`, an
//! example server). MCP 2026-07-28 requests carry their per-request `_meta` ([`meta`]).
//!
//! A server started on HTTP says where it listens with a `{"listening": URL}` line on its
//! stderr: [`wait_listening`] waits for it (and keeps the pipe drained).

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};

/// One running stdio MCP server.
pub struct Server {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: i64,
}

impl Server {
    /// Spawns `command` (a stdio server) with piped stdin and stdout, stderr discarded.
    pub fn spawn(command: Command) -> Server {
        Server::spawn_with_stderr(command, Stdio::null())
    }

    /// Spawns `command` with piped stdin and stdout, and stderr to `stderr` (a log file, say).
    pub fn spawn_with_stderr(mut command: Command, stderr: Stdio) -> Server {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .spawn()
            .unwrap();
        let rx = line_reader(child.stdout.take().unwrap());
        Server {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            next_id: 1,
        }
    }

    /// The server's process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Writes one raw line.
    pub fn send_line(&mut self, line: &str) {
        let stdin = self.stdin.as_mut().unwrap();
        stdin.write_all(line.as_bytes()).unwrap();
        stdin.write_all(b"\n").unwrap();
        stdin.flush().unwrap();
    }

    /// Sends `message` as one JSON line.
    pub fn send(&mut self, message: &Value) {
        self.send_line(&message.to_string());
    }

    /// The next line from the server, parsed (panics after 60 s without one).
    pub fn recv(&mut self) -> Value {
        let line = self
            .lines
            .recv_timeout(Duration::from_secs(60))
            .expect("no reply from the server");
        serde_json::from_str(&line).unwrap()
    }

    /// The next line, or `None` if stdout closes first.
    pub fn try_recv(&mut self) -> Option<Value> {
        match self.lines.recv_timeout(Duration::from_secs(60)) {
            Ok(line) => Some(serde_json::from_str(&line).unwrap()),
            Err(_) => None,
        }
    }

    fn id(&mut self) -> i64 {
        let id = self.next_id;
        self.next_id += 1;
        id
    }

    /// Sends a 2026-07-28 `tools/call` (no initialize; per-request `_meta`) and returns the
    /// whole JSON-RPC response.
    pub fn call_raw(&mut self, params: Value) -> Value {
        let id = self.id();
        self.send_call(id, params);
        let reply = self.recv();
        assert_eq!(reply["id"], id, "reply to another request: {reply}");
        reply
    }

    /// Sends a 2026-07-28 `tools/call` under the caller's request `id` without waiting (for
    /// the same request to several servers at once); [`Server::recv_result`] reads its reply.
    pub fn send_call(&mut self, id: i64, params: Value) {
        let mut params = params;
        params["_meta"] = meta();
        self.send(&json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params}));
    }

    /// The `result` of the next reply, which must answer request `id`.
    pub fn recv_result(&mut self, id: i64) -> Value {
        let reply = self.recv();
        assert_eq!(reply["id"], id, "reply to another request: {reply}");
        reply["result"].clone()
    }

    /// `tools/call` returning the `result` object.
    pub fn call(&mut self, name: &str, arguments: Value) -> Value {
        let r = self.call_raw(json!({"name": name, "arguments": arguments}));
        r["result"].clone()
    }

    /// A continuation: same arguments plus `requestState` and `inputResponses`; returns the
    /// `result` object.
    pub fn resume(&mut self, name: &str, arguments: Value, state: &str, responses: Value) -> Value {
        self.resume_reply(name, arguments, state, responses)["result"].clone()
    }

    /// A continuation returning the whole JSON-RPC reply (for refusals that are protocol
    /// errors, such as an invalid `requestState`).
    pub fn resume_reply(
        &mut self,
        name: &str,
        arguments: Value,
        state: &str,
        responses: Value,
    ) -> Value {
        self.call_raw(json!({
            "name": name,
            "arguments": arguments,
            "requestState": state,
            "inputResponses": responses,
        }))
    }

    /// `get_operation_status` structured content.
    pub fn status(&mut self, operation_id: &str) -> Value {
        let r = self.call(
            "get_operation_status",
            json!({"operation_id": operation_id}),
        );
        assert_eq!(r["isError"], false, "{r}");
        r["structuredContent"].clone()
    }

    /// Closes stdin and waits for the exit code.
    pub fn finish(mut self) -> i32 {
        self.stdin.take();
        self.child.wait().unwrap().code().unwrap_or(-1)
    }

    /// Waits for the process to exit by itself (e.g. a fault) and returns its exit code.
    pub fn wait_exit(mut self) -> i32 {
        self.child.wait().unwrap().code().unwrap_or(-1)
    }

    /// Kills the process (SIGKILL) and reaps it.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// The lines `from` yields, read on a thread of its own, until it ends (or the receiver is
/// dropped).
pub fn line_reader(from: impl std::io::Read + Send + 'static) -> Receiver<String> {
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        for line in BufReader::new(from).lines() {
            let Ok(line) = line else { break };
            if tx.send(line).is_err() {
                break;
            }
        }
    });
    rx
}

/// The URL of a `{"listening": URL}` line (what a server started on a port of its choosing
/// prints on stderr once it accepts connections); `None` for any other line.
pub fn listening_url(line: &str) -> Option<String> {
    serde_json::from_str::<Value>(line)
        .ok()?
        .get("listening")?
        .as_str()
        .map(str::to_string)
}

/// Waits for a spawned server's `{"listening": URL}` line on `stderr` (its piped stderr) and
/// returns the URL, with a receiver of the lines after it. `stderr` is read to its end on a
/// thread of its own, so the server never blocks on a full pipe: lines before that one are
/// passed over, lines after it arrive on the receiver (or are dropped with it). Panics, with
/// the lines read, when stderr ends without that line, or when none comes within 60 s.
pub fn wait_listening(stderr: impl std::io::Read + Send + 'static) -> (String, Receiver<String>) {
    let (found_tx, found_rx) = channel::<Result<String, Vec<String>>>();
    let (tx, rx) = channel();
    std::thread::spawn(move || {
        let mut reader = BufReader::new(stderr);
        let mut next_line = move || {
            let mut buf = Vec::new();
            match reader.read_until(b'\n', &mut buf) {
                Ok(0) | Err(_) => None,
                Ok(_) => Some(
                    String::from_utf8_lossy(&buf)
                        .trim_end_matches(['\n', '\r'])
                        .to_string(),
                ),
            }
        };
        let mut before = Vec::new();
        while let Some(line) = next_line() {
            if let Some(url) = listening_url(&line) {
                let _ = found_tx.send(Ok(url));
                while let Some(line) = next_line() {
                    let _ = tx.send(line);
                }
                return;
            }
            before.push(line);
        }
        let _ = found_tx.send(Err(before));
    });
    match found_rx.recv_timeout(Duration::from_secs(60)) {
        Ok(Ok(url)) => (url, rx),
        Ok(Err(before)) => panic!("stderr ended without a listening line: {before:?}"),
        Err(_) => panic!("no listening line on stderr within 60 s"),
    }
}

/// Per-request metadata of MCP 2026-07-28.
pub fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "wire-test", "version": "1.0.0"},
    })
}
