"""Growth of time and peak memory with store size: estimate, report, each dashboard panel query, ingest.

How the stores are built: a synthetic truth run (``syn-cap``, cap-accept, 400 requests: the
tail estimator's hazards are fitted on it) and a synthetic compact run (``syn-c``) from
:func:`estimators.synthetic.simulate`; the compact run is then grown *inside DuckDB* by copying
its request-steps, steps and requests with fresh keys (``rid.<copy>``, ``forward_ct`` shifted by
whole copies, so every copy is a later stretch of traffic with its own requests and decode
steps). One store is grown through the sizes, so each size reuses the previous one.

Every measurement is a child process (``python -c``) that reports its wall and CPU seconds and
``VmHWM`` (peak RSS since exec, read from /proc/self/status at the end; ``ru_maxrss`` would
carry the parent's peak over ``execve``):

* ``estimate``: ``acceptscope estimate --db S --run syn-c --json`` (200 bootstrap replicates);
* ``report``: ``acceptscope report --db S --run syn-c --run syn-cap`` (estimators on);
* ``panel:<name>``: each dashboard query the panels make (``acceptscope.reader.Reader`` methods,
  ``acceptscope.figures.tables.reliability_bins``) for the run, best and worst of ``--panel-repeats``;
* ``--page-tail``: then ``requests`` (first and middle page) again once new requests rows written through the
  store leave ``syn-c`` with the longest unsorted drill-down tail a writer keeps before it sorts the run again;
* ``ingest``: ``acceptscope ingest`` of a synthetic SGLang ``/server_info`` dump
  (:func:`acceptscope.ingest.synth.make_server_info`) of about the same number of request-steps,
  for sizes up to ``--ingest-max``.

``--many-runs N``: a store of N small runs instead (copies, inside DuckDB, of a synthetic audit pair
``syn-cap`` / ``syn-c`` of ``--many-requests`` requests each, every table's run ids suffixed, one
audit group per copy); ``estimate`` over all of them, timed side by side in child processes: one
:func:`estimators.run_all` per run (``per-run``: the path before issue 15) and
:func:`estimators.run_all_runs` (``one-pass``: one ordered scan of ``request_steps`` for every run,
the side tables read once per table); seconds per run, CPU seconds, peak RSS, and whether the two
give the same JSON.

``--phases S``: one streamed estimate of ``syn-c`` in store ``S`` in a child process that samples its
VmRSS every 50 ms and prints the peak of each phase (ordered scan, hazard fit, side tables, chunk,
utilization, calibration, cost fit, planner, json): where the peak is, not only how big.

Rows are JSON lines on stdout (and in ``--out``); the table at the end fits ``time = a * rows^b``
and ``peak = c + d * rows`` per command on the measured sizes and extrapolates to 100M
request-steps (an extrapolation, labelled as such).

Usage::

    .venv/bin/python bench/scale.py --sizes 100000,300000,1000000,3000000,10000000 --workdir /tmp/scale \
        [--out scale.jsonl] [--timeout 900] [--skip report,ingest]
    .venv/bin/python bench/scale.py --sizes 100000000 --workdir /tmp/scale --reuse --skip panels,ingest \
        --report-max 100000000 --timeout 9000     # 100M: ~11.5 GB of store, ~21 GB of sort spill in $TMPDIR
    .venv/bin/python bench/scale.py --sizes 100000000 --workdir /tmp/scale --reuse --skip estimate,report,ingest \
        --page-tail                                # the panels, then requests with a writer's longest unsorted tail
    .venv/bin/python bench/scale.py --many-runs 200 --workdir /tmp/scale
    .venv/bin/python bench/scale.py --phases /tmp/scale/scale.duckdb [--stream-kw '{"chunk_rows": 131072}']
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

_CHILD = r"""
import json, sys, time, os
sys.argv = ["acceptscope"] + json.loads(sys.argv[1])
t0, c0 = time.perf_counter(), time.process_time()
rc = 0
out = open(os.devnull, "w")
so = sys.stdout
sys.stdout = out
try:
    from acceptscope.cli import main
    main()
except SystemExit as e:
    rc = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
