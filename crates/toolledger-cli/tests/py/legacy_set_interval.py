"""set_interval and create_issue through the official MCP Python SDK (mcp==2.3.0) in legacy
mode (initialize lifecycle, 2025-11-25); create_issue's body is asked for by elicitation.

Usage: legacy_set_interval.py TOOLLEDGER_BIN DB_PATH BACKEND_ID
Prints one JSON object with the negotiated version, the tool names and both replies.
"""

import asyncio
import json
import sys

from mcp import Client, StdioServerParameters
from mcp import types


async def answer_body(context, params):
    return types.ElicitResult(action="accept", content={"body": "alpha"})


async def main():
    binary, db, backend = sys.argv[1], sys.argv[2], sys.argv[3]
    server = StdioServerParameters(
        command=binary,
        args=["serve", "--db", db, "--backend-id", backend, "--principal", "alice"],
    )
    out = {}
    async with Client(server, mode="legacy", elicitation_callback=answer_body) as client:
        out["protocol_version"] = client.protocol_version
        tools = await client.list_tools()
        out["tools"] = sorted(t.name for t in tools.tools)
        created = await client.call_tool(
            "create_automation", {"request_id": "py-c1", "interval_minutes": 30}
        )
        out["created"] = created.structured_content
        args = {
            "request_id": "py-s1",
            "automation_id": created.structured_content["id"],
            "expected_version": 1,
            "interval_minutes": 60,
        }
        first = await client.call_tool("set_interval", args)
        again = await client.call_tool("set_interval", args)
        out["set_interval"] = [first.structured_content, again.structured_content]
        issue_args = {"operation_id": "py-l", "title": "t"}
        first = await client.call_tool("create_issue", issue_args)
        retry = await client.call_tool("create_issue", issue_args)
        out["create_issue_legacy"] = [first.structured_content, retry.structured_content]
    print(json.dumps(out, sort_keys=True))


asyncio.run(main())
