"""The interop story through the Python SDK's high-level `mcp.Client` (mcp==2.3.0), with an
elicitation callback that answers create_issue's body request: under 2026-07-28 the SDK's own
input_required driver runs the rounds, under the initialize lifecycle the server asks with
elicitation/create; a second client without the callback asks for an issue too. Usage: interop_client.py SPEC_JSON (see interop_common.py). Prints one
JSON object with what the client saw, one entry per case.
"""

import asyncio

from mcp import Client
from mcp import types

from interop_common import BODY, ISSUE, case, emit, load_spec, mode, seen, single_round_story, target, tool_listing


async def answer_body(context, params):
    return types.ElicitResult(action="accept", content={"body": BODY})


async def main():
    spec = load_spec()
    out = {}
    async with Client(target(spec), mode=mode(spec), elicitation_callback=answer_body) as client:
        out["protocol_version"] = client.protocol_version

        async def tools():
            return tool_listing(await client.list_tools())

        await case(out, "tools_list", tools)

        async def issue():
            return seen(await client.call_tool("create_issue", ISSUE))

        # Fresh through the SDK's rounds, then the same call again: the client has no
        # requestState any more and starts over with the same body.
        await case(out, "create_issue", issue)
        await case(out, "create_issue_again", issue)

        async def call(name, arguments):
            return await client.call_tool(name, arguments)

        await single_round_story(call, spec, out)

    async def undeclared():
        # A second client with no elicitation callback declares no elicitation capability.
        async with Client(target(spec), mode=mode(spec)) as plain:
            return seen(await plain.call_tool("create_issue", {"operation_id": "iss-nocap", "title": "spec"}))

    await case(out, "create_issue_without_elicitation", undeclared)
    emit(out)


asyncio.run(main())
