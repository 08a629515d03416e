//! Runs the official MCP conformance suite (`@modelcontextprotocol/conformance`, pinned in
//! tests/js) against a server and judges the result against tests/conformance/baseline.json.
//!
//! Shared by crates/toolledger-cli/tests/conformance.rs (`toolledger serve --http`) and
//! crates/toolledger-mcp/tests/conformance_example.rs (examples/conformance_server.rs), which
//! include it with `#[path]`. It needs Node (`TOOLLEDGER_NODE`, set by .ci/run from
//! .ci/node.sh) and the suite installed by `npm ci` in tests/js: without them a test skips
//! with one loud line, and fails when `TOOLLEDGER_CI` is set.
//!
//! The suite sends no bearer token, so [`bearer_proxy`] stands in front of the server and adds
//! one to every request, passing every byte of the response through as it arrives (so
//! streamed responses stay streamed).
//!
//! [`judge`] fails when a scenario outside the baseline fails, and when a baselined scenario
//! (or `scenario:check` entry) no longer fails, so the baseline stays true.

#![allow(dead_code)]

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The repository root (the including crate is two levels below it).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
}

/// Skips the calling test (one loud line), or fails it in CI (`TOOLLEDGER_CI`).
fn unavailable(why: &str) {
    if std::env::var_os("TOOLLEDGER_CI").is_some() {
        panic!("the conformance suite cannot run in CI: {why}");
    }
    eprintln!(
        "SKIPPED: the MCP conformance suite did not run: {why} \
         (run `bash .ci/node.sh` and set TOOLLEDGER_NODE to the node it prints)"
    );
}

/// The pinned suite and the Node that runs it.
pub struct Suite {
    node: PathBuf,
    cli: PathBuf,
}

impl Suite {
    /// The suite, or `None` (after a loud skip line; a failure in CI) when it cannot run.
    pub fn find() -> Option<Suite> {
        let Some(node) = std::env::var_os("TOOLLEDGER_NODE").map(PathBuf::from) else {
            unavailable("TOOLLEDGER_NODE is not set");
            return None;
        };
        let cli = repo_root()
            .join("tests/js/node_modules/@modelcontextprotocol/conformance/dist/index.js");
        if !cli.is_file() {
            unavailable("tests/js/node_modules has no @modelcontextprotocol/conformance");
            return None;
        }
        Some(Suite { node, cli })
    }

    /// Runs every scenario the suite requires for `revision` (at that revision's wire), and
    /// those it runs unscored, against `url`; `label` names the output directory.
    pub fn run_requirements(&self, url: &str, revision: &str, label: &str) -> Vec<Scenario> {
        let out = output_dir(label, revision);
        let log = out.join("suite.log");
        let args = ["--requirements", revision];
        self.run(url, &args, &out, &log);
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        // The summary names every scenario that ran, also those that recorded no checks.
        let mut names: Vec<String> = text
            .split("=== SUMMARY ===")
            .nth(1)
            .unwrap_or_else(|| panic!("the suite printed no summary; see {}", log.display()))
            .lines()
            .filter_map(|l| l.strip_prefix("✓ ").or_else(|| l.strip_prefix("✗ ")))
            .filter_map(|l| l.split_once(": ").map(|(name, _)| name.to_string()))
            .collect();
        names.dedup();
        assert!(!names.is_empty(), "no scenario ran; see {}", log.display());
        collect(&out, &names)
    }

    /// Runs each of `scenarios` alone at the wire of `revision` against `url`.
    pub fn run_scenarios(
        &self,
        url: &str,
        revision: &str,
        scenarios: &[&str],
        label: &str,
    ) -> Vec<Scenario> {
        let out = output_dir(label, revision);
        for name in scenarios {
            let log = out.join(format!("{name}.log"));
            let args = ["--scenario", name, "--spec-version", revision];
            self.run(url, &args, &out, &log);
        }
        let names: Vec<String> = scenarios.iter().map(|s| s.to_string()).collect();
        collect(&out, &names)
    }

