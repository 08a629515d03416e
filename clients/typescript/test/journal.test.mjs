import assert from 'node:assert/strict';
import { appendFileSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { test } from 'node:test';
import { Ledger, canonicalJson, uuidv5, uuidv7 } from '@toolledger/client';
import { tempDir } from './helpers.mjs';

test('UUIDv5 matches the RFC test vector; UUIDv7 carries the time and version', () => {
    assert.equal(uuidv5('www.example.com', '6ba7b810-9dad-11d1-80b4-00c04fd430c8'), '2ed6657d-e927-568b-95e1-2665a8aea6a2');
    const id = uuidv7(0x0189_0000_0000);
    assert.match(id, /^01890000-0000-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/);
    assert.notEqual(uuidv7(), uuidv7());
});

test('canonical JSON sorts keys at every level', () => {
    assert.equal(canonicalJson({ b: 1, a: { d: [1, { z: 1, y: 2 }], c: null } }), '{"a":{"c":null,"d":[1,{"y":2,"z":1}]},"b":1}');
});

test('a journal keeps its namespace, its intents and their outcomes across reopening', () => {
    const path = join(tempDir(), 'sub', 'journal.jsonl');
    const a = new Ledger(path);
    const id = a.operationIdFor('refund order 42');
    assert.equal(id, a.operationIdFor('refund order 42'));
    a.recordIntent({ operationId: id, intent: 'refund order 42', tool: 'refund', arguments: { order: 42 } });
    a.recordIntent({ operationId: 'other', tool: 'refund', arguments: { order: 43 } });
    a.recordSettled('other', { state: 'succeeded', replayed: false, result: null, statusRef: 'op_1', errorCode: null });
    a.close();

    const b = new Ledger(path);
    assert.equal(b.namespace, a.namespace);
    assert.equal(b.operationIdFor('refund order 42'), id);
    assert.deepEqual(b.pending().map(e => [e.operationId, e.intent, e.arguments]), [[id, 'refund order 42', { order: 42 }]]);
    assert.equal(b.entry('other').outcome.statusRef, 'op_1');
    b.close();

    // Another journal gives the same intent another id.
    const c = new Ledger(join(tempDir(), 'journal.jsonl'));
    assert.notEqual(c.operationIdFor('refund order 42'), id);
    c.close();
});

test('a torn last line (a power loss mid-write) is skipped and does not swallow the next record', () => {
    const path = join(tempDir(), 'journal.jsonl');
    new Ledger(path).close();
    appendFileSync(path, '{"type":"intent","operationId":"torn","tool":"x","argu');
    const l = new Ledger(path);
    assert.deepEqual(l.pending(), []);
    l.recordIntent({ operationId: 'next', tool: 'x', arguments: {} });
    assert.deepEqual(l.pending().map(e => e.operationId), ['next']);
    l.close();
    assert.match(readFileSync(path, 'utf8'), /"argu\n\{"type":"intent","operationId":"next"/);
});

test('a file that is not a journal is refused', () => {
    const path = join(tempDir(), 'notes.jsonl');
    writeFileSync(path, '{"hello":"world"}\n');
    assert.throws(() => new Ledger(path), /not a toolledger client journal/);
});
