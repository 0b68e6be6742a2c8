"""Whole requests out of the store: ``request_steps`` read run by run in request order and cut into chunks
that never split a request, and stable hash-samples of requests. Every executor of :mod:`estimators.pipeline` that
reads a DuckDB store gets its chunks here (the Spark executors cut their partitions with
:func:`whole_requests` too).

Memory: a run of up to :data:`SORT_ROWS` request-steps is sorted in memory, a bigger one by DuckDB, its sort
capped (:func:`sort_memory`, spilling beyond); a chunk is ``chunk_rows`` request-steps, so a pass holds one
chunk on top of the sort whatever the run's size."""

from __future__ import annotations

import math
import tempfile
from typing import Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope.store import fetch_arrow, fetch_arrow_reader
from acceptscope.estimators.bootstrap import request_keys, uniforms

TAIL_COLUMNS = ("run_id", "rank", "epoch", "forward_ct", "rid", "step_index", "prefix_len", "window", "correct_drafts",
                "cap_trim", "bonus_token", "draft_tokens", "confidence", "confidence_logit", "draft_logprob",
                "target_logprob", "committed_tokens", "ceiling", "temperature", "workload", "finished")
ORDER = "run_id, rid, epoch, forward_ct"
S_ORDER = "s.run_id, s.rid, s.epoch, s.forward_ct"
PLANNER_ROWS = 1 << 17  # request-steps of the first decode steps a big run's planner audit recomputes
DUCKDB_MEMORY = "256MB"  # DuckDB's share while sorting by request (it spills beyond; 3M: 955 vs 1051 MB peak at 384MB)
AUTO_MEMORY = "auto"  # run_all_stream: DuckDB's share from the rows sorted (:func:`sort_memory`)
SORT_ROWS = 1 << 19  # a run up to this many request-steps is read whole and sorted in memory (request_chunks)
CHUNK_ROWS = 1 << 16  # request-steps per chunk: a chunk's estimator arrays sit on top of the sort (1 << 17: +~100 MB)


def s_columns(columns) -> str:
    """The SELECT list of ``columns`` over ``request_steps s``: plain column reads (temperatures are filled
    where the data is written, :mod:`acceptscope.domain.temperature`)."""
    return ", ".join(f's."{c}"' for c in columns)


def fetch_by_request(con, sql: str, params: list | None, columns) -> pa.Table:
    """A query's whole result (``sql`` without ORDER BY, selecting ``columns``) in :data:`ORDER`, sorted here
    rather than by DuckDB when ``columns`` hold the keys (``run_id, rid, epoch, forward_ct``), else by
    DuckDB's ORDER BY.

    Why: DuckDB sorts a row with its payload, and a request-step carries six lists; a run's 349k rows
    took 0.58 CPU-s ordered in DuckDB against 0.38 read as stored and put in order by one ``lexsort`` of
    the keys and one Arrow ``take``. The strings order by their code points, as DuckDB's byte order of
    UTF-8 does. For a result that may not fit in memory, :func:`request_chunks` keeps DuckDB's external
    sort; a caller that builds a :class:`~estimators.frame.BlockFrame` needs no order at all (the frame
    sorts its own rows: ``read_sample(ordered=False)``)."""
    if not set(ORDER.split(", ")) <= set(columns):
        return fetch_arrow(con, f"{sql} ORDER BY {S_ORDER}", params)
    tbl = fetch_arrow(con, sql, params)
    if tbl.num_rows < 2:
        return tbl
    keys = [tbl.column(c).to_numpy() for c in ("forward_ct", "epoch")]
    for c in ("rid", "run_id"):  # each string column as the rank of its value among the distinct ones
        d = pc.dictionary_encode(tbl.column(c).combine_chunks())  # one dictionary for every chunk
        rank = np.empty(len(d.dictionary), np.int64)
        rank[np.asarray(pc.sort_indices(d.dictionary))] = np.arange(rank.size)
        keys.append(rank[np.asarray(d.indices)])
    return tbl.take(np.lexsort(keys))


def sort_memory(rows: int) -> str:
    """DuckDB's memory for sorting ``rows`` request-steps by request: at least :data:`DUCKDB_MEMORY`,
    growing with the square root of the rows (its external sort merges sorted runs that each need a
    buffer in memory: 256 MB sorted 10M request-steps and ran out at 100M; 1 GB sorted 100M, see
    docs/scale.md §8)."""
    return f"{max(256, round(320 * math.sqrt(max(rows, 0) / 10e6)))}MB"


