"""`LedgerSession`: calls a side-effecting MCP tool once, whatever happens on the way."""

from __future__ import annotations

import json
import logging
import random
from collections.abc import Callable, Mapping
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol

import anyio
import anyio.abc

try:
    BaseExceptionGroup
except NameError:  # Python 3.10: anyio's dependency provides it
    from exceptiongroup import BaseExceptionGroup

from ._journal import JournalEntry, Ledger, canonical_json
from ._trace import traced

logger = logging.getLogger("toolledger_client")

META_OPERATION_ID = "io.toolledger/operation_id"
"""The request `_meta` key that carries the operation id."""
META_NEW_INTENT = "io.toolledger/new_intent"
"""The request `_meta` key that says "this is a new intent, not a duplicate" (overrides `possible_duplicate`)."""
META_LEDGER = "io.toolledger/ledger"
"""The result `_meta` key under which a proxy reports `{operationId, statusRef, replayed, state}`."""

DEFAULT_KEY_ARGUMENT = "operation_id"

OutcomeState = Literal["succeeded", "failed", "unknown", "conflict", "refused"]

# toolledger's error codes, by what the client does with them.
_RETRY_LATER = frozenset({"unavailable"})
_POLL = frozenset({"outcome_unknown", "operation_in_progress"})
_CONFLICT = frozenset({"operation_conflict"})
_REFUSED = frozenset(
    {
        "possible_duplicate",
        "permission_denied",
        "not_found",
        "invalid_arguments",
        "continuation_unsupported",
        "approval_required",
        "approval_invalid",
        "business_state_changed",
    }
)
_FAILED = frozenset({"resolved_failed"})
_CONFIRMED = frozenset({"effect_confirmed"})
_UNSURE = frozenset({"operation_authority_expired", "operation_retention_expired"})
_KNOWN_CODES = _RETRY_LATER | _POLL | _CONFLICT | _REFUSED | _FAILED | _CONFIRMED | _UNSURE

# JSON-RPC error codes that mean "no answer came back", not "the server said no".
_CONNECTION_CLOSED = -32000
_REQUEST_TIMEOUT = -32001


class ToolCaller(Protocol):
    """What a `LedgerSession` drives: `mcp.Client`, `mcp.ClientSession`, an Agents SDK MCP
    server, or anything with this method."""

    async def call_tool(self, name: str, arguments: dict[str, Any] | None, *, meta: dict[str, Any] | None = ...) -> Any: ...


AsyncConnect = Callable[[], AbstractAsyncContextManager[Any]]
"""A factory of unentered connections: `lambda: mcp.Client(params)`. Each call gives an async
context manager whose `__aenter__` returns a connected `ToolCaller`."""


@dataclass(frozen=True)
class Outcome:
    """How one intended effect ended, as far as this client can tell."""

    state: OutcomeState
    """`succeeded`: the tool answered with a result. `failed`: the tool (or an operator) said it
    failed. `unknown`: still unsure at the deadline; the journal entry stays pending, resume it
    later. `conflict`: the id was used with other arguments. `refused`: the server refused the
    call without recording it (nothing happened)."""
    operation_id: str
    tool: str
    replayed: bool
    """True when the answer is a replay of an earlier one (from the server or from the journal)."""
    result: Any | None
    """The tool result (`mcp.types.CallToolResult`) when one was received, else None."""
    status_ref: str | None
    """The server's status reference (`op_…`) when it gave one."""
    error_code: str | None
    """toolledger's error code (`operation_conflict`, `outcome_unknown`, …), `transport_error`,
    `intent_conflict`, `jsonrpc_error`; None for a success or a tool's own failure."""
    detail: str | None = None
    """A human-readable reason, when there is one."""
    error: dict[str, Any] | None = None
    """The whole `{"code", "message", "status_ref"?, …}` object of a toolledger refusal."""
    wire: dict[str, Any] | None = field(default=None, repr=False)
    """The result as a JSON object (wire field names), when one was received."""

    @property
    def ok(self) -> bool:
        return self.state == "succeeded"

    @property
    def structured_content(self) -> Any | None:
        return (self.wire or {}).get("structuredContent")

    @property
    def text(self) -> str:
        """The text blocks of the result, joined by newlines."""
        content = (self.wire or {}).get("content") or []
        return "\n".join(b.get("text", "") for b in content if isinstance(b, dict) and b.get("type") == "text")


