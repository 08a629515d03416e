// The client against `toolledger proxy` in front of charge_server.py, on stdio and over HTTP.
import assert from 'node:assert/strict';
import { join } from 'node:path';
import { after, before, describe, test } from 'node:test';
import { Ledger } from '@toolledger/client';
import {
    addPrincipal,
    connectHttp,
    connectStdio,
    countCharges,
    freePort,
    proxyStdioServer,
    sleep,
    startHttpProxy,
    tempDir,
} from './helpers.mjs';

const LEDGER_META = 'io.toolledger/ledger';

describe('proxy on stdio', () => {
    const dir = tempDir();
    const chargeDb = join(dir, 'charges.sqlite');
    const server = proxyStdioServer({ db: join(dir, 'ledger.sqlite'), chargeDb });
    let ledger, session;
    before(async () => {
        ledger = new Ledger(join(dir, 'journal.jsonl'));
        session = ledger.session(await connectStdio(server), { reconnect: () => connectStdio(server) });
    });
    after(async () => {
        await session.client.close();
        ledger.close();
    });

    test('a call is journaled before it is sent, succeeds once, and the same intent replays it', async () => {
        const first = await session.callToolOnce('charge', { customer: 'alice', amount_cents: 500 }, { intent: 'charge alice for order 1' });
        assert.equal(first.state, 'succeeded', JSON.stringify(first));
        assert.equal(first.replayed, false);
        assert.equal(first.operationId, ledger.operationIdFor('charge alice for order 1'));
        assert.match(first.statusRef, /^op_/);
        assert.equal(first.result.structuredContent.customer, 'alice');
        assert.equal(first.result._meta[LEDGER_META].operationId, first.operationId);
        const entry = ledger.entry(first.operationId);
        assert.equal(entry.settled, true);
        assert.equal(entry.keyArgument, 'operation_id');
        assert.deepEqual(entry.arguments, { customer: 'alice', amount_cents: 500 });

        const again = await session.callToolOnce('charge', { amount_cents: 500, customer: 'alice' }, { intent: 'charge alice for order 1' });
        assert.equal(again.state, 'succeeded');
        assert.equal(again.replayed, true);
        assert.deepEqual(again.result.structuredContent, first.result.structuredContent);
        assert.equal(countCharges(chargeDb), 1);
        assert.deepEqual(ledger.pending(), []);
    });

    test('the same intent with other arguments is a conflict, and nothing is sent', async () => {
        const before = countCharges(chargeDb);
        const out = await session.callToolOnce('charge', { customer: 'alice', amount_cents: 501 }, { intent: 'charge alice for order 1' });
        assert.equal(out.state, 'conflict');
        assert.equal(out.errorCode, 'operation_conflict');
        assert.equal(countCharges(chargeDb), before);
    });

    test('an id the server already holds for other arguments is the server\'s conflict', async () => {
        // Two journals (two agents) that share nothing but the server's principal.
        const other = new Ledger(join(dir, 'journal-2.jsonl'));
        const s2 = other.session(session.client);
        const id = ledger.operationIdFor('charge alice for order 1');
        other.recordIntent({ operationId: id, tool: 'charge', arguments: { customer: 'mallory', amount_cents: 1 }, keyArgument: 'operation_id' });
        const out = await s2.resume(id);
        assert.equal(out.state, 'conflict');
        assert.equal(out.errorCode, 'operation_conflict');
        assert.equal(other.entry(id).settled, true);
        other.close();
    });

    test('calls without an intent get fresh UUIDv7 ids: two calls, two charges', async () => {
        const before = countCharges(chargeDb);
        const a = await session.callToolOnce('charge', { customer: 'bob', amount_cents: 7 });
        const b = await session.callToolOnce('charge', { customer: 'bob', amount_cents: 7 });
        assert.equal(a.state, 'succeeded');
        assert.equal(b.state, 'succeeded');
        assert.match(a.operationId, /^[0-9a-f]{8}-[0-9a-f]{4}-7/);
        assert.notEqual(a.operationId, b.operationId);
        assert.equal(countCharges(chargeDb), before + 2);
    });

    test("the tool's own error is the operation's answer: failed, and replayed as failed", async () => {
        const a = await session.callToolOnce('charge', { customer: 'carol', amount_cents: -5 }, { intent: 'negative' });
        assert.equal(a.state, 'failed');
        assert.equal(a.result.isError, true);
        assert.match(a.result.content[0].text, /must be positive/);
        const b = await session.callToolOnce('charge', { customer: 'carol', amount_cents: -5 }, { intent: 'negative' });
        assert.equal(b.state, 'failed');
        assert.equal(b.replayed, true);
    });

    test('a refusal (invalid arguments) is refused, settled, and nothing charged', async () => {
        const before = countCharges(chargeDb);
        const out = await session.callToolOnce('charge', { customer: 'dave', amount_cents: 'lots' }, { intent: 'bad args' });
        assert.equal(out.state, 'refused');
        assert.equal(out.errorCode, 'invalid_arguments');
        assert.equal(ledger.entry(out.operationId).settled, true);
        assert.equal(countCharges(chargeDb), before);
    });

    test('an upstream JSON-RPC error leaves the outcome unknown: polled until the deadline, kept pending', async () => {
        const started = Date.now();
        const out = await session.callToolOnce('charge', { customer: 'erin', amount_cents: 13 }, { intent: 'thirteen', deadline: 1500 });
        assert.equal(out.state, 'unknown', JSON.stringify(out));
        assert.match(out.statusRef, /^op_/);
        assert.ok(Date.now() - started >= 1000, 'it polled until the deadline');
        const pending = ledger.pending();
        assert.deepEqual(pending.map(e => e.intent), ['thirteen']);
        assert.equal(pending[0].statusRef, out.statusRef);
        assert.equal(pending[0].lastErrorCode, 'outcome_unknown');
    });
});

