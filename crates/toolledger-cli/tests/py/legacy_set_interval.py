"""set_interval and create_issue through the official MCP Python SDK (mcp==2.3.0) in legacy
mode (initialize lifecycle, 2025-11-25); create_issue's body is asked for by elicitation.

Usage: legacy_set_interval.py SPEC_JSON
where SPEC_JSON is {"binary": TOOLLEDGER_BIN, "store_args": [serve flags selecting the
ledger], "env": {variables the server needs, e.g. key variables}}.
Prints one JSON object with the negotiated version, the tool names and both replies.
"""

import asyncio
import json
import sys

from mcp import Client, StdioServerParameters
from mcp import types
from mcp.client.stdio import get_default_environment


async def answer_body(context, params):
    return types.ElicitResult(action="accept", content={"body": "alpha"})


async def main():
    spec = json.loads(sys.argv[1])
    # The SDK hands the server only a small default environment, so the key variables
    # (PostgreSQL has no key file) must be passed explicitly.
    server = StdioServerParameters(
        command=spec["binary"],
        args=["serve", *spec["store_args"], "--principal", "alice"],
        env={**get_default_environment(), **spec["env"]},
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
