"""The OpenAI Agents SDK adapter, driven by a scripted Model (no network, no LLM)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("agents")

import _support  # noqa: E402
from toolledger_client import Ledger  # noqa: E402

AGENT = str(Path(__file__).resolve().parent / "agents" / "openai_agents_agent.py")


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
        "run_key": "ticket-91",
        "customer": "erin",
        "amount_cents": 900,
    }
    run(spec, kill_after_charge=charges)
    assert len(Ledger(spec["journal"]).pending()) == 1
    lines = run(spec)
    assert json.loads(lines[-1]["output"]) == {"charge_id": 1, "customer": "erin", "amount_cents": 900}
    assert _support.count_charges(charges) == 1
    assert Ledger(spec["journal"]).pending() == []
    lines = run({**spec, "run_key": "ticket-92"})
    assert json.loads(lines[-1]["output"])["charge_id"] == 2
