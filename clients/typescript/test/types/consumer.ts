// Compiled with `tsc --noEmit` by types.test.mjs: the shipped declarations fit real use.
import { Client } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';
import { Ledger, type Outcome } from '@toolledger/client';
import { ledgerTools } from '@toolledger/client/ai';
import { generateText } from 'ai';

export async function main(): Promise<string> {
    const connect = async () => {
        const client = new Client({ name: 'agent', version: '1.0.0' });
        await client.connect(new StdioClientTransport({ command: 'toolledger', args: ['proxy', '--', 'server'] }));
        return client;
    };
    const ledger = new Ledger('journal.jsonl');
    const session = ledger.session(await connect(), { reconnect: connect, backoff: { maxMs: 2000 } });
    const out: Outcome = await session.callToolOnce('charge', { customer: 'a', amount_cents: 5 }, { intent: 'order 1', deadline: 30_000 });
    for (const entry of ledger.pending()) await session.resume(entry);
    const tools = await ledgerTools(session, { runId: 'run-1' });
    void generateText;
    void tools;
    const state: 'succeeded' | 'failed' | 'unknown' | 'conflict' | 'refused' = out.state;
    return `${state} ${out.operationId} ${out.statusRef ?? ''}`;
}
