#!/usr/bin/env bash
# Makes Node.js 22 and the pinned JavaScript MCP clients available to the tests.
# Node 22 comes from npm's `node` package when the system's Node is older; it is kept under
# target/ so a clean clone needs nothing outside the repository. Prints the directory holding
# the `node` binary to use.
set -euo pipefail
cd "$(dirname "$0")/.."
want=22
have=$(node --version 2>/dev/null | sed -E 's/^v([0-9]+).*/\1/' || echo 0)
if [ "${have:-0}" -ge "$want" ]; then
  bin=$(dirname "$(command -v node)")
else
  prefix="$PWD/target/node$want"
  if [ ! -x "$prefix/node_modules/.bin/node" ]; then
    npm install --silent --no-audit --no-fund --prefix "$prefix" "node@$want" >&2
  fi
  bin="$prefix/node_modules/.bin"
fi
(cd tests/js && PATH="$bin:$PATH" npm ci --silent --no-audit --no-fund >&2)
echo "$bin"
