// A session: tool calls through one MCP client, each journaled before it is sent and retried
// under the same operation id until the server gives an answer that settles it.
import { ProtocolError, SdkError, SdkErrorCode } from '@modelcontextprotocol/client';
import { canonicalJson, uuidv7 } from './ids.js';
import { request, traced } from './trace.js';

export const META_OPERATION_ID = 'io.toolledger/operation_id';
export const META_LEDGER = 'io.toolledger/ledger';
export const META_NEW_INTENT = 'io.toolledger/new_intent';
export const STATUS_TOOL = 'get_operation_status';

const DEFAULT_DEADLINE_MS = 60_000;
const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;

/** Answers that say the operation may still be running or its outcome is not known yet. */
const UNSETTLED = new Set(['operation_in_progress', 'outcome_unknown']);
/** Answers after which the same id, sent again, is forwarded: nothing was sent the first time. */
const RETRY_SAME_ID = new Set(['unavailable']);
/** Ledger states of a row whose outcome nobody knows yet. */
const OPEN_LEDGER_STATES = new Set(['outcome_unknown', 'processing', 'in_progress', 'dead']);

const TRANSPORT_CODES = new Set([
    SdkErrorCode.ConnectionClosed,
    SdkErrorCode.SendFailed,
    SdkErrorCode.NotConnected,
    SdkErrorCode.RequestTimeout,
]);

export class LedgerError extends Error {}

/** Thrown inside the session when too little time is left to send a request. */
class DeadlinePassed extends Error {}
const MIN_REQUEST_MS = 20;

/** The `{"error": {code, message, status_ref?}}` a toolledger server puts in a refusal, or null. */
export function ledgerError(result) {
    if (!result?.isError) return null;
    const text = result.content?.[0]?.type === 'text' ? result.content[0].text : null;
    if (typeof text !== 'string') return null;
    try {
        const parsed = JSON.parse(text);
        const err = parsed?.error;
        if (err && typeof err.code === 'string') return { code: err.code, message: err.message ?? '', statusRef: err.status_ref ?? null, ...err };
    } catch {
        // the upstream's own error text
    }
    return null;
}

function isTransportError(e) {
    if (e instanceof ProtocolError) return false;
    if (e instanceof SdkError) return TRANSPORT_CODES.has(e.code) || e.name === 'SdkHttpError';
    // fetch() failing (connection refused, reset) and the SDK's HTTP errors.
    return e instanceof TypeError || e?.name === 'SdkHttpError' || e?.code === 'ECONNREFUSED' || e?.code === 'ECONNRESET';
}

function isConnectionGone(e) {
    return e instanceof SdkError && (e.code === SdkErrorCode.ConnectionClosed || e.code === SdkErrorCode.NotConnected);
}

function describe(e) {
    const code = e?.code !== undefined ? ` ${e.code}` : '';
    return `${e?.name ?? 'Error'}${code}: ${String(e?.message ?? e)}`.slice(0, 500);
}

function sleep(ms, signal) {
    return new Promise((resolve, reject) => {
        if (signal?.aborted) return reject(signal.reason);
        const t = setTimeout(() => {
            signal?.removeEventListener('abort', onAbort);
            resolve();
        }, Math.max(0, ms));
        const onAbort = () => {
            clearTimeout(t);
            reject(signal.reason);
        };
        signal?.addEventListener('abort', onAbort, { immediate: true });
    });
}

function deadlineAt(deadline) {
    if (deadline === undefined || deadline === null) return Date.now() + DEFAULT_DEADLINE_MS;
    if (deadline instanceof Date) return deadline.getTime();
    if (typeof deadline === 'number' && Number.isFinite(deadline) && deadline >= 0) return Date.now() + deadline;
    throw new TypeError('deadline must be a Date or a number of milliseconds from now');
}

export class LedgerSession {
    /**
     * @param ledger   the journal
     * @param client   a connected `Client` of `@modelcontextprotocol/client`
     * @param options  {reconnect?, requestTimeoutMs?, backoff?: {initialMs?, maxMs?}, keyArguments?}
     */
    constructor(ledger, client, options = {}) {
        this.ledger = ledger;
        this._client = null;
        this._tools = null;
        this._inFlight = new Set();
        this.reconnect = options.reconnect ?? null;
        this.requestTimeoutMs = options.requestTimeoutMs ?? DEFAULT_REQUEST_TIMEOUT_MS;
        this.backoff = { initialMs: 200, maxMs: 5_000, ...(options.backoff ?? {}) };
        this.keyArguments = { ...(options.keyArguments ?? {}) };
        this._attach(client);
    }

    /** The client calls go through now (a reconnection replaces it). */
    get client() {
        return this._client;
    }

