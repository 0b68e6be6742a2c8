"""A fleet of runs: ``acceptscope estimate --db S --json`` over a real main-job audit replicated to ~2M
request-steps, whole process, side by side for several checkouts (issue 29's bar-style check).

Why: production stores hold many runs; what ``estimate`` costs per run (its fixed cost: side tables,
hazard fit, calibration comparison, cost fit) and whether its memory follows the rows or the number of
runs decide whether a fleet of small runs is cheap. The store is the main job's own audit
(``acceptscope audit --engine reference --workload math,chat,poetry``), every run grown *inside DuckDB*
by copies of its requests (``rid.<copy>``) in later decode steps (``forward_ct`` shifted by whole
copies), so its mix of arms, workloads and run sizes stays the real one.

Each measurement is a child process running the CLI; it reports wall and CPU seconds (user + system,
``getrusage``) and ``VmHWM`` (peak RSS). ``--tree NAME=PATH`` (repeatable) runs the same commands with
another checkout's code alone on the path (``git worktree add /tmp/before <commit>``), in turns, so a
noisy machine affects every tree alike; ratios are printed against the first tree.

Usage::

    .venv/bin/python bench/fleet.py --workdir /tmp/fleet --rows 2000000 \\
        --tree before=/tmp/wt-before --tree after=. [--repeats 1] [--single-rows 125000]

``--json-dir DIR`` keeps every tree's ``--json`` output and compares each with the first tree's (results
must not change with a speed-up: the count of float fields that differ and their largest relative
difference, timings aside). ``--single-rows N`` adds two stores of one run each grown to ~N request-steps (a run with its ceiling
recorded, so the held-out calibration comparison runs, and a tail-estimated one): ``estimate`` over one
such run is the per-run fixed cost plus N rows of per-row work. Several sizes (``--single-rows 31250 62500
125000 250000``) separate the two: the line through each arm's CPU-s against its rows, intercept and slope.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PY = sys.executable

_CHILD = r"""
import atexit, json, resource, sys, time
t0 = time.perf_counter()
def _report():
    ru = resource.getrusage(resource.RUSAGE_SELF)
    hwm = [l for l in open("/proc/self/status") if l.startswith("VmHWM")][0].split()[1]
    sys.stderr.write("FLEET " + json.dumps({"seconds": time.perf_counter() - t0, "cpu_seconds": ru.ru_utime + ru.ru_stime,
                                            "peak_mb": int(hwm) / 1024}) + "\n")