def _wire(result: Any) -> dict[str, Any]:
    if isinstance(result, dict):
        return result
    dump = getattr(result, "model_dump", None)
    if dump is None:
        raise TypeError(f"call_tool returned {type(result).__name__}, not a tool result")
    return dump(mode="json", by_alias=True, exclude_none=True)


def _result_object(wire: dict[str, Any]) -> Any:
    try:
        from mcp import types

        return types.CallToolResult.model_validate(wire)
    except Exception:  # a shape this SDK version does not read: give the JSON
        return wire


def _toolledger_error(wire: dict[str, Any]) -> dict[str, Any] | None:
    """The `{"code", "message", …}` of a toolledger refusal, None for anything else."""
    if not wire.get("isError"):
        return None
    ledger_meta = (wire.get("_meta") or {}).get(META_LEDGER)
    if isinstance(ledger_meta, dict) and ledger_meta.get("state") == "failed":
        return None  # the upstream tool's own failure, recorded by the proxy
    content = wire.get("content") or []
    if not content or not isinstance(content[0], dict) or content[0].get("type") != "text":
        return None
    try:
        body = json.loads(content[0].get("text", ""))
    except ValueError:
        return None
    error = body.get("error") if isinstance(body, dict) else None
    if isinstance(error, dict) and error.get("code") in _KNOWN_CODES:
        return error
    return None


def _replayed(wire: dict[str, Any]) -> bool:
    ledger_meta = (wire.get("_meta") or {}).get(META_LEDGER)
    if isinstance(ledger_meta, dict) and isinstance(ledger_meta.get("replayed"), bool):
        return ledger_meta["replayed"]
    structured = wire.get("structuredContent")
    if isinstance(structured, dict) and isinstance(structured.get("replayed"), bool):
        return structured["replayed"]
    return False


def _status_ref(wire: dict[str, Any], error: dict[str, Any] | None) -> str | None:
    if error and isinstance(error.get("status_ref"), str):
        return error["status_ref"]
    ledger_meta = (wire.get("_meta") or {}).get(META_LEDGER)
    if isinstance(ledger_meta, dict) and isinstance(ledger_meta.get("statusRef"), str):
        return ledger_meta["statusRef"]
    structured = wire.get("structuredContent")
    if isinstance(structured, dict) and isinstance(structured.get("status_ref"), str):
        return structured["status_ref"]
    return None


def _leaves(exc: BaseException) -> list[BaseException]:
    if isinstance(exc, BaseExceptionGroup):
        return [leaf for e in exc.exceptions for leaf in _leaves(e)]
    return [exc]


def _transport_kind(exc: BaseException) -> Literal["timeout", "broken"] | None:
    """`timeout`: no answer in time, the connection may still work. `broken`: the connection
    is gone. None: not a transport failure (a definitive answer, or a bug)."""
    kinds = [_leaf_kind(leaf) for leaf in _leaves(exc)]
    if not kinds or any(k is None for k in kinds):
        return None
    return "broken" if "broken" in kinds else "timeout"


def _leaf_kind(exc: BaseException) -> Literal["timeout", "broken"] | None:
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        kind = _one_kind(current)
        if kind is not None:
            return kind
        current = current.__cause__
    return None


def _one_kind(exc: BaseException) -> Literal["timeout", "broken"] | None:
    from mcp.shared.exceptions import MCPError

    if isinstance(exc, MCPError):
        if exc.code == _REQUEST_TIMEOUT:
            return "timeout"
        if exc.code == _CONNECTION_CLOSED:
            return "broken"
        # The SDK's HTTP transport turns an HTTP error status without a JSON-RPC body into one
        # of these; a server's own answer never reads so.
        if exc.code == -32603 and exc.message == "Server returned an error response":
            return "broken"
        if exc.code == -32600 and exc.message == "Session terminated":
            return "broken"
        return None
    if isinstance(exc, TimeoutError):
        return "timeout"
    if isinstance(exc, (OSError, EOFError, anyio.ClosedResourceError, anyio.BrokenResourceError, anyio.EndOfStream)):
        return "broken"
    module = type(exc).__module__ or ""
    if module.split(".")[0] in ("httpx", "httpx2", "httpcore", "httpcore2", "h11"):
        return "broken"
    return None


class _Backoff:
    """Capped exponential backoff with jitter: each delay is between half and all of
    `min(cap, initial * 2**n)`."""

    def __init__(self, initial: float, cap: float) -> None:
        self.initial = initial
        self.cap = cap
        self.n = 0

    def next(self) -> float:
        ceiling = min(self.cap, self.initial * (2**self.n))
        self.n += 1
        return ceiling / 2 + random.uniform(0, ceiling / 2)


