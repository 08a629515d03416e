//! The proxy's configuration: which upstream tools are guarded and how.
//!
//! A TOML file, every key optional:
//!
//! ```toml
//! # Defaults for every tool.
//! operation_id_argument = "operation_id"   # the argument a client names the operation by
//! call_timeout_seconds = 60                # a forward without an answer by then is outcome_unknown
//! authority_ttl_seconds = 86400            # how long a retry may still replay (and a forward run)
//! retention_ttl_seconds = 604800           # how long a stored result is replayed
//! replan_window_seconds = 86400            # the re-plan guard's window; 0 turns it off
//!
//! [upstream_headers]                 # sent to an HTTP upstream (--upstream-url) with every request
//! Authorization = "Bearer ${UPSTREAM_TOKEN}"   # ${NAME}: the environment variable NAME
//!
//! [upstream_env]                     # set in a stdio upstream's environment (${NAME} as above)
//! PAYMENTS_API_KEY = "${PAYMENTS_API_KEY}"
//! # removed from it (the ledger's keys and database URL are never passed on)
//! upstream_env_remove = ["AWS_SECRET_ACCESS_KEY"]
//!
//! [tools.charge]
//! guarded = true                     # default: guarded unless the upstream marks it readOnlyHint
//! key_argument = "operation_id"      # this tool's operation id argument
//! forward_operation_id = "_meta"     # or an argument name, e.g. "idempotency_key"; absent: not sent
//!                                    # (what is sent is the operation's upstream key, derived from
//!                                    # tenant, subject, tool and operation id: never the raw id)
//! call_timeout_seconds = 30
//! required_scopes = ["payments:write"]
//!
//! [tools.charge.reconcile]           # how a status query looks an unsure charge up
//! tool = "find_charge"               # a read-only upstream tool
//! arguments = { reference = "{operation_id}" }   # replaced by the upstream key that was sent
//! found_when = "/structuredContent/found"        # JSON pointer into its result: true = evidence
//! ```

use std::collections::BTreeMap;

use serde::Deserialize;
use serde_json::Value;

/// The `_meta` key a client may name the operation by instead of the argument, and the key
/// the proxy forwards it under when a tool's `forward_operation_id` is `"_meta"`.
pub const META_OPERATION_ID: &str = "io.toolledger/operation_id";

/// Why a configuration was refused.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The file is not valid TOML of this shape (the message names the key, never a path).
    #[error("the proxy configuration is invalid: {0}")]
    Invalid(String),
}

/// The whole configuration file.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProxyConfig {
    /// The argument guarded tools gain for the operation id (default `operation_id`).
    #[serde(default)]
    pub operation_id_argument: Option<String>,
    /// Seconds a forward may take before its outcome is unknown (default 60).
    #[serde(default)]
    pub call_timeout_seconds: Option<u64>,
    /// Seconds after acceptance during which retries replay and a forward may run.
    #[serde(default)]
    pub authority_ttl_seconds: Option<i64>,
    /// Seconds after acceptance during which a stored result is replayed.
    #[serde(default)]
    pub retention_ttl_seconds: Option<i64>,
    /// Seconds back a call under a new operation id is compared with the caller's unsettled
    /// operations of the same tool and arguments (the re-plan guard); 0 turns it off.
    #[serde(default)]
    pub replan_window_seconds: Option<i64>,
    /// Per tool, by the upstream's tool name.
    #[serde(default)]
    pub tools: BTreeMap<String, ToolConfig>,
    /// Headers sent to an HTTP upstream with every request, by name; `${NAME}` in a value is
    /// replaced by the environment variable `NAME` when the proxy starts
    /// ([`ProxyConfig::upstream_headers`]), so a secret need not be written in the file.
    #[serde(default)]
    pub upstream_headers: BTreeMap<String, String>,
    /// Variables set in a stdio upstream's environment, by name; `${NAME}` as in
    /// `upstream_headers`.
    #[serde(default)]
    pub upstream_env: BTreeMap<String, String>,
    /// Variables removed from a stdio upstream's environment (the ledger's own secrets always
    /// are: [`crate::upstream::STRIPPED_ENV`]).
    #[serde(default)]
    pub upstream_env_remove: Vec<String>,
}

