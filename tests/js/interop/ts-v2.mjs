// The interop story through the TypeScript SDK v2 (`@modelcontextprotocol/client` 2.4.0):
// under 2026-07-28 (`versionNegotiation: {mode: {pin: '2026-07-28'}}`) the SDK's own
// input_required driver runs create_issue's rounds through the registered elicitation/create
// handler; under the initialize lifecycle (the SDK's default) the server asks with
// elicitation/create. A second client that declares no elicitation asks for an issue too.
// Usage: node ts-v2.mjs SPEC_JSON (see common.mjs). Prints one JSON object, one entry per case.

import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

import { BODY, ISSUE, emit, kase, loadSpec, seen, singleRoundStory, toolListing } from './common.mjs';

const spec = loadSpec();
const modern = spec.lifecycle === '2026-07-28';

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
    const options = { capabilities: elicit ? { elicitation: { form: {} } } : {} };
    if (modern) options.versionNegotiation = { mode: { pin: '2026-07-28' } };
    const c = new Client({ name: 'toolledger-interop-ts-v2', version: '1.0.0' }, options);
    if (elicit) {
        c.setRequestHandler('elicitation/create', async () => ({ action: 'accept', content: { body: BODY } }));
    }
    return c;
}

const out = {};
const c = client(true);
const main = transport();
await c.connect(main);
out.protocol_version = c.getNegotiatedProtocolVersion?.() ?? null;
await kase(out, 'tools_list', async () => toolListing(await c.listTools()));
// Fresh through the SDK's rounds, then the same call again: the client keeps no requestState
// between calls, so it starts over with the same body.
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
