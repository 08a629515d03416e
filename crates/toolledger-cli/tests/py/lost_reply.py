"""Seed 003's lost-reply story driven by the official MCP Python SDK (mcp==2.3.0).

Usage: lost_reply.py TOOLLEDGER_BIN DB_PATH BACKEND_ID

Mode 2026-07-28 (no initialize): first round -> input_required with requestState; the
continuation commits and the server exits before replying (--fault drop-after-commit);
a restarted server answers get_operation_status with the stored result; the exact
continuation replays it. Prints one JSON object with what the client saw and the rows read
back with sqlite3.
"""

import asyncio
import json
import sqlite3
import sys

from mcp import Client, StdioServerParameters
from mcp import types


def params(binary, db, backend, *extra):
    return StdioServerParameters(
        command=binary,
        args=["serve", "--db", db, "--backend-id", backend, "--principal", "alice", *extra],
    )


ARGS = {"operation_id": "py-case-03", "title": "spec"}
BODY = {"body": {"action": "accept", "content": {"body": "alpha"}}}


async def main():
    binary, db, backend = sys.argv[1], sys.argv[2], sys.argv[3]
    out = {}

    async with Client(params(binary, db, backend), mode="2026-07-28") as client:
        first = await client.session.call_tool("create_issue", ARGS, allow_input_required=True)
        out["first_round"] = type(first).__name__
        assert isinstance(first, types.InputRequiredResult), first
        state = first.request_state
        out["input_request_keys"] = sorted((first.input_requests or {}).keys())

    transport = "reply received"
    try:
        async with Client(
            params(binary, db, backend, "--fault", "drop-after-commit"),
            mode="2026-07-28",
            read_timeout_seconds=30,
        ) as client:
            await client.session.call_tool(
                "create_issue", ARGS, input_responses=BODY, request_state=state
            )
    except BaseException as e:  # the server exits before replying
        transport = "unknown; no reply"
        out["transport_error"] = type(e).__name__
    out["transport_after_commit"] = transport

    async with Client(params(binary, db, backend), mode="2026-07-28") as client:
        status = await client.call_tool("get_operation_status", {"operation_id": "py-case-03"})
        out["status"] = status.structured_content
        replay = await client.session.call_tool(
            "create_issue", ARGS, input_responses=BODY, request_state=state
        )
        out["replay"] = replay.structured_content

    conn = sqlite3.connect(db)
    out["physical_issue_rows"] = conn.execute("SELECT count(*) FROM issues").fetchone()[0]
    out["physical_operation_rows"] = conn.execute("SELECT count(*) FROM operations").fetchone()[0]
    conn.close()
    print(json.dumps(out, sort_keys=True))


asyncio.run(main())