/// One tool's settings; unset ones take the file's defaults.
#[derive(Clone, Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ToolConfig {
    /// Guarded or passed through (default: guarded unless the upstream says `readOnlyHint`).
    #[serde(default)]
    pub guarded: Option<bool>,
    /// The operation id argument of this tool.
    #[serde(default)]
    pub key_argument: Option<String>,
    /// Forward the operation id to the upstream: `"_meta"` or an argument name.
    #[serde(default)]
    pub forward_operation_id: Option<String>,
    /// Seconds a forward may take.
    #[serde(default)]
    pub call_timeout_seconds: Option<u64>,
    /// Authority deadline, seconds after acceptance.
    #[serde(default)]
    pub authority_ttl_seconds: Option<i64>,
    /// Retention deadline, seconds after acceptance.
    #[serde(default)]
    pub retention_ttl_seconds: Option<i64>,
    /// The re-plan guard's window for this tool, in seconds; 0 turns it off.
    #[serde(default)]
    pub replan_window_seconds: Option<i64>,
    /// Scopes the caller must hold, checked at acceptance, before the forward, at replay and
    /// at status.
    #[serde(default)]
    pub required_scopes: Vec<String>,
    /// A read-only lookup that settles an unsure operation.
    #[serde(default)]
    pub reconcile: Option<Reconcile>,
}

/// A read-only upstream tool that finds the effect of one operation.
#[derive(Clone, Debug, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct Reconcile {
    /// The upstream tool to call.
    pub tool: String,
    /// Its arguments; every `{operation_id}` in a string is replaced by the operation's
    /// upstream key (what the forward sent: [`crate::effect::upstream_key`]).
    #[serde(default)]
    pub arguments: serde_json::Map<String, Value>,
    /// A JSON pointer into the lookup's tool result (`/structuredContent/found`): the effect
    /// happened when it points at `true`, a non-empty string, array or object, or a non-zero
    /// number. Required: a configuration without it is refused.
    #[serde(default)]
    pub found_when: Option<String>,
    /// How to build the guarded tool's own result from the lookup's answer once it found the
    /// effect, for a tool that declares an `outputSchema`: a JSON object whose string members
    /// starting with `/` are JSON pointers into the lookup's tool result (`result =
    /// "/structuredContent/email/message_id"`), every other member a literal. The built
    /// result must conform to the tool's output schema, or it is not used.
    #[serde(default)]
    pub result: Option<serde_json::Map<String, Value>>,
}

/// Why a lookup answer could not be mapped into a result.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Unmapped(pub String);

impl Reconcile {
    /// The guarded tool's result built from the lookup's answer `found` by [`Reconcile::result`]
    /// (`None` when no mapping is configured); `Err` names a pointer that resolves to nothing.
    pub fn map_result(&self, found: &Value) -> Option<Result<Value, Unmapped>> {
        fn build(template: &Value, found: &Value) -> Result<Value, Unmapped> {
            match template {
                Value::String(p) if p.starts_with('/') => found
                    .pointer(p)
                    .cloned()
                    .ok_or_else(|| Unmapped(format!("the pointer {p} resolves to nothing"))),
                Value::Object(o) => o
                    .iter()
                    .map(|(k, v)| Ok((k.clone(), build(v, found)?)))
                    .collect::<Result<_, _>>()
                    .map(Value::Object),
                Value::Array(a) => a
                    .iter()
                    .map(|v| build(v, found))
                    .collect::<Result<_, _>>()
                    .map(Value::Array),
                other => Ok(other.clone()),
            }
        }
        let template = self.result.as_ref()?;
        Some(build(&Value::Object(template.clone()), found))
    }

    /// Whether `found_when` resolves to anything at all in `result` (a pointer that resolves
    /// to nothing is a misconfiguration, not a "no").
    pub fn pointer_resolves(&self, result: &Value) -> bool {
        self.found_when
            .as_ref()
            .is_none_or(|p| result.pointer(p).is_some())
    }

    /// The lookup's arguments for the operation whose upstream key is `key`.
    pub fn arguments_for(&self, key: &str) -> serde_json::Map<String, Value> {
        fn substitute(v: &Value, key: &str) -> Value {
            match v {
                Value::String(s) => Value::String(s.replace("{operation_id}", key)),
                Value::Array(a) => Value::Array(a.iter().map(|x| substitute(x, key)).collect()),
                Value::Object(o) => Value::Object(
                    o.iter()
                        .map(|(k, x)| (k.clone(), substitute(x, key)))
                        .collect(),
                ),
                other => other.clone(),
            }
        }
        self.arguments
            .iter()
            .map(|(k, v)| (k.clone(), substitute(v, key)))
            .collect()
    }

