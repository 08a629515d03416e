// OpenTelemetry spans, when the application has `@opentelemetry/api` installed (an optional peer
// dependency; without it, or without an SDK registered, nothing is recorded): one span per
// `callToolOnce` / `resume`, and under it a client span per MCP request whose context travels to
// the server in `_meta` (`traceparent`, `tracestate`), so the server's span joins the agent's
// trace. Never recorded: the operation id, the intent, or argument values.
let api = null;
try {
    api = await import('@opentelemetry/api');
} catch {
    api = null;
}

const TRACER = '@toolledger/client';

/**
 * Runs `body(span)` in a new active span `name`: a throw marks the span an error (`error.type`,
 * the error's name) and is rethrown; the span ends either way.
 */
function inSpan(name, kind, attributes, body) {
    return api.trace.getTracer(TRACER).startActiveSpan(name, { kind, attributes }, async span => {
        try {
            return await body(span);
        } catch (e) {
            span.setAttribute('error.type', e?.name ?? 'Error');
            span.setStatus({ code: api.SpanStatusCode.ERROR });
            throw e;
        } finally {
            span.end();
        }
    });
}

/** Runs `drive` (which resolves to an Outcome) in a span `call_tool_once {tool}`. */
export async function traced(tool, resumed, drive) {
    if (!api) return drive();
    const attributes = { 'gen_ai.operation.name': 'execute_tool', 'gen_ai.tool.name': tool, 'toolledger.resumed': resumed };
    return inSpan(`call_tool_once ${tool}`, api.SpanKind.INTERNAL, attributes, async span => {
        const outcome = await drive();
        span.setAttribute('toolledger.outcome', outcome.state);
        span.setAttribute('toolledger.replayed', Boolean(outcome.replayed));
        if (outcome.statusRef) span.setAttribute('toolledger.status_ref', outcome.statusRef);
        if (outcome.state !== 'succeeded') {
            span.setAttribute('error.type', outcome.errorCode ?? outcome.state);
            span.setStatus({ code: api.SpanStatusCode.ERROR });
        }
        return outcome;
    });
}

/**
 * Sends one `tools/call` of `tool` with `meta` as its `_meta` through `send(meta)`, in a client
 * span `tools/call {tool}` whose context is added to the `_meta` sent.
 */
export async function request(tool, meta, send) {
    if (!api) return send(meta);
    const attributes = { 'mcp.method.name': 'tools/call', 'gen_ai.tool.name': tool, 'gen_ai.operation.name': 'execute_tool' };
    return inSpan(`tools/call ${tool}`, api.SpanKind.CLIENT, attributes, async span => {
        const carried = { ...meta };
        api.propagation.inject(api.context.active(), carried);
        const result = await send(carried);
        if (result?.isError) span.setAttribute('error.type', 'tool_error');
        return result;
    });
}
