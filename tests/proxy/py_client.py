"""Drives an MCP server (or a proxy in front of one) with the Python MCP SDK (mcp==2.3.0), one
connection, calls made in order. Usage: py_client.py SPEC_JSON

The spec:
  {"transport": "stdio" | "http",
   "server": {"command", "args", "env"}        stdio: how to start the server (env is added to
                                               the SDK's small default environment)
   "url": "http://.../mcp", "token": "..."     http: the endpoint; the token, if any, is sent as
                                               `Authorization: Bearer <token>`
   "lifecycle": "2026-07-28" | "legacy" | "auto"
   "api": "client" | "session"                 the high-level `mcp.Client` or a hand-driven
                                               `mcp.ClientSession`
   "list_tools": true | false
   "progress": true | false                    ask for progress and print what arrives
   "calls": [{"name", "arguments", "meta"?, "until"?}],   "until": repeat the call (up to 100
                                               times, 100 ms apart) until its result's JSON
                                               contains this text, as an agent polls; the
                                               last result is the one printed
   "roots": ["file:///…"]                      optional: the client offers roots (a
                                               list_roots callback answering these)
   "sampling": "TEXT"}                         optional: the client offers sampling, answering
                                               every request with this text

lifecycle: with api "client", "2026-07-28" is `Client(mode="2026-07-28")`, which adopts that
version without any handshake on the wire; "legacy" is `mode="legacy"` (initialize); "auto" is
the SDK's default (server/discover, falling back to initialize). With api "session",
"2026-07-28" sends server/discover, "legacy" sends initialize, "auto" is not offered.

Output, one JSON line each, flushed as soon as it is known:
  {"connected": {"protocol_version"}}        once the client is ready
  {"roots_asked": N} / {"sampled": N}        each time the server asked for roots / sampling
  {"tools": [...]}                           the listing, when asked for
  {"i": N, "progress": {...}}                a progress notification for call N, when asked for
  {"i": N, "result": CallToolResult}         the result as the SDK returns it (isError included)
  {"i": N, "jsonrpc_error": {"code", "message", "data"?}}
  {"i": N, "sdk_error": {"type", "message"}}  the SDK rejected what came back (a result that
                                             does not fit the negotiated protocol version)
  {"i": N, "transport_error": "..."}         then no further calls are made and the exit is 3
A connection that cannot be opened prints {"transport_error": "..."} and exits 3.

What counts as a transport error: the SDK's "connection closed" (-32000) for a request in
flight, an error that is neither an MCPError nor a pydantic ValidationError, and the stand-ins the SDK's HTTP transport
makes up from an HTTP status when the body held no JSON-RPC error (see SYNTHESIZED).
"""

import asyncio
import json
import sys
from contextlib import AsyncExitStack
from typing import Any

from pydantic import ValidationError

from mcp import Client, ClientSession, StdioServerParameters
from mcp import types
from mcp.client.stdio import get_default_environment, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError

CONNECTION_CLOSED = -32000
# Errors the SDK's streamable HTTP transport synthesizes from an HTTP status (no JSON-RPC error
# in the body): they say the exchange failed, not that the server answered with an error.
SYNTHESIZED = {
    (-32603, "Server returned an error response"),
    (-32600, "Session terminated"),
}
LOST = 3


# The call in flight, so that a failure the SDK raises from its own task group (which cancels
# this driver rather than failing the awaited call) is still reported against that call.
IN_FLIGHT: dict[str, int | None] = {"i": None}
REPORTED: dict[str, bool] = {"lost": False, "done": False}


def emit(obj: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(obj, default=str) + "\n")
    sys.stdout.flush()


def dump(model: Any) -> Any:
    return model.model_dump(by_alias=True, exclude_none=True, mode="json")


def first_leaf(e: BaseException) -> BaseException:
    while isinstance(e, BaseExceptionGroup) and e.exceptions:
        e = e.exceptions[0]
    return e


def is_transport(e: BaseException) -> bool:
    if isinstance(e, ValidationError):
        return False
    if not isinstance(e, MCPError):
        return True
    if e.error.code == CONNECTION_CLOSED:
        return True
    return (e.error.code, e.error.message) in SYNTHESIZED


def describe(e: BaseException) -> str:
    if isinstance(e, MCPError):
        return f"MCPError {e.error.code}: {e.error.message}"
    return f"{type(e).__name__}: {e}"[:500]


def stdio_params(spec: dict[str, Any]) -> StdioServerParameters:
    server = spec["server"]
    return StdioServerParameters(
        command=server["command"],
        args=server.get("args", []),
        env={**get_default_environment(), **(server.get("env") or {})},
    )


def http_transport(spec: dict[str, Any]):
    headers = {"Authorization": "Bearer " + spec["token"]} if spec.get("token") else None
    return streamable_http_client(spec["url"], http_client=create_mcp_http_client(headers=headers))