    /// Whether the lookup's result (the tool result's JSON) is evidence of the effect.
    pub fn is_evidence(&self, result: &Value) -> bool {
        if result.get("isError") == Some(&Value::Bool(true)) {
            return false;
        }
        let Some(pointer) = &self.found_when else {
            return true;
        };
        match result.pointer(pointer) {
            Some(Value::Bool(b)) => *b,
            Some(Value::String(s)) => !s.is_empty(),
            Some(Value::Array(a)) => !a.is_empty(),
            Some(Value::Object(o)) => !o.is_empty(),
            Some(Value::Number(n)) => n.as_f64().is_some_and(|f| f != 0.0),
            Some(Value::Null) | None => false,
        }
    }
}

/// How the operation id reaches the upstream.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Forward {
    /// Not at all (the default): the upstream sees only its own arguments.
    No,
    /// As the request's `_meta[io.toolledger/operation_id]`.
    Meta,
    /// As this argument.
    Argument(String),
}

/// One tool's settings, resolved against the defaults.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolPolicy {
    /// Guarded by the ledger.
    pub guarded: bool,
    /// The operation id argument.
    pub key_argument: String,
    /// How the id reaches the upstream.
    pub forward: Forward,
    /// Seconds a forward may take.
    pub call_timeout_seconds: u64,
    /// Authority deadline, seconds after acceptance.
    pub authority_ttl_seconds: i64,
    /// Retention deadline, seconds after acceptance.
    pub retention_ttl_seconds: i64,
    /// Scopes the caller must hold.
    pub required_scopes: Vec<String>,
    /// The lookup that settles an unsure operation, if any.
    pub reconcile: Option<Reconcile>,
    /// The re-plan guard's window in seconds (`None`: off).
    pub replan_window_seconds: Option<i64>,
}

/// Default seconds a forward may take.
pub const DEFAULT_CALL_TIMEOUT_SECONDS: u64 = 60;
/// Default authority deadline (one day).
pub const DEFAULT_AUTHORITY_TTL_SECONDS: i64 = 86_400;
/// Default retention deadline (one week).
pub const DEFAULT_RETENTION_TTL_SECONDS: i64 = 604_800;

/// The TTLs and the call timeout of the file (`at` = "") or of one tool (`at` =
/// "tools.NAME."), checked.
fn check_limits(
    at: &str,
    authority: Option<i64>,
    retention: Option<i64>,
    timeout: Option<u64>,
) -> Result<(), ConfigError> {
    for (what, ttl) in [
        ("authority_ttl_seconds", authority),
        ("retention_ttl_seconds", retention),
    ] {
        if ttl.is_some_and(|s| !(1..=toolledger::runtime::MAX_TTL_SECONDS).contains(&s)) {
            return Err(ConfigError::Invalid(format!("{at}{what} is out of range")));
        }
    }
    if timeout == Some(0) {
        return Err(ConfigError::Invalid(format!(
            "{at}call_timeout_seconds must be at least 1"
        )));
    }
    Ok(())
}

/// The re-plan guard's window of the file (`at` = "") or of one tool, checked: 0 (off) up to
/// the longest TTL.
fn check_window(at: &str, window: Option<i64>) -> Result<(), ConfigError> {
    if window.is_some_and(|s| !(0..=toolledger::runtime::MAX_TTL_SECONDS).contains(&s)) {
        return Err(ConfigError::Invalid(format!(
            "{at}replan_window_seconds is out of range (0 turns the guard off)"
        )));
    }
    Ok(())
}

/// Replaces every `${NAME}` in `value` by `env(NAME)`; `Err` names the first variable that is
/// not set. `$` not followed by `{NAME}` stays as it is.
pub fn substitute_env(value: &str, env: impl Fn(&str) -> Option<String>) -> Result<String, String> {
    let mut out = String::with_capacity(value.len());
    let mut rest = value;
    while let Some(at) = rest.find("${") {
        out.push_str(&rest[..at]);
        let after = &rest[at + 2..];
        let name_len = after.find('}').filter(|&n| {
            n > 0
                && !after.as_bytes()[0].is_ascii_digit()
                && after[..n]
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_')
        });
        match name_len {
            Some(n) => {
                let name = &after[..n];
                out.push_str(&env(name).ok_or_else(|| name.to_string())?);
                rest = &after[n + 1..];
            }
            None => {
                out.push_str("${");
                rest = after;
            }
        }
    }
    out.push_str(rest);
    Ok(out)
}

/// The table `section`'s values with `${NAME}` replaced from the environment `env`, in name
/// order; `Err` names the member and the unset variable (never a value).
fn substituted(
    section: &str,
    table: &BTreeMap<String, String>,
    env: impl Fn(&str) -> Option<String>,
) -> Result<Vec<(String, String)>, ConfigError> {
    table
        .iter()
        .map(|(name, value)| {
            substitute_env(value, &env)
                .map(|v| (name.clone(), v))
                .map_err(|var| {
                    ConfigError::Invalid(format!(
                        "{section}.{name} uses ${{{var}}}, which is not set in the environment"
                    ))
                })
        })
        .collect()
}

