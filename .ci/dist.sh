#!/usr/bin/env bash
# Builds toolledger's user packages from the release build and tests each one installed the way
# a user installs it, with no Rust toolchain on the PATH:
#
#   target/dist/toolledger-<version>-py3-none-<platform>.whl   PyPI (maturin, bindings = "bin")
#   target/dist/toolledger-<version>.tgz                       npm launcher `toolledger`
#   target/dist/toolledger-cli-linux-x64-<version>.tgz         npm `@toolledger/cli-linux-x64`
#
# Steps (each one timed; the table is printed at the end and kept in target/dist/timings.txt):
#   release build   cargo build --release -p toolledger-cli --no-default-features (no bench harness)
#                   already; otherwise this is the run's one release compile
#   share           the man page and the bash/zsh/fish completions, from the built binary
#   maturin         maturin from PyPI, in its own venv under target/dist-tools/
#   wheel           maturin build: the same cargo invocation, so it reuses the release build
#                   (checked: target/release/toolledger is not rebuilt, and the wheel's
#                   binary is that file byte for byte)
#   wheel test      a fresh venv in an empty temp directory: the wheel and mcp==2.3.0;
#                   `toolledger --version`, `toolledger demo proxy`, and one guarded tool call
#                   through `toolledger proxy` with the official Python MCP SDK's Client, in
#                   front of a tiny MCPServer upstream (plus its replay)
#   npm packages    packaging/npm/generate.mjs, then `npm pack` into target/dist/
#   npm test        both tarballs installed into an empty prefix with an unreachable registry
#                   and an empty cache (--offline): `npx --no-install toolledger --version`,
#                   `... demo proxy`, an exit code and a SIGTERM passed through the launcher,
#                   and the launcher's error without its platform package
#
# Needs: cargo, python3 (3.8+, with venv), network access to PyPI (maturin, mcp), and Node.js
# 22 with npm: $TOOLLEDGER_NODE (as exported by .ci/run) names the node binary, otherwise
# `bash .ci/node.sh` provides it. Idempotent: every output is rebuilt in place.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
DIST=$ROOT/target/dist
TOOLS=$ROOT/target/dist-tools
BIN=$ROOT/target/release/toolledger
MATURIN_VERSION=1.16.0
MCP_VERSION=2.3.0
# An address where nothing listens: any attempt to reach a registry fails at once.
DEAD_REGISTRY=http://127.0.0.1:9/

export CARGO_TERM_COLOR=never

TIMINGS=()
WARNINGS=()
step_name=""
step_start=""
begin() {
  step_name=$1
  step_start=$EPOCHREALTIME
  echo
  echo "== dist: $step_name"
}
end() {
  local secs
  secs=$(awk -v a="$step_start" -v b="$EPOCHREALTIME" 'BEGIN { printf "%.1f", b - a }')
  TIMINGS+=("$(printf '%-16s %7ss' "$step_name" "$secs")")
  echo "-- $step_name: ${secs}s"
}
warn() {
  WARNINGS+=("$1")
  {
    echo
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo "!!! WARNING: $1"
    echo "!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!!"
    echo
  } >&2
}
die() {
  echo "dist: FAILED: $*" >&2
  exit 1
}
sha() { sha256sum "$1" | cut -d' ' -f1; }

# A PATH for the install tests: the system's directories, less any holding cargo or rustc.
clean_path() {
  local out="" dir
  for dir in /usr/local/sbin /usr/local/bin /usr/sbin /usr/bin /sbin /bin; do
    [ -d "$dir" ] || continue
    [ -e "$dir/cargo" ] || [ -e "$dir/rustc" ] && continue
    out=${out:+$out:}$dir
  done
  echo "$out"
}

TMP_DIRS=()
cleanup() {
  local dir
  for dir in "${TMP_DIRS[@]}"; do rm -rf "$dir"; done
}
trap cleanup EXIT
new_tmp() {
  local dir
  dir=$(mktemp -d "${TMPDIR:-/tmp}/toolledger-dist.XXXXXX")
  TMP_DIRS+=("$dir")
  echo "$dir"
}

