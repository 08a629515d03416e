//! `toolledger proxy`: the ledger in front of an MCP server we did not write.
//!
//! ```text
//! toolledger proxy [--db PATH | --database-url URL] [--principal NAME | --http ADDR]
//!                  [--config proxy.toml] -- UPSTREAM_COMMAND [ARGS…]
//! toolledger proxy … --upstream-url https://host/mcp [--upstream-headers-file FILE]
//! ```
//!
//! The upstream is a command the proxy starts (and starts again when it exited, at the next
//! call) talking MCP on stdio, its stderr going to the proxy's log; or a streamable HTTP
//! endpoint. Clients reach the proxy on stdio (as `--principal`, by default the principal
//! `local` in tenant `local`, created on first use: whoever launches a stdio proxy already owns
//! its ledger file, so desktop clients need no setup) or over streamable HTTP with bearer
//! tokens, exactly as `toolledger serve`. What is guarded and how: see `toolledger_proxy`,
//! docs/proxy.md and docs/clients.md.

use std::sync::Arc;

use toolledger::store::sqlite::CommitWait;
use toolledger_cli::common::{StoreArgs, StoreConfig};
use toolledger_cli::exit::{Failure, Outcome};
use toolledger_cli::telemetry::{start_metrics, TelemetryArgs};
use toolledger_mcp::{CallerSource, LedgerGuard};
use toolledger_proxy::{
    BuildError, ChildEnv, Lifecycle, Proxy, ProxyConfig, Upstream, UpstreamSpec,
};

use crate::serving::{open_ledger, run_server, serve_http, stdio_principal, ClockArgs, ServerArgs};

/// `--upstream-lifecycle` values.
#[derive(clap::ValueEnum, Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum LifecycleArg {
    /// `server/discover` (MCP 2026-07-28) first, the `initialize` handshake for older servers.
    #[default]
    Auto,
    /// Only the `initialize` handshake.
    Legacy,
    /// Only MCP 2026-07-28.
    Modern,
}

/// Options of `toolledger proxy`.
#[derive(clap::Args, Debug, Clone)]
pub struct ProxyArgs {
    #[command(flatten)]
    pub store: StoreArgs,
    /// Principal the stdio caller acts as (resolved from the principal store on each call).
    /// Default: the principal `local` (tenant `local`), created on first use.
    #[arg(long)]
    pub principal: Option<String>,
    #[command(flatten)]
    pub server: ServerArgs,
    /// The proxy's configuration (TOML): which tools are guarded and how.
    #[arg(long, value_name = "FILE")]
    pub config: Option<std::path::PathBuf>,
    /// A streamable HTTP upstream instead of a command.
    #[arg(long, value_name = "URL", conflicts_with = "upstream")]
    pub upstream_url: Option<String>,
    /// A header sent to the HTTP upstream with every request, `Name: value` (repeatable).
    /// A secret here is visible to every user of the machine (`ps`): prefer
    /// `--upstream-headers-file`, `TOOLLEDGER_UPSTREAM_HEADERS` or the configuration's
    /// `[upstream_headers]`.
    #[arg(long, value_name = "HEADER", requires = "upstream_url")]
    pub upstream_header: Vec<String>,
    /// A file of headers for the HTTP upstream, one `Name: value` per line (`#` starts a
    /// comment line).
    #[arg(long, value_name = "FILE", requires = "upstream_url")]
    pub upstream_headers_file: Option<std::path::PathBuf>,
    /// The MCP lifecycle spoken to the upstream.
    #[arg(long, value_enum, default_value = "auto")]
    pub upstream_lifecycle: LifecycleArg,
    /// Seconds the upstream may take to complete its MCP handshake (each start and restart),
    /// and to list its tools at the proxy's start; long enough by default for an `npx -y` or
    /// `uvx` upstream to install itself on a cold cache.
    #[arg(long, value_name = "SECS", default_value_t = 30,
          value_parser = clap::value_parser!(u64).range(1..=3600))]
    pub upstream_start_timeout: u64,
    /// Set a variable in a stdio upstream's environment, `NAME=VALUE` (repeatable). The
    /// ledger's keys and database URL are never passed on. A secret here is visible to every
    /// user of the machine (`ps`): prefer the configuration's `[upstream_env]` with `${NAME}`.
    #[arg(long, value_name = "NAME=VALUE", conflicts_with = "upstream_url")]
    pub upstream_env: Vec<String>,
    /// Remove a variable from a stdio upstream's environment (repeatable).
    #[arg(long, value_name = "NAME", conflicts_with = "upstream_url")]
    pub upstream_env_remove: Vec<String>,
    #[command(flatten)]
    pub clock: ClockArgs,
    #[command(flatten)]
    pub telemetry: TelemetryArgs,
    #[command(flatten)]
    pub prune: toolledger_cli::prune::PruneFlags,
    /// The upstream command and its arguments, after `--`.
    #[arg(last = true, value_name = "UPSTREAM_COMMAND")]
    pub upstream: Vec<String>,
}

