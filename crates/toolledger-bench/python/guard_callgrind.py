"""Instructions per proxied fresh call, with the re-plan guard on or off: runs `toolledger proxy`
(in front of `toolledger upstream-example`) under `valgrind --tool=callgrind` and sends it N
fresh `charge` calls one after another over stdio (MCP 2026-07-28 requests). Only the proxy is
counted (valgrind does not follow its child). Prints `GUARD N TOTAL_INSTRUCTIONS`.

Run it twice per setting with two N and take the difference over the extra calls, which removes
the start-up's share:

    for n in 100 400; do for g in off on; do
      python3 guard_callgrind.py target/release/toolledger /tmp/cg-$g-$n $g $n
    done; done

Usage: guard_callgrind.py TOOLLEDGER DIR on|off N    (DIR: a new directory for the files)
"""

import json
import os
import subprocess
import sys


def main() -> None:
    binary, directory, guard, n = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
    os.makedirs(directory)
    ledger = os.path.join(directory, "ledger.sqlite")
    config = os.path.join(directory, "proxy.toml")
    with open(config, "w") as f:
        f.write('[tools.charge]\nforward_operation_id = "_meta"\n')
        if guard == "off":
            f.write("replan_window_seconds = 0\n")
    subprocess.run([binary, "principal", "add", "--db", ledger, "--tenant", "bench", "bench"], check=True,
                   capture_output=True)
    env = {k: v for k, v in os.environ.items() if not k.startswith("TOOLLEDGER_")}
    out = os.path.join(directory, "callgrind.out")
    proxy = subprocess.Popen(
        ["valgrind", "--tool=callgrind", "--callgrind-out-file=" + out, binary, "proxy", "--db", ledger,
         "--principal", "bench", "--config", config, "--", binary, "upstream-example", "--db",
         os.path.join(directory, "charges.sqlite")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=open(os.path.join(directory, "stderr.log"), "w"),
        env=env)
    meta = {"io.modelcontextprotocol/protocolVersion": "2026-07-28",
            "io.modelcontextprotocol/clientCapabilities": {},
            "io.modelcontextprotocol/clientInfo": {"name": "guard-callgrind", "version": "1"}}
    for i in range(n):
        arguments = {"customer": f"c-{i}", "amount_cents": 100 + i % 1000, "operation_id": f"op-{i}"}
        request = {"jsonrpc": "2.0", "id": i + 1, "method": "tools/call",
                   "params": {"name": "charge", "arguments": arguments, "_meta": meta}}
        proxy.stdin.write((json.dumps(request) + "\n").encode())
        proxy.stdin.flush()
        reply = json.loads(proxy.stdout.readline())
        if reply.get("result", {}).get("isError") is not False:
            sys.exit(f"call {i} was not a fresh charge: {reply}")
    proxy.stdin.close()
    proxy.wait()
    with open(out) as f:
        total = next(line.split()[1] for line in f if line.startswith("summary:"))
    print(guard, n, total)


if __name__ == "__main__":
    main()