VERSION=$(sed -n '/^\[workspace\.package\]/,/^\[/s/^version *= *"\([^"]*\)".*/\1/p' Cargo.toml)
[ -n "$VERSION" ] || die "no version in Cargo.toml [workspace.package]"
echo "toolledger $VERSION"
mkdir -p "$DIST" "$TOOLS"

# Node.js 22 and npm, and the Python the venvs are made from (the real interpreter, not a shim
# that needs its own PATH).
if [ -n "${TOOLLEDGER_NODE:-}" ]; then
  NODE_BIN=$(dirname "$TOOLLEDGER_NODE")
else
  NODE_BIN=$(bash .ci/node.sh)
fi
"$NODE_BIN/node" --version >/dev/null
NPM=$(PATH="$NODE_BIN:$PATH" command -v npm) || die "npm not found"
PYTHON=$(python3 -c 'import sys; print(sys.executable)')
CLEAN_PATH=$(clean_path)

# ---------------------------------------------------------------------------------------------
begin "release build"
cargo build --release -p toolledger-cli --no-default-features --locked
[ -x "$BIN" ] || die "$BIN was not built"
bin_sha=$(sha "$BIN")
"$BIN" --version
# The packaged binary carries no bench harness: the command is known and says how to get it.
bench_rc=0
bench_err=$("$BIN" bench --ops 1 2>&1 >/dev/null) || bench_rc=$?
[ "$bench_rc" = 2 ] && grep -q '"code":"BENCH_NOT_BUILT"' <<<"$bench_err" \
  || die "the packaged binary should refuse bench with BENCH_NOT_BUILT (exit $bench_rc: $bench_err)"
echo "bench harness left out: $bench_err"
end

# ---------------------------------------------------------------------------------------------
begin "share"
# The man page and completions, laid out as under a prefix's share/; the wheel ships them as
# data (installed under the environment's prefix), the npm platform package under share/.
SHARE=$DIST/share
WHEEL_DATA=$DIST/wheel-data # [tool.maturin] data in pyproject.toml; must exist, even empty
rm -rf "$SHARE" "$WHEEL_DATA"
mkdir -p "$SHARE" "$WHEEL_DATA"
if "$BIN" manpage >/dev/null 2>&1; then
  mkdir -p "$SHARE/man/man1"
  "$BIN" manpage >"$SHARE/man/man1/toolledger.1"
  grep -q '^\.TH' "$SHARE/man/man1/toolledger.1" || die "toolledger manpage printed no .TH line"
  echo "man page: $(wc -c <"$SHARE/man/man1/toolledger.1") bytes"
else
  warn "\`toolledger manpage\` is not in this build: the wheel and the npm packages carry NO man page"
fi
if "$BIN" completions bash >/dev/null 2>&1; then
  mkdir -p "$SHARE/bash-completion/completions" "$SHARE/zsh/site-functions" \
    "$SHARE/fish/vendor_completions.d"
  "$BIN" completions bash >"$SHARE/bash-completion/completions/toolledger"
  "$BIN" completions zsh >"$SHARE/zsh/site-functions/_toolledger"
  "$BIN" completions fish >"$SHARE/fish/vendor_completions.d/toolledger.fish"
  bash -n "$SHARE/bash-completion/completions/toolledger" || die "the bash completion does not parse"
  for f in "$SHARE/zsh/site-functions/_toolledger" "$SHARE/fish/vendor_completions.d/toolledger.fish"; do
    [ -s "$f" ] || die "$f is empty"
  done
  echo "completions: bash, zsh, fish"
else
  warn "\`toolledger completions\` is not in this build: the wheel and the npm packages carry NO shell completions"
fi
if [ -n "$(ls -A "$SHARE")" ]; then
  mkdir -p "$WHEEL_DATA/data"
  cp -R "$SHARE" "$WHEEL_DATA/data/share"