    _attach(client) {
        this._client = client;
        this._tools = null;
        // A stdio server that dies can leave a request in flight unanswered: the closed
        // connection is the answer then.
        const previous = client.onclose;
        client.onclose = (...a) => {
            for (const abort of this._inFlight) abort.abort(new SdkError(SdkErrorCode.ConnectionClosed, 'the connection closed with the call unanswered'));
            if (typeof previous === 'function') previous(...a);
        };
    }

    /** The server's tools (every page), listed once per connection. */
    async listTools() {
        if (this._tools === null) {
            const tools = new Map();
            let cursor;
            do {
                const page = await this._client.listTools(cursor ? { cursor } : undefined);
                for (const t of page.tools) tools.set(t.name, t);
                cursor = page.nextCursor;
            } while (cursor);
            this._tools = tools;
        }
        return this._tools;
    }

    async keyArgumentFor(name, explicit) {
        if (explicit !== undefined) return explicit;
        if (this.keyArguments[name] !== undefined) return this.keyArguments[name];
        let tools;
        try {
            tools = await this.listTools();
        } catch {
            return null; // the _meta key alone; the listing is tried again on the next call
        }
        const props = tools.get(name)?.inputSchema?.properties ?? {};
        return Object.hasOwn(props, 'operation_id') ? 'operation_id' : null;
    }

    /**
     * Calls a side-effecting tool at most once per intent: see the README.
     * @returns {Promise<Outcome>}
     */
    async callToolOnce(name, args = {}, options = {}) {
        if (typeof name !== 'string' || !name) throw new TypeError('the tool name must be a non-empty string');
        const { intent, deadline, signal, newIntent = false } = options;
        const at = deadlineAt(deadline);
        const operationId = intent !== undefined ? this.ledger.operationIdFor(intent) : uuidv7();
        const arguments_ = structuredClone(args ?? {});
        const existing = intent !== undefined ? this.ledger.entry(operationId) : null;
        let entry;
        if (existing) {
            // The journal already holds this intent (an earlier call, maybe in a process that
            // died): the same call again is a retry of it; another call is a conflict, not sent.
            if (existing.tool !== name || canonicalJson(existing.arguments) !== canonicalJson(arguments_)) {
                return {
                    state: 'conflict',
                    replayed: false,
                    result: null,
                    operationId,
                    statusRef: existing.statusRef,
                    errorCode: 'operation_conflict',
                    message: `the intent ${JSON.stringify(intent)} was journaled for another call (${existing.tool} with other arguments); nothing was sent`,
                    intent,
                    tool: name,
                };
            }
            entry = existing;
        } else {
            const keyArgument = await this.keyArgumentFor(name, options.keyArgument);
            entry = { operationId, intent: intent ?? null, tool: name, arguments: arguments_, keyArgument };
            this.ledger.recordIntent(entry); // durable before anything is sent
        }
        return traced(name, false, () => this._drive(entry, at, { signal, newIntent }));
    }

    /** Takes a journaled call up again (`ledger.pending()` lists them) under its own id. */
    async resume(entry, options = {}) {
        const id = typeof entry === 'string' ? entry : entry?.operationId;
        const stored = this.ledger.entry(id);
        if (!stored) throw new LedgerError(`the journal has no operation ${id}`);
        return traced(stored.tool, true, () =>
            this._drive(stored, deadlineAt(options.deadline), { signal: options.signal, newIntent: options.newIntent ?? false }),
        );
    }

    _delay(attempt) {
        const cap = Math.min(this.backoff.maxMs, this.backoff.initialMs * 2 ** Math.min(attempt, 20));
        return cap / 2 + Math.random() * (cap / 2); // half fixed, half jitter
    }

    async _wait(attempt, at, signal) {
        const ms = Math.min(this._delay(attempt), at - Date.now());
        if (ms > 0) await sleep(ms, signal);
    }

    async _request(fn, at, signal) {
        const abort = new AbortController();
        const onAbort = () => abort.abort(signal.reason);
        signal?.addEventListener('abort', onAbort, { immediate: true });
        this._inFlight.add(abort);
        try {
            const left = at - Date.now();
            if (left < MIN_REQUEST_MS) throw new DeadlinePassed();
            const timeout = Math.min(this.requestTimeoutMs, left);
            return await fn({ signal: abort.signal, timeout });
        } catch (e) {
            if (signal?.aborted) throw signal.reason;
            if (abort.signal.aborted && abort.signal.reason instanceof SdkError) throw abort.signal.reason;
            throw e;
        } finally {
            this._inFlight.delete(abort);
            signal?.removeEventListener('abort', onAbort);
        }
    }

