"""A pydantic-ai toolset whose MCP tool calls go through `call_tool_once`.

    from mcp import Client, StdioServerParameters
    from pydantic_ai import Agent
    from toolledger_client import Ledger
    from toolledger_client.adapters.pydantic_ai import LedgerToolset

    toolset = LedgerToolset(Ledger("journal.sqlite"), lambda: Client(params), run_key="invoice-42")
    agent = Agent(model, toolsets=[toolset])

Each tool call's intent is the run key, the tool's name and its canonical arguments: a run
restarted under the same run key (after a crash, a lost reply, a redeploy) that asks for the
same call gets the first call's operation id, and so its answer, instead of a second effect.
The consequence: within one run key, two calls of one tool with equal arguments are one effect;
give `intent=` a function of your own to tell them apart.

Requires `pydantic-ai-slim` (tested with 2.78).
"""

from __future__ import annotations

import copy
from collections.abc import Callable, Mapping
from typing import Any

import pydantic_core
from pydantic_ai import RunContext
from pydantic_ai.exceptions import ModelRetry, ToolFailed
from pydantic_ai.tools import ToolDefinition
from pydantic_ai.toolsets.abstract import AbstractToolset, ToolsetTool

from .._journal import Ledger, canonical_json
from .._session import DEFAULT_KEY_ARGUMENT, AsyncConnect, LedgerSession, Outcome, _wire

__all__ = ["LedgerToolset", "default_intent", "outcome_value"]

_ARGS_VALIDATOR = pydantic_core.SchemaValidator(
    schema=pydantic_core.core_schema.dict_schema(
        pydantic_core.core_schema.str_schema(), pydantic_core.core_schema.any_schema()
    )
)

RunKey = str | Callable[[RunContext[Any]], str]
IntentFn = Callable[[str, str, dict[str, Any]], str]


def default_intent(run_key: str, tool: str, arguments: dict[str, Any]) -> str:
    """`RUN_KEY/TOOL/CANONICAL_ARGUMENTS`: the same call in the same run is the same intent."""
    return f"{run_key}/{tool}/{canonical_json(arguments)}"


def outcome_value(outcome: Outcome) -> Any:
    """What the model is given for a successful outcome: the structured content, else the text."""
    structured = outcome.structured_content
    return structured if structured is not None else outcome.text


