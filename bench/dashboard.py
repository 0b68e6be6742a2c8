"""Dashboard panels and ``report`` on big runs: per-panel p50/p95, process peak RSS, growth with rows.

How the store is built: one synthetic audit pair from :func:`estimators.synthetic.simulate`
(400 requests, about 10k request-steps): ``big-cap`` (cap-accept) and ``big-c`` (its compact
view, same requests, so the arms pair by ``(workload, prompt_index, seed)``). Both runs are grown
to each size by appending copies with fresh keys (``rid.<copy>``, ``forward_ct`` shifted by whole
copies, request ``seed`` shifted per copy) through ``Store.write_arrow``, the path every writer
takes, so the summaries are maintained as a real capture would maintain them; the time spent in
``summaries.add`` is reported next to the whole write (the maintenance overhead).

At each size (request-steps *per run*, two runs selected), one child process plays the dashboard:
it calls every panel's data function (``acceptscope.reader.Reader`` methods, ``acceptscope.figures.tables.reliability_bins``,
``audit_sampling.infer_runs``) ``--repeats`` times, in the order a page render makes them, and
reports p50/p95 per panel and its peak RSS (``VmHWM``). A second child does the same with the
summaries treated as stale (``raw`` column: what a store written before schema version 2 costs,
i.e. the pre-summary queries). A third runs ``acceptscope report --no-estimators`` and reports its
wall time and peak RSS.

Usage::

    .venv/bin/python bench/dashboard.py --sizes 100000,1000000,5000000 \\
        --workdir /work/scratch-s2-15d/dash [--repeats 20] [--raw-repeats 3] [--skip raw,report]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.compute as pc

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.scale import cli, run_child  # noqa: E402  (one child-process harness for the benches)
RUNS = ("big-c", "big-cap")
TABLES = ("request_steps", "steps", "requests")

_PANELS = r"""
import json, sys, time
import numpy as np
db, reps, raw = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "raw"
from acceptscope import audit_sampling, summaries
if raw:  # every run counts as stale: the panels aggregate the raw tables (a store from before v2)
    summaries.freshness.stale_runs = lambda con, run_ids=None: set(run_ids or [])
from acceptscope.figures import tables as figures
from acceptscope.reader import Reader
ids = ["big-c", "big-cap"]
r = Reader(db)
rid = r.df("SELECT rid FROM requests WHERE run_id = 'big-cap' LIMIT 1")["rid"].iloc[0]
one_workload = [r.df("SELECT workload FROM sum_cells WHERE run_id = 'big-cap' LIMIT 1")["workload"].iloc[0]]
calls = {
    "data_version": lambda: r.data_version(),
    "runs": lambda: r.runs(),
    "run_summary": lambda: r.run_summary(ids),
    "data_quality": lambda: r.data_quality(ids),
    "window_distribution": lambda: r.window_distribution(ids),
    "reliability_bins": lambda: figures.reliability_bins(r, ["big-cap"]),
    "position_acceptance": lambda: r.position_acceptance(ids),
    "utilization_by_workload": lambda: r.utilization_by_workload(ids),
    "sampling_inference": lambda: audit_sampling.infer_runs(r, "big-c", "big-cap"),
    "regime_by_workload": lambda: r.regime_by_workload(["big-cap"]),
    "step_costs": lambda: r.step_costs(ids, 20_000),  # app/panels/cost.py's MAX_POINTS
    # the drill-down: a count and a page of 1,000 (drilldown.PAGE); a tree from before paging read 5,000
    "requests": (lambda: (r.request_count("big-cap"), r.requests("big-cap", 1000))) if hasattr(r, "request_count")
                else (lambda: r.requests("big-cap")),
    "request_steps": lambda: r.request_steps("big-cap", rid),
    # the sidebar's workload filter (one workload selected)
    "run_summary[workload]": lambda: r.run_summary(ids, one_workload),
    "reliability_bins[workload]": lambda: figures.reliability_bins(r, ["big-cap"], workloads=one_workload),
    "position_acceptance[workload]": lambda: r.position_acceptance(ids, one_workload),
}
cold = {}
for k, f in calls.items():  # first call of each: imports (scipy.stats for the bootstrap), DuckDB start-up
    t0 = time.perf_counter(); f(); cold[k] = time.perf_counter() - t0
ts = {k: [] for k in calls}
for _ in range(reps):
    for k, f in calls.items():
        t0 = time.perf_counter(); f(); ts[k].append(time.perf_counter() - t0)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"panels": {k: [float(np.percentile(v, 50)), float(np.percentile(v, 95))] for k, v in ts.items()},
                  "cold": cold,
                  "peak_mb": int(hwm) / 1024}))
