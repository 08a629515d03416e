"""The client's span per `call_tool_once` joins one trace with the server's: the MCP SDK's
request spans are its children and carry its context in `_meta`, so `toolledger serve`'s span
for the call (exported over OTLP to a receiver that decodes it with the official protobufs) has
the client's trace id and the SDK request span as its parent. No operation id, intent or
argument value is recorded on either side."""

from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

import _support
from toolledger_client import Ledger

pytestmark = pytest.mark.anyio

RECEIVER = _support.REPO / "crates" / "toolledger-cli" / "tests" / "py" / "otlp_receiver.py"
EXPORTER = InMemorySpanExporter()
_provider = TracerProvider()
_provider.add_span_processor(SimpleSpanProcessor(EXPORTER))
trace.set_tracer_provider(_provider)


def _receiver(out: str) -> tuple[subprocess.Popen, int]:
    proc = subprocess.Popen([sys.executable, str(RECEIVER), out], stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    assert line.startswith("listening "), line
    return proc, int(line.split()[1])


def _server_spans(out: str, name: str, timeout: float = 20.0) -> list[dict]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(out) as f:
                spans = [json.loads(line) for line in f if line.strip()]
        except FileNotFoundError:
            spans = []
        found = [s for s in spans if s["name"] == name]
        if found:
            return found
        time.sleep(0.05)
    raise AssertionError(f"the server exported no span {name!r}")


async def test_the_call_and_the_servers_span_share_one_trace(tmp_path):
    db = str(tmp_path / "serve.sqlite")
    _support.add_principal(db, "alice", scopes=("automation:write",))
    out = str(tmp_path / "spans.jsonl")
    receiver, port = _receiver(out)
    try:
        spec = _support.serve_stdio_spec(db, "alice")
        spec["env"] = {
            "OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{port}",
            "OTEL_BSP_SCHEDULE_DELAY": "50",
            "OTEL_SERVICE_NAME": "toolledger-client-test",
        }
        EXPORTER.clear()
        async with Ledger(tmp_path / "journal.sqlite").session(
            reconnect=lambda: _support.connect(spec), key_arguments={"create_automation": "request_id"}
        ) as session:
            outcome = await session.call_tool_once(
                "create_automation", {"interval_minutes": 45}, intent="secret-intent-7"
            )
        assert outcome.state == "succeeded", outcome
        spans = EXPORTER.get_finished_spans()
        ours = [s for s in spans if s.name == "call_tool_once create_automation"]
        assert len(ours) == 1, [s.name for s in spans]
        span = ours[0]
        assert span.attributes["gen_ai.tool.name"] == "create_automation"
        assert span.attributes["gen_ai.operation.name"] == "execute_tool"
        assert span.attributes["toolledger.outcome"] == "succeeded"
        assert span.attributes["toolledger.replayed"] is False
        # The SDK's request span for the call is our span's child.
        sends = [
            s
            for s in spans
            if s.name.startswith("MCP send tools/call")
            and s.parent is not None
            and s.parent.span_id == span.context.span_id
        ]
        assert sends, [(s.name, s.parent) for s in spans]
        trace_id = f"{span.context.trace_id:032x}"
        send_ids = {f"{s.context.span_id:016x}" for s in sends}
        # The server's span for the call is in the same trace, under the SDK's request span.
        served = _server_spans(out, "tools/call create_automation")
        assert any(s["trace_id"] == trace_id and s["parent_span_id"] in send_ids for s in served), (
            served,
            trace_id,
            send_ids,
        )
        # Neither side recorded the operation id, the intent or an argument value.
        client_values = json.dumps([dict(s.attributes or {}) for s in spans], default=str)
        with open(out + ".raw") as f:
            exported = f.read()
        for secret in (outcome.operation_id, "secret-intent-7"):
            assert secret not in client_values
            assert secret not in exported
        assert "45" not in json.dumps(dict(span.attributes or {}))
    finally:
        receiver.terminate()
        receiver.wait(timeout=10)
