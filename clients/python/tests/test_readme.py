"""The README's quick start is the file examples/quickstart.py, and it runs as written."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import _support

PKG = Path(__file__).resolve().parents[1]


def test_the_quick_start_is_the_example_file():
    block = re.search(r"```python\n(import anyio.*?)```", (PKG / "README.md").read_text(), re.S).group(1)
    assert block in (PKG / "examples" / "quickstart.py").read_text()


def test_the_quick_start_runs_and_charges_once_over_two_runs(tmp_path):
    (tmp_path / "tests" / "proxy").mkdir(parents=True)
    (tmp_path / "tests" / "proxy" / "charge_server.py").symlink_to(_support.charge_server())
    env = {
        **os.environ,
        "PATH": os.pathsep.join([os.path.dirname(_support.toolledger_bin()), os.path.dirname(sys.executable), os.environ.get("PATH", "")]),
    }
    outputs = []
    for _ in range(2):
        run = subprocess.run(
            [sys.executable, str(PKG / "examples" / "quickstart.py")],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120,
        )
        assert run.returncode == 0, run.stderr[-3000:]
        outputs.append(run.stdout.splitlines())
    assert outputs[0][0].startswith("succeeded ") and "'charge_id': 1" in outputs[0][0]
    assert outputs[1][0] == outputs[0][0]
    assert outputs[0][1] == "pending: []"
    assert _support.count_charges(tmp_path / "quickstart-charges.sqlite") == 1
