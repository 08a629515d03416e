#!/usr/bin/env python3
"""Generates crates/toolledger/tests/vectors/digests.json.

An independent implementation of the canonical form (canonical JSON, request/result/call-binding digests and the
keyed fingerprint) that shares no code with the Rust crate: Python standard library only. The
Rust tests check their output against the file this script writes.

Run from the repository root:  python3 tools/gen_digest_vectors.py
The output is deterministic (fixed seed), so re-running it must not change the file.
"""

import hashlib
import hmac
import json
import random
from decimal import Decimal
from pathlib import Path

MAX_SAFE = 2**53 - 1
OUT = Path(__file__).resolve().parent.parent / "crates/toolledger/tests/vectors/digests.json"


class Refused(Exception):
    """A value or document outside the canonical domain; args[0] is the stable code."""


# --- canonical JSON -------------------------------------------------------------------

SHORT = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def canon_str(s):
    out = ['"']
    for ch in s:
        cp = ord(ch)
        if 0xD800 <= cp <= 0xDFFF:
            raise Refused("lone_surrogate")
        if ch in SHORT:
            out.append(SHORT[ch])
        elif cp < 0x20:
            out.append("\\u%04x" % cp)
        else:
            out.append(ch)
    out.append('"')
    return "".join(out)


def canon_int(n):
    if abs(n) > MAX_SAFE:
        raise Refused("integer_out_of_range")
    return str(n)


def es_number(f):
    """ECMAScript Number::toString of a finite nonzero double (RFC 8785 section 3.2.2.3).

    Python's repr gives the shortest digits that round-trip; only the layout differs."""
    sign = "-" if f < 0 else ""
    t = Decimal(repr(abs(f))).normalize().as_tuple()
    digits = "".join(map(str, t.digits))
    k = len(digits)
    n = k + t.exponent
    if k <= n <= 21:
        body = digits + "0" * (n - k)
    elif 0 < n <= 21:
        body = digits[:n] + "." + digits[n:]
    elif -6 < n <= 0:
        body = "0." + "0" * (-n) + digits
    else:
        e = n - 1
        body = digits[0] + ("." + digits[1:] if k > 1 else "") + "e" + ("-" if e < 0 else "+") + str(abs(e))
    return sign + body


def canon_float(f):
    if f != f or f in (float("inf"), float("-inf")):
        raise Refused("non_finite_number")
    if f.is_integer():
        if abs(f) <= MAX_SAFE:
            return str(int(f))
        if abs(f) < 1e21:
            # A double cannot hold every such integer: two of them would share one form.
            raise Refused("integer_out_of_range")
    return es_number(f)


def canon_decimal(d):
    if not d.is_finite():
        raise Refused("non_finite_number")
    if d == d.to_integral_value() and abs(d) < Decimal(10) ** 21:
        return canon_int(int(d))
    f = float(d)  # correctly rounded
    if f in (float("inf"), float("-inf")) or f == 0:
        raise Refused("number_out_of_range")
    return canon_float(f)


def canon(v):
    if v is None:
        return "null"
    if v is True:
        return "true"
    if v is False:
        return "false"
    if isinstance(v, int):
        return canon_int(v)
    if isinstance(v, float):
        return canon_float(v)
    if isinstance(v, Decimal):
        return canon_decimal(v)
    if isinstance(v, str):
        return canon_str(v)
    if isinstance(v, list):
        return "[" + ",".join(canon(x) for x in v) + "]"
    if isinstance(v, dict):
        # Python compares str by code point, which is Unicode scalar value order.
        items = sorted(v.items(), key=lambda kv: kv[0])
        return "{" + ",".join(canon_str(k) + ":" + canon(x) for k, x in items) + "}"
    raise TypeError(type(v))


def canon_bytes(v):
    return canon(v).encode("utf-8")


def sha256_hex(b):
    return hashlib.sha256(b).hexdigest()


def strict_loads(text):
    """json.loads with duplicate keys, NaN/Infinity refused and exact decimal numbers."""

    def pairs(ps):
        d = {}
        for k, x in ps:
            if k in d:
                raise Refused("duplicate_key")
            d[k] = x
        return d

    def constant(_name):
        raise Refused("non_finite_number")

    return json.loads(
        text,
        object_pairs_hook=pairs,
        parse_float=Decimal,
        parse_int=Decimal,
        parse_constant=constant,
    )


# --- digests ---------------------------------------------------------------------------------