def configure(con, duckdb_memory: str | None) -> None:
    if duckdb_memory:
        con.execute(f"SET memory_limit='{duckdb_memory}'")
    spill = f"{tempfile.gettempdir()}/acceptscope-duckdb-spill"
    if con.execute("SELECT current_setting('temp_directory')").fetchone()[0] != spill:
        try:  # a nested cursor shares the database: its spill directory cannot change once used
            con.execute(f"SET temp_directory='{spill}'")
        except duckdb.NotImplementedException:
            pass
    con.execute("SET preserve_insertion_order=false")
    con.execute("SET threads=1")  # the sort by request: one thread's buffers (10M: 697 vs 778 MB, same CPU-s)
    try:
        con.execute("SET enable_progress_bar=false")
    except duckdb.Error:  # in a Jupyter kernel DuckDB wants ipywidgets to change this: leave it
        pass


def request_chunks(store, run_ids, chunk_rows: int = CHUNK_ROWS, columns=TAIL_COLUMNS, where: str = "",
                   params: list | None = None, duckdb_memory: str | None = DUCKDB_MEMORY,
                   whole_runs: bool = False, sort_rows: int = SORT_ROWS) -> Iterator[tuple[str, pa.Table]]:
    """``(run_id, table)`` pieces of ``request_steps`` holding whole requests of one run, about
    ``chunk_rows`` rows each (a request longer than that is one piece), run after run in run order.
    ``whole_runs``: cut only between runs (each run is one piece, however long).

    A run of at most ``sort_rows`` request-steps is read whole and put in order in memory
    (:func:`fetch_by_request`: the 2M-row fleet's pass 2.5 -> 1.6 CPU-s); longer runs, and reads with a ``where``,
    stream out of DuckDB's external sort, so memory stays bounded by ``sort_rows`` whatever the run."""
    with store.connect(read_only=True) as con:
        configure(con, duckdb_memory)
        select = f"SELECT {s_columns(columns)} FROM request_steps s"
        if where or params:
            sql = f"{select} WHERE s.run_id IN (SELECT UNNEST(?)) {where} ORDER BY {S_ORDER}"
            reader = fetch_arrow_reader(con, sql, [list(run_ids)] + list(params or []),
                                        batch_rows=min(chunk_rows, 1 << 16))
            for tbl in whole_requests(reader, chunk_rows, whole_runs):
                yield from split_runs(tbl)
            return
        rows = dict(con.execute("SELECT run_id, count(*) FROM request_steps WHERE run_id IN (SELECT UNNEST(?)) "
                                "GROUP BY run_id", [list(run_ids)]).fetchall())
        for run in sorted(rows):  # code point order: DuckDB's byte order of UTF-8
            if rows[run] <= sort_rows:
                tbl = fetch_by_request(con, f"{select} WHERE s.run_id = ?", [run], columns)
                batches = tbl.to_batches(max_chunksize=min(chunk_rows, 1 << 16))
                del tbl
            else:
                batches = fetch_arrow_reader(con, f"{select} WHERE s.run_id = ? ORDER BY {S_ORDER}", [run],
                                             batch_rows=min(chunk_rows, 1 << 16))
            for tbl in whole_requests(batches, chunk_rows, whole_runs):
                yield run, tbl


def whole_requests(batches, chunk_rows: int, whole_runs: bool = False) -> Iterator[pa.Table]:
    """Regroup record batches sorted by (run_id, rid) into tables of about ``chunk_rows`` rows that
    never split a request (a request longer than that is one table), nor a run with ``whole_runs``.
    Shared by this module's store pass and the Spark executors' partition pass."""
    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        size += batch.num_rows
        if size < chunk_rows:
            continue
        tbl = pa.Table.from_batches(pending)
        cut = last_request_start(tbl, whole_runs)
        if cut == 0:  # one request so far: keep reading
            continue
        yield tbl.slice(0, cut)
        rest = tbl.slice(cut).combine_chunks()
        pending, size = rest.to_batches(), rest.num_rows
    if size:
        yield pa.Table.from_batches(pending)


def last_request_start(tbl: pa.Table, whole_runs: bool = False) -> int:
    """Index of the first row of the table's last (run_id, rid), or last run_id with ``whole_runs``
    (rows sorted by run_id, rid)."""
    n = tbl.num_rows
    run, rid = tbl.column("run_id"), tbl.column("rid")
    same = pc.equal(run, run[n - 1]) if whole_runs else pc.and_(pc.equal(rid, rid[n - 1]), pc.equal(run, run[n - 1]))
    return int(pc.index(same, True).as_py())


