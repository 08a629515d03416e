"""An agent process SIGKILLed mid-call (after the charge row committed, before the reply),
then started again: it finds its id in the journal and gets the first charge's answer."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

import _support
from toolledger_client import Ledger

AGENT = str(Path(__file__).resolve().parent / "agents" / "charge_agent.py")
CHARGE = {"customer": "carol", "amount_cents": 1200}


def run_agent(spec: dict, *, kill_after_charge: str | None = None, timeout: float = 60) -> list[dict]:
    proc = subprocess.Popen(
        [sys.executable, AGENT, json.dumps(spec)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    if kill_after_charge is not None:
        try:
            _support.wait_for(lambda: _support.count_charges(kill_after_charge) >= 1, 30, "the charge row")
        finally:
            os.kill(proc.pid, signal.SIGKILL)
        proc.communicate(timeout=timeout)
        assert proc.returncode == -signal.SIGKILL
        return []
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err[-3000:]
    return [json.loads(line) for line in out.splitlines() if line.strip()]


def outcome(lines: list[dict]) -> dict:
    found = [line["outcome"] for line in lines if "outcome" in line]
    assert len(found) == 1, lines
    return found[0]


@pytest.mark.parametrize("restart", ["same_intent", "resume_pending"])
def test_stdio_proxy_agent_killed_mid_call(tmp_path, restart):
    charges = str(tmp_path / "charges.sqlite")
    server = _support.proxy_stdio_spec(str(tmp_path / "ledger.sqlite"), charges, delay_ms=2000)
    spec = {"journal": str(tmp_path / "journal.sqlite"), "server": server, "intent": "invoice-9",
            "arguments": CHARGE, "mode": "call"}
    run_agent(spec, kill_after_charge=charges)
    pending = Ledger(spec["journal"]).pending()
    assert len(pending) == 1 and pending[0].intent == "invoice-9"

    again = run_agent({**spec, "mode": "call" if restart == "same_intent" else "resume"})
    out = outcome(again)
    assert out["state"] == "succeeded", out
    assert out["operation_id"] == pending[0].operation_id
    assert out["wire"]["structuredContent"] == {"charge_id": 1, "customer": "carol", "amount_cents": 1200}
    assert _support.count_charges(charges) == 1
    assert Ledger(spec["journal"]).pending() == []


def test_http_proxy_agent_killed_mid_call(tmp_path):
    ledger_db = str(tmp_path / "ledger.sqlite")
    charges = str(tmp_path / "charges.sqlite")
    token = _support.add_principal(ledger_db, "agent")
    args = ["proxy", "--db", ledger_db, "--", _support.python(), _support.charge_server()]
    with _support.http_server(args, env={"CHARGE_DB": charges, "CHARGE_DELAY_MS": "2000"}) as url:
        spec = {"journal": str(tmp_path / "journal.sqlite"), "server": {"transport": "http", "url": url, "token": token},
                "intent": "invoice-10", "arguments": CHARGE, "mode": "call"}
        run_agent(spec, kill_after_charge=charges)
        # Restarted at once: the proxy is still waiting for the upstream's answer, so the new
        # process is told operation_in_progress, polls, and fetches the stored answer.
        out = outcome(run_agent(spec))
    assert out["state"] == "succeeded", out
    assert out["replayed"] is True
    assert out["wire"]["structuredContent"]["charge_id"] == 1
    assert _support.count_charges(charges) == 1
