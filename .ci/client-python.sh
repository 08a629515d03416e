#!/usr/bin/env bash
# The Python client package (clients/python) and its framework adapters, tested against a
# toolledger binary. Usage: bash .ci/client-python.sh PATH/TO/toolledger
#
# 1. installs ./clients/python into an empty venv (proving it installs with nothing but its
#    declared dependency, mcp) and imports it;
# 2. in the test venv (target/client-python/venv, reused), installs the pinned versions below,
#    the package, and runs its suite with TOOLLEDGER_BIN and the repo's charge server.
set -euo pipefail
cd "$(dirname "$0")/.."

if [ $# -ne 1 ] || [ ! -x "$1" ]; then
  echo "usage: $0 PATH/TO/toolledger (an executable)" >&2
  exit 2
fi
bin="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"

# The versions the suite is tested with.
MCP='mcp==2.3.0'
PYTEST='pytest==9.2.0'
PYDANTIC_AI='pydantic-ai-slim[mcp]==2.78.0'
OPENAI_AGENTS='openai-agents==0.24.0'
# The trace test: the SDK's in-memory exporter, and the protobufs the OTLP receiver decodes with.
OTEL_SDK='opentelemetry-sdk==1.45.2'
OTEL_PROTO='opentelemetry-proto==1.45.2'

root="$PWD/target/client-python"
mkdir -p "$root"
pip_q=(--quiet --disable-pip-version-check)

echo "== client-python: install into an empty venv"
rm -rf "$root/empty"
python3 -m venv "$root/empty"
"$root/empty/bin/pip" install "${pip_q[@]}" ./clients/python
"$root/empty/bin/python" -c '
import importlib.metadata as m, toolledger_client
deps = m.requires("toolledger-client") or []
core = [d for d in deps if "extra ==" not in d]
assert [d.split(">")[0].split("=")[0].strip() for d in core] == ["mcp"], core
print("toolledger-client", toolledger_client.__version__, "installs; core dependencies:", core)
'
rm -rf "$root/empty"

echo "== client-python: test venv"
if [ ! -x "$root/venv/bin/python" ]; then
  python3 -m venv "$root/venv"
fi
"$root/venv/bin/pip" install "${pip_q[@]}" "$MCP" "$PYTEST" "$PYDANTIC_AI" "$OPENAI_AGENTS" \
  "$OTEL_SDK" "$OTEL_PROTO"
"$root/venv/bin/pip" install "${pip_q[@]}" --force-reinstall --no-deps ./clients/python
# The adapters' frameworks must leave the pinned SDK in place (the charge server needs it).
"$root/venv/bin/python" -c 'import importlib.metadata as m; v = m.version("mcp"); assert v == "2.3.0", v'

echo "== client-python: tests (TOOLLEDGER_BIN=$bin)"
export TOOLLEDGER_BIN="$bin" CHARGE_SERVER="$PWD/tests/proxy/charge_server.py"
(cd clients/python && timeout 300 "$root/venv/bin/python" -m pytest -p no:cacheprovider -q -ra)

# The package declares Python >= 3.10: its core suite (no framework adapters) runs on 3.10 too.
# The first candidate that really runs 3.10 (pyenv's shim may exist without that version set).
py310=""
for candidate in $(command -v python3.10 || true) /root/.pyenv/versions/3.10.*/bin/python; do
  if [ -x "$candidate" ] &&
    "$candidate" -c 'import sys; sys.exit(sys.version_info[:2] != (3, 10))' 2>/dev/null; then
    py310=$candidate
    break
  fi
done
if [ -z "$py310" ]; then
  if [ -n "${TOOLLEDGER_CI:-}" ]; then
    echo "client-python: no Python 3.10 on this machine (python3.10 or pyenv's 3.10)" >&2
    exit 1
  fi
  echo "client-python: SKIPPED the Python 3.10 run: no Python 3.10 here (python3.10 or pyenv's 3.10)" >&2
  exit 0
fi
echo "== client-python: the core suite on $("$py310" --version)"
if [ ! -x "$root/venv310/bin/python" ]; then
  "$py310" -m venv "$root/venv310"
fi
"$root/venv310/bin/pip" install "${pip_q[@]}" "$MCP" "$PYTEST" "$OTEL_SDK" "$OTEL_PROTO"
"$root/venv310/bin/pip" install "${pip_q[@]}" --force-reinstall --no-deps ./clients/python
(cd clients/python && timeout 600 "$root/venv310/bin/python" -m pytest -p no:cacheprovider -q -ra \
  tests/test_serve.py tests/test_journal.py tests/test_proxy.py tests/test_crash.py \
  tests/test_traces.py tests/test_readme.py)
