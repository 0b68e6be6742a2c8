"""Per-position layout: LIST columns on request_steps vs a long (row, position) table.

Builds the same synthetic request_steps (default 300k rows, gamma 7, two runs)
in two DuckDB files and times, side by side in one run (median of --repeat,
layouts interleaved), the queries the estimators and the dashboard run:

  (a) per-position mean confidence and acceptance indicator (position < ceiling)
      per workload, over one run;
  (b) whole-row read of one run into pandas, arrays included (and into Arrow);
  (c) one request's drill-down (all its steps with arrays);
  (d) file size; plus the bulk load time.

LIST layout = ``schema.REQUEST_STEPS`` as the store writes it. Long layout = the
scalar columns (``committed_tokens``, not per-position, stays a list there) plus
``request_positions(run_id, rank, epoch, forward_ct, rid, position, draft_token,
confidence, survival, confidence_logit, draft_logprob, target_logprob)``; queries
join the two on the natural key, as a normalised long design must.

Run:  .venv/bin/python bench/layout.py [--rows 300000] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb  # noqa: E402
import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from acceptscope import schema  # noqa: E402
from acceptscope.store import Store  # noqa: E402
from bench.support import synthetic as H  # noqa: E402

KEY = list(schema.REQUEST_STEPS.key)
PER_POS = ["draft_tokens", "confidence", "survival", "confidence_logit", "draft_logprob", "target_logprob"]
LONG_NAMES = {"draft_tokens": "draft_token"}


def build(rows: int, gamma: int) -> pa.Table:
    half = rows // 2
    a = H.request_steps(half, gamma=gamma, run_id="run-a", seed=1)
    b = H.request_steps(rows - half, gamma=gamma, run_id="run-b", seed=2)
    return pa.concat_tables([a, b])


def to_long(data: pa.Table, gamma: int) -> tuple[pa.Table, pa.Table]:
    scalars = data.drop_columns(PER_POS)
    n = data.num_rows
    idx = np.repeat(np.arange(n), gamma)
    cols = {k: data.column(k).take(pa.array(idx)) for k in KEY}
    cols["position"] = pa.array(np.tile(np.arange(gamma, dtype=np.int32), n))
    for c in PER_POS:
        cols[LONG_NAMES.get(c, c)] = pc.list_flatten(data.column(c))
    return scalars, pa.table(cols)


def load(d: Path, data: pa.Table, gamma: int) -> tuple[duckdb.DuckDBPyConnection, duckdb.DuckDBPyConnection, dict]:
    out = {}
    t0 = time.perf_counter()
    list_store = Store(d / "list.duckdb")
    list_store.write_arrow({"request_steps": data})
    out["load_list_s"] = time.perf_counter() - t0

    t0 = time.perf_counter()
    scalars, positions = to_long(data, gamma)
    con = duckdb.connect(str(d / "long.duckdb"))
    con.register("s", scalars)
    con.register("p", positions)
    con.execute("CREATE TABLE request_scalars AS SELECT * FROM s")
    con.execute("CREATE TABLE request_positions AS SELECT * FROM p")
    con.close()
    out["load_long_s"] = time.perf_counter() - t0
    out["size_list_mb"] = os.path.getsize(d / "list.duckdb") / 1e6
    out["size_long_mb"] = os.path.getsize(d / "long.duckdb") / 1e6
    return (duckdb.connect(str(d / "list.duckdb"), read_only=True),
            duckdb.connect(str(d / "long.duckdb"), read_only=True), out)


JOIN = " AND ".join(f's."{k}" = p."{k}"' for k in KEY)
QUERIES = {
    "a_per_position": (
        # LIST: unnest with subscripts (one pass, no join)
        """SELECT workload, pos, avg(conf) AS mean_conf, avg((pos - 1 < ceiling)::INT) AS accept
           FROM (SELECT workload, ceiling, unnest(confidence) AS conf, generate_subscripts(confidence, 1) AS pos
                 FROM request_steps WHERE run_id = 'run-a') GROUP BY ALL ORDER BY ALL""",
        f"""SELECT s.workload, p.position + 1 AS pos, avg(p.confidence) AS mean_conf,
                   avg((p.position < s.ceiling)::INT) AS accept
            FROM request_scalars s JOIN request_positions p ON {JOIN}
            WHERE s.run_id = 'run-a' AND p.run_id = 'run-a' GROUP BY ALL ORDER BY ALL""",
    ),
    "b_whole_run_pandas": (
        "SELECT * FROM request_steps WHERE run_id = 'run-a'",
        "SELECT s.*, " + ", ".join(f"p.{c}" for c in PER_POS) + f""" FROM request_scalars s JOIN (
               SELECT {', '.join(KEY)}, """ + ", ".join(
            f"list({LONG_NAMES.get(c, c)} ORDER BY position) AS {c}" for c in PER_POS
        ) + f""" FROM request_positions WHERE run_id = 'run-a' GROUP BY ALL) p ON {JOIN}
               WHERE s.run_id = 'run-a'""",
    ),
    "c_one_request": (
        "SELECT * FROM request_steps WHERE run_id = 'run-a' AND rid = 'req-1003' ORDER BY forward_ct",
        "SELECT s.*, " + ", ".join(f"p.{c}" for c in PER_POS) + f""" FROM request_scalars s JOIN (
               SELECT {', '.join(KEY)}, """ + ", ".join(
            f"list({LONG_NAMES.get(c, c)} ORDER BY position) AS {c}" for c in PER_POS
        ) + f""" FROM request_positions WHERE run_id = 'run-a' AND rid = 'req-1003' GROUP BY ALL) p ON {JOIN}
               WHERE s.run_id = 'run-a' AND s.rid = 'req-1003' ORDER BY s.forward_ct""",
    ),
}


def time_query(con: duckdb.DuckDBPyConnection, sql: str, arrow: bool = False) -> tuple[float, object]:
    t0 = time.perf_counter()
    res = con.sql(sql).to_arrow_table() if arrow else con.execute(sql).df()
    return time.perf_counter() - t0, res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=300_000)
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    data = build(a.rows, a.gamma)
    with tempfile.TemporaryDirectory() as d:
        lst, lng, info = load(Path(d), data, a.gamma)
        print(f"duckdb {duckdb.__version__}; {a.rows} request_steps rows (2 runs), gamma {a.gamma}")
        print(f"{'query':22s} {'LIST ms':>9s} {'long ms':>9s} {'long/LIST':>9s}")
        runs = list(QUERIES.items())
        runs.insert(2, ("b_whole_run_arrow", QUERIES["b_whole_run_pandas"]))
        for name, (q_list, q_long) in runs:
            arrow = name.endswith("_arrow")
            tl, tg = [], []
            for _ in range(a.repeat):
                t, r_list = time_query(lst, q_list, arrow)
                tl.append(t)
                t, r_long = time_query(lng, q_long, arrow)
                tg.append(t)
            assert len(r_list) == len(r_long), (name, len(r_list), len(r_long))
            if name == "a_per_position":
                assert np.allclose(r_list["mean_conf"], r_long["mean_conf"]) and np.allclose(
                    r_list["accept"], r_long["accept"])
            ml, mg = statistics.median(tl) * 1000, statistics.median(tg) * 1000
            print(f"{name:22s} {ml:9.1f} {mg:9.1f} {mg / ml:9.2f}x")
        print(f"{'d_file_size_MB':22s} {info['size_list_mb']:9.1f} {info['size_long_mb']:9.1f} "
              f"{info['size_long_mb'] / info['size_list_mb']:9.2f}x")
        print(f"{'bulk_load_s':22s} {info['load_list_s']:9.2f} {info['load_long_s']:9.2f} "
              f"{info['load_long_s'] / info['load_list_s']:9.2f}x")
        print("long/LIST > 1: the LIST layout is faster (smaller)")
        lst.close()
        lng.close()


if __name__ == "__main__":
    main()
