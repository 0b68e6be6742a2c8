"""Streaming telemetry writer: many producer threads, one background flusher.

Producers call ``append(table, rows)`` (row dicts, a DataFrame, or Arrow), or
``append_many({table: rows, ...})`` for rows of several tables that must land
in the same flush.
Rows are conformed to the record model in the producer's thread, buffered per
table, and a background thread commits them to DuckDB as Arrow tables, all
tables of one flush in ONE transaction (``Store.write_arrow``), never row by row.
(``background=False``: no thread; the producer whose append finds a flush due
commits it. What a bulk ingest on one CPU uses; see ``TelemetryWriter``.)

Guarantees
----------
* Latency: a flush starts ``flush_interval_s`` minus the (smoothed) recent
  flush duration after the oldest buffered append, so it commits about
  ``flush_interval_s`` after that append; only a flush slower than the
  interval, or a wait for the file lock held by a reader process, pushes
  past it. ``stats()['max_flush_latency_s']`` reports the worst (commit time
  minus the oldest append of that flush).
* Memory: when the buffered rows or bytes pass ``max_buffer_rows`` /
  ``max_buffer_bytes``, the flusher is woken and ``append`` blocks until the
  buffer has been handed to it (backpressure). At most one buffer is being
  written while the next fills, so memory stays under about twice the bound.
* Errors: an exception in the flush thread is sticky. The next ``append``,
  ``flush`` or ``close`` raises ``WriterError`` chained to it; the rows that
  failed to commit are kept in ``writer.failed`` (table -> Arrow) so the
  caller can retry them. Nothing is dropped silently.
* ``flush()`` returns when everything appended before the call is committed;
  ``close()`` flushes and stops the thread; the writer is a context manager.
  Writers still open at interpreter exit are closed by an ``atexit`` hook.

Dedupe design, measured
-----------------------
``bench/writer.py``: 240k request_steps rows, gamma 7, 120 flushes of 2,000 rows,
PK and index-free batches interleaved so both see the same load; DuckDB 2.0.1
on 2 cores shared with other jobs (absolute rates are low). Last run, after the
index-free bulk path (a flush whose key box holds no stored row skips the
semi-join: in-order telemetry almost always), with the ratio range of the four
runs before it (semi-join on every flush)::

                         primary key (ART)   index-free (default)   ratio    (before)
  flush path, rows/s     7,297               10,162                 x1.39    x1.21-1.27
  median flush           258 ms              166 ms                 x1.55    x1.20-1.36
  held connection        37,301              64,191                 x1.72    x1.43-1.48
  re-ingest (all dups)   38,587              54,053                 x1.40    x1.29-2.17
  file size              59.0 MB             38.5 MB                x1.53 smaller
  writer, 4 producers    135,339             259,164                x1.9     x2.1-4.0
  paced 20k rows/s, 1 s interval: max flush latency 1.27 s vs 1.31 s (7 flushes each)

Larger table (``--rows 1000000 --batch 20000``, before the bulk path): index-free
x1.39 flush path, x1.63 median flush, x1.79 held connection, x2.62 re-ingest,
file 203 vs 291 MB; the PK flush grows with the table (first/last 10 flushes
1,058 -> 1,306 ms) while the index-free one stays flat (671 -> 688 ms).

The index-free design (key semi-join, pruned by zone maps, then a plain
append; see ``acceptscope/store_dedupe.py``) wins everywhere, needs no in-memory
index and keeps arrival order, so it is the default
(``Store(primary_keys=False)``). Opening the file per flush (so other
processes can read between flushes) costs x1.9-6.3 against a held connection;
the close also checkpoints, so readers open a clean file with no WAL to replay.
"""

from __future__ import annotations

import atexit
import threading
import time
import weakref
from contextlib import ExitStack
from typing import TYPE_CHECKING, Any, Callable, Mapping

import pyarrow as pa

from acceptscope import schema
from acceptscope.schema import as_arrow

if TYPE_CHECKING:  # the store imports this module (Store.writer), never the other way round
    from acceptscope.store import Store


class WriterError(RuntimeError):
    """The writer's flush thread failed, or the writer is closed."""


