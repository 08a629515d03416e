"""The journal on its own: ids, durability across Ledger objects and processes."""

import json
import subprocess
import sys
import uuid

from toolledger_client import Ledger, uuid7


def test_uuid7_is_version_7_and_ordered():
    ids = [uuid7() for _ in range(200)]
    assert all(u.version == 7 and u.variant == uuid.RFC_4122 for u in ids)
    stamps = [u.int >> 80 for u in ids]
    assert stamps == sorted(stamps)
    assert len(set(ids)) == len(ids)


def test_an_intent_keeps_its_id_across_ledger_objects(tmp_path):
    path = tmp_path / "journal.sqlite"
    first = Ledger(path)
    entry = first.reserve("charge", {"customer": "a", "amount_cents": 5}, "order-1")
    first.close()
    again = Ledger(path)
    assert again.reserve("charge", {"customer": "a", "amount_cents": 5}, "order-1") == entry
    assert again.operation_id_for("order-1") == entry.operation_id
    assert [e.operation_id for e in again.pending()] == [entry.operation_id]
    # Another journal mints other ids for the same intent.
    other = Ledger(tmp_path / "other.sqlite")
    assert other.operation_id_for("order-1") != entry.operation_id


def test_without_an_intent_every_call_gets_a_new_id(tmp_path):
    ledger = Ledger(tmp_path / "j.sqlite")
    a = ledger.reserve("charge", {}, None)
    b = ledger.reserve("charge", {}, None)
    assert a.operation_id != b.operation_id
    assert uuid.UUID(a.operation_id).version == 7


def test_the_journal_is_wal_and_full_sync(tmp_path):
    ledger = Ledger(tmp_path / "j.sqlite")
    assert ledger._conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert ledger._conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


SCRIPT = """
import json, sys
from toolledger_client import Ledger
ledger = Ledger(sys.argv[1])
ids = [ledger.reserve("charge", {"n": i}, f"intent-{i}").operation_id for i in range(50)]
print(json.dumps(ids))
"""


def test_several_processes_agree_on_every_intent(tmp_path):
    path = str(tmp_path / "shared.sqlite")
    procs = [
        subprocess.Popen([sys.executable, "-c", SCRIPT, path], stdout=subprocess.PIPE, text=True)
        for _ in range(4)
    ]
    outs = [json.loads(p.communicate(timeout=60)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert all(out == outs[0] for out in outs)
    assert len(Ledger(path).entries()) == 50
