"""``bench/ingest.py --parsers`` (the evidence against a C-reader fast path) compares like with like."""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_parsers_bench_readers_give_our_table(tmp_path):
    # a small synthetic dump: every reader's RECORD_SCHEMA table must equal msgspec + records_table's,
    # or the bench's timings compare different work
    out = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "ingest.py"), "--parsers", "--steps", "40", "--bs", "4",
         "--repeats", "1", "--workdir", str(tmp_path)],
        capture_output=True, text=True, cwd=ROOT, timeout=300,
    )
    assert out.returncode == 0, out.stderr
    rows = [line.split() for line in out.stdout.splitlines()]
    same = {" ".join(r[:-3]): r[-1] for r in rows if r and r[-1] in ("yes", "NO")}
    assert set(same) == {"msgspec+records_table", "arrow read_json", "arrow read_json 1MiB", "duckdb read_json",
                         "duckdb json_transform"}, out.stdout
    assert set(same.values()) == {"yes"}, out.stdout
    assert "320 request-steps" in out.stdout
    assert not list(tmp_path.glob("parsers-chunk*")), "the bench leaves its lines files behind"
