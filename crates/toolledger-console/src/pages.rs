//! The console's HTML, rendered with maud: every interpolated value is escaped, so a tool
//! name, key or reason containing markup is shown as text.

use maud::{html, Markup, PreEscaped, DOCTYPE};
use serde_json::Value;
use toolledger::operations::{OperationSummary, Unsure, UnsureCount, UnsurePage};

/// The stylesheet (inline: the pages load nothing else).
const STYLE: &str = "body{font-family:system-ui,sans-serif;margin:0;color:#1d2330;background:#f6f7f9}\
header{background:#1d2330;color:#fff;padding:.6rem 1.2rem;display:flex;gap:1rem;align-items:center}\
header a{color:#fff;text-decoration:none;font-weight:600}header .who{margin-left:auto;font-size:.9rem}\
header form{display:inline}main{padding:1rem 1.2rem;max-width:72rem}\
table{border-collapse:collapse;width:100%;background:#fff;margin:.5rem 0 1rem}\
th,td{text-align:left;padding:.35rem .6rem;border-bottom:1px solid #e3e6eb;font-size:.9rem;vertical-align:top}\
th{background:#eef0f4}code,pre{font-family:ui-monospace,monospace;font-size:.85rem}\
pre{white-space:pre-wrap;word-break:break-all;margin:0}\
.counts{display:flex;gap:.6rem;flex-wrap:wrap;margin-bottom:1rem}.count{background:#fff;border:1px solid #e3e6eb;padding:.5rem .8rem;min-width:9rem;text-decoration:none;color:inherit}\
.count b{display:block;font-size:1.4rem}.state{font-weight:600}\
.outcome_unknown,.lease_expired,.dead{color:#b42318}.stuck,.partial{color:#b54708}.accepted{color:#175cd3}\
.note{background:#fff8e6;border:1px solid #f5d58a;padding:.5rem .8rem}\
.error{background:#fdecec;border:1px solid #f3b4b4;padding:.5rem .8rem}\
form.filters{display:flex;gap:.6rem;align-items:end;flex-wrap:wrap}label{display:block;font-size:.85rem}\
textarea{width:100%;max-width:40rem}";

/// The page around `body`, with the viewer's name and the logout form when logged in.
pub fn layout(title: &str, viewer: Option<(&str, &str)>, body: Markup) -> Markup {
    html! {
        (DOCTYPE)
        html lang="en" {
            head {
                meta charset="utf-8";
                meta name="viewport" content="width=device-width, initial-scale=1";
                title { (title) " · toolledger console" }
                style { (PreEscaped(STYLE)) }
            }
            body {
                header {
                    a href="/console" { "toolledger console" }
                    @if let Some((name, csrf)) = viewer {
                        span.who {
                            "signed in as " strong { (name) } " "
                            form method="post" action="/console/logout" {
                                input type="hidden" name="csrf" value=(csrf);
                                button type="submit" { "Sign out" }
                            }
                        }
                    }
                }
                main { (body) }
            }
        }
    }
}

/// The login form; `error` when the last token was not accepted.
pub fn login(csrf: &str, error: bool) -> Markup {
    layout(
        "Sign in",
        None,
        html! {
            h1 { "Sign in" }
            @if error {
                p.error id="login-error" { "The token was not accepted." }
            }
            p { "Paste a bearer token issued with " code { "toolledger principal token add" } "." }
            form method="post" action="/console/login" {
                input type="hidden" name="csrf" value=(csrf);
                label for="token" { "Bearer token" }
                input type="password" id="token" name="token" autocomplete="off" size="60";
                " "
                button type="submit" id="login" { "Sign in" }
            }
        },
    )
}

/// A short human form of `secs` (`45s`, `3m 20s`, `2h 5m`, `4d 3h`).
pub fn age(secs: i64) -> String {
    let s = secs.max(0);
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m {}s", s / 60, s % 60),
        3600..86400 => format!("{}h {}m", s / 3600, (s % 3600) / 60),
        _ => format!("{}d {}h", s / 86400, (s % 86400) / 3600),
    }
}

/// Unix seconds as a UTC date and time (`2026-01-01 00:00:00 UTC`).
pub fn when(secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let rem = secs.rem_euclid(86_400);
    // Civil date from days since 1970-01-01 (proleptic Gregorian calendar).
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}:{:02} UTC",
        rem / 3600,
        (rem % 3600) / 60,
        rem % 60
    )
}

/// A time field of the timeline (Unix seconds) as [`when`]; `—` when absent.
fn time(v: &Value) -> String {
    v.as_i64().map_or_else(|| field(v), when)
}

