// The client against the reference server, `toolledger serve`, on stdio.
import assert from 'node:assert/strict';
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { test } from 'node:test';
import { Ledger } from '@toolledger/client';
import { BIN, connectStdio, tempDir } from './helpers.mjs';

function serveDb() {
    const dir = tempDir();
    const db = join(dir, 'ledger.sqlite');
    execFileSync(BIN, ['principal', 'add', 'alice', '--tenant', 'team-a', '--role', 'editor', '--scope', 'automation:write', '--db', db]);
    return { dir, db };
}

const serve = (db, ...extra) => ({ command: BIN, args: ['serve', '--db', db, '--principal', 'alice', ...extra] });

test('serve: the key goes in the argument the tool names (request_id); a second call replays', async () => {
    const { dir, db } = serveDb();
    const ledger = new Ledger(join(dir, 'journal.jsonl'));
    const session = ledger.session(await connectStdio(serve(db)), { keyArguments: { create_automation: 'request_id' } });
    const a = await session.callToolOnce('create_automation', { interval_minutes: 15 }, { intent: 'nightly sync' });
    assert.equal(a.state, 'succeeded', JSON.stringify(a));
    assert.equal(a.replayed, false);
    assert.equal(a.result.structuredContent.interval_minutes, 15);
    const b = await session.callToolOnce('create_automation', { interval_minutes: 15 }, { intent: 'nightly sync' });
    assert.equal(b.state, 'succeeded');
    assert.equal(b.replayed, true);
    assert.equal(b.result.structuredContent.id, a.result.structuredContent.id);
    assert.equal(ledger.entry(a.operationId).keyArgument, 'request_id');

    // A refusal of the reference server: set_interval on a version that is not current.
    const c = await session.callToolOnce(
        'set_interval',
        { automation_id: a.result.structuredContent.id, expected_version: 99, interval_minutes: 30 },
        { intent: 'slow it down', keyArgument: 'request_id' },
    );
    assert.notEqual(c.state, 'succeeded', JSON.stringify(c));
    assert.deepEqual([c.state, c.errorCode], ['refused', 'version_conflict'], JSON.stringify(c));
    await session.client.close();
    ledger.close();
});

test('serve: the server dies after its commit and before its reply; the reconnected session retries the same id and gets the stored result', async () => {
    const { dir, db } = serveDb();
    const ledger = new Ledger(join(dir, 'journal.jsonl'));
    let connects = 0;
    const reconnect = async () => {
        connects++;
        return connectStdio(serve(db));
    };
    const session = ledger.session(await connectStdio(serve(db, '--fault', 'drop-after-commit')), {
        reconnect,
        keyArguments: { create_automation: 'request_id' },
        backoff: { initialMs: 50, maxMs: 500 },
    });
    const out = await session.callToolOnce('create_automation', { interval_minutes: 60 }, { intent: 'hourly report' });
    assert.equal(out.state, 'succeeded', JSON.stringify(out));
    assert.equal(out.replayed, true, 'the answer is the one stored before the crash');
    assert.equal(connects, 1);
    // One automation: the first one the ledger stored.
    const again = await session.callToolOnce('create_automation', { interval_minutes: 60 }, { intent: 'hourly report' });
    assert.equal(again.result.structuredContent.id, out.result.structuredContent.id);
    const status = await session.client.callTool({ name: 'get_operation_status', arguments: { operation_id: out.operationId } });
    assert.equal(status.structuredContent.state, 'applied');
    await session.client.close();
    ledger.close();
});
