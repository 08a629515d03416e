"""The `python-sdk` bench baseline: an MCP server written with the official Python SDK's
high-level MCPServer (mcp==2.3.0), whose one tool does by hand what a guarded tool gets from the
ledger: look the request id up in a SQLite file and insert a row when it is new, under a lock,
with the file in WAL mode and synchronous=FULL (each new row durable before it is answered).

Tool:
  create_automation(request_id, interval_minutes)
      The first call for a request id inserts one row and answers
      {automation_id, interval_minutes, replayed: false}; a later one answers the stored row
      with replayed: true.

Environment: BASELINE_DB (the SQLite file; required).
Usage: sdk_baseline.py   (stdio)
"""

import os
import sqlite3
import threading

import anyio.to_thread
from pydantic import BaseModel

from mcp.server.mcpserver import MCPServer

SCHEMA = """
CREATE TABLE IF NOT EXISTS automations (
    request_id TEXT PRIMARY KEY,
    id INTEGER NOT NULL UNIQUE,
    interval_minutes INTEGER NOT NULL
)
"""


class Automation(BaseModel):
    automation_id: int
    interval_minutes: int
    replayed: bool


def connect() -> sqlite3.Connection:
    conn = sqlite3.connect(os.environ["BASELINE_DB"], check_same_thread=False, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute(SCHEMA)
    return conn


conn = connect()
lock = threading.Lock()
server = MCPServer("sdk-baseline")


def lookup_or_insert(request_id: str, interval_minutes: int) -> Automation:
    with lock:
        row = conn.execute(
            "SELECT id, interval_minutes FROM automations WHERE request_id = ?", (request_id,)
        ).fetchone()
        if row is not None:
            return Automation(automation_id=row[0], interval_minutes=row[1], replayed=True)
        conn.execute("BEGIN IMMEDIATE")
        (next_id,) = conn.execute("SELECT coalesce(max(id), 0) + 1 FROM automations").fetchone()
        conn.execute(
            "INSERT INTO automations(request_id, id, interval_minutes) VALUES (?, ?, ?)",
            (request_id, next_id, interval_minutes),
        )
        conn.execute("COMMIT")
        return Automation(automation_id=next_id, interval_minutes=interval_minutes, replayed=False)


@server.tool()
async def create_automation(request_id: str, interval_minutes: int) -> Automation:
    """Create an automation once per request id; a repeated request id answers the stored one."""
    return await anyio.to_thread.run_sync(lookup_or_insert, request_id, interval_minutes)


if __name__ == "__main__":
    server.run()
