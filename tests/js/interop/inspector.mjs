// The interop story through the MCP Inspector's command line (`@modelcontextprotocol/inspector`
// 2.12.0, `inspector --cli`), one Inspector run per request: stdio servers come from a
// session config file (`--config`, `--server`), HTTP servers from the URL with the bearer
// token in `--header`; `--protocol-era modern` speaks 2026-07-28, `legacy` the initialize
// lifecycle. The Inspector's CLI declares no elicitation and answers no input request, so
// create_issue (whose body arrives in a second round) must be refused with
// continuation_unsupported and nothing written; the single-round tools run the whole story.
// Usage: node inspector.mjs SPEC_JSON (see common.mjs). Prints one JSON object, one entry per
// case.

import { spawnSync } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { dirname, join } from 'node:path';

import { emit, kase, loadSpec, seen, singleRoundStory } from './common.mjs';

const spec = loadSpec();
const require = createRequire(import.meta.url);
const inspectorPackage = require.resolve('@modelcontextprotocol/inspector/package.json');
const launcher = join(dirname(inspectorPackage), 'clients/launcher/build/index.js');
const era = spec.lifecycle === '2026-07-28' ? 'modern' : 'legacy';
const RUN_LIMIT_MS = 30_000;
const scratch = mkdtempSync(join(tmpdir(), 'tl-inspector-'));

function target() {
    if (spec.transport === 'stdio') {
        const config = join(scratch, 'mcp.json');
        const { command, args, env } = spec.server;
        writeFileSync(config, JSON.stringify({ mcpServers: { toolledger: { command, args, env } } }));
        return ['--config', config, '--server', 'toolledger'];
    }
    return [spec.url, '--transport', 'http', '--header', `Authorization: Bearer ${spec.token}`];
}
const where = target();

/** One Inspector run; its JSON result on stdout, or what it said when it failed. */
function inspector(args) {
    const p = spawnSync(
        process.execPath,
        [launcher, '--cli', ...where, '--protocol-era', era, '--format', 'json', '--quiet', ...args],
        {
            encoding: 'utf8',
            // A run waiting for an answer it can never give must not hang the story.
            timeout: RUN_LIMIT_MS,
            killSignal: 'SIGKILL',
            // Its own state (catalog, client config) stays out of the user's home directory.
            env: { ...process.env, HOME: scratch }
        }
    );
    // `--format json` prints {"result": …} on stdout, also for an error result (exit 5).
    let printed;
    try {
        printed = JSON.parse(p.stdout);
    } catch {
        printed = null;
    }
    if (printed && typeof printed === 'object' && 'result' in printed) return printed.result;
    const how = p.error?.code === 'ETIMEDOUT' ? `was stopped after ${RUN_LIMIT_MS} ms` : `exited ${p.status}`;
    const e = new Error(
        `inspector ${how} without a result; stdout ${JSON.stringify(p.stdout.slice(0, 300))}, ` +
            `stderr ${JSON.stringify(p.stderr.slice(0, 600))}`
    );
    e.name = 'InspectorFailed';
    throw e;
}

function call(name, args) {
    return inspector(['--method', 'tools/call', '--tool-name', name, '--tool-args-json', JSON.stringify(args)]);
}

const out = {};
await kase(out, 'tools_list', async () => {
    const listed = inspector(['--method', 'tools/list']);
    const tools = {};
    for (const t of listed.tools) {
        tools[t.name] = { input: t.inputSchema?.type ?? null, output: t.outputSchema?.type ?? null };
    }
    return tools;
});
await kase(out, 'create_issue_without_elicitation', async () =>
    seen(call('create_issue', { operation_id: 'iss-nocap', title: 'spec' }))
);
await singleRoundStory(async (name, args) => call(name, args), spec, out);
rmSync(scratch, { recursive: true, force: true });
emit(out);