describe('proxy over HTTP', () => {
    const dir = tempDir();
    const db = join(dir, 'ledger.sqlite');
    const chargeDb = join(dir, 'charges.sqlite');
    let token, proxy, port;
    before(async () => {
        token = addPrincipal(db);
        port = await freePort();
        proxy = await startHttpProxy({ db, chargeDb, port });
    });
    after(async () => {
        await proxy?.stop();
    });

    test('a call succeeds once and the same intent replays it', async () => {
        const ledger = new Ledger(join(dir, 'journal.jsonl'));
        const session = ledger.session(await connectHttp(proxy.url, token));
        const a = await session.callToolOnce('charge', { customer: 'frank', amount_cents: 42 }, { intent: 'frank 42' });
        const b = await session.callToolOnce('charge', { customer: 'frank', amount_cents: 42 }, { intent: 'frank 42' });
        assert.equal(a.state, 'succeeded');
        assert.equal(b.state, 'succeeded');
        assert.equal(b.replayed, true);
        assert.equal(countCharges(chargeDb), 1);
        await session.client.close();
        ledger.close();
    });

    test('a call sent while the proxy is down is retried under the same id until it is back', async () => {
        const ledger = new Ledger(join(dir, 'journal-down.jsonl'));
        let connects = 0;
        const reconnect = async () => {
            connects++;
            return connectHttp(proxy.url, token);
        };
        const session = ledger.session(await connectHttp(proxy.url, token), { reconnect, backoff: { initialMs: 100, maxMs: 500 } });
        const before = countCharges(chargeDb);
        await proxy.stop();
        const call = session.callToolOnce('charge', { customer: 'grace', amount_cents: 9 }, { intent: 'grace 9', deadline: 30_000 });
        await sleep(1500);
        assert.equal(ledger.pending().length, 1, 'journaled while the server was down');
        proxy = await startHttpProxy({ db, chargeDb, port });
        const out = await call;
        assert.equal(out.state, 'succeeded', JSON.stringify(out));
        assert.equal(out.replayed, false);
        assert.ok(connects >= 1);
        assert.equal(countCharges(chargeDb), before + 1);
        assert.deepEqual(ledger.pending(), []);
        await session.client.close();
        ledger.close();
    });
});
