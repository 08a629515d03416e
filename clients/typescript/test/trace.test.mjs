// The client's span per callToolOnce joins one trace with the server's: under it, a client span
// per MCP request whose context travels in `_meta`, so `toolledger serve`'s span for the call
// (exported over OTLP to a receiver that decodes it with the official protobufs) has the
// client's trace id and the request span as its parent. No operation id, intent or argument
// value is recorded on either side.
import assert from 'node:assert/strict';
import { execFileSync, spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { test } from 'node:test';
import { fileURLToPath } from 'node:url';
import { context, propagation, trace } from '@opentelemetry/api';
import { AsyncLocalStorageContextManager } from '@opentelemetry/context-async-hooks';
import { W3CTraceContextPropagator } from '@opentelemetry/core';
import { BasicTracerProvider, InMemorySpanExporter, SimpleSpanProcessor } from '@opentelemetry/sdk-trace-base';
import { Ledger } from '@toolledger/client';
import { BIN, PYTHON, connectStdio, tempDir } from './helpers.mjs';

const RECEIVER =
    process.env.TOOLLEDGER_OTLP_RECEIVER ||
    fileURLToPath(new URL('../../../crates/toolledger-cli/tests/py/otlp_receiver.py', import.meta.url));

const exporter = new InMemorySpanExporter();
trace.setGlobalTracerProvider(new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] }));
context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
propagation.setGlobalPropagator(new W3CTraceContextPropagator());

async function receiver(out) {
    const proc = spawn(PYTHON, [RECEIVER, out], { stdio: ['ignore', 'pipe', 'inherit'] });
    const lines = createInterface({ input: proc.stdout });
    for await (const line of lines) {
        if (line.startsWith('listening ')) return { proc, port: Number(line.split(' ')[1]) };
    }
    throw new Error('the OTLP receiver did not start');
}

async function serverSpans(out, name) {
    const until = Date.now() + 20_000;
    while (Date.now() < until) {
        if (existsSync(out)) {
            const spans = readFileSync(out, 'utf8').split('\n').filter(Boolean).map(l => JSON.parse(l));
            const found = spans.filter(s => s.name === name);
            if (found.length) return found;
        }
        await new Promise(r => setTimeout(r, 50));
    }
    throw new Error(`the server exported no span ${name}`);
}

const parentOf = s => s.parentSpanContext?.spanId ?? s.parentSpanId;

test('traces: the call and the server span share one trace; no key or value is recorded', async () => {
    const dir = tempDir();
    const db = join(dir, 'ledger.sqlite');
    execFileSync(BIN, ['principal', 'add', 'alice', '--tenant', 'team-a', '--scope', 'automation:write', '--db', db]);
    const out = join(dir, 'spans.jsonl');
    const { proc, port } = await receiver(out);
    try {
        const client = await connectStdio({
            command: BIN,
            args: ['serve', '--db', db, '--principal', 'alice'],
            env: {
                OTEL_EXPORTER_OTLP_ENDPOINT: `http://127.0.0.1:${port}`,
                OTEL_BSP_SCHEDULE_DELAY: '50',
                OTEL_SERVICE_NAME: 'toolledger-client-ts-test',
            },
        });
        const session = new Ledger(join(dir, 'journal.jsonl')).session(client, { keyArguments: { create_automation: 'request_id' } });
        const outcome = await session.callToolOnce('create_automation', { interval_minutes: 45 }, { intent: 'secret-intent-7' });
        assert.equal(outcome.state, 'succeeded', JSON.stringify(outcome));
        await client.close();

        const spans = exporter.getFinishedSpans();
        const ours = spans.filter(s => s.name === 'call_tool_once create_automation');
        assert.equal(ours.length, 1, spans.map(s => s.name).join(', '));
        const span = ours[0];
        assert.equal(span.attributes['gen_ai.tool.name'], 'create_automation');
        assert.equal(span.attributes['gen_ai.operation.name'], 'execute_tool');
        assert.equal(span.attributes['toolledger.outcome'], 'succeeded');
        assert.equal(span.attributes['toolledger.replayed'], false);
        const sends = spans.filter(s => s.name === 'tools/call create_automation' && parentOf(s) === span.spanContext().spanId);
        assert.equal(sends.length, 1, spans.map(s => `${s.name} <- ${parentOf(s)}`).join(', '));
        assert.equal(sends[0].attributes['mcp.method.name'], 'tools/call');
        const traceId = span.spanContext().traceId;
        const served = await serverSpans(out, 'tools/call create_automation');
        assert.ok(
            served.some(s => s.trace_id === traceId && s.parent_span_id === sends[0].spanContext().spanId),
            JSON.stringify({ served, traceId }),
        );
        const recorded = JSON.stringify(spans.map(s => s.attributes));
        const exported = readFileSync(`${out}.raw`, 'utf8');
        for (const secret of [outcome.operationId, 'secret-intent-7']) {
            assert.ok(!recorded.includes(secret), `the client recorded ${secret}`);
            assert.ok(!exported.includes(secret), `the server exported ${secret}`);
        }
    } finally {
        proc.kill();
    }
});
