"""Writer throughput: PRIMARY KEY (ART, INSERT OR IGNORE) vs index-free dedupe (pruned key lookup + append).

Side by side in one run, on fresh files:
  * batched ``request_steps`` appends (the flush path, ``Store.write_arrow``),
    connection opened per flush (the store's concurrency design) and, for
    reference, one held connection (what the open/checkpoint per flush costs);
  * growth: mean batch time over the first vs the last 10 batches;
  * a full re-ingest of the same rows (all duplicates, must insert 0);
  * the streaming writer end to end with 4 producer threads, unpaced
    (throughput) and paced at --rate rows/s (flush latency at the default 1 s interval).

Run:  .venv/bin/python bench/writer.py [--rows 240000] [--batch 2000]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import duckdb  # noqa: E402

from acceptscope import schema  # noqa: E402
from acceptscope.store import Store  # noqa: E402
from acceptscope.store_dedupe import insert_new_rows  # noqa: E402
from bench.support import synthetic as H  # noqa: E402


def batches(rows: int, batch: int):
    data = H.request_steps(rows, seed=1)
    return [data.slice(i, batch) for i in range(0, rows, batch)]


def bench_flush_path(d: Path, parts) -> dict:
    """Both designs, batches interleaved (PK batch i, index-free batch i, ...) so both see the same load."""
    stores = {pk: Store(d / f"flush_{pk}.duckdb", primary_keys=pk) for pk in (True, False)}
    times: dict[bool, list[float]] = {True: [], False: []}
    for b in parts:
        for pk, store in stores.items():
            s = time.perf_counter()
            store.write_arrow({"request_steps": b})
            times[pk].append(time.perf_counter() - s)
    n = sum(b.num_rows for b in parts)
    out = {}
    for pk, store in stores.items():
        assert store.counts()["request_steps"] == n
        q = len(parts) // 4
        s = time.perf_counter()
        re = sum(store.write_arrow({"request_steps": b})["request_steps"] for b in parts[:q])
        reingest = time.perf_counter() - s
        assert re == 0, "re-ingest inserted duplicates"
        ts = times[pk]
        out[pk] = {
            "rows_per_s": n / sum(ts),
            "median_ms": 1000 * statistics.median(ts),
            "first10_ms": 1000 * statistics.median(ts[:10]),
            "last10_ms": 1000 * statistics.median(ts[-10:]),
            "reingest_rows_per_s": sum(b.num_rows for b in parts[:q]) / reingest,
            "file_mb": os.path.getsize(store.path) / 1e6,
        }
    return out


def bench_held_connection(d: Path, parts) -> dict:
    """One held connection per design (no open/checkpoint per flush), batches interleaved."""
    cons = {}
    for pk in (True, False):
        Store(d / f"held_{pk}.duckdb", primary_keys=pk)
        cons[pk] = duckdb.connect(str(d / f"held_{pk}.duckdb"))
    times: dict[bool, float] = {True: 0.0, False: 0.0}
    for b in parts:
        for pk, con in cons.items():
            s = time.perf_counter()
            con.execute("BEGIN TRANSACTION")
            insert_new_rows(con, schema.REQUEST_STEPS, b, pk)
            con.execute("COMMIT")
            times[pk] += time.perf_counter() - s
    for con in cons.values():
        con.close()
    n = sum(b.num_rows for b in parts)
    return {pk: n / t for pk, t in times.items()}


def bench_writer(path: Path, pk: bool, parts, producers: int = 4, rate: float | None = None) -> dict:
    """4 producer threads; unpaced (throughput) or paced at ``rate`` rows/s in total (latency)."""
    store = Store(path, primary_keys=pk)
    t0 = time.perf_counter()
    with store.writer(flush_interval_s=1.0) as w:
        def produce(k: int) -> None:
            mine = parts[k::producers]
            for j, b in enumerate(mine):
                if rate:
                    due = t0 + j * b.num_rows * producers / rate
                    time.sleep(max(0.0, due - time.perf_counter()))
                w.append("request_steps", b)
        threads = [threading.Thread(target=produce, args=(k,)) for k in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    total = time.perf_counter() - t0
    st = w.stats()
    assert st["rows_inserted"]["request_steps"] == sum(b.num_rows for b in parts)
    return {"rows_per_s": st["rows_inserted"]["request_steps"] / total, "flushes": st["flushes"],
            "max_latency_s": st["max_flush_latency_s"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rows", type=int, default=240_000)
    ap.add_argument("--batch", type=int, default=2_000)
    ap.add_argument("--rate", type=float, default=20_000, help="paced producer rate, rows/s in total")
    a = ap.parse_args()
    parts = batches(a.rows, a.batch)
    print(f"duckdb {duckdb.__version__}; {a.rows} request_steps rows, gamma 7, {len(parts)} batches of {a.batch}")
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        res = bench_flush_path(d, parts)
        held = bench_held_connection(d, parts)
        for pk in (True, False):
            wr = bench_writer(d / f"writer_{pk}.duckdb", pk, parts)
            paced = bench_writer(d / f"paced_{pk}.duckdb", pk, parts[: len(parts) // 2], rate=a.rate)
            r = res[pk]
            r["held_rows_per_s"] = held[pk]
            r["writer_rows_per_s"] = wr["rows_per_s"]
            print(
                f"{'primary key' if pk else 'index-free':11s} | flush path {r['rows_per_s']:7.0f} rows/s, "
                f"median batch {r['median_ms']:6.1f} ms (first10 {r['first10_ms']:6.1f}, last10 {r['last10_ms']:6.1f}) "
                f"| held connection {held[pk]:7.0f} rows/s | re-ingest {r['reingest_rows_per_s']:7.0f} rows/s "
                f"| file {r['file_mb']:5.1f} MB | writer, 4 threads {wr['rows_per_s']:7.0f} rows/s "
                f"| paced {a.rate:.0f} rows/s: {paced['flushes']} flushes, max latency {paced['max_latency_s']:.3f} s"
            )
        pk, aj = res[True], res[False]
        print(
            "ratio index-free / primary key (>1: index-free better): "
            f"flush path x{aj['rows_per_s'] / pk['rows_per_s']:.2f}, "
            f"median batch x{pk['median_ms'] / aj['median_ms']:.2f}, "
            f"held connection x{aj['held_rows_per_s'] / pk['held_rows_per_s']:.2f}, "
            f"re-ingest x{aj['reingest_rows_per_s'] / pk['reingest_rows_per_s']:.2f}, "
            f"file size x{pk['file_mb'] / aj['file_mb']:.2f} smaller"
        )
        print(
            "open + checkpoint per flush: "
            f"index-free x{aj['held_rows_per_s'] / aj['rows_per_s']:.2f}, "
            f"primary key x{pk['held_rows_per_s'] / pk['rows_per_s']:.2f} slower than a held connection"
        )

if __name__ == "__main__":
    main()
