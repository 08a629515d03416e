// The Vercel AI SDK adapter, driven by the SDK's own mock language model (no network).
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';
import { Ledger } from '@toolledger/client';
import { ledgerTools } from '@toolledger/client/ai';
import { AI_AGENT, connectStdio, countCharges, proxyStdioServer, runNode, tempDir, waitFor } from './helpers.mjs';

test('ledgerTools: guarded tools lose their operation_id (the client fills it in); read-only ones pass through', async () => {
    const dir = tempDir();
    const chargeDb = join(dir, 'charges.sqlite');
    const ledger = new Ledger(join(dir, 'journal.jsonl'));
    const session = ledger.session(await connectStdio(proxyStdioServer({ db: join(dir, 'ledger.sqlite'), chargeDb })));
    try {
        const tools = await ledgerTools(session, { runId: 'run-1' });
        assert.ok(tools.charge && tools.count_charges);
        assert.equal(tools.get_operation_status, undefined);
        const schema = await tools.charge.inputSchema.jsonSchema;
        assert.equal(schema.properties.operation_id, undefined);
        assert.deepEqual(schema.required, ['customer', 'amount_cents']);

        const opts = { toolCallId: 'c1', messages: [] };
        const out = await tools.charge.execute({ customer: 'kim', amount_cents: 3 }, opts);
        assert.equal(out.state, 'succeeded');
        assert.equal(out.result.customer, 'kim');
        // Another tool call id, same run, same arguments: the same intent, replayed.
        const again = await tools.charge.execute({ customer: 'kim', amount_cents: 3 }, { ...opts, toolCallId: 'c2' });
        assert.equal(again.replayed, true);
        const count = await tools.count_charges.execute({}, opts);
        assert.deepEqual(count.result, { count: 1 });
        assert.equal(countCharges(chargeDb), 1);
        assert.equal(ledger.entries().length, 1, 'read-only calls are not journaled');
    } finally {
        await session.client.close();
        ledger.close();
    }
});

test('generateText with the mock model: killed mid-tool-call, the run restarted under its runId charges once', async () => {
    const dir = tempDir();
    const chargeDb = join(dir, 'charges.sqlite');
    const spec = {
        journal: join(dir, 'journal.jsonl'),
        runId: 'support-ticket-4711',
        server: proxyStdioServer({ db: join(dir, 'ledger.sqlite'), chargeDb, delayMs: 1500 }),
        customer: 'lee',
        amount_cents: 2500,
    };
    const first = runNode(AI_AGENT, spec);
    await waitFor('the charge row', () => countCharges(chargeDb) === 1 || first.child.exitCode !== null, 30_000);
    assert.equal(first.child.exitCode, null, 'the run was still inside the tool call');
    first.child.kill('SIGKILL');
    const killed = await first.done;
    assert.equal(killed.lines.filter(l => l.tool_result).length, 0);

    const second = await runNode(AI_AGENT, spec).done;
    assert.equal(second.code, 0, second.stderr);
    const results = second.lines.filter(l => l.tool_result);
    assert.equal(results.length, 1);
    assert.equal(results[0].tool_result.state, 'succeeded', JSON.stringify(results[0]));
    assert.equal(results[0].tool_result.replayed, true);
    assert.deepEqual(results[0].tool_result.result, { charge_id: 1, customer: 'lee', amount_cents: 2500 });
    assert.equal(second.lines.at(-1).text, 'Charged.');
    assert.equal(countCharges(chargeDb), 1);
});