impl ProxyConfig {
    /// The `[upstream_headers]` with `${NAME}` replaced from the environment `env`, in name
    /// order; `Err` says which header names which unset variable (never a value).
    pub fn upstream_headers(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<(String, String)>, ConfigError> {
        substituted("upstream_headers", &self.upstream_headers, env)
    }

    /// The `[upstream_env]` with `${NAME}` replaced from the environment `env`, in name order;
    /// `Err` says which variable names which unset one (never a value).
    pub fn upstream_env(
        &self,
        env: impl Fn(&str) -> Option<String>,
    ) -> Result<Vec<(String, String)>, ConfigError> {
        substituted("upstream_env", &self.upstream_env, env)
    }

    /// Parses the TOML text of a configuration file and checks it.
    pub fn parse(text: &str) -> Result<Self, ConfigError> {
        let config: ProxyConfig =
            toml::from_str(text).map_err(|e| ConfigError::Invalid(e.message().to_string()))?;
        config.check()?;
        Ok(config)
    }

    fn check(&self) -> Result<(), ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        let name_ok = |s: &str| {
            !s.is_empty()
                && s.len() <= 64
                && s.chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
        };
        if let Some(a) = &self.operation_id_argument {
            if !name_ok(a) {
                return bad("operation_id_argument must be 1 to 64 letters, digits, _ or -".into());
            }
        }
        for (name, value) in &self.upstream_headers {
            let token = |c: char| c.is_ascii_alphanumeric() || "!#$%&'*+-.^_`|~".contains(c);
            if name.is_empty() || !name.chars().all(token) {
                return bad("upstream_headers has a name that is not a valid header name".into());
            }
            if value.chars().any(|c| c.is_control() && c != '\t') {
                return bad(format!("upstream_headers.{name} holds a control character"));
            }
        }
        let env_name_ok = |n: &str| {
            !n.is_empty()
                && !n.contains('=')
                && !n.contains('\0')
                && !n.chars().any(char::is_whitespace)
        };
        for name in self
            .upstream_env
            .keys()
            .chain(self.upstream_env_remove.iter())
        {
            if !env_name_ok(name) {
                return bad(
                    "upstream_env and upstream_env_remove take variable names without `=`, \
                     spaces or NUL"
                        .into(),
                );
            }
        }
        for (name, t) in &self.tools {
            if let Some(a) = &t.key_argument {
                if !name_ok(a) {
                    return bad(format!(
                        "tools.{name}.key_argument is not a valid argument name"
                    ));
                }
            }
            if let Some(f) = &t.forward_operation_id {
                if f != "_meta" && !name_ok(f) {
                    return bad(format!(
                        "tools.{name}.forward_operation_id must be \"_meta\" or an argument name"
                    ));
                }
            }
            check_window(&format!("tools.{name}."), t.replan_window_seconds)?;
            check_limits(
                &format!("tools.{name}."),
                t.authority_ttl_seconds,
                t.retention_ttl_seconds,
                t.call_timeout_seconds,
            )?;
            if let Some(r) = &t.reconcile {
                if r.found_when.is_none() {
                    return bad(format!(
                        "tools.{name}.reconcile.found_when is required: a JSON pointer into the \
                         lookup's result that is true when the effect happened"
                    ));
                }
                if r.found_when.as_deref().is_some_and(|p| !p.starts_with('/')) {
                    return bad(format!(
                        "tools.{name}.reconcile.found_when must be a JSON pointer (\"/…\")"
                    ));
                }
            }
        }
        check_window("", self.replan_window_seconds)?;
        check_limits(
            "",
            self.authority_ttl_seconds,
            self.retention_ttl_seconds,
            self.call_timeout_seconds,
        )
    }