atexit.register(_report)
sys.argv = ["acceptscope"] + json.loads(sys.argv[1])
from acceptscope.cli import main
main()
"""

RUN_TABLES = ("request_steps", "steps", "requests", "sts_samples")  # grown per copy; other tables are per run


def build(source: Path, db: Path, rows: int, only_run: str | None = None) -> dict:
    """Copy ``source`` to ``db`` and grow every run by whole copies of its requests to ~``rows`` in all.
    ``only_run``: keep that run alone (the per-run fixed cost: one run of ``rows`` request-steps)."""
    import duckdb

    shutil.copyfile(source, db)
    con = duckdb.connect(str(db))
    con.execute("SET memory_limit='2GB'")
    if only_run is not None:
        for (t,) in con.execute("SELECT DISTINCT table_name FROM information_schema.columns WHERE column_name = "
                                "'run_id' AND table_schema = 'main'").fetchall():
            con.execute(f'DELETE FROM "{t}" WHERE run_id <> ?', [only_run])
    have = con.execute("SELECT count(*) FROM request_steps").fetchone()[0]
    copies = max(1, math.ceil(rows / max(have, 1)))
    tables = [t for t in RUN_TABLES if con.execute(
        "SELECT count(*) FROM information_schema.columns WHERE table_name = ? AND column_name = 'run_id'", [t]).fetchone()[0]]
    for t in tables:
        cols = {r[0] for r in con.execute("SELECT column_name FROM information_schema.columns WHERE table_name = ?",
                                          [t]).fetchall()}
        con.execute(f"CREATE TEMP TABLE base_{t} AS SELECT * FROM {t}")
        span = con.execute("SELECT coalesce(max(forward_ct), 0) + 1 FROM steps").fetchone()[0]
        repl = []
        if "rid" in cols:
            repl.append("rid || '.' || c.i AS rid")
        if "forward_ct" in cols:
            repl.append(f"forward_ct + c.i * {span} AS forward_ct")
        if not repl:
            continue
        con.execute(f"INSERT INTO {t} SELECT s.* REPLACE ({', '.join(repl)}) FROM base_{t} s, range(1, {copies}) c(i)")
    con.execute("CHECKPOINT")
    out = dict(copies=copies, request_steps=con.execute("SELECT count(*) FROM request_steps").fetchone()[0],
               runs=con.execute("SELECT count(DISTINCT run_id) FROM request_steps").fetchone()[0])
    biggest = con.execute("SELECT run_id, count(*) n FROM request_steps GROUP BY 1 ORDER BY 2 DESC, 1 LIMIT 1").fetchone()
    out.update(biggest_run=biggest[0], biggest_rows=biggest[1])
    con.close()
    return out


def measure(tree: Path, args: list[str], timeout: float, json_out: Path | None = None, env_extra: dict | None = None) -> dict:
    env = dict(os.environ, PYTHONPATH=str(tree), COLUMNS="100", **(env_extra or {}))
    try:
        r = subprocess.run([PY, "-c", _CHILD, json.dumps(args)], capture_output=True, text=True, timeout=timeout,
                           env=env, cwd=tree)
    except subprocess.TimeoutExpired:
        return {"rc": "timeout"}
    line = [x for x in r.stderr.splitlines() if x.startswith("FLEET ")]
    out = json.loads(line[-1][6:]) if line else {}
    out["rc"] = r.returncode
    if r.returncode != 0:
        out["error"] = r.stderr.strip().splitlines()[-1:] if r.stderr.strip() else r.stdout[-300:]
    else:
        try:
            out["runs_estimated"] = len(json.loads(r.stdout))
        except json.JSONDecodeError:
            out["runs_estimated"] = None
        if json_out is not None:
            json_out.write_text(r.stdout)
    return out


def json_diff(a, b, path: str = "") -> tuple[int, float, list]:
    """(float fields that differ, their largest relative difference, other differences) between two
    ``estimate --json`` documents; the calibration fits' ``fit_seconds`` (timings) are skipped."""
    if path.endswith("/fit_seconds"):
        return 0, 0.0, []
    if isinstance(a, dict) and isinstance(b, dict) and sorted(a) == sorted(b):
        parts = [json_diff(a[k], b[k], f"{path}/{k}") for k in a]
    elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        parts = [json_diff(x, y, f"{path}[{i}]") for i, (x, y) in enumerate(zip(a, b))]
    elif isinstance(a, float) and isinstance(b, float):
        return (0, 0.0, []) if a == b else (1, abs(a - b) / max(abs(a), abs(b)), [])
    else:
        return 0, 0.0, [] if a == b else [path]
    return (sum(p[0] for p in parts), max([p[1] for p in parts], default=0.0), [x for p in parts for x in p[2]])


def line(points: list[tuple[float, float]]) -> tuple[float, float]:
    """Least-squares intercept and slope of ``(x, y)`` points."""
    n = len(points)
    mx = sum(x for x, _ in points) / n
    my = sum(y for _, y in points) / n
    slope = sum((x - mx) * (y - my) for x, y in points) / sum((x - mx) ** 2 for x, _ in points)
    return my - slope * mx, slope


