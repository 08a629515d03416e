//! docs/clients.md, run as written: every client configuration in it (the JSON files of Claude
//! Desktop, Cursor and VS Code, the `claude mcp add` lines of Claude Code) is launched exactly
//! as its command and arguments say — `toolledger` found on the PATH (the built binary), from
//! an unrelated working directory, with a fresh home directory — and driven by the Python
//! SDK's client the way a desktop client drives it: a replay (one effect, the second answer
//! is the stored one) and a conflict (`operation_conflict`, nothing forwarded) through each
//! upstream, and the ledger found at the default data-directory location, not in the working
//! directory. Also: the stdio proxy's local principal (created on first use, refused when
//! deactivated, before the upstream starts).
//!
//! The upstreams are installed the way the doc says: `npx` (npm registry) and `uvx` (PyPI).
//! Their caches live under the target directory (`CARGO_TARGET_TMPDIR/clients-doc`), where
//! .ci/run installs them ahead of the tests. A missing `npx`, `uvx` or `git` skips with one
//! loud line, and fails under CI (`TOOLLEDGER_CI`).

mod support;

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::{json, Value};
use support::clients::{driver_result, node, proxy_fixture, python, repo, run_driver};
use support::BIN;
use toolledger_testkit::machine::skip;

/// One server entry of one client's configuration.
#[derive(Debug)]
struct Launch {
    /// The client the section is about (its `##` heading).
    client: String,
    /// The server's name in the configuration.
    name: String,
    command: String,
    args: Vec<String>,
}

fn clients_md() -> String {
    std::fs::read_to_string(repo().join("docs/clients.md")).unwrap()
}

/// Every server every configuration in the doc launches: the `json` blocks (`mcpServers`, or
/// VS Code's `servers` with `"type": "stdio"`) and the `claude mcp add` lines.
fn launches(doc: &str) -> Vec<Launch> {
    let mut out = Vec::new();
    let mut heading = String::new();
    let mut block: Option<(String, String)> = None;
    for line in doc.lines() {
        if let Some((lang, text)) = block.as_mut() {
            if line.trim_start().starts_with("```") {
                let (lang, text) = block.take().unwrap();
                if lang == "json" {
                    out.extend(from_json(&heading, &text));
                }
                continue;
            }
            if lang == "sh" && line.trim_start().starts_with("claude mcp add") {
                out.push(from_claude_line(&heading, line.trim()));
            }
            text.push_str(line);
            text.push('\n');
        } else if let Some(lang) = line.trim_start().strip_prefix("```") {
            block = Some((lang.trim().to_string(), String::new()));
        } else if let Some(h) = line.strip_prefix("## ") {
            heading = h.trim().to_string();
        }
    }
    out
}

fn from_json(client: &str, text: &str) -> Vec<Launch> {
    let v: Value = serde_json::from_str(text)
        .unwrap_or_else(|e| panic!("a json block under {client:?} does not parse: {e}\n{text}"));
    let (servers, vscode) = match (v.get("mcpServers"), v.get("servers")) {
        (Some(s), None) => (s, false),
        (None, Some(s)) => (s, true),
        _ => panic!("a json block under {client:?} has neither mcpServers nor servers: {v}"),
    };
    assert_eq!(
        vscode,
        client == "VS Code",
        "VS Code uses `servers`, the others `mcpServers` ({client})"
    );
    servers
        .as_object()
        .unwrap()
        .iter()
        .map(|(name, s)| {
            if vscode {
                assert_eq!(s["type"], "stdio", "{client}/{name}");
            }
            Launch {
                client: client.to_string(),
                name: name.clone(),
                command: s["command"].as_str().unwrap().to_string(),
                args: s["args"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|a| a.as_str().unwrap().to_string())
                    .collect(),
            }
        })
        .collect()
}