/// Runs the proxy until its stdin closes (stdio) or it is stopped (SIGTERM, SIGINT), then
/// stops its upstream.
pub fn run(args: ProxyArgs, config: StoreConfig) -> Result<Outcome, Failure> {
    run_server(args.telemetry.log_format, proxy(args, config))
}

/// The environment variable holding headers for the HTTP upstream, one `Name: value` per line.
pub const UPSTREAM_HEADERS_ENV: &str = "TOOLLEDGER_UPSTREAM_HEADERS";

/// `Name: value` lines (blank lines and `#` comments skipped) from `source`.
fn header_lines(text: &str, source: &str) -> Result<Vec<(String, String)>, Failure> {
    let mut out = Vec::new();
    for line in text.lines().map(str::trim) {
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let Some((name, value)) = line.split_once(':') else {
            return Err(Failure::explained(
                "UPSTREAM_HEADER_INVALID",
                format!("{source} takes `Name: value` lines"),
            ));
        };
        out.push((name.trim().to_string(), value.trim().to_string()));
    }
    Ok(out)
}

/// The HTTP upstream's headers, from the configuration's `[upstream_headers]`, then
/// `--upstream-headers-file`, then `TOOLLEDGER_UPSTREAM_HEADERS`, then `--upstream-header`;
/// a later source's header replaces an earlier one of the same name.
fn upstream_headers(
    args: &ProxyArgs,
    config: &ProxyConfig,
) -> Result<Vec<(String, String)>, Failure> {
    let mut all = config
        .upstream_headers(|name| std::env::var(name).ok())
        .map_err(|e| Failure::explained("CONFIG_INVALID", e.to_string()))?;
    if let Some(path) = &args.upstream_headers_file {
        let text = std::fs::read_to_string(path).map_err(|_| {
            Failure::explained(
                "UPSTREAM_HEADER_INVALID",
                "the --upstream-headers-file cannot be read (missing, unreadable or not UTF-8)",
            )
        })?;
        all.extend(header_lines(&text, "--upstream-headers-file")?);
    }
    if let Ok(text) = std::env::var(UPSTREAM_HEADERS_ENV) {
        all.extend(header_lines(&text, UPSTREAM_HEADERS_ENV)?);
    }
    for h in &args.upstream_header {
        all.extend(header_lines(h, "--upstream-header")?);
    }
    let mut headers: Vec<(String, String)> = Vec::new();
    for (name, value) in all {
        headers.retain(|(n, _)| !n.eq_ignore_ascii_case(&name));
        headers.push((name, value));
    }
    Ok(headers)
}

/// The secrets of an HTTP upstream no log line may show: its headers' values (and a bearer
/// token alone), and its URL's password and query values.
fn upstream_secrets(url: &str, headers: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (_, value) in headers {
        out.push(value.clone());
        if let Some((_, token)) = value.split_once(' ') {
            out.push(token.to_string());
        }
    }
    let after_scheme = url.split_once("://").map_or(url, |(_, rest)| rest);
    let authority = after_scheme.split(['/', '?', '#']).next().unwrap_or("");
    if let Some((userinfo, _)) = authority.rsplit_once('@') {
        out.extend(userinfo.split(':').map(str::to_string));
    }
    if let Some((_, query)) = url.split_once('?') {
        let query = query.split('#').next().unwrap_or("");
        out.extend(
            query
                .split('&')
                .filter_map(|pair| pair.split_once('='))
                .map(|(_, v)| v.to_string()),
        );
    }
    out
}

fn upstream_spec(args: &ProxyArgs, config: &ProxyConfig) -> Result<UpstreamSpec, Failure> {
    let headers = upstream_headers(args, config)?;
    if let Some(url) = &args.upstream_url {
        toolledger_cli::log_sink::register_secrets(upstream_secrets(url, &headers));
        return Ok(UpstreamSpec::Http {
            url: url.clone(),
            headers,
        });
    }
    if !headers.is_empty() {
        return Err(Failure::explained(
            "UPSTREAM_HEADER_INVALID",
            "upstream headers are for an HTTP upstream (--upstream-url); this upstream is a command",
        ));
    }
    let Some((command, rest)) = args.upstream.split_first() else {
        return Err(Failure::explained(
            "UPSTREAM_REQUIRED",
            "name the upstream: `-- COMMAND [ARGS…]` for a stdio server, or --upstream-url URL",
        ));
    };
    Ok(UpstreamSpec::Stdio {
        command: command.clone(),
        args: rest.to_vec(),
        env: child_env(args, config)?,
    })
}

