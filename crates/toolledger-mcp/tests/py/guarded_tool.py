"""Drives examples/guarded_tool.rs over stdio with the official MCP Python SDK (mcp==2.3.0).

Usage: guarded_tool.py SPEC_JSON
where SPEC_JSON is {"command": [server executable, args...], "env": {variables the server
needs, e.g. the database URL and key variables}}.

First session (initialize lifecycle): list the tools, create a note, send the exact call
again, reuse its operation id with other arguments, send a call with an argument the input
schema does not allow. Second session (a new server process, MCP 2026-07-28, no
initialize): ask get_operation_status for the note. Prints one JSON object with what the
client saw; the caller reads the rows back itself.
"""

import asyncio
import json
import sys

from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment


def params(spec):
    # The SDK hands the server only a small default environment.
    return StdioServerParameters(
        command=spec["command"][0],
        args=spec["command"][1:],
        env={**get_default_environment(), **spec["env"]},
    )


async def call(client, name, args):
    r = await client.call_tool(name, args)
    # An error result carries its {"error": …} object as the JSON text of content[0].
    text = r.content[0].text if r.content else None
    return {"is_error": bool(r.is_error), "structured": r.structured_content, "text": text}


NOTE = {"operation_id": "py-note-1", "text": "hello from python"}


async def main():
    spec = json.loads(sys.argv[1])
    out = {}

    async with Client(params(spec), mode="legacy") as client:
        tools = (await client.list_tools()).tools
        out["tools"] = sorted(t.name for t in tools)
        note = next(t for t in tools if t.name == "create_note")
        out["create_note_input_schema"] = note.input_schema
        out["create_note_has_output_schema"] = note.output_schema is not None
        out["first"] = await call(client, "create_note", NOTE)
        out["replay"] = await call(client, "create_note", NOTE)
        out["conflict"] = await call(
            client, "create_note", {"operation_id": "py-note-1", "text": "something else"}
        )
        out["extra_argument"] = await call(
            client, "create_note", {"operation_id": "py-note-2", "text": "x", "priority": 1}
        )

    async with Client(params(spec), mode="2026-07-28") as client:
        out["status"] = await call(client, "get_operation_status", {"operation_id": "py-note-1"})
        out["status_of_refused"] = await call(
            client, "get_operation_status", {"operation_id": "py-note-2"}
        )

    print(json.dumps(out, sort_keys=True))


asyncio.run(main())
