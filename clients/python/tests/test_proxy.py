"""`call_tool_once` through `toolledger proxy` in front of the charge server (which never
deduplicates: every call that reaches it is one more row)."""

from __future__ import annotations

import json
from typing import Any

import pytest
from mcp.shared.exceptions import MCPError

import _support
from toolledger_client import Ledger

pytestmark = pytest.mark.anyio

CHARGE = {"customer": "alice", "amount_cents": 500}


@pytest.fixture
def files(tmp_path):
    return {
        "ledger": str(tmp_path / "proxy-ledger.sqlite"),
        "charges": str(tmp_path / "charges.sqlite"),
        "journal": str(tmp_path / "journal.sqlite"),
        "dir": tmp_path,
    }


async def test_a_call_succeeds_once_and_a_replan_is_answered_from_the_journal(files):
    spec = _support.proxy_stdio_spec(files["ledger"], files["charges"])
    ledger = Ledger(files["journal"])
    async with _support.connect(spec) as client:
        session = ledger.session(client)
        first = await session.call_tool_once("charge", CHARGE, intent="order-1:charge")
        assert first.state == "succeeded", first
        assert first.replayed is False
        assert first.structured_content == {"charge_id": 1, "customer": "alice", "amount_cents": 500}
        assert first.status_ref and first.status_ref.startswith("op_")
        assert first.operation_id == ledger.operation_id_for("order-1:charge")
        # The same intent again, from a new Ledger object on the same file: no call at all.
        again = await Ledger(files["journal"]).session(client).call_tool_once("charge", CHARGE, intent="order-1:charge")
        assert again.state == "succeeded" and again.replayed is True
        assert again.operation_id == first.operation_id
        assert again.structured_content == first.structured_content
        # The server replays it too, under the same id.
        replay = await session.resume(first.operation_id)
        assert replay.replayed
    assert _support.count_charges(files["charges"]) == 1
    assert ledger.pending() == []


async def test_the_id_goes_in_meta_and_in_the_listed_argument(files):
    spec = _support.proxy_stdio_spec(files["ledger"], files["charges"])
    seen: list[dict[str, Any]] = []

    async with _support.connect(spec) as client:

        class Spy:
            async def list_tools(self):
                return await client.list_tools()

            async def call_tool(self, name, arguments, *, meta=None):
                seen.append({"name": name, "arguments": dict(arguments or {}), "meta": meta})
                return await client.call_tool(name, arguments, meta=meta)

        session = Ledger(files["journal"]).session(Spy())
        out = await session.call_tool_once("charge", CHARGE)
        assert out.state == "succeeded"
    assert seen[0]["arguments"] == {**CHARGE, "operation_id": out.operation_id}
    assert seen[0]["meta"] == {"io.toolledger/operation_id": out.operation_id}


async def test_a_tool_error_is_failed_and_settled(files):
    spec = _support.proxy_stdio_spec(files["ledger"], files["charges"])
    ledger = Ledger(files["journal"])
    async with _support.connect(spec) as client:
        out = await ledger.session(client).call_tool_once("charge", {"customer": "a", "amount_cents": -1}, intent="bad")
    assert out.state == "failed" and out.error_code is None
    assert "amount_cents must be positive" in out.text
    assert ledger.find("bad").status == "settled"
    assert _support.count_charges(files["charges"]) == 0


async def test_an_id_used_with_other_arguments_is_a_conflict(files):
    spec = _support.proxy_stdio_spec(files["ledger"], files["charges"])
    ledger = Ledger(files["journal"])
    taken = ledger.operation_id_for("order-2")
    async with _support.connect(spec) as client:
        # Someone else already used that id (other arguments).
        await client.call_tool("charge", {"customer": "bob", "amount_cents": 7, "operation_id": taken})
        out = await ledger.session(client).call_tool_once("charge", CHARGE, intent="order-2")
        assert out.state == "conflict" and out.error_code == "operation_conflict"
        # The same intent with other arguments is refused locally, before anything is sent.
        local = await ledger.session(client).call_tool_once("charge", {**CHARGE, "amount_cents": 501}, intent="order-2")
        assert local.state == "conflict" and local.error_code == "intent_conflict"
    assert _support.count_charges(files["charges"]) == 1