/// The stdio upstream's environment changes: the configuration's, then the flags'.
fn child_env(args: &ProxyArgs, config: &ProxyConfig) -> Result<ChildEnv, Failure> {
    let mut set = config
        .upstream_env(|name| std::env::var(name).ok())
        .map_err(|e| Failure::explained("CONFIG_INVALID", e.to_string()))?;
    for pair in &args.upstream_env {
        match pair.split_once('=') {
            Some((name, value)) if !name.is_empty() => {
                set.retain(|(n, _)| n != name);
                set.push((name.to_string(), value.to_string()));
            }
            _ => {
                return Err(Failure::explained(
                    "USAGE_ERROR",
                    "--upstream-env takes NAME=VALUE (to remove a variable: --upstream-env-remove NAME)",
                ))
            }
        }
    }
    let mut remove = config.upstream_env_remove.clone();
    remove.extend(args.upstream_env_remove.iter().cloned());
    Ok(ChildEnv { remove, set })
}

/// How the upstream is named in a start-up error: its program's file name (never a
/// directory, never its arguments, which may hold secrets), or "the HTTP upstream".
fn upstream_name(spec: &UpstreamSpec) -> String {
    match spec {
        UpstreamSpec::Stdio { command, .. } => {
            let program = std::path::Path::new(command)
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_else(|| command.clone());
            format!("the upstream command `{program}`")
        }
        UpstreamSpec::Http { .. } => "the HTTP upstream".into(),
    }
}

fn proxy_config(args: &ProxyArgs) -> Result<ProxyConfig, Failure> {
    let Some(path) = &args.config else {
        return Ok(ProxyConfig::default());
    };
    let text = std::fs::read_to_string(path).map_err(|_| {
        Failure::explained(
            "CONFIG_UNREADABLE",
            "the --config file cannot be read (missing, unreadable or not UTF-8)",
        )
    })?;
    ProxyConfig::parse(&text).map_err(|e| Failure::explained("CONFIG_INVALID", e.to_string()))
}

/// The proxy's ledger: `config` with [`CommitWait::PROXY`]. A proxied call's three write jobs
/// are separated by the upstream's answer, so they reach the SQLite writer one by one: a short
/// wait lets a commit carry more of them.
fn ledger_config(mut config: StoreConfig) -> StoreConfig {
    config.commit_wait = Some(CommitWait::PROXY);
    config
}

async fn proxy(args: ProxyArgs, config: StoreConfig) -> Result<(), Failure> {
    let front = args.server.front.resolve()?;
    let proxy_config = proxy_config(&args)?;
    let spec = upstream_spec(&args, &proxy_config)?;
    let config = ledger_config(config);
    let store = config.open()?;
    let clock = args.clock.clock();
    let ledger = open_ledger(&config, store, LedgerGuard::builder().clock(clock.clone()))?;
    // Who the stdio client acts for is settled before the upstream is started.
    let http = args.server.http;
    let stdio_caller = match http {
        None => {
            let principals = ledger.principals();
            Some(stdio_principal("proxy", args.principal.as_deref(), true, principals).await?)
        }
        Some(_) => None,
    };
    let lifecycle = match args.upstream_lifecycle {
        LifecycleArg::Auto => Lifecycle::Auto,
        LifecycleArg::Legacy => Lifecycle::Legacy,
        LifecycleArg::Modern => Lifecycle::Modern,
    };
    let named = upstream_name(&spec);
    let upstream = Upstream::new(spec, lifecycle);
    // A stdio proxy's one client is the upstream's client: its roots, and its answers to the
    // upstream's sampling and elicitation requests, are relayed.
    let relay = upstream.client_relay(http.is_none());
    let start_timeout = std::time::Duration::from_secs(args.upstream_start_timeout);
    upstream.set_start_timeout(start_timeout);
    let stopping = upstream.clone();
    let hook = crate::cmd_dispatch::hold_hook();
    let build = Proxy::build(&ledger, upstream, &proxy_config, hook);
    // A stdio client that goes away while the upstream starts (its end of stdin closed) is
    // not waited for: the proxy stops its upstream and exits.
    let mut watch = stdin_watch(http.is_none());
    let built = tokio::select! {
        biased;
        built = tokio::time::timeout(start_timeout, build) => built,
        () = watch.closed() => {
            tracing::info!(target: "toolledger::proxy",
                "the client closed its input while the upstream was starting; stopping");
            stopping.close().await;
            return Ok(());
        }
    };
    watch.stop();
    let built = built
        .map_err(|_| {
            Failure::explained(
                "UPSTREAM_UNAVAILABLE",
                format!(
                    "{named} did not start and list its tools within {} s \
                     (--upstream-start-timeout)",
                    start_timeout.as_secs()
                ),
            )
        })?
        .map_err(|e| match e {
            BuildError::Upstream(e) => Failure::explained(
                "UPSTREAM_UNAVAILABLE",
                format!(
                    "{named} could not be started or did not list its tools: {}",
                    e.start_reason()
                ),
            ),
            BuildError::Config(why) => Failure::explained("CONFIG_INVALID", why),
        });
    let built = match built {
        Ok(b) => b,
        Err(e) => {
            stopping.close().await;
            return Err(e);
        }
    };
    tracing::info!(target: "toolledger::proxy", guarded = ?built.guarded,
        passed_through = ?built.passed_through, "proxying the upstream's tools");
    start_metrics(args.telemetry.metrics, ledger.store(), &clock, front.limits)
        .await
        .map_err(Failure::code)?;
    let pruner = args.prune.spawn(ledger.store(), &clock);
    let served = match (http, stdio_caller) {
        (None, Some(caller)) => {
            built
                .server(&ledger.with_caller(CallerSource::Configured(caller)))
                .with_client_events(relay)
                .serve_stdio(front.max_in_flight)
                .await;
            Ok(())
        }
        (None, None) => unreachable!("a stdio session's caller is resolved above"),
        (Some(addr), _) => {
            let ledger = ledger.with_caller(CallerSource::BearerToken);
            let console = args.server.console.then(|| {
                // The proxy's operations are settled offline, as `toolledger resolve`
                // settles them: the runtime starts with no tool of its own.
                let rt = toolledger::runtime::Runtime::new(
                    ledger.store().clone(),
                    clock.clone(),
                    toolledger::runtime::Registry::new(),
                );
                crate::cmd_console::console(ledger.principals(), clock.clone(), rt.clone())
                    .with_evidence(crate::cmd_console::evidence(rt))
                    .with_secure_cookies(args.server.secure_cookies)
                    .router(front.hosts.clone())
            });
            serve_http(addr, built.server(&ledger), &ledger, &front, console).await
        }
    };
    // The upstream is stopped as a client ends a session: a child's stdin closes and it
    // exits on its own (then SIGTERM, then a kill), an HTTP session is ended.
    stopping.close().await;
    pruner.stop().await;
    served
}