def callbacks(spec: dict[str, Any]) -> dict[str, Any]:
    """The client's roots and sampling callbacks the spec asks for."""
    out: dict[str, Any] = {}
    asked = {"roots": 0, "sampled": 0}
    if spec.get("roots") is not None:
        roots = [types.Root(uri=u) for u in spec["roots"]]

        async def list_roots(context: Any) -> types.ListRootsResult:
            asked["roots"] += 1
            emit({"roots_asked": asked["roots"]})
            return types.ListRootsResult(roots=roots)

        out["list_roots_callback"] = list_roots
    if spec.get("sampling") is not None:
        text = spec["sampling"]

        async def sample(context: Any, params: Any) -> types.CreateMessageResult:
            asked["sampled"] += 1
            emit({"sampled": asked["sampled"]})
            return types.CreateMessageResult(
                role="assistant", content=types.TextContent(type="text", text=text), model="test-model"
            )

        out["sampling_callback"] = sample
    return out


async def connect(stack: AsyncExitStack, spec: dict[str, Any]):
    """Returns (call_tool, list_tools, protocol_version) over one open connection."""
    lifecycle = spec.get("lifecycle", "legacy")
    if spec.get("api", "client") == "client":
        target = stdio_params(spec) if spec["transport"] == "stdio" else http_transport(spec)
        client = await stack.enter_async_context(Client(target, mode=lifecycle, **callbacks(spec)))
        return client.call_tool, client.list_tools, client.protocol_version
    transport = stdio_client(stdio_params(spec)) if spec["transport"] == "stdio" else http_transport(spec)
    read, write = await stack.enter_async_context(transport)
    session = await stack.enter_async_context(ClientSession(read, write, **callbacks(spec)))
    if lifecycle == "2026-07-28":
        await session.discover()
    elif lifecycle == "legacy":
        await session.initialize()
    else:
        raise ValueError(f"lifecycle {lifecycle!r} is not offered with api 'session'")
    return session.call_tool, session.list_tools, session.protocol_version


async def list_all(list_tools) -> list[Any]:
    tools, cursor = [], None
    while True:
        page = await list_tools(cursor=cursor) if cursor else await list_tools()
        tools.extend(dump(t) for t in page.tools)
        cursor = page.next_cursor
        if not cursor:
            return tools


def progress_printer(i: int):
    async def on_progress(progress: float, total: float | None, message: str | None) -> None:
        emit({"i": i, "progress": {"progress": progress, "total": total, "message": message}})

    return on_progress


async def drive(spec: dict[str, Any]) -> int:
    async with AsyncExitStack() as stack:
        try:
            call_tool, list_tools, version = await connect(stack, spec)
        except Exception as e:
            emit({"transport_error": describe(first_leaf(e))})
            REPORTED["lost"] = True
            return LOST
        emit({"connected": {"protocol_version": version}})
        if spec.get("list_tools"):
            try:
                emit({"tools": await list_all(list_tools)})
            except Exception as e:
                e = first_leaf(e)
                if is_transport(e):
                    emit({"transport_error": describe(e)})
                    REPORTED["lost"] = True
                    return LOST
                if isinstance(e, ValidationError):
                    emit({"list_tools_error": {"type": "ValidationError", "message": str(e)[:1000]}})
                else:
                    emit({"list_tools_error": dump(e.error)})
        for i, call in enumerate(spec.get("calls", [])):
            IN_FLIGHT["i"] = i
            kwargs: dict[str, Any] = {}
            if call.get("meta") is not None:
                kwargs["meta"] = call["meta"]
            if spec.get("progress"):
                kwargs["progress_callback"] = progress_printer(i)
            try:
                result = await call_tool(call["name"], call.get("arguments") or {}, **kwargs)
                for _ in range(100 if call.get("until") else 0):
                    if call["until"] in json.dumps(dump(result)):
                        break
                    await asyncio.sleep(0.1)
                    result = await call_tool(call["name"], call.get("arguments") or {}, **kwargs)
            except Exception as e:
                e = first_leaf(e)
                if is_transport(e):
                    emit({"i": i, "transport_error": describe(e)})
                    REPORTED["lost"] = True
                    return LOST
                if isinstance(e, ValidationError):
                    emit({"i": i, "sdk_error": {"type": "ValidationError", "message": str(e)[:1000]}})
                else:
                    emit({"i": i, "jsonrpc_error": dump(e.error)})
                continue
            emit({"i": i, "result": dump(result)})
        IN_FLIGHT["i"] = None
        REPORTED["done"] = True
    return 0


def main() -> None:
    spec = json.loads(sys.argv[1])
    try:
        code = asyncio.run(drive(spec))
    except (KeyboardInterrupt, SystemExit):
        raise
    except BaseException as e:  # the transport failed outside an awaited call, or while closing
        message = describe(first_leaf(e))
        print(f"py_client: {message}", file=sys.stderr)
        if REPORTED["done"] and not REPORTED["lost"]:
            sys.exit(0)  # every call was answered; only the goodbye failed
        if not REPORTED["lost"]:
            line: dict[str, Any] = {"transport_error": message}
            if IN_FLIGHT["i"] is not None:
                line = {"i": IN_FLIGHT["i"], **line}
            emit(line)
        code = LOST
    sys.exit(code)


if __name__ == "__main__":
    main()
