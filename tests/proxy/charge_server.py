"""An MCP server with a side effect, written the way an outside team would write one with the
Python SDK's high-level MCPServer (mcp==2.3.0): every `charge` call inserts a row into a SQLite
file, so a test can count exactly how many times the effect happened.

Tools:
  charge(customer, amount_cents, idempotency_key=None)
      Inserts one row and answers {charge_id, customer, amount_cents} (structured content,
      plus a text block). The row's `reference` is the request's
      `_meta["io.toolledger/operation_id"]` when present, else `idempotency_key`, else NULL.
      The server does not deduplicate: two calls are two rows, whatever their keys — unless
      CHARGE_DEDUPLICATE is set: then a call whose reference is already recorded answers that
      charge and inserts nothing (as a payments API that deduplicates on its key does).
      amount_cents <= 0: a tool error (isError true), no row.
      amount_cents == 13: a JSON-RPC error response (-32602), no row.
      CHARGE_DELAY_MS: sleep that long after the row is committed and before answering.
  pay(customer, amount, currency="EUR")
      Like charge with a decimal amount (a float): inserts one row whose amount_cents is
      round(amount * 100) and answers {payment_id, customer, amount, currency} (declared
      output schema, structured content).
  convert(amount, rate)        read-only: {converted: amount * rate}
  find_charge(reference)       read-only: {found, charge: {...} | null}
  count_charges()              read-only: {count}
  slow(seconds)                sleeps, with progress notifications when the caller sent a
                               progress token; answers {slept}. No annotations.

Environment: CHARGE_DB (the SQLite file; required), CHARGE_DELAY_MS (optional),
CHARGE_BEARER (optional, HTTP only: every request must carry `Authorization: Bearer <it>`,
or it is answered 401), CHARGE_EXIT_MARK (optional, stdio only: a file to which a line is
appended when the server ends because its stdin closed), CHARGE_HEADER_LOG (optional, HTTP only:
a file to which the `traceparent` header of every POST that has one is appended, a line each).
Several server processes may share one CHARGE_DB: WAL mode, a busy timeout, and each insert is
its own short IMMEDIATE transaction.

Usage: charge_server.py                 stdio
       charge_server.py --http PORT     streamable HTTP at http://127.0.0.1:PORT/mcp
"""

import argparse
import datetime
import os
import sqlite3
import sys
from typing import Annotated, Any

import anyio
import anyio.to_thread
from pydantic import BaseModel

from mcp import MCPError
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.resolve import Elicit, Resolve
from mcp.server.mcpserver.exceptions import ToolError
from mcp.types import CallToolResult, TextContent, ToolAnnotations

OPERATION_ID_META_KEY = "io.toolledger/operation_id"
INVALID_PARAMS = -32602
BUSY_TIMEOUT_MS = 10_000

SCHEMA = """
CREATE TABLE IF NOT EXISTS charges (
    id INTEGER PRIMARY KEY,
    customer TEXT NOT NULL,
    amount_cents INTEGER NOT NULL,
    reference TEXT,
    idempotency_key TEXT,
    created_at TEXT NOT NULL
)
"""


class Charged(BaseModel):
    charge_id: int
    customer: str
    amount_cents: int


class Paid(BaseModel):
    payment_id: int
    customer: str
    amount: float
    currency: str


class Converted(BaseModel):
    converted: float


class Charge(BaseModel):
    id: int
    customer: str
    amount_cents: int
    reference: str | None
    idempotency_key: str | None
    created_at: str


class Found(BaseModel):
    found: bool
    charge: Charge | None


class Count(BaseModel):
    count: int


class Slept(BaseModel):
    slept: float


def log(message: str) -> None:
    print(f"charge_server[{os.getpid()}]: {message}", file=sys.stderr, flush=True)


def db_path() -> str:
    path = os.environ.get("CHARGE_DB")
    if not path:
        raise SystemExit("charge_server: CHARGE_DB must name the SQLite file")
    return path


def connect() -> sqlite3.Connection:
    # Autocommit mode: transactions are opened explicitly, so a writer takes the lock up front
    # (BEGIN IMMEDIATE) and waits out another process's writer for up to the busy timeout.
    conn = sqlite3.connect(db_path(), timeout=BUSY_TIMEOUT_MS / 1000, isolation_level=None)
    conn.row_factory = sqlite3.Row
    conn.execute(f"PRAGMA busy_timeout = {BUSY_TIMEOUT_MS}")
    return conn


def init_db() -> None:
    conn = connect()
    try:
        conn.execute("PRAGMA journal_mode = WAL")
        conn.execute(SCHEMA)
    finally:
        conn.close()


