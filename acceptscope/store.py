"""The DuckDB telemetry store: schema creation, idempotent Arrow appends, readers.

Concurrency design
------------------
DuckDB allows one read-write *process* per file (an OS file lock), and inside
one process it refuses a second connection to the same file with a different
``read_only`` setting. The store therefore never keeps a connection open:

* the writer opens the file read-write only for the duration of a flush (one
  transaction across all tables, then close, which checkpoints the WAL);
* readers open short ``read_only`` connections and retry with backoff while a
  flush holds the lock (``_connect``), so a dashboard process reads committed
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

Idempotency
-----------
Every table has a natural key (``schema.Table.key``). Re-ingesting a source
inserts nothing new. Two implementations exist and are detected per file:

* ``primary_keys=True``: the key is a DuckDB ``PRIMARY KEY`` and inserts use
  ``INSERT OR IGNORE`` (an ART index, kept in memory, grows with the table);
* ``primary_keys=False`` (default for new files): no index; each insert first
  looks up which of the batch's keys already exist (a semi-join on the key
  columns only, restricted by the min/max of the batch's integer and string
  key columns so DuckDB's zone maps skip row groups that cannot collide:
  telemetry arrives in ``forward_ct`` order, so a flush only touches the tail
  of the table), drops those rows and duplicates inside the batch in Arrow,
  and appends the rest with a plain INSERT, which keeps arrival order (a
  read without ORDER BY returns rows as written; ``INSERT OR IGNORE`` into a
  PRIMARY KEY table does not). When no stored row lies inside the batch's key
  box at all (a fresh store, a new run, a poll past the stored ``forward_ct``
  range: one zone-map probe tells), the semi-join is skipped and only repeats
  inside the batch are dropped (bulk append: 0.03-0.04 s of checks per 200k
  request_steps instead of 0.06-0.1 s, measured on a fresh table, one core).

``bench/writer.py`` measures both side by side; the figures (see
``acceptscope/writer.py``'s docstring) chose the default.
"""

from __future__ import annotations

import os
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope import schema, summaries
from acceptscope.arrow_columns import one_array
from acceptscope.schema import as_arrow  # noqa: F401 - re-exported: callers import it from here
from acceptscope.writer import TelemetryWriter

_DUCK_TYPES = {
    pa.string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
    schema.F32_LIST: "FLOAT[]",
    schema.F64_LIST: "DOUBLE[]",
    schema.I32_LIST: "INTEGER[]",
    schema.I64_LIST: "BIGINT[]",
}


def duck_type(t: pa.DataType) -> str:
    try:
        return _DUCK_TYPES[t]
    except KeyError:
        raise TypeError(f"no DuckDB type mapping for Arrow type {t}") from None


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _add_trailing_columns(con: duckdb.DuckDBPyConnection, tables: Sequence[schema.Table]) -> None:
    """Columns the record model added at the end of a table since a file was created (nullable only)."""
    for t in tables:
        have = [r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [t.name]).fetchall()]
        names = [c.name for c in t.columns]
        if len(have) < len(names) and names[: len(have)] == have:
            for c in t.columns[len(have):]:
                if c.nullable:
                    con.execute(f"ALTER TABLE {_q(t.name)} ADD COLUMN {_q(c.name)} {duck_type(c.type)}")


def incomplete_runs(runs: Any, run_ids: Any = None) -> list[str]:
    """Run ids of a ``runs`` frame with no ``completed_at`` (see :meth:`Store.mark_complete`)."""
    if "completed_at" not in getattr(runs, "columns", ()):
        return []
    sel = runs if run_ids is None else runs[runs["run_id"].isin(list(run_ids))]
    return [str(r) for r in sel.loc[sel["completed_at"].isna(), "run_id"]]


def create_table_sql(t: schema.Table, primary_key: bool = True) -> str:
    cols = ",\n  ".join(
        f'{_q(c.name)} {duck_type(c.type)}{"" if c.nullable else " NOT NULL"}' for c in t.columns
    )
    if primary_key:
        cols += ",\n  PRIMARY KEY (" + ", ".join(_q(k) for k in t.key) + ")"
    return f"CREATE TABLE IF NOT EXISTS {_q(t.name)} (\n  {cols}\n)"


# ---------------------------------------------------------------------------
# connections
# ---------------------------------------------------------------------------
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