    /// The settings of upstream tool `name`, which the upstream marks read-only or not.
    pub fn policy(&self, name: &str, read_only: bool) -> ToolPolicy {
        let t = self.tools.get(name).cloned().unwrap_or_default();
        ToolPolicy {
            guarded: t.guarded.unwrap_or(!read_only),
            key_argument: t
                .key_argument
                .or_else(|| self.operation_id_argument.clone())
                .unwrap_or_else(|| "operation_id".into()),
            forward: match t.forward_operation_id.as_deref() {
                None => Forward::No,
                Some("_meta") => Forward::Meta,
                Some(arg) => Forward::Argument(arg.to_string()),
            },
            call_timeout_seconds: t
                .call_timeout_seconds
                .or(self.call_timeout_seconds)
                .unwrap_or(DEFAULT_CALL_TIMEOUT_SECONDS),
            authority_ttl_seconds: t
                .authority_ttl_seconds
                .or(self.authority_ttl_seconds)
                .unwrap_or(DEFAULT_AUTHORITY_TTL_SECONDS),
            retention_ttl_seconds: t
                .retention_ttl_seconds
                .or(self.retention_ttl_seconds)
                .unwrap_or(DEFAULT_RETENTION_TTL_SECONDS),
            required_scopes: t.required_scopes,
            reconcile: t.reconcile,
            replan_window_seconds: Some(
                t.replan_window_seconds
                    .or(self.replan_window_seconds)
                    .unwrap_or(toolledger::runtime::DEFAULT_REPLAN_WINDOW_SECONDS),
            )
            .filter(|s| *s > 0),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn defaults_guard_writes_and_pass_reads_through() {
        let c = ProxyConfig::parse("").unwrap();
        let w = c.policy("charge", false);
        assert!(w.guarded);
        assert_eq!(w.key_argument, "operation_id");
        assert_eq!(w.forward, Forward::No);
        assert_eq!(w.call_timeout_seconds, DEFAULT_CALL_TIMEOUT_SECONDS);
        assert!(!c.policy("find", true).guarded);
    }

    #[test]
    fn a_tool_overrides_the_defaults() {
        let c = ProxyConfig::parse(
            r#"
            operation_id_argument = "op"
            call_timeout_seconds = 9
            [tools.charge]
            forward_operation_id = "idempotency_key"
            required_scopes = ["payments:write"]
            [tools.find]
            guarded = true
            forward_operation_id = "_meta"
            [tools.charge.reconcile]
            tool = "find_charge"
            arguments = { reference = "ref-{operation_id}", n = 1 }
            found_when = "/structuredContent/found"
            "#,
        )
        .unwrap();
        let p = c.policy("charge", false);
        assert_eq!(p.key_argument, "op");
        assert_eq!(p.call_timeout_seconds, 9);
        assert_eq!(p.forward, Forward::Argument("idempotency_key".into()));
        assert_eq!(p.required_scopes, vec!["payments:write".to_string()]);
        let r = p.reconcile.unwrap();
        assert_eq!(
            Value::Object(r.arguments_for("k1")),
            json!({"reference": "ref-k1", "n": 1})
        );
        assert!(r.is_evidence(&json!({"structuredContent": {"found": true}})));
        assert!(!r.is_evidence(&json!({"structuredContent": {"found": false}})));
        assert!(!r.is_evidence(&json!({"isError": true, "structuredContent": {"found": true}})));
        let f = c.policy("find", true);
        assert!(f.guarded);
        assert_eq!(f.forward, Forward::Meta);
    }

    #[test]
    fn upstream_headers_take_their_secrets_from_the_environment() {
        let c = ProxyConfig::parse(
            "[upstream_headers]\nAuthorization = \"Bearer ${TL_TOKEN}\"\nX-Plain = \"a$b ${ c}\"\n",
        )
        .unwrap();
        let env = |name: &str| (name == "TL_TOKEN").then(|| "s3cret".to_string());
        assert_eq!(
            c.upstream_headers(env).unwrap(),
            vec![
                ("Authorization".to_string(), "Bearer s3cret".to_string()),
                ("X-Plain".to_string(), "a$b ${ c}".to_string()),
            ]
        );
        let unset = c.upstream_headers(|_| None).unwrap_err().to_string();
        assert!(unset.contains("${TL_TOKEN}"), "{unset}");
        assert!(unset.contains("upstream_headers.Authorization"), "{unset}");
        assert_eq!(
            substitute_env("${A}${A}x", |_| Some("1".into())),
            Ok("11x".into())
        );
        assert_eq!(
            substitute_env("${1A}", |_| Some("1".into())),
            Ok("${1A}".into())
        );
    }

    #[test]
    fn unknown_keys_and_bad_values_are_refused() {
        for text in [
            "nonsense = 1",
            "[tools.a]\nguarded = \"yes\"",
            "[tools.a]\nkey_argument = \"has space\"",
            "[tools.a]\nauthority_ttl_seconds = 0",
            "call_timeout_seconds = 0",
            "[tools.a.reconcile]\ntool = \"b\"\nfound_when = \"found\"",
            "[tools.a.reconcile]\ntool = \"b\"",
            "[upstream_headers]\n\"Bad Name\" = \"x\"",
            "[upstream_headers]\nX-A = \"line\\nbreak\"",
        ] {
            assert!(ProxyConfig::parse(text).is_err(), "{text}");
        }
    }
}