sys.stdout = so
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                  "peak_mb": int(hwm) / 1024, "rc": rc}))
"""

_REBUILD = r"""
import json, sys, time
t0, c0 = time.perf_counter(), time.process_time()
from acceptscope.store import Store
st = Store(sys.argv[1])
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"seconds": time.perf_counter() - t0, "cpu_seconds": time.process_time() - c0,
                  "peak_mb": int(hwm) / 1024, "rc": 0, "rebuilt": len(st.rebuilt_summaries or [])}))
"""

_PANEL = r"""
import json, sys, time
db, name, runs, reps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
from acceptscope.reader import Reader
from acceptscope import audit_sampling  # (imported before the clock: the worst call is a cold query, not an import)
from acceptscope.figures import tables as figures
r = Reader(db)
middle = r.request_count(runs[0]) // 2 if name == "requests@middle" else 0
def call():
    if name == "reliability_bins":
        return figures.reliability_bins(r, runs)
    if name == "sampling_inference":
        try:
            return audit_sampling.infer_runs(r, runs[0], runs[1])
        except ValueError as e:
            return str(e)
    if name == "requests":
        return r.requests(runs[0])
    if name == "requests@middle":  # the page halfway down the run's requests
        return r.requests(runs[0], offset=middle)
    if name == "step_costs":  # as the Cost panel asks: app/panels/cost.py's MAX_POINTS per run
        return r.step_costs(runs, 20_000)
    return getattr(r, name)(runs)
ts = []
for _ in range(reps):
    t0 = time.perf_counter(); call(); ts.append(time.perf_counter() - t0)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
