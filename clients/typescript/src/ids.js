// Operation ids and the canonical form of arguments.
import { createHash, randomBytes, randomUUID } from 'node:crypto';

function parseUuid(uuid) {
    const hex = uuid.replace(/-/g, '');
    if (!/^[0-9a-f]{32}$/i.test(hex)) throw new TypeError(`not a UUID: ${uuid}`);
    return Buffer.from(hex, 'hex');
}

function formatUuid(bytes) {
    const h = Buffer.from(bytes).toString('hex');
    return `${h.slice(0, 8)}-${h.slice(8, 12)}-${h.slice(12, 16)}-${h.slice(16, 20)}-${h.slice(20, 32)}`;
}

/** RFC 9562 UUIDv5: SHA-1 of the namespace's bytes and the name's UTF-8 bytes. */
export function uuidv5(name, namespace) {
    const hash = createHash('sha1').update(parseUuid(namespace)).update(Buffer.from(String(name), 'utf8')).digest();
    const b = hash.subarray(0, 16);
    b[6] = (b[6] & 0x0f) | 0x50;
    b[8] = (b[8] & 0x3f) | 0x80;
    return formatUuid(b);
}

/** RFC 9562 UUIDv7: 48 bits of Unix milliseconds, then 74 random bits. */
export function uuidv7(now = Date.now()) {
    const b = randomBytes(16);
    const ms = BigInt(now);
    for (let i = 0; i < 6; i++) b[i] = Number((ms >> BigInt(8 * (5 - i))) & 0xffn);
    b[6] = (b[6] & 0x0f) | 0x70;
    b[8] = (b[8] & 0x3f) | 0x80;
    return formatUuid(b);
}

export function uuidv4() {
    return randomUUID();
}

/** JSON with object keys sorted at every level: two equal argument objects give one text. */
export function canonicalJson(value) {
    if (value === null || typeof value !== 'object') {
        const text = JSON.stringify(value);
        return text === undefined ? 'null' : text;
    }
    if (Array.isArray(value)) return `[${value.map(canonicalJson).join(',')}]`;
    const keys = Object.keys(value)
        .filter(k => value[k] !== undefined)
        .sort();
    return `{${keys.map(k => `${JSON.stringify(k)}:${canonicalJson(value[k])}`).join(',')}}`;
}