"""

def base_tables() -> dict[str, dict[str, pa.Table]]:
    """The two runs' template tables (one audit pair), as Arrow in the record model's types."""
    from acceptscope import schema
    from acceptscope.estimators.synthetic import compact_view, simulate

    t = simulate(n_requests=400, seed=1).tables
    cap = {k: t[k] for k in ("runs", *TABLES)}
    com = {k: v.assign(run_id="big-c") for k, v in cap.items()}
    com["request_steps"] = compact_view(com["request_steps"])
    com["runs"] = com["runs"].assign(arm="compact")
    cap = {k: v.assign(run_id="big-cap") for k, v in cap.items()}
    for d in (cap, com):
        d["runs"] = d["runs"].assign(audit_group="bench-dashboard")
    return {run: {k: schema.as_arrow(schema.table(k), v) for k, v in d.items()} for run, d in zip(RUNS, (com, cap))}


def copy_of(base: dict[str, pa.Table], i: int, span: int) -> dict[str, pa.Table]:
    """Copy ``i`` of a run's tables with fresh keys: a later stretch of traffic with its own requests."""
    out = {}
    suffix = f".{i}"
    for name in TABLES:
        t = base[name]
        if "rid" in t.column_names:
            j = t.column_names.index("rid")
            t = t.set_column(j, "rid", pc.binary_join_element_wise(t.column("rid"), pa.scalar(suffix), ""))
        if "forward_ct" in t.column_names:
            j = t.column_names.index("forward_ct")
            t = t.set_column(j, "forward_ct", pc.add(t.column("forward_ct"), pa.scalar(i * span, pa.int64())))
        if name == "requests":
            j = t.column_names.index("seed")
            t = t.set_column(j, "seed", pc.add(pc.fill_null(t.column("seed"), 0), pa.scalar(i * 1_000_003, pa.int64())))
        out[name] = t
    return out


def grow(store, bases: dict, span: int, have: int, want: int, per_write: int = 20) -> dict:
    """Append copies ``have .. want-1`` of both runs through ``Store.write_arrow``; time it and the summaries' share."""
    from acceptscope import summaries

    spent = [0.0]
    add = summaries.add

    def timed_add(*a, **k):  # measure the maintenance inside the real write (not a stand-in)
        t0 = time.perf_counter()
        try:
            return add(*a, **k)
        finally:
            spent[0] += time.perf_counter() - t0

    summaries.add = timed_add
    rows = 0
    t0 = time.perf_counter()
    try:
        for a in range(have, want, per_write):
            parts: dict[str, list] = {k: [] for k in TABLES}
            for i in range(a, min(want, a + per_write)):
                for run in RUNS:
                    for k, v in copy_of(bases[run], i, span).items():
                        parts[k].append(v)
            got = store.write_arrow({k: pa.concat_tables(v) for k, v in parts.items()})
            rows += got["request_steps"]
    finally:
        summaries.add = add
    return {"written_request_steps": rows, "write_s": time.perf_counter() - t0, "summaries_s": spent[0]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,1000000,5000000", help="request-steps per run")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/acceptscope-dashboard"))
    ap.add_argument("--repeats", type=int, default=20)
    ap.add_argument("--raw-repeats", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=1800)
    ap.add_argument("--skip", default="", help="comma list of: raw, report")
    ap.add_argument("--baseline", nargs=2, metavar=("TREE", "DB"),
                    help="also run the panel child with TREE's code (an older checkout) on DB (a copy of the store "
                         "that TREE can read), alternating with this tree's, for a side-by-side table")
    ap.add_argument("--reuse", action="store_true",
                    help="keep WORKDIR's store from an earlier run and only append the copies it lacks "
                         "(measure new code on the same file; its first read-write open upgrades its summaries)")
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    sys.path.insert(0, str(ROOT))
    from acceptscope.store import Store

    a.workdir.mkdir(parents=True, exist_ok=True)
    db = a.workdir / "dashboard.duckdb"
    reuse = a.reuse and db.exists()
    if not reuse:
        for p in (db, Path(str(db) + ".wal")):
            p.unlink(missing_ok=True)
    bases = base_tables()
    per_copy = bases["big-cap"]["request_steps"].num_rows
    span = int(pc.max(bases["big-cap"]["request_steps"].column("forward_ct")).as_py()) + 1
    t0 = time.perf_counter()
    store = Store(db)
    if reuse:
        copies = store.counts("big-cap")["request_steps"] // per_copy
        print(json.dumps({"reused_copies": copies, "open_s": time.perf_counter() - t0}), flush=True)
    else:
        store.write_arrow({"runs": pa.concat_tables([bases[r]["runs"] for r in RUNS])})
        copies = 0
    results = []
    for size in (int(s) for s in a.sizes.split(",")):
        want = max(1, round(size / per_copy))
        w = grow(store, bases, span, copies, want)
        copies = max(copies, want)
        n = copies * per_copy
        row = {"rows_per_run": n, **w, "db_mb": db.stat().st_size / 2**20}
        print(json.dumps(row), flush=True)
        if a.baseline:  # alternate baseline / this tree, 3 children each, so both see the same machine load
            runs = {"baseline": [], "summary": []}
            for _ in range(3):
                runs["baseline"].append(run_child(_PANELS, [a.baseline[1], str(a.repeats), "summary"], a.timeout,
                                                  tree=a.baseline[0]))
                runs["summary"].append(run_child(_PANELS, [str(db), str(a.repeats), "summary"], a.timeout))
            for k, got in runs.items():
                row[k] = _merge(got)
                print(json.dumps({"rows_per_run": n, k: row[k]}), flush=True)
        else:
            row["summary"] = run_child(_PANELS, [str(db), str(a.repeats), "summary"], a.timeout)
            print(json.dumps({"rows_per_run": n, "summary": row["summary"]}), flush=True)
        if "raw" not in skip:
            row["raw"] = run_child(_PANELS, [str(db), str(a.raw_repeats), "raw"], a.timeout)
            print(json.dumps({"rows_per_run": n, "raw": row["raw"]}), flush=True)
        if "report" not in skip:
            row["report"] = cli(["report", "--db", str(db), "--run", RUNS[0], "--run", RUNS[1], "--no-estimators",
                                 "-o", str(a.workdir / "report.html")], a.timeout)
            print(json.dumps({"rows_per_run": n, "report": row["report"]}), flush=True)
        results.append(row)
    print_table(results)


