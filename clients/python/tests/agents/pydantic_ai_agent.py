"""A pydantic-ai agent (a scripted FunctionModel, no network) that charges through
LedgerToolset and prints its output. Usage: pydantic_ai_agent.py SPEC_JSON
  {"journal", "server": <a _support spec>, "run_key", "customer", "amount_cents"}
"""

import json
import sys
from pathlib import Path

import anyio
from pydantic_ai import Agent
from pydantic_ai.messages import ModelResponse, TextPart, ToolCallPart, ToolReturnPart
from pydantic_ai.models.function import AgentInfo, FunctionModel

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import _support  # noqa: E402
from toolledger_client import Ledger  # noqa: E402
from toolledger_client.adapters.pydantic_ai import LedgerToolset  # noqa: E402


async def main(spec):
    def plan(messages, info: AgentInfo) -> ModelResponse:
        names = {t.name for t in info.function_tools}
        assert "charge" in names and "get_operation_status" not in names, names
        charge = next(t for t in info.function_tools if t.name == "charge")
        assert "operation_id" not in charge.parameters_json_schema["properties"]
        returns = [p for m in messages for p in m.parts if isinstance(p, ToolReturnPart)]
        if not returns:
            print(json.dumps({"calling": "charge"}), flush=True)
            return ModelResponse(
                parts=[ToolCallPart("charge", {"customer": spec["customer"], "amount_cents": spec["amount_cents"]})]
            )
        return ModelResponse(parts=[TextPart(json.dumps(returns[-1].content))])

    toolset = LedgerToolset(
        Ledger(spec["journal"]), lambda: _support.connect(spec["server"]), run_key=spec["run_key"], deadline=30
    )
    agent = Agent(FunctionModel(plan), toolsets=[toolset])
    result = await agent.run("Charge the customer.")
    print(json.dumps({"output": json.loads(result.output)}), flush=True)


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]))
