// Drives an MCP server (or a proxy in front of one) with the TypeScript SDK v2
// (`@modelcontextprotocol/client` 2.4.0), one connection, calls made in order.
// Usage: node ts_client.mjs SPEC_JSON
//
// The spec:
//   {"transport": "stdio" | "http",
//    "server": {"command", "args", "env"}       stdio: how to start the server (env is passed
//                                               as given, on top of the SDK's default
//                                               inherited variables)
//    "url": "http://.../mcp", "token": "..."    http: the endpoint; the token, if any, is sent
//                                               as `Authorization: Bearer <token>`
//    "lifecycle": "2026-07-28" | "legacy" | "auto"
//    "list_tools": true | false
//    "progress": true | false                   ask for progress and print what arrives
//    "timeout_ms": N                            per-request timeout (the SDK's default is 60 s)
//    "calls": [{"name", "arguments", "meta"?}]}
//
// lifecycle: "legacy" is the SDK's default (initialize); "2026-07-28" is
// `versionNegotiation: {mode: {pin: '2026-07-28'}}` (server/discover must offer it, no
// fallback); "auto" probes with server/discover and falls back to initialize (on stdio the
// probe runs in a short-lived extra copy of the server process).
//
// Output, one JSON line each, written as soon as it is known:
//   {"connected": {"protocol_version"}}
//   {"tools": [...]}                            the listing, when asked for
//   {"i": N, "progress": {...}}                 a progress notification for call N
//   {"i": N, "result": CallToolResult}          as the SDK returns it (isError included)
//   {"i": N, "jsonrpc_error": {"code", "message", "data"?}}   a ProtocolError from the wire
//   {"i": N, "sdk_error": {"code", "message"}}  a local SDK failure that is not a lost
//                                               connection (e.g. a result failing its
//                                               outputSchema, a request timeout)
//   {"i": N, "transport_error": "..."}          then no further calls are made and the exit is 3
// A connection that cannot be opened prints {"transport_error": "..."} and exits 3; so does a
// connection that ends while a request is unanswered (a call's line then has its "i").

import { Client, ProtocolError, SdkError, SdkErrorCode, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

const LOST = 3;
const TRANSPORT_CODES = new Set([SdkErrorCode.ConnectionClosed, SdkErrorCode.SendFailed, SdkErrorCode.NotConnected]);

const spec = JSON.parse(process.argv[2]);

function emit(obj) {
    process.stdout.write(JSON.stringify(obj) + '\n');
}

function describe(e) {
    const code = e?.code !== undefined ? ` ${e.code}` : '';
    return `${e?.name ?? 'Error'}${code}: ${String(e?.message ?? e)}`.slice(0, 500);
}

/** What a failed request was: an error the server sent, a lost connection, or a local failure. */
function classify(e) {
    if (e instanceof ProtocolError) {
        const out = { code: e.code, message: e.message };
        if (e.data !== undefined) out.data = e.data;
        return { jsonrpc_error: out };
    }
    // An HTTP status with no JSON-RPC error in the body (SdkHttpError) is a failed exchange.
    if (e instanceof SdkError && !TRANSPORT_CODES.has(e.code) && e.name !== 'SdkHttpError') {
        return { sdk_error: { code: e.code, message: e.message } };
    }
    return { transport_error: describe(e) };
}

function transport() {
    if (spec.transport === 'stdio') {
        const { command, args = [], env = {} } = spec.server;
        return new StdioClientTransport({ command, args, env, stderr: 'inherit' });
    }
    const headers = spec.token ? { Authorization: `Bearer ${spec.token}` } : {};
    return new StreamableHTTPClientTransport(new URL(spec.url), { requestInit: { headers } });
}

function client() {
    const options = { capabilities: {} };
    const lifecycle = spec.lifecycle ?? 'legacy';
    if (lifecycle === '2026-07-28') options.versionNegotiation = { mode: { pin: '2026-07-28' } };
    else if (lifecycle === 'auto') options.versionNegotiation = { mode: 'auto' };
    else if (lifecycle !== 'legacy') throw new Error(`unknown lifecycle ${lifecycle}`);
    return new Client({ name: 'toolledger-proxy-ts-client', version: '1.0.0' }, options);
}

async function main() {
    const c = client();
    const t = transport();
    let lost = false;
    // A transport that dies between requests is noticed here; a request in flight rejects on its own.
    // Over streamable HTTP, a response stream that breaks is retried (GET with Last-Event-ID);
    // when the transport gives up it says so only through onerror and the request stays pending
    // until its timeout. The driver takes that report as the lost connection and aborts the call.
    let inFlight = null;
    // A stdio server that dies can leave the request in flight unsettled; the closed
    // connection is the lost connection then.
    c.onclose = () => {
        if (inFlight && !inFlight.lost) {
            inFlight.lost = 'connection closed with the call unanswered';
            inFlight.abort.abort(new Error(inFlight.lost));
        }
    };
    c.onerror = e => {
        process.stderr.write(`ts_client: transport error: ${describe(e)}\n`);
        if (inFlight && /^Maximum reconnection attempts/.test(String(e?.message))) {
            inFlight.lost = describe(e);
            inFlight.abort.abort(e);
        }
    };
    try {
        await c.connect(t);
    } catch (e) {
        emit({ transport_error: describe(e) });
        return LOST;
    }
    emit({ connected: { protocol_version: c.getNegotiatedProtocolVersion?.() ?? null } });
    const requestOptions = (i, signal) => {
        const o = signal ? { signal } : {};
        if (spec.timeout_ms) o.timeout = spec.timeout_ms;
        if (spec.progress) o.onprogress = p => emit({ i, progress: p });
        return o;
    };
    if (spec.list_tools) {
        try {
            emit({ tools: (await c.listTools()).tools });
        } catch (e) {
            const seen = classify(e);
            if (seen.transport_error) {
                emit(seen);
                return LOST;
            }
            emit({ list_tools_error: seen.jsonrpc_error ?? seen.sdk_error });
        }
    }
    const calls = spec.calls ?? [];
    for (let i = 0; i < calls.length; i++) {
        const { name, arguments: args = {}, meta } = calls[i];
        const params = { name, arguments: args };
        if (meta !== undefined && meta !== null) params._meta = meta;
        inFlight = { abort: new AbortController(), lost: null };
        try {
            emit({ i, result: await c.callTool(params, requestOptions(i, inFlight.abort.signal)) });
        } catch (e) {
            const seen = inFlight.lost ? { transport_error: inFlight.lost } : classify(e);
            emit({ i, ...seen });
            if (seen.transport_error) {
                lost = true;
                break;
            }
        } finally {
            inFlight = null;
        }
    }
    try {
        await c.close();
    } catch (e) {
        process.stderr.write(`ts_client: close failed: ${describe(e)}\n`);
    }
    return lost ? LOST : 0;
}

// If the connection ends while the SDK still awaits an answer (and nothing else keeps the
// process alive), Node would exit 13 on the unsettled await: report it as what it is, a lost
// connection.
let finished = false;
process.on('beforeExit', () => {
    if (!finished) {
        emit({ transport_error: 'the connection ended with a request unanswered' });
        process.exit(LOST);
    }
});
const code = await main();
finished = true;
// Flush stdout before leaving; the stdio child is already closed.
process.stdout.write('', () => process.exit(code));
