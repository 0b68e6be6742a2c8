"""A bounded hand-off between live producers (poller, tailers, driver) and the store.

Why: a poll of ``/server_info`` can return a whole ring of records at once; if
the store falls behind (a reader holding the file lock, a slow disk), the
producers must slow down rather than grow memory without limit. Producers
``put`` a dict of ``table -> rows`` into a ``queue.Queue(maxsize)``; ``put``
blocks when the queue is full (backpressure, time spent blocked is counted).
One writer thread drains the queue, coalesces what is waiting into one append
per table, and commits through the store's streaming writer when it has one
(``store.writer()``), else through ``store.append``. Errors are sticky: the
next ``put``/``close`` raises them.
"""

from __future__ import annotations

import queue
import threading
import time
from typing import Any, Mapping

import pyarrow as pa

from acceptscope.store import Store, as_arrow
from acceptscope import schema


class SinkError(RuntimeError):
    pass


_STOP = object()


def _as_table(name: str, rows: Any) -> pa.Table:
    t = getattr(rows, "table", None)  # ingest ArrowRows
    if isinstance(t, pa.Table):
        rows = t
    return as_arrow(schema.table(name), rows)


class StoreSink:
    """Bounded queue + one writer thread into a Store."""

    def __init__(self, store: Store, *, max_batches: int = 64, coalesce: int = 32):
        self.store = store
        self.q: queue.Queue = queue.Queue(maxsize=max_batches)
        self.coalesce = coalesce
        self.blocked_s = 0.0
        self.batches = 0
        self.rows: dict[str, int] = {}
        self.max_queue_depth = 0
        self._err: BaseException | None = None
        self._writer = store.writer() if hasattr(store, "writer") else None
        self._thread = threading.Thread(target=self._run, name="live-sink", daemon=True)
        self._thread.start()

    def put(self, tables: Mapping[str, Any], timeout_s: float | None = None) -> None:
        """Queue rows for the store; blocks while the queue is full (backpressure)."""
        if self._err is not None:
            raise SinkError(f"store writer failed: {self._err!r}") from self._err
        tables = {k: v for k, v in tables.items() if v is not None and len(v)}
        if not tables:
            return
        t0 = time.monotonic()
        self.q.put(tables, timeout=timeout_s)
        self.blocked_s += time.monotonic() - t0
        self.max_queue_depth = max(self.max_queue_depth, self.q.qsize())

    def _write(self, items: list[dict]) -> None:
        merged: dict[str, list[pa.Table]] = {}
        for tables in items:
            for name, rows in tables.items():
                merged.setdefault(name, []).append(_as_table(name, rows))
        payload = {n: (ts[0] if len(ts) == 1 else pa.concat_tables(ts)) for n, ts in merged.items()}
        if self._writer is not None:
            for name, tbl in payload.items():
                self._writer.append(name, tbl)
        else:
            self.store.append(payload)
        for name, tbl in payload.items():
            self.rows[name] = self.rows.get(name, 0) + tbl.num_rows
        self.batches += len(items)

    def _run(self) -> None:
        stop = False
        while not stop:
            item = self.q.get()
            items = []
            if item is _STOP:
                stop = True
            else:
                items.append(item)
            while not stop and len(items) < self.coalesce:
                try:
                    nxt = self.q.get_nowait()
                except queue.Empty:
                    break
                if nxt is _STOP:
                    stop = True
                else:
                    items.append(nxt)
            if items and self._err is None:
                try:
                    self._write(items)
                except BaseException as e:  # noqa: BLE001 - sticky, re-raised to producers
                    self._err = e
            for _ in range(len(items) + (1 if stop else 0)):
                self.q.task_done()

    def flush(self) -> None:
        """Wait until everything queued so far is written (and committed)."""
        if self._thread.is_alive():
            self.q.join()
        if self._writer is not None and self._err is None:
            self._writer.flush()
        if self._err is not None:
            raise SinkError(f"store writer failed: {self._err!r}") from self._err

    def close(self) -> None:
        if self._thread.is_alive():
            self.q.put(_STOP)
            self._thread.join()
        if self._writer is not None:
            self._writer.close()
        if self._err is not None:
            raise SinkError(f"store writer failed: {self._err!r}") from self._err

    def stats(self) -> dict:
        return {
            "batches": self.batches,
            "rows": dict(self.rows),
            "blocked_s": round(self.blocked_s, 3),
            "max_queue_depth": self.max_queue_depth,
            "queue_capacity": self.q.maxsize,
        }

    def __enter__(self) -> "StoreSink":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