    async _send(entry, at, { signal, newIntent }) {
        const args = { ...entry.arguments };
        if (entry.keyArgument) args[entry.keyArgument] = entry.operationId;
        const meta = { [META_OPERATION_ID]: entry.operationId };
        if (newIntent) meta[META_NEW_INTENT] = true;
        return request(entry.tool, meta, carried =>
            this._request(opts => this._client.callTool({ name: entry.tool, arguments: args, _meta: carried }, opts), at, signal),
        );
    }

    async _status(entry, at, signal) {
        const args = { operation_id: entry.operationId };
        try {
            const tools = await this.listTools();
            if (Object.hasOwn(tools.get(STATUS_TOOL)?.inputSchema?.properties ?? {}, 'tool')) args.tool = entry.tool;
        } catch {
            // asked without `tool`
        }
        const res = await request(STATUS_TOOL, {}, carried =>
            this._request(opts => this._client.callTool({ name: STATUS_TOOL, arguments: args, ...(Object.keys(carried).length ? { _meta: carried } : {}) }, opts), at, signal),
        );
        if (res.isError) throw new LedgerError(`${STATUS_TOOL} failed: ${res.content?.[0]?.text ?? 'no text'}`);
        return res.structuredContent ?? JSON.parse(res.content?.[0]?.text ?? '{}');
    }

    /** After a transport failure: a new connection when one can be made. False: give up. */
    async _recover(error) {
        // A request that timed out on a live connection is sent again on it: the server may be
        // slow, and the same id tells it apart from a new call.
        if (error instanceof SdkError && error.code === SdkErrorCode.RequestTimeout) return true;
        if (this.reconnect) {
            const previous = this._client;
            try {
                await previous.close(); // its stdio child, its HTTP session: let them go
            } catch {
                // already gone
            }
            const client = await this.reconnect(previous);
            if (client && client !== this._client) this._attach(client);
            else this._tools = null;
            return true;
        }
        // Without a way to reconnect, a closed connection stays closed; HTTP retries as it is.
        return !isConnectionGone(error);
    }

    _settle(entry, outcome) {
        const full = { ...outcome, operationId: entry.operationId, intent: entry.intent, tool: entry.tool };
        this.ledger.recordSettled(entry.operationId, full);
        return full;
    }

    _unknown(entry, seen, message) {
        this.ledger.recordObserved({ operationId: entry.operationId, statusRef: seen.statusRef, errorCode: seen.errorCode });
        return {
            state: 'unknown',
            replayed: false,
            result: seen.result ?? null,
            operationId: entry.operationId,
            statusRef: seen.statusRef ?? null,
            errorCode: seen.errorCode ?? null,
            message,
            intent: entry.intent,
            tool: entry.tool,
        };
    }

