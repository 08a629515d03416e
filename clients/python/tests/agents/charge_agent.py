"""A small agent process using toolledger_client: charges once, prints the outcome as JSON.

Usage: charge_agent.py SPEC_JSON
  {"journal", "server": <a _support spec>, "intent", "arguments",
   "mode": "call" | "resume", "deadline"}
"call" calls `charge` with the intent; "resume" completes every pending journal entry.
The crash tests SIGKILL it mid-call and start it again.
"""

import json
import sys
from dataclasses import asdict
from pathlib import Path

import anyio

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _support  # noqa: E402
from toolledger_client import Ledger  # noqa: E402


def emit(obj):
    print(json.dumps(obj, default=str), flush=True)


async def main(spec):
    ledger = Ledger(spec["journal"])
    async with ledger.session(
        reconnect=lambda: _support.connect(spec["server"]), backoff_initial=0.1, backoff_max=1.0
    ) as session:
        if spec["mode"] == "call":
            emit({"calling": spec["intent"]})
            outcomes = [
                await session.call_tool_once(
                    "charge", spec["arguments"], intent=spec["intent"], deadline=spec.get("deadline", 30)
                )
            ]
        else:
            pending = ledger.pending()
            emit({"pending": [e.operation_id for e in pending]})
            outcomes = [await session.resume(e, deadline=spec.get("deadline", 30)) for e in pending]
    for out in outcomes:
        d = asdict(out)
        d.pop("result")
        emit({"outcome": d})


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]))
