"""`bench/scale.py --page-tail` measures the requests panel in the state it claims: the longest unsorted
drill-down tail a writer leaves, and pages that still read in the panel's order."""

import importlib.util
from pathlib import Path

import duckdb

from acceptscope import summaries
from acceptscope.reader import Reader

ROOT = Path(__file__).resolve().parents[1]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_scale", ROOT / "bench" / "scale.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    return bench


def test_page_tail_is_the_longest_a_writer_leaves_and_pages_keep_their_order(tmp_path):
    bench = _bench()
    db = tmp_path / "scale.duckdb"
    bench.build_base(db)
    with duckdb.connect(str(db), read_only=True) as con:
        (n_base,), = con.execute("SELECT n_base FROM sum_page_runs WHERE run_id = 'syn-c'").fetchall()
    tail = bench.write_page_tail(db)
    limit = summaries.page_limit(n_base)
    assert tail == limit > 0
    with duckdb.connect(str(db), read_only=True) as con:
        (unsorted,), = con.execute("SELECT count(*) FROM sum_request_page WHERE run_id = 'syn-c' AND pos IS NULL "
                                   "AND has_req").fetchall()
        (n_base_after,), = con.execute("SELECT n_base FROM sum_page_runs WHERE run_id = 'syn-c'").fetchall()
        order = [r for (r,) in con.execute("SELECT rid FROM requests WHERE run_id = 'syn-c' "
                                           "ORDER BY workload, prompt_index, rid").fetchall()]
    assert (unsorted, n_base_after) == (tail, n_base)  # at the threshold (one more row re-sorts): nothing sorted
    assert bench.write_page_tail(db) == tail  # a second call adds nothing: the tail is already the longest
    r = Reader(db)
    middle = len(order) // 2
    assert list(r.requests("syn-c", limit=25, offset=middle).rid) == order[middle:middle + 25]
    assert list(r.requests("syn-c", limit=25).rid) == order[:25]
