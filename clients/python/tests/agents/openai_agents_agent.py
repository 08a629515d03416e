"""An OpenAI Agents SDK agent (a scripted Model, no network) that charges through
LedgerMCPServer and prints its final output. Usage: openai_agents_agent.py SPEC_JSON
  {"journal", "server": <a _support stdio spec>, "run_key", "customer", "amount_cents"}
"""

import json
import os
import sys
from pathlib import Path

os.environ.setdefault("OPENAI_AGENTS_DISABLE_TRACING", "1")

import anyio  # noqa: E402
from agents import Agent, Runner, set_tracing_disabled  # noqa: E402
from agents.items import ModelResponse  # noqa: E402
from agents.mcp import MCPServerStdio  # noqa: E402
from agents.models.interface import Model  # noqa: E402
from agents.usage import Usage  # noqa: E402
from mcp.client.stdio import get_default_environment  # noqa: E402
from openai.types.responses import ResponseFunctionToolCall, ResponseOutputMessage, ResponseOutputText  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from toolledger_client import Ledger  # noqa: E402
from toolledger_client.adapters.openai_agents import LedgerMCPServer  # noqa: E402


def field(item, name):
    return item.get(name) if isinstance(item, dict) else getattr(item, name, None)


class ScriptedModel(Model):
    """Asks for one charge, then answers with the tool's output."""

    def __init__(self, customer, amount_cents):
        self.call = {"customer": customer, "amount_cents": amount_cents}

    async def get_response(self, system_instructions, input, model_settings, tools, output_schema, handoffs,
                           tracing, *, previous_response_id=None, conversation_id=None, prompt=None):
        charge = next(t for t in tools if t.name == "charge")
        assert "operation_id" not in charge.params_json_schema["properties"], charge.params_json_schema
        assert not any(t.name == "get_operation_status" for t in tools)
        items = input if isinstance(input, list) else []
        outputs = [i for i in items if field(i, "type") == "function_call_output"]
        if not outputs:
            print(json.dumps({"calling": "charge"}), flush=True)
            call = ResponseFunctionToolCall(type="function_call", id="fc_1", call_id="call_1", name="charge",
                                            arguments=json.dumps(self.call), status="completed")
            return ModelResponse(output=[call], usage=Usage(), response_id=None)
        text = field(outputs[-1], "output")
        text = text if isinstance(text, str) else json.dumps(text)
        message = ResponseOutputMessage(id="msg_1", type="message", role="assistant", status="completed",
                                        content=[ResponseOutputText(type="output_text", text=text, annotations=[])])
        return ModelResponse(output=[message], usage=Usage(), response_id=None)

    def stream_response(self, *args, **kwargs):
        raise NotImplementedError("this scripted model does not stream")


async def main(spec):
    set_tracing_disabled(True)
    server = spec["server"]
    inner = MCPServerStdio(
        {"command": server["command"], "args": server["args"], "env": {**get_default_environment(), **server["env"]}},
        use_structured_content=True,
        client_session_timeout_seconds=30,
    )
    async with LedgerMCPServer(inner, Ledger(spec["journal"]), run_key=spec["run_key"], deadline=30) as wrapped:
        agent = Agent(name="billing", model=ScriptedModel(spec["customer"], spec["amount_cents"]), mcp_servers=[wrapped])
        result = await Runner.run(agent, "Charge the customer.")
    print(json.dumps({"output": result.final_output}), flush=True)


if __name__ == "__main__":
    anyio.run(main, json.loads(sys.argv[1]))
