"""Opening a store file: DuckDB's one-writer file lock, shared with readers in other processes and threads.

Concurrency design
------------------
DuckDB allows one read-write *process* per file (an OS file lock), and inside
one process it refuses a second connection to the same file with a different
``read_only`` setting. The store therefore never keeps a connection open:

* the writer opens the file read-write only for the duration of a flush (one
  transaction across all tables, then close, which checkpoints the WAL);
* readers open short ``read_only`` connections and retry with backoff while a
  flush holds the lock (:func:`connect_file`), so a dashboard process reads committed
  snapshots while a run is being written;
* the writer has priority: while it waits for the lock it keeps a
  ``<db>.writer-waiting`` marker fresh, and readers hold off new connections
  until it is in (otherwise overlapping reader locks starve it);
* inside one process a per-file lock serialises connections, so a reader
  thread and the writer thread of the same process take turns instead of
  tripping DuckDB's "different configuration" error. Nested ``connect()``
  calls on one thread reuse the open connection.

``tests/test_concurrent_read.py`` checks this with real processes (a writer
streaming for seconds, two readers polling every 100 ms); the figures are in
that test's printed summary and in the store helper's report.

Why a module of its own: every open of a store file (``Store.connect``, the dashboard's
:func:`open_read_only`) goes through this discipline, and the ``Store`` class only asks it for a connection.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import duckdb

_PROCESS_LOCKS: dict[str, threading.RLock] = {}
_PROCESS_LOCKS_GUARD = threading.Lock()
_ACTIVE = threading.local()  # per thread: {path: (connection, read_only)}


def _process_lock(path: str) -> threading.RLock:
    with _PROCESS_LOCKS_GUARD:
        return _PROCESS_LOCKS.setdefault(path, threading.RLock())


class LockStats:
    """How often opening the file had to wait for another holder, and for how long."""

    def __init__(self) -> None:
        self.opens = 0
        self.retries = 0
        self.waited_opens = 0
        self.max_wait_s = 0.0  # longest open that had to retry (includes the open itself)
        self.max_open_s = 0.0  # longest open overall
        self._lock = threading.Lock()

    def record(self, retries: int, elapsed_s: float) -> None:
        with self._lock:
            self.opens += 1
            self.retries += retries
            self.max_open_s = max(self.max_open_s, elapsed_s)
            if retries:
                self.waited_opens += 1
                self.max_wait_s = max(self.max_wait_s, elapsed_s)

    def as_dict(self) -> dict[str, float]:
        return {
            "opens": self.opens,
            "retries": self.retries,
            "waited_opens": self.waited_opens,
            "max_wait_s": round(self.max_wait_s, 4),
            "max_open_s": round(self.max_open_s, 4),
        }


def _is_busy(e: Exception) -> bool:
    msg = str(e).lower()
    return (isinstance(e, duckdb.IOException) and "lock" in msg) or (
        isinstance(e, duckdb.ConnectionException) and "different configuration" in msg
    )


_DUCKDB_HEADER_BYTES = 3 * 4096  # the main header and the two database headers before the first block


def check_not_truncated(con: duckdb.DuckDBPyConnection, path: Path) -> None:
    """Raise when the file is shorter than the blocks in use its header counts (a cut copy or a
    partial download). Why: DuckDB reads blocks lazily, so a truncated file can open and answer
    from the blocks that survived while the rest of the data is gone. Used blocks, not all: free
    blocks at the end are trimmed from the file. Read-only opens only, and not while a
    write-ahead log is pending (its blocks are not in the file yet)."""
    if Path(f"{path}.wal").exists():
        return
    row = con.execute("SELECT block_size, used_blocks FROM pragma_database_size() "
                      "WHERE database_name = current_database()").fetchone()
    if not row or not row[0]:
        return
    expected = _DUCKDB_HEADER_BYTES + int(row[0]) * int(row[1])
    size = path.stat().st_size
    if size < expected:
        raise ValueError(f"{path}: truncated DuckDB file ({size:,} bytes; its header counts {int(row[1])} blocks in use "
                         f"of {int(row[0]):,} bytes = {expected:,})")


def file_state(path: Path) -> tuple | None:
    """(inode, size, mtime, ctime) of a file in ns, None when it cannot be read: what a write changes."""
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


WRITER_WAITING_SUFFIX = ".writer-waiting"
_MARKER_STALE_S = 2.0  # a marker not refreshed for this long is from a dead writer: ignore it


def _writer_waiting(marker: Path) -> bool:
    try:
        return time.time() - marker.stat().st_mtime < _MARKER_STALE_S
    except FileNotFoundError:
        return False


def _fit_threads(con: duckdb.DuckDBPyConnection) -> None:
    """Cap DuckDB's worker threads at the CPUs this process may run on.

    DuckDB sizes its pool from the machine's core count and ignores the process's CPU
    affinity (``taskset``, a cgroup cpuset): pinned to one CPU it still starts a second
    worker, which only adds context switches (measured: ``Store.write_arrow`` of 204,800
    request_steps on one pinned core, five alternating runs each: best 0.39 s CPU with
    threads=1 vs 0.44 s with DuckDB's 2, medians 0.41 vs 0.45 s).
    A process allowed on every core keeps DuckDB's default.
    """
    allowed = usable_cpus()
    if allowed < (os.cpu_count() or allowed):
        con.execute(f"SET threads={max(allowed, 1)}")


def usable_cpus() -> int:
    """CPUs this process may run on: its affinity mask where the OS has one, else the core count."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # not Linux
        return os.cpu_count() or 1


def connect_file(
    path: str | Path, read_only: bool, timeout_s: float, stats: LockStats | None = None,
    opener: Any = None,
) -> duckdb.DuckDBPyConnection:
    """Open a connection, retrying with backoff while another process holds the file lock.

    Writer priority: a read-write opener that finds the file busy touches
    ``<db>.writer-waiting`` (refreshed on every retry, removed once it is in);
    read-only openers do not start while a fresh marker exists. Without this,
    several readers polling every 100 ms keep a shared lock held almost
    continuously and starve the writer (measured: 1.5 s waits with 2 readers).
    """
    start = time.monotonic()
    deadline = start + timeout_s
    delay = 0.002
    retries = 0
    marker = Path(str(path) + WRITER_WAITING_SUFFIX)
    marked = False
    try:
        while True:
            if read_only and _writer_waiting(marker) and time.monotonic() < deadline:
                retries += 1
                time.sleep(0.005)
                continue
            try:
                con = opener() if opener is not None else duckdb.connect(str(path), read_only=read_only)
            except (duckdb.IOException, duckdb.ConnectionException) as e:
                if not _is_busy(e):
                    raise
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"{path}: could not open {'read-only' if read_only else 'read-write'} within "
                        f"{timeout_s:.1f} s because another connection holds the file: {e}"
                    ) from e
                if not read_only and isinstance(e, duckdb.IOException):
                    try:
                        marker.touch()
                        marked = True
                    except OSError:  # read-only directory: no priority, still correct
                        pass
                retries += 1
                time.sleep(delay)
                delay = min(delay * 2, 0.02 if marked else 0.05)
                continue
            if stats is not None:
                stats.record(retries, time.monotonic() - start)
            if opener is None:
                _fit_threads(con)
            return con
    finally:
        if marked:
            try:
                marker.unlink()
            except FileNotFoundError:
                pass