def split_runs(tbl: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    run = tbl.column("run_id").combine_chunks()
    if run[0] == run[len(run) - 1]:
        yield run[0].as_py(), tbl
        return
    codes = np.asarray(pc.dictionary_encode(run).indices)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(codes)) + 1, [len(codes)]])
    for a, b in zip(starts[:-1], starts[1:]):
        yield run[int(a)].as_py(), tbl.slice(int(a), int(b - a))


def sample_from_counts(batches, max_rows: int, seed: int) -> pa.Table | None:
    """A stable hash-sample of requests with at most ``max_rows`` request-steps in all, from their
    per-request counts (Arrow batches of ``run_id, rid, n``; ``None``: every request fits): the
    requests of lowest uniform (:func:`uniforms` of the request key, stream 3) while their
    request-steps add up to ``max_rows`` (at least one request).

    Streamed, keeping only the candidates: a request outside the lowest-uniform prefix of some
    requests is outside it for any superset of them, so memory is bounded by the sample, not by the
    run's requests (3.9M requests at 100M: 1.46 GB when they were held in pandas)."""
    keep = None  # (run_id, rid, n, u) of the candidates, in uniform order
    total = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        run = batch.column("run_id").to_numpy(zero_copy_only=False)
        rid = batch.column("rid").to_numpy(zero_copy_only=False)
        n = batch.column("n").to_numpy().astype(np.int64)
        total += int(n.sum())
        cand = (run, rid, n, uniforms(request_keys(run, rid), 0, seed, stream=3))
        if keep is not None:
            cand = tuple(np.concatenate([a, b]) for a, b in zip(keep, cand))
        order = np.argsort(cand[3], kind="stable")
        fits = int(np.searchsorted(np.cumsum(cand[2][order]), max_rows, side="right"))
        keep = tuple(a[order[:max(fits, 1)]] for a in cand)
    if keep is None or total <= max_rows:
        return None
    return pa.table({"run_id": keep[0].astype(str), "rid": keep[1].astype(str)})


def sample_requests(store, run_ids, max_rows: int, seed: int, duckdb_memory: str | None = DUCKDB_MEMORY,
                     batch_rows: int = 1 << 16) -> pa.Table | None:
    """:func:`sample_from_counts` over the runs' per-request counts, aggregated in DuckDB and
    read in batches of ``batch_rows`` requests."""
    sql = ("SELECT run_id, rid, count(*) AS n FROM request_steps WHERE run_id IN (SELECT UNNEST(?)) "
           "GROUP BY run_id, rid")
    with store.connect(read_only=True) as con:
        configure(con, duckdb_memory)
        return sample_from_counts(fetch_arrow_reader(con, sql, [list(run_ids)], batch_rows=batch_rows), max_rows, seed)


def read_sample(store, run_ids, max_rows: int, seed: int = 0, columns=TAIL_COLUMNS,
                duckdb_memory: str | None = DUCKDB_MEMORY, total: int | None = None, ordered: bool = True) -> pa.Table:
    """``request_steps`` of a stable hash-sample of the runs' requests (whole requests; at most
    ``max_rows`` rows, all of them when they fit), ordered by request. ``total``: the runs' request-steps
    when the caller counted them (all of them fit: no per-request count to sample from). ``ordered=False``:
    in stored order, for a caller that builds a :class:`~estimators.frame.BlockFrame` of it (which puts its
    rows in request order itself, its list columns after padding: cheaper than any sort of the lists)."""
    def fetch(con, sql, params=None):
        return fetch_by_request(con, sql, params, columns) if ordered else fetch_arrow(con, sql, params)

    sel = None if total is not None and total <= max_rows else sample_requests(store, run_ids, max_rows, seed,
                                                                                duckdb_memory)
    with store.connect(read_only=True) as con:
        configure(con, duckdb_memory)
        cols = s_columns(columns)
        if sel is None:
            sql = f"SELECT {cols} FROM request_steps s WHERE s.run_id IN (SELECT UNNEST(?))"
            return fetch(con, sql, [list(run_ids)])
        con.register("_acceptscope_sample", sel)
        try:
            sql = (f"SELECT {cols} FROM request_steps s SEMI JOIN _acceptscope_sample k "
                   f"ON s.run_id = k.run_id AND s.rid = k.rid")
            return fetch(con, sql)
        finally:
            con.unregister("_acceptscope_sample")