/// `claude mcp add [OPTIONS] NAME -- COMMAND [ARGS…]` (no quoting in the doc's lines).
fn from_claude_line(client: &str, line: &str) -> Launch {
    assert!(
        !line.contains(['"', '\'', '\\']),
        "no quoting expected: {line}"
    );
    let words: Vec<&str> = line.split_whitespace().collect();
    let sep = words.iter().position(|w| *w == "--").expect("a `--`");
    assert!(sep >= 4, "{line}");
    Launch {
        client: client.to_string(),
        name: words[sep - 1].to_string(),
        command: words[sep + 1].to_string(),
        args: words[sep + 2..].iter().map(|w| w.to_string()).collect(),
    }
}

#[test]
fn the_doc_configures_both_servers_for_each_of_the_four_clients() {
    let all = launches(&clients_md());
    for client in ["Claude Desktop", "Claude Code", "Cursor", "VS Code"] {
        let mut names: Vec<&str> = all
            .iter()
            .filter(|l| l.client == client)
            .map(|l| l.name.as_str())
            .collect();
        names.sort();
        assert_eq!(names, ["everything", "git"], "{client}: {all:?}");
    }
    for l in &all {
        assert_eq!(l.command, "toolledger", "{l:?}");
        assert_eq!(l.args[0], "proxy", "{l:?}");
        assert!(
            !l.args.iter().any(|a| a == "--db" || a == "--principal"),
            "zero setup: {l:?}"
        );
    }
}

/// The directory of `program` on `path`, if any.
fn on_path(program: &str, path: &std::ffi::OsStr) -> Option<PathBuf> {
    std::env::split_paths(path).find(|d| d.join(program).is_file())
}

/// Where the upstreams' package managers keep what they downloaded, shared by runs (.ci/run
/// installs `mcp-server-git` into `uv-tools` before the tests).
fn caches() -> PathBuf {
    PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("clients-doc")
}

/// The default ledger under `home` (no XDG_DATA_HOME: the clients do not pass it on).
fn default_ledger(home: &Path) -> PathBuf {
    let data = if cfg!(target_os = "macos") {
        home.join("Library/Application Support")
    } else {
        home.join(".local/share")
    };
    data.join("toolledger/ledger.sqlite")
}

/// The text of a tool result's first content block.
fn text(result: &Value) -> &str {
    result["content"][0]["text"].as_str().unwrap_or("")
}

fn error_code(result: &Value) -> Value {
    assert_eq!(result["isError"], true, "{result}");
    let body: Value = serde_json::from_str(text(result)).unwrap();
    body["error"]["code"].clone()
}

fn replayed(result: &Value) -> &Value {
    &result["_meta"]["io.toolledger/ledger"]["replayed"]
}

/// The tools guarded and passed through, as the doc's table lists them for `server`.
fn table_row(doc: &str, server: &str) -> (Vec<String>, Vec<String>) {
    let row = doc
        .lines()
        .find(|l| l.starts_with(&format!("| {server} |")))
        .unwrap_or_else(|| panic!("no table row for {server}"));
    let cells: Vec<&str> = row.split('|').collect();
    let names = |cell: &str| -> Vec<String> {
        let mut v: Vec<String> = cell
            .split('`')
            .skip(1)
            .step_by(2)
            .map(str::to_string)
            .collect();
        v.sort();
        v
    };
    (names(cells[2]), names(cells[3]))
}

/// The listing's guarded tools (they require `operation_id`) and the others, without
/// `get_operation_status`.
fn listed(lines: &[Value]) -> (Vec<String>, Vec<String>) {
    let tools = lines
        .iter()
        .find_map(|l| l.get("tools"))
        .expect("a tool listing");
    let (mut guarded, mut passed) = (Vec::new(), Vec::new());
    for t in tools.as_array().unwrap() {
        let name = t["name"].as_str().unwrap().to_string();
        if name == "get_operation_status" {
            continue;
        }
        let required = t["inputSchema"]["required"].as_array();
        if required.is_some_and(|r| r.iter().any(|x| x == "operation_id")) {
            guarded.push(name);
        } else {
            passed.push(name);
        }
    }
    guarded.sort();
    passed.sort();
    (guarded, passed)
}

