"""What the tests share: where the toolledger binary and the charge server are, how to start a
proxy or a reference server (stdio or HTTP), and how to count the charges that happened.

Also imported by the agent scripts the crash tests start and kill (tests/agents/).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import sqlite3
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[2]


def toolledger_bin() -> str:
    found = os.environ.get("TOOLLEDGER_BIN") or shutil.which("toolledger")
    if not found or not os.access(found, os.X_OK):
        raise RuntimeError("set TOOLLEDGER_BIN to the toolledger binary (none on PATH either)")
    return found


def charge_server() -> str:
    path = Path(os.environ.get("CHARGE_SERVER", REPO / "tests" / "proxy" / "charge_server.py"))
    if not path.is_file():
        raise RuntimeError(f"the charge server is not at {path}; set CHARGE_SERVER")
    return str(path)


def python() -> str:
    return sys.executable


def count_charges(charge_db: str | os.PathLike[str]) -> int:
    if not os.path.exists(charge_db):
        return 0
    conn = sqlite3.connect(charge_db, timeout=10)
    try:
        return int(conn.execute("SELECT count(*) FROM charges").fetchone()[0])
    except sqlite3.OperationalError:  # the server has not created its table yet
        return 0
    finally:
        conn.close()


def wait_for(predicate: Any, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def proxy_stdio_spec(ledger_db: str, charge_db: str, *, delay_ms: int = 0, config: str | None = None) -> dict[str, Any]:
    """How to launch a stdio proxy in front of the charge server (JSON, for agent scripts too)."""
    args = ["proxy", "--db", ledger_db]
    if config:
        args += ["--config", config]
    args += ["--", python(), charge_server()]
    env = {"CHARGE_DB": charge_db}
    if delay_ms:
        env["CHARGE_DELAY_MS"] = str(delay_ms)
    return {"transport": "stdio", "command": toolledger_bin(), "args": args, "env": env}


def serve_stdio_spec(ledger_db: str, principal: str) -> dict[str, Any]:
    return {
        "transport": "stdio",
        "command": toolledger_bin(),
        "args": ["serve", "--db", ledger_db, "--principal", principal],
        "env": {},
    }


def connect(spec: dict[str, Any]) -> Any:
    """An unentered `mcp.Client` for a spec: stdio (`command`, `args`, `env`) or HTTP (`url`, `token`)."""
    from mcp import Client, StdioServerParameters
    from mcp.client.stdio import get_default_environment

    if spec["transport"] == "stdio":
        params = StdioServerParameters(
            command=spec["command"],
            args=spec["args"],
            env={**get_default_environment(), **spec.get("env", {})},
        )
        return Client(params, mode="legacy")
    return Client(http_transport(spec), mode="legacy")


def http_transport(spec: dict[str, Any]) -> Any:
    from mcp.client.streamable_http import streamable_http_client
    from mcp.shared._httpx_utils import create_mcp_http_client

    headers = {"Authorization": "Bearer " + spec["token"]} if spec.get("token") else None
    return streamable_http_client(spec["url"], http_client=create_mcp_http_client(headers=headers))


def add_principal(ledger_db: str, name: str, *, tenant: str = "acme", scopes: tuple[str, ...] = ()) -> str:
    """Create a principal with a bearer token; return the token."""
    cmd = [toolledger_bin(), "principal", "add", name, "--tenant", tenant, "--token", "--db", ledger_db]
    for scope in scopes:
        cmd += ["--scope", scope]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=60)
    return json.loads(out.stdout)["token"]


@contextmanager
def http_server(args: list[str], env: dict[str, str] | None = None, log: str | None = None) -> Iterator[str]:
    """Run `toolledger ARGS --http 127.0.0.1:PORT`; yield its /mcp URL once it listens."""
    port = free_port()
    http = ["--http", f"127.0.0.1:{port}"]
    cut = args.index("--") if "--" in args else len(args)
    cmd = [toolledger_bin(), *args[:cut], *http, *args[cut:]]
    logfile = open(log or os.devnull, "w")
    proc = subprocess.Popen(
        cmd, stdin=subprocess.DEVNULL, stdout=logfile, stderr=subprocess.PIPE, text=True,
        env={**os.environ, **(env or {})},
    )
    try:
        url = None
        deadline = time.monotonic() + 60
        assert proc.stderr is not None
        while time.monotonic() < deadline:
            line = proc.stderr.readline()
            if not line:
                break
            logfile.write(line)
            m = re.search(r'"listening":"(http://[^"]+)"', line)
            if m:
                url = m.group(1)
                break
        if url is None:
            proc.kill()
            raise RuntimeError(f"{cmd[:3]} did not start listening (exit {proc.poll()})")
        # Keep draining its log so that it never blocks on a full pipe.
        import threading

        def drain() -> None:
            assert proc.stderr is not None
            for line in proc.stderr:
                logfile.write(line)

        threading.Thread(target=drain, daemon=True).start()
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        logfile.close()
