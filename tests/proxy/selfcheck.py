"""Checks the fixtures against each other with no proxy in between: every driver (py_client with
the high-level Client and with ClientSession, ts_client) over stdio and HTTP, in both eras,
against charge_server; then each driver losing its server after the effect and before the reply.

Usage: selfcheck.py [NODE]   (run with the venv's python; NODE defaults to the `node` in the
directory `.ci/node.sh` prints). Prints one line per check and `N passed, N failed`.
"""

import json
import os
import socket
import subprocess
import sys
import tempfile
import time
import sqlite3

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
PY = sys.executable
SERVER = os.path.join(HERE, "charge_server.py")
PY_CLIENT = os.path.join(HERE, "py_client.py")
TS_CLIENT = os.path.join(ROOT, "tests", "js", "proxy", "ts_client.mjs")

results = {"passed": 0, "failed": 0}


def check(name, ok, detail=""):
    results["passed" if ok else "failed"] += 1
    print(("ok   " if ok else "FAIL ") + name + ("" if ok else f"  {detail}"), flush=True)


def node_binary():
    if len(sys.argv) > 1:
        return sys.argv[1]
    out = subprocess.run(["bash", os.path.join(ROOT, ".ci", "node.sh")], capture_output=True, text=True, check=True)
    return os.path.join(out.stdout.strip(), "node")


def driver_command(driver, node):
    if driver == "ts":
        return [node, TS_CLIENT]
    return [PY, PY_CLIENT]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def count(db):
    try:
        with sqlite3.connect(db) as c:
            return c.execute("SELECT count(*) FROM charges").fetchone()[0]
    except sqlite3.Error:
        return 0


def start_http(db, delay_ms=None):
    port = free_port()
    env = {**os.environ, "CHARGE_DB": db}
    if delay_ms:
        env["CHARGE_DELAY_MS"] = str(delay_ms)
    proc = subprocess.Popen([PY, SERVER, "--http", str(port)], env=env, stderr=subprocess.DEVNULL)
    deadline = time.time() + 20
    while time.time() < deadline:
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return proc, f"http://127.0.0.1:{port}/mcp"
        time.sleep(0.1)
    proc.kill()
    raise RuntimeError("charge_server did not start")


def spec_for(driver, transport, lifecycle, db, url, calls, delay_ms=None):
    spec = {"transport": transport, "lifecycle": lifecycle, "calls": calls}
    if driver.startswith("py-"):
        spec["api"] = driver[3:]
    if transport == "stdio":
        env = {"CHARGE_DB": db}
        if delay_ms:
            env["CHARGE_DELAY_MS"] = str(delay_ms)
        spec["server"] = {"command": PY, "args": [SERVER], "env": env}
    else:
        spec["url"], spec["token"] = url, "selfcheck-token"
    return spec


def lines_of(stdout):
    return [json.loads(line) for line in stdout.splitlines() if line.strip()]


def story(driver, transport, lifecycle, node, tmp):
    name = f"{driver} {transport} {lifecycle}"
    db = os.path.join(tmp, f"{driver}-{transport}-{lifecycle}.db")
    server, url = start_http(db) if transport == "http" else (None, None)
    op = f"op-{driver}-{transport}-{lifecycle}"
    calls = [
        {"name": "charge", "arguments": {"customer": "alice", "amount_cents": 500}, "meta": {"io.toolledger/operation_id": op}},
        {"name": "charge", "arguments": {"customer": "bob", "amount_cents": 0}},
        {"name": "charge", "arguments": {"customer": "bob", "amount_cents": 13}},
        {"name": "find_charge", "arguments": {"reference": op}},
        {"name": "count_charges", "arguments": {}},
    ]
    try:
        spec = spec_for(driver, transport, lifecycle, db, url, calls)
        p = subprocess.run(
            [*driver_command(driver, node), json.dumps(spec)], capture_output=True, text=True, timeout=120
        )
    finally:
        if server:
            server.terminate()
            server.wait()
    out = lines_of(p.stdout)
    by_i = {line["i"]: line for line in out if "i" in line and "progress" not in line}
    check(f"{name}: exit 0", p.returncode == 0, p.stderr[-500:])
    check(f"{name}: era", out and out[0].get("connected", {}).get("protocol_version") == (
        "2025-11-25" if lifecycle == "legacy" else "2026-07-28"), out[:1])
    first = by_i.get(0, {}).get("result", {})
    check(f"{name}: charge answers", first.get("structuredContent", {}).get("customer") == "alice", by_i.get(0))
    check(f"{name}: amount 0 is a tool error", by_i.get(1, {}).get("result", {}).get("isError") is True, by_i.get(1))
    check(f"{name}: amount 13 is -32602", by_i.get(2, {}).get("jsonrpc_error", {}).get("code") == -32602, by_i.get(2))
    found = by_i.get(3, {}).get("result", {}).get("structuredContent", {})
    check(f"{name}: reference from _meta", (found.get("charge") or {}).get("reference") == op, found)
    check(f"{name}: one row", by_i.get(4, {}).get("result", {}).get("structuredContent") == {"count": 1} and count(db) == 1, by_i.get(4))


def children_of(pid):
    kids = []
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                if int(fields[1]) == pid:
                    kids.append(int(entry))
            except (OSError, IndexError, ValueError):
                pass
    return kids


def lost(driver, transport, lifecycle, node, tmp):
    name = f"{driver} {transport} {lifecycle} lost reply"
    db = os.path.join(tmp, f"lost-{driver}-{transport}-{lifecycle}.db")
    server, url = start_http(db, delay_ms=5000) if transport == "http" else (None, None)
    calls = [{"name": "charge", "arguments": {"customer": "dan", "amount_cents": 100}}, {"name": "count_charges"}]
    spec = spec_for(driver, transport, lifecycle, db, url, calls, delay_ms=5000)
    p = subprocess.Popen(
        [*driver_command(driver, node), json.dumps(spec)],
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
    )
    deadline = time.time() + 30
    while count(db) < 1 and time.time() < deadline:
        time.sleep(0.05)
    if server:
        server.kill()
        server.wait()
    else:
        for kid in children_of(p.pid):
            with open(f"/proc/{kid}/cmdline", "rb") as f:
                if b"charge_server.py" in f.read():
                    os.kill(kid, 9)
    try:
        stdout, _ = p.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        p.kill()
        stdout, _ = p.communicate()
    out = lines_of(stdout)
    check(f"{name}: exit 3", p.returncode == 3, p.returncode)
    check(f"{name}: call 0 is a transport error", out and out[-1].get("i") == 0 and "transport_error" in out[-1], out[-1:])
    check(f"{name}: the row is there", count(db) == 1, count(db))


def main():
    node = node_binary()
    with tempfile.TemporaryDirectory() as tmp:
        for driver in ["py-client", "py-session", "ts"]:
            for transport in ["stdio", "http"]:
                for lifecycle in ["legacy", "2026-07-28"]:
                    story(driver, transport, lifecycle, node, tmp)
                    lost(driver, transport, lifecycle, node, tmp)
    print(f"{results['passed']} passed, {results['failed']} failed")
    sys.exit(1 if results["failed"] else 0)


if __name__ == "__main__":
    main()