/// The variables that say how to reach the npm registry and PyPI from this machine.
const NETWORK_ENV: [&str; 11] = [
    "NODE_EXTRA_CA_CERTS",
    "SSL_CERT_FILE",
    "SSL_CERT_DIR",
    "HTTP_PROXY",
    "HTTPS_PROXY",
    "NO_PROXY",
    "http_proxy",
    "https_proxy",
    "no_proxy",
    "UV_INDEX_URL",
    "npm_config_registry",
];

/// What a run needs around the doc's command lines.
struct World {
    python: PathBuf,
    /// The PATH the client launches `toolledger` with: the built binary's directory first.
    path: std::ffi::OsString,
    git: PathBuf,
}

impl World {
    fn new() -> Option<World> {
        let python = python()?;
        let node = node()?;
        let system = std::env::var_os("PATH").unwrap_or_default();
        let mut dirs = vec![Path::new(BIN).parent().unwrap().to_path_buf()];
        // Node 22 for the npm server; `uv`/`uvx` where .ci/run installs them (the venv).
        dirs.push(node.parent().unwrap().to_path_buf());
        dirs.push(python.parent().unwrap().to_path_buf());
        dirs.extend(std::env::split_paths(&system));
        let path = std::env::join_paths(dirs).unwrap();
        for program in ["npx", "uvx", "git"] {
            if on_path(program, &path).is_none() {
                skip(&format!(
                    "the docs/clients.md test needs `{program}` on the PATH \
                     (or `uvx` beside TOOLLEDGER_PYTHON)"
                ));
                return None;
            }
        }
        let git = on_path("git", &path).unwrap().join("git");
        Some(World { python, path, git })
    }

    /// The environment a client gives a server it launches: the home directory and PATH
    /// (and where npm and uv keep their downloads, so a fresh home does not download again).
    fn env(&self, home: &Path) -> Value {
        let c = caches();
        let mut env = json!({
            "HOME": home.display().to_string(),
            "PATH": self.path.to_str().unwrap(),
            "npm_config_cache": c.join("npm").display().to_string(),
            "npm_config_prefer_offline": "true",
            "npm_config_update_notifier": "false",
            "npm_config_fund": "false",
            "UV_CACHE_DIR": c.join("uv-cache").display().to_string(),
            "UV_TOOL_DIR": c.join("uv-tools").display().to_string(),
            "UV_TOOL_BIN_DIR": c.join("uv-bin").display().to_string(),
        });
        // How this machine reaches the registries (its certificate authorities and proxies),
        // which a user's client passes on from the user's environment.
        for var in NETWORK_ENV {
            if let Some(v) = std::env::var_os(var) {
                env[var] = json!(v.to_string_lossy());
            }
        }
        env
    }

    /// Launches `launch` through the Python SDK's stdio client from `cwd` and makes `calls`.
    fn drive(&self, launch: &Launch, home: &Path, cwd: &Path, calls: Value) -> Vec<Value> {
        let spec = json!({
            "transport": "stdio",
            "server": {"command": launch.command, "args": launch.args, "env": self.env(home)},
            "lifecycle": "legacy",
            "api": "client",
            "list_tools": true,
            "calls": calls,
        });
        let mut command = Command::new(&self.python);
        command
            .arg(proxy_fixture("py_client.py"))
            .current_dir(cwd)
            .env("HOME", home)
            .env("PATH", &self.path)
            .env_remove("XDG_DATA_HOME")
            .env_remove("TOOLLEDGER_DB")
            .env_remove("TOOLLEDGER_DATABASE_URL");
        run_driver(command, &spec)
    }

