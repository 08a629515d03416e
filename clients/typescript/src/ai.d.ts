import type { Tool } from 'ai';
import type { LedgerSession, Outcome, OutcomeState } from './index.js';

export interface LedgerToolsOptions {
    /** Names the agent run: a restarted run with the same runId reuses its journaled keys. */
    runId?: string;
    /** The intent of one tool call; default `${runId}:${toolName}:${canonical JSON of input}`. */
    intent?: (call: { toolName: string; input: Record<string, unknown>; toolCallId: string; runId?: string }) => string;
    /** Only these tools. */
    tools?: string[];
    /** Passed to callToolOnce. */
    deadline?: Date | number;
}

/** What a tool's `execute` returns to the model. */
export interface ModelOutput {
    state: OutcomeState;
    replayed: boolean;
    /** The result's structuredContent, else its text. */
    result: unknown;
    errorCode?: string;
    statusRef?: string;
    note?: string;
}

export declare function ledgerTools(session: LedgerSession, options?: LedgerToolsOptions): Promise<Record<string, Tool<Record<string, unknown>, ModelOutput>>>;
export declare function toModelOutput(outcome: Outcome): ModelOutput;
