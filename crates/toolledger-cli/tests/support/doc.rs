//! A documentation page's shell examples, run as written and checked against what the page
//! shows.
//!
//! The pages' convention: in a fenced block tagged `sh` or `console`, a line starting with
//! `$ ` begins a command, which goes on over lines ending in `\` and over an open quote; the
//! lines after it, up to the next command or the block's end (blank lines aside), are its
//! output as shown. [`steps`] reads the commands of one [`section`] in order; [`run`] runs
//! them all in one `sh -e` in a directory of the test's choosing, with the built `toolledger`
//! first on `PATH`, each command exactly as written (its exit status, stdout and stderr
//! recorded); [`check`] compares each with the page:
//!
//! - a step shown answering `"gate":"BLOCK"` must exit 1, every other one 0;
//! - output shown whole (every line JSON) must equal the real output line for line;
//! - output shortened with `…` is compared member by member: every `"name":value` it shows
//!   (a string, number, `true`, `false`, `null`, `[]` or `{}`) must be one the real output
//!   holds somewhere;
//! - values that differ on every run (status references, receipt and token ids, bearer
//!   tokens, the process ids in lease owners) are masked on both sides.
//!
//! A command ending in `&` starts a server: the run waits until it says where it listens and
//! stops it when the script ends.
//!
//! A test file takes it with `#[path = "support/doc.rs"] mod doc;`.

#![allow(dead_code)]

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use serde_json::Value;

/// The built binary.
pub const BIN: &str = env!("CARGO_BIN_EXE_toolledger");