fi
end

# ---------------------------------------------------------------------------------------------
begin "maturin"
MATURIN_VENV=$TOOLS/maturin-$MATURIN_VERSION
if [ "$("$MATURIN_VENV/bin/maturin" --version 2>/dev/null || true)" != "maturin $MATURIN_VERSION" ]; then
  rm -rf "$MATURIN_VENV"
  "$PYTHON" -m venv "$MATURIN_VENV"
  "$MATURIN_VENV/bin/pip" install --quiet --disable-pip-version-check "maturin==$MATURIN_VERSION"
fi
"$MATURIN_VENV/bin/maturin" --version
end

# ---------------------------------------------------------------------------------------------
begin "wheel"
rm -f "$DIST"/toolledger-*.whl
# pyproject.toml's [tool.maturin] (the release profile, --locked, no strip) makes maturin's
# `cargo rustc --profile release --bin toolledger` the same build as step one's: cargo finds it
# fresh. `-v` has cargo say why it would compile anything (its "Dirty" lines).
"$MATURIN_VENV/bin/maturin" build -v --out "$DIST" >"$DIST/maturin.log" 2>&1 \
  || { tail -n 60 "$DIST/maturin.log" >&2; die "maturin build failed (target/dist/maturin.log)"; }
grep -E '^ *(Dirty|Compiling|Finished)|Built wheel|[Ww]arning|^error' "$DIST/maturin.log" || true
shopt -s nullglob
wheels=("$DIST"/toolledger-*.whl)
shopt -u nullglob
[ "${#wheels[@]}" -eq 1 ] || die "expected one wheel in $DIST, found ${#wheels[@]}"
WHEEL=${wheels[0]}
if [ "$(sha "$BIN")" != "$bin_sha" ] || grep -q '^ *Compiling toolledger' "$DIST/maturin.log"; then
  # Either the sources changed since step one (a commit moves HEAD, which the CLI's build
  # script watches for --version) or maturin's cargo flags differ from `cargo build`'s. A CI run
  # on a fresh clone has no such change: there it is the flags, and a second compile.
  msg="maturin compiled toolledger again instead of reusing the release build (its \"Dirty\" lines above say why)"
  if [ -n "${CI:-}" ]; then die "$msg; see [tool.maturin] in pyproject.toml"; fi
  warn "$msg"
  bin_sha=$(sha "$BIN")
else
  echo "maturin reused the release build: target/release/toolledger unchanged (sha256 $bin_sha)"
fi
# And the other way round: cargo finds maturin's build fresh, so the two are one build.
cargo build --release -p toolledger-cli --no-default-features --locked -v >"$DIST/cargo-after-maturin.log" 2>&1 \
  || { tail -n 40 "$DIST/cargo-after-maturin.log" >&2; die "cargo build failed after maturin"; }
if grep -E '^ *(Dirty|Compiling) toolledger' "$DIST/cargo-after-maturin.log"; then
  die "cargo build --release compiles again after maturin's build: the two builds' flags differ (see [tool.maturin] in pyproject.toml)"
fi
[ "$(sha "$BIN")" = "$bin_sha" ] || die "cargo build --release rewrote target/release/toolledger after maturin's build"
echo "cargo build --release after maturin: fresh"
"$PYTHON" - "$WHEEL" "$BIN" "$VERSION" "$SHARE" <<'PY'
import hashlib, os, sys, zipfile
wheel, binary, version, share = sys.argv[1:]
z = zipfile.ZipFile(wheel)
names = z.namelist()
data = [n for n in names if ".data/" in n]
scripts = [n for n in data if "/scripts/" in n]
assert len(scripts) == 1 and scripts[0].endswith("/scripts/toolledger"), scripts
info = z.getinfo(scripts[0])
assert (info.external_attr >> 16) & 0o111, "the binary is not executable in the wheel"
with open(binary, "rb") as f:
    assert hashlib.sha256(z.read(scripts[0])).digest() == hashlib.sha256(f.read()).digest(), \
        "the wheel's binary is not target/release/toolledger"
