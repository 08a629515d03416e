#!/usr/bin/env bash
# Checks the invariants of ARCHITECTURE.md that a script can check (the ones it marks
# "(checked)"). Fast and without a build: `cargo metadata --no-deps`, grep-like reads of the
# sources (test modules left out) and python3. Run from anywhere; it works at the repo root.
# Each failure names the invariant, the file and the line.
set -euo pipefail
cd "$(dirname "$0")/.."

doc=ARCHITECTURE.md
failed=0
fail() {
  echo "architecture: $*" >&2
  failed=1
}
ok() {
  echo "ok: $*"
}

# What the Python checks share: a source file's text without its `#[cfg(test)] mod … { … }`
# blocks (rustfmt puts the closing brace of a top-level module at column 0) and with `//`
# comment lines blanked, so line numbers stay true.
read -r -d '' PYLIB <<'PY' || true
import json, os, re, subprocess, sys

def source(path):
    out, skipping, armed = [], False, False
    for line in open(path, encoding="utf-8").read().split("\n"):
        if skipping:
            out.append("")
            if line == "}":
                skipping = False
            continue
        if line.strip() == "#[cfg(test)]":
            armed = True
            out.append("")
            continue
        if armed and re.match(r"(pub(\(crate\))? )?mod \w+ \{", line):
            skipping, armed = True, False
            out.append("")
            continue
        armed = False
        out.append("" if line.lstrip().startswith("//") else line)
    return "\n".join(out)

def rust_files(*roots):
    for root in roots:
        for d, _, files in os.walk(root):
            for f in sorted(files):
                if f.endswith(".rs"):
                    yield os.path.join(d, f)

def line_of(text, offset):
    return text.count("\n", 0, offset) + 1

problems = []
def problem(msg):
    problems.append(msg)

def finish(what):
    if problems:
        for p in problems:
            print("architecture: " + p, file=sys.stderr)
        sys.exit(1)
    print("ok: " + what)
PY

# Runs the Python check on stdin after PYLIB.
py() {
  local check
  check=$(cat)
  python3 -c "$PYLIB"$'\n'"$check"
}

# 1. Dependency direction. The ordered list is the one in ARCHITECTURE.md's crate-order block;
# it must name every workspace member once, and a crate's normal and build dependencies on
# other workspace crates must point up the list (dev-dependencies are exempt). With the test
# kit last, this also says no crate has it as a normal dependency. Core's own dependencies name
# no database library and no MCP crate.
METADATA=$(cargo metadata --format-version 1 --no-deps --offline 2>/dev/null ||
  cargo metadata --format-version 1 --no-deps)
export METADATA
py <<'PY' || failed=1
doc = open("ARCHITECTURE.md", encoding="utf-8").read()
m = re.search(r"<!-- crate-order:begin -->(.*?)<!-- crate-order:end -->", doc, re.S)
if not m:
    problem("ARCHITECTURE.md has no <!-- crate-order:begin --> … <!-- crate-order:end --> block")
    finish("")
order = re.findall(r"^crates/([A-Za-z0-9_-]+)/", m.group(1), re.M)
meta = json.loads(os.environ["METADATA"])
members = {p["name"]: p for p in meta["packages"] if p["id"] in meta["workspace_members"]}
dirs = {n: os.path.basename(os.path.dirname(p["manifest_path"])) for n, p in members.items()}
if sorted(order) != sorted(dirs.values()) or len(set(order)) != len(order):
    problem("the crate-order block of ARCHITECTURE.md lists %s; the workspace members are %s "
            "(each once)" % (order, sorted(dirs.values())))
    finish("")
rank = {d: i for i, d in enumerate(order)}
for name, p in members.items():
    for d in p["dependencies"]:
        if d["kind"] == "dev" or d["name"] not in members:
            continue
        if rank[dirs[d["name"]]] >= rank[dirs[name]]:
            problem("dependency direction: %s has a %s dependency on %s, which is not above it "
                    "in ARCHITECTURE.md's crate order" % (name, d["kind"] or "normal", d["name"]))
core = members["toolledger-core"]
forbidden = {"rusqlite", "libsqlite3-sys", "tokio-postgres", "postgres", "sqlx", "diesel", "rmcp"}
for d in core["dependencies"]:
    if d["kind"] != "dev" and d["name"] in forbidden:
        problem("toolledger-core depends on %s: core knows no database library and no MCP" % d["name"])
finish("dependency direction: each crate normally depends only on crates listed before it (%s)" % ", ".join(order))
PY

# 2. No hidden or `internal` module: nothing in crates/ declares or names one, and the crates
# users write against (toolledger, toolledger-core, toolledger-mcp) hide no public item.
py <<'PY' || failed=1
pat = re.compile(r"\bmod internal\b|toolledger_mcp::internal\b|\binternal::\w")
hidden = re.compile(r"#\[doc\(hidden\)\]")
for path in rust_files("crates"):
    text = open(path, encoding="utf-8").read()
    for m in pat.finditer(text):
        problem("%s:%d: an `internal` module (`%s`): the public API is the only way in"
                % (path, line_of(text, m.start()), m.group(0)))
for path in rust_files("crates/toolledger/src", "crates/toolledger-core/src", "crates/toolledger-mcp/src"):
    text = source(path)
    for m in hidden.finditer(text):
        problem("%s:%d: #[doc(hidden)] in a crate users write against" % (path, line_of(text, m.start())))