/// The unsure kind of an operation in the list.
fn kind_of(op: &OperationSummary) -> &'static str {
    Unsure::ALL
        .into_iter()
        .find(|k| k.state() == op.state)
        .map_or(op.state.as_str(), |k| k.as_str())
}

/// The list's filters, as the page got them.
#[derive(Clone, Debug, Default)]
pub struct Filters {
    /// One kind, or every kind.
    pub kind: Option<Unsure>,
    /// One tool.
    pub tool: Option<String>,
    /// Created at least this many seconds ago.
    pub older_than: Option<i64>,
}

impl Filters {
    /// The query string of these filters (without `after`).
    pub fn query(&self) -> String {
        let mut parts = Vec::new();
        if let Some(k) = self.kind {
            parts.push(format!("kind={}", k.as_str()));
        }
        if let Some(t) = &self.tool {
            parts.push(format!("tool={}", encode(t)));
        }
        if let Some(o) = self.older_than {
            parts.push(format!("older_than={o}"));
        }
        parts.join("&")
    }
}

/// Percent-encodes `s` for a query string.
pub fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// The unsure operations page.
pub fn list(
    viewer: (&str, &str),
    scope: &str,
    counts: &[UnsureCount],
    filters: &Filters,
    page: &UnsurePage,
    first_page: bool,
) -> Markup {
    let q = filters.query();
    layout(
        "Unsure operations",
        Some(viewer),
        html! {
            h1 { "Unsure operations" }
            p { "Operations an operator may have to settle, " (scope) ", newest first." }
            div.counts id="counts" {
                @for c in counts {
                    a.count href={ "/console?kind=" (c.kind.as_str()) } data-kind=(c.kind.as_str()) {
                        span class={ "state " (c.kind.as_str()) } { (c.kind.as_str()) }
                        b { (c.count) }
                        @match c.oldest_age_seconds {
                            Some(a) => { "oldest " (age(a)) }
                            None => { "none" }
                        }
                    }
                }
            }
            form.filters method="get" action="/console" {
                div {
                    label for="kind" { "Kind" }
                    select id="kind" name="kind" {
                        option value="" selected[filters.kind.is_none()] { "every kind" }
                        @for k in Unsure::ALL {
                            option value=(k.as_str()) selected[filters.kind == Some(k)] { (k.as_str()) }
                        }
                    }
                }
                div {
                    label for="tool" { "Tool" }
                    input id="tool" name="tool" value=(filters.tool.as_deref().unwrap_or(""));
                }
                div {
                    label for="older_than" { "Older than (seconds)" }
                    input id="older_than" name="older_than" type="number" min="0"
                        value=(filters.older_than.map(|o| o.to_string()).unwrap_or_default());
                }
                button type="submit" { "Filter" }
            }
            @if page.rows.is_empty() {
                p id="empty" { "Nothing unsure matches." }
            } @else {
                table id="operations" {
                    thead { tr { th { "status_ref" } th { "tool" } th { "principal" } th { "state" } th { "age" } } }
                    tbody {
                        @for op in &page.rows {
                            tr data-status-ref=(op.status_ref) {
                                td { a href={ "/console/operations/" (encode(&op.status_ref)) } { code { (op.status_ref) } } }
                                td.tool { (op.tool) }
                                td { (op.tenant) " / " (op.subject) }
                                td { span class={ "state " (kind_of(op)) } { (kind_of(op)) }
                                    @if let Some(until) = op.lease_until { " (lease ended " (when(until)) ")" } }
                                td { (age(op.age_seconds)) }
                            }
                        }
                    }
                }
            }
            p {
                @if !first_page {
                    a href={ "/console?" (q) } { "First page" } " "
                }
                @if let Some(next) = &page.next {
                    a id="next" href={ "/console?" (q) @if !q.is_empty() { "&" } "after=" (encode(next)) } { "Next page" }
                }
            }
        },
    )
}

/// What the operation page may show the viewer.
pub struct Shown<'a> {
    /// The timeline (core's `operations::timeline` JSON).
    pub timeline: &'a Value,
    /// What the downstream holds now (a receipt or none), why this process cannot ask it, or
    /// why asking failed; `None`: not asked (not an operator of the tenant, an inline
    /// operation, or no evidence configured).
    pub downstream: Option<&'a Result<crate::Held, String>>,
    /// Whether the viewer may read arguments (the operation's own principal).
    pub arguments: bool,
    /// Whether the viewer may read the stored result, event details, intent and receipt.
    pub result: bool,
    /// The resolve form's outcomes (empty: no form).
    pub resolve_as: &'a [&'a str],
    /// Why there is no form although the viewer is an operator.
    pub resolve_note: Option<&'a str>,
    /// A refusal of the last resolution attempt: (code, message).
    pub refusal: Option<(&'a str, &'a str)>,
}

