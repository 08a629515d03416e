// What the tests share: the toolledger binary, the Python test upstream, processes, ports.
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Client, StreamableHTTPClientTransport } from '@modelcontextprotocol/client';
import { StdioClientTransport } from '@modelcontextprotocol/client/stdio';

export const BIN = process.env.TOOLLEDGER_BIN;
if (!BIN) throw new Error('TOOLLEDGER_BIN must name the toolledger binary the tests run');
export const PYTHON = process.env.TOOLLEDGER_PYTHON || 'python3';
export const CHARGE_SERVER =
    process.env.TOOLLEDGER_CHARGE_SERVER || fileURLToPath(new URL('../../../tests/proxy/charge_server.py', import.meta.url));
export const AGENT = fileURLToPath(new URL('./fixtures/agent.mjs', import.meta.url));
export const AI_AGENT = fileURLToPath(new URL('./fixtures/ai_agent.mjs', import.meta.url));

const made = [];
process.on('exit', () => {
    for (const dir of made) rmSync(dir, { recursive: true, force: true });
});

/** A temporary directory, removed when the test file's process exits. */
export function tempDir(prefix = 'tl-client-') {
    const dir = mkdtempSync(join(tmpdir(), prefix));
    made.push(dir);
    return dir;
}

/** How an agent starts the proxy in front of charge_server.py on its stdio. */
export function proxyStdioServer({ db, chargeDb, delayMs }) {
    const env = { CHARGE_DB: chargeDb };
    if (delayMs) env.CHARGE_DELAY_MS = String(delayMs);
    return { command: BIN, args: ['proxy', '--db', db, '--', PYTHON, CHARGE_SERVER], env };
}

export async function connectStdio(server) {
    const client = new Client({ name: 'toolledger-client-tests', version: '0.1.0' }, { capabilities: {} });
    await client.connect(new StdioClientTransport({ ...server, stderr: 'ignore' }));
    return client;
}

export async function connectHttp(url, token) {
    const client = new Client({ name: 'toolledger-client-tests', version: '0.1.0' }, { capabilities: {} });
    const headers = token ? { Authorization: `Bearer ${token}` } : {};
    await client.connect(new StreamableHTTPClientTransport(new URL(url), { requestInit: { headers } }));
    return client;
}

/** How many times charge_server.py really charged. */
export function countCharges(chargeDb) {
    const out = execFileSync(PYTHON, [
        '-c',
        'import sqlite3,sys\ntry:\n print(sqlite3.connect(sys.argv[1]).execute("select count(*) from charges").fetchone()[0])\nexcept sqlite3.OperationalError:\n print(0)',
        chargeDb,
    ]);
    return Number(String(out).trim());
}

export async function freePort() {
    return new Promise((resolve, reject) => {
        const s = createServer();
        s.once('error', reject);
        s.listen(0, '127.0.0.1', () => {
            const { port } = s.address();
            s.close(() => resolve(port));
        });
    });
}

export function sleep(ms) {
    return new Promise(r => setTimeout(r, ms));
}

export async function waitFor(what, check, timeoutMs = 20_000, everyMs = 50) {
    const end = Date.now() + timeoutMs;
    for (;;) {
        const v = await check();
        if (v) return v;
        if (Date.now() > end) throw new Error(`timed out waiting for ${what}`);
        await sleep(everyMs);
    }
}

/** A principal with a bearer token on `db` (the HTTP proxy's callers present it). */
export function addPrincipal(db, name = 'agent', tenant = 'acme') {
    const out = String(execFileSync(BIN, ['principal', 'add', name, '--tenant', tenant, '--token', '--db', db]));
    const m = out.match(/"token"\s*:\s*"([^"]+)"/) ?? out.match(/(\S{20,})\s*$/);
    if (!m) throw new Error(`no token in: ${out}`);
    return m[1];
}

/** `toolledger proxy --http` in front of charge_server.py; resolves once /healthz answers. */
export async function startHttpProxy({ db, chargeDb, port, delayMs }) {
    port ??= await freePort();
    const env = { ...process.env, CHARGE_DB: chargeDb };
    if (delayMs) env.CHARGE_DELAY_MS = String(delayMs);
    const child = spawn(BIN, ['proxy', '--db', db, '--http', `127.0.0.1:${port}`, '--', PYTHON, CHARGE_SERVER], {
        env,
        stdio: ['ignore', 'ignore', 'pipe'],
    });
    let log = '';
    child.stderr.on('data', d => (log = (log + d).slice(-20_000)));
    const exited = new Promise(r => child.once('exit', (code, sig) => r({ code, sig })));
    await waitFor(`the proxy on port ${port}`, async () => {
        if (child.exitCode !== null) throw new Error(`the proxy exited ${child.exitCode}: ${log}`);
        try {
            return (await fetch(`http://127.0.0.1:${port}/healthz`)).ok;
        } catch {
            return false;
        }
    });
    return {
        child,
        port,
        url: `http://127.0.0.1:${port}/mcp`,
        log: () => log,
        async stop() {
            if (child.exitCode === null && child.signalCode === null) child.kill('SIGTERM');
            await exited;
        },
    };
}

/** Runs a fixture script with node; resolves with its exit and its JSON lines. */
export function runNode(script, spec, { onLine } = {}) {
    const child = spawn(process.execPath, [script, JSON.stringify(spec)], { stdio: ['ignore', 'pipe', 'pipe'] });
    const lines = [];
    let buf = '';
    let err = '';
    child.stdout.on('data', d => {
        buf += d;
        let i;
        while ((i = buf.indexOf('\n')) >= 0) {
            const line = buf.slice(0, i);
            buf = buf.slice(i + 1);
            if (!line.trim()) continue;
            const obj = JSON.parse(line);
            lines.push(obj);
            onLine?.(obj);
        }
    });
    child.stderr.on('data', d => (err = (err + d).slice(-20_000)));
    const done = new Promise(resolve => child.once('exit', (code, signal) => resolve({ code, signal, lines, stderr: err })));
    return { child, lines, done };
}