class SessionNotEntered(RuntimeError):
    """A session with a reconnect factory was used outside `async with`."""


class _Unsure(Exception):
    """The deadline passed (or nothing more can be tried) while the outcome is not known."""

    def __init__(self, code: str | None, detail: str | None) -> None:
        super().__init__(detail)
        self.code = code
        self.detail = detail


class LedgerSession:
    """Calls MCP tools through a `Ledger`: one operation id per intended effect, kept across
    retries, reconnections and restarts.

    Args:
        ledger: the journal.
        target: a connected `mcp.Client`, `mcp.ClientSession` or other `ToolCaller`; None to
            have the session connect with `reconnect` when it is entered.
        reconnect: a factory of new connections (`lambda: mcp.Client(params)`), used when the
            connection breaks. With it, use the session as `async with ledger.session(...)`:
            the connections it opens are closed when the block ends.
        key_arguments: per tool, the argument that carries the operation id
            (`{"create_automation": "request_id"}`). Without an entry, a tool whose listed
            `inputSchema` has an `operation_id` property gets the id there; every call also
            carries it in `_meta["io.toolledger/operation_id"]`.
        deadline: default seconds `call_tool_once` keeps trying before it answers `unknown`.
        attempt_timeout: seconds one request may take before it is retried (same id).
        backoff_initial, backoff_max: the retry delays' first and largest ceiling, seconds.
    """

    def __init__(
        self,
        ledger: Ledger,
        target: ToolCaller | None = None,
        *,
        reconnect: AsyncConnect | None = None,
        key_arguments: Mapping[str, str] | None = None,
        deadline: float = 60.0,
        attempt_timeout: float = 30.0,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
    ) -> None:
        if target is None and reconnect is None:
            raise ValueError("give a connected target, a reconnect factory, or both")
        self.ledger = ledger
        self.deadline = deadline
        self.attempt_timeout = attempt_timeout
        self.backoff_initial = backoff_initial
        self.backoff_max = backoff_max
        self._target: ToolCaller | None = target
        self._reconnect = reconnect
        self._key_arguments = dict(key_arguments or {})
        self._schemas: dict[str, dict[str, Any]] | None = None
        self._tg: anyio.abc.TaskGroup | None = None
        self._release: anyio.Event | None = None
        self._connect_lock = anyio.Lock()

    # -- lifecycle --------------------------------------------------------------------------

    async def __aenter__(self) -> LedgerSession:
        self._tg = anyio.create_task_group()
        await self._tg.__aenter__()
        if self._target is None:
            try:
                await self._connect()
            except BaseException as exc:
                await self.__aexit__(type(exc), exc, exc.__traceback__)
                raise
        return self

    async def __aexit__(self, *exc: Any) -> None:
        if self._release is not None:
            self._release.set()
            self._release = None
        tg, self._tg = self._tg, None
        if tg is not None:
            # The block's own exception goes on unwrapped: the connections are closed as after
            # a normal exit (their tasks never fail the group, see `_hold`).
            await tg.__aexit__(None, None, None)

    async def _hold(self, factory: AsyncConnect, *, task_status: anyio.abc.TaskStatus[Any]) -> None:
        release = anyio.Event()
        started = False
        try:
            async with factory() as target:
                task_status.started((target, release))
                started = True
                await release.wait()
        except Exception as exc:
            if not started:
                raise  # to the caller of `start`: the connection could not be opened
            # A connection that broke (its own tasks failed) or failed to close: the session
            # has dropped it or is ending; say so and end quietly.
            logger.info("a connection ended with %s: %s", type(exc).__name__, exc)

    async def _connect(self) -> None:
        """Open a new connection with the factory (in the session's own task, so that it can
        be closed from anywhere), closing the one this session opened before."""
        if self._reconnect is None:
            raise _Unsure("transport_error", "the connection is lost and no reconnect factory was given")
        if self._tg is None:
            raise SessionNotEntered("a session with a reconnect factory must be entered: `async with ledger.session(...)`")
        if self._release is not None:
            self._release.set()
            self._release = None
        self._target = None
        target, release = await self._tg.start(self._hold, self._reconnect)
        self._target, self._release = target, release

    async def _current(self) -> ToolCaller:
        async with self._connect_lock:
            if self._target is None:
                await self._connect()
            assert self._target is not None
            return self._target

    async def _broken(self, target: ToolCaller) -> None:
        """The connection `target` is broken: drop it (the next attempt reconnects)."""
        async with self._connect_lock:
            if self._target is target:
                if self._reconnect is None:
                    raise _Unsure("transport_error", "the connection is lost and no reconnect factory was given")
                if self._release is not None:
                    self._release.set()
                    self._release = None
                self._target = None

    # -- the tools' schemas -----------------------------------------------------------------

    async def _list_schemas(self, target: ToolCaller) -> dict[str, dict[str, Any]]:
        if self._schemas is None:
            schemas: dict[str, dict[str, Any]] = {}
            listed = await target.list_tools()  # type: ignore[attr-defined]
            tools = listed if isinstance(listed, list) else getattr(listed, "tools", [])
            for tool in tools:
                schema = getattr(tool, "input_schema", None) or getattr(tool, "inputSchema", None)
                if isinstance(tool, dict):
                    schema = tool.get("inputSchema")
                    name = tool.get("name")
                else:
                    name = getattr(tool, "name", None)
                if isinstance(name, str):
                    schemas[name] = schema if isinstance(schema, dict) else {}
            self._schemas = schemas
        return self._schemas

    async def key_argument(self, tool: str) -> str | None:
        """The argument of `tool` that carries the operation id, or None (only `_meta` does)."""
        if tool in self._key_arguments:
            return self._key_arguments[tool]
        schemas = await self._list_schemas(await self._current())
        properties = (schemas.get(tool) or {}).get("properties") or {}
        return DEFAULT_KEY_ARGUMENT if DEFAULT_KEY_ARGUMENT in properties else None

    async def list_tools(self) -> Any:
        """The connection's `list_tools()` answer (for frameworks that show tools to a model)."""
        return await (await self._current()).list_tools()  # type: ignore[attr-defined]

    # -- calls ------------------------------------------------------------------------------

    async def call_tool_once(
        self,
        name: str,
        arguments: Mapping[str, Any] | None = None,
        *,
        intent: str | None = None,
        deadline: float | None = None,
        new_intent: bool = False,
        meta: Mapping[str, Any] | None = None,
    ) -> Outcome:
        """Call `name` with `arguments` so that its effect happens at most once.

        The operation id is minted and written to the journal before anything is sent: derived
        from `intent` (the same intent always gets the same id from this journal, so a re-plan
        after a crash or a lost reply reuses it), or random when `intent` is None. Transport
        failures, timeouts and `unavailable` are retried under the same id; `outcome_unknown`
        and `operation_in_progress` are followed with `get_operation_status` until the
        operation settles, then the stored answer is fetched. `deadline` (seconds, default the
        session's) bounds all of it: past it the outcome is `unknown` and the entry stays
        pending. An intent already settled in the journal is answered from it without a call.
        `new_intent=True` tells the server this is not a duplicate of an earlier operation with
        equal arguments (after a `possible_duplicate` refusal). `meta` adds request `_meta`
        entries (not journaled: a resumed call is sent without them).
        """
        args = dict(arguments or {})
        explicit_key = self._key_arguments.get(name, DEFAULT_KEY_ARGUMENT)
        if explicit_key in args:
            raise ValueError(
                f"{name}: leave the {explicit_key!r} argument out; the session sets it to the journal's operation id"
            )
        canonical_json(args)  # refuse what the journal cannot store, before anything is written
        entry = self.ledger.reserve(name, args, intent)
        if entry.tool != name or canonical_json(entry.arguments) != canonical_json(args):
            return Outcome(
                state="conflict",
                operation_id=entry.operation_id,
                tool=name,
                replayed=False,
                result=None,
                status_ref=entry.status_ref,
                error_code="intent_conflict",
                detail=(
                    f"the intent {intent!r} is already recorded for {entry.tool} with other arguments;"
                    " nothing was sent (use a new intent for a new effect)"
                ),
            )
        if entry.status == "settled":
            return self._from_journal(entry)
        return await traced(name, False, lambda: self._drive(entry, deadline, new_intent, meta))

    async def resume(
        self, entry: JournalEntry | str, *, deadline: float | None = None, new_intent: bool = False
    ) -> Outcome:
        """Complete a journal entry (from `ledger.pending()`, or its operation id) under its own id."""
        operation_id = entry if isinstance(entry, str) else entry.operation_id
        current = self.ledger.get(operation_id)
        if current is None:
            raise KeyError(f"the journal has no operation {operation_id!r}")
        if current.status == "settled":
            return self._from_journal(current)
        return await traced(current.tool, True, lambda: self._drive(current, deadline, new_intent))

    async def call_tool_direct(self, name: str, arguments: Mapping[str, Any] | None = None) -> Any:
        """Call `name` on the current connection without the journal: for read-only tools,
        whose answers must not be replayed. Returns what the connection's `call_tool` returns."""
        return await (await self._current()).call_tool(name, dict(arguments or {}), meta=None)

    async def operation_status(self, operation_id: str, tool: str | None = None) -> dict[str, Any] | None:
        """The server's `get_operation_status` answer (its structured content), or None when it
        answered with an error."""
        target = await self._current()
        arguments: dict[str, Any] = {"operation_id": operation_id}
        if tool is not None:
            arguments["tool"] = tool
        wire = _wire(await target.call_tool("get_operation_status", arguments, meta=None))
        if wire.get("isError"):
            return None
        structured = wire.get("structuredContent")
        if isinstance(structured, dict):
            return structured
        try:
            parsed = json.loads((wire.get("content") or [{}])[0].get("text", ""))
        except (ValueError, AttributeError):
            return None
        return parsed if isinstance(parsed, dict) else None

    # -- the loop ---------------------------------------------------------------------------

    def _from_journal(self, entry: JournalEntry) -> Outcome:
        return Outcome(
            state=entry.outcome or "unknown",  # type: ignore[arg-type]
            operation_id=entry.operation_id,
            tool=entry.tool,
            replayed=True,
            result=_result_object(entry.result) if entry.result is not None else None,
            status_ref=entry.status_ref,
            error_code=entry.error_code,
            detail=entry.detail,
            error=_toolledger_error(entry.result) if entry.result is not None else None,
            wire=entry.result,
        )

    def _finish(
        self,
        entry: JournalEntry,
        state: OutcomeState,
        *,
        raw: Any = None,
        wire: dict[str, Any] | None = None,
        error: dict[str, Any] | None = None,
        error_code: str | None = None,
        status_ref: str | None = None,
        detail: str | None = None,
    ) -> Outcome:
        status = {"unknown": "pending", "refused": "refused"}.get(state, "settled")
        self.ledger.finish(
            entry.operation_id,
            status=status,  # type: ignore[arg-type]
            outcome=None if state == "unknown" else state,
            result=wire,
            status_ref=status_ref,
            error_code=error_code,
            detail=detail,
        )
        if state == "unknown":
            logger.warning("%s %s: outcome unknown (%s); the journal keeps it pending", entry.tool, entry.operation_id, detail)
        return Outcome(
            state=state,
            operation_id=entry.operation_id,
            tool=entry.tool,
            replayed=_replayed(wire) if wire is not None else False,
            result=raw if raw is not None else (_result_object(wire) if wire is not None else None),
            status_ref=status_ref or self.ledger.get(entry.operation_id).status_ref,  # type: ignore[union-attr]
            error_code=error_code,
            detail=detail,
            error=error,
            wire=wire,
        )

    async def _sleep(self, backoff: _Backoff, deadline_at: float) -> None:
        remaining = deadline_at - anyio.current_time()
        if remaining <= 0:
            return
        await anyio.sleep(min(backoff.next(), remaining))

    async def _attempt(self, deadline_at: float, call: Callable[[ToolCaller], Any]) -> Any:
        """Run `call(target)` within the attempt timeout; on a transport failure, drop a broken
        connection and raise `_Retry`."""
        remaining = deadline_at - anyio.current_time()
        if remaining <= 0:
            raise _Unsure(None, "deadline passed")
        target: ToolCaller | None = None
        try:
            with anyio.fail_after(min(self.attempt_timeout, remaining)):
                target = await self._current()
                return await call(target)
        except (_Unsure, SessionNotEntered):
            raise
        except Exception as exc:
            kind = _transport_kind(exc)
            if kind is None and target is None and self._reconnect is not None:
                kind = "broken"  # the reconnect itself failed: try again later
            if kind is None:
                raise
            detail = f"{type(exc).__name__}: {exc}"
            if kind == "broken" and target is not None:
                await self._broken(target)
            raise _Retry(detail) from exc

    async def _drive(
        self, entry: JournalEntry, deadline: float | None, new_intent: bool, extra_meta: Mapping[str, Any] | None = None
    ) -> Outcome:
        deadline_at = anyio.current_time() + (self.deadline if deadline is None else deadline)
        backoff = _Backoff(self.backoff_initial, self.backoff_max)
        last_code: str | None = entry.error_code
        last_detail: str | None = entry.detail
        status_ref: str | None = entry.status_ref

        async def send(target: ToolCaller) -> Any:
            key = await self.key_argument(entry.tool)
            args = dict(entry.arguments)
            if key is not None:
                args[key] = entry.operation_id
            meta: dict[str, Any] = {**(extra_meta or {}), META_OPERATION_ID: entry.operation_id}
            if new_intent:
                meta[META_NEW_INTENT] = True
            return await target.call_tool(entry.tool, args, meta=meta)

        try:
            while True:
                try:
                    raw = await self._attempt(deadline_at, send)
                except _Retry as retry:
                    last_code, last_detail = "transport_error", retry.detail
                    self.ledger.record_attempt(entry.operation_id, detail=retry.detail)
                    logger.info("%s %s: %s; retrying under the same id", entry.tool, entry.operation_id, retry.detail)
                    await self._sleep(backoff, deadline_at)
                    continue
                except Exception as exc:
                    from mcp.shared.exceptions import MCPError

                    if isinstance(exc, MCPError):
                        # A JSON-RPC error: the server (or the upstream behind a proxy) refused
                        # the request itself.
                        return self._finish(
                            entry,
                            "failed",
                            error_code="jsonrpc_error",
                            error={"code": exc.code, "message": exc.message, "data": exc.data},
                            detail=f"JSON-RPC error {exc.code}: {exc.message}",
                        )
                    raise
                wire = _wire(raw)
                error = _toolledger_error(wire)
                ref = _status_ref(wire, error)
                status_ref = ref or status_ref
                self.ledger.record_attempt(entry.operation_id, status_ref=ref)
                if not wire.get("isError"):
                    return self._finish(entry, "succeeded", raw=raw, wire=wire, status_ref=status_ref)
                if error is None:
                    return self._finish(entry, "failed", raw=raw, wire=wire, status_ref=status_ref)
                code = error["code"]
                message = error.get("message")
                if code in _CONFIRMED:
                    return self._finish(entry, "succeeded", raw=raw, wire=wire, error=error, error_code=code, status_ref=status_ref, detail=message)
                if code in _FAILED:
                    return self._finish(entry, "failed", raw=raw, wire=wire, error=error, error_code=code, status_ref=status_ref, detail=message)
                if code in _CONFLICT:
                    return self._finish(entry, "conflict", raw=raw, wire=wire, error=error, error_code=code, status_ref=status_ref, detail=message)
                if code in _REFUSED:
                    return self._finish(entry, "refused", raw=raw, wire=wire, error=error, error_code=code, status_ref=status_ref, detail=message)
                last_code, last_detail = code, message
                if code in _RETRY_LATER:
                    await self._sleep(backoff, deadline_at)
                    continue
                if code in _POLL:
                    await self._until_settled(entry, deadline_at, backoff)
                    continue
                # An expired authority or retention: the server will not answer this id again.
                raise _Unsure(code, message)
        except _Unsure as unsure:
            return self._finish(
                entry,
                "unknown",
                error_code=unsure.code or last_code,
                status_ref=status_ref,
                detail=unsure.detail if unsure.code else (last_detail or unsure.detail),
            )

    async def _until_settled(self, entry: JournalEntry, deadline_at: float, backoff: _Backoff) -> None:
        """Poll `get_operation_status` until the operation is settled (or nothing is in flight,
        so that a re-call forwards or replays it); `_Unsure` at the deadline."""

        async def status(target: ToolCaller) -> Any:
            return await target.call_tool(
                "get_operation_status", {"operation_id": entry.operation_id, "tool": entry.tool}, meta=None
            )

        while True:
            await self._sleep(backoff, deadline_at)
            try:
                wire = _wire(await self._attempt(deadline_at, status))
            except _Retry as retry:
                logger.info("%s %s: status query: %s", entry.tool, entry.operation_id, retry.detail)
                continue
            answer = wire.get("structuredContent")
            if wire.get("isError") or not isinstance(answer, dict):
                continue
            if answer.get("state") in ("applied", "succeeded", "partial", "failed"):
                return
            if answer.get("ledgerState") in (None, "accepted", "succeeded", "failed", "applied", "partial"):
                return
            logger.info(
                "%s %s: still %s; polling", entry.tool, entry.operation_id, answer.get("ledgerState")
            )


class _Retry(Exception):
    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail
