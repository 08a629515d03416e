"""toolledger-client: the agent's side of toolledger.

An agent that loses a tool call's reply must retry it under the *same* operation id, or the
server acts twice. `Ledger` remembers each id in a SQLite journal before the call is sent, and
`LedgerSession.call_tool_once` retries, polls and resumes under it until the outcome is known:

    from mcp import Client, StdioServerParameters
    from toolledger_client import Ledger

    ledger = Ledger("agent-journal.sqlite")
    async with Client(params) as client:
        outcome = await ledger.session(client).call_tool_once(
            "charge", {"customer": "alice", "amount_cents": 500}, intent="order-42:charge")
"""

from ._journal import EntryStatus, JournalEntry, Ledger, canonical_json, uuid7
from ._session import (
    DEFAULT_KEY_ARGUMENT,
    META_LEDGER,
    META_NEW_INTENT,
    META_OPERATION_ID,
    AsyncConnect,
    LedgerSession,
    Outcome,
    OutcomeState,
    SessionNotEntered,
    ToolCaller,
)

__all__ = [
    "DEFAULT_KEY_ARGUMENT",
    "META_LEDGER",
    "META_NEW_INTENT",
    "META_OPERATION_ID",
    "AsyncConnect",
    "EntryStatus",
    "JournalEntry",
    "Ledger",
    "LedgerSession",
    "Outcome",
    "OutcomeState",
    "SessionNotEntered",
    "ToolCaller",
    "canonical_json",
    "uuid7",
]

__version__ = "0.1.0"
