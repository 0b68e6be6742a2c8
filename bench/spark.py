"""The lake estimators on Spark: request-steps per second with 1 and 2 executor cores, side by side.

A synthetic fleet-shaped lake (estimators.synthetic: a cap-accept run and the compact view of
the same draws, engine schema, written by ``export_parquet``) is estimated with
``run_lake(LakeStore, SparkTail, "syn-compact")`` under ``local[1]`` and ``local[2]`` (a fresh
SparkSession each, after a warm-up job: JVM JIT, Python workers). Reported per master:

* ``total_s`` / rows/s end to end (``run_lake``: hazard fit, refits, the executors' reduction,
  the driver's merge, bootstrap, cost, calibration, planner);
* ``reduce_s`` / rows/s of the executors' pass (walk, per-block predictions, per-request sums),
  the part that scales with executors;
* executor CPU per row (the per-row cost used for the N-node extrapolation in docs/scale.md)
  and the bytes that came back to the driver per row;
* ``job_s``: one trivial Spark job (the per-job floor).

and the single-machine path (``run_all`` over the DuckDB file) for reference, with the
JSON equality (values compared, worst relative difference). The host is shared (2 cores,
other work running): wall seconds are noisy, compare ratios within one run.

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
    from acceptscope.estimators.synthetic import compact_view, simulate

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
    ap.add_argument("--dir", help="where the lake is written (default: the temp directory)")
    a = ap.parse_args(argv)

    from acceptscope.store import Store
    from acceptscope.estimators import run_all, to_jsonable
    from acceptscope.estimators.spark import LakeStore, SparkTail, run_lake, spark_session, sts_fit_lake

    root = Path(tempfile.mkdtemp(prefix="acceptscope-spark-bench-", dir=a.dir))
    t0 = time.perf_counter()
    db, lake, n = make_lake(root, a.requests)
    print(f"lake: {n} request-steps in {a.run} ({time.perf_counter() - t0:.1f} s to simulate + export) at {lake}")

    t0, c0 = time.perf_counter(), time.process_time()
    local = to_jsonable(run_all(Store(db), a.run))
    local_s, local_cpu = time.perf_counter() - t0, time.process_time() - c0
    from acceptscope.estimators import load_run
    from acceptscope.estimators.calibration import StsCalibrator, calibration_data

    d = calibration_data(load_run(Store(db), "syn-cap")["request_steps"], "realized")
    sts_local = StsCalibrator("smooth-nll").fit(d.z, d.y).temperatures_
    rs_bytes = sum(p.stat().st_size for p in (lake / "request_steps").rglob("*.parquet"))
    out = {"request_steps": n, "requests": a.requests, "local_duckdb_s": local_s, "local_duckdb_cpu_s": local_cpu, "masters": {},
           "lake_request_steps_bytes_per_row": rs_bytes / (2 * n)}
    print(f"request_steps on disk: {rs_bytes / (2 * n):.0f} B/row (Parquet, zstd)")

    for master in a.masters.split(","):
        spark = spark_session(master)
        try:
            store = LakeStore(spark, lake)
            store.query_df("SELECT count(*) AS n FROM request_steps")  # warm-up: JIT, Python workers
            t = time.perf_counter()
            store.query_df("SELECT count(*) AS n FROM runs")
            job_s = time.perf_counter() - t
            eng = SparkTail(store)
            t, c = time.perf_counter(), time.process_time()
            dist = to_jsonable(run_lake(store, eng, a.run))
            total, driver_cpu = time.perf_counter() - t, time.process_time() - c
            worst, nvals = _worst_rel(local, dist)
            t = time.perf_counter()
            sts = sts_fit_lake(store, "syn-cap", "realized", "smooth-nll")
            sts_s = time.perf_counter() - t
        finally:
            spark.stop()
        st = eng.stats
        ex = st["fit_executor_cpu_s"] + st["reduce_executor_cpu_s"] + st.get("refit_executor_cpu_s", 0)
        back = st["fit_bytes_collected"] + st["reduce_bytes_collected"]
        out["masters"][master] = dict(total_s=total, end_to_end_rows_per_s=n / total, reduce_s=st["reduce_wall_s"],
                                      reduce_rows_per_s=n / st["reduce_wall_s"], job_s=job_s, driver_cpu_s=driver_cpu,
                                      executor_cpu_s=ex, executor_us_per_row=1e6 * ex / n,
                                      bytes_to_driver=back, bytes_to_driver_per_row=back / n,
                                      equal_values=nvals, worst_rel_diff_vs_local=worst, sts_fit_s=sts_s,
                                      sts_cells=sts["cells"], sts_samples=sts["num_samples"],
                                      sts_worst_rel_vs_local=float(max(abs(a / b - 1) for a, b in
                                                                       zip(sts["temperatures"], sts_local))), **st)
        print(f"{master:>9}: end to end {total:6.1f} s ({n / total:8.0f} rows/s); executors' reduction "
              f"{st['reduce_wall_s']:.1f} s ({n / st['reduce_wall_s']:8.0f} rows/s); one trivial job {job_s:.2f} s")
        print(f"{'':>9}  executor CPU {ex:.2f} s ({1e6 * ex / n:.1f} us/row: fit {st['fit_executor_cpu_s']:.2f} s, "
              f"{st.get('refit_tasks', 0)} hazard refits {st.get('refit_executor_cpu_s', 0):.2f} s in "
              f"{st.get('refit_wall_s', 0):.1f} s, reduction {st['reduce_executor_cpu_s']:.2f} s); driver CPU "
              f"{driver_cpu:.2f} s; back to the driver {back / 1e3:.0f} kB ({back / n:.1f} B/row: training positions "
              f"{st['fit_bytes_collected'] / 1e3:.0f} kB, {st['reduce_partitions']} partition payloads "
              f"{st['reduce_bytes_collected'] / 1e3:.0f} kB)")
        print(f"{'':>9}  JSON vs the single-machine path: {nvals} values, worst relative difference {worst:.3g}")
        m = out["masters"][master]
        print(f"{'':>9}  STS fit (syn-cap, realized, smooth-nll): {sts_s:.1f} s, {sts['num_samples']} samples in "
              f"{sts['cells']} cells over {len(sts_local)} positions; worst relative difference to the local fit "
              f"{m['sts_worst_rel_vs_local']:.3g}")
    ms = list(out["masters"])
    if len(ms) >= 2:
        r = out["masters"][ms[-1]]["reduce_rows_per_s"] / out["masters"][ms[0]]["reduce_rows_per_s"]
        e = out["masters"][ms[-1]]["end_to_end_rows_per_s"] / out["masters"][ms[0]]["end_to_end_rows_per_s"]
        out["ratio_reduce"], out["ratio_end_to_end"] = r, e
        print(f"{ms[-1]} / {ms[0]}: executors' reduction rows/s x{r:.2f}, end to end x{e:.2f}")
    print(f"single machine (DuckDB file, run_all): {local_s:.1f} s ({n / local_s:.0f} rows/s), CPU {local_cpu:.1f} s")
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))
    return out


if __name__ == "__main__":
    main()
