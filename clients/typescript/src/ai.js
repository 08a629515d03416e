// Tools for the Vercel AI SDK (`ai` 7) whose `execute` goes through `callToolOnce`.
import { dynamicTool, jsonSchema } from 'ai';
import { canonicalJson } from './ids.js';
import { STATUS_TOOL } from './session.js';

/** The schema the model sees: the tool's own, without the key argument the client fills in. */
function modelSchema(inputSchema, keyArgument) {
    const schema = structuredClone(inputSchema ?? { type: 'object', properties: {} });
    if (keyArgument && schema.properties) {
        delete schema.properties[keyArgument];
        if (Array.isArray(schema.required)) schema.required = schema.required.filter(k => k !== keyArgument);
    }
    return schema;
}

function isGuarded(tool, keyArgument) {
    if (keyArgument && Object.hasOwn(tool.inputSchema?.properties ?? {}, keyArgument)) return true;
    return tool.annotations?.readOnlyHint !== true;
}

/** What the model is told: the result's structured content or text, and the ledger's word. */
export function toModelOutput(outcome) {
    const r = outcome.result;
    let value = null;
    if (r && typeof r === 'object' && ('content' in r || 'structuredContent' in r)) {
        value = r.structuredContent ?? (r.content ?? []).filter(c => c.type === 'text').map(c => c.text).join('\n');
    } else if (r !== undefined) {
        value = r;
    }
    const out = { state: outcome.state, replayed: outcome.replayed, result: value };
    if (outcome.errorCode) out.errorCode = outcome.errorCode;
    if (outcome.statusRef) out.statusRef = outcome.statusRef;
    if (outcome.state === 'unknown') {
        out.note = 'The effect may or may not have happened. Do not call this tool again for the same purpose; the operation is kept and will be settled.';
    }
    return out;
}

/**
 * The session's MCP tools as AI SDK tools. Guarded (side-effecting) tools run through
 * `session.callToolOnce` with an intent derived from the run, the tool and its arguments;
 * read-only tools are called directly.
 *
 * options:
 *   runId      names this agent run; a restarted run with the same runId reuses the keys of
 *              the calls it journaled before (required unless `intent` is given)
 *   intent     ({toolName, input, toolCallId, runId}) => string: the intent of one call
 *   tools      only these tool names
 *   deadline   passed to callToolOnce (milliseconds or a Date)
 */
export async function ledgerTools(session, options = {}) {
    const { runId, tools: only, deadline } = options;
    const intentOf =
        options.intent ??
        (({ toolName, input }) => {
            if (typeof runId !== 'string' || !runId) throw new TypeError('ledgerTools needs a runId (or an intent function)');
            return `${runId}:${toolName}:${canonicalJson(input)}`;
        });
    const listed = await session.listTools();
    const out = {};
    for (const tool of listed.values()) {
        if (tool.name === STATUS_TOOL) continue;
        if (only && !only.includes(tool.name)) continue;
        const keyArgument = await session.keyArgumentFor(tool.name);
        const guarded = isGuarded(tool, keyArgument);
        out[tool.name] = dynamicTool({
            description: tool.description ?? tool.title ?? tool.name,
            inputSchema: jsonSchema(modelSchema(tool.inputSchema, keyArgument)),
            execute: async (input, { toolCallId, abortSignal }) => {
                if (!guarded) {
                    const res = await session.client.callTool({ name: tool.name, arguments: input ?? {} }, abortSignal ? { signal: abortSignal } : undefined);
                    return toModelOutput({ state: res.isError ? 'failed' : 'succeeded', replayed: false, result: res });
                }
                const intent = intentOf({ toolName: tool.name, input: input ?? {}, toolCallId, runId });
                const outcome = await session.callToolOnce(tool.name, input ?? {}, { intent, deadline, signal: abortSignal });
                return toModelOutput(outcome);
            },
        });
    }
    return out;
}
