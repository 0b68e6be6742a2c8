"""Scrape cost of ``live export-metrics`` over a big store: ``/metrics`` p50/p95 against the estimate it caches.

Why: the exporter estimates once per data version in a background thread and a scrape only formats the
cached snapshot, so a scrape should cost the same at any store size (target: p95 <= 100 ms over a 10M
request-step store). This prints, as JSON lines: the snapshot's compute time (what every scrape would
cost without the cache), the scrape latencies while idle, and while the next data version is being
estimated in the same process (the background thread shares the interpreter with the HTTP server), and
their ratios. ``--in-process`` estimates in the exporter's own process instead (the path before the child
process).

The store is bench/scale.py's (``syn-cap`` truth run + ``syn-c`` compact run grown by copies inside
DuckDB); ``--db`` reuses one it built (``/tmp/acceptscope-scale/scale.duckdb``).

Usage::

    .venv/bin/python bench/exporter.py --rows 10000000 --workdir /tmp/acceptscope-exporter [--scrapes 200]
    .venv/bin/python bench/exporter.py --db /tmp/acceptscope-scale/scale.duckdb
"""

from __future__ import annotations

import argparse
import json
import sys
import threading
import time
from pathlib import Path

import numpy as np
import requests

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "bench"))

from scale import build_base, grow  # noqa: E402 - bench/scale.py's store builder

from acceptscope.live.exporter import MetricsExporter  # noqa: E402
from acceptscope.store import Store  # noqa: E402


def build(workdir: Path, rows: int) -> Path:
    """bench/scale.py's store grown to about ``rows`` request-steps of ``syn-c`` (reused when present)."""
    workdir.mkdir(parents=True, exist_ok=True)
    db = workdir / "exporter.duckdb"
    if db.exists():
        return db
    base = build_base(db)
    grow(db, 1, max(1, round(rows / base)))
    Store(db)  # a read-write open rebuilds the summaries the copies made stale (as bench/scale.py does)
    return db


def scrape_ms(url: str, n: int) -> np.ndarray:
    out = []
    with requests.Session() as s:
        for _ in range(n):
            t0 = time.perf_counter()
            r = s.get(url, timeout=30)
            r.raise_for_status()
            out.append((time.perf_counter() - t0) * 1e3)
    return np.array(out)


def stats(ms: np.ndarray) -> dict:
    return {"n": int(len(ms)), "p50_ms": float(np.percentile(ms, 50)), "p95_ms": float(np.percentile(ms, 95)),
            "max_ms": float(ms.max())}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--db", type=Path, default=None)
    ap.add_argument("--rows", type=int, default=10_000_000)
    ap.add_argument("--workdir", type=Path, default=Path("/tmp/acceptscope-exporter"))
    ap.add_argument("--scrapes", type=int, default=200)
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--in-process", action="store_true", help="estimate in the exporter's process (the path "
                    "before the child process: its scrapes wait on the interpreter lock)")
    a = ap.parse_args()
    db = a.db or build(a.workdir, a.rows)
    n_rows = int(Store(db, read_only=True).query_df("SELECT count(*) n FROM request_steps").n.iloc[0])
    print(json.dumps({"what": "store", "db": str(db), "request_steps": n_rows}), flush=True)
    with MetricsExporter(str(db), 0, refresh_s=3600, n_boot=a.n_boot, isolate=not a.in_process) as ex:
        t0 = time.perf_counter()
        assert ex.source.wait_ready(7200), ex.source.last_error
        snap = ex.source.get()
        print(json.dumps({"what": "first snapshot", "wall_s": time.perf_counter() - t0, "compute_s": snap.compute_s}), flush=True)
        idle = stats(scrape_ms(ex.url, a.scrapes))
        print(json.dumps({"what": "scrape, idle", **idle}), flush=True)
        # a re-estimate meanwhile, as when a writer flushes (in the exporter's child process by default)
        busy: list[float] = []
        made: list[bool] = []
        t1 = time.perf_counter()
        worker = threading.Thread(target=lambda: made.append(ex.source.refresh(force=True)))
        worker.start()
        while worker.is_alive():
            busy.extend(scrape_ms(ex.url, 5))
        worker.join()
        assert made == [True], f"the re-estimate failed: {ex.source.last_error}"
        during = stats(np.array(busy))
        print(json.dumps({"what": "scrape, during a re-estimate", "reestimate_s": time.perf_counter() - t1, **during}),
              flush=True)
    print(json.dumps({"what": "ratio", "estimate": "in process" if a.in_process else "child process", "uncached_over_cached_p95": snap.compute_s * 1e3 / idle["p95_ms"],
                      "target_p95_ms": 100, "idle_p95_ok": idle["p95_ms"] <= 100,
                      "during_reestimate_p95_ok": during["p95_ms"] <= 100}), flush=True)


if __name__ == "__main__":
    main()
