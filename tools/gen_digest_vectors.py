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
        if v != v or v in (float("inf"), float("-inf")):
            raise Refused("non_finite_number")
        if not v.is_integer():
            raise Refused("non_integral_number")
        return canon_int(int(v))
    if isinstance(v, Decimal):
        if not v.is_finite():
            raise Refused("non_finite_number")
        if v != v.to_integral_value():
            raise Refused("non_integral_number")
        return canon_int(int(v))
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
    ]
    out = []
    for t in texts:
        try:
            out.append({"text": t, "canonical": canon(strict_loads(t))})
        except Refused as e:
            out.append({"text": t, "error": e.args[0]})
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
    }
    kat = doc["fingerprint"][0]
    assert kat["fingerprint"] == "8053811d58bacfa928adfe862a3e1bda8040d18feef86b1b6eca9cd807c2cd97"
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(doc, ensure_ascii=False, indent=1) + "\n", encoding="utf-8")
    counts = {k: len(v) for k, v in doc.items() if isinstance(v, list)}
    print(f"wrote {OUT.name}: {counts}")


if __name__ == "__main__":
    main()
