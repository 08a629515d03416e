"""A hostile stdio MCP upstream, in plain JSON-RPC lines (no SDK): it answers the `initialize`
handshake, then misbehaves as HOSTILE_MODE says.

  endless_pages   every tools/list page names a next cursor, forever (one tool per page)
  many_tools      one tools/list page of HOSTILE_TOOLS tools (default 5000)
  fat_tools       tool definitions of ~1 MiB each, 60 of them over pages of 4
  stderr_flood    writes HOSTILE_STDERR_MB MiB (default 64) to stderr without a newline, then
                  one newline, then behaves: one read-only tool `ping` answering {"pong": true}
  tools           HOSTILE_TOOLS tools named t0, t1, … on one page, each answering {"ok": true}
  task_required   one tool `pay` whose execution.taskSupport is "required" (and `ping`)

Unknown methods (server/discover among them) get -32601, so a client falls back to
`initialize`.
"""

import json
import os
import sys

MODE = os.environ.get("HOSTILE_MODE", "")
TOOLS = int(os.environ.get("HOSTILE_TOOLS", "5000"))


def send(message):
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def tool(name, read_only=False, description=""):
    return {
        "name": name,
        "description": description,
        "inputSchema": {"type": "object", "properties": {}},
        "annotations": {"readOnlyHint": read_only},
    }


def tools_page(cursor):
    if MODE == "endless_pages":
        n = int(cursor or "0")
        return {"tools": [tool(f"t{n}")], "nextCursor": str(n + 1)}
    if MODE == "task_required":
        pay = tool("pay")
        pay["execution"] = {"taskSupport": "required"}
        return {"tools": [pay, tool("ping", read_only=True)]}
    if MODE in ("many_tools", "tools"):
        return {"tools": [tool(f"t{i}") for i in range(TOOLS)]}
    if MODE == "fat_tools":
        n = int(cursor or "0")
        page = [tool(f"fat{n + i}", description="x" * (1 << 20)) for i in range(4)]
        result = {"tools": page}
        if n + 4 < 60:
            result["nextCursor"] = str(n + 4)
        return result
    return {"tools": [tool("ping", read_only=True)]}


def main():
    if MODE == "stderr_flood":
        chunk = "x" * (1 << 20)
        for _ in range(int(os.environ.get("HOSTILE_STDERR_MB", "64"))):
            sys.stderr.write(chunk)
        sys.stderr.write("\n")
        sys.stderr.flush()
    for line in sys.stdin:
        line = line.strip()
        if not line:
            continue
        message = json.loads(line)
        method = message.get("method")
        if "id" not in message:
            continue
        mid = message["id"]
        if method == "initialize":
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "protocolVersion": "2025-06-18",
                "capabilities": {"tools": {}},
                "serverInfo": {"name": "hostile", "version": "1.0.0"},
            }})
        elif method == "tools/list":
            cursor = (message.get("params") or {}).get("cursor")
            send({"jsonrpc": "2.0", "id": mid, "result": tools_page(cursor)})
        elif method == "tools/call":
            name = message["params"]["name"]
            result = {"pong": True} if name == "ping" else {"ok": True}
            send({"jsonrpc": "2.0", "id": mid, "result": {
                "content": [{"type": "text", "text": json.dumps(result)}],
                "structuredContent": result,
            }})
        else:
            send({"jsonrpc": "2.0", "id": mid,
                  "error": {"code": -32601, "message": "method not found"}})


if __name__ == "__main__":
    main()
