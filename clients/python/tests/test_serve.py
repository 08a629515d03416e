"""`call_tool_once` against the reference server, `toolledger serve`, on stdio and HTTP. Its
tools take the operation id as an argument of their own (`create_automation`: `request_id`)."""

from __future__ import annotations

import pytest

import _support
from toolledger_client import Ledger

pytestmark = pytest.mark.anyio

KEYS = {"create_automation": "request_id"}


async def test_serve_stdio_create_automation_once(tmp_path):
    db = str(tmp_path / "serve.sqlite")
    _support.add_principal(db, "alice", scopes=("automation:write",))
    ledger = Ledger(tmp_path / "journal.sqlite")
    spec = _support.serve_stdio_spec(db, "alice")
    async with ledger.session(reconnect=lambda: _support.connect(spec), key_arguments=KEYS) as session:
        first = await session.call_tool_once("create_automation", {"interval_minutes": 15}, intent="nightly-sync")
        assert first.state == "succeeded", first
        assert first.structured_content == {"id": 1, "interval_minutes": 15, "replayed": False, "version": 1}
        # The server replays it under the same id.
        replay = await session.resume(first.operation_id)
        assert replay.state == "succeeded" and replay.replayed
        # A new intent is a new automation.
        second = await session.call_tool_once("create_automation", {"interval_minutes": 15}, intent="hourly-sync")
        assert second.structured_content["id"] == 2
        status = await session.operation_status(first.operation_id, "create_automation")
        assert status["state"] == "applied" and status["authoritative"] is True
    # A restarted agent re-planning the first intent gets the first automation, from the journal.
    async with Ledger(tmp_path / "journal.sqlite").session(
        reconnect=lambda: _support.connect(spec), key_arguments=KEYS
    ) as session:
        again = await session.call_tool_once("create_automation", {"interval_minutes": 15}, intent="nightly-sync")
    assert again.state == "succeeded" and again.replayed
    assert again.structured_content["id"] == 1


async def test_serve_refusals_are_not_pending(tmp_path):
    db = str(tmp_path / "serve.sqlite")
    _support.add_principal(db, "bob")  # no automation:write scope
    _support.add_principal(db, "carl", scopes=("automation:write",))
    ledger = Ledger(tmp_path / "journal.sqlite")
    async with ledger.session(
        reconnect=lambda: _support.connect(_support.serve_stdio_spec(db, "bob")), key_arguments=KEYS
    ) as session:
        out = await session.call_tool_once("create_automation", {"interval_minutes": 15}, intent="x")
        assert out.state == "refused" and out.error_code == "permission_denied"
    async with ledger.session(
        reconnect=lambda: _support.connect(_support.serve_stdio_spec(db, "carl")), key_arguments=KEYS
    ) as session:
        bad = await session.call_tool_once("create_automation", {"interval_minutes": 1}, intent="y")
        assert bad.state == "refused" and bad.error_code == "invalid_arguments"
        # Refused means nothing was recorded: the same intent is sent again (same id), and
        # this principal may.
        retried = await session.call_tool_once("create_automation", {"interval_minutes": 15}, intent="x")
        assert retried.state == "succeeded" and retried.operation_id == out.operation_id
    assert ledger.pending() == []
    assert ledger.find("y").status == "refused"


async def test_the_key_argument_is_the_sessions_to_set(tmp_path):
    ledger = Ledger(tmp_path / "journal.sqlite")

    class Never:
        async def call_tool(self, *a, **k):
            raise AssertionError("nothing may be sent")

    with pytest.raises(ValueError, match="request_id"):
        await ledger.session(Never(), key_arguments=KEYS).call_tool_once(
            "create_automation", {"request_id": "mine", "interval_minutes": 15}
        )
    assert ledger.entries() == []


async def test_serve_http_with_a_bearer_token(tmp_path):
    db = str(tmp_path / "serve.sqlite")
    token = _support.add_principal(db, "alice", scopes=("automation:write",))
    with _support.http_server(["serve", "--db", db]) as url:
        spec = {"transport": "http", "url": url, "token": token}
        ledger = Ledger(tmp_path / "journal.sqlite")
        async with ledger.session(reconnect=lambda: _support.connect(spec), key_arguments=KEYS) as session:
            out = await session.call_tool_once("create_automation", {"interval_minutes": 30}, intent="weekly")
            assert out.state == "succeeded", out
            assert (await session.resume(out.operation_id)).replayed


async def test_a_client_session_is_a_target(tmp_path):
    """The SDK's lower-level `ClientSession`, opened by the application itself, wrapped directly
    (no reconnect factory): the key goes in the tool's own argument, and the same intent is
    answered from the journal, then by the server's replay when resumed."""
    from mcp import ClientSession, StdioServerParameters
    from mcp.client.stdio import get_default_environment, stdio_client

    db = str(tmp_path / "serve.sqlite")
    _support.add_principal(db, "alice", scopes=("automation:write",))
    spec = _support.serve_stdio_spec(db, "alice")
    params = StdioServerParameters(command=spec["command"], args=spec["args"], env=get_default_environment())
    ledger = Ledger(tmp_path / "journal.sqlite")
    async with stdio_client(params) as (read, write), ClientSession(read, write) as client_session:
        await client_session.initialize()
        session = ledger.session(client_session, key_arguments=KEYS)
        first = await session.call_tool_once("create_automation", {"interval_minutes": 20}, intent="session-intent")
        assert first.state == "succeeded" and not first.replayed, first
        assert first.structured_content["interval_minutes"] == 20
        again = await session.call_tool_once("create_automation", {"interval_minutes": 20}, intent="session-intent")
        assert again.operation_id == first.operation_id
        assert again.structured_content["id"] == first.structured_content["id"]
        replay = await session.resume(first.operation_id)
        assert replay.state == "succeeded" and replay.replayed
        assert replay.structured_content["id"] == first.structured_content["id"]
    assert ledger.pending() == []