/// The text of `docs/NAME`.
pub fn page(name: &str) -> String {
    let path = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../docs")
        .join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// Whether the program `tool` runs (`tool --version`). Missing, a test that needs it says so
/// loudly and skips, except under CI (`TOOLLEDGER_CI` set), where that is a failure.
pub fn require(tool: &str) -> bool {
    let runs = Command::new(tool)
        .arg("--version")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    if !runs {
        toolledger_testkit::machine::skip(&format!("the page's examples need `{tool}`"));
    }
    runs
}

fn heading_level(line: &str) -> Option<usize> {
    let hashes = line.chars().take_while(|c| *c == '#').count();
    (hashes > 0 && line[hashes..].starts_with(' ')).then_some(hashes)
}

/// The section of `text` whose heading line starts with `heading` (`"## 1. "`), up to the
/// next heading of its level or above (headings inside fenced blocks do not count).
pub fn section(text: &str, heading: &str) -> String {
    let mut found: Option<usize> = None;
    let mut fenced = false;
    let mut out = String::new();
    for line in text.lines() {
        if line.trim_start().starts_with("```") {
            fenced = !fenced;
        }
        if !fenced {
            if let Some(level) = heading_level(line) {
                match found {
                    Some(open) if level <= open => break,
                    None if line.starts_with(heading) => found = Some(level),
                    _ => {}
                }
            }
        }
        if found.is_some() {
            out.push_str(line);
            out.push('\n');
        }
    }
    assert!(found.is_some(), "no section {heading:?} on the page");
    out
}

/// One command of a page and the output the page shows under it.
#[derive(Clone, Debug)]
pub struct Step {
    /// The command as written, its lines joined with `\n`.
    pub command: String,
    /// The output as shown (empty when the page shows none).
    pub shown: String,
}

/// Whether `command` goes on past its last line: an open quote, or a `\` at its end.
fn continues(command: &str) -> bool {
    let mut quote: Option<char> = None;
    let mut chars = command.chars();
    while let Some(c) = chars.next() {
        match (quote, c) {
            (Some('\''), '\'') => quote = None,
            (Some('\''), _) => {}
            // A `\` escapes the next character (the guard takes it); at the very end it
            // continues the command on the next line.
            (_, '\\') if chars.next().is_none() => return true,
            (Some('"'), '"') => quote = None,
            (None, '\'' | '"') => quote = Some(c),
            _ => {}
        }
    }
    quote.is_some()
}

/// The commands of `section`'s `sh` and `console` blocks, in order, with their shown output.
pub fn steps(section: &str) -> Vec<Step> {
    let mut steps: Vec<Step> = Vec::new();
    let mut block: Option<bool> = None; // Some(runs) inside a fenced block
    let mut open: Option<String> = None;
    let mut commands_in_block = 0;
    for line in section.lines() {
        let trimmed = line.trim_start();
        if let Some(tag) = trimmed.strip_prefix("```") {
            match block {
                None => {
                    block = Some(matches!(tag.trim(), "sh" | "console"));
                    commands_in_block = 0;
                }
                Some(_) => {
                    assert!(open.is_none(), "a command runs past its block: {open:?}");
                    block = None;
                }
            }
            continue;
        }
        if block != Some(true) {
            continue;
        }
        if let Some(command) = open.as_mut() {
            command.push('\n');
            command.push_str(line);
        } else if let Some(rest) = line.strip_prefix("$ ") {
            open = Some(rest.to_string());
            commands_in_block += 1;
        } else if !line.trim().is_empty() {
            assert!(
                commands_in_block > 0,
                "a line that is no `$ ` command opens a block: {line:?}"
            );
            let last = steps.last_mut().unwrap();
            last.shown.push_str(line);
            last.shown.push('\n');
            continue;
        } else {
            continue;
        }
        if !continues(open.as_deref().unwrap()) {
            let command = open.take().unwrap();
            assert!(
                !command.contains('…'),
                "a shortened command cannot run as written: {command}"
            );
            steps.push(Step {
                command,
                shown: String::new(),
            });
        }
    }
    assert!(!steps.is_empty(), "no `$ ` commands in the section");
    steps
}

/// One step as it ran.
#[derive(Clone, Debug)]
pub struct Ran {
    /// Its exit status.
    pub code: i32,
    /// What it printed on stdout.
    pub stdout: String,
    /// What it printed on stderr.
    pub stderr: String,
}

/// The script [`run`] runs: each step as written, its streams and status recorded under
/// `records`.
fn script(steps: &[Step], records: &Path) -> String {
    let mut s = String::new();
    let mut servers = 0;
    for (i, step) in steps.iter().enumerate() {
        let base = records.join(i.to_string()).display().to_string();
        assert!(!base.contains('\''), "{base}");
        writeln!(s, "_doc_rc=0").unwrap();
        writeln!(
            s,
            "{{ {}\n}} >'{base}.out' 2>'{base}.err' || _doc_rc=$?",
            step.command
        )
        .unwrap();
        writeln!(s, "echo \"$_doc_rc\" >'{base}.rc'").unwrap();
        if step.command.trim_end().ends_with('&') {
            servers += 1;
            assert_eq!(servers, 1, "one server per page section");
            writeln!(
                s,
                "_doc_server=$!\n\
                 trap 'kill $_doc_server 2>/dev/null || true' EXIT\n\
                 _doc_n=0\n\
                 until grep -q '\"listening\"' '{base}.err'; do\n\
                 \x20 kill -0 $_doc_server 2>/dev/null || {{ cat '{base}.err' >&2; exit 96; }}\n\
                 \x20 _doc_n=$((_doc_n + 1)); [ $_doc_n -lt 600 ] || exit 97\n\
                 \x20 sleep 0.1\n\
                 done"
            )
            .unwrap();
        }
    }
    s
}

/// Runs `steps` as written, in order, in one `sh -e` in `dir`, with the directory of the
/// built binary first on `PATH` and none of the variables that would point `toolledger`
/// elsewhere; returns how each step ran (panics when the script itself fails).
pub fn run(steps: &[Step], dir: &Path) -> Vec<Ran> {
    let records = tempfile::tempdir().unwrap();
    let script_path = records.path().join("steps.sh");
    std::fs::write(&script_path, script(steps, records.path())).unwrap();
    let bin_dir = Path::new(BIN).parent().unwrap().to_path_buf();
    let mut path = vec![bin_dir];
    path.extend(std::env::split_paths(
        &std::env::var_os("PATH").unwrap_or_default(),
    ));
    let mut command = Command::new("sh");
    command
        .arg("-e")
        .arg(&script_path)
        .current_dir(dir)
        .env("PATH", std::env::join_paths(path).unwrap())
        .stdin(Stdio::null());
    for var in [
        "TOOLLEDGER_DB",
        "TOOLLEDGER_DATABASE_URL",
        "TOOLLEDGER_STATE_KEY_HEX",
        "TOOLLEDGER_FINGERPRINT_KEY_HEX",
        "TOOLLEDGER_ALLOWED_HOSTS",
        "TOOLLEDGER_MAX_IN_FLIGHT",
        "TOOLLEDGER_MAX_CONNECTIONS",
        "TOOLLEDGER_TEST_HOLD_AT",
    ] {
        command.env_remove(var);
    }
    let out = command.output().expect("sh runs");
    let read = |i: usize, ext: &str| -> Option<String> {
        std::fs::read_to_string(records.path().join(format!("{i}.{ext}"))).ok()
    };
    let ran: Vec<Ran> = (0..steps.len())
        .map_while(|i| {
            Some(Ran {
                code: read(i, "rc")?.trim().parse().unwrap(),
                stdout: read(i, "out").unwrap_or_default(),
                stderr: read(i, "err").unwrap_or_default(),
            })
        })
        .collect();
    assert!(
        out.status.success() && ran.len() == steps.len(),
        "the script stopped ({:?}) after {} of {} steps; last: {:?}\nstderr: {}",
        out.status,
        ran.len(),
        steps.len(),
        ran.last().map(|r| (&steps[ran.len() - 1], r)),
        String::from_utf8_lossy(&out.stderr)
    );
    ran
}

/// `text` with the runs of `chars` after each `prefix` (at least `min` of them, the prefix
/// not inside a word) replaced by `mask`.
fn mask_runs(text: &str, prefix: &str, chars: fn(char) -> bool, min: usize, mask: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut rest = text;
    while let Some(at) = rest.find(prefix) {
        let before = &rest[..at];
        let in_word = before
            .chars()
            .next_back()
            .is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        let after = &rest[at + prefix.len()..];
        let run = after.find(|c: char| !chars(c)).unwrap_or(after.len());
        out.push_str(before);
        out.push_str(prefix);
        if !in_word && run >= min {
            out.push_str(mask);
        } else {
            out.push_str(&after[..run]);
        }
        rest = &after[run..];
    }
    out.push_str(rest);
    out
}

/// `text` with the values that differ on every run masked.
pub fn mask(text: &str) -> String {
    let hex = |c: char| c.is_ascii_hexdigit();
    let digit = |c: char| c.is_ascii_digit();
    let mut t = text.to_string();
    for (prefix, chars, min) in [
        ("op_", hex as fn(char) -> bool, 16),
        ("rcpt_", hex, 16),
        ("tok_", hex, 8),
        ("tl_", hex, 32),
        ("dispatch-", digit, 1),
        ("worker-", digit, 1),
    ] {
        t = mask_runs(&t, prefix, chars, min, "<masked>");
    }
    t
}

/// The JSON string literal starting at `chars[at]` (a `"`): its end (one past the closing
/// quote), or `None` when it does not close.
fn string_end(chars: &[char], at: usize) -> Option<usize> {
    let mut i = at + 1;
    while i < chars.len() {
        match chars[i] {
            '\\' => i += 2,
            '"' => return Some(i + 1),
            _ => i += 1,
        }
    }
    None
}

/// The `"name":value` members `shown` shows with a value that is a string, a number, `true`,
/// `false`, `null`, `[]` or `{}` (the value as compact JSON).
pub fn members(shown: &str) -> BTreeSet<(String, String)> {
    let chars: Vec<char> = shown.chars().collect();
    let skip_space = |mut i: usize| {
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        i
    };
    let mut found = BTreeSet::new();
    let mut i = 0;
    while i < chars.len() {
        if chars[i] != '"' {
            i += 1;
            continue;
        }
        let Some(end) = string_end(&chars, i) else {
            break;
        };
        let literal: String = chars[i..end].iter().collect();
        i = end;
        let colon = skip_space(i);
        if chars.get(colon) != Some(&':') {
            continue;
        }
        let Ok(Value::String(name)) = serde_json::from_str::<Value>(&literal) else {
            continue;
        };
        let start = skip_space(colon + 1);
        let value_end = match chars.get(start) {
            Some('"') => string_end(&chars, start),
            Some('[' | '{') => {
                let close = skip_space(start + 1);
                matches!(chars.get(close), Some(']' | '}')).then_some(close + 1)
            }
            Some(c) if c.is_ascii_alphanumeric() || *c == '-' => Some(
                (start..chars.len())
                    .find(|&j| !(chars[j].is_ascii_alphanumeric() || "-+.".contains(chars[j])))
                    .unwrap_or(chars.len()),
            ),
            _ => None,
        };
        let Some(value_end) = value_end else {
            i = start;
            continue;
        };
        let text: String = chars[start..value_end].iter().collect();
        if let Ok(value) = serde_json::from_str::<Value>(&text) {
            found.insert((name, value.to_string()));
        }
        i = value_end;
    }
    found
}

fn flatten(value: &Value, into: &mut BTreeSet<(String, String)>) {
    match value {
        Value::Object(map) => {
            for (k, v) in map {
                into.insert((k.clone(), v.to_string()));
                flatten(v, into);
            }
        }
        Value::Array(items) => items.iter().for_each(|v| flatten(v, into)),
        _ => {}
    }
}

/// Checks that `ran` is what the page shows for `step` (see the [module docs](self)).
pub fn check(step: &Step, ran: &Ran) {
    let expected = if step.shown.contains("\"gate\":\"BLOCK\"") {
        1
    } else {
        0
    };
    assert_eq!(
        ran.code, expected,
        "`{}` exited {}, the page shows exit {expected}:\n{}{}",
        step.command, ran.code, ran.stdout, ran.stderr
    );
    if step.shown.trim().is_empty() {
        return;
    }
    let shown = mask(&step.shown);
    let actual = mask(&ran.stdout);
    let whole: Option<Vec<Value>> = shown
        .lines()
        .filter(|l| !l.trim().is_empty())
        .map(|l| serde_json::from_str(l).ok())
        .collect();
    if let Some(shown_values) = whole {
        let actual_values: Vec<Value> = actual
            .lines()
            .filter(|l| !l.trim().is_empty())
            .map(|l| {
                serde_json::from_str(l)
                    .unwrap_or_else(|e| panic!("`{}` printed no JSON ({e}): {l}", step.command))
            })
            .collect();
        assert_eq!(
            actual_values, shown_values,
            "`{}` printed other than the page shows",
            step.command
        );
        return;
    }
    let mut held = BTreeSet::new();
    for value in serde_json::Deserializer::from_str(&actual).into_iter::<Value>() {
        let value = value.unwrap_or_else(|e| panic!("`{}` printed no JSON ({e})", step.command));
        flatten(&value, &mut held);
    }
    let members = members(&shown);
    assert!(!members.is_empty(), "nothing to compare in {shown}");
    for member in &members {
        assert!(
            held.contains(member),
            "the page shows {member:?} for `{}`, which its output does not hold: {actual}",
            step.command
        );
    }
}

/// Where a fixture of the repository is.
pub fn example_fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../examples/fixtures")
        .join(name)
}

/// The rows of `toolledger operations list --json` over `ledger.sqlite` in `dir` (what a page's
/// commands left behind).
pub fn ledger_rows(dir: &Path) -> Vec<serde_json::Value> {
    let list = std::process::Command::new(BIN)
        .args(["operations", "list", "--db", "ledger.sqlite", "--json"])
        .current_dir(dir)
        .env_remove("TOOLLEDGER_DATABASE_URL")
        .output()
        .unwrap();
    assert!(list.status.success(), "{list:?}");
    String::from_utf8_lossy(&list.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}
