"""The lake estimators on Spark: request-steps per second with 1 and 2 executor cores, side by side.

A synthetic fleet-shaped lake (estimators.synthetic: a cap-accept run and the compact view of
the same draws, engine schema, written by ``export_parquet``) is estimated with
``run_all(LakeStore, "syn-compact", tail_engine=SparkTail)`` under ``local[1]`` and ``local[2]``
(a fresh SparkSession each), after one warm-up job per session (a hazard fit: JVM JIT, Python
workers).
Reported per master:

* ``tail_s``: the distributed part (hazard training positions + per-block predictions with
  ``hazard_boot`` refits, on the executors; the hazard fit and the assembly on the driver);
* ``driver_s``: the rest of ``run_all`` (reads of the driver columns, aggregate bootstrap,
  utilization, calibration, cost, planner), single-threaded on the driver;
* ``job_s``: the fixed cost of one trivial Spark job (a count of ``runs``), the per-job floor;
* rows/s = request-steps of the estimated run / seconds, for the tail part and end to end;

and the single-machine path (``run_all`` over the DuckDB file) for reference. The ratio
``local[2] / local[1]`` of tail rows/s is the measured speed-up from a second executor core.
The host is shared (2 cores, other work running): wall seconds are noisy, run it twice.

Usage::

    .venv/bin/python bench/spark.py [--requests 3000] [--masters 'local[1],local[2]'] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def make_lake(root: Path, n_requests: int, seed: int = 0) -> tuple[Path, Path, int]:
    from acceptscope.export import export_parquet
    from acceptscope.store import Store
    from estimators.synthetic import compact_view, simulate

    sim = simulate(n_requests=n_requests, seed=seed)
    t = dict(sim.tables)
    db = root / "syn.duckdb"
    st = Store(db)
    st.append(t)
    runs = st.query_df("SELECT * FROM runs WHERE run_id = 'syn-cap'")
    run = runs.iloc[0].to_dict()
    run.update(run_id="syn-compact", arm="compact")
    rs = compact_view(t["request_steps"], run_id="syn-compact")
    steps = t["steps"].assign(run_id="syn-compact")
    st.append({"runs": [{k: (None if v != v else v) for k, v in run.items()}], "request_steps": rs, "steps": steps})
    lake = root / "lake"
    export_parquet(st, None, lake)
    return db, lake, len(rs)


def _worst_rel(a, b, skip=("fit_seconds",)) -> tuple[float, int]:
    """Largest relative difference between the numbers of two JSON trees (same shape asserted)."""
    if isinstance(a, dict):
        assert set(a) == set(b)
        got = [_worst_rel(a[k], b[k]) for k in a if k not in skip]
    elif isinstance(a, list):
        assert len(a) == len(b)
        got = [_worst_rel(x, y) for x, y in zip(a, b)]
    elif isinstance(a, float) and isinstance(b, (int, float)):
        return (0.0 if a == b else abs(a - b) / max(abs(a), abs(b))), 1
    else:
        assert a == b, (a, b)
        return 0.0, 1
    return max([g[0] for g in got], default=0.0), sum(g[1] for g in got)


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--requests", type=int, default=3000)
    ap.add_argument("--masters", default="local[1],local[2]")
    ap.add_argument("--run", default="syn-compact")
    ap.add_argument("--json", type=Path)
    a = ap.parse_args(argv)

    from acceptscope.store import Store
    from estimators import run_all, to_jsonable
    from estimators.spark import LakeStore, SparkTail, spark_session

    root = Path(tempfile.mkdtemp(prefix="acceptscope-spark-bench-"))
    t0 = time.perf_counter()
    db, lake, n = make_lake(root, a.requests)
    print(f"lake: {n} request-steps in {a.run} ({time.perf_counter() - t0:.1f} s to simulate + export) at {lake}")

    t0, c0 = time.perf_counter(), time.process_time()
    local = to_jsonable(run_all(Store(db), a.run))
    local_s, local_cpu = time.perf_counter() - t0, time.process_time() - c0
    rs_bytes = sum(p.stat().st_size for p in (lake / "request_steps").rglob("*.parquet"))
    out = {"request_steps": n, "requests": a.requests, "local_duckdb_s": local_s, "local_duckdb_cpu_s": local_cpu, "masters": {},
           "lake_request_steps_bytes_per_row": rs_bytes / (2 * n)}
    print(f"request_steps on disk: {rs_bytes / (2 * n):.0f} B/row (Parquet, zstd)")

    for master in a.masters.split(","):
        spark = spark_session(master)
        try:
            store = LakeStore(spark, lake)
            timing = {}

            class Timed(SparkTail):
                def fit(self, *args, **kw):
                    t, c = time.perf_counter(), time.process_time()
                    r = super().fit(*args, **kw)
                    timing["fit"] = time.perf_counter() - t
                    timing["fit_driver_cpu"] = time.process_time() - c
                    return r

                def estimate(self, *args, **kw):
                    t, c = time.perf_counter(), time.process_time()
                    r = super().estimate(*args, **kw)
                    timing["estimate"] = time.perf_counter() - t
                    timing["estimate_driver_cpu"] = time.process_time() - c
                    return r

            gamma = int(store.query_df("SELECT gamma FROM runs WHERE run_id = ?", [a.run]).gamma.iloc[0])
            SparkTail(store).fit(store, ["syn-cap"], None, gamma)  # warm-up: JIT, Python workers
            t = time.perf_counter()
            store.query_df("SELECT count(*) AS n FROM runs")
            job_s = time.perf_counter() - t
            t, c = time.perf_counter(), time.process_time()
            eng = Timed(store)
            dist = run_all(store, a.run, tail_engine=eng)
            total, driver_cpu = time.perf_counter() - t, time.process_time() - c
            worst, nvals = _worst_rel(local, to_jsonable(dist))
        finally:
            spark.stop()
        tail_s = timing["fit"] + timing["estimate"]
        out["masters"][master] = dict(total_s=total, tail_s=tail_s, fit_s=timing["fit"], estimate_s=timing["estimate"],
                                          driver_s=total - tail_s, job_s=job_s,
                                          tail_rows_per_s=n / tail_s, end_to_end_rows_per_s=n / total,
                                          driver_cpu_s=driver_cpu, equal_values=nvals, worst_rel_diff_vs_local=worst, **{k: v for k, v in timing.items() if "cpu" in k},
                                          **eng.stats)
        print(f"{master:>9}: end to end {total:6.1f} s ({n / total:8.0f} rows/s); tail (fit {timing['fit']:.1f} s + "
              f"estimate {timing['estimate']:.1f} s) {n / tail_s:8.0f} rows/s; driver rest {total - tail_s:.1f} s; "
              f"one trivial job {job_s:.2f} s")
        st = eng.stats
        ex = st["fit_executor_cpu_s"] + st["estimate_executor_cpu_s"] + st.get("refit_executor_cpu_s", 0)
        print(f"{'':>9}  executor CPU {ex:.2f} s ({1e6 * ex / n:.0f} us/row: fit {st['fit_executor_cpu_s']:.2f} s, "
              f"{st.get('refit_tasks', 0)} hazard refits {st.get('refit_executor_cpu_s', 0):.2f} s, "
              f"estimate {st['estimate_executor_cpu_s']:.2f} s); driver CPU {driver_cpu:.2f} s "
              f"({1e6 * driver_cpu / n:.0f} us/row; tail part {timing['fit_driver_cpu'] + timing['estimate_driver_cpu']:.2f} s); "
              f"collected {eng.stats['fit_bytes_collected'] / n:.0f} + {eng.stats['estimate_bytes_collected'] / n:.0f} B/row")
        print(f"{'':>9}  JSON vs the single-machine path: {nvals} values, worst relative difference {worst:.3g}")
    ms = list(out["masters"])
    if len(ms) >= 2:
        r = out["masters"][ms[-1]]["tail_rows_per_s"] / out["masters"][ms[0]]["tail_rows_per_s"]
        e = out["masters"][ms[-1]]["end_to_end_rows_per_s"] / out["masters"][ms[0]]["end_to_end_rows_per_s"]
        out["ratio_tail"], out["ratio_end_to_end"] = r, e
        print(f"{ms[-1]} / {ms[0]}: tail rows/s x{r:.2f}, end to end x{e:.2f}")
    print(f"single machine (DuckDB file, run_all): {local_s:.1f} s ({n / local_s:.0f} rows/s), CPU {local_cpu:.1f} s")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
