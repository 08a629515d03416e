"""An OpenAI Agents SDK MCP server whose tool calls go through `call_tool_once`.

    from agents import Agent, Runner
    from agents.mcp import MCPServerStdio
    from toolledger_client import Ledger
    from toolledger_client.adapters.openai_agents import LedgerMCPServer

    inner = MCPServerStdio({"command": "toolledger", "args": ["proxy", "--", "payments-mcp"]})
    async with LedgerMCPServer(inner, Ledger("journal.sqlite"), run_key="invoice-42") as server:
        agent = Agent(name="billing", model=model, mcp_servers=[server])
        await Runner.run(agent, "Charge the customer")

Each tool call's intent is the run key, the tool's name and its canonical arguments (as in the
pydantic-ai adapter): a run restarted under the same run key that asks for the same call gets
the first call's operation id and answer. The operation id argument is hidden from the model;
`get_operation_status` too (the session asks it by itself). Tools annotated `readOnlyHint`
are called directly, without the journal.

Requires `openai-agents` (tested with 0.24).
"""

from __future__ import annotations

import copy
from collections.abc import AsyncIterator, Callable, Mapping
from contextlib import asynccontextmanager
from typing import Any

from agents.mcp import MCPServer
from mcp import types

from .._journal import Ledger, canonical_json
from .._session import DEFAULT_KEY_ARGUMENT, LedgerSession, Outcome, logger

__all__ = ["LedgerMCPServer", "default_intent"]

IntentFn = Callable[[str, str, dict[str, Any]], str]


def default_intent(run_key: str, tool: str, arguments: dict[str, Any]) -> str:
    """`RUN_KEY/TOOL/CANONICAL_ARGUMENTS`: the same call in the same run is the same intent."""
    return f"{run_key}/{tool}/{canonical_json(arguments)}"


def _error_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)], is_error=True)


class LedgerMCPServer(MCPServer):
    """Wraps an Agents SDK MCP server (`MCPServerStdio`, `MCPServerStreamableHttp`, …).

    Args:
        server: the server to wrap; this wrapper connects and cleans it up, and reconnects it
            (cleanup, then connect) when its connection breaks.
        ledger: the journal.
        run_key: what identifies this run across restarts (a task id, a conversation id).
        intent: the intent of a call from the run key, the tool name and its arguments.
        key_arguments, deadline: as for `Ledger.session`.
        hidden_tools: tools not shown to the model.
    """

    def __init__(
        self,
        server: MCPServer,
        ledger: Ledger,
        *,
        run_key: str,
        intent: IntentFn = default_intent,
        key_arguments: Mapping[str, str] | None = None,
        deadline: float = 60.0,
        hidden_tools: frozenset[str] = frozenset({"get_operation_status"}),
    ) -> None:
        super().__init__(use_structured_content=server.use_structured_content)
        # The wrapped server's policies apply as they are.
        for attr in (
            "_needs_approval_policy",
            "_failure_error_function",
            "tool_meta_resolver",
            "custom_data_extractor",
            "tool_input_guardrails",
            "tool_output_guardrails",
        ):
            if hasattr(server, attr):
                setattr(self, attr, getattr(server, attr))
        self.server = server
        self.ledger = ledger
        self.run_key = run_key
        self.intent = intent
        self.deadline = deadline
        self.hidden_tools = hidden_tools
        self._key_arguments = dict(key_arguments or {})
        self._session: LedgerSession | None = None
        self._read_only: set[str] = set()

    @property
    def name(self) -> str:
        return self.server.name

    @asynccontextmanager
    async def _reconnected(self) -> AsyncIterator[MCPServer]:
        try:
            await self.server.cleanup()
        except Exception as exc:  # a broken connection may not close cleanly
            logger.info("cleanup of a broken connection: %s", exc)
        await self.server.connect()
        yield self.server

    async def connect(self) -> None:
        await self.server.connect()
        session = self.ledger.session(
            self.server, reconnect=self._reconnected, key_arguments=self._key_arguments, deadline=self.deadline
        )
        await session.__aenter__()
        self._session = session

    async def cleanup(self) -> None:
        session, self._session = self._session, None
        try:
            if session is not None:
                await session.__aexit__(None, None, None)
        finally:
            await self.server.cleanup()

    async def __aenter__(self) -> LedgerMCPServer:
        await self.connect()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.cleanup()

    async def list_tools(self, run_context: Any = None, agent: Any = None) -> list[types.Tool]:
        shown = []
        for tool in await self.server.list_tools(run_context, agent):
            if tool.name in self.hidden_tools:
                continue
            if tool.annotations is not None and tool.annotations.read_only_hint is True:
                self._read_only.add(tool.name)
            schema = copy.deepcopy(tool.input_schema or {})
            key = self._key_arguments.get(tool.name, DEFAULT_KEY_ARGUMENT)
            (schema.get("properties") or {}).pop(key, None)
            if isinstance(schema.get("required"), list):
                schema["required"] = [r for r in schema["required"] if r != key]
            shown.append(tool.model_copy(update={"input_schema": schema}))
        return shown

    @property
    def cached_tools(self) -> list[types.Tool] | None:
        return self.server.cached_tools

    async def call_tool(
        self, tool_name: str, arguments: dict[str, Any] | None, meta: dict[str, Any] | None = None
    ) -> types.CallToolResult:
        if self._session is None:
            raise RuntimeError("LedgerMCPServer is not connected: call connect() or use `async with`")
        args = dict(arguments or {})
        args.pop(self._key_arguments.get(tool_name, DEFAULT_KEY_ARGUMENT), None)
        if tool_name in self._read_only:
            return await self.server.call_tool(tool_name, args, meta=meta)
        outcome = await self._session.call_tool_once(
            tool_name, args, intent=self.intent(self.run_key, tool_name, args), deadline=self.deadline, meta=meta
        )
        return self._result(outcome)

    @staticmethod
    def _result(outcome: Outcome) -> types.CallToolResult:
        if outcome.state in ("succeeded", "failed") and isinstance(outcome.result, types.CallToolResult):
            return outcome.result
        if outcome.state == "unknown":
            ref = f", status {outcome.status_ref}" if outcome.status_ref else ""
            return _error_result(
                f"The outcome of {outcome.tool} is not known yet (operation {outcome.operation_id}{ref})."
                " It may have happened: do not call it again with other arguments; the same call later resumes it."
            )
        return _error_result(
            f"{outcome.tool} was {outcome.state} ({outcome.error_code}): {outcome.detail or outcome.text}"
        )

    # Everything else is the wrapped server's.
    async def list_prompts(self) -> Any:
        return await self.server.list_prompts()

    async def get_prompt(self, name: str, arguments: dict[str, Any] | None = None) -> Any:
        return await self.server.get_prompt(name, arguments)

    async def list_resources(self, cursor: str | None = None) -> Any:
        return await self.server.list_resources(cursor)

    async def list_resource_templates(self, cursor: str | None = None) -> Any:
        return await self.server.list_resource_templates(cursor)

    async def read_resource(self, uri: str) -> Any:
        return await self.server.read_resource(uri)
