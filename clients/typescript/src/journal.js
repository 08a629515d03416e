// The journal: one append-only JSON-lines file on disk.
//
// Line 1 is the journal's header, written once when the file is created, holding the namespace
// under which intents become operation ids. Every later line is one record:
//   {"type":"intent", operationId, intent, tool, arguments, keyArgument, at}   before the first send
//   {"type":"observed", operationId, statusRef, errorCode, at}                  an unsettled answer
//   {"type":"settled", operationId, outcome: {...}, at}                         the final answer
// Each record is one write(2) on a descriptor opened with O_APPEND, then fsync(2), before the
// call that depends on it goes on: the intent is on disk before the request is sent.
//
// A process killed at any moment leaves either the whole record or none of it (a write(2) to a
// regular file completes or does not happen; only a power loss can tear a line, and a torn or
// unreadable line is skipped on reading). Several processes may append to one journal: each
// record is a single append, and since an intent's operation id is derived from the journal's
// namespace, two processes that journal the same intent send the same id, and the server keeps
// it one operation.
import {
    closeSync,
    fstatSync,
    fsyncSync,
    linkSync,
    mkdirSync,
    openSync,
    readFileSync,
    readSync,
    unlinkSync,
    writeSync,
} from 'node:fs';
import { constants } from 'node:fs';
import { dirname, resolve, basename, join } from 'node:path';
import { canonicalJson, uuidv4, uuidv5 } from './ids.js';
import { LedgerSession } from './session.js';

const FORMAT = 'toolledger-client-journal';
const VERSION = 1;

function fsyncDir(dir) {
    let fd;
    try {
        fd = openSync(dir, constants.O_RDONLY | (constants.O_DIRECTORY ?? 0));
        fsyncSync(fd);
    } catch {
        // Some platforms cannot open or fsync a directory; the file's own fsync still holds.
    } finally {
        if (fd !== undefined) closeSync(fd);
    }
}

function writeAll(fd, text) {
    const buf = Buffer.from(text, 'utf8');
    let off = 0;
    while (off < buf.length) off += writeSync(fd, buf, off, buf.length - off);
}

/** Creates the journal file with its header, atomically: a concurrent creator's header wins. */
function createIfMissing(path) {
    mkdirSync(dirname(path), { recursive: true });
    const tmp = join(dirname(path), `.${basename(path)}.${process.pid}.${uuidv4()}.tmp`);
    const header = { type: 'journal', format: FORMAT, version: VERSION, namespace: uuidv4(), createdAt: new Date().toISOString() };
    const fd = openSync(tmp, 'wx', 0o600);
    try {
        writeAll(fd, JSON.stringify(header) + '\n');
        fsyncSync(fd);
    } finally {
        closeSync(fd);
    }
    try {
        linkSync(tmp, path); // fails with EEXIST when the journal is already there
        fsyncDir(dirname(path));
    } catch (e) {
        if (e.code !== 'EEXIST') throw e;
    } finally {
        unlinkSync(tmp);
    }
}

function parse(text, path) {
    let header = null;
    const records = [];
    for (const line of text.split('\n')) {
        if (!line.trim()) continue;
        let rec;
        try {
            rec = JSON.parse(line);
        } catch {
            continue; // a line torn by a power loss
        }
        if (header === null) {
            if (rec?.type !== 'journal' || rec.format !== FORMAT || typeof rec.namespace !== 'string') {
                throw new Error(`${path} is not a toolledger client journal`);
            }
            if (rec.version > VERSION) throw new Error(`${path} is a journal of a newer version (${rec.version})`);
            header = rec;
            continue;
        }
        if (rec && typeof rec.operationId === 'string') records.push(rec);
    }
    if (header === null) throw new Error(`${path} has no journal header`);
    return { header, records };
}