def insert_charge(customer: str, amount_cents: int, reference: str | None, idempotency_key: str | None) -> int:
    conn = connect()
    try:
        conn.execute("BEGIN IMMEDIATE")
        cur = conn.execute(
            "INSERT INTO charges (customer, amount_cents, reference, idempotency_key, created_at)"
            " VALUES (?, ?, ?, ?, ?)",
            (
                customer,
                amount_cents,
                reference,
                idempotency_key,
                datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="microseconds"),
            ),
        )
        conn.execute("COMMIT")
        return int(cur.lastrowid)
    except BaseException:
        if conn.in_transaction:
            conn.execute("ROLLBACK")
        raise
    finally:
        conn.close()


def select_charge(reference: str) -> dict[str, Any] | None:
    conn = connect()
    try:
        row = conn.execute(
            "SELECT * FROM charges WHERE reference = ? ORDER BY id LIMIT 1", (reference,)
        ).fetchone()
        return dict(row) if row is not None else None
    finally:
        conn.close()


def select_count() -> int:
    conn = connect()
    try:
        return int(conn.execute("SELECT count(*) FROM charges").fetchone()[0])
    finally:
        conn.close()


def operation_id(ctx: Context) -> str | None:
    meta = ctx.request_context.meta or {}
    value = meta.get(OPERATION_ID_META_KEY)
    return value if isinstance(value, str) else None


server = MCPServer(name="charge-server", version="1.0.0")


@server.tool(
    description="Charge a customer. Every call creates a new charge.",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
)
async def charge(
    customer: str, amount_cents: int, ctx: Context, idempotency_key: str | None = None
) -> Annotated[CallToolResult, Charged]:
    if amount_cents == 13:
        # Deliberately a protocol-level failure rather than a tool error.
        raise MCPError(code=INVALID_PARAMS, message="amount_cents 13 is not accepted", data={"amount_cents": 13})
    if amount_cents <= 0:
        raise ToolError(f"amount_cents must be positive, got {amount_cents}")
    reference = operation_id(ctx) or idempotency_key
    if os.environ.get("CHARGE_DEDUPLICATE") and reference is not None:
        # Like a payments API that deduplicates on its idempotency key: a known key answers
        # the charge it made, whatever the other arguments say.
        existing = await anyio.to_thread.run_sync(select_charge, reference)
        if existing is not None:
            log(f"charge {existing['id']}: deduplicated on reference={reference!r}")
            out = Charged(charge_id=existing["id"], customer=existing["customer"], amount_cents=existing["amount_cents"])
            return CallToolResult(
                content=[TextContent(type="text", text=f"Charged {out.customer} {out.amount_cents} cents (charge {out.charge_id}).")],
                structured_content=out.model_dump(mode="json"),
            )
    charge_id = await anyio.to_thread.run_sync(insert_charge, customer, amount_cents, reference, idempotency_key)
    log(f"charge {charge_id}: {customer} {amount_cents} reference={reference!r}")
    delay_ms = os.environ.get("CHARGE_DELAY_MS")
    if delay_ms:
        await anyio.sleep(int(delay_ms) / 1000)
    out = Charged(charge_id=charge_id, customer=customer, amount_cents=amount_cents)
    return CallToolResult(
        content=[TextContent(type="text", text=f"Charged {customer} {amount_cents} cents (charge {charge_id}).")],
        structured_content=out.model_dump(mode="json"),
    )


@server.tool(
    description="Pay a decimal amount. Every call creates a new charge.",
    annotations=ToolAnnotations(read_only_hint=False, destructive_hint=False, idempotent_hint=False),
)
async def pay(customer: str, amount: float, ctx: Context, currency: str = "EUR") -> Paid:
    if amount <= 0:
        raise ToolError(f"amount must be positive, got {amount}")
    reference = operation_id(ctx)
    payment_id = await anyio.to_thread.run_sync(insert_charge, customer, round(amount * 100), reference, None)
    log(f"pay {payment_id}: {customer} {amount} {currency} reference={reference!r}")
    return Paid(payment_id=payment_id, customer=customer, amount=amount, currency=currency)


@server.tool(description="Convert an amount at a rate.", annotations=ToolAnnotations(read_only_hint=True))
async def convert(amount: float, rate: float) -> Converted:
    return Converted(converted=amount * rate)


class Confirmation(BaseModel):
    confirm: bool


def ask_confirmation(customer: str, amount_cents: int) -> Elicit[Confirmation]:
    return Elicit(f"Charge {customer} {amount_cents} cents?", Confirmation)


