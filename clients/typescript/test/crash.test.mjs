// An agent process SIGKILLed while its call is in flight; a new process takes the call up from
// the journal. The upstream charged exactly once, and the new process gets the stored answer.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { test } from 'node:test';
import { Ledger } from '@toolledger/client';
import { AGENT, addPrincipal, countCharges, proxyStdioServer, runNode, startHttpProxy, tempDir, waitFor } from './helpers.mjs';

/** Starts the agent, kills it once the charge row is committed (its reply is still delayed). */
async function killMidCall(spec, chargeDb) {
    const agent = runNode(AGENT, spec);
    await waitFor('the charge row', () => countCharges(chargeDb) === 1 || agent.child.exitCode !== null, 30_000);
    assert.equal(agent.child.exitCode, null, 'the agent was still waiting for its reply');
    agent.child.kill('SIGKILL');
    const end = await agent.done;
    assert.equal(end.signal, 'SIGKILL');
    assert.equal(end.lines.filter(l => l.outcome).length, 0, 'the killed agent never saw an answer');
    return end;
}

for (const transport of ['stdio', 'http']) {
    test(`${transport}: killed mid-call, a new process resumes the pending entry and gets the stored answer; one charge`, async t => {
        const dir = tempDir();
        const db = join(dir, 'ledger.sqlite');
        const chargeDb = join(dir, 'charges.sqlite');
        const journal = join(dir, 'journal.jsonl');
        let target;
        if (transport === 'stdio') {
            target = { transport, server: proxyStdioServer({ db, chargeDb, delayMs: 1500 }) };
        } else {
            const token = addPrincipal(db);
            const proxy = await startHttpProxy({ db, chargeDb, delayMs: 1500 });
            t.after(() => proxy.stop());
            target = { transport, url: proxy.url, token };
        }
        const call = { ...target, journal, mode: 'call', tool: 'charge', arguments: { customer: 'ivy', amount_cents: 1234 }, intent: 'invoice 77' };
        await killMidCall(call, chargeDb);

        const ledger = new Ledger(journal);
        const pending = ledger.pending();
        assert.equal(pending.length, 1);
        assert.equal(pending[0].intent, 'invoice 77');
        assert.equal(pending[0].operationId, ledger.operationIdFor('invoice 77'));
        ledger.close();

        const resumed = await runNode(AGENT, { ...target, journal, mode: 'resume' }).done;
        assert.equal(resumed.code, 0, resumed.stderr);
        const outcome = resumed.lines.find(l => l.outcome).outcome;
        assert.equal(outcome.state, 'succeeded', JSON.stringify(outcome));
        assert.equal(outcome.replayed, true);
        assert.equal(outcome.operationId, pending[0].operationId);
        assert.deepEqual(outcome.result.structuredContent, { charge_id: 1, customer: 'ivy', amount_cents: 1234 });
        assert.equal(countCharges(chargeDb), 1);
        assert.deepEqual(new Ledger(journal).pending(), []);

        // The agent restarted from scratch asks again with the same intent: the same id, replayed.
        const again = await runNode(AGENT, call).done;
        const o2 = again.lines.find(l => l.outcome).outcome;
        assert.equal(o2.state, 'succeeded');
        assert.equal(o2.replayed, true);
        assert.equal(o2.operationId, outcome.operationId);
        assert.equal(countCharges(chargeDb), 1);
    });
}

test('stdio: killed mid-call, the restarted agent calls again with the same intent while the old forward still runs; one charge', async () => {
    const dir = tempDir();
    const chargeDb = join(dir, 'charges.sqlite');
    const journal = join(dir, 'journal.jsonl');
    // A reply delayed 4 s: the restarted agent's proxy finds the first forward still running.
    const server = proxyStdioServer({ db: join(dir, 'ledger.sqlite'), chargeDb, delayMs: 4000 });
    const call = { transport: 'stdio', server, journal, mode: 'call', tool: 'charge', arguments: { customer: 'jack', amount_cents: 99 }, intent: 'order 9' };
    await killMidCall(call, chargeDb);
    const again = await runNode(AGENT, call).done;
    assert.equal(again.code, 0, again.stderr);
    const outcome = again.lines.find(l => l.outcome).outcome;
    assert.equal(outcome.state, 'succeeded', JSON.stringify(outcome));
    assert.equal(outcome.replayed, true);
    assert.equal(outcome.result.structuredContent.charge_id, 1);
    assert.equal(countCharges(chargeDb), 1);
    // It was told the operation was in progress, and waited for it under the same id.
    const entry = new Ledger(journal).entry(outcome.operationId);
    assert.equal(entry.lastErrorCode, 'operation_in_progress');
    assert.equal(entry.settled, true);
});
