// The interop story through the TypeScript SDK v1 (`@modelcontextprotocol/sdk` 1.32.2), which
// speaks only the initialize lifecycle: create_issue's body is asked for with
// elicitation/create, answered by the registered handler. This SDK validates structuredContent
// against the tool's outputSchema even on error results, so every error must reach the
// client as its real code, never as a schema failure. A second client that declares no
// elicitation asks for an issue too.
// Usage: node ts-v1.mjs SPEC_JSON (see common.mjs). Prints one JSON object, one entry per case.

import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StdioClientTransport } from '@modelcontextprotocol/sdk/client/stdio.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { ElicitRequestSchema } from '@modelcontextprotocol/sdk/types.js';

import { BODY, ISSUE, emit, kase, loadSpec, seen, singleRoundStory, toolListing } from './common.mjs';

const spec = loadSpec();

function transport() {
    if (spec.transport === 'stdio') {
        const { command, args, env } = spec.server;
        return new StdioClientTransport({ command, args, env, stderr: 'inherit' });
    }
    return new StreamableHTTPClientTransport(new URL(spec.url), {
        requestInit: { headers: { Authorization: `Bearer ${spec.token}` } }
    });
}

function client(elicit) {
    const c = new Client(
        { name: 'toolledger-interop-ts-v1', version: '1.0.0' },
        { capabilities: elicit ? { elicitation: { form: {} } } : {} }
    );
    if (elicit) {
        c.setRequestHandler(ElicitRequestSchema, async () => ({ action: 'accept', content: { body: BODY } }));
    }
    return c;
}

const out = {};
const c = client(true);
const main = transport();
await c.connect(main);
out.protocol_version = c.transport?.protocolVersion ?? null;
await kase(out, 'tools_list', async () => toolListing(await c.listTools()));
await kase(out, 'create_issue', async () => seen(await c.callTool({ name: 'create_issue', arguments: ISSUE })));
await kase(out, 'create_issue_again', async () => seen(await c.callTool({ name: 'create_issue', arguments: ISSUE })));
await singleRoundStory(async (name, args) => c.callTool({ name, arguments: args }), spec, out);
if (spec.transport === 'http' && spec.lifecycle === 'legacy') {
    // The initialize lifecycle over HTTP has a session; the client ends it with DELETE.
    await kase(out, 'http_session_termination', async () => {
        const hadSession = typeof main.sessionId === 'string';
        await main.terminateSession();
        return { hadSession, terminated: main.sessionId === undefined };
    });
}
await c.close();

await kase(out, 'create_issue_without_elicitation', async () => {
    const plain = client(false);
    await plain.connect(transport());
    try {
        return seen(await plain.callTool({ name: 'create_issue', arguments: { operation_id: 'iss-nocap', title: 'spec' } }));
    } finally {
        await plain.close();
    }
});
emit(out);