    fn run(&self, url: &str, args: &[&str], out: &Path, log: &Path) {
        let file = std::fs::File::create(log).unwrap();
        let mut child = Command::new(&self.node)
            .arg(&self.cli)
            .args(["server", "--url", url, "-o"])
            .arg(out)
            .args(args)
            .current_dir(out)
            .stdin(Stdio::null())
            .stdout(file.try_clone().unwrap())
            .stderr(file)
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {}: {e}", self.node.display()));
        // A hang guard, not a measurement: the pinned suite's own timeouts end far earlier.
        let started = Instant::now();
        while child.try_wait().unwrap().is_none() {
            if started.elapsed() > Duration::from_secs(600) {
                let _ = child.kill();
                panic!("the conformance suite hung; see {}", log.display());
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A fresh directory for one run's results, under the target directory so it can be read
/// after the test.
fn output_dir(label: &str, revision: &str) -> PathBuf {
    let dir = Path::new(env!("CARGO_TARGET_TMPDIR"))
        .join("conformance")
        .join(format!("{label}-{revision}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

/// One check the suite recorded.
#[derive(Clone, Debug)]
pub struct Check {
    /// The check id (`tools-call-error`, `wire-schema-valid`, …).
    pub id: String,
    /// `SUCCESS`, `FAILURE`, `WARNING`, `INFO` or `SKIPPED`.
    pub status: String,
    /// The suite's message, if any.
    pub message: String,
}

/// One scenario's recorded checks.
#[derive(Clone, Debug)]
pub struct Scenario {
    /// The scenario name.
    pub name: String,
    /// Its checks; empty when the suite recorded none.
    pub checks: Vec<Check>,
}

impl Scenario {
    /// The failing checks; a scenario that recorded no checks at all fails as a whole.
    pub fn failures(&self) -> Vec<&Check> {
        self.checks
            .iter()
            .filter(|c| c.status == "FAILURE")
            .collect()
    }

    /// Whether the scenario passed (no failing check, and at least one check recorded).
    pub fn passed(&self) -> bool {
        !self.checks.is_empty() && self.failures().is_empty()
    }
}

/// Reads the `checks.json` the suite wrote for each of `names` into `out`
/// (`server-<scenario>-<timestamp>/checks.json`).
fn collect(out: &Path, names: &[String]) -> Vec<Scenario> {
    let mut by_name: BTreeMap<String, Vec<Check>> = BTreeMap::new();
    for entry in std::fs::read_dir(out).unwrap().flatten() {
        let dir = entry.file_name().to_string_lossy().into_owned();
        // The timestamp is `YYYY-MM-DDTHH-MM-SS-mmmZ`: 24 characters and a dash.
        let Some(name) = dir
            .strip_prefix("server-")
            .filter(|d| d.len() > 25)
            .map(|d| &d[..d.len() - 25])
        else {
            continue;
        };
        let Ok(text) = std::fs::read_to_string(entry.path().join("checks.json")) else {
            continue;
        };
        let checks: Vec<Value> = serde_json::from_str(&text).unwrap();
        let checks = checks.iter().map(|c| Check {
            id: c["id"].as_str().unwrap_or("?").to_string(),
            status: c["status"].as_str().unwrap_or("?").to_string(),
            message: c["errorMessage"].as_str().unwrap_or("").to_string(),
        });
        by_name.entry(name.to_string()).or_default().extend(checks);
    }
    names
        .iter()
        .map(|name| Scenario {
            name: name.clone(),
            checks: by_name.remove(name).unwrap_or_default(),
        })
        .collect()
}

/// The baseline of `target` (`serve` or `example`) at `revision`: entry → reason.
pub fn baseline(target: &str, revision: &str) -> BTreeMap<String, String> {
    let path = repo_root().join("tests/conformance/baseline.json");
    let text = std::fs::read_to_string(&path).unwrap();
    let all: Value = serde_json::from_str(&text).unwrap();
    let section = all[target][revision]
        .as_object()
        .unwrap_or_else(|| panic!("baseline.json has no {target}.{revision} section"));
    section
        .iter()
        .map(|(k, v)| {
            let reason = v.as_str().unwrap_or_default().to_string();
            assert!(!reason.is_empty(), "baseline entry {k} gives no reason");
            (k.clone(), reason)
        })
        .collect()
}

/// Prints every scenario's verdict and fails the test when a scenario outside the baseline
/// fails or a baseline entry no longer fails.
pub fn judge(target: &str, revision: &str, scenarios: &[Scenario]) {
    let baseline = baseline(target, revision);
    let mut unexpected = Vec::new();
    let mut stale: Vec<String> = Vec::new();
    let mut report = format!("conformance of {target} at {revision}:\n");
    for s in scenarios {
        let wholesale = baseline.get(&s.name);
        let failures = s.failures();
        let verdict = match (s.passed(), wholesale) {
            (true, None) => "pass".to_string(),
            (true, Some(_)) => {
                stale.push(s.name.clone());
                "PASS (baselined: remove the entry)".to_string()
            }
            (false, Some(reason)) => format!("baselined: {reason}"),
            (false, None) => {
                let mut excused = 0;
                for c in &failures {
                    if baseline.contains_key(&format!("{}:{}", s.name, c.id)) {
                        excused += 1;
                    } else {
                        unexpected.push(format!("{} [{}]: {}", s.name, c.id, c.message));
                    }
                }
                if s.checks.is_empty() {
                    unexpected.push(format!("{}: the suite recorded no checks", s.name));
                }
                if excused == failures.len() && !s.checks.is_empty() {
                    "pass (outside its baselined checks)".to_string()
                } else {
                    "FAIL".to_string()
                }
            }
        };
        report.push_str(&format!("  {:<48} {verdict}\n", s.name));
        for c in s.checks.iter().filter(|c| c.status != "SUCCESS") {
            let entry = format!("{}:{}", s.name, c.id);
            let note = match baseline.get(&entry) {
                Some(reason) => format!(" (baselined: {reason})"),
                None => String::new(),
            };
            report.push_str(&format!(
                "      {} {}: {}{note}\n",
                c.status, c.id, c.message
            ));
        }
    }
    for entry in baseline.keys() {
        let (name, check) = match entry.split_once(':') {
            Some((n, c)) => (n, Some(c)),
            None => (entry.as_str(), None),
        };
        let Some(s) = scenarios.iter().find(|s| s.name == name) else {
            stale.push(format!("{entry} (did not run)"));
            continue;
        };
        if let Some(check) = check {
            let fails = s
                .checks
                .iter()
                .any(|c| c.id == check && c.status == "FAILURE");
            if !fails {
                stale.push(format!("{entry} (no longer fails)"));
            }
        }
    }
    eprintln!("{report}");
    let mut problems = String::new();
    if !unexpected.is_empty() {
        problems.push_str("failing outside tests/conformance/baseline.json:\n  ");
        problems.push_str(&unexpected.join("\n  "));
        problems.push('\n');
    }
    if !stale.is_empty() {
        problems.push_str("baseline entries that no longer fail (remove them):\n  ");
        problems.push_str(&stale.join("\n  "));
        problems.push('\n');
    }
    assert!(
        problems.is_empty(),
        "{target} at {revision}:\n{problems}(full report above)"
    );
}

/// Listens on a loopback port and forwards every connection to `upstream`, adding
/// `Authorization: Bearer <token>` to the request head (replacing any the client sent) and
/// `Connection: close` (so each connection carries one request whose head this rewrote);
/// everything else, the response included, passes through byte for byte as it arrives.
pub async fn bearer_proxy(upstream: SocketAddr, token: String) -> SocketAddr {
    let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((client, _)) = listener.accept().await {
            let token = token.clone();
            tokio::spawn(async move {
                let _ = forward(client, upstream, &token).await;
            });
        }
    });
    addr
}

async fn forward(mut client: TcpStream, upstream: SocketAddr, token: &str) -> std::io::Result<()> {
    let mut head = Vec::new();
    let mut buf = [0u8; 8192];
    let end = loop {
        let n = client.read(&mut buf).await?;
        if n == 0 || head.len() > 64 * 1024 {
            return Ok(());
        }
        head.extend_from_slice(&buf[..n]);
        if let Some(i) = head.windows(4).position(|w| w == b"\r\n\r\n") {
            break i;
        }
    };
    let text = String::from_utf8_lossy(&head[..end]).into_owned();
    let mut rewritten = String::new();
    for (i, line) in text.split("\r\n").enumerate() {
        let name = line.split(':').next().unwrap_or_default().trim();
        let dropped = ["authorization", "connection", "keep-alive"]
            .iter()
            .any(|h| name.eq_ignore_ascii_case(h));
        if i == 0 || !dropped {
            rewritten.push_str(line);
            rewritten.push_str("\r\n");
        }
    }
    rewritten.push_str(&format!(
        "Authorization: Bearer {token}\r\nConnection: close\r\n\r\n"
    ));
    let mut server = TcpStream::connect(upstream).await?;
    server.write_all(rewritten.as_bytes()).await?;
    server.write_all(&head[end + 4..]).await?;
    tokio::io::copy_bidirectional(&mut client, &mut server).await?;
    Ok(())
}