def biggest_run(source: Path, exact: bool) -> str:
    """The source's biggest run whose ceiling is recorded on every request-step (``exact``: the held-out
    calibration runs) or on none (the tail is estimated)."""
    import duckdb

    con = duckdb.connect(str(source), read_only=True)
    cond = "count(ceiling) = count(*)" if exact else "count(ceiling) = 0"
    got = con.execute(f"SELECT run_id FROM request_steps GROUP BY run_id HAVING {cond} ORDER BY count(*) DESC, run_id "
                      "LIMIT 1").fetchone()
    con.close()
    return got[0]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, required=True)
    ap.add_argument("--source", type=Path, help="a main-job audit database (default: run the main job into the workdir)")
    ap.add_argument("--rows", type=int, default=2_000_000)
    ap.add_argument("--tree", action="append", default=[], help="NAME=PATH of a checkout (repeatable; default: this one)")
    ap.add_argument("--env", action="append", default=[],
                    help="TREE:NAME=VALUE, an environment variable for that tree's runs only (repeatable): e.g. one "
                         "checkout twice, once with the CLI's process defaults overridden")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--timeout", type=float, default=3600)
    ap.add_argument("--json-dir", type=Path, help="keep each tree's JSON output here and compare it with the first "
                                                  "tree's (float fields that differ, largest relative difference)")
    ap.add_argument("--single-rows", type=int, nargs="*", default=[],
                    help="also one run alone grown to this many request-steps (the per-run fixed cost), once for "
                         "the biggest run with a recorded ceiling (calibration) and once for the biggest without (tail); "
                         "several sizes: each, and per tree the line through them (its intercept is the run's fixed cost)")
    a = ap.parse_args()
    a.workdir.mkdir(parents=True, exist_ok=True)
    if a.json_dir is not None:
        a.json_dir.mkdir(parents=True, exist_ok=True)
    source = a.source
    if source is None:
        source = a.workdir / "audit.duckdb"
        if not source.exists():
            subprocess.run([PY, "-c", "from acceptscope.cli import main; main()", "audit", "--engine", "reference",
                            "--workload", "math,chat,poetry", "--db", str(source), "--out", str(a.workdir / "r.html")],
                           check=True, cwd=ROOT)
    db = a.workdir / "fleet.duckdb"
    info = build(source, db, a.rows)
    print(json.dumps({"store": info}), flush=True)
    trees = [tuple(t.split("=", 1)) for t in a.tree] or [("this", str(ROOT))]
    tree_env: dict[str, dict] = {}
    for spec in a.env:
        name, _, kv = spec.partition(":")
        key, _, value = kv.partition("=")
        tree_env.setdefault(name, {})[key] = value
    cases = {"all runs": ["estimate", "--db", str(db), "--json"],
             "biggest run alone": ["estimate", "--db", str(db), "--run", info["biggest_run"], "--json"]}
    rows_of = {"all runs": info["request_steps"], "biggest run alone": info["biggest_rows"]}
    sweep: dict[str, list[str]] = {}  # arm -> its cases, by size
    for size in a.single_rows:
        for arm, exact in (("exact", True), ("estimated", False)):
            suffix = "" if len(a.single_rows) == 1 else f"-{size}"
            one = a.workdir / f"single-{arm}{suffix}.duckdb"
            got = build(source, one, size, only_run=biggest_run(source, exact))
            print(json.dumps({f"single {arm}{suffix}": got}), flush=True)
            case = f"one {arm} run" + ("" if len(a.single_rows) == 1 else f" {size // 1000}k")
            cases[case] = ["estimate", "--db", str(one), "--json"]
            rows_of[case] = got["request_steps"]
            sweep.setdefault(arm, []).append(case)
    rows = []
    for rep in range(a.repeats):
        for case, args in cases.items():
            for name, path in trees:
                out = None if a.json_dir is None else a.json_dir / f"{case.replace(' ', '-')}.{name}.{rep}.json"
                m = measure(Path(path).resolve(), args, a.timeout, out, tree_env.get(name))
                m.update(tree=name, case=case, repeat=rep)
                rows.append(m)
                print(json.dumps(m), flush=True)
    print(f"\n{'case':<20} {'tree':<10} {'CPU s':>8} {'wall s':>8} {'peak MB':>8} {'rs/CPU-s':>10}  vs {trees[0][0]}")
    for case in cases:
        base = None
        for name, _ in trees:
            got = [r for r in rows if r["case"] == case and r["tree"] == name and r["rc"] == 0]
            if not got:
                print(f"{case:<20} {name:<10} failed: {[r.get('error') for r in rows if r['case'] == case and r['tree'] == name]}")
                continue
            cpu = min(r["cpu_seconds"] for r in got)
            wall = min(r["seconds"] for r in got)
            peak = max(r["peak_mb"] for r in got)
            n = rows_of[case]
            base = base or cpu
            print(f"{case:<20} {name:<10} {cpu:8.1f} {wall:8.1f} {peak:8.0f} {n / cpu:10.0f}  x{base / cpu:.2f}")
    if len(a.single_rows) > 1:
        print("\none run alone, CPU-s against its request-steps (least squares over the sizes, each size's smaller CPU):")
        for arm, names in sweep.items():
            for name, _ in trees:
                pts = [(rows_of[c], min(r["cpu_seconds"] for r in rows if r["case"] == c and r["tree"] == name and r["rc"] == 0))
                       for c in names if any(r["case"] == c and r["tree"] == name and r["rc"] == 0 for r in rows)]
                if len(pts) >= 2:
                    fixed, per_row = line(pts)
                    print(f"{arm:<10} {name:<10} fixed cost {fixed:6.2f} CPU-s, {per_row * 1e5:6.2f} CPU-s per 100k request-steps")
    if a.json_dir is not None:
        first = trees[0][0]
        print(f"\nJSON against {first} (repeat 0): float fields that differ, largest relative difference, other fields")
        for case in cases:
            slug = case.replace(" ", "-")
            ref = a.json_dir / f"{slug}.{first}.0.json"
            for name, _ in trees[1:]:
                got = a.json_dir / f"{slug}.{name}.0.json"
                if ref.exists() and got.exists():
                    n, rel, other = json_diff(json.loads(ref.read_text()), json.loads(got.read_text()))
                    print(f"{case:<20} {name:<10} {n:6d} {rel:10.2e} {len(other):6d} {other[:3]}")


if __name__ == "__main__":
    main()