fn json_block(v: &Value) -> Markup {
    let text = serde_json::to_string_pretty(v).unwrap_or_default();
    html! { pre { (text) } }
}

fn field(v: &Value) -> String {
    match v {
        Value::Null => "—".into(),
        Value::String(s) => s.clone(),
        other => other.to_string(),
    }
}

/// The operation page: its row, timeline, evidence and the resolve form.
pub fn operation(viewer: (&str, &str), s: &Shown<'_>) -> Markup {
    let t = s.timeline;
    let op = &t["operation"];
    let status_ref = field(&op["status_ref"]);
    let withheld = html! { em { "withheld: visible to the operation's own principal" } };
    let result_withheld =
        html! { em { "withheld: visible to its principal and to operators of its tenant" } };
    layout(
        "Operation",
        Some(viewer),
        html! {
            p { a href="/console" { "← Unsure operations" } }
            h1 { "Operation " code id="status-ref" { (status_ref) } }
            @if let Some((code, message)) = s.refusal {
                p.error id="refusal" { "Refused (" code { (code) } "): " (message) }
            }
            table id="summary" {
                tr { th { "tool" } td.tool { (field(&op["tool"])) } }
                tr { th { "key" } td { code { (field(&op["key"])) } } }
                tr { th { "principal" } td { (field(&op["tenant"])) " / " (field(&op["subject"])) } }
                tr { th { "effect" } td { (field(&op["effect_kind"])) } }
                tr { th { "state" } td { span id="state" class={ "state " (field(&op["state"])) } { (field(&op["state"])) }
                    @if op["stuck"] == Value::Bool(true) { " (stuck past the in-progress expiry)" } } }
                tr { th { "age" } td { (age(op["age_seconds"].as_i64().unwrap_or(0))) } }
                tr { th { "created / updated" } td { (time(&op["created_at"])) " / " (time(&op["updated_at"])) } }
                tr { th { "request digest" } td { code { (field(&op["request_digest"])) } } }
                tr { th { "arguments" } td {
                    @if s.arguments { (json_block(&op["arguments"])) } @else {
                        @if let Some(m) = op["arguments"].as_object() {
                            "members: " code { (m.keys().cloned().collect::<Vec<_>>().join(", ")) } " — "
                        }
                        (withheld)
                    }
                } }
                tr { th { "stored result" } td {
                    @if s.result { (json_block(&op["result"])) } @else { (result_withheld) }
                } }
            }
            h2 { "Events" }
            table id="events" {
                thead { tr { th { "at" } th { "kind" } th { "detail" } } }
                tbody {
                    @for e in t["events"].as_array().into_iter().flatten() {
                        tr {
                            td { (time(&e["at"])) }
                            td.kind { (field(&e["kind"])) }
                            td { @if s.result { (json_block(&e["detail"])) } @else { (result_withheld) } }
                        }
                    }
                }
            }
            h2 { "Attempts, leases and fencing tokens" }
            @if t["claims"].as_array().is_none_or(|c| c.is_empty()) {
                p { "No worker claimed this operation." }
            } @else {
                table id="claims" {
                    thead { tr { th { "at" } th { "attempt" } th { "fencing token" } th { "lease owner" } th { "lease until" } } }
                    tbody {
                        @for c in t["claims"].as_array().into_iter().flatten() {
                            tr { td { (time(&c["at"])) } td { (field(&c["attempt"])) } td { (field(&c["fencing_token"])) }
                                 td { (field(&c["lease_owner"])) } td { (time(&c["lease_until"])) } }
                        }
                    }
                }
            }
            h2 { "Outbox event" }
            @if t["outbox"].is_null() { p { "None (an inline operation)." } } @else { (json_block(&t["outbox"])) }
            h2 { "Evidence: intent and local receipt" }
            @if s.result {
                h3 { "Intent" } (json_block(&t["intent"]))
                h3 { "Receipt" } (json_block(&t["receipt"]))
            } @else { p { (result_withheld) } }
            @if let Some(answer) = s.downstream {
                h2 { "Evidence: what the downstream holds now" }
                div id="downstream-evidence" {
                    @match answer {
                        Ok(crate::Held::Asked(Some(receipt))) => { p { "The downstream holds a receipt: the effect happened." } (json_block(receipt)) }
                        Ok(crate::Held::Asked(None)) => { p { "The downstream holds no receipt for this operation." } }
                        Ok(crate::Held::NotHere(how)) => { p.note id="downstream-elsewhere" { (how) } }
                        Err(why) => { p.error { "The downstream could not be asked: " (why) } }
                    }
                }
            }
            h2 { "Resolution" }
            @if t["resolution"].is_null() { p id="resolution" { "Not resolved by an operator." } } @else {
                table id="resolution" {
                    tr { th { "as" } td { (field(&t["resolution"]["as"])) } }
                    tr { th { "operator" } td { (field(&t["resolution"]["operator"])) } }
                    tr { th { "reason" } td.reason { (field(&t["resolution"]["reason"])) } }
                    tr { th { "previous state" } td { (field(&t["resolution"]["previous_state"])) } }
                    tr { th { "at" } td { (time(&t["resolution"]["at"])) } }
                }
            }
            @if !s.resolve_as.is_empty() {
                h2 { "Resolve" }
                p.note { "Settling records your name, the outcome and the reason as an event of this operation. "
                    "It is refused where " code { "toolledger resolve" } " refuses it." }
                form id="resolve" method="post" action={ "/console/operations/" (encode(&status_ref)) "/resolve" } {
                    input type="hidden" name="csrf" value=(viewer.1);
                    fieldset {
                        legend { "Outcome" }
                        @for a in s.resolve_as {
                            label { input type="radio" name="as" value=(a) required; " " (a) }
                        }
                    }
                    label for="reason" { "Reason (required)" }
                    textarea id="reason" name="reason" rows="3" maxlength="512" required {}
                    label for="evidence" { "Evidence (a JSON object of what you verified; needed to record succeeded when the downstream holds no receipt)" }
                    textarea id="evidence" name="evidence" rows="3" maxlength="16384" placeholder="{\"message_id\": \"…\"}" {}
                    label for="result" { "Result (optional, with succeeded and evidence, for an operation "
                        code { "toolledger proxy" } " recorded: the tool's result as a JSON object, which every retry then receives as a success)" }
                    textarea id="result" name="result" rows="3" maxlength="65536" {}
                    label for="output_schema" { "Output schema (with a result, when the tool declared one: its "
                        code { "outputSchema" } " as the upstream lists it; the result is checked against it)" }
                    textarea id="output_schema" name="output_schema" rows="3" maxlength="65536" {}
                    p { button type="submit" id="resolve-submit" { "Resolve" } }
                }
            } @else if let Some(note) = s.resolve_note {
                p.note id="resolve-note" { (note) }
            }
        },
    )
}