def _check_not_truncated(con: duckdb.DuckDBPyConnection, path: Path) -> None:
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


def _file_state(path: Path) -> tuple | None:
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


def _connect(
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
            _connect(path, True, lock_timeout_s, opener=attach)
            try:
                cur.execute(f"USE {alias}")
                yield cur
            finally:
                cur.execute("USE memory")
                cur.execute(f"DETACH {alias}")
        finally:
            cur.close()


def fetch_arrow(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
    """A query's result as an Arrow table, via the relation API (no extra copy on DuckDB 2.x)."""
    rel = con.sql(sql, params=list(params) if params else None)
    fn = getattr(rel, "to_arrow_table", None) or getattr(rel, "arrow")
    return fn()


def fetch_arrow_reader(
    con: duckdb.DuckDBPyConnection, sql: str, params: Sequence[Any] | None = None, batch_rows: int = 65_536
) -> pa.RecordBatchReader:
    """A query's result as a streaming Arrow reader (bounded memory)."""
    rel = con.sql(sql, params=list(params) if params else None)
    fn = getattr(rel, "to_arrow_reader", None) or getattr(rel, "record_batch")
    return fn(batch_rows)


# ---------------------------------------------------------------------------
# dedupe
# ---------------------------------------------------------------------------
def _literal(v: Any) -> str | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return None


def _packed_keys(t: schema.Table, keys: pa.Table) -> np.ndarray | None:
    """One int64 per row that is equal exactly when the natural keys are; None when they do not fit.

    Integer key columns are offset by their minimum, string ones replaced by their
    dictionary index, and the columns combined in mixed radix. Anything else (a
    float or timestamp key, a NULL, a radix product past 2**62) returns None.
    """
    packed = np.zeros(keys.num_rows, dtype=np.int64)
    span = 1
    for k in t.key:
        col = one_array(keys.column(k))
        if col.null_count:
            return None
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            enc = pc.dictionary_encode(col)
            v = enc.indices.to_numpy().astype(np.int64)
            size = len(enc.dictionary)
        elif pa.types.is_integer(col.type):
            v = col.to_numpy().astype(np.int64)
            lo = int(v.min())
            size = int(v.max()) - lo + 1
            v = v - lo
        else:
            return None
        if span * size > 2**62:
            return None
        packed *= size
        packed += v
        span *= size
    return packed


def dedupe_batch(t: schema.Table, data: pa.Table) -> pa.Table:
    """Drop rows whose natural key repeats an earlier row of the same batch (first one wins).

    The common case, no repeat at all, is settled by sorting one packed int64 per
    row (``_packed_keys``: ~2-4x cheaper than a group-by on 200k request_steps keys).
    Repeats, or keys that do not pack, go through a hash group-by in Arrow (a SQL
    window over the batch materialises every column, list columns included: ~8x slower).
    """
    if data.num_rows < 2:
        return data
    keys = data.select(list(t.key))
    packed = _packed_keys(t, keys)
    if packed is not None:
        s = np.sort(packed)
        if not (s[1:] == s[:-1]).any():
            return data
    elif keys.group_by(list(t.key), use_threads=False).aggregate([]).num_rows == data.num_rows:
        return data
    idx = keys.append_column("_i", pa.array(range(data.num_rows), pa.int64()))
    first = idx.group_by(list(t.key), use_threads=False).aggregate([("_i", "min")]).column("_i_min")
    first = first.combine_chunks()
    return data.take(first.take(pc.sort_indices(first)))  # keep the original row order


def _key_ranges(t: schema.Table, incoming: pa.Table, alias: str) -> list[str]:
    """``alias.k BETWEEN lo AND hi`` for each integer/string key column of the batch.

    Every key of the batch lies in this box, so a stored row outside it cannot
    collide; DuckDB's zone maps skip the row groups that lie outside.
    """
    terms = []
    for k in t.key:
        col = incoming.column(k)
        if not (pa.types.is_integer(col.type) or pa.types.is_string(col.type)):
            continue
        mm = pc.min_max(col).as_py()
        lo, hi = _literal(mm["min"]), _literal(mm["max"])
        if lo is None or hi is None:
            continue
        terms.append(f"{alias}.{_q(k)} BETWEEN {lo} AND {hi}")
    return terms


def _existing_keys_sql(t: schema.Table, box: list[str], keys_view: str) -> str:
    """Row indices (``_i``) of the batch whose natural key is already in the table.

    Only the key columns take part (a semi-join), pruned to the batch's key box
    (``_key_ranges``) so zone maps skip row groups that cannot collide.
    """
    keys = [_q(k) for k in t.key]
    on = " AND ".join(f"e.{k} = i.{k}" for k in keys)
    where = " AND ".join([on] + box)
    return f"SELECT i._i FROM {keys_view} i WHERE EXISTS (SELECT 1 FROM {_q(t.name)} e WHERE {where})"


def _may_collide(con: duckdb.DuckDBPyConnection, t: schema.Table, box: list[str]) -> bool:
    """Whether any stored row lies inside the batch's key box (``_key_ranges``; else none of its keys can exist).

    A probe on zone maps: a fresh table, a new run, or a poll whose ``forward_ct``
    range starts past the stored ones answers False without reading the batch.
    """
    where = " AND ".join(box) or "TRUE"
    return bool(con.execute(f"SELECT EXISTS (SELECT 1 FROM {_q(t.name)} e WHERE {where})").fetchall()[0][0])


def insert_new_rows(con: duckdb.DuckDBPyConnection, t: schema.Table, tbl: pa.Table, primary_keys: bool) -> int:
    """Insert the rows of ``tbl`` (record-model schema) whose natural key is new; returns rows inserted.

    Arrival order is preserved (a plain appending INSERT of the surviving rows),
    so a table read without ORDER BY comes back in the order it was written.
    Index-free: when no stored row lies inside the batch's key box (``_may_collide``)
    the existing-keys semi-join is skipped (bulk append: only in-batch repeats are dropped).
    The rows inserted are folded into the per-run summaries in the same transaction
    (``summaries.add``): the one place every writer (ingest, engine, live) goes through.
    """
    view = f"_incoming_{t.name}"
    summarised = t.name in summaries.SUMMARISED
    if primary_keys and not summarised:
        con.register(view, tbl)
        row = con.execute(f"INSERT OR IGNORE INTO {_q(t.name)} SELECT * FROM {view}").fetchone()
        con.unregister(view)
        return int(row[0]) if row else 0
    tbl = dedupe_batch(t, tbl)
    box = _key_ranges(t, tbl, "e")  # (min and max of every key column: once for the probe and the semi-join)
    if _may_collide(con, t, box):
        keys_view = f"_keys_{t.name}"
        keys = tbl.select(list(t.key)).append_column("_i", pa.array(np.arange(tbl.num_rows, dtype=np.int64)))
        con.register(keys_view, keys)
        dup = con.execute(_existing_keys_sql(t, box, keys_view)).fetchnumpy()["_i"]
        con.unregister(keys_view)
        if len(dup):
            keep = np.ones(tbl.num_rows, dtype=bool)
            keep[np.asarray(dup, dtype=np.int64)] = False
            tbl = tbl.filter(pa.array(keep))
    if tbl.num_rows == 0:
        return 0
    con.register(view, tbl)
    row = con.execute(f"INSERT INTO {_q(t.name)} SELECT * FROM {view}").fetchone()
    con.unregister(view)
    n = int(row[0]) if row else 0
    if summarised:
        if n != tbl.num_rows:  # cannot happen after the semi-join; refuse to miscount rather than guess
            raise RuntimeError(f"{t.name}: inserted {n} of {tbl.num_rows} new rows; summaries would miscount")
        summaries.add(con, t.name, tbl)
    return n


# ---------------------------------------------------------------------------
# the store
# ---------------------------------------------------------------------------
class Store:
    """A DuckDB file holding acceptscope telemetry.

    ``primary_keys`` only matters for a new file (an existing file keeps the
    layout it was created with); see the module docstring. ``read_only=True``
    opens an existing file without creating anything and refuses writes: the
    form a dashboard or notebook uses next to a live writer process.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        lock_timeout_s: float = 30.0,
        primary_keys: bool = False,
        read_only: bool = False,
    ):
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self.lock_stats = LockStats()
        self.read_only = read_only
        if read_only:
            if not self.path.exists():
                raise FileNotFoundError(f"{self.path}: no such database file")
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
        self._key = str(self.path.resolve())
        self.rebuilt_summaries: list[str] = []  # runs whose summaries this open rebuilt from the raw tables
        with self.connect(read_only=read_only) as con:
            if read_only:
                _check_not_truncated(con, self.path)
            existing = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()}
            missing = [t for t in schema.ALL_TABLES if t.name not in existing]
            if missing and read_only:
                raise ValueError(
                    f"{self.path}: not an acceptscope store (missing tables {[t.name for t in missing]})"
                )
            if not read_only:
                _add_trailing_columns(con, [t for t in schema.ALL_TABLES if t.name in existing])
            derived = [] if read_only else [t for t in (schema.STORE_META, *schema.SUMMARY_TABLES)
                                            if t.name not in existing]
            # a new file (no table of ours): nothing to migrate, no summary can be stale; it gets its schema
            # version with its tables (skips ensure()'s and the column check's ~10 queries: ~0.04 CPU-s)
            fresh = not read_only and not existing & {t.name for t in (*schema.ALL_TABLES, schema.STORE_META)}
            if missing or derived:  # one transaction: ~3x cheaper than a commit per CREATE on a new file
                con.execute("BEGIN TRANSACTION")
                try:
                    for t in missing:
                        con.execute(create_table_sql(t, primary_key=primary_keys))
                    for t in derived:  # small tables updated in place (ON CONFLICT): always keyed
                        con.execute(create_table_sql(t, primary_key=True))
                    if fresh:
                        summaries.record_version(con, new_file=True)
                    con.execute("COMMIT")
                except BaseException:
                    con.execute("ROLLBACK")
                    raise
            if not read_only and not fresh:  # a file written by an older release: add the nullable columns added since
                have: dict[str, set] = {}
                for tn, cn in con.execute("SELECT table_name, column_name FROM duckdb_columns()").fetchall():
                    have.setdefault(tn, set()).add(cn)
                for t in schema.ALL_TABLES:
                    if t.name in have:
                        for c in t.columns:
                            if c.nullable and c.name not in have[t.name]:
                                con.execute(f"ALTER TABLE {_q(t.name)} ADD COLUMN {_q(c.name)} {duck_type(c.type)}")
            if any(t.name == "request_steps" for t in missing):  # created just now, as asked
                pk = primary_keys
            else:
                pk = con.execute(
                    "SELECT count(*) FROM duckdb_constraints() WHERE table_name = 'request_steps' "
                    "AND constraint_type = 'PRIMARY KEY'"
                ).fetchone()[0]
            if read_only:
                summaries.check_version(con, self.path)
            elif not fresh:  # a file from before the summaries (or appended to by something else): rebuild them once
                self.rebuilt_summaries = summaries.ensure(con, self.path)
        self.primary_keys = bool(pk)
        self._created = _file_state(self.path) if fresh else None

    def created_empty(self) -> bool:
        """Whether this Store created its file and nothing has written to it since: the file's inode, size and
        times as the create left them, and no WAL beside it (any commit, by this process or another, leaves
        one or rewrites the file). Then no table holds a row, known without opening the file: an open costs
        a DuckDB instance start (~0.05 CPU-s), and the ingest's run lookup asks this first."""
        return self._created is not None and not Path(str(self.path) + ".wal").exists() \
            and _file_state(self.path) == self._created

    def __repr__(self) -> str:
        return f"Store({str(self.path)!r}, primary_keys={self.primary_keys}, read_only={self.read_only})"

    # -- connections ------------------------------------------------------
    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        """A short-lived connection; hold it briefly (it blocks other processes' writers/readers)."""
        active: dict = _ACTIVE.__dict__.setdefault("cons", {})
        outer = active.get(self._key)
        if outer is not None:  # nested on this thread: reuse the open connection
            con, ro = outer
            if ro and not read_only:
                raise RuntimeError(f"{self.path}: read-write connect() nested inside a read-only one")
            cur = con.cursor()
            try:
                yield cur
            finally:
                cur.close()
            return
        lock = _process_lock(self._key)
        with lock:
            con = _connect(self.path, read_only, self.lock_timeout_s, self.lock_stats)
            active[self._key] = (con, read_only)
            try:
                yield con
            finally:
                del active[self._key]
                con.close()

    def snapshot(self) -> Any:
        """Context manager: one read-only connection for several queries on one committed snapshot.

        Keep it short: while it is open, a writer process waits for the file lock.
        """
        return self.connect(read_only=True)

    # -- writes -----------------------------------------------------------
    def write_arrow(self, tables: Mapping[str, pa.Table]) -> dict[str, int]:
        """Insert Arrow tables in ONE transaction; returns rows actually inserted per table.

        Tables already in the record model's schema (``as_arrow`` output) go in as is;
        others are conformed first.
        """
        if self.read_only:
            raise PermissionError(f"{self.path}: this Store was opened read_only")
        inserted: dict[str, int] = {}
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                for name, tbl in tables.items():
                    if tbl.num_rows == 0:
                        inserted[name] = 0
                        continue
                    t = schema.table(name)
                    if tbl.schema != t.arrow_schema:
                        tbl = as_arrow(t, tbl)
                    inserted[name] = insert_new_rows(con, t, tbl, self.primary_keys)
                con.execute("COMMIT")
            except BaseException:
                try:
                    con.execute("ROLLBACK")
                except duckdb.Error:  # the transaction is already gone; the original error matters
                    pass
                raise
        return inserted

    def mark_complete(self, run_ids: Any) -> None:
        """Set ``runs.completed_at`` (now) of the given runs that have no mark yet: the writing command finished.

        A run without it was killed (or is still being written): readers warn
        (:meth:`incomplete_runs`)."""
        ids = [run_ids] if isinstance(run_ids, str) else list(dict.fromkeys(run_ids))
        if not ids:
            return
        with self.connect() as con:
            con.execute(f"UPDATE {_q(schema.RUNS.name)} SET completed_at = now() "
                        "WHERE completed_at IS NULL AND list_contains(?, run_id)", [ids])

    def incomplete_runs(self, run_ids: Any = None) -> list[str]:
        """Runs (of ``run_ids``, default all) without a completion mark. A file written before the
        mark existed has no ``completed_at`` column: nothing is known, nothing is reported."""
        return incomplete_runs(self.query_df(f"SELECT * FROM {_q(schema.RUNS.name)}"), run_ids)

    def append(self, tables: Mapping[str, Any]) -> dict[str, int]:
        """Append data to several tables in one transaction; duplicates by natural key are ignored.

        Returns the number of rows offered per table (``write_arrow`` returns inserted rows).
        """
        arrow = {name: as_arrow(schema.table(name), data) for name, data in tables.items()}
        self.write_arrow(arrow)
        return {name: tbl.num_rows for name, tbl in arrow.items()}

    def update_run(self, run_id: str, values: Mapping[str, Any]) -> int:
        """Set columns of one ``runs`` row (links to tables, temperature); returns rows changed."""
        if self.read_only:
            raise PermissionError(f"{self.path}: this Store was opened read_only")
        if not values:
            return 0
        for c in values:
            schema.RUNS.column(c)
            if c == "run_id":
                raise ValueError("run_id is the key of runs; it cannot be updated")
        sets = ", ".join(f"{_q(c)} = ?" for c in values)
        with self.connect() as con:
            return int(con.execute(f"UPDATE runs SET {sets} WHERE run_id = ?", [*values.values(), run_id])
                       .fetchone()[0])

    def fill_temperatures(self, run_ids: Sequence[str]) -> int:
        """Fill ``request_steps.temperature`` where NULL: the request's own (``requests``), else the
        run's (``runs.temperature``). SGLang's dumps carry none; written once here, every reader (the
        estimators, an exported lake, the dashboard) sees the same temperatures. Returns rows filled."""
        if self.read_only:
            raise PermissionError(f"{self.path}: this Store was opened read_only")
        ids = list(run_ids)
        if not ids:
            return 0
        with self.connect() as con:
            a = con.execute(
                "UPDATE request_steps AS rs SET temperature = q.temperature FROM requests AS q "
                "WHERE rs.run_id = q.run_id AND rs.rid = q.rid AND rs.temperature IS NULL "
                "AND q.temperature IS NOT NULL AND rs.run_id IN (SELECT UNNEST(?))", [ids]).fetchone()[0]
            b = con.execute(
                "UPDATE request_steps AS rs SET temperature = r.temperature FROM runs AS r "
                "WHERE rs.run_id = r.run_id AND rs.temperature IS NULL AND r.temperature IS NOT NULL "
                "AND rs.run_id IN (SELECT UNNEST(?))", [ids]).fetchone()[0]
        return int(a) + int(b)

    def writer(self, **kwargs: Any) -> TelemetryWriter:
        """A streaming, buffered, thread-safe writer (see ``acceptscope.writer``)."""
        return TelemetryWriter(self, **kwargs)

    # -- reads ------------------------------------------------------------
    def summary(self, fn: Any, *args: Any) -> Any:
        """``fn(con, *args)`` of :mod:`acceptscope.summaries` on one read-only snapshot."""
        with self.snapshot() as con:
            return fn(con, *args)

    def query_arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        with self.connect(read_only=True) as con:
            return fetch_arrow(con, sql, params)

    def query_df(self, sql: str, params: Sequence[Any] | None = None) -> pd.DataFrame:
        with self.connect(read_only=True) as con:
            return con.execute(sql, params or []).df()

    def _table_sql(self, name: str, run_id: str | Sequence[str] | None, columns: Sequence[str] | None):
        t = schema.table(name)
        cols = "*"
        if columns is not None:
            for c in columns:
                t.column(c)
            cols = ", ".join(_q(c) for c in columns)
        if run_id is None or "run_id" not in t.names:
            return f"SELECT {cols} FROM {_q(t.name)}", []
        ids = [run_id] if isinstance(run_id, str) else list(run_id)
        return f"SELECT {cols} FROM {_q(t.name)} WHERE run_id IN (SELECT UNNEST(?))", [ids]

    def read_table(
        self, name: str, run_id: str | Sequence[str] | None = None, columns: Sequence[str] | None = None
    ) -> pd.DataFrame:
        """Read one table as a DataFrame, optionally filtered to one or more runs and some columns.

        Goes through Arrow (``read_arrow(...).to_pandas()``): list columns become
        numpy arrays and timestamps UTC, about 2x faster than DuckDB's ``df()``
        for ``request_steps`` (150k rows: 1.4 s vs 2.7 s, 2 shared cores).
        """
        return self.read_arrow(name, run_id, columns).to_pandas()

    def read_arrow(
        self, name: str, run_id: str | Sequence[str] | None = None, columns: Sequence[str] | None = None
    ) -> pa.Table:
        """``read_table`` as an Arrow table in the record model's exact types (lists stay Arrow lists)."""
        t = schema.table(name)
        got = self.query_arrow(*self._table_sql(name, run_id, columns))
        want = pa.schema([t.arrow_schema.field(n) for n in got.column_names])
        return got.cast(want)

    def runs(self) -> pd.DataFrame:
        """Every run, oldest first, each with its ``role`` (schema.ROLES)."""
        return schema.with_roles(self.query_df("SELECT * FROM runs ORDER BY started_at, run_id"))

    def counts(self, run_id: str | None = None) -> dict[str, int]:
        """Rows per table (only tables with a ``run_id`` column when ``run_id`` is given)."""
        tables = [t for t in schema.ALL_TABLES if run_id is None or "run_id" in t.names]
        where = " WHERE run_id = ?" if run_id is not None else ""
        sql = " UNION ALL ".join(
            f"SELECT {i} AS i, count(*) AS n FROM {_q(t.name)}{where}" for i, t in enumerate(tables)
        )
        params = [run_id] * len(tables) if run_id is not None else []
        with self.connect(read_only=True) as con:
            got = dict(con.execute(sql, params).fetchall())
        return {t.name: int(got.get(i, 0)) for i, t in enumerate(tables)}

    def latest_forward_ct(self, run_id: str) -> dict[str, Any]:
        """Cheap 'has anything changed' probe for live refresh.

        Returns row counts of ``steps`` and ``request_steps`` for the run and the
        largest ``(epoch, forward_ct)`` seen in ``steps`` (None when empty). Compare
        the dict with the previous poll's to decide whether to re-query.
        """
        with self.connect(read_only=True) as con:
            n_steps, epoch, fct = con.execute(
                "SELECT count(*), max(epoch), max(forward_ct) FILTER (WHERE epoch = "
                "(SELECT max(epoch) FROM steps WHERE run_id = $1)) FROM steps WHERE run_id = $1",
                [run_id],
            ).fetchone()
            n_rs = con.execute("SELECT count(*) FROM request_steps WHERE run_id = ?", [run_id]).fetchone()[0]
        return {"steps": int(n_steps), "request_steps": int(n_rs), "epoch": epoch, "forward_ct": fct}
