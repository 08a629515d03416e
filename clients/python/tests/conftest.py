import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

import _support  # noqa: E402


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="session", autouse=True)
def _binaries() -> None:
    # Fail loudly, once, when the binary or the charge server is missing.
    _support.toolledger_bin()
    _support.charge_server()