async def test_a_lost_reply_is_retried_under_the_same_id(files):
    """The reply of the first attempt is lost (the connection breaks after the call reached
    the server): the session reconnects and gets the stored answer. One charge."""
    spec = _support.proxy_stdio_spec(files["ledger"], files["charges"])
    ledger = Ledger(files["journal"])
    attempts = {"n": 0}

    class LosesFirstReply:
        def __init__(self, client):
            self.client = client

        async def __aenter__(self):
            await self.client.__aenter__()
            return self

        async def __aexit__(self, *exc):
            return await self.client.__aexit__(*exc)

        async def list_tools(self):
            return await self.client.list_tools()

        async def call_tool(self, name, arguments, *, meta=None):
            result = await self.client.call_tool(name, arguments, meta=meta)
            attempts["n"] += 1
            if attempts["n"] == 1:
                raise MCPError(code=-32000, message="Connection closed")
            return result

    async with ledger.session(reconnect=lambda: LosesFirstReply(_support.connect(spec)), backoff_initial=0.05) as session:
        out = await session.call_tool_once("charge", CHARGE, intent="order-3")
    assert out.state == "succeeded" and out.replayed is True
    assert attempts["n"] == 2
    assert ledger.find("order-3").attempts == 2
    assert _support.count_charges(files["charges"]) == 1


async def test_a_lost_reply_then_a_replan_with_the_same_intent_charges_once(files):
    """No reconnect factory: the broken call answers `unknown` and the entry stays pending;
    the agent re-plans the same intent on a new connection and gets the first charge."""
    spec = _support.proxy_stdio_spec(files["ledger"], files["charges"])
    ledger = Ledger(files["journal"])

    async with _support.connect(spec) as client:

        class LosesReply:
            async def list_tools(self):
                return await client.list_tools()

            async def call_tool(self, name, arguments, *, meta=None):
                await client.call_tool(name, arguments, meta=meta)
                raise MCPError(code=-32000, message="Connection closed")

        lost = await ledger.session(LosesReply()).call_tool_once("charge", CHARGE, intent="order-4")
    assert lost.state == "unknown" and lost.error_code == "transport_error"
    assert [e.operation_id for e in ledger.pending()] == [lost.operation_id]

    async with _support.connect(spec) as client:
        replan = await Ledger(files["journal"]).session(client).call_tool_once("charge", CHARGE, intent="order-4")
    assert replan.state == "succeeded" and replan.replayed
    assert replan.operation_id == lost.operation_id
    assert replan.structured_content["charge_id"] == 1
    assert ledger.pending() == []
    assert _support.count_charges(files["charges"]) == 1


async def test_a_slow_answer_times_out_then_is_polled_and_fetched(files):
    """The attempt times out while the charge server is still answering; the retry finds the
    operation in progress, polls `get_operation_status` until it is settled, then fetches the
    stored answer. One charge."""
    spec = _support.proxy_stdio_spec(files["ledger"], files["charges"], delay_ms=1500)
    ledger = Ledger(files["journal"])
    async with _support.connect(spec) as client:
        session = ledger.session(client, attempt_timeout=0.5, backoff_initial=0.1, backoff_max=0.5)
        out = await session.call_tool_once("charge", CHARGE, intent="order-5", deadline=20)
    assert out.state == "succeeded", out
    assert out.replayed is True
    assert out.structured_content == {"charge_id": 1, "customer": "alice", "amount_cents": 500}
    assert ledger.find("order-5").attempts >= 2
    assert _support.count_charges(files["charges"]) == 1


async def test_outcome_unknown_is_settled_by_the_status_lookup(files):
    """The proxy gives up on the upstream (its call timeout) after the row committed: the
    operation is outcome_unknown. The session asks get_operation_status, whose reconcile
    lookup finds the charge; the retry then gets the confirmed answer. One charge."""
    config = files["dir"] / "proxy.toml"
    config.write_text(
        """
[tools.charge]
call_timeout_seconds = 1
forward_operation_id = "_meta"

[tools.charge.reconcile]
tool = "find_charge"
arguments = { reference = "{operation_id}" }
found_when = "/structuredContent/found"
"""
    )
    spec = _support.proxy_stdio_spec(files["ledger"], files["charges"], delay_ms=2500, config=str(config))
    ledger = Ledger(files["journal"])
    async with _support.connect(spec) as client:
        session = ledger.session(client, backoff_initial=0.2, backoff_max=1.0)
        out = await session.call_tool_once("charge", CHARGE, intent="order-6", deadline=30)
    assert out.state == "succeeded", out
    # `charge` declares an output schema, so the confirmation is the `effect_confirmed` answer
    # with the lookup's evidence, never a made-up result.
    assert out.error_code == "effect_confirmed"
    assert out.wire["_meta"]["io.toolledger/confirmed"]["by"]
    assert _support.count_charges(files["charges"]) == 1