    fn git(&self, repo: &Path, args: &[&str]) -> String {
        let out = Command::new(&self.git)
            .arg("-C")
            .arg(repo)
            .args(args)
            .env("HOME", repo)
            .output()
            .unwrap();
        assert!(out.status.success(), "git {args:?}: {out:?}");
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

/// server-everything: `toggle-simulated-logging` twice under one id acts once (a third call
/// under a new id stops what the first started), `gzip-file-as-resource` under one id with
/// other arguments is `operation_conflict`.
fn everything(world: &World, launch: &Launch, home: &Path, cwd: &Path) -> Vec<Value> {
    let gzip = |data: &str| {
        json!({"name": "gzip-file-as-resource",
               "arguments": {"name": "note.gz", "data": data, "outputType": "resource",
                             "operation_id": "ev-gzip"}})
    };
    let toggle =
        |id: &str| json!({"name": "toggle-simulated-logging", "arguments": {"operation_id": id}});
    let lines = world.drive(
        launch,
        home,
        cwd,
        json!([
            toggle("ev-toggle-1"),
            toggle("ev-toggle-1"),
            toggle("ev-toggle-2"),
            gzip("data:text/plain,one"),
            gzip("data:text/plain,two"),
        ]),
    );
    let (first, again, next) = (
        driver_result(&lines, 0),
        driver_result(&lines, 1),
        driver_result(&lines, 2),
    );
    assert!(text(&first).starts_with("Started"), "{first}");
    assert_eq!(replayed(&first), false, "{first}");
    assert_eq!(replayed(&again), true, "{again}");
    assert_eq!(
        first["content"], again["content"],
        "the replay is the first answer"
    );
    // Had the retry reached the server, it would have stopped the logging; the next
    // operation is the one that does.
    assert!(text(&next).starts_with("Stopped"), "{next}");
    let zipped = driver_result(&lines, 3);
    assert_ne!(zipped["isError"], true, "{zipped}");
    assert_eq!(
        error_code(&driver_result(&lines, 4)),
        "operation_conflict",
        "{}",
        launch.client
    );
    lines
}

/// mcp-server-git: `git_create_branch` twice under one id creates the branch once (without
/// the ledger the second call would fail: the branch exists), the same id for another branch
/// is `operation_conflict` and creates nothing; `git_branch` (read-only) passes through.
fn git(world: &World, launch: &Launch, home: &Path, cwd: &Path, repo: &Path) -> Vec<Value> {
    let repo_path = repo.display().to_string();
    let create = |branch: &str| {
        json!({"name": "git_create_branch",
               "arguments": {"repo_path": repo_path, "branch_name": branch,
                             "operation_id": "git-branch-1"}})
    };
    let lines = world.drive(
        launch,
        home,
        cwd,
        json!([
            create("feature-a"),
            create("feature-a"),
            create("feature-b"),
            {"name": "git_branch", "arguments": {"repo_path": repo_path, "branch_type": "local"}},
        ]),
    );
    let (first, again) = (driver_result(&lines, 0), driver_result(&lines, 1));
    assert_ne!(first["isError"], true, "{first}");
    assert!(text(&first).contains("feature-a"), "{first}");
    assert_eq!(replayed(&again), true, "{again}");
    assert_eq!(
        first["content"], again["content"],
        "the replay is the first answer"
    );
    assert_eq!(error_code(&driver_result(&lines, 2)), "operation_conflict");
    let branches = driver_result(&lines, 3);
    assert!(text(&branches).contains("feature-a"), "{branches}");
    assert!(
        replayed(&branches).is_null(),
        "read-only: passed through {branches}"
    );
    let local = world.git(repo, &["branch", "--list", "--format=%(refname:short)"]);
    let mut names: Vec<&str> = local.lines().collect();
    names.sort();
    assert_eq!(
        names,
        ["feature-a", "main"],
        "one branch made, none for the conflict"
    );
    lines
}

#[test]
fn every_configuration_in_clients_md_runs_as_written() {
    let Some(world) = World::new() else { return };
    let doc = clients_md();
    let all = launches(&doc);
    let mut clients: Vec<&str> = all.iter().map(|l| l.client.as_str()).collect();
    clients.dedup();
    for client in clients {
        // A fresh home and an unrelated working directory per client, as on a new machine.
        let scratch = tempfile::tempdir().unwrap();
        let home = scratch.path().join("home");
        let cwd = scratch.path().join("somewhere-else");
        std::fs::create_dir_all(&home).unwrap();
        std::fs::create_dir_all(&cwd).unwrap();
        let repo = scratch.path().join("repo");
        std::fs::create_dir_all(&repo).unwrap();
        world.git(&repo, &["init", "--quiet", "--initial-branch=main"]);
        world.git(
            &repo,
            &[
                "-c",
                "user.name=t",
                "-c",
                "user.email=t@example.com",
                "commit",
                "--quiet",
                "--allow-empty",
                "-m",
                "first",
            ],
        );
        for launch in all.iter().filter(|l| l.client == client) {
            eprintln!("{client}: {} {}", launch.command, launch.args.join(" "));
            let (lines, row) = if launch.args.iter().any(|a| a == "npx") {
                (everything(&world, launch, &home, &cwd), "server-everything")
            } else if launch.args.iter().any(|a| a == "uvx") {
                (git(&world, launch, &home, &cwd, &repo), "mcp-server-git")
            } else {
                panic!("an upstream this test does not know: {launch:?}");
            };
            assert_eq!(
                listed(&lines),
                table_row(&doc, row),
                "{client}/{}: the doc's table of guarded tools",
                launch.name
            );
        }

        // The ledger is at the default location, private, and nothing landed in the working
        // directory.
        let ledger = default_ledger(&home);
        assert!(
            ledger.is_file(),
            "{client}: no ledger at {}",
            ledger.display()
        );
        #[cfg(unix)]
        {
            use std::os::unix::fs::PermissionsExt;
            let mode = std::fs::metadata(ledger.parent().unwrap())
                .unwrap()
                .permissions()
                .mode();
            assert_eq!(mode & 0o777, 0o700, "{client}");
        }
        let left: Vec<_> = std::fs::read_dir(&cwd).unwrap().collect();
        assert!(
            left.is_empty(),
            "{client}: the working directory got {left:?}"
        );

        // `toolledger operations list` finds them there without --db, acted for by `local`.
        let out = Command::new(BIN)
            .args(["operations", "list"])
            .current_dir(&cwd)
            .env("HOME", &home)
            .env_remove("XDG_DATA_HOME")
            .env_remove("TOOLLEDGER_DB")
            .env_remove("TOOLLEDGER_DATABASE_URL")
            .stdin(Stdio::null())
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let ops: Vec<Value> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        let mut keys: Vec<&str> = ops.iter().filter_map(|o| o["key"].as_str()).collect();
        keys.sort();
        assert_eq!(
            keys,
            ["ev-gzip", "ev-toggle-1", "ev-toggle-2", "git-branch-1"],
            "{client}: {ops:?}"
        );
        assert!(
            ops.iter()
                .all(|o| o["subject"] == "local" && o["tenant"] == "local"),
            "{ops:?}"
        );
    }
}

/// A command running the built binary with `home` as the home directory and no ledger
/// named: the default location.
fn at_home(home: &Path, args: &[&str]) -> Command {
    let mut c = Command::new(BIN);
    c.args(args)
        .current_dir(home)
        .env("HOME", home)
        .env_remove("XDG_DATA_HOME")
        .env_remove("TOOLLEDGER_DB")
        .env_remove("TOOLLEDGER_DATABASE_URL")
        .stdin(Stdio::null());
    c
}

fn error_of(out: &std::process::Output) -> Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("{\"error\""))
        .unwrap_or_else(|| panic!("no error line: {stderr}"));
    serde_json::from_str::<Value>(line).unwrap()["error"].clone()
}

