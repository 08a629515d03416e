"""The journal: one SQLite file that remembers every operation id this agent sent.

Every intent is written (and flushed to disk) before its first request leaves, so a process
that dies mid-call leaves a pending entry behind, and the next process reuses its id.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import sqlite3
import threading
import time
import uuid
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from ._session import AsyncConnect, LedgerSession, ToolCaller

EntryStatus = Literal["pending", "settled", "refused"]
"""`pending`: sent or about to be, outcome not known yet. `settled`: the outcome is known and
final (succeeded, failed or conflict). `refused`: the server refused the call without recording
it (nothing happened); the next call with the same intent sends it again under the same id."""

_SCHEMA = """
CREATE TABLE IF NOT EXISTS journal_meta (
    key TEXT PRIMARY KEY,
    value TEXT NOT NULL
);
CREATE TABLE IF NOT EXISTS operations (
    operation_id TEXT PRIMARY KEY,
    intent TEXT UNIQUE,
    tool TEXT NOT NULL,
    arguments TEXT NOT NULL,
    status TEXT NOT NULL CHECK (status IN ('pending', 'settled', 'refused')),
    outcome TEXT,
    result TEXT,
    status_ref TEXT,
    error_code TEXT,
    detail TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    created_at TEXT NOT NULL,
    updated_at TEXT NOT NULL
);
CREATE INDEX IF NOT EXISTS operations_pending ON operations (status) WHERE status = 'pending';
"""

_SCHEMA_VERSION = "1"


def canonical_json(value: Any) -> str:
    """The JSON text used to compare two calls' arguments: sorted keys, no spaces."""
    return json.dumps(value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def uuid7() -> uuid.UUID:
    """A random UUIDv7 (RFC 9562): 48 bits of Unix milliseconds, then 74 random bits."""
    ms = time.time_ns() // 1_000_000
    rand = int.from_bytes(secrets.token_bytes(10), "big")
    value = (ms & ((1 << 48) - 1)) << 80
    value |= 0x7 << 76  # version
    value |= ((rand >> 64) & 0xFFF) << 64  # rand_a, 12 bits
    value |= 0b10 << 62  # variant
    value |= rand & ((1 << 62) - 1)  # rand_b, 62 bits
    return uuid.UUID(int=value)


def _now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds")


@dataclass(frozen=True)
class JournalEntry:
    """One intended effect as the journal holds it."""

    operation_id: str
    intent: str | None
    tool: str
    arguments: dict[str, Any]
    status: EntryStatus
    outcome: str | None
    """The `Outcome.state` it settled with (`succeeded`, `failed`, `conflict`, `refused`), else None."""
    result: dict[str, Any] | None
    """The tool result as it came over the wire (a JSON object), when one was received."""
    status_ref: str | None
    error_code: str | None
    detail: str | None
    attempts: int
    created_at: str
    updated_at: str

    @property
    def pending(self) -> bool:
        return self.status == "pending"


class Ledger:
    """A journal of operation ids in a SQLite file, shared safely by several processes.

    The file uses WAL with `synchronous=FULL`, so an intent is on disk before the call that
    carries its id is sent; a busy timeout lets an agent and its restarted self (or several
    workers) use one file at once.
    """

    def __init__(self, path: str | os.PathLike[str], *, busy_timeout: float = 30.0) -> None:
        self.path = os.fspath(path)
        self._lock = threading.Lock()
        self._conn = sqlite3.connect(
            self.path, timeout=busy_timeout, isolation_level=None, check_same_thread=False
        )
        self._conn.row_factory = sqlite3.Row
        self._conn.execute(f"PRAGMA busy_timeout = {int(busy_timeout * 1000)}")
        mode = self._conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
        if str(mode).lower() != "wal":
            raise RuntimeError(f"the journal {self.path!r} cannot use WAL (journal_mode is {mode})")
        self._conn.execute("PRAGMA synchronous = FULL")
        with self._write() as conn:
            for statement in _SCHEMA.split(";"):
                if statement.strip():
                    conn.execute(statement)
            conn.execute(
                "INSERT OR IGNORE INTO journal_meta (key, value) VALUES ('schema_version', ?)",
                (_SCHEMA_VERSION,),
            )
            conn.execute(
                "INSERT OR IGNORE INTO journal_meta (key, value) VALUES ('namespace', ?)",
                (str(uuid.uuid4()),),
            )
            version = conn.execute("SELECT value FROM journal_meta WHERE key = 'schema_version'").fetchone()[0]
            if version != _SCHEMA_VERSION:
                raise RuntimeError(f"the journal {self.path!r} has schema version {version}, this client knows {_SCHEMA_VERSION}")
            self.namespace = uuid.UUID(conn.execute("SELECT value FROM journal_meta WHERE key = 'namespace'").fetchone()[0])

    # -- plumbing -------------------------------------------------------------------------

    class _Tx:
        def __init__(self, ledger: Ledger) -> None:
            self.ledger = ledger

        def __enter__(self) -> sqlite3.Connection:
            self.ledger._lock.acquire()
            try:
                self.ledger._conn.execute("BEGIN IMMEDIATE")
            except BaseException:
                self.ledger._lock.release()
                raise
            return self.ledger._conn

        def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
            try:
                self.ledger._conn.execute("COMMIT" if exc_type is None else "ROLLBACK")
            finally:
                self.ledger._lock.release()

    def _write(self) -> Ledger._Tx:
        return Ledger._Tx(self)

    @staticmethod
    def _entry(row: sqlite3.Row) -> JournalEntry:
        return JournalEntry(
            operation_id=row["operation_id"],
            intent=row["intent"],
            tool=row["tool"],
            arguments=json.loads(row["arguments"]),
            status=row["status"],
            outcome=row["outcome"],
            result=json.loads(row["result"]) if row["result"] is not None else None,
            status_ref=row["status_ref"],
            error_code=row["error_code"],
            detail=row["detail"],
            attempts=row["attempts"],
            created_at=row["created_at"],
            updated_at=row["updated_at"],
        )

    # -- public ---------------------------------------------------------------------------

    def operation_id_for(self, intent: str) -> str:
        """The id this journal gives `intent`: a UUIDv5 under the journal's own namespace."""
        return str(uuid.uuid5(self.namespace, intent))

    def reserve(self, tool: str, arguments: dict[str, Any], intent: str | None = None) -> JournalEntry:
        """Record the intent to call `tool` with `arguments` and return its entry.

        With an `intent` already in the journal, its existing entry is returned unchanged
        (whatever its tool and arguments: the caller compares them). Otherwise a new pending
        entry is committed, durably, under a new id: derived from `intent`, or a random UUIDv7.
        """
        args_json = canonical_json(arguments)
        with self._write() as conn:
            if intent is not None:
                row = conn.execute("SELECT * FROM operations WHERE intent = ?", (intent,)).fetchone()
                if row is not None:
                    return self._entry(row)
                operation_id = self.operation_id_for(intent)
            else:
                operation_id = str(uuid7())
            now = _now()
            conn.execute(
                "INSERT INTO operations (operation_id, intent, tool, arguments, status, created_at, updated_at)"
                " VALUES (?, ?, ?, ?, 'pending', ?, ?)",
                (operation_id, intent, tool, args_json, now, now),
            )
            row = conn.execute("SELECT * FROM operations WHERE operation_id = ?", (operation_id,)).fetchone()
            return self._entry(row)

    def get(self, operation_id: str) -> JournalEntry | None:
        """The entry of `operation_id`, if the journal has it."""
        with self._lock:
            row = self._conn.execute("SELECT * FROM operations WHERE operation_id = ?", (operation_id,)).fetchone()
        return self._entry(row) if row is not None else None

    def find(self, intent: str) -> JournalEntry | None:
        """The entry recorded for `intent`, if any."""
        with self._lock:
            row = self._conn.execute("SELECT * FROM operations WHERE intent = ?", (intent,)).fetchone()
        return self._entry(row) if row is not None else None

    def pending(self) -> list[JournalEntry]:
        """Every entry whose outcome is not known yet, oldest first."""
        with self._lock:
            rows = self._conn.execute(
                "SELECT * FROM operations WHERE status = 'pending' ORDER BY created_at, operation_id"
            ).fetchall()
        return [self._entry(r) for r in rows]

    def entries(self) -> list[JournalEntry]:
        """Every entry, oldest first."""
        with self._lock:
            rows = self._conn.execute("SELECT * FROM operations ORDER BY created_at, operation_id").fetchall()
        return [self._entry(r) for r in rows]

    def record_attempt(self, operation_id: str, *, status_ref: str | None = None, detail: str | None = None) -> None:
        """Count one more attempt (and remember what the last one said)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE operations SET attempts = attempts + 1, status_ref = COALESCE(?, status_ref),"
                " detail = COALESCE(?, detail), updated_at = ? WHERE operation_id = ?",
                (status_ref, detail, _now(), operation_id),
            )

    def finish(
        self,
        operation_id: str,
        *,
        status: EntryStatus,
        outcome: str | None,
        result: dict[str, Any] | None,
        status_ref: str | None,
        error_code: str | None,
        detail: str | None,
    ) -> None:
        """Record what an attempt ended with (`status` settled, refused, or still pending)."""
        with self._write() as conn:
            conn.execute(
                "UPDATE operations SET status = ?, outcome = ?, result = ?, status_ref = COALESCE(?, status_ref),"
                " error_code = ?, detail = ?, updated_at = ? WHERE operation_id = ?",
                (
                    status,
                    outcome,
                    canonical_json(result) if result is not None else None,
                    status_ref,
                    error_code,
                    detail,
                    _now(),
                    operation_id,
                ),
            )

    def session(
        self,
        target: ToolCaller | None = None,
        *,
        reconnect: AsyncConnect | None = None,
        key_arguments: dict[str, str] | None = None,
        deadline: float = 60.0,
        attempt_timeout: float = 30.0,
        backoff_initial: float = 0.2,
        backoff_max: float = 5.0,
    ) -> LedgerSession:
        """Wrap `target` (an `mcp.Client`, an `mcp.ClientSession`, or anything with
        `call_tool(name, arguments, meta=...)`) so that its calls go through this journal.

        See `LedgerSession` for the arguments.
        """
        from ._session import LedgerSession

        return LedgerSession(
            self,
            target,
            reconnect=reconnect,
            key_arguments=key_arguments,
            deadline=deadline,
            attempt_timeout=attempt_timeout,
            backoff_initial=backoff_initial,
            backoff_max=backoff_max,
        )

    def close(self) -> None:
        with self._lock:
            self._conn.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
