"""The interop story through the Python SDK's session API (`mcp.ClientSession`, mcp==2.3.0)
driven by hand: under 2026-07-28 the client discovers the server, runs create_issue's rounds
itself (first round -> input_required, continuation with requestState and inputResponses),
replays the exact continuation, loses its requestState and starts over, presents a tampered
requestState, and opens a second session that declares no elicitation. Under the initialize
lifecycle the server asks for the body with elicitation/create. Usage: interop_session.py
SPEC_JSON (see interop_common.py). Prints one JSON object, one entry per case.
"""

import asyncio

from mcp import ClientSession
from mcp import types
from mcp.client.stdio import stdio_client

from interop_common import (
    BODY,
    ISSUE,
    case,
    emit,
    http_transport,
    load_spec,
    protocol_error,
    seen,
    single_round_story,
    stdio_params,
    tool_listing,
)

RESPONSES = {"body": {"action": "accept", "content": {"body": BODY}}}


async def answer_body(context, params):
    return types.ElicitResult(action="accept", content={"body": BODY})


def transport(spec):
    if spec["transport"] == "stdio":
        return stdio_client(stdio_params(spec))
    return http_transport(spec)


async def connect(session, spec):
    if spec["lifecycle"] == "2026-07-28":
        await session.discover()
    else:
        await session.initialize()
    return session.protocol_version


def tamper(state):
    middle = len(state) // 2
    flipped = "A" if state[middle] != "A" else "B"
    return state[:middle] + flipped + state[middle + 1 :]


async def multi_round(session, out):
    async def first(arguments):
        return await session.call_tool("create_issue", arguments, allow_input_required=True)

    async def cont(arguments, state):
        return await session.call_tool(
            "create_issue", arguments, input_responses=RESPONSES, request_state=state, allow_input_required=True
        )

    state = {}

    async def first_round():
        r = await first(ISSUE)
        if isinstance(r, types.InputRequiredResult):
            state["s1"] = r.request_state
        return seen(r)

    async def continuation():
        return seen(await cont(ISSUE, state["s1"]))

    async def restart():
        # The requestState is lost: a new first round, then (if the server asks again) the
        # continuation with the new state and the same body.
        r = await first(ISSUE)
        outcome = {"first": seen(r)}
        if isinstance(r, types.InputRequiredResult):
            outcome["final"] = seen(await cont(ISSUE, r.request_state))
        return outcome

    async def tampered():
        args = {"operation_id": "iss-t", "title": "spec"}
        r = await first(args)
        if not isinstance(r, types.InputRequiredResult):
            return {"first": seen(r)}
        try:
            return {"answer": seen(await cont(args, tamper(r.request_state)))}
        except Exception as e:  # a protocol error is what the rules ask for
            return protocol_error(e)

    await case(out, "create_issue_first_round", first_round)
    await case(out, "create_issue", continuation)
    await case(out, "create_issue_continuation_replay", continuation)
    await case(out, "create_issue_restart_without_state", restart)
    await case(out, "tampered_request_state", tampered)


async def main():
    spec = load_spec()
    modern = spec["lifecycle"] == "2026-07-28"
    out = {}
    async with transport(spec) as (read, write):
        async with ClientSession(read, write, elicitation_callback=answer_body) as session:
            out["protocol_version"] = await connect(session, spec)

            async def tools():
                return tool_listing(await session.list_tools())

            await case(out, "tools_list", tools)
            if modern:
                await multi_round(session, out)
            else:

                async def issue():
                    return seen(await session.call_tool("create_issue", ISSUE))

                await case(out, "create_issue", issue)
                await case(out, "create_issue_again", issue)

            async def call(name, arguments):
                return await session.call_tool(name, arguments)

            await single_round_story(call, spec, out)

    async def undeclared():
        # A second session that declares no elicitation capability.
        async with transport(spec) as (read, write):
            async with ClientSession(read, write) as session:
                await connect(session, spec)
                r = await session.call_tool(
                    "create_issue", {"operation_id": "iss-nocap", "title": "spec"}, allow_input_required=modern
                )
                return seen(r)

    await case(out, "create_issue_without_elicitation", undeclared)
    emit(out)


asyncio.run(main())
