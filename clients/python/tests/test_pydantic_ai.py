"""The pydantic-ai adapter, driven by pydantic-ai's own test models (no network, no LLM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("pydantic_ai")

from pydantic_ai import Agent  # noqa: E402
from pydantic_ai.models.test import TestModel  # noqa: E402

import _support  # noqa: E402
from toolledger_client import Ledger  # noqa: E402
from toolledger_client.adapters.pydantic_ai import LedgerToolset  # noqa: E402

AGENT = str(Path(__file__).resolve().parent / "agents" / "pydantic_ai_agent.py")


def run(spec, *, kill_after_charge=None):
    proc = subprocess.Popen([sys.executable, AGENT, json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if kill_after_charge:
        try:
            _support.wait_for(lambda: _support.count_charges(kill_after_charge) >= 1, 30, "the charge row")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=60)
        return None
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def test_a_run_killed_mid_tool_call_and_restarted_charges_once(tmp_path):
    charges = str(tmp_path / "charges.sqlite")
    spec = {
        "journal": str(tmp_path / "journal.sqlite"),
        "server": _support.proxy_stdio_spec(str(tmp_path / "ledger.sqlite"), charges, delay_ms=2000),
        "run_key": "ticket-77",
        "customer": "dave",
        "amount_cents": 700,
    }
    run(spec, kill_after_charge=charges)
    assert len(Ledger(spec["journal"]).pending()) == 1
    lines = run(spec)
    assert lines[-1]["output"] == {"charge_id": 1, "customer": "dave", "amount_cents": 700}
    assert _support.count_charges(charges) == 1
    assert Ledger(spec["journal"]).pending() == []
    # Another run key is another run: a new charge.
    lines = run({**spec, "run_key": "ticket-78"})
    assert lines[-1]["output"]["charge_id"] == 2


@pytest.mark.anyio
async def test_test_model_sees_the_tools_without_the_key_and_reads_are_not_journaled(tmp_path):
    charges = str(tmp_path / "charges.sqlite")
    server = _support.proxy_stdio_spec(str(tmp_path / "ledger.sqlite"), charges)
    ledger = Ledger(tmp_path / "journal.sqlite")
    toolset = LedgerToolset(ledger, lambda: _support.connect(server), run_key="r1")
    agent = Agent(TestModel(call_tools=["count_charges"]), toolsets=[toolset])
    result = await agent.run("How many charges?")
    assert '"count":0' in result.output.replace(" ", "")
    assert ledger.entries() == []
    async with toolset:
        tools = {d.name: d for d in await toolset._definitions()}
    assert "get_operation_status" not in tools
    assert "operation_id" not in tools["charge"].parameters_json_schema["properties"]
    assert "operation_id" not in tools["charge"].parameters_json_schema["required"]
