"""`bench/ingest.py` compares like with like: the `--parsers` readers (the evidence against a C-reader fast path)
and the growth bench's `read_json+derive` baseline."""

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import duckdb

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


def test_read_json_derive_stores_the_table_ours_stores(tmp_path):
    # ``--kinds read_json+derive`` is the like-for-like baseline of the ingest growth bench: DuckDB filling
    # the request_steps table ours stores, derived columns included; the timings mean that only if the
    # two tables are the same, column for column
    spec = importlib.util.spec_from_file_location("bench_ingest", ROOT / "bench" / "ingest.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    dump, jsonl, n = bench.build(tmp_path, steps=40, bs=4, ranks=2, gamma=7)
    env = dict(os.environ, PYTHONPATH=str(ROOT))
    for kind in ("ours", "read_json+derive"):
        out = subprocess.run([sys.executable, str(ROOT / "bench" / "ingest.py"), "--child", kind, str(dump),
                              str(jsonl), str(tmp_path / f"{kind}.duckdb")],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=300)
        assert out.returncode == 0, out.stderr
    con = duckdb.connect()
    con.execute(f"ATTACH '{tmp_path / 'ours.duckdb'}' AS o (READ_ONLY)")
    con.execute(f"ATTACH '{tmp_path / 'read_json+derive.duckdb'}' AS d (READ_ONLY)")
    cols = [r[0] for r in con.execute("SELECT column_name FROM duckdb_columns() WHERE database_name = 'o' "
                                      "AND table_name = 'request_steps'").fetchall()]
    assert {"step_index", "window", "ceiling", "committed_tokens"} <= set(cols)
    sel = ", ".join(f'"{c}"' for c in cols)
    assert con.execute("SELECT count(*) FROM o.request_steps").fetchone()[0] == n == 320
    for a, b in (("o", "d"), ("d", "o")):  # the same multiset of rows, every column compared
        left = con.execute(f"SELECT count(*) FROM (SELECT {sel} FROM {a}.request_steps EXCEPT ALL "
                           f"SELECT {sel} FROM {b}.request_steps)").fetchone()[0]
        assert left == 0, (a, b)
    nulls = con.execute('SELECT count(*) FROM d.request_steps WHERE step_index IS NULL OR "window" IS NULL '
                        "OR ceiling IS NULL OR committed_tokens IS NULL").fetchone()[0]
    assert nulls == 0
