"""Agent-framework adapters. Each module imports its framework; the core package needs only `mcp`.

- `toolledger_client.adapters.pydantic_ai`: `LedgerToolset` (pydantic-ai-slim).
- `toolledger_client.adapters.openai_agents`: `LedgerMCPServer` (openai-agents).
"""
