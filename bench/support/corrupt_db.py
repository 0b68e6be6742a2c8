"""Damaged copies of a real store file: what a read command must answer with one line and exit 2 (issue 11).

Shared by tests/test_hostile_db.py and the fuzz benchmark's ``corrupt db:<kind>`` cases (bench/fuzz.py).
"""

from __future__ import annotations

from pathlib import Path

from bench.support import SGLANG_FIXTURES

KINDS = ("random", "tiny", "jsonl", "truncated", "zeroed-middle")


def corrupt(kind: str, real: Path, out: Path) -> Path:
    """Write to ``out`` a damaged version of the DuckDB file ``real`` (``kind``: one of :data:`KINDS`)."""
    data = real.read_bytes()
    if kind == "random":
        out.write_bytes(bytes((i * 7919 + 13) % 256 for i in range(100_000)))
    elif kind == "tiny":
        out.write_bytes(b"DUCK")
    elif kind == "jsonl":
        out.write_bytes((SGLANG_FIXTURES / "capacc.estimator.jsonl").read_bytes())
    elif kind == "truncated":
        out.write_bytes(data[: len(data) // 3])
    elif kind == "zeroed-middle":
        mid = len(data) // 2
        out.write_bytes(data[:4096] + b"\0" * (mid - 4096) + data[mid:])
    else:
        raise ValueError(f"unknown corruption {kind!r} (one of {', '.join(KINDS)})")
    return out