@server.tool(description="Charge a customer after the user confirms (asks first; charges in the last round).")
async def confirm_charge(
    customer: str,
    amount_cents: int,
    confirmation: Annotated[Confirmation, Resolve(ask_confirmation)],
    ctx: Context,
) -> Annotated[CallToolResult, Charged]:
    if not confirmation.confirm:
        raise ToolError("the user did not confirm the charge")
    reference = operation_id(ctx)
    charge_id = await anyio.to_thread.run_sync(insert_charge, customer, amount_cents, reference, None)
    log(f"confirm_charge {charge_id}: {customer} {amount_cents} reference={reference!r}")
    out = Charged(charge_id=charge_id, customer=customer, amount_cents=amount_cents)
    return CallToolResult(
        content=[TextContent(type="text", text=f"Charged {customer} {amount_cents} cents (charge {charge_id}).")],
        structured_content=out.model_dump(mode="json"),
    )


@server.tool(
    description="Find the first charge recorded with this reference.",
    annotations=ToolAnnotations(read_only_hint=True),
)
async def find_charge(reference: str) -> Found:
    row = await anyio.to_thread.run_sync(select_charge, reference)
    return Found(found=row is not None, charge=Charge(**row) if row is not None else None)


@server.tool(description="How many charges exist.", annotations=ToolAnnotations(read_only_hint=True))
async def count_charges() -> Count:
    return Count(count=await anyio.to_thread.run_sync(select_count))


@server.tool(description="Sleep for a while, reporting progress.")
async def slow(seconds: float, ctx: Context) -> Slept:
    steps = max(1, min(20, int(seconds * 10)))
    try:
        for step in range(steps):
            await anyio.sleep(seconds / steps)
            try:
                await ctx.report_progress(step + 1, steps, f"slept {(step + 1) * seconds / steps:.2f}s")
            except Exception as e:  # progress is best effort; the reply is what matters
                log(f"progress not sent: {e!r}")
    except anyio.get_cancelled_exc_class():
        # The client cancelled the request (notifications/cancelled): say so, then stop.
        log("slow: cancelled by the client")
        raise
    return Slept(slept=seconds)


def require_bearer(app, token: str):
    """The ASGI app `app` behind a bearer token check: 401 without `Authorization: Bearer token`."""
    expected = f"Bearer {token}".encode()

    async def guarded(scope, receive, send):
        if scope["type"] == "http" and dict(scope["headers"]).get(b"authorization") != expected:
            log("refused a request without the bearer token")
            await send({"type": "http.response.start", "status": 401,
                        "headers": [(b"content-type", b"text/plain")]})
            await send({"type": "http.response.body", "body": b"unauthorized"})
            return
        await app(scope, receive, send)

    return guarded


def log_traceparent(app, path: str):
    """The ASGI app `app`, appending the `traceparent` header of each POST that has one to `path`."""

    async def logged(scope, receive, send):
        if scope["type"] == "http" and scope["method"] == "POST":
            value = dict(scope["headers"]).get(b"traceparent")
            if value is not None:
                with open(path, "a") as f:
                    f.write(value.decode() + "\n")
        await app(scope, receive, send)

    return logged


def main() -> None:
    parser = argparse.ArgumentParser(description="A side-effecting MCP server backed by SQLite.")
    parser.add_argument("--http", type=int, metavar="PORT", help="serve streamable HTTP at 127.0.0.1:PORT/mcp")
    args = parser.parse_args()
    init_db()
    if args.http is not None:
        # uvicorn writes its access log to stdout; keep every log line on stderr.
        sys.stdout.flush()
        os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
        log(f"serving http://127.0.0.1:{args.http}/mcp (db {db_path()})")
        bearer = os.environ.get("CHARGE_BEARER")
        header_log = os.environ.get("CHARGE_HEADER_LOG")
        if bearer is None and header_log is None:
            server.run("streamable-http", host="127.0.0.1", port=args.http, streamable_http_path="/mcp")
        else:
            import uvicorn

            app = server.streamable_http_app(streamable_http_path="/mcp")
            if bearer is not None:
                app = require_bearer(app, bearer)
            if header_log is not None:
                app = log_traceparent(app, header_log)
            uvicorn.run(app, host="127.0.0.1", port=args.http, log_level="warning")
    else:
        log(f"serving stdio (db {db_path()})")
        server.run()
        # Reached only when the client ended the session (stdin closed), not on a signal.
        mark = os.environ.get("CHARGE_EXIT_MARK")
        if mark:
            with open(mark, "a") as f:
                f.write("stdin closed; exited\n")


if __name__ == "__main__":
    main()