async def test_still_unknown_at_the_deadline_stays_pending(files):
    """Without a reconcile lookup nobody can tell: `unknown`, and the journal keeps it."""
    config = files["dir"] / "proxy.toml"
    config.write_text("[tools.charge]\ncall_timeout_seconds = 1\n")
    spec = _support.proxy_stdio_spec(files["ledger"], files["charges"], delay_ms=2000, config=str(config))
    ledger = Ledger(files["journal"])
    async with _support.connect(spec) as client:
        out = await ledger.session(client, backoff_initial=0.2, backoff_max=0.5).call_tool_once(
            "charge", CHARGE, intent="order-7", deadline=4
        )
    assert out.state == "unknown", out
    assert out.error_code == "outcome_unknown"
    assert out.status_ref and out.status_ref.startswith("op_")
    entry = ledger.find("order-7")
    assert entry.pending and entry.status_ref == out.status_ref
    assert _support.count_charges(files["charges"]) == 1


async def test_http_proxy_with_a_bearer_token(files):
    token = _support.add_principal(files["ledger"], "agent")
    args = ["proxy", "--db", files["ledger"], "--", _support.python(), _support.charge_server()]
    with _support.http_server(args, env={"CHARGE_DB": files["charges"]}) as url:
        spec = {"transport": "http", "url": url, "token": token}
        ledger = Ledger(files["journal"])
        async with ledger.session(reconnect=lambda: _support.connect(spec)) as session:
            out = await session.call_tool_once("charge", CHARGE, intent="order-8")
            assert out.state == "succeeded"
            status = await session.operation_status(out.operation_id, "charge")
            # A proxied (deferred) operation's status says the ledger's word: succeeded.
            assert status["state"] == "succeeded" and status["statusRef"] == out.status_ref
            assert (await session.resume(out.operation_id)).replayed
    assert _support.count_charges(files["charges"]) == 1


async def test_unavailable_is_retried_until_the_upstream_is_back(files):
    """The proxy's HTTP upstream is down: `unavailable` (nothing sent). The session retries
    under the same id; once the upstream is back, the retry is forwarded. One charge."""
    import subprocess

    import anyio

    port = _support.free_port()
    env = {**__import__("os").environ, "CHARGE_DB": files["charges"]}

    def start_upstream():
        proc = subprocess.Popen(
            [_support.python(), _support.charge_server(), "--http", str(port)],
            env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )

        def up():
            try:
                import socket

                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                return True
            except OSError:
                return False

        _support.wait_for(up, 30, "the charge server's port")
        return proc

    upstream = start_upstream()
    token = _support.add_principal(files["ledger"], "agent")
    args = ["proxy", "--db", files["ledger"], "--upstream-url", f"http://127.0.0.1:{port}/mcp"]
    try:
        with _support.http_server(args) as url:
            upstream.terminate()
            upstream.wait(timeout=15)
            spec = {"transport": "http", "url": url, "token": token}
            ledger = Ledger(files["journal"])
            async with ledger.session(
                reconnect=lambda: _support.connect(spec), backoff_initial=0.2, backoff_max=0.5
            ) as session:
                async with anyio.create_task_group() as tg:

                    async def bring_back():
                        await anyio.sleep(2)
                        nonlocal upstream
                        upstream = await anyio.to_thread.run_sync(start_upstream)

                    tg.start_soon(bring_back)
                    out = await session.call_tool_once("charge", CHARGE, intent="order-9", deadline=30)
            assert out.state == "succeeded", out
            assert ledger.find("order-9").attempts >= 2
    finally:
        upstream.terminate()
        upstream.wait(timeout=15)
    assert _support.count_charges(files["charges"]) == 1