REVS = ("input_rev", "output_rev", "effect_rev", "handler_rev", "producer_rev", "policy_rev")


def request_object(tenant, subject, contract, arguments):
    return {
        "tenant": tenant,
        "subject": subject,
        "tool": contract["name"],
        "arguments": arguments,
        "input_rev": contract["input_rev"],
        "output_rev": contract["output_rev"],
        "effect_rev": contract["effect_rev"],
    }


def keyed(key, name, value):
    msg = name.encode("utf-8") + b"\x00" + canon_bytes(value)
    return hmac.new(key, msg, hashlib.sha256).hexdigest()


def fingerprint(key, req):
    assert len(key) >= 32
    cs = keyed(key, "continuation_state", req.get("continuation_state"))
    ir = keyed(key, "input_responses", req.get("input_responses"))
    obj = {
        "principal": req["principal"],
        "tool_id": req["tool_id"],
        "tool_version": req["tool_version"],
        "arguments": req["arguments"],
        "continuation_state": cs,
        "input_responses": ir,
    }
    return cs, ir, sha256_hex(canon_bytes(obj))


# --- case generation -------------------------------------------------------------------------

rng = random.Random(20240611)

POOL = (
    list("abcxyzABC019 _-:/.")
    + ["\u0000", "\u0001", "\u001f", "\b", "\f", "\n", "\r", "\t", '"', "\\", "\u007f"]
    + ["é", "ß", "\u2028", "\u00a0", "\ufeff", "\ue000", "\uf8ff", "\ufffd", "\uffff", "中", "ｱ"]
    + ["\U0001f600", "\U0001f4a9", "\U00010000", "\U0010ffff", "\U000e0001"]
)


def rand_str(max_len=8):
    return "".join(rng.choice(POOL) for _ in range(rng.randint(0, max_len)))


def rand_int():
    return rng.choice(
        [0, 1, -1, MAX_SAFE, -MAX_SAFE, rng.randint(-MAX_SAFE, MAX_SAFE), rng.randint(-1000, 1000)]
    )


def rand_value(depth=0):
    kinds = ["null", "bool", "int", "str"] + (["list", "dict", "dict"] if depth < 4 else [])
    kind = rng.choice(kinds)
    if kind == "null":
        return None
    if kind == "bool":
        return rng.random() < 0.5
    if kind == "int":
        return rand_int()
    if kind == "str":
        return rand_str()
    if kind == "list":
        return [rand_value(depth + 1) for _ in range(rng.randint(0, 4))]
    return {rand_str(6): rand_value(depth + 1) for _ in range(rng.randint(0, 5))}


def rand_object():
    return {rand_str(6): rand_value(1) for _ in range(rng.randint(0, 5))}


def contract(name, rev="1"):
    return {"name": name, **{r: rev for r in REVS}}


def rand_contract():
    c = {"name": rand_str(10)}
    for r in REVS:
        c[r] = rng.choice(["1", "2", "2024-06-01", rand_str(4)])
    return c


ASTRAL_KEYS = {"\U0001f600": 1, "\ue000": 2, "\ufffd": 3, "z": 4, "": 5, "\u00e9": 6, "\U00010000": 7}


def request_cases():
    fixed = [
        ("acme", "alice", contract("create_issue"), {"title": "spec"}),
        ("acme", "alice", contract("create_issue"), {}),
        ("acme", "bob", contract("create_issue"), {"title": "spec"}),
        ("other", "alice", contract("create_issue"), {"title": "spec"}),
        ("acme", "alice", contract("create_issue", "2"), {"title": "spec"}),
        ("acme", "alice", contract("set_interval"), {"automation_id": 7, "minutes": 15, "expected_version": 3}),
        ("acme", "alice", contract("refund"), {"amount": MAX_SAFE, "delta": -MAX_SAFE, "zero": 0}),
        ("acme", "alice", contract("tool"), {"nested": {"b": [1, [2, [3, {"c": None}]]], "a": True}}),
        ("acme", "alice", contract("tool"), ASTRAL_KEYS),
        ("t\u00e9nant", "s\U0001f600", contract("\u5de5\u5177"), {"ctl": "\u0000\u0001\b\f\n\r\t\u001f\u007f"}),
        ("acme", "alice", contract("tool"), {"quote": '"', "backslash": "\\", "slash": "/"}),
        ("acme", "alice", contract("tool"), [1, "two", None]),
        ("acme", "alice", contract("tool"), "a bare string"),
        ("", "", contract(""), None),
    ]
    cases = list(fixed)
    while len(cases) < 22:
        cases.append((rand_str(), rand_str(), rand_contract(), rand_object()))
    out = []
    for tenant, subject, c, args in cases:
        text = canon(request_object(tenant, subject, c, args))
        out.append(
            {
                "tenant": tenant,
                "subject": subject,
                "contract": c,
                "arguments": args,
                "canonical": text,
                "digest": sha256_hex(text.encode("utf-8")),
            }
        )
    return out