function fold(records) {
    const entries = new Map();
    for (const r of records) {
        if (r.type === 'intent') {
            if (!entries.has(r.operationId)) {
                entries.set(r.operationId, {
                    operationId: r.operationId,
                    intent: r.intent ?? null,
                    tool: r.tool,
                    arguments: r.arguments ?? {},
                    keyArgument: r.keyArgument ?? null,
                    createdAt: r.at,
                    settled: false,
                    statusRef: null,
                    lastErrorCode: null,
                    outcome: null,
                });
            }
            continue;
        }
        const e = entries.get(r.operationId);
        if (!e) continue;
        if (r.type === 'observed') {
            if (r.statusRef) e.statusRef = r.statusRef;
            e.lastErrorCode = r.errorCode ?? null;
        } else if (r.type === 'settled') {
            e.settled = true;
            e.outcome = r.outcome;
            e.settledAt = r.at;
            if (r.outcome?.statusRef) e.statusRef = r.outcome.statusRef;
        }
    }
    return entries;
}

export class Ledger {
    /** Opens the journal at `path`, creating it (and its directory) on first use. */
    constructor(path) {
        this.path = resolve(String(path));
        let text;
        try {
            text = readFileSync(this.path, 'utf8');
        } catch (e) {
            if (e.code !== 'ENOENT') throw e;
            createIfMissing(this.path);
            text = readFileSync(this.path, 'utf8');
        }
        const { header } = parse(text, this.path);
        this.namespace = header.namespace;
        this.createdAt = header.createdAt;
        // A line torn by a power loss must not swallow the next record: start on a new line.
        this._needsNewline = !endsWithNewline(this.path);
        this._fd = openSync(this.path, 'a', 0o600);
    }

    /** The operation id an intent gets in this journal: the same in every process, forever. */
    operationIdFor(intent) {
        if (typeof intent !== 'string' || intent.length === 0) throw new TypeError('intent must be a non-empty string');
        return uuidv5(intent, this.namespace);
    }

    /** Every entry, as the file holds them now (read afresh: other processes may append). */
    entries() {
        const { records } = parse(readFileSync(this.path, 'utf8'), this.path);
        return [...fold(records).values()].map(e => structuredClone(e));
    }

    /** The entry of one operation id, or null. */
    entry(operationId) {
        return this.entries().find(e => e.operationId === operationId) ?? null;
    }

    /** Entries whose call was journaled but whose answer was never settled, oldest first. */
    pending() {
        return this.entries().filter(e => !e.settled);
    }

    /** Creates a session: calls made through `client`, journaled here. */
    session(client, options = {}) {
        return new LedgerSession(this, client, options);
    }

    /** Appends one record and makes it durable before returning. */
    append(record) {
        if (this._fd === null) throw new Error('the journal is closed');
        const line = (this._needsNewline ? '\n' : '') + JSON.stringify({ ...record, at: new Date().toISOString() }) + '\n';
        writeAll(this._fd, line);
        fsyncSync(this._fd);
        this._needsNewline = false;
    }

    recordIntent({ operationId, intent, tool, arguments: args, keyArgument }) {
        this.append({ type: 'intent', operationId, intent: intent ?? null, tool, arguments: args, keyArgument: keyArgument ?? null });
    }

    recordObserved({ operationId, statusRef, errorCode }) {
        this.append({ type: 'observed', operationId, statusRef: statusRef ?? null, errorCode: errorCode ?? null });
    }

    recordSettled(operationId, outcome) {
        this.append({ type: 'settled', operationId, outcome });
    }

    close() {
        if (this._fd !== null) {
            closeSync(this._fd);
            this._fd = null;
        }
    }
}

function endsWithNewline(path) {
    const fd = openSync(path, 'r');
    try {
        const size = fstatSync(fd).size;
        if (size === 0) return true;
        const b = Buffer.alloc(1);
        readSync(fd, b, 0, 1, size - 1);
        return b[0] === 0x0a;
    } finally {
        closeSync(fd);
    }
}

export { canonicalJson };