class LedgerToolset(AbstractToolset[Any]):
    """The tools of one MCP server, each call made once through a `Ledger`.

    Args:
        ledger: the journal.
        connect: a factory of connections (`lambda: mcp.Client(params)`): the toolset opens one
            when the agent run starts and another whenever it breaks. Or a `LedgerSession` you
            manage yourself.
        run_key: what identifies this run across restarts (a task id, a conversation id), or
            a function of the run context that returns it.
        intent: the intent of a call, from the run key, the tool name and its arguments
            (default: `default_intent`).
        key_arguments, deadline: as for `Ledger.session`.
        hidden_tools: tools not shown to the model (default: `get_operation_status`, which
            the session asks by itself).
        id: the toolset's id for pydantic-ai.
        max_retries: how often the model may retry a failed tool (None: the agent's setting).
    """

    def __init__(
        self,
        ledger: Ledger,
        connect: AsyncConnect | LedgerSession,
        *,
        run_key: RunKey,
        intent: IntentFn = default_intent,
        key_arguments: Mapping[str, str] | None = None,
        deadline: float = 60.0,
        hidden_tools: frozenset[str] = frozenset({"get_operation_status"}),
        id: str | None = None,
        max_retries: int | None = None,
    ) -> None:
        self.ledger = ledger
        self.run_key = run_key
        self.intent = intent
        self.deadline = deadline
        self.hidden_tools = hidden_tools
        self.max_retries = max_retries
        self._id = id
        self._key_arguments = dict(key_arguments or {})
        if isinstance(connect, LedgerSession):
            self._session: LedgerSession | None = connect
            self._connect: AsyncConnect | None = None
        else:
            self._session = None
            self._connect = connect
        self._owned: LedgerSession | None = None
        self._entered = 0
        self._tool_defs: list[ToolDefinition] | None = None

    @property
    def id(self) -> str | None:
        return self._id

    async def __aenter__(self) -> LedgerToolset:
        if self._entered == 0 and self._connect is not None:
            self._owned = self.ledger.session(
                reconnect=self._connect, key_arguments=self._key_arguments, deadline=self.deadline
            )
            await self._owned.__aenter__()
            self._session = self._owned
        self._entered += 1
        return self

    async def __aexit__(self, *args: Any) -> bool | None:
        self._entered -= 1
        if self._entered == 0 and self._owned is not None:
            owned, self._owned, self._session = self._owned, None, None
            await owned.__aexit__(*args)
        return None

    def _current(self) -> LedgerSession:
        if self._session is None:
            raise RuntimeError("LedgerToolset is not connected: use it within an agent run or `async with`")
        return self._session

    async def _definitions(self) -> list[ToolDefinition]:
        if self._tool_defs is None:
            session = self._current()
            listed = await session.list_tools()
            tools = listed if isinstance(listed, list) else listed.tools
            defs = []
            for tool in tools:
                if tool.name in self.hidden_tools:
                    continue
                schema = copy.deepcopy(tool.input_schema or {"type": "object", "properties": {}})
                # The operation id is the session's to set, never the model's.
                key = self._key_arguments.get(tool.name, DEFAULT_KEY_ARGUMENT)
                (schema.get("properties") or {}).pop(key, None)
                if isinstance(schema.get("required"), list):
                    schema["required"] = [r for r in schema["required"] if r != key]
                defs.append(
                    ToolDefinition(
                        name=tool.name,
                        description=tool.description,
                        parameters_json_schema=schema,
                        metadata={"annotations": tool.annotations.model_dump(by_alias=True) if tool.annotations else None},
                    )
                )
            self._tool_defs = defs
        return self._tool_defs

    async def get_tools(self, ctx: RunContext[Any]) -> dict[str, ToolsetTool[Any]]:
        return {
            d.name: ToolsetTool(
                toolset=self,
                tool_def=d,
                max_retries=self.max_retries if self.max_retries is not None else ctx.max_retries,
                args_validator=_ARGS_VALIDATOR,
            )
            for d in await self._definitions()
        }

    def _run_key(self, ctx: RunContext[Any]) -> str:
        return self.run_key(ctx) if callable(self.run_key) else self.run_key

    async def call_tool(self, name: str, tool_args: dict[str, Any], ctx: RunContext[Any], tool: ToolsetTool[Any]) -> Any:
        args = dict(tool_args)
        args.pop(self._key_arguments.get(name, DEFAULT_KEY_ARGUMENT), None)
        annotations = (tool.tool_def.metadata or {}).get("annotations") or {}
        if annotations.get("readOnlyHint") is True:
            # A read has no effect to protect, and its answer must not be replayed.
            result = await self._current().call_tool_direct(name, args)
            read = Outcome("succeeded", "", name, False, result, None, None, wire=_wire(result))
            if read.wire and read.wire.get("isError"):
                raise ModelRetry(read.text or f"{name} failed")
            return outcome_value(read)
        outcome = await self._current().call_tool_once(
            name, args, intent=self.intent(self._run_key(ctx), name, args), deadline=self.deadline
        )
        if outcome.state == "succeeded":
            return outcome_value(outcome)
        if outcome.state == "failed":
            raise ModelRetry(outcome.text or outcome.detail or f"{name} failed")
        if outcome.state == "unknown":
            raise ToolFailed(
                f"The outcome of {name} is not known yet (operation {outcome.operation_id}"
                f"{', status ' + outcome.status_ref if outcome.status_ref else ''}). It may have happened:"
                " do not call it again with other arguments; the same call later resumes it."
            )
        raise ToolFailed(f"{name} was {outcome.state} ({outcome.error_code}): {outcome.detail or outcome.text}")
