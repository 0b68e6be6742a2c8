"""The reader's Arrow path against DuckDB's ``.df()``, side by side on one synthetic store.

Why: issue 12 made :class:`acceptscope.reader.Reader` (report, audit, dashboard, notebook) read through
Arrow (``fetch_arrow(...).to_pandas()``, as ``Store.read_table`` does) instead of ``.df()``. This prints,
per dashboard/report query, the best-of-N wall time of both paths on the same file and their ratio
(> 1: Arrow is faster). Timings are noisy on shared machines; read the ratios, not the seconds.

Usage::

    .venv/bin/python bench/reader.py --requests 2000 --repeats 5 --workdir /tmp/bench-reader
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from acceptscope.reader import Reader  # noqa: E402
from acceptscope.store import Store  # noqa: E402
from acceptscope.store_lock import open_read_only  # noqa: E402
from acceptscope.figures.tables import reliability_bins  # noqa: E402
from acceptscope.estimators.synthetic import simulate  # noqa: E402


class DfReader(Reader):
    """The reader as it was before: DuckDB's ``.df()``."""

    def query_df(self, sql, params=None):
        with open_read_only(self.path, self.lock_timeout_s) as con:
            return con.execute(sql, list(params or [])).df()

    df = query_df


def best(fn, repeats: int) -> float:
    out = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return min(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--requests", type=int, default=2000)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--workdir", default="/tmp/bench-reader")
    a = ap.parse_args()
    db = Path(a.workdir) / f"reader-{a.requests}.duckdb"
    if not db.exists():
        db.parent.mkdir(parents=True, exist_ok=True)
        Store(db).append(simulate(n_requests=a.requests, seed=1).tables)
    arrow, old = Reader(db), DfReader(db)
    ids = list(arrow.runs()["run_id"])
    rid = arrow.requests(ids[0])["rid"].iloc[0]
    queries = {
        "runs": lambda r: r.runs(),
        "run_summary": lambda r: r.run_summary(ids),
        "position_acceptance": lambda r: r.position_acceptance(ids),
        "window_distribution": lambda r: r.window_distribution(ids),
        "utilization_by_workload": lambda r: r.utilization_by_workload(ids),
        "step_costs": lambda r: r.step_costs(ids),
        "requests": lambda r: r.requests(ids[0]),
        "request_steps": lambda r: r.request_steps(ids[0], rid),
        "reliability_bins": lambda r: reliability_bins(r, ids),
        "all request_steps rows": lambda r: r.df('SELECT * FROM "request_steps"'),
    }
    n = int(arrow.df('SELECT count(*) AS n FROM "request_steps"')["n"].iloc[0])
    print(f"{db.name}: {n} request-steps; best of {a.repeats}")
    print(f"{'query':28s} {'.df() s':>9s} {'arrow s':>9s} {'ratio':>6s}")
    for name, q in queries.items():
        t_old, t_new = best(lambda: q(old), a.repeats), best(lambda: q(arrow), a.repeats)
        print(f"{name:28s} {t_old:9.4f} {t_new:9.4f} {t_old / t_new:6.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