def result_cases():
    fixed = [
        None,
        True,
        False,
        0,
        -1,
        MAX_SAFE,
        -MAX_SAFE,
        1.0,  # an integral float is written as an integer
        -0.0,
        "",
        "plain",
        "\u0000\u001f\"\\\u007f\u2028\ufeff",
        [],
        {},
        {"ok": True, "issue": {"id": 42, "title": "spec", "labels": ["a", "b"]}},
        ASTRAL_KEYS,
        {"\U0001f600": {"\ue000": ["\ufffd", "\U0010ffff"]}},
    ]
    cases = list(fixed)
    while len(cases) < 24:
        cases.append(rand_value(0))
    out = []
    for v in cases:
        text = canon(v)
        out.append({"result": v, "canonical": text, "digest": sha256_hex(text.encode("utf-8"))})
    return out


BINDING_FIELDS = (
    "provider",
    "api_family",
    "adapter_rev",
    "turn_id",
    "call_id",
    "response_id",
    "operation_id",
    "idempotency_key",
    "request_digest",
    "result_digest",
    "downstream_request_ref",
    "downstream_receipt_ref",
    "downstream_status_ref",
)
OPTIONAL = ("turn_id", "response_id", "result_digest", "downstream_request_ref",
            "downstream_receipt_ref", "downstream_status_ref")


def binding_object(b):
    return dict(b)  # the canonical object is the binding itself, contract nested


def call_binding_cases():
    base = {
        "provider": "mcp",
        "api_family": "tools/call",
        "adapter_rev": "1",
        "turn_id": None,
        "call_id": "17",
        "response_id": None,
        "operation_id": "op-1",
        "idempotency_key": "key-1",
        "contract": contract("create_issue"),
        "request_digest": sha256_hex(b"request"),
        "result_digest": None,
        "downstream_request_ref": None,
        "downstream_receipt_ref": None,
        "downstream_status_ref": None,
    }
    variants = [
        {},
        {"idempotency_key": "key-2"},
        {"call_id": "18"},
        {"operation_id": "op-2"},
        {"provider": "openai", "api_family": "responses", "adapter_rev": "3", "turn_id": "turn-9",
         "response_id": "resp_abc"},
        {"result_digest": sha256_hex(b"result")},
        {"downstream_request_ref": "req-1", "downstream_receipt_ref": "rcpt-1",
         "downstream_status_ref": "status-1"},
        {"downstream_request_ref": "", "downstream_receipt_ref": None, "downstream_status_ref": ""},
        {"contract": {**contract("create_issue"), "handler_rev": "2"}},
        {"contract": {**contract("create_issue"), "policy_rev": "2"}},
        {"contract": {**contract("create_issue"), "producer_rev": "2"}},
        {"turn_id": "\U0001f600", "call_id": "\u0000\n\"", "idempotency_key": "\ue000\ufffd"},
    ]
    cases = [{**base, **v} for v in variants]
    while len(cases) < 22:
        b = {f: rand_str(10) for f in BINDING_FIELDS}
        for f in OPTIONAL:
            if rng.random() < 0.4:
                b[f] = None
        b["contract"] = rand_contract()
        cases.append(b)
    out = []
    for b in cases:
        text = canon(binding_object(b))
        out.append({"binding": b, "canonical": text, "digest": sha256_hex(text.encode("utf-8"))})
    return out


KAT_KEY = b"test-only-cross-language-key-32b"
KEYS = [
    KAT_KEY,
    bytes(range(32)),
    bytes(range(33)),
    bytes((i * 7 + 3) % 256 for i in range(64)),
    bytes((i * 13 + 1) % 256 for i in range(100)),  # longer than the SHA-256 block
]