_OPEN_WRITERS: "weakref.WeakSet[TelemetryWriter]" = weakref.WeakSet()


@atexit.register
def _close_open_writers() -> None:  # pragma: no cover - exercised at interpreter exit
    for w in list(_OPEN_WRITERS):
        try:
            w.close()
        except Exception:  # noqa: BLE001 - nothing left to report to at exit
            pass


class TelemetryWriter:
    """Buffered, thread-safe writer for one ``Store``. Create it with ``store.writer()``.

    ``background=False``: no flush thread; a flush that falls due (size bound reached, or the
    interval passed since the oldest append) is committed by the ``append`` that finds it due, in
    that producer's thread, as are ``flush()`` and ``close()``. Why: on one usable CPU a flush thread
    cannot overlap the producer, it only adds thread switches (a server dump's bulk ingest pinned to
    one CPU: ~9% more CPU with the thread; ``acceptscope.ingest._bulk_writer`` picks). The latency
    guarantee then holds only while producers keep appending.
    """

    def __init__(
        self,
        store: Store,
        *,
        flush_interval_s: float = 1.0,
        max_buffer_rows: int = 250_000,
        max_buffer_bytes: int = 256 * 1024 * 1024,
        on_flush: Callable[[dict[str, Any]], None] | None = None,
        background: bool = True,
    ):
        if flush_interval_s <= 0:
            raise ValueError(f"flush_interval_s must be > 0, got {flush_interval_s}")
        if max_buffer_rows <= 0 or max_buffer_bytes <= 0:
            raise ValueError("max_buffer_rows and max_buffer_bytes must be > 0")
        if getattr(store, "read_only", False):
            raise PermissionError(f"{store.path}: cannot write through a Store opened read_only")
        self.store = store
        self.flush_interval_s = float(flush_interval_s)
        self.max_buffer_rows = int(max_buffer_rows)
        self.max_buffer_bytes = int(max_buffer_bytes)
        self.on_flush = on_flush
        self.failed: dict[str, pa.Table] = {}

        self._cv = threading.Condition()
        self._buf: dict[str, list[pa.Table]] = {}
        self._buf_rows = 0
        self._buf_bytes = 0
        self._oldest: float | None = None  # monotonic time of the oldest unflushed append
        self._seq_appended = 0
        self._seq_committed = 0
        self._flush_requested = False
        self._closing = False
        self._closed = False
        self._error: BaseException | None = None
        self._handoff = False  # close(then=...): the thread leaves the last buffer to the closing thread

        self._offered: dict[str, int] = {}
        self._inserted: dict[str, int] = {}
        self._flushes = 0
        self._max_latency = 0.0
        self._max_duration = 0.0
        self._total_duration = 0.0
        self._blocked_s = 0.0
        self._max_buffered_bytes = 0
        self._ewma_duration = 0.0  # smoothed flush duration, to start flushes early enough

        self._inline = threading.Lock() if not background else None  # one inline commit at a time
        self._thread = None
        if background:
            self._thread = threading.Thread(target=self._run, name=f"acceptscope-writer:{store.path.name}", daemon=True)
            self._thread.start()
        _OPEN_WRITERS.add(self)

    # -- producer side ----------------------------------------------------
    def _raise_if_failed(self) -> None:
        if self._error is not None:
            lost = {k: v.num_rows for k, v in self.failed.items()}
            raise WriterError(
                f"telemetry writer for {self.store.path} failed in its flush thread "
                f"({type(self._error).__name__}: {self._error}); uncommitted rows kept in writer.failed: {lost}"
            ) from self._error
        if self._closing or self._closed:
            raise WriterError(f"telemetry writer for {self.store.path} is closed")

    def append(self, table: str, rows: Any) -> int:
        """Buffer rows for ``table``; returns the number of rows buffered. May block (backpressure)."""
        return self.append_many({table: rows})[table]

    def append_many(self, tables: Mapping[str, Any]) -> dict[str, int]:
        """Buffer rows for several tables as one unit: they land in the same flush (one transaction).

        Use it for data that must appear together, e.g. a step's ``steps`` row and
        its ``request_steps`` rows, so a reader never sees one without the other.
        """
        with self._cv:
            self._raise_if_failed()
        # conform in the producer's thread; bad input raises here and buffers nothing
        data = {name: as_arrow(schema.table(name), rows) for name, rows in tables.items()}
        counts = {name: tbl.num_rows for name, tbl in data.items()}
        data = {name: tbl for name, tbl in data.items() if tbl.num_rows}
        if not data:
            return counts
        with self._cv:
            self._raise_if_failed()
            for name, tbl in data.items():
                self._buf.setdefault(name, []).append(tbl)
                self._buf_rows += tbl.num_rows
                self._buf_bytes += tbl.nbytes
            self._max_buffered_bytes = max(self._max_buffered_bytes, self._buf_bytes)
            self._seq_appended += 1
            if self._oldest is None:
                self._oldest = time.monotonic()
                self._cv.notify_all()
            inline_due = self._inline is not None and (self._over_bound() or self._due(time.monotonic()))
            if self._inline is None and self._over_bound():
                self._flush_requested = True
                self._cv.notify_all()
                t0 = time.monotonic()
                while self._over_bound() and self._error is None:
                    self._cv.wait(0.5)
                self._blocked_s += time.monotonic() - t0
                self._raise_if_failed()
        if inline_due:
            self._commit_inline()
        return counts

    def _commit_inline(self) -> None:
        """Commit the buffer in the calling thread (a writer without a flush thread)."""
        with self._inline:
            with self._cv:
                taken = self._take()
                if taken is None:
                    self._seq_committed = self._seq_appended
            if taken is not None and not self._commit(*taken):
                with self._cv:
                    self._raise_if_failed()

    def _over_bound(self) -> bool:
        return self._buf_rows > self.max_buffer_rows or self._buf_bytes > self.max_buffer_bytes

    def flush(self, timeout_s: float | None = None) -> None:
        """Commit everything appended before this call; raise ``WriterError`` if the flusher failed."""
        if self._inline is not None:
            self._commit_inline()
        with self._cv:
            self._raise_if_failed()
            target = self._seq_appended
            if self._seq_committed >= target:
                return
            self._flush_requested = True
            self._cv.notify_all()
            deadline = None if timeout_s is None else time.monotonic() + timeout_s
            while self._seq_committed < target and self._error is None:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"flush did not complete within {timeout_s} s")
                self._cv.wait(left if left is not None else 1.0)
            self._raise_if_failed()

    def close(self, then: Callable[[], None] | None = None) -> None:
        """Flush everything, stop the thread. Raises ``WriterError`` if a flush failed (on every call).

        ``then``: closing writes of the caller (the ingest's run marks and links). The thread stops
        after any flush in progress, and the rows still buffered are committed in the calling thread
        inside ``store.connect()``, where ``then()`` runs next: the last flush and the closing writes
        share one connection, one DuckDB instance start (~0.05 CPU-s) instead of two. The thread must
        be stopped before the caller takes the file (its flush would wait on the caller's lock), which
        is why the writer, not the caller, opens that connection. Not run when a flush failed.
        """
        with self._cv:
            first = not self._closed and not self._closing
            if not self._closed:
                self._closing = True
                self._handoff = then is not None and first
                self._cv.notify_all()
        if self._thread is not None:
            self._thread.join()
        elif first and then is None:
            try:
                self._commit_inline()
            except WriterError:
                pass  # (raised below, with the writer marked closed)
        with self._cv:
            self._closed = True
            _OPEN_WRITERS.discard(self)
            if self._error is not None:
                self._raise_if_failed()
            handoff, self._handoff = self._handoff, False
        if handoff:
            with self._cv:
                taken = self._take()
            with ExitStack() as held:
                try:
                    held.enter_context(self.store.connect())
                except BaseException as e:  # noqa: BLE001 - as a failed flush: sticky, the rows kept
                    self._fail(e, self._tables(taken[0]) if taken is not None else {})
                if taken is not None and not self._commit(*taken):
                    with self._cv:
                        self._raise_if_failed()
                then()

    def __enter__(self) -> "TelemetryWriter":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def stats(self) -> dict[str, Any]:
        """Counters: rows offered/inserted per table, flushes, latencies (s), backpressure time."""
        with self._cv:
            return {
                "rows_offered": dict(self._offered),
                "rows_inserted": dict(self._inserted),
                "flushes": self._flushes,
                "max_flush_latency_s": self._max_latency,
                "max_flush_duration_s": self._max_duration,
                "mean_flush_duration_s": self._total_duration / self._flushes if self._flushes else 0.0,
                "blocked_s": self._blocked_s,
                "buffered_rows": self._buf_rows,
                "max_buffered_bytes": self._max_buffered_bytes,
                "lock": self.store.lock_stats.as_dict(),
            }

    # -- flusher side -----------------------------------------------------
    def _lead_s(self) -> float:
        """Start a flush this long after the oldest append so that it *commits* near the interval."""
        return max(0.1 * self.flush_interval_s, self.flush_interval_s - self._ewma_duration)

    def _due(self, now: float) -> bool:
        return self._oldest is not None and now - self._oldest >= self._lead_s()

    def _run(self) -> None:
        while True:
            with self._cv:
                while True:
                    now = time.monotonic()
                    if self._closing or self._flush_requested or self._due(now):
                        break
                    wait = None if self._oldest is None else self._lead_s() - (now - self._oldest)
                    self._cv.wait(wait)
                if self._closing and self._handoff:
                    return  # close() commits what is left, in its own thread
                self._flush_requested = False
                if not self._buf:
                    self._seq_committed = self._seq_appended
                    self._cv.notify_all()
                    if self._closing:
                        return
                    continue
                taken = self._take()
            if not self._commit(*taken):
                return

    def _take(self) -> tuple[dict[str, list[pa.Table]], int, float | None] | None:
        """The buffered tables (None when empty), emptied; call with ``_cv`` held."""
        if not self._buf:
            return None
        parts, self._buf = self._buf, {}
        upto, oldest = self._seq_appended, self._oldest
        self._buf_rows = self._buf_bytes = 0
        self._oldest = None
        self._cv.notify_all()  # producers blocked on backpressure may continue
        return parts, upto, oldest

    @staticmethod
    def _tables(parts: dict[str, list[pa.Table]]) -> dict[str, pa.Table]:
        return {name: pa.concat_tables(p) if len(p) > 1 else p[0] for name, p in parts.items()}

    def _stick(self, e: BaseException, tables: dict[str, pa.Table] | None = None) -> None:
        """Make ``e`` the sticky error (and ``tables``, when given, the rows kept for a retry)."""
        with self._cv:
            self._error = e
            if tables is not None:
                self.failed = tables
            self._cv.notify_all()

    def _fail(self, e: BaseException, tables: dict[str, pa.Table]) -> None:
        """:meth:`_stick`, then raise it as a WriterError."""
        self._stick(e, tables)
        with self._cv:
            self._raise_if_failed()

    def _commit(self, parts: dict[str, list[pa.Table]], upto: int, oldest: float | None) -> bool:
        """Write one flush's tables in one transaction; False (the error made sticky) when it failed."""
        tables = self._tables(parts)
        t0 = time.monotonic()
        try:
            inserted = self.store.write_arrow(tables)
        except BaseException as e:  # noqa: BLE001 - surfaced to producers, never dropped
            self._stick(e, tables)
            return False
        done = time.monotonic()
        with self._cv:
            self._flushes += 1
            for name, tbl in tables.items():
                self._offered[name] = self._offered.get(name, 0) + tbl.num_rows
                self._inserted[name] = self._inserted.get(name, 0) + inserted.get(name, 0)
            self._max_latency = max(self._max_latency, done - (oldest or t0))
            self._max_duration = max(self._max_duration, done - t0)
            self._total_duration += done - t0
            d = done - t0
            self._ewma_duration = d if self._flushes == 1 else 0.7 * self._ewma_duration + 0.3 * d
            self._seq_committed = upto
            info = {"flush": self._flushes, "rows_offered": dict(self._offered),
                    "rows_inserted": dict(self._inserted), "duration_s": done - t0}
            self._cv.notify_all()
        if self.on_flush is not None:
            try:
                self.on_flush(info)
            except BaseException as e:  # noqa: BLE001
                self._stick(e)
                return False
        return True