ts.sort()
print(json.dumps({"seconds": ts[len(ts) // 2], "best_s": ts[0], "worst_s": ts[-1], "peak_mb": int(hwm) / 1024, "rc": 0}))
"""

_MANY = r"""
import json, sys, time, os
db, mode, n_boot = sys.argv[1], sys.argv[2], int(sys.argv[3])
from acceptscope.store import Store
from acceptscope import estimators
st = Store(db, read_only=True)
ids = sorted(st.runs().run_id)
t0, c0 = time.perf_counter(), time.process_time()
if mode == "per-run":
    out = {}
    for r in ids:
        try:
            out[r] = estimators.to_jsonable(estimators.run_all(st, r, n_boot=n_boot))
        except (ValueError, KeyError) as e:
            out[r] = {"error": str(e)}
else:
    out = {r: {"error": str(v)} if isinstance(v, Exception) else estimators.to_jsonable(v)
           for r, v in estimators.run_all_runs(st, ids, n_boot=n_boot).items()}
sec, cpu = time.perf_counter() - t0, time.process_time() - c0
json.dump(out, open(sys.argv[4], "w"), sort_keys=True, default=str)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
print(json.dumps({"seconds": sec, "cpu_seconds": cpu, "runs": len(ids), "s_per_run": sec / len(ids),
                  "cpu_s_per_run": cpu / len(ids), "peak_mb": int(hwm) / 1024, "rc": 0}))
"""

_PHASES = r"""
import json, os, sys, threading, time
from acceptscope import estimators
import acceptscope.estimators.accumulator as A
import acceptscope.estimators.stream as S
from acceptscope.store import Store
phase, peaks = ["start"], {}
def rss():
    return int([l for l in open("/proc/self/status") if l.startswith("VmRSS")][0].split()[1]) / 1024
def sample():
    while True:
        p = phase[-1]
        peaks[p] = max(peaks.get(p, 0), rss())
        time.sleep(0.05)
threading.Thread(target=sample, daemon=True).start()
def wrap(owner, name, tag):
    f = getattr(owner, name)
    def g(*a, **k):
        phase.append(tag)
        try:
            return f(*a, **k)
        finally:
            phase.pop()
    setattr(owner, name, g)
import acceptscope.estimators.pipeline as P
for owner, n, t in ((S, "fit_hazards", "hazard fit"), (S, "run_side", "side tables"), (S, "read_steps", "steps read"),
                    (P, "fit_calibration", "calibration"), (P, "fit_cost", "cost fit"), (S, "planner_window", "planner")):
    wrap(owner, n, t)
wrap(A.RunAccumulator, "add", "chunk")
wrap(A.RunAccumulator, "utilization_result", "utilization")
phase.append("ordered scan")
c0 = time.process_time()
out = S.run_all_stream(Store(sys.argv[1], read_only=True), [sys.argv[2]], **json.loads(sys.argv[3]))
phase.append("json")
estimators.to_jsonable(out[sys.argv[2]])
time.sleep(0.2)
print(json.dumps({"cpu_seconds": time.process_time() - c0, "peak_mb_by_phase": {k: round(v) for k, v in peaks.items()}, "rc": 0}))
"""

PANELS = ("run_summary", "window_distribution", "position_acceptance", "utilization_by_workload", "step_costs",
          "requests", "data_quality", "reliability_bins", "sampling_inference")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="100")


def run_child(code: str, args: list[str], timeout: float, tree: str | Path | None = None) -> dict:
    """Run ``code`` in a fresh interpreter (``python -c code args``): the last JSON line it prints, or its exit
    code and error. ``tree``: another checkout, its code alone on the path (a baseline); default this one."""
    env = _env() if tree is None else dict(os.environ, PYTHONPATH=str(tree), COLUMNS="100")
    try:
        r = subprocess.run([PY, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=env,
                           cwd=tree or ROOT)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "seconds": timeout}
    lines = [x for x in r.stdout.strip().splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"rc": r.returncode, "error": (r.stderr or r.stdout)[-600:]}
    return json.loads(lines[-1])


def cli(args: list[str], timeout: float) -> dict:
    return run_child(_CHILD, [json.dumps(args)], timeout)


def build_base(db: Path) -> int:
    """The template store: truth run ``syn-cap`` and compact run ``syn-c``; returns syn-c's rows."""
    from acceptscope.store import Store
    from acceptscope.estimators.synthetic import compact_view, simulate

    st = Store(db)
    st.append(simulate(n_requests=400, seed=1).tables)
    t = dict(simulate(n_requests=400, seed=2, run_id="syn-c").tables)
    t["request_steps"], t["runs"] = compact_view(t["request_steps"]), t["runs"].assign(arm="compact")
    st.append(t)
    import duckdb

    con = duckdb.connect(str(db))
    for tb in ("request_steps", "steps", "requests"):
        con.execute(f"CREATE TABLE base_{tb} AS SELECT * FROM {tb} WHERE run_id = 'syn-c'")
    n = con.execute("SELECT count(*) FROM base_request_steps").fetchone()[0]
    con.close()
    return n


def build_many(db: Path, copies: int, n_requests: int) -> int:
    """A store of ``2 * copies`` small runs: an audit pair (truth ``syn-cap``, compact ``syn-c``) copied
    inside DuckDB with every table's run ids (and the audit group) suffixed ``.<copy>``; returns the runs."""
    import duckdb

    from acceptscope.store import Store
    from acceptscope.estimators.synthetic import compact_view, simulate

    st = Store(db)
    a = dict(simulate(n_requests=n_requests, seed=1).tables)
    a["runs"] = a["runs"].assign(audit_group="g")
    st.append(a)
    t = dict(simulate(n_requests=n_requests, seed=2, run_id="syn-c").tables)
    t["request_steps"], t["runs"] = compact_view(t["request_steps"]), t["runs"].assign(arm="compact", audit_group="g")
    st.append(t)
    del st
    con = duckdb.connect(str(db))
    tables = [r[0] for r in con.execute("SELECT table_name FROM information_schema.columns WHERE column_name = 'run_id' "
                                        "AND table_schema = 'main'").fetchall()]
    for tb in tables:
        con.execute(f"CREATE TEMP TABLE base_{tb} AS SELECT * FROM {tb}")
        con.execute(f"DELETE FROM {tb}")
        rep = "run_id || '.' || c.i AS run_id" + (", audit_group || '.' || c.i AS audit_group" if tb == "runs" else "")
        con.execute(f"INSERT INTO {tb} SELECT s.* REPLACE ({rep}) FROM base_{tb} s, range(0, {copies}) c(i)")
    con.execute("CHECKPOINT")
    n = con.execute("SELECT count(*) FROM runs").fetchone()[0]
    con.close()
    return n


def _worst_difference(a, b) -> str:
    """Whether two JSON documents match: their non-numbers equal, and the worst relative difference of their numbers."""
    worst, bad = 0.0, []

    def go(x, y, p):
        nonlocal worst
        if isinstance(x, dict) and isinstance(y, dict) and sorted(x) == sorted(y):
            for k in x:
                if "seconds" not in k:  # timings
                    go(x[k], y[k], f"{p}/{k}")
        elif isinstance(x, list) and isinstance(y, list) and len(x) == len(y):
            for i, (u, v) in enumerate(zip(x, y)):
                go(u, v, f"{p}[{i}]")
        elif isinstance(x, (int, float)) and isinstance(y, (int, float)) and not isinstance(x, bool):
            worst = max(worst, abs(x - y) / max(abs(x), abs(y), 1e-300))
        elif x != y:
            bad.append(p)

    go(a, b, "")
    return f"{len(bad)} differing non-numbers {bad[:3]}, worst relative difference {worst:.1e}"


def many_runs(a) -> None:
    """``--many-runs``: estimate over a store of many small runs, per run vs one pass (module docstring)."""
    db = a.workdir / "many.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    sys.path.insert(0, str(ROOT))
    t0 = time.perf_counter()
    n = build_many(db, max(1, a.many_runs // 2), a.many_requests)
    print(json.dumps({"what": "build (DuckDB copy)", "runs": n, "seconds": time.perf_counter() - t0}), flush=True)
    res = {}
    for mode in ("per-run", "one-pass"):
        res[mode] = run_child(_MANY, [str(db), mode, str(a.many_boot), str(a.workdir / f"many-{mode}.json")], a.timeout)
        print(json.dumps({"what": f"estimate {mode}", **res[mode]}), flush=True)
    if all(r.get("rc") == 0 for r in res.values()):
        same = _worst_difference(json.loads((a.workdir / "many-per-run.json").read_text()),
                                 json.loads((a.workdir / "many-one-pass.json").read_text()))
        b, o = res["per-run"], res["one-pass"]
        print(f"\n{n} runs: per-run {b['s_per_run']:.3f} s/run ({b['cpu_s_per_run']:.3f} CPU-s, {b['peak_mb']:.0f} MB) | "
              f"one-pass {o['s_per_run']:.3f} s/run ({o['cpu_s_per_run']:.3f} CPU-s, {o['peak_mb']:.0f} MB) | "
              f"x{b['seconds'] / o['seconds']:.2f} wall, x{b['cpu_seconds'] / o['cpu_seconds']:.2f} CPU | JSON: {same}")


def grow(db: Path, copies_now: int, copies_to: int) -> None:
    """Append copies ``copies_now .. copies_to - 1`` of the base compact run with fresh keys."""
    import duckdb

    con = duckdb.connect(str(db))
    con.execute("SET memory_limit='2GB'")
    span = con.execute("SELECT max(forward_ct) + 1 FROM base_steps").fetchone()[0] or \
        con.execute("SELECT max(forward_ct) + 1 FROM base_request_steps").fetchone()[0]
    step = 50
    for a in range(copies_now, copies_to, step):
        b = min(copies_to, a + step)
        con.execute(f"INSERT INTO request_steps SELECT s.* REPLACE (rid || '.' || c.i AS rid, forward_ct + c.i * {span} AS "
                    f"forward_ct) FROM base_request_steps s, range({a}, {b}) c(i)")
        con.execute(f"INSERT INTO steps SELECT s.* REPLACE (forward_ct + c.i * {span} AS forward_ct) "
                    f"FROM base_steps s, range({a}, {b}) c(i)")
        con.execute(f"INSERT INTO requests SELECT s.* REPLACE (rid || '.' || c.i AS rid) FROM base_requests s, range({a}, {b}) c(i)")
    con.execute("CHECKPOINT")
    con.close()


def write_page_tail(db: Path, run: str = "syn-c") -> int:
    """Leave ``run`` with the longest unsorted drill-down tail a writer leaves: new requests rows written
    through the store (``Store.write_arrow``, whose summaries update adds them unsorted), as many as stay
    under the threshold past which the writer sorts the run again. Returns the run's unsorted rows."""
    import duckdb
    import numpy as np
    import pyarrow as pa

    from acceptscope import summaries
    from acceptscope.store import Store, fetch_arrow

    with duckdb.connect(str(db), read_only=True) as con:
        n_base, tail = summaries.page_tails(con, [run])[run]
        base = fetch_arrow(con, "SELECT * FROM base_requests WHERE run_id = ?", [run])
    k = summaries.page_limit(n_base) - tail
    if k > 0:
        rows = base.take(pa.array(np.arange(k) % base.num_rows))
        rows = rows.set_column(rows.schema.get_field_index("rid"), "rid", pa.array([f"tail.{i}" for i in range(k)]))
        Store(db).write_arrow({"requests": rows})
    return tail + max(k, 0)


def ingest_row(workdir: Path, rows: int, timeout: float) -> dict:
    import msgspec

    from acceptscope.ingest.synth import make_server_info

    bs, ranks = 256, 2
    steps = max(1, rows // (bs * ranks))
    dump = workdir / f"dump-{rows}.server_info.json"
    if not dump.exists():
        dump.write_bytes(msgspec.json.encode(make_server_info(ranks=ranks, n_steps=steps, bs=bs, gamma=7,
                                                              mode="cap-accept", seed=1)))
    out = workdir / f"ingest-{rows}.duckdb"
    if out.exists():
        out.unlink()
    r = cli(["ingest", str(dump), "--db", str(out)], timeout)
    r["dump_mb"] = dump.stat().st_size / 2**20
    out.unlink(missing_ok=True)
    return r


def fit_table(rows: list[dict]) -> list[str]:
    import numpy as np

    lines = []
    by: dict = {}
    for r in rows:
        if isinstance(r.get("seconds"), (int, float)) and r.get("rc") == 0:
            by.setdefault(r["what"], []).append(r)
    for what, rs in by.items():
        rs = sorted(rs, key=lambda r: r["rows"])
        if len(rs) < 2:
            continue
        n = np.array([r["rows"] for r in rs], float)
        t = np.array([max(r["seconds"], 1e-4) for r in rs])
        m = np.array([r["peak_mb"] for r in rs])
        b, la = np.polyfit(np.log(n), np.log(t), 1)
        d, c = np.polyfit(n, m, 1)
        t100 = np.exp(la) * 1e8 ** b
        cpu = ""
        if all(isinstance(r.get("cpu_seconds"), (int, float)) for r in rs):  # CPU: the host is shared, wall is noisy
            cs = np.array([max(r["cpu_seconds"], 1e-4) for r in rs])
            bc, lc = np.polyfit(np.log(n), np.log(cs), 1)
            cpu = (f"; CPU ~ rows^{bc:.2f} -> {np.exp(lc) * 1e8 ** bc:,.0f} CPU-s at 100M (extrapolated), "
                   f"{n[-1] / cs[-1]:,.0f} request-steps/CPU-s at {int(n[-1]):,}")
        lines.append(f"{what:32s} time ~ rows^{b:.2f} -> {t100:,.0f} s at 100M (extrapolated); "
                     f"peak ~ {c:,.0f} MB + {d * 1e6:,.1f} MB/M rows -> {c + d * 1e8:,.0f} MB at 100M (extrapolated)"
                     + cpu)
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="100000,300000,1000000,3000000,10000000")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/acceptscope-scale"))
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--timeout", type=float, default=900)
    ap.add_argument("--skip", default="", help="comma list of: estimate, report, panels, ingest")
    ap.add_argument("--panel-repeats", type=int, default=5)
    ap.add_argument("--reuse", action="store_true", help="measure the store in --workdir as built before (grown "
                                                            "if a size asks for more), instead of building anew")
    ap.add_argument("--page-tail", action="store_true",
                    help="after the panels: the requests panel (first and middle page) again once syn-c holds the "
                         "longest unsorted tail a writer leaves (new requests rows written through the store; "
                         "they stay in the store)")
    ap.add_argument("--ingest-max", type=int, default=1_000_000)
    ap.add_argument("--report-max", type=int, default=1_000_000)
    ap.add_argument("--many-runs", type=int, default=0, help="instead: estimate over a store of N small runs")
    ap.add_argument("--many-requests", type=int, default=12, help="requests per run with --many-runs")
    ap.add_argument("--many-boot", type=int, default=200, help="bootstrap replicates with --many-runs")
    ap.add_argument("--phases", type=Path, default=None,
                    help="instead: peak RSS of each phase of a streamed estimate of syn-c in this store (a child "
                         "process sampling VmRSS every 50 ms; the scan's DuckDB sort stays open under the chunks)")
    ap.add_argument("--stream-kw", default="{}", help="with --phases: run_all_stream keywords as JSON, e.g. "
                                                      "'{\"chunk_rows\": 131072, \"duckdb_memory\": \"384MB\"}'")
    a = ap.parse_args()
    if a.phases:
        print(json.dumps({"what": "estimate phases", "db": str(a.phases), **run_child(_PHASES, [str(a.phases.resolve()), "syn-c",
                                                                                              a.stream_kw], a.timeout)}))
        return
    if a.many_runs:
        a.workdir.mkdir(parents=True, exist_ok=True)
        return many_runs(a)
    skip = set(filter(None, a.skip.split(",")))
    a.workdir.mkdir(parents=True, exist_ok=True)
    db = a.workdir / "scale.duckdb"
    sys.path.insert(0, str(ROOT))
    if a.reuse and db.exists():  # a store this command built before: grow it only if asked for more
        import duckdb

        with duckdb.connect(str(db), read_only=True) as con:
            base = con.execute("SELECT count(*) FROM base_request_steps").fetchone()[0]
            copies = con.execute("SELECT count(*) FROM request_steps WHERE run_id = 'syn-c'").fetchone()[0] // base
    else:
        for p in (db, Path(str(db) + ".wal")):
            p.unlink(missing_ok=True)
        base = build_base(db)
        copies = 1
    rows_out: list[dict] = []
    sink = open(a.out, "a") if a.out else None

    def emit(d: dict) -> None:
        rows_out.append(d)
        line = json.dumps(d)
        print(line, flush=True)
        if sink:
            sink.write(line + "\n")
            sink.flush()

    for size in (int(s) for s in a.sizes.split(",")):
        want = max(1, round(size / base))
        t0 = time.perf_counter()
        if want > copies:
            grow(db, copies, want)
            copies = want
            emit({"what": "build (DuckDB copy)", "rows": copies * base, "seconds": time.perf_counter() - t0, "peak_mb": None,
                  "rc": "n/a", "db_mb": db.stat().st_size / 2**20})
            # the copies were inserted behind the store's back: bring its summaries up to date as a writer
            # keeps them (a read-write open rebuilds stale ones), so panels and report read them
            emit({"what": "summaries rebuild", "rows": copies * base, **run_child(_REBUILD, [str(db)], a.timeout)})
        n = copies * base
        if copies > want:
            print(f"note: {db} holds {n} request-steps; measuring it as is for size {size}", flush=True)
        if "estimate" not in skip:
            emit({"what": "estimate", "rows": n, **cli(["estimate", "--db", str(db), "--run", "syn-c", "--json"], a.timeout)})
        def panel(p: str, label: str = "") -> None:
            emit({"what": f"panel:{p}{label}", "rows": n,
                  **run_child(_PANEL, [str(db), p, json.dumps(["syn-c", "syn-cap"]), str(a.panel_repeats)], a.timeout)})
        if "panels" not in skip:
            for p in PANELS:
                panel(p)
        if a.page_tail and "panels" not in skip:
            panel("requests@middle")
            tail = write_page_tail(db)
            for p in ("requests", "requests@middle"):
                panel(p, f" (unsorted tail {tail})")
        if "report" not in skip and size <= a.report_max:
            emit({"what": "report", "rows": n, **cli(["report", "--db", str(db), "--run", "syn-c", "--run", "syn-cap",
                                                      "-o", str(a.workdir / "r.html")], a.timeout)})
        if "ingest" not in skip and size <= a.ingest_max:
            emit({"what": "ingest", "rows": size, **ingest_row(a.workdir, size, a.timeout)})
    print("\ngrowth (fitted on the measured sizes):")
    for line in fit_table(rows_out):
        print(" ", line)


if __name__ == "__main__":
    main()
