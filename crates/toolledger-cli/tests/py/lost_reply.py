"""The lost-reply story of `create_issue` driven by the official MCP Python SDK (mcp==2.3.0).

Usage: lost_reply.py SPEC_JSON
where SPEC_JSON is {"binary": TOOLLEDGER_BIN, "store_args": [serve flags selecting the
ledger], "env": {variables the server needs, e.g. key variables}}.

Mode 2026-07-28 (no initialize): first round -> input_required with requestState; the
continuation commits and the server exits before replying (--fault drop-after-commit);
a restarted server answers get_operation_status with the stored result; the exact
continuation replays it. Prints one JSON object with what the client saw; the caller reads
the rows back itself.
"""

import asyncio
import json
import sys

from mcp import Client, StdioServerParameters
from mcp import types
from mcp.client.stdio import get_default_environment


def params(spec, *extra):
    # The SDK hands the server only a small default environment, so the key variables
    # (PostgreSQL has no key file) must be passed explicitly.
    return StdioServerParameters(
        command=spec["binary"],
        args=["serve", *spec["store_args"], "--principal", "alice", *extra],
        env={**get_default_environment(), **spec["env"]},
    )


ARGS = {"operation_id": "py-case-03", "title": "spec"}


async def answer_body(context, params):
    # Declares form elicitation (the server asks only clients that did) and answers it.
    return types.ElicitResult(action="accept", content={"body": "alpha"})
BODY = {"body": {"action": "accept", "content": {"body": "alpha"}}}


async def main():
    spec = json.loads(sys.argv[1])
    out = {}

    async with Client(params(spec), mode="2026-07-28", elicitation_callback=answer_body) as client:
        first = await client.session.call_tool("create_issue", ARGS, allow_input_required=True)
        out["first_round"] = type(first).__name__
        assert isinstance(first, types.InputRequiredResult), first
        state = first.request_state
        out["input_request_keys"] = sorted((first.input_requests or {}).keys())

    transport = "reply received"
    try:
        async with Client(
            params(spec, "--fault", "drop-after-commit"),
            mode="2026-07-28",
            read_timeout_seconds=30,
            elicitation_callback=answer_body,
        ) as client:
            await client.session.call_tool(
                "create_issue", ARGS, input_responses=BODY, request_state=state
            )
    except BaseException as e:  # the server exits before replying
        transport = "unknown; no reply"
        out["transport_error"] = type(e).__name__
    out["transport_after_commit"] = transport

    async with Client(params(spec), mode="2026-07-28", elicitation_callback=answer_body) as client:
        status = await client.call_tool("get_operation_status", {"operation_id": "py-case-03"})
        out["status"] = status.structured_content
        replay = await client.session.call_tool(
            "create_issue", ARGS, input_responses=BODY, request_state=state
        )
        out["replay"] = replay.structured_content

    print(json.dumps(out, sort_keys=True))


asyncio.run(main())
