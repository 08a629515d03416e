#!/usr/bin/env bash
# The TypeScript client package, @toolledger/client: packed, installed from its tarball into an
# empty directory (with the test toolchain, pinned by clients/typescript/test/install's lockfile),
# then its test suite run there against the installed copy and the given toolledger binary.
#
# Usage: .ci/client-typescript.sh TOOLLEDGER_BIN NODE_BIN_DIR
#   TOOLLEDGER_BIN  the toolledger binary the tests drive (proxy, serve)
#   NODE_BIN_DIR    the directory of Node.js 22's `node` (what .ci/node.sh prints)
# Environment: TOOLLEDGER_PYTHON, a python with mcp==2.3.0 (the test upstream's SDK) and
# opentelemetry-proto (the trace test's receiver): required.
set -euo pipefail
cd "$(dirname "$0")/.."
repo=$PWD

fail() {
  echo "client-typescript: $*" >&2
  exit 1
}

[ $# -eq 2 ] || fail "usage: $0 TOOLLEDGER_BIN NODE_BIN_DIR"
bin=$(realpath "$1") || fail "no toolledger binary at $1"
[ -x "$bin" ] || fail "$bin is not executable"
node_dir=$(realpath "$2") || fail "no directory $2"
[ -x "$node_dir/node" ] || fail "no node in $node_dir"
export PATH="$node_dir:$PATH"
command -v npm >/dev/null || fail "npm is not on the PATH"
node_major=$(node -p 'process.versions.node.split(".")[0]')
[ "$node_major" -ge 22 ] || fail "Node.js 22 or newer is needed (the AI SDK's engines), got $(node --version)"

python=${TOOLLEDGER_PYTHON:-}
[ -n "$python" ] || fail "TOOLLEDGER_PYTHON must name a python with mcp==2.3.0"
"$python" -c 'import mcp.server.mcpserver' 2>/dev/null || fail "$python has no mcp 2.x (pip install 'mcp==2.3.0')"
# The trace test's OTLP receiver decodes the server's export with the official protobufs.
"$python" -c 'import opentelemetry.proto' 2>/dev/null ||
  fail "$python has no opentelemetry-proto (pip install 'opentelemetry-proto==1.45.2')"

pkg="$repo/clients/typescript"
work=$(mktemp -d "${TMPDIR:-/tmp}/toolledger-client-ts.XXXXXX")
trap 'rm -rf "$work"' EXIT
export npm_config_update_notifier=false npm_config_audit=false npm_config_fund=false

echo "client-typescript: packing $pkg"
(cd "$pkg" && npm pack --silent --pack-destination "$work" >/dev/null)
tarballs=("$work"/toolledger-client-*.tgz)
[ ${#tarballs[@]} -eq 1 ] && [ -f "${tarballs[0]}" ] || fail "npm pack made no single tarball"
mv "${tarballs[0]}" "$work/toolledger-client.tgz"
tar -tzf "$work/toolledger-client.tgz" | sort | sed 's/^/  /'

echo "client-typescript: installing it into an empty directory ($work)"
cp "$pkg/test/install/package.json" "$pkg/test/install/package-lock.json" "$work/"
(cd "$work" && npm ci --silent)
[ -f "$work/node_modules/@toolledger/client/package.json" ] && [ ! -L "$work/node_modules/@toolledger/client" ] ||
  fail "the package did not install from its tarball"
(cd "$work" && node -e '
  const m = await import("@toolledger/client");
  const ai = await import("@toolledger/client/ai");
  if (typeof m.Ledger !== "function" || typeof ai.ledgerTools !== "function") process.exit(1);
  console.log("client-typescript: installed @toolledger/client", (await import("@toolledger/client/package.json", { with: { type: "json" } })).default.version);
' --input-type=module) || fail "the installed package does not load"

echo "client-typescript: running the tests against the installed copy"
mkdir -p "$work/test"
cp -R "$pkg/test/." "$work/test/"
rm -rf "$work/test/install"
cd "$work"
export TOOLLEDGER_BIN="$bin" TOOLLEDGER_PYTHON="$python"
export TOOLLEDGER_CHARGE_SERVER="$repo/tests/proxy/charge_server.py"
export TOOLLEDGER_OTLP_RECEIVER="$repo/crates/toolledger-cli/tests/py/otlp_receiver.py"
[ -f "$TOOLLEDGER_CHARGE_SERVER" ] || fail "no $TOOLLEDGER_CHARGE_SERVER"
rc=0
timeout 280 node --test --test-timeout=120000 \
  --test-reporter=spec --test-reporter-destination=stdout \
  --test-reporter=tap --test-reporter-destination="$work/tap.txt" \
  test/*.test.mjs || rc=$?
passed=$(sed -n 's/^# pass \([0-9]*\)$/\1/p' "$work/tap.txt" | tail -n1)
failed=$(sed -n 's/^# fail \([0-9]*\)$/\1/p' "$work/tap.txt" | tail -n1)
echo "client-typescript: ${passed:-0} passed, ${failed:-0} failed"
[ "$rc" -eq 0 ] || fail "the tests failed (exit $rc)"
[ "${passed:-0}" -gt 0 ] || fail "no test ran"
