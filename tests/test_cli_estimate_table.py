"""``acceptscope estimate``'s table at an 80-column terminal: each run's arm and whole run id, never cut."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CLI = "import sys; from acceptscope.cli import main; sys.argv = ['acceptscope', *sys.argv[1:]]; main()"


def _cli(*args: str, columns: int) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=str(ROOT), COLUMNS=str(columns))
    return subprocess.run([sys.executable, "-c", CLI, *args], capture_output=True, text=True, env=env, cwd=ROOT,
                          timeout=600)


def test_estimate_table_shows_whole_run_ids_and_arms_at_80_columns(tmp_path):
    db = tmp_path / "fx.duckdb"
    r = _cli("ingest", str(ROOT / "fixtures" / "sglang"), "--db", str(db), columns=80)
    assert r.returncode == 0, r.stderr
    r = _cli("estimate", "--db", str(db), "--n-boot", "10", columns=80)
    assert r.returncode == 0, r.stderr
    lines = r.stderr.splitlines()
    ids = [ln.strip() for ln in lines if ln.strip().startswith("sglang-") and ":" not in ln]
    assert len(ids) == 2 and all(len(i) > 30 for i in ids), lines  # both runs, ids whole on their own line
    arms = [ln.split()[1] for ln in lines if ln.strip().startswith("arm ")]
    assert sorted(arms) == ["cap-accept", "compact"]
    rows = [ln for ln in lines if ln.startswith("  ")]  # metric rows (titles and statements soft-wrap)
    assert len(rows) >= 18 and max(len(ln.rstrip()) for ln in rows) <= 80
