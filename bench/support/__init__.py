"""Helpers the benches and the tests share: synthetic telemetry, poisoned JSON values, a hostile HTTP server
and corrupted database files.

Why here and not in tests/: bench/ measures what tests/ holds, so both import these from one place and
bench/ never imports tests/ (issue 29). Not part of the installed package.
"""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SGLANG_FIXTURES = ROOT / "fixtures" / "sglang"  # the real SGLang artifacts the hostile cases start from