/// A page with one message (errors and refusals).
pub fn message(viewer: Option<(&str, &str)>, title: &str, code: &str, text: &str) -> Markup {
    layout(
        title,
        viewer,
        html! {
            h1 { (title) }
            p.error id="error" { code { (code) } ": " (text) }
            p { a href="/console" { "← Unsure operations" } }
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ages_read_as_the_largest_units() {
        assert_eq!(age(-3), "0s");
        assert_eq!(age(45), "45s");
        assert_eq!(age(200), "3m 20s");
        assert_eq!(age(7500), "2h 5m");
        assert_eq!(age(4 * 86400 + 3 * 3600 + 5), "4d 3h");
    }

    #[test]
    fn unix_seconds_read_as_utc_dates() {
        assert_eq!(when(0), "1970-01-01 00:00:00 UTC");
        assert_eq!(when(1_767_225_600), "2026-01-01 00:00:00 UTC");
        assert_eq!(when(951_825_599), "2000-02-29 11:59:59 UTC");
    }

    #[test]
    fn query_values_are_percent_encoded() {
        assert_eq!(encode("a b&c=<d>"), "a%20b%26c%3D%3Cd%3E");
        let f = Filters {
            kind: Some(Unsure::Dead),
            tool: Some("x&y".into()),
            older_than: Some(60),
        };
        assert_eq!(f.query(), "kind=dead&tool=x%26y&older_than=60");
    }

    #[test]
    fn markup_in_a_shown_value_is_escaped() {
        let page = message(None, "t", "c", "<script>alert(1)</script>");
        let s = page.into_string();
        assert!(s.contains("&lt;script&gt;alert(1)&lt;/script&gt;"), "{s}");
        assert!(!s.contains("<script>"));
    }
}