_HOST: dict = {}  # pid -> this process's in-memory DuckDB that read-only opens ATTACH files to
_ALIASES = iter(range(1 << 62))


def _attach_host() -> duckdb.DuckDBPyConnection:
    """One in-memory DuckDB per process (re-made after a fork) to ATTACH store files to.

    Creating a DuckDB instance costs 0.1-0.15 s of CPU here (its catalog), ATTACH of a file
    read-only 0.01-0.03 s (measured side by side, 2 loaded cores), and a short read (a
    dashboard panel) is otherwise dominated by that start-up. DETACH releases the file lock
    as closing a connection does, so writers get the file between reads as before.
    """
    with _PROCESS_LOCKS_GUARD:
        host = _HOST.get(os.getpid())
        if host is None:
            _HOST.clear()
            # no replacement scans: a missing table must fail as one, not read a Python variable of that name
            host = _HOST[os.getpid()] = duckdb.connect(config={"python_enable_replacements": False})
            _fit_threads(host)
        return host


@contextmanager
def connection(key: str, path: Path, read_only: bool, timeout_s: float,
               stats: LockStats | None = None) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short-lived connection to the file ``key`` (its resolved path); closed when the block ends.

    Nested on this thread it reuses the open connection (a cursor of it): a read-write one nested in a
    read-only one is refused. Otherwise the per-file process lock serialises this process's threads and
    :func:`connect_file` waits out other processes.
    """
    active: dict = _ACTIVE.__dict__.setdefault("cons", {})
    outer = active.get(key)
    if outer is not None:
        con, ro = outer
        if ro and not read_only:
            raise RuntimeError(f"{path}: read-write connect() nested inside a read-only one")
        cur = con.cursor()
        try:
            yield cur
        finally:
            cur.close()
        return
    with _process_lock(key):
        con = connect_file(path, read_only, timeout_s, stats)
        active[key] = (con, read_only)
        try:
            yield con
        finally:
            del active[key]
            con.close()


@contextmanager
def open_read_only(path: str | Path, lock_timeout_s: float = 10.0) -> Iterator[duckdb.DuckDBPyConnection]:
    """A short read-only connection with the store's lock discipline, without the schema check.

    For readers next to a live writer (the dashboard): open, query, close; never hold it.
    The file is attached read-only to this process's in-memory DuckDB (``_attach_host``) and
    made the default database of a fresh cursor; leaving the block detaches it.
    """
    with _process_lock(str(Path(path).resolve())):
        cur = _attach_host().cursor()
        alias = f"acceptscope_ro_{next(_ALIASES)}"
        target = "'" + str(path).replace("'", "''") + "'"

        def attach() -> duckdb.DuckDBPyConnection:
            cur.execute(f"ATTACH {target} AS {alias} (READ_ONLY)")
            return cur

        try:
            connect_file(path, True, lock_timeout_s, opener=attach)
            try:
                cur.execute(f"USE {alias}")
                yield cur
            finally:
                cur.execute("USE memory")
                cur.execute(f"DETACH {alias}")
        finally:
            cur.close()
