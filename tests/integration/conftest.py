"""The ``sglang`` tier: needs .venv-sglang (``bash .ci/sglang-env.sh``); skips cleanly elsewhere.

Run: ``.venv-sglang/bin/pytest -m sglang tests/integration``
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

FIXTURES = Path(__file__).resolve().parents[2] / "fixtures" / "sglang"
if str(FIXTURES) not in sys.path:
    sys.path.insert(0, str(FIXTURES))


@pytest.fixture
def cpu(monkeypatch):
    """SGLang's recorders on a host without an NVIDIA driver: torch-level shims in this process only."""
    import drive

    drive.cpu_shims(monkeypatch.setattr)
    monkeypatch.setenv("TRITON_INTERPRET", "1")
    return drive