want = sorted(os.path.relpath(os.path.join(d, f), share)
              for d, _, fs in os.walk(share) for f in fs)
have = sorted(n.split("/data/share/", 1)[1] for n in data if "/data/share/" in n)
assert have == want, (have, want)
meta = z.read(next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
headers = dict(line.split(": ", 1) for line in meta.split("\n\n", 1)[0].splitlines() if ": " in line)
assert headers["Name"] == "toolledger", headers["Name"]
assert headers["Requires-Python"] == ">=3.8", headers.get("Requires-Python")
assert headers.get("License-Expression") == "MIT OR Apache-2.0", headers.get("License-Expression")
print(f"{os.path.basename(wheel)}: Version {headers['Version']} (workspace {version}); "
      f"scripts/toolledger = target/release/toolledger; data: {', '.join(have) or 'none'}")
PY
end

# ---------------------------------------------------------------------------------------------
begin "wheel test"
T=$(new_tmp)
mkdir -p "$T/home" "$T/work"
"$PYTHON" -m venv "$T/venv"
"$T/venv/bin/pip" install --quiet --disable-pip-version-check "$WHEEL" "mcp==$MCP_VERSION"
cat >"$T/work/upstream.py" <<'PY'
"""A tiny upstream MCP server (Python SDK MCPServer, stdio): send_message has an effect, one
line appended to $SENT_LOG per call, and never deduplicates; count_messages is read-only."""
import os

from mcp.server.mcpserver import MCPServer
from mcp.types import ToolAnnotations

SENT_LOG = os.environ["SENT_LOG"]
server = MCPServer(name="dist-upstream", version="1.0.0")


def count() -> int:
    if not os.path.exists(SENT_LOG):
        return 0
    with open(SENT_LOG) as f:
        return sum(1 for _ in f)


@server.tool(description="Send a message. Every call sends one.",
             annotations=ToolAnnotations(read_only_hint=False, idempotent_hint=False))
def send_message(to: str, text: str) -> str:
    with open(SENT_LOG, "a") as f:
        f.write(f"{to}\t{text}\n")
    return f"sent message {count()} to {to}"


@server.tool(description="How many messages were sent.", annotations=ToolAnnotations(read_only_hint=True))
def count_messages() -> int:
    return count()


if __name__ == "__main__":
    server.run()
PY
cat >"$T/work/client.py" <<'PY'
"""Starts `toolledger proxy` over stdio in front of upstream.py with the official Python MCP SDK
Client, calls the guarded tool once, retries it under the same operation id, and checks the
answers and that the upstream acted once."""
import asyncio
import os
import sys

from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment

here = os.path.dirname(os.path.abspath(__file__))
ledger, sent_log = os.path.join(here, "ledger.sqlite"), os.path.join(here, "sent.log")


def ledger_meta(result):
    return (result.model_dump(by_alias=True, mode="json").get("_meta") or {}).get("io.toolledger/ledger")


def text(result):
    return [c.text for c in result.content if c.type == "text"]


async def main() -> None:
    params = StdioServerParameters(
        command="toolledger",
        args=["proxy", "--db", ledger, "--", sys.executable, os.path.join(here, "upstream.py")],
        env={**get_default_environment(), "SENT_LOG": sent_log},
    )
    async with Client(params) as client:
        tools = {t.name: t for t in (await client.list_tools()).tools}
        assert {"send_message", "count_messages", "get_operation_status"} <= set(tools), sorted(tools)
        assert "operation_id" in tools["send_message"].input_schema.get("required", []), tools["send_message"].input_schema
        args = {"to": "alice", "text": "hello", "operation_id": "msg-1"}
        first = await client.call_tool("send_message", args)
        assert not first.is_error, first
        assert text(first) == ["sent message 1 to alice"], text(first)
        assert ledger_meta(first)["replayed"] is False, ledger_meta(first)
        again = await client.call_tool("send_message", args)
        assert not again.is_error, again
        assert text(again) == text(first), (text(again), text(first))
        assert ledger_meta(again)["replayed"] is True, ledger_meta(again)
        counted = await client.call_tool("count_messages", {})
        assert text(counted) == ["1"], text(counted)
        print(f"proxied send_message: {text(first)[0]!r}, replayed on retry; "
              f"protocol {client.protocol_version}; upstream acted once")
    with open(sent_log) as f:
        assert f.read() == "alice\thello\n"


asyncio.run(main())
PY
(
  cd "$T/work"
  export HOME=$T/home PATH=$T/venv/bin:$CLEAN_PATH
  unset TOOLLEDGER_DB TOOLLEDGER_DATABASE_URL VIRTUAL_ENV CARGO_HOME RUSTUP_HOME
  if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    die "cargo or rustc is on the test PATH ($PATH)"
  fi
  [ "$(command -v toolledger)" = "$T/venv/bin/toolledger" ] || die "toolledger is not the venv's"
  toolledger --version | tee "$T/version"
  grep -q "^toolledger $VERSION\b" "$T/version" || die "toolledger --version does not say $VERSION"
  toolledger demo proxy
  for f in $(cd "$SHARE" && find . -type f); do
    [ -f "$T/venv/share/$f" ] || die "the wheel did not install share/$f"
    echo "installed: venv/share/${f#./}"
  done
  python client.py
)
end

# ---------------------------------------------------------------------------------------------
begin "npm packages"
NPM_OUT=$DIST/npm
rm -rf "$NPM_OUT"
rm -f "$DIST"/toolledger-*.tgz
share_arg=()
[ -n "$(ls -A "$SHARE")" ] && share_arg=(--share "$SHARE")
PATH="$NODE_BIN:$PATH" node packaging/npm/generate.mjs --out "$NPM_OUT" "${share_arg[@]}" \
  --binary "linux-x64=$BIN"
for pkg in toolledger cli-linux-x64; do
  (cd "$NPM_OUT/$pkg" && PATH="$NODE_BIN:$PATH" "$NPM" pack --silent --pack-destination "$DIST" >/dev/null)
done
LAUNCHER_TGZ=$DIST/toolledger-$VERSION.tgz
PLATFORM_TGZ=$DIST/toolledger-cli-linux-x64-$VERSION.tgz
[ -f "$LAUNCHER_TGZ" ] && [ -f "$PLATFORM_TGZ" ] || die "npm pack did not write $LAUNCHER_TGZ and $PLATFORM_TGZ"
for tgz in "$LAUNCHER_TGZ" "$PLATFORM_TGZ"; do
  tar -tvzf "$tgz" >"$tgz.list"
  echo "${tgz#"$ROOT"/}:"
  sed 's/^/  /' "$tgz.list"
done
grep -q '^-rwx.* package/bin/toolledger$' "$PLATFORM_TGZ.list" || die "the binary is not executable in the tarball"
grep -q '^-rwx.* package/bin/toolledger.js$' "$LAUNCHER_TGZ.list" || die "the launcher is not executable in the tarball"
rm -f "$LAUNCHER_TGZ.list" "$PLATFORM_TGZ.list"
end

# ---------------------------------------------------------------------------------------------
begin "npm test"
T=$(new_tmp)
mkdir -p "$T/home" "$T/prefix" "$T/cache" "$T/bare"
(
  export HOME=$T/home PATH=$NODE_BIN:$CLEAN_PATH
  export npm_config_registry=$DEAD_REGISTRY npm_config_cache=$T/cache npm_config_offline=true \
    npm_config_audit=false npm_config_fund=false npm_config_update_notifier=false \
    npm_config_userconfig=$T/home/.npmrc
  unset TOOLLEDGER_DB TOOLLEDGER_DATABASE_URL CARGO_HOME RUSTUP_HOME
  if command -v cargo >/dev/null || command -v rustc >/dev/null; then
    die "cargo or rustc is on the test PATH ($PATH)"
  fi
  cd "$T/prefix"
  echo '{"private": true}' >package.json
  # The other platforms' packages are optional dependencies that no registry can give here:
  # npm skips them (they are not for this os/cpu anyway).
  "$NPM" install --no-save --loglevel=error "$PLATFORM_TGZ" "$LAUNCHER_TGZ"
  [ -x node_modules/@toolledger/cli-linux-x64/bin/toolledger ] || die "the platform package's binary is not installed executable"
  ls node_modules/@toolledger
  npx --no-install toolledger --version | tee "$T/version"
  grep -q "^toolledger $VERSION\b" "$T/version" || die "toolledger --version through npx does not say $VERSION"
  npx --no-install toolledger demo proxy
  for f in $(cd "$SHARE" && find . -type f); do
    [ -f "node_modules/@toolledger/cli-linux-x64/share/$f" ] || die "the platform package has no share/$f"
    echo "installed: node_modules/@toolledger/cli-linux-x64/share/${f#./}"
  done
  # The launcher passes the binary's exit code through ...
  status=0
  npx --no-install toolledger no-such-command 2>/dev/null || status=$?
  [ "$status" -eq 2 ] || die "a command-line error exited $status through the launcher, not 2"
  # ... and a SIGTERM to the binary (the way a client stops a stdio server), then exits.
  mkfifo "$T/stdin"
  exec 7<>"$T/stdin"
  # (The upstream answers nothing and reads its stdin to the end, so it ends with the proxy.)
  node_modules/.bin/toolledger proxy --db "$T/ledger.sqlite" -- sh -c 'cat >/dev/null; exit 0' \
    <&7 >/dev/null 2>"$T/proxy.err" &
  launcher=$!
  trap 'kill "$launcher" 2>/dev/null || true' EXIT
  child=""
  for _ in $(seq 1 100); do
    child=$(pgrep -P "$launcher" -x toolledger || true)
    [ -n "$child" ] && break
    sleep 0.1
  done
  [ -n "$child" ] || { cat "$T/proxy.err" >&2; die "the launcher did not start the binary"; }
  sleep 1 # let the proxy start its upstream
  kill -TERM "$launcher"
  status=0
  wait "$launcher" || status=$?
  exec 7>&-
  ! kill -0 "$child" 2>/dev/null || die "the binary (pid $child) outlived its launcher after SIGTERM"
  echo "SIGTERM through the launcher: the binary stopped, the launcher exited $status"
  # Without its platform package the launcher says what is missing.
  cp -R node_modules/toolledger "$T/bare/toolledger"
  status=0
  node "$T/bare/toolledger/bin/toolledger.js" --version 2>"$T/bare.err" || status=$?
  [ "$status" -eq 1 ] && grep -q "@toolledger/cli-linux-x64.*is not installed" "$T/bare.err" \
    || { cat "$T/bare.err" >&2; die "no clear error without the platform package"; }
  echo "without @toolledger/cli-linux-x64: $(head -n1 "$T/bare.err")"
)
end

# ---------------------------------------------------------------------------------------------
echo
echo "== dist: artifacts"
for f in "$BIN" "$WHEEL" "$LAUNCHER_TGZ" "$PLATFORM_TGZ"; do
  printf '%-60s %10s bytes\n' "${f#"$ROOT"/}" "$(stat -c %s "$f")"
done
echo
echo "== dist: timings"
printf '%s\n' "${TIMINGS[@]}" | tee "$DIST/timings.txt"
if [ "${#WARNINGS[@]}" -gt 0 ]; then
  echo
  echo "== dist: WARNINGS"
  printf '!!! %s\n' "${WARNINGS[@]}"
fi
echo
echo "== dist passed"