def _merge(got: list[dict]) -> dict:
    """One child's result from several: per panel the median p50 and the median p95, the highest peak."""
    import statistics

    ok = [g for g in got if "panels" in g]
    if not ok:
        return got[-1]
    panels = {k: [statistics.median(g["panels"][k][0] for g in ok), statistics.median(g["panels"][k][1] for g in ok)]
              for k in ok[0]["panels"]}
    return {"panels": panels, "peak_mb": max(g["peak_mb"] for g in ok), "children": len(ok)}


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x * 1e3:,.0f}"


def print_table(results: list[dict]) -> None:
    sizes = [r["rows_per_run"] for r in results]
    names = list(next((r["summary"]["panels"] for r in results if "panels" in r.get("summary", {})), {}))
    head = "panel (ms, two runs selected)".ljust(32) + "".join(
        (f"{'before p50/p95':>16}" if any("baseline" in r for r in results) else "") +
        f"{f'{n / 1e6:g}M p50/p95':>18}" + (f"{'raw p50':>9}" if any("raw" in r for r in results) else "")
        for n in sizes)
    print("\n" + head)
    for name in names:
        line = name.ljust(32)
        for r in results:
            if any("baseline" in x for x in results):
                b = r.get("baseline", {}).get("panels", {}).get(name)
                line += f"{(_ms(b[0]) + ' / ' + _ms(b[1])) if b else '-':>16}"
            p = r.get("summary", {}).get("panels", {}).get(name)
            line += f"{(_ms(p[0]) + ' / ' + _ms(p[1])) if p else '-':>18}"
            if "raw" in r:
                q = r["raw"].get("panels", {}).get(name)
                line += f"{_ms(q[0]) if q else '-':>9}"
        print(line)
    if any("baseline" in r for r in results):
        print("baseline peak RSS (MB)".ljust(32) + "".join(f"{r.get('baseline', {}).get('peak_mb', float('nan')):>16,.0f}"
                                                         for r in results))
    for label, key in (("dashboard peak RSS (MB)", "summary"), ("raw-path peak RSS (MB)", "raw")):
        if any(key in r for r in results):
            print(label.ljust(32) + "".join(f"{r.get(key, {}).get('peak_mb', float('nan')):>18,.0f}" +
                                            (" " * 9 if any("raw" in x for x in results) else "") for r in results))
    if any("report" in r for r in results):
        print("report --no-estimators".ljust(32) + "".join(
            f"{r['report'].get('seconds', float('nan')):>10,.1f} s {r['report'].get('peak_mb', float('nan')):>5,.0f}MB"
            + (" " * 9 if any("raw" in x for x in results) else "") for r in results))
    print("write: " + "; ".join(f"{r['rows_per_run'] / 1e6:g}M/run: {r['write_s']:,.1f} s total, "
                                f"{r['summaries_s']:,.1f} s in summaries.add ({r['summaries_s'] / max(r['write_s'], 1e-9):.0%})"
                                for r in results))


if __name__ == "__main__":
    main()