#[test]
fn the_stdio_proxy_acts_for_a_local_principal_and_refuses_a_deactivated_one_before_starting_the_upstream(
) {
    let home = tempfile::tempdir().unwrap();
    let home = home.path();
    let marker = home.join("upstream-started");
    let upstream = format!("touch '{}'", marker.display());
    let proxy = ["proxy", "--", "sh", "-c", upstream.as_str()];

    // First launch: the ledger and `local` are created; the upstream starts (and, being no
    // MCP server, fails the start).
    let out = at_home(home, &proxy).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    assert_eq!(error_of(&out)["code"], "UPSTREAM_UNAVAILABLE");
    assert!(marker.exists(), "the upstream was started");
    let listed = at_home(home, &["principal", "list"]).output().unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(
        listed["principals"],
        json!([{"name": "local", "tenant": "local", "roles": [], "scopes": [],
                "active": true, "tokens": 0}])
    );
    // A later launch uses it as it is.
    let out = at_home(home, &proxy).output().unwrap();
    assert_eq!(error_of(&out)["code"], "UPSTREAM_UNAVAILABLE");

    // Deactivated: refused, not re-activated, and the upstream is never started.
    let revoked = at_home(home, &["principal", "revoke", "local", "--all"])
        .output()
        .unwrap();
    assert!(revoked.status.success(), "{revoked:?}");
    std::fs::remove_file(&marker).unwrap();
    let out = at_home(home, &proxy).output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let e = error_of(&out);
    assert_eq!(e["code"], "PRINCIPAL_INACTIVE", "{e}");
    let message = e["message"].as_str().unwrap();
    assert!(
        message.contains("`proxy`") && message.contains("--replace"),
        "{message}"
    );
    assert!(!marker.exists(), "the upstream was not started");
    let listed = at_home(home, &["principal", "list"]).output().unwrap();
    let listed: Value = serde_json::from_slice(&listed.stdout).unwrap();
    assert_eq!(listed["principals"][0]["active"], false);

    // A named principal that does not exist: refused naming the command, before the upstream.
    let mut named = vec!["proxy", "--principal", "nobody"];
    named.extend(&proxy[1..]);
    let out = at_home(home, &named).output().unwrap();
    let e = error_of(&out);
    assert_eq!(e["code"], "PRINCIPAL_NOT_FOUND");
    assert!(
        e["message"]
            .as_str()
            .unwrap()
            .starts_with("`proxy --principal`"),
        "{e}"
    );
    assert!(!marker.exists());

    // `serve` on stdio still needs --principal, and says so naming `serve`.
    let out = at_home(home, &["serve"]).output().unwrap();
    let e = error_of(&out);
    assert_eq!(e["code"], "PRINCIPAL_REQUIRED");
    assert!(e["message"].as_str().unwrap().starts_with("`serve`"), "{e}");
}

#[test]
fn toolledger_db_and_xdg_data_home_place_the_ledger() {
    let scratch = tempfile::tempdir().unwrap();
    let home = scratch.path().join("home");
    let migrate = |envs: &[(&str, &Path)]| {
        let out = Command::new(BIN)
            .arg("migrate")
            .current_dir(scratch.path())
            .env("HOME", &home)
            .env_remove("XDG_DATA_HOME")
            .env_remove("TOOLLEDGER_DB")
            .env_remove("TOOLLEDGER_DATABASE_URL")
            .envs(envs.iter().map(|(k, v)| (k, v)))
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
    };
    // TOOLLEDGER_DB names the file, as --db does; the default location is not touched.
    let db = scratch.path().join("elsewhere.sqlite");
    migrate(&[("TOOLLEDGER_DB", &db)]);
    assert!(db.is_file());
    assert!(!home.exists());
    // XDG_DATA_HOME moves the default on Linux.
    if cfg!(target_os = "linux") {
        let data = scratch.path().join("data");
        migrate(&[("XDG_DATA_HOME", &data)]);
        assert!(data.join("toolledger/ledger.sqlite").is_file());
        assert!(!home.exists());
    }
}
