"""The README's quick start (kept identical by tests/test_readme.py). Run from the repository root."""

import anyio
from mcp import Client, StdioServerParameters
from mcp.client.stdio import get_default_environment

from toolledger_client import Ledger

# The proxy in front of a server that never deduplicates; both files are created on first use.
server = StdioServerParameters(
    command="toolledger",
    args=["proxy", "--db", "quickstart-ledger.sqlite", "--", "python", "tests/proxy/charge_server.py"],
    env={**get_default_environment(), "CHARGE_DB": "quickstart-charges.sqlite"},
)


async def main() -> None:
    ledger = Ledger("quickstart-journal.sqlite")  # the agent's journal of operation ids
    async with ledger.session(reconnect=lambda: Client(server, mode="legacy")) as session:
        outcome = await session.call_tool_once(
            "charge", {"customer": "alice", "amount_cents": 500}, intent="order-42/charge"
        )
        print(outcome.state, outcome.operation_id, outcome.structured_content)
        # Re-planning the same intent (here, or after a crash in a new process) reuses the id:
        again = await session.call_tool_once(
            "charge", {"customer": "alice", "amount_cents": 500}, intent="order-42/charge"
        )
        assert again.operation_id == outcome.operation_id and again.replayed
        print("pending:", ledger.pending())  # nothing: both settled


anyio.run(main)
