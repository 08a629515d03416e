//! A demo's client of one MCP server process over its stdio: raw 2026-07-28 `tools/call`
//! lines with the per-request metadata, replies read on their own thread with a bound on the
//! wait. The demos that start `toolledger serve` or `toolledger proxy` share it.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdin, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::time::Duration;

use serde_json::{json, Value};

/// Per-request metadata of MCP 2026-07-28 (the client declares form elicitation).
fn meta() -> Value {
    json!({
        "io.modelcontextprotocol/protocolVersion": "2026-07-28",
        "io.modelcontextprotocol/clientCapabilities": {"elicitation": {"form": {}}},
        "io.modelcontextprotocol/clientInfo": {"name": "toolledger-demo", "version": "1.0.0"},
    })
}

/// One server process and the lines it answered.
pub(crate) struct Session {
    child: Child,
    stdin: Option<ChildStdin>,
    lines: Receiver<String>,
    next_id: i64,
}

impl Session {
    /// Starts `command` with piped stdin and stdout (stderr discarded).
    pub(crate) fn start(mut command: Command) -> Result<Session, &'static str> {
        let mut child = command
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|_| "DEMO_SPAWN_ERROR")?;
        let stdout = child.stdout.take().ok_or("DEMO_SPAWN_ERROR")?;
        let (tx, rx) = channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { break };
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        Ok(Session {
            stdin: child.stdin.take(),
            child,
            lines: rx,
            next_id: 1,
        })
    }

    /// Sends one `tools/call` with `params` (`name`, `arguments`, …) without waiting.
    pub(crate) fn send(&mut self, params: Value) -> Result<(), &'static str> {
        let id = self.next_id;
        self.next_id += 1;
        let mut params = params;
        params["_meta"] = meta();
        let line = json!({"jsonrpc": "2.0", "id": id, "method": "tools/call", "params": params});
        let stdin = self.stdin.as_mut().ok_or("DEMO_IO_ERROR")?;
        writeln!(stdin, "{line}").map_err(|_| "DEMO_IO_ERROR")?;
        stdin.flush().map_err(|_| "DEMO_IO_ERROR")
    }

    /// The result of the next reply; `None` when the server closed (or said nothing within
    /// `wait`).
    pub(crate) fn reply(&mut self, wait: Duration) -> Result<Option<Value>, &'static str> {
        match self.lines.recv_timeout(wait) {
            Ok(line) => {
                let v: Value = serde_json::from_str(&line).map_err(|_| "DEMO_PROTOCOL_ERROR")?;
                Ok(Some(v["result"].clone()))
            }
            Err(_) => Ok(None),
        }
    }

    /// One `tools/call` and its result; `None` when the server closed without replying.
    pub(crate) fn call(
        &mut self,
        params: Value,
        wait: Duration,
    ) -> Result<Option<Value>, &'static str> {
        self.send(params)?;
        self.reply(wait)
    }

    /// The process id.
    pub(crate) fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Kills the process and reaps it.
    pub(crate) fn kill(mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Closes stdin and waits for the process to exit; its exit code.
    pub(crate) fn exit_code(mut self) -> Result<i32, &'static str> {
        self.stdin.take();
        let status = self.child.wait().map_err(|_| "DEMO_IO_ERROR")?;
        Ok(status.code().unwrap_or(-1))
    }
}
