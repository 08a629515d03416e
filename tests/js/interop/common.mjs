// What the interop scripts driving `toolledger serve` with JavaScript MCP clients share:
// the spec the Rust test passes (one JSON argument), reading a tool result the way a client
// author would (an error's code from the JSON text of content[0]), recording each case
// without letting one failure hide the others, and the part of the story every tool but
// create_issue shares.
//
// The spec is:
//   {"transport": "stdio" | "http", "lifecycle": "2026-07-28" | "legacy",
//    "server": {"command", "args", "env"}           (stdio: how to start the server)
//    "url", "token"                                 (http: the endpoint and a bearer token)
//    "worker": {"command", "args", "env"}           (one `toolledger worker --once` pass)
//    "approvals": {"draft": ID, "refund": ID}}

import { spawnSync } from 'node:child_process';

export const BODY = 'alpha';
export const ISSUE = { operation_id: 'iss-1', title: 'spec' };
export const DRAFT = { slug: 'interop-draft', title: 'Interop', text: 'draft text', kind: 'article' };
export const REFUND = { order_id: 'o-1', amount_cents: 1200 };

export function loadSpec() {
    return JSON.parse(process.argv[2]);
}

/** A tool result as the client saw it: isError, structuredContent and, for an error, the
 *  {code, ...} object read from the JSON text of content[0]. */
export function seen(result) {
    if (result && result.resultType === 'input_required') {
        return {
            resultType: 'input_required',
            inputRequestKeys: Object.keys(result.inputRequests ?? {}).sort(),
            hasRequestState: typeof result.requestState === 'string'
        };
    }
    const out = { isError: result.isError === true, structured: result.structuredContent ?? null };
    if (result.isError) {
        try {
            out.error = JSON.parse(result.content[0].text).error;
        } catch (e) {
            out.error = { unreadable: String(e) };
        }
    }
    return out;
}

export function thrown(e) {
    const out = { exception: `${e?.name ?? 'Error'}: ${String(e?.message ?? e).slice(0, 400)}` };
    if (typeof e?.code === 'number') {
        out.jsonrpcError = { code: e.code, message: e.message, data: e.data ?? null };
    }
    return out;
}

/** Runs one case; an exception is recorded as its outcome instead of ending the story. */
export async function kase(out, name, fn) {
    try {
        out[name] = await fn();
    } catch (e) {
        out[name] = thrown(e);
    }
}

export function runWorker(spec) {
    const w = spec.worker;
    const p = spawnSync(w.command, w.args, { env: w.env, encoding: 'utf8' });
    let report;
    try {
        report = JSON.parse(p.stdout);
    } catch {
        report = { stdout: p.stdout, stderr: p.stderr };
    }
    return { exit: p.status, report };
}

/** Every case after create_issue; `call(name, arguments)` resolves to a CallToolResult. */
export async function singleRoundStory(call, spec, out) {
    const status = async op => seen(await call('get_operation_status', { operation_id: op }));

    await kase(out, 'automations', async () => {
        const created = seen(await call('create_automation', { request_id: 'auto-1', interval_minutes: 30 }));
        const id = created.structured?.id ?? null;
        const args = { request_id: 'si-1', automation_id: id, expected_version: 1, interval_minutes: 60 };
        const updated = seen(await call('set_interval', args));
        const again = seen(await call('set_interval', args));
        const stale = seen(
            await call('set_interval', { request_id: 'si-2', automation_id: id, expected_version: 1, interval_minutes: 90 })
        );
        return { created, updated, again, stale };
    });

    await kase(out, 'drafts', async () => {
        const without_approval = seen(await call('create_draft', { ...DRAFT, operation: 'dr-0' }));
        const args = { ...DRAFT, operation: 'dr-1', approval: spec.approvals.draft };
        const first = seen(await call('create_draft', args));
        const again = seen(await call('create_draft', args));
        return { without_approval, first, again };
    });

    await kase(out, 'refund', async () => {
        const args = { ...REFUND, idempotency_key: 'rf-1', approval: spec.approvals.refund };
        const r = { first: seen(await call('refund_order', args)) };
        r.status_before = await status('rf-1');
        r.worker = runWorker(spec);
        r.status_after = await status('rf-1');
        r.again = seen(await call('refund_order', args));
        return r;
    });

    await kase(out, 'status', async () => {
        const all = {};
        for (const op of ['iss-1', 'auto-1', 'si-1', 'dr-1', 'rf-1']) all[op] = await status(op);
        return all;
    });
}

export function toolListing(listed) {
    const tools = {};
    for (const t of listed.tools) {
        tools[t.name] = { input: t.inputSchema?.type ?? null, output: t.outputSchema?.type ?? null };
    }
    return tools;
}

export function emit(out) {
    process.stdout.write(JSON.stringify(out) + '\n');
}
