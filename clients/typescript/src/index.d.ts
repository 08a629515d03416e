import type { CallToolResult, Client, Tool } from '@modelcontextprotocol/client';

/** `_meta` key of the operation id a call is sent under. */
export declare const META_OPERATION_ID: 'io.toolledger/operation_id';
/** `_meta` key of the ledger's word on a result: `{operationId, statusRef, replayed, state}`. */
export declare const META_LEDGER: 'io.toolledger/ledger';
/** `_meta` key that tells a server a call is a new intent despite equal arguments. */
export declare const META_NEW_INTENT: 'io.toolledger/new_intent';
export declare const STATUS_TOOL: 'get_operation_status';

export type OutcomeState = 'succeeded' | 'failed' | 'unknown' | 'conflict' | 'refused';

/** What `callToolOnce` and `resume` return. */
export interface Outcome {
    /**
     * succeeded: the effect happened (fresh or replayed); failed: the tool's own error is the
     * operation's answer, or an operator settled it as failed; unknown: not settled by the
     * deadline (the entry stays pending); conflict: the id is held by another call; refused: the
     * server refused the call and nothing was done under this id.
     */
    state: OutcomeState;
    /** True when the answer is one the server stored earlier. */
    replayed: boolean;
    /** The server's `CallToolResult` (for a JSON-RPC refusal: `{code, message, data}`), or null. */
    result: CallToolResult | { code: number; message: string; data?: unknown } | null;
    operationId: string;
    /** The ledger's status reference (`op_…`), what an operator settles it by. */
    statusRef: string | null;
    /** The ledger's error code (`operation_conflict`, `outcome_unknown`, `invalid_arguments`, …). */
    errorCode: string | null;
    message?: string;
    intent: string | null;
    tool: string;
}

/** One journaled call. */
export interface Entry {
    operationId: string;
    intent: string | null;
    tool: string;
    arguments: Record<string, unknown>;
    /** The argument the id is sent in besides `_meta`, or null. */
    keyArgument: string | null;
    createdAt: string;
    settled: boolean;
    statusRef: string | null;
    lastErrorCode: string | null;
    outcome: Outcome | null;
    settledAt?: string;
}

export interface SessionOptions {
    /** Makes a new connected client after a transport failure (a stdio server that died). */
    reconnect?: (previous: Client) => Promise<Client>;
    /** One request's timeout, at most; default 30 000. */
    requestTimeoutMs?: number;
    /** Delays between retries: capped exponential with jitter; default {initialMs: 200, maxMs: 5000}. */
    backoff?: { initialMs?: number; maxMs?: number };
    /** Per tool: the argument that carries the operation id (default: `operation_id` when listed). */
    keyArguments?: Record<string, string | null>;
}

export interface CallOptions {
    /** Names the intended effect; the same intent in this journal is always the same operation id. */
    intent?: string;
    /** A Date, or milliseconds from now; default 60 000. */
    deadline?: Date | number;
    /** Stops waiting (the entry stays pending). */
    signal?: AbortSignal;
    /** The argument that carries the operation id, or null for `_meta` only. */
    keyArgument?: string | null;
    /** Sends `_meta["io.toolledger/new_intent"]: true` (answers `possible_duplicate`). */
    newIntent?: boolean;
}

export declare class Ledger {
    /** Opens (creating on first use) the journal file at `path`. */
    constructor(path: string);
    readonly path: string;
    /** The namespace (a UUID) under which this journal turns intents into operation ids. */
    readonly namespace: string;
    readonly createdAt: string;
    /** The operation id `intent` has in this journal: UUIDv5(namespace, intent). */
    operationIdFor(intent: string): string;
    session(client: Client, options?: SessionOptions): LedgerSession;
    entries(): Entry[];
    entry(operationId: string): Entry | null;
    /** Journaled calls whose answer was never settled, oldest first. */
    pending(): Entry[];
    recordIntent(entry: { operationId: string; intent?: string | null; tool: string; arguments: Record<string, unknown>; keyArgument?: string | null }): void;
    recordObserved(observation: { operationId: string; statusRef?: string | null; errorCode?: string | null }): void;
    recordSettled(operationId: string, outcome: Partial<Outcome>): void;
    close(): void;
}

export declare class LedgerSession {
    constructor(ledger: Ledger, client: Client, options?: SessionOptions);
    readonly ledger: Ledger;
    /** The client calls go through now (a reconnection replaces it). */
    readonly client: Client;
    listTools(): Promise<Map<string, Tool>>;
    keyArgumentFor(name: string, explicit?: string | null): Promise<string | null>;
    callToolOnce(name: string, args?: Record<string, unknown>, options?: CallOptions): Promise<Outcome>;
    resume(entry: Entry | string, options?: { deadline?: Date | number; signal?: AbortSignal; newIntent?: boolean }): Promise<Outcome>;
}

export declare class LedgerError extends Error {}

/** The `{code, message, statusRef}` of a toolledger refusal, or null. */
export declare function ledgerError(result: CallToolResult): ({ code: string; message: string; statusRef: string | null } & Record<string, unknown>) | null;
export declare function uuidv5(name: string, namespace: string): string;
export declare function uuidv7(now?: number): string;
export declare function canonicalJson(value: unknown): string;
