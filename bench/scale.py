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
* ``ingest``: ``acceptscope ingest`` of a synthetic SGLang ``/server_info`` dump
  (:func:`acceptscope.ingest.synth.make_server_info`) of about the same number of request-steps,
  for sizes up to ``--ingest-max``.

Rows are JSON lines on stdout (and in ``--out``); the table at the end fits ``time = a * rows^b``
and ``peak = c + d * rows`` per command on the measured sizes and extrapolates to 100M
request-steps (an extrapolation, labelled as such).

Usage::

    .venv/bin/python bench/scale.py --sizes 100000,300000,1000000,3000000,10000000 --workdir /tmp/scale \
        [--out scale.jsonl] [--timeout 900] [--skip report,ingest]
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

_PANEL = r"""
import json, sys, time
db, name, runs, reps = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), int(sys.argv[4])
from acceptscope.reader import Reader
r = Reader(db)
def call():
    if name == "reliability_bins":
        from acceptscope.figures import tables as figures
        return figures.reliability_bins(r, runs)
    if name == "sampling_inference":
        from acceptscope import audit_sampling
        try:
            return audit_sampling.infer_runs(r, runs[0], runs[1])
        except ValueError as e:
            return str(e)
    if name == "requests":
        return r.requests(runs[0])
    return getattr(r, name)(runs)
ts = []
for _ in range(reps):
    t0 = time.perf_counter(); call(); ts.append(time.perf_counter() - t0)
hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
ts.sort()
print(json.dumps({"seconds": ts[len(ts) // 2], "best_s": ts[0], "worst_s": ts[-1], "peak_mb": int(hwm) / 1024, "rc": 0}))
"""

PANELS = ("run_summary", "window_distribution", "position_acceptance", "utilization_by_workload", "step_costs",
          "requests", "data_quality", "reliability_bins", "sampling_inference")


def _env() -> dict:
    return dict(os.environ, PYTHONPATH=str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), COLUMNS="100")


def _child(code: str, args: list[str], timeout: float) -> dict:
    try:
        r = subprocess.run([PY, "-c", code, *args], capture_output=True, text=True, timeout=timeout, env=_env(), cwd=ROOT)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout", "seconds": timeout}
    lines = [x for x in r.stdout.strip().splitlines() if x.startswith("{")]
    if r.returncode != 0 or not lines:
        return {"rc": r.returncode, "error": (r.stderr or r.stdout)[-600:]}
    return json.loads(lines[-1])


def cli(args: list[str], timeout: float) -> dict:
    return _child(_CHILD, [json.dumps(args)], timeout)


def build_base(db: Path) -> int:
    """The template store: truth run ``syn-cap`` and compact run ``syn-c``; returns syn-c's rows."""
    from acceptscope.store import Store
    from estimators.synthetic import compact_view, simulate

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
    ap.add_argument("--ingest-max", type=int, default=1_000_000)
    ap.add_argument("--report-max", type=int, default=1_000_000)
    a = ap.parse_args()
    skip = set(filter(None, a.skip.split(",")))
    a.workdir.mkdir(parents=True, exist_ok=True)
    db = a.workdir / "scale.duckdb"
    for p in (db, Path(str(db) + ".wal")):
        p.unlink(missing_ok=True)
    sys.path.insert(0, str(ROOT))
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
        grow(db, copies, want)
        copies = max(copies, want)
        n = copies * base
        emit({"what": "build (DuckDB copy)", "rows": n, "seconds": time.perf_counter() - t0, "peak_mb": None, "rc": "n/a",
              "db_mb": db.stat().st_size / 2**20})
        if "estimate" not in skip:
            emit({"what": "estimate", "rows": n, **cli(["estimate", "--db", str(db), "--run", "syn-c", "--json"], a.timeout)})
        if "panels" not in skip:
            for p in PANELS:
                runs = ["syn-c", "syn-cap"]
                emit({"what": f"panel:{p}", "rows": n,
                      **_child(_PANEL, [str(db), p, json.dumps(runs), str(a.panel_repeats)], a.timeout)})
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
