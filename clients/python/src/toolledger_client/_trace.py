"""One OpenTelemetry span per `call_tool_once` / `resume`, when the OpenTelemetry API is
importable (the MCP SDK depends on it). With no SDK configured the API's tracer is a no-op.

The span is the parent of the MCP SDK's own per-request spans (`MCP send tools/call …`), which
carry its context to the server in `_meta` (`traceparent`), so the server's span for each
attempt and status query joins the agent's trace. Never recorded: the operation id, the intent,
anything derived from them, or argument values.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ._session import Outcome

try:
    from opentelemetry import trace as _otel
except ImportError:  # pragma: no cover - the MCP SDK depends on opentelemetry-api
    _otel = None  # type: ignore[assignment]

TRACER_NAME = "toolledger-client"


async def traced(tool: str, resumed: bool, drive: Callable[[], Awaitable["Outcome"]]) -> "Outcome":
    """Runs `drive` inside a span named `call_tool_once {tool}` and records its outcome."""
    if _otel is None:
        return await drive()
    tracer = _otel.get_tracer(TRACER_NAME)
    attributes: dict[str, Any] = {
        "gen_ai.operation.name": "execute_tool",
        "gen_ai.tool.name": tool,
        "toolledger.resumed": resumed,
    }
    with tracer.start_as_current_span(
        f"call_tool_once {tool}", kind=_otel.SpanKind.INTERNAL, attributes=attributes
    ) as span:
        outcome = await drive()
        if span.is_recording():
            span.set_attribute("toolledger.outcome", outcome.state)
            span.set_attribute("toolledger.replayed", bool(outcome.replayed))
            if outcome.status_ref:
                span.set_attribute("toolledger.status_ref", outcome.status_ref)
            if outcome.state != "succeeded":
                span.set_attribute("error.type", outcome.error_code or outcome.state)
                span.set_status(_otel.Status(_otel.StatusCode.ERROR))
        return outcome