finish("no internal or hidden module")
PY

# 3. Core: every SQL statement on the `operations` table is in ledger.rs; no DDL.
py <<'PY' || failed=1
ops = re.compile(r"\b(FROM|INTO|UPDATE|JOIN|TABLE)\s+operations\b")
ddl = re.compile(r"\b(CREATE|ALTER|DROP)\s+(TABLE|INDEX|UNIQUE INDEX|TRIGGER|VIEW)\b")
for path in rust_files("crates/toolledger-core/src"):
    text = source(path)
    if not path.endswith("/src/ledger.rs"):
        for m in ops.finditer(text):
            problem("%s:%d: SQL on the operations table (`%s`) outside ledger.rs"
                    % (path, line_of(text, m.start()), m.group(0)))
    for m in ddl.finditer(text):
        problem("%s:%d: DDL in core (`%s`): migrations are the drivers'"
                % (path, line_of(text, m.start()), m.group(0)))
finish("core: operations SQL only in ledger.rs, no DDL")
PY

# 4. Core chooses no SQL by dialect: `Dialect::Sqlite` / `Dialect::Postgres` appear only where
# the backend is named (the enum's `as_str`, `store::database_error_code`).
py <<'PY' || failed=1
allowed = {("effect.rs", "as_str"), ("store.rs", "database_error_code")}
arm = re.compile(r"Dialect::(Sqlite|Postgres)\b")
fn = re.compile(r"\bfn\s+(\w+)")
for path in rust_files("crates/toolledger-core/src"):
    text = source(path)
    for m in arm.finditer(text):
        fns = fn.findall(text[:m.start()])
        where = (os.path.relpath(path, "crates/toolledger-core/src"), fns[-1] if fns else "")
        if where not in allowed:
            problem("%s:%d: a dialect branch in core (`%s` in fn %s): what must differ is a "
                    "driver method" % (path, line_of(text, m.start()), m.group(0), where[1] or "?"))
finish("core: no dialect branch")
PY

# 5. No import circle between the CLI's modules (a module's `crate::x` / `super::x` paths,
# `use crate::{x, y}` groups included; test modules left out).
py <<'PY' || failed=1
src = "crates/toolledger-cli/src"
mods = {f[:-3] for f in os.listdir(src) if f.endswith(".rs")}
edges = {}
for m in sorted(mods):
    text = source(os.path.join(src, m + ".rs"))
    names = set(re.findall(r"\b(?:crate|super)::(\w+)", text))
    for group in re.findall(r"\b(?:crate|super)::\{([^}]*)\}", text):
        names |= {g.strip().split("::")[0] for g in group.split(",") if g.strip()}
    edges[m] = sorted((names & mods) - {m})
state, stack = {}, []
def visit(m):
    state[m] = 1
    stack.append(m)
    for n in edges[m]:
        if state.get(n) == 1:
            problem("import circle in the CLI: " + " -> ".join(stack[stack.index(n):] + [n]))
        elif n not in state:
            visit(n)
    stack.pop()
    state[m] = 2
for m in sorted(mods):
    if m not in state:
        visit(m)
finish("no import circle between the CLI's modules")
PY

# 6. SQL stays out of the crates that hold none: the facade, the proxy and the console hold no
# SQL statement; toolledger-mcp only the readiness probe; the CLI only `prune --vacuum`'s. The
# MCP crate, the proxy and the console name no driver.
py <<'PY' || failed=1
allowed = {
    "crates/toolledger-mcp/src/front.rs": {"\"SELECT 1\""},
    "crates/toolledger-cli/src/cmd_prune.rs": {
        "\"PRAGMA page_count\"", "\"PRAGMA auto_vacuum = INCREMENTAL; VACUUM;\"",
        "\"PRAGMA auto_vacuum\""},
}
sql = re.compile(r"\"\s*(SELECT|INSERT|UPDATE|DELETE|CREATE|ALTER|DROP|WITH|PRAGMA|VACUUM|BEGIN)\b[^\"\n]*\"?")
driver = re.compile(r"\b(SqliteStore|PgStore|PgOptions|rusqlite|tokio_postgres|toolledger_sqlite|toolledger_postgres)\b|\bstore::(sqlite|postgres)\b")
for crate in ["toolledger", "toolledger-mcp", "toolledger-proxy", "toolledger-console", "toolledger-cli"]:
    for path in rust_files("crates/%s/src" % crate):
        text = source(path)
        for m in sql.finditer(text):
            if m.group(0) not in allowed.get(path, set()):
                problem("%s:%d: an SQL statement (%s) in %s, which holds none"
                        % (path, line_of(text, m.start()), m.group(0), crate))
        if crate in ("toolledger-mcp", "toolledger-proxy", "toolledger-console"):
            for m in driver.finditer(text):
                problem("%s:%d: %s names a driver (`%s`)" % (path, line_of(text, m.start()), crate, m.group(0)))
finish("no SQL or driver where ARCHITECTURE.md says there is none")
PY

# 7. The map stays a map.
size=$(wc -c <"$doc")
if [ "$size" -gt 25000 ]; then
  fail "$doc is $size bytes, over 25,000: keep it a map, not an inventory"
else
  ok "$doc is $size bytes (at most 25,000)"
fi

if [ "$failed" != 0 ]; then
  echo "architecture: ARCHITECTURE.md's invariants do not hold (above)" >&2
  exit 1
fi