    async _drive(entry, at, { signal, newIntent }) {
        let attempt = 0;
        let seen = { statusRef: entry.statusRef ?? null, errorCode: entry.lastErrorCode ?? null };
        const seenRef = ref => (ref ? ref : seen.statusRef);
        for (;;) {
            if (Date.now() >= at) return this._unknown(entry, seen, 'the deadline passed before the server settled the call; the journal keeps it pending');
            let res;
            try {
                res = await this._send(entry, at, { signal, newIntent });
            } catch (e) {
                if (signal?.aborted) throw e;
                if (e instanceof DeadlinePassed) return this._unknown(entry, seen, 'the deadline passed before the server settled the call; the journal keeps it pending');
                if (e instanceof ProtocolError) {
                    // A JSON-RPC error: the server (or the upstream behind a proxy) refused the
                    // request. Whether the ledger recorded it decides what it means.
                    seen = { ...seen, errorCode: 'protocol_error', result: { code: e.code, message: e.message, data: e.data } };
                    const settled = await this._poll(entry, at, signal, seen, { immediate: true });
                    if (settled === 'no_row') {
                        return this._settle(entry, { state: 'refused', replayed: false, result: seen.result, statusRef: null, errorCode: 'protocol_error', message: e.message });
                    }
                    if (settled.unknown) return settled.unknown;
                    seen = settled.seen;
                    continue;
                }
                if (!isTransportError(e)) {
                    seen = { ...seen, errorCode: 'client_error' };
                    return this._unknown(entry, seen, `the client failed on the answer: ${describe(e)}`);
                }
                seen = { ...seen, errorCode: 'transport_error' };
                let recovered = false;
                while (!recovered && Date.now() < at) {
                    await this._wait(attempt++, at, signal);
                    try {
                        recovered = await this._recover(e);
                        if (!recovered) return this._unknown(entry, seen, `the connection is gone (${describe(e)}) and the session has no reconnect`);
                    } catch (re) {
                        if (signal?.aborted) throw re;
                        // the server is not back yet; try again after the next delay
                    }
                }
                continue;
            }

            const ledgerMeta = res._meta?.[META_LEDGER] ?? null;
            const err = ledgerError(res);
            const statusRef = seenRef(ledgerMeta?.statusRef ?? err?.statusRef ?? null);
            if (!res.isError) {
                const replayed = Boolean(ledgerMeta?.replayed ?? res.structuredContent?.replayed ?? false);
                return this._settle(entry, { state: 'succeeded', replayed, result: res, statusRef, errorCode: null });
            }
            if (ledgerMeta?.state === 'failed' || (!err && res.isError)) {
                // The tool's own error, recorded by the ledger as the operation's answer.
                return this._settle(entry, { state: 'failed', replayed: Boolean(ledgerMeta?.replayed), result: res, statusRef, errorCode: null });
            }
            const code = err.code;
            if (code === 'operation_conflict') {
                return this._settle(entry, { state: 'conflict', replayed: false, result: res, statusRef, errorCode: code, message: err.message });
            }
            if (code === 'resolved_failed') {
                return this._settle(entry, { state: 'failed', replayed: true, result: res, statusRef, errorCode: code, message: err.message });
            }
            if (code === 'effect_confirmed') {
                return this._settle(entry, { state: 'succeeded', replayed: true, result: res, statusRef, errorCode: code, message: err.message });
            }
            if (RETRY_SAME_ID.has(code)) {
                seen = { ...seen, statusRef, errorCode: code };
                await this._wait(attempt++, at, signal);
                continue;
            }
            if (UNSETTLED.has(code)) {
                seen = { ...seen, statusRef, errorCode: code, result: res };
                this.ledger.recordObserved({ operationId: entry.operationId, statusRef, errorCode: code });
                const settled = await this._poll(entry, at, signal, seen, { attempt: attempt++ });
                if (settled === 'no_row') continue; // nothing recorded under this id: send it
                if (settled.unknown) return settled.unknown;
                seen = settled.seen;
                continue; // settled (or forwardable): the same id again gets the answer
            }
            // Any other refusal: nothing was done under this id (invalid_arguments, not_found,
            // permission_denied, possible_duplicate, continuation_unsupported, …).
            return this._settle(entry, { state: 'refused', replayed: false, result: res, statusRef, errorCode: code, message: err.message });
        }
    }

    /**
     * Asks `get_operation_status` until the operation is settled, forwardable, or the deadline.
     * Returns 'no_row' when no ledger row answers, {seen} when the call should be sent again
     * (its answer is stored, or it was never sent), or {unknown: outcome} at the deadline.
     */
    async _poll(entry, at, signal, seen, { immediate = false, attempt = 0 } = {}) {
        for (let i = 0; ; i++) {
            if (!immediate || i > 0) {
                if (Date.now() >= at) {
                    return { unknown: this._unknown(entry, seen, `the operation is ${seen.ledgerState ?? seen.errorCode}: its outcome is not settled by the deadline; the journal keeps it pending`) };
                }
                await this._wait(attempt + i, at, signal);
            }
            let st;
            try {
                st = await this._status(entry, at, signal);
            } catch (e) {
                if (signal?.aborted) throw e;
                if (e instanceof DeadlinePassed) {
                    return { unknown: this._unknown(entry, seen, `the operation is ${seen.ledgerState ?? seen.errorCode}: its outcome is not settled by the deadline; the journal keeps it pending`) };
                }
                if (isTransportError(e)) {
                    try {
                        if (!(await this._recover(e))) return { unknown: this._unknown(entry, seen, `the connection is gone (${describe(e)}) and the session has no reconnect`) };
                    } catch {
                        // not back yet
                    }
                }
                continue;
            }
            seen = { ...seen, statusRef: st.statusRef ?? seen.statusRef, ledgerState: st.ledgerState };
            if (st.ledgerState === 'outcome_unknown' || st.ledgerState === 'dead') seen.errorCode = 'outcome_unknown';
            else if (st.ledgerState === 'processing' || st.ledgerState === 'in_progress') seen.errorCode = 'operation_in_progress';
            if (st.ledgerState === null || st.ledgerState === undefined) return 'no_row';
            if (['applied', 'succeeded', 'partial', 'failed'].includes(st.state) || !OPEN_LEDGER_STATES.has(st.ledgerState)) return { seen };
            if (st.ledgerState === 'processing' || st.ledgerState === 'in_progress') {
                // A forward that may finish by itself (or whose lease lapses into
                // outcome_unknown): the same id again tells which.
                if (!immediate) return { seen };
            }
        }
    }
}