/// Watches the proxy's stdin while the upstream starts, without reading it: says when the
/// client's end closed with nothing left to read (a pipe or socket hung up). Input that is
/// not a pipe (`/dev/null`, a file) or that holds data is never taken for a closed client.
struct StdinWatch {
    stop: Arc<std::sync::atomic::AtomicBool>,
    closed: Option<tokio::sync::oneshot::Receiver<()>>,
}

fn stdin_watch(enabled: bool) -> StdinWatch {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    if !enabled {
        return StdinWatch { stop, closed: None };
    }
    let (tx, rx) = tokio::sync::oneshot::channel();
    let stopped = stop.clone();
    std::thread::spawn(move || {
        use std::sync::atomic::Ordering;
        while !stopped.load(Ordering::Relaxed) {
            let mut fd = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, for the duration of the call.
            let n = unsafe { libc::poll(&mut fd, 1, 200) };
            if n < 0 || fd.revents & libc::POLLNVAL != 0 {
                return;
            }
            if n == 0 {
                continue;
            }
            if fd.revents & (libc::POLLHUP | libc::POLLERR) != 0 {
                let mut pending: libc::c_int = 0;
                // SAFETY: FIONREAD writes one c_int.
                let r = unsafe { libc::ioctl(0, libc::FIONREAD, &mut pending) };
                if r == 0 && pending == 0 {
                    let _ = tx.send(());
                }
            }
            // Readable data, or input that is always readable: the client is there.
            return;
        }
    });
    StdinWatch {
        stop,
        closed: Some(rx),
    }
}

impl StdinWatch {
    /// Completes when the client's input closed (never when it is not watched, or once the
    /// watch saw input that is there).
    async fn closed(&mut self) {
        if let Some(rx) = self.closed.as_mut() {
            if rx.await.is_ok() {
                return;
            }
        }
        std::future::pending::<()>().await
    }

    fn stop(&self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::common::{Access, StoreArgs, SyncMode};

    /// What the proxy's ledger is opened with: the commit wait on its SQLite writer, and
    /// nothing else of the resolved store flags changed.
    #[test]
    fn the_proxy_opens_its_ledger_with_the_commit_wait() {
        let resolved = StoreArgs {
            db: Some("dir/ledger.sqlite".into()),
            database_url: None,
            backend_id: None,
            sqlite_synchronous: SyncMode::Full,
        }
        .resolve(Access::OpenOrCreate)
        .unwrap();
        assert_eq!(resolved.commit_wait, None, "other commands keep no wait");
        assert_eq!(
            ledger_config(resolved.clone()),
            StoreConfig {
                commit_wait: Some(CommitWait::PROXY),
                ..resolved
            }
        );
    }
}