def fingerprint_cases():
    kat = {
        "principal": "alice",
        "tool_id": "create_issue",
        "tool_version": "1.0",
        "arguments": {"title": "spec"},
        "continuation_state": "awaiting-body",
        "input_responses": {"body": {"action": "accept", "content": {"body": "alpha"}}},
    }
    plain = {"principal": "alice", "tool_id": "create_issue", "tool_version": "1.0",
             "arguments": {"title": "spec"}}
    fixed = [
        (KAT_KEY, kat),
        (KAT_KEY, plain),
        (KAT_KEY, {**plain, "continuation_state": None, "input_responses": None}),
        (KAT_KEY, {**plain, "continuation_state": None}),
        (KAT_KEY, {**plain, "input_responses": {}}),
        (KAT_KEY, {**plain, "continuation_state": ""}),
        (KAT_KEY, {**kat, "principal": "bob"}),
        (KAT_KEY, {**kat, "tool_version": "1.1"}),
        (KAT_KEY, {**kat, "input_responses": {"body": {"action": "decline"}}}),
        (KAT_KEY, {**plain, "arguments": ASTRAL_KEYS}),
        (KAT_KEY, {**plain, "arguments": {"n": MAX_SAFE, "m": -MAX_SAFE, "f": 2.0}}),
        (KAT_KEY, {**plain, "arguments": {"ctl": "\u0000\u001f\b\t\n\"\\"}, "principal": "\U0001f600"}),
        (KAT_KEY, {**plain, "continuation_state": {"step": [1, 2, {"\ue000": None}]},
                   "input_responses": ["a", 1, True]}),
        (KEYS[1], kat),
        (KEYS[2], kat),
        (KEYS[3], kat),
        (KEYS[4], kat),
    ]
    cases = list(fixed)
    while len(cases) < 24:
        req = {"principal": rand_str(), "tool_id": rand_str(), "tool_version": rand_str(4),
               "arguments": rand_object()}
        if rng.random() < 0.7:
            req["continuation_state"] = rand_value(1)
        if rng.random() < 0.7:
            req["input_responses"] = rand_value(1)
        cases.append((rng.choice(KEYS), req))
    out = []
    for key, req in cases:
        cs, ir, fp = fingerprint(key, req)
        out.append(
            {
                "key_hex": key.hex(),
                "input": req,
                # The request as one line of `toolledger fingerprint` input (not canonical).
                "line": json.dumps(req, ensure_ascii=False),
                "continuation_state_hash": cs,
                "input_responses_hash": ir,
                "fingerprint": fp,
            }
        )
    return out


def canonicalize_cases():
    texts = [
        '{"b": 1, "a": [true, false, null]}',
        " [ 1 , 2 ] ",
        "1.0",
        "10e-1",
        "1e2",
        "1E+2",
        "-0",
        "0.5e1",
        "123.4500e2",
        "9007199254740991",
        "-9.007199254740991e15",
        '"\\u00e9\\/\\b\\u0001\\u001F\\ud83d\\ude00"',
        '{"\\ud83d\\ude00": 1, "\\ue000": 2, "\\ufffd": 3}',
        '{"a": {"b": {"c": [1.00, 2e0]}}}',
        "1.5",
        "1e-1",
        "[0.1]",
        "9007199254740992",
        "-1e16",
        "1e400",
        '{"a": 1, "a": 2}',
        '[{"k": 1, "\\u006b": 2}]',
        "NaN",
        "[-Infinity]",
        '"\\ud800"',
        '"\\udc00x"',
        '{"k": "\\ud800\\u0041"}',
        "12.5",
        "-0.5",
        "0.10",
        "1e-7",
        "1.5e300",
        "1e21",
        "123456789012345678901234",
        "999999999999999999999.5",
        "0.99999999999999999999",
        "9007199254740993.5",
        "1e-400",
        "-1e400",
        '{"amount": 12.50, "ratio": 0.333333333333333333333}',
    ]
    out = []
    for t in texts:
        try:
            out.append({"text": t, "canonical": canon(strict_loads(t))})
        except Refused as e:
            out.append({"text": t, "error": e.args[0]})
    return out


