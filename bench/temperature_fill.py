"""The temperature rule on write (acceptscope.domain.temperature) against the read-time fill it replaced.

Side by side in one run, on fresh files, the same SGLang-like rows (no temperature on the request-steps):
  * write: ``request_steps`` batches through ``Store.write_arrow`` with the fill (now) and with it switched
    off (before: the write stored NULLs), in four orders: a dump alone (nothing can fill), request records
    stored first (the batch is filled before its INSERT), request records stored after the steps (one
    UPDATE), and a run temperature set after the steps (``update_run``; before: ingest's UPDATE at its end);
  * read: one run's ``request_steps`` read for the estimators, a plain SELECT (now) against the
    ``coalesce`` join the readers ran on every read (before).

Run:  .venv/bin/python bench/temperature_fill.py [--rows 400000] [--batch 50000] [--repeat 2]
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402

from acceptscope.domain import temperature  # noqa: E402
from acceptscope.estimators.chunks import TAIL_COLUMNS  # noqa: E402
from acceptscope.store import Store, fetch_arrow  # noqa: E402
from bench.support import synthetic as H  # noqa: E402

RUN = "run-a"
OLD_SELECT = ("SELECT {cols} FROM request_steps s LEFT JOIN (SELECT run_id, rid, temperature FROM requests WHERE "
              "temperature IS NOT NULL) q ON s.run_id = q.run_id AND s.rid = q.rid LEFT JOIN runs r ON "
              "s.run_id = r.run_id WHERE s.run_id = ? ORDER BY s.rowid")


def _data(rows: int, batch: int):
    rs = H.request_steps(rows, run_id=RUN, seed=1)
    rs = rs.set_column(rs.schema.get_field_index("temperature"), "temperature", pa.nulls(rows, pa.float64()))
    rids = pc.unique(rs.column("rid"))
    req = pa.table({"run_id": pa.array([RUN] * len(rids)), "rid": rids,
                    "temperature": pa.array(np.where(np.arange(len(rids)) % 2 == 0, 0.7, np.nan), from_pandas=True)})
    return [rs.slice(i, batch) for i in range(0, rows, batch)], req


def _write(path: Path, parts, req, order: str, fill: bool) -> float:
    """Seconds for the writes of ``order`` (the fill on or off)."""
    saved = (temperature.fill_batch, temperature.fill_from_requests, temperature.fill_stored)
    if not fill:
        temperature.fill_batch = lambda con, t: t
        temperature.fill_from_requests = lambda con, r: 0
        temperature.fill_stored = lambda con, ids=None: 0
    try:
        st = Store(path)
        st.append({"runs": [{**H.run_row(RUN), "temperature": None}]})  # (an SGLang server's run: none known)
        t0 = time.perf_counter()
        if order == "requests first":
            st.append({"requests": req})
        for b in parts:
            st.write_arrow({"request_steps": b})
        if order == "requests after":
            st.append({"requests": req})
        if order == "run temperature after":
            st.update_run(RUN, {"temperature": 0.7})
            if not fill:  # before: ingest filled the run's rows with one UPDATE at its end
                with st.connect() as con:
                    saved[2](con, [RUN])
        return time.perf_counter() - t0
    finally:
        temperature.fill_batch, temperature.fill_from_requests, temperature.fill_stored = saved


def _read(path: Path, old: bool) -> float:
    st = Store(path, read_only=True)
    t0 = time.perf_counter()
    with st.connect(read_only=True) as con:
        if old:
            cols = ", ".join('CAST(coalesce(s.temperature, q.temperature, r.temperature) AS DOUBLE) AS "temperature"'
                             if c == "temperature" else f's."{c}"' for c in TAIL_COLUMNS)
            tbl = fetch_arrow(con, OLD_SELECT.format(cols=cols), [RUN])
        else:
            cols = ", ".join(f's."{c}"' for c in TAIL_COLUMNS)
            tbl = fetch_arrow(con, f"SELECT {cols} FROM request_steps s WHERE s.run_id = ? ORDER BY s.rowid", [RUN])
    assert tbl.num_rows > 0
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--rows", type=int, default=400_000)
    ap.add_argument("--batch", type=int, default=50_000)
    ap.add_argument("--repeat", type=int, default=2)
    a = ap.parse_args()
    parts, req = _data(a.rows, a.batch)
    print(f"{a.rows:,} request-steps in batches of {a.batch:,}; {req.num_rows:,} requests, half with a temperature")
    print(f"{'write order':<24}{'before s':>10}{'now s':>10}{'now/before':>12}")
    with tempfile.TemporaryDirectory() as d:
        for order in ("dump alone", "requests first", "requests after", "run temperature after"):
            runs = []
            for rep in range(a.repeat):  # alternated, fresh files each time; the min of each (a shared machine)
                runs.append((_write(Path(d) / f"b{rep}-{order}.duckdb", parts, req, order, fill=False),
                             _write(Path(d) / f"n{rep}-{order}.duckdb", parts, req, order, fill=True)))
            before, now = min(r[0] for r in runs), min(r[1] for r in runs)
            print(f"{order:<24}{before:>10.3f}{now:>10.3f}{now / before:>12.2f}")
        # the read the estimators make of a run whose rows lacked temperatures: before on the file the
        # old write left (NULLs, filled by the join), now on the file the new write left (filled)
        b, n = Path(d) / "b0-requests after.duckdb", Path(d) / "n0-requests after.duckdb"
        reads = [(_read(b, True), _read(n, False)) for _ in range(3)]
        before, now = min(r[0] for r in reads), min(r[1] for r in reads)
        print(f"{'read (min of 3)':<24}{before:>10.3f}{now:>10.3f}{now / before:>12.2f}")


if __name__ == "__main__":
    main()
