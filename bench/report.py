"""``acceptscope report`` (estimators on) on growing stores: wall, CPU, peak RSS, and a linear fit to 100M.

The store is the dashboard bench's (``bench/dashboard.py``): the synthetic audit pair ``big-c`` (compact)
and ``big-cap`` (cap-accept) grown by copies with fresh keys through ``Store.write_arrow``, so every
summary is maintained as a capture would maintain it. At each size (request-steps *per run*; the store
holds twice that) one child process runs ``acceptscope report --db S --run big-c --run big-cap``
through bench/scale.py's harness (``cli``: wall and CPU seconds, ``VmHWM``). The report reads its
tables from the summaries and runs the estimators through ``estimators.run_all``, which streams a run
of more than ``estimators.STREAM_ROWS`` request-steps in chunks of whole requests (the path
``acceptscope estimate`` takes). The last line fits time and peak memory against the store's rows
(least squares, ``a + b * rows``) and extrapolates to 100M request-steps. ``--build-only`` grows the store
and stops (copy the file to keep one store per size, then ``--reuse`` each).

Usage::

    .venv/bin/python bench/report.py --sizes 500000,5000000 --workdir /work/scratch-s3-15d/report \\
        [--reuse] [--no-estimators] [--build-only] [--timeout 3000]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from bench.dashboard import RUNS, base_tables, grow  # noqa: E402  (the same store as the dashboard bench)
from bench.scale import cli  # noqa: E402


def fit(xs: list[float], ys: list[float], at: float) -> tuple[float, float, float]:
    """(intercept, slope, value at ``at``) of the least-squares line through (xs, ys)."""
    if len(xs) < 2:
        return float("nan"), float("nan"), float("nan")
    b, a = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(a), float(b), float(a + b * at)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--sizes", default="500000,5000000", help="request-steps per run (the store holds two runs)")
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/acceptscope-report"))
    ap.add_argument("--reuse", action="store_true", help="keep WORKDIR's store and append only the copies it lacks")
    ap.add_argument("--no-estimators", action="store_true", help="measure `report --no-estimators` instead")
    ap.add_argument("--timeout", type=float, default=3000)
    ap.add_argument("--build-only", action="store_true", help="grow WORKDIR's store to the last size and stop")
    a = ap.parse_args()
    from acceptscope.store import Store
    import pyarrow.compute as pc

    a.workdir.mkdir(parents=True, exist_ok=True)
    db = a.workdir / "report.duckdb"
    if not (a.reuse and db.exists()):
        for p in (db, Path(str(db) + ".wal")):
            p.unlink(missing_ok=True)
    bases = base_tables()
    per_copy = bases["big-cap"]["request_steps"].num_rows
    span = int(pc.max(bases["big-cap"]["request_steps"].column("forward_ct")).as_py()) + 1
    store = Store(db)
    copies = store.counts("big-cap")["request_steps"] // per_copy
    if not copies:
        store.write_arrow({"runs": pa.concat_tables([bases[r]["runs"] for r in RUNS])})
    rows = []
    for size in (int(s) for s in a.sizes.split(",")):
        want = max(1, round(size / per_copy))
        if want > copies:
            grow(store, bases, span, copies, want)
            copies = want
        n = 2 * copies * per_copy
        if a.build_only:
            print(json.dumps({"store_rows": n, "built": str(db)}), flush=True)
            continue
        args = ["report", "--db", str(db), "--run", RUNS[0], "--run", RUNS[1], "-o", str(a.workdir / "report.html")]
        got = cli(args + (["--no-estimators"] if a.no_estimators else []), a.timeout)
        row = {"store_rows": n, **got}
        print(json.dumps(row), flush=True)
        rows.append(row)
    if a.build_only:
        return
    what = "report --no-estimators" if a.no_estimators else "report"
    print(f"\n{what:24s}{'store rows':>12}{'wall s':>10}{'CPU s':>10}{'peak MB':>10}")
    for r in rows:
        print(f"{'':24s}{r['store_rows'] / 1e6:>11.2f}M{r.get('seconds', float('nan')):>10.1f}"
              f"{r.get('cpu_seconds', float('nan')):>10.1f}{r.get('peak_mb', float('nan')):>10.0f}  rc={r.get('rc')}")
    ok = [r for r in rows if r.get("rc") == 0]
    x = [r["store_rows"] for r in ok]
    for key, unit in (("seconds", "s"), ("cpu_seconds", "CPU s"), ("peak_mb", "MB")):
        c, slope, at = fit(x, [r[key] for r in ok], 100e6)
        print(f"fit {key}: {c:,.1f} + {slope * 1e6:,.2f} {unit} per M rows -> 100M rows: {at:,.0f} {unit}")


if __name__ == "__main__":
    main()