# RFC 8785 appendix B: IEEE 754 bit patterns and their JCS form. The integral ones from 2^53 up
# to 10^21 are refused by the canonical form (a double cannot hold every such integer).
RFC8785_NUMBERS = [
    ("0000000000000000", "0"),
    ("8000000000000000", "0"),
    ("0000000000000001", "5e-324"),
    ("8000000000000001", "-5e-324"),
    ("7fefffffffffffff", "1.7976931348623157e+308"),
    ("ffefffffffffffff", "-1.7976931348623157e+308"),
    ("4340000000000000", "9007199254740992"),
    ("c340000000000000", "-9007199254740992"),
    ("4430000000000000", "295147905179352830000"),
    ("7fffffffffffffff", "NaN"),
    ("7ff0000000000000", "Infinity"),
    ("44b52d02c7e14af5", "9.999999999999997e+22"),
    ("44b52d02c7e14af6", "1e+23"),
    ("44b52d02c7e14af7", "1.0000000000000001e+23"),
    ("444b1ae4d6e2ef4e", "999999999999999700000"),
    ("444b1ae4d6e2ef4f", "999999999999999900000"),
    ("444b1ae4d6e2ef50", "1e+21"),
    ("3eb0c6f7a0b5ed8c", "9.999999999999997e-7"),
    ("3eb0c6f7a0b5ed8d", "0.000001"),
    ("41b3de4355555553", "333333333.3333332"),
    ("41b3de4355555554", "333333333.33333325"),
    ("41b3de4355555555", "333333333.3333333"),
    ("41b3de4355555556", "333333333.3333334"),
    ("41b3de4355555557", "333333333.33333343"),
    ("becbf647612f3696", "-0.0000033333333333333333"),
    ("43143ff3c1cb0959", "1424953923781206.2"),
]


def number_cases():
    """Doubles by bit pattern: RFC 8785's examples, then random ones (their own seed, so the
    sections above are unchanged)."""
    import struct

    frng = random.Random(8785)
    bits = [b for b, _ in RFC8785_NUMBERS]
    while len(bits) < 200:
        kind = frng.random()
        if kind < 0.5:
            f = frng.uniform(-1e6, 1e6)
        elif kind < 0.8:
            f = frng.uniform(-1, 1) * 10 ** frng.randint(-30, 30)
        else:
            f = struct.unpack(">d", frng.getrandbits(64).to_bytes(8, "big"))[0]
        bits.append(struct.pack(">d", f).hex())
    out = []
    for b in bits:
        f = struct.unpack(">d", bytes.fromhex(b))[0]
        case = {"bits": b}
        if b in dict(RFC8785_NUMBERS) and f == f and abs(f) != float("inf"):
            jcs = es_number(f) if f != 0 else "0"
            assert jcs == dict(RFC8785_NUMBERS)[b], (b, jcs)
        try:
            case["canonical"] = canon_float(f)
        except Refused as e:
            case["error"] = e.args[0]
        out.append(case)
    return out


def float_fingerprint_cases():
    """Fingerprints and request digests of arguments with non-integral numbers."""
    frng = random.Random(1285)
    args = [
        {"amount": 12.5},
        {"amount": 0.1, "currency": "EUR"},
        {"ratio": 1e-7, "big": 1.5e300, "neg": -2.25},
        {"nested": {"prices": [19.99, 0.5, 1e21, 1e-6]}},
        {"amount": 12.5, "n": 3},
    ]
    while len(args) < 20:
        args.append({"x": frng.uniform(-1000, 1000), "y": [frng.random() for _ in range(2)]})
    out = []
    for a in args:
        req = {"principal": "alice", "tool_id": "charge", "tool_version": "1", "arguments": a}
        cs, ir, fp = fingerprint(KAT_KEY, req)
        text = canon(request_object("acme", "alice", contract("charge"), a))
        out.append({
            "key_hex": KAT_KEY.hex(),
            "input": req,
            "line": json.dumps(req),
            "fingerprint": fp,
            "request_canonical": text,
            "request_digest": sha256_hex(text.encode("utf-8")),
        })
    return out


def main():
    doc = {
        "about": "Generated by tools/gen_digest_vectors.py (independent Python implementation of "
        "the canonical form). Do not edit by hand.",
        "request": request_cases(),
        "result": result_cases(),
        "call_binding": call_binding_cases(),
        "fingerprint": fingerprint_cases(),
        "canonicalize": canonicalize_cases(),
        "numbers": number_cases(),
        "float_fingerprint": float_fingerprint_cases(),
    }
    kat = doc["fingerprint"][0]
    assert kat["fingerprint"] == "8053811d58bacfa928adfe862a3e1bda8040d18feef86b1b6eca9cd807c2cd97"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    counts = {k: len(v) for k, v in doc.items() if isinstance(v, list)}
    print(f"wrote {OUT.name}: {counts}")


if __name__ == "__main__":
    main()
