"""Per-run summaries the store keeps as it appends, and the panel queries that read them.

Why this module exists: with two 5M-row runs selected, panel queries that aggregate
``request_steps`` took 0.3-13 s and the dashboard process 7.7 GB. The store instead keeps
small summary tables (``schema.SUMMARY_TABLES``: sums per run x workload x window, per
request, per draft position, per calibration bin, per run's steps, per 64 steps, per request
key: ``(workload, prompt_index, seed)``, the audit arms' pairing; distinct requests per run and
workload) in the same transaction
as every append (:func:`add`, called by ``Store.write_arrow``: ingest, the engine's
writer and live capture all go through it), counting only rows actually inserted. A panel
reads those (kilobytes) instead of millions of rows.

Stale or missing summaries (a file written before schema version 2, or rows appended by
something that bypassed ``Store.write_arrow``) are detected per run by comparing row counts
(:func:`stale_runs`); such runs are aggregated from the raw tables by DuckDB with the same
SQL (:func:`_agg_sql`), so every query answers the same either way. A read-write open
(:func:`ensure`) rebuilds them once. Nothing deletes rows, and the only in-place UPDATE the store
makes (``fill_temperatures``) touches a column no summary reads; an UPDATE of a summarised column
from outside would not be noticed (row counts are unchanged).

All functions take an open DuckDB connection; the caller owns the locking discipline
(``acceptscope.store``). This module imports nothing from the store (no import cycle).
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope import batch_summaries, schema

RELIABILITY_BINS = 15  # equal-width bins kept by sum_reliability; other bin counts read the raw table
RS, STEPS, REQ, RUNS = (schema.REQUEST_STEPS.name, schema.STEPS.name, schema.REQUESTS.name, schema.RUNS.name)
Step = Callable[[Callable[[], Any]], Any]  # runs one step of a rebuild: inline, or in a transaction of its own


def _inline(step: Callable[[], Any]) -> Any:
    """A rebuild step in the caller's transaction (the default :data:`Step`)."""
    return step()

_COUNTS = """count(*) AS n,
  coalesce(sum(acc_len), 0)::BIGINT AS sum_acc_len, count(acc_len) AS n_acc_len,
  coalesce(sum("window"), 0)::BIGINT AS sum_window, count("window") AS n_window,
  coalesce(sum(correct_drafts), 0)::BIGINT AS sum_correct, count(correct_drafts) AS n_correct,
  coalesce(sum(ceiling::BIGINT + 1), 0)::BIGINT AS sum_ceil1, count(ceiling) AS n_ceil,
  coalesce(sum(acc_len) FILTER (WHERE ceiling IS NOT NULL), 0)::BIGINT AS sum_acc_len_ceil,
  coalesce(sum(cap_trim), 0)::BIGINT AS sum_cap_trim, count(cap_trim) AS n_cap_trim"""


def _agg_sql(t: schema.Table, src: str, n_bins: int = RELIABILITY_BINS, max_len: int | None = None) -> str:
    """The SELECT that builds summary table ``t``'s rows from ``src`` (a relation of raw rows).

    The one definition of every summary: used on each appended batch, on a rebuild, and as
    the fallback for runs whose summaries are stale. ``max_len`` (the longest survival list in
    ``src``, known for an appended batch): positions are summed without unnesting every row
    (:func:`_positions_grouped_sql`, ~3x less CPU); a rebuild keeps the unnest, and
    ``tests/test_summaries.py`` holds the two equal.
    """
    if t is schema.SUM_CELLS:
        return (f'SELECT run_id, coalesce(workload, \'?\'), coalesce("window", -1)::INTEGER, {_COUNTS} '
                f"FROM {src} GROUP BY ALL")
    if t is schema.SUM_REQUESTS:
        return (f"SELECT run_id, rid, coalesce(workload, '?'), {_COUNTS}, coalesce(sum(1 + list_sum(survival)), 0)::DOUBLE, "
                f"count(1 + list_sum(survival)) FROM {src} GROUP BY ALL")
    if t is schema.SUM_POSITIONS and max_len is not None:
        return _positions_grouped_sql(src, max_len)
    if t is schema.SUM_POSITIONS:
        return f"""
            WITH u AS (
              SELECT run_id, coalesce(workload, '?') AS workload, unnest(generate_series(1, len(survival))) AS k,
                     unnest(survival) AS s, ceiling, "window", correct_drafts
              FROM {src} WHERE survival IS NOT NULL)
            SELECT run_id, workload, k::INTEGER, count(*), coalesce(sum(s::DOUBLE), 0), count(s),
                   count(*) FILTER (WHERE ceiling >= k), count(ceiling),
                   count(*) FILTER (WHERE "window" >= k),
                   count(*) FILTER (WHERE "window" >= k AND correct_drafts >= k),
                   count(correct_drafts) FILTER (WHERE "window" >= k)
            FROM u GROUP BY ALL"""
    if t is schema.SUM_RELIABILITY:
        return f"""
            WITH u AS (
              SELECT run_id, coalesce(workload, '?') AS workload,
                     unnest(generate_series(1, least(len(confidence), ceiling + 1))) AS k,
                     unnest(confidence[1:ceiling + 1]) AS c, unnest(confidence_logit[1:ceiling + 1]) AS z, ceiling
              FROM {src} WHERE ceiling IS NOT NULL AND confidence IS NOT NULL),
            lab AS (SELECT run_id, workload, k, c, 1 / (1 + exp(-z)) AS c_raw, (ceiling >= k)::INT AS y
                    FROM u WHERE ceiling >= k - 1),
            v AS (SELECT run_id, workload, k, 'after' AS variant, c::DOUBLE AS p, y FROM lab
                  UNION ALL SELECT run_id, workload, k, 'before', c_raw, y FROM lab WHERE c_raw IS NOT NULL)
            SELECT run_id, workload, k::INTEGER, variant, least(floor(p * {int(n_bins)})::INT, {int(n_bins)} - 1),
                   sum(p), sum(y)::BIGINT, count(*)
            FROM v WHERE isfinite(p) GROUP BY ALL"""
    if t is schema.SUM_STEPS:
        return f"""SELECT run_id, count(*), max(wall_time_s), coalesce(sum(bs), 0)::BIGINT, count(bs),
                          coalesce(sum(executed_verify_tokens), 0)::BIGINT, count(executed_verify_tokens),
                          coalesce(sum(modeled_step_ms), 0)::DOUBLE, count(modeled_step_ms)
                   FROM {src} GROUP BY ALL"""
    if t is schema.SUM_STEP_BINS:
        cols = {"bs": "bs", "budget": "budget", "num_verify": "num_verify_tokens",
                "executed": "executed_verify_tokens", "predicted_ms": "predicted_step_ms",
                "theta": "predicted_theta", "cpu_ms": "step_cpu_ms", "gpu_ms": "step_gpu_ms",
                "modeled_ms": "modeled_step_ms"}
        sums = ", ".join(f"coalesce(sum({c}), 0)::{'BIGINT' if k in _INT_BINS else 'DOUBLE'}, count({c})"
                         for k, c in cols.items())
        return f"""SELECT run_id, rank, epoch, (forward_ct // {schema.STEP_BIN})::BIGINT, count(*), max(wall_time_s),
                          {sums} FROM {src} GROUP BY ALL"""
    if t is schema.SUM_RUN_RIDS:
        return (f"SELECT run_id, 0, coalesce(workload, '?'), count(DISTINCT rid) FROM {src} GROUP BY ALL "
                f"UNION ALL SELECT run_id, 1, '', count(DISTINCT rid) FROM {src} GROUP BY ALL")
    if t is schema.SUM_REQUEST_KEYS:  # src: requests rows; their blocks from the raw request_steps
        per_rid = (f"(SELECT run_id, rid, {_PER_RID} FROM {RS} "
                   f"WHERE run_id IN (SELECT DISTINCT run_id FROM {src}) GROUP BY run_id, rid)")
        return _keys_sql(src, per_rid, "LEFT", "count(*)")
    raise KeyError(f"{t.name} is not a summary table")


def _positions_grouped_sql(src: str, max_len: int) -> str:
    """sum_positions rows without unnesting: rows grouped first by (run, workload, list length, ceiling,
    window, correct_drafts) with the survival sum and count per position as columns, then those few
    groups spread over positions. Equal to the unnest form (sums in another order: last bits)."""
    max_len = max(int(max_len), 1)  # (every list empty: one position, reached by none)
    g = range(1, max_len + 1)
    cols = ", ".join(f"sum(survival[{k}]::DOUBLE) AS s{k}, count(survival[{k}]) AS m{k}" for k in g)
    s_list, m_list = ", ".join(f"s{k}" for k in g), ", ".join(f"m{k}" for k in g)

    def cnt(cond: str) -> str:
        return f"coalesce(sum(c) FILTER (WHERE {cond}), 0)::BIGINT"
    return f"""
        WITH g AS (SELECT run_id, coalesce(workload, '?') AS workload, len(survival) AS len_, ceiling, "window",
                          correct_drafts, count(*) AS c, {cols}
                   FROM {src} WHERE survival IS NOT NULL GROUP BY ALL),
        u AS (SELECT g.*, k, [{s_list}][k] AS s, [{m_list}][k] AS m FROM g, range(1, {int(max_len)} + 1) r(k)
              WHERE k <= len_)
        SELECT run_id, workload, k::INTEGER, sum(c)::BIGINT, coalesce(sum(s), 0), sum(m)::BIGINT,
               {cnt("ceiling >= k")}, {cnt("ceiling IS NOT NULL")}, {cnt('"window" >= k')},
               {cnt('"window" >= k AND correct_drafts >= k')}, {cnt('"window" >= k AND correct_drafts IS NOT NULL')}
        FROM u GROUP BY ALL"""


_KEY_SUMS = [c.name for c in schema.SUM_REQUEST_KEYS.columns[6:]]  # n, sum_acc_len, ..., sum_x, n_x
_PER_RID = _COUNTS + ", coalesce(sum(1 + list_sum(survival)), 0)::DOUBLE AS sum_x, count(1 + list_sum(survival)) AS n_x"


def _keys_sql(req: str, per_rid: str, join: str, n_requests: str) -> str:
    """sum_request_keys rows: requests rows ``req`` joined with per-(run, rid) block sums ``per_rid``
    (columns named as the summary's), summed per key; NULL key parts become sentinels plus a mask."""
    sums = ", ".join(f"coalesce(sum(r.{c}), 0)::{'DOUBLE' if c == 'sum_x' else 'BIGINT'}" for c in _KEY_SUMS)
    return f"""
        SELECT q.run_id, coalesce(q.workload, ''), coalesce(q.prompt_index, 0)::INTEGER, coalesce(q.seed, 0)::BIGINT,
               ((q.workload IS NULL)::INT + 2 * (q.prompt_index IS NULL)::INT + 4 * (q.seed IS NULL)::INT),
               {n_requests}, {sums}
        FROM {req} q {join} JOIN {per_rid} r ON r.run_id = q.run_id AND r.rid = q.rid
        GROUP BY ALL"""


_INT_BINS = ("bs", "budget", "num_verify", "executed")


_OF = {schema.REQUEST_STEPS.name: (schema.SUM_CELLS, schema.SUM_REQUESTS, schema.SUM_POSITIONS,
                                   schema.SUM_RELIABILITY, schema.SUM_RUN_RIDS),
       schema.STEPS.name: (schema.SUM_STEPS, schema.SUM_STEP_BINS),
       schema.REQUESTS.name: (schema.SUM_REQUEST_KEYS,)}  # after request_steps: a rebuild reads sum_requests' base
_NEW_IN_3 = (schema.SUM_STEP_BINS, schema.SUM_REQUEST_KEYS)
_NEW_IN_4 = (schema.SUM_RUN_RIDS,)
_NEW_IN_5 = (schema.SUM_KEY_PAIRS, schema.SUM_PAIRS)
_NEW_IN_6 = (schema.SUM_REQUEST_PAGE, schema.SUM_PAGE_RUNS)
_V2 = tuple(t for t in schema.SUMMARY_TABLES
            if t not in _NEW_IN_3 + _NEW_IN_4 + _NEW_IN_5 + _NEW_IN_6)  # what a version-2 file has


SUMMARISED = frozenset(_OF)  # record-model tables whose appends update summaries


def _q(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def _upsert_sql(t: schema.Table, select: str, first: bool = False) -> str:
    """INSERT the SELECT's rows, adding sums and counts into rows whose key already exists.

    ``first``: no stored row can share a key with them (the caller knows the table holds no row of their
    runs, and the SELECT yields each key once): a plain INSERT, which skips the conflict check (~1-5 ms a
    statement, what a small flush's summaries mostly cost)."""
    if first:
        return f"INSERT INTO {_q(t.name)} {select}"
    sets = []
    for c in t.columns:
        if c.name in t.key:
            continue
        q = _q(c.name)
        sets.append(f"{q} = greatest({q}, EXCLUDED.{q})" if c.name.startswith("max_") else f"{q} = {q} + EXCLUDED.{q}")
    return f"INSERT INTO {_q(t.name)} {select} ON CONFLICT DO UPDATE SET {', '.join(sets)}"


def _tables(con: duckdb.DuckDBPyConnection) -> set[str]:
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()").fetchall()}


def present(con: duckdb.DuckDBPyConnection, tables: Sequence[schema.Table] = _V2) -> bool:
    """Whether every summary table of ``tables`` (default: those of schema version 2) exists in this file.

    A version-2 file opened read-only lacks only the step bins and request keys: its other summaries
    still answer, and those two come from the raw tables (:func:`_source`) until a read-write open adds them."""
    have = _tables(con)
    return all(t.name in have for t in tables)


def add(con: duckdb.DuckDBPyConnection, table: str, inserted: pa.Table) -> None:
    """Fold rows just inserted into ``table`` into its summaries (inside the caller's transaction).

    Per-request sums are aggregated once and feed both ``sum_requests`` and ``sum_request_keys``."""
    sums = _OF.get(table)
    if not sums or inserted.num_rows == 0:
        return
    view, req_view, rows_view = f"_summarise_{table}", f"_summarise_{table}_req", f"_summarise_{table}_rows"
    runs = pc.unique(inserted["run_id"]).drop_null().to_pylist() if "run_id" in inserted.column_names else None
    con.register(view, inserted)
    try:
        keys = schema.SUM_REQUEST_KEYS
        groups = batch_summaries.Groups(inserted) if table == RS else None
        # the batch's runs' first rows in these summaries: every append of a run writes its sum_cells (or
        # sum_steps) rows, so none there means none in the tables written alongside (sum_request_keys aside)
        # (a stale run's rebuild, in Store() before any append, deletes and rewrites all of them; and the tables'
        # primary keys would refuse a duplicate key rather than let it count twice)
        first = table in (RS, schema.STEPS.name) and runs is not None and not _has_rows(
            con, (schema.SUM_CELLS if table == RS else schema.SUM_STEPS).name, runs)
        for t in sums:
            if t in (keys, schema.SUM_REQUESTS, schema.SUM_RUN_RIDS):
                continue
            rows = _batch_rows(con, t, inserted, groups)
            if rows is not None:  # (numpy on the batch's columns; None: the SQL below)
                if rows.num_rows:
                    con.register(rows_view, rows)
                    try:
                        con.execute(_upsert_sql(t, f"SELECT * FROM {rows_view}", first))
                    finally:
                        con.unregister(rows_view)
                continue
            max_len = _max_len(inserted, "survival") if t is schema.SUM_POSITIONS else None
            con.execute(_upsert_sql(t, _agg_sql(t, view, max_len=max_len), first))
        # request keys: new blocks of requests whose requests row is stored, and new requests rows with the
        # blocks stored so far (whichever comes second in a transaction sees the first; nothing counts twice)
        if table == RS:
            rt = schema.SUM_REQUESTS
            req_rows = batch_summaries.requests_rows(inserted, groups)
            if req_rows is None:
                rel = con.sql(f"SELECT * FROM ({_agg_sql(rt, view)}) AS x({', '.join(_q(c) for c in rt.names)})")
                req_rows = (getattr(rel, "to_arrow_table", None) or rel.arrow)()
            con.register(req_view, req_rows)
            con.execute(_upsert_sql(schema.SUM_RUN_RIDS, _new_rids_sql(req_view), first))  # before sum_requests grows
            con.execute(_upsert_sql(rt, f"SELECT * FROM {req_view}", first))
            # (an inner join with the requests rows: none stored for these runs, as in a server dump's ingest,
            # adds nothing; the probe is ~1 ms, the statement ~25 ms per 100k rows)
            if runs is None or _has_rows(con, REQ, runs):
                cols = ", ".join(f"sum({c}) AS {c}" for c in _KEY_SUMS)
                per_rid = f"(SELECT run_id, rid, {cols} FROM {req_view} GROUP BY run_id, rid)"
                con.execute(_upsert_sql(keys, _keys_sql(REQ, per_rid, "", "0")))
        elif table == REQ:
            cols = ", ".join(f"sum(s.{c}) AS {c}" for c in _KEY_SUMS)
            per_rid = (f"(SELECT s.run_id, s.rid, {cols} FROM {schema.SUM_REQUESTS.name} s "
                       f"JOIN {view} v ON v.run_id = s.run_id AND v.rid = s.rid GROUP BY s.run_id, s.rid)")
            con.execute(_upsert_sql(keys, _keys_sql(view, per_rid, "LEFT", "count(*)")))
        add_pairs(con, table, view, runs)  # version 5: the pairs' copies of the keys just touched
        add_pages(con, table, view, req_view, runs)  # version 6: the drill-down's rows of the requests just touched
    finally:
        con.unregister(view)
        if table == RS:
            con.unregister(req_view)


def _has_rows(con: duckdb.DuckDBPyConnection, table: str, run_ids: Sequence[str]) -> bool:
    """Whether ``table`` holds a row of any of ``run_ids``."""
    return bool(run_ids) and con.execute(
        f"SELECT EXISTS (SELECT 1 FROM {_q(table)} WHERE run_id IN (SELECT UNNEST(?)))", [list(run_ids)]).fetchall()[0][0]


def _new_rids_sql(req: str) -> str:
    """sum_run_rids increments of a batch: its per-request sums ``req`` whose (run, rid, workload), and
    whose (run, rid), ``sum_requests`` does not hold yet (read before the batch is folded into it)."""
    sr = schema.SUM_REQUESTS.name
    mine = f"s.run_id IN (SELECT DISTINCT run_id FROM {req})"
    return f"""
        SELECT run_id, 0, workload, count(*) FROM {req} v
        WHERE NOT EXISTS (SELECT 1 FROM {sr} s WHERE {mine} AND s.run_id = v.run_id AND s.rid = v.rid
                          AND s.workload = v.workload)
        GROUP BY ALL
        UNION ALL
        SELECT run_id, 1, '', count(DISTINCT rid) FROM {req} v
        WHERE NOT EXISTS (SELECT 1 FROM {sr} s WHERE {mine} AND s.run_id = v.run_id AND s.rid = v.rid)
        GROUP BY ALL"""


def _batch_rows(con: duckdb.DuckDBPyConnection, t: schema.Table, tbl: pa.Table,
                groups: batch_summaries.Groups | None) -> pa.Table | None:
    """Summary ``t``'s rows of an appended request_steps batch (``groups``: its run x workload codes) by
    :mod:`acceptscope.batch_summaries` (numpy), or None where that module declines the batch or has no form
    of ``t``: the caller then runs :func:`_agg_sql`."""
    if groups is None:
        return None
    if t is schema.SUM_CELLS:
        return batch_summaries.cells_rows(tbl, groups)
    if t is schema.SUM_POSITIONS:
        return batch_summaries.positions_rows(tbl, groups)
    if t is schema.SUM_RELIABILITY:
        return batch_summaries.reliability_rows(con, tbl, groups, RELIABILITY_BINS)
    return None


def _max_len(tbl: pa.Table, column: str) -> int:
    """Longest list in ``tbl[column]`` (0 when all are NULL or empty)."""
    m = pc.max(pc.list_value_length(tbl[column])).as_py()
    return int(m or 0)


def _counts(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in con.execute(sql, params).fetchall()}


def stale_runs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str] | None = None) -> set[str]:
    """Runs (of ``run_ids``, default all) whose summaries do not count exactly the stored rows.

    A row count per run (one column scan, pruned by zone maps) against the summaries' own counts:
    rows appended past :func:`add` (an older writer, a raw INSERT) make the run stale.
    """
    # fast path. Nothing deletes rows, so equal totals mean every run is counted exactly,
    # unless a run_id was rewritten in place: then the summaries hold an id the runs table no longer
    # has, or a requested run has rows but no summary (both checked; the full count settles it).
    ids = [] if run_ids is None else list(run_ids)
    cells, steps = schema.SUM_CELLS.name, schema.SUM_STEPS.name
    keys = schema.SUM_REQUEST_KEYS.name
    have = _tables(con)
    marked = _rebuilding(con, have)  # an unfinished rebuild's runs (ensure): stale whatever the counts say
    if run_ids is not None:
        marked &= set(ids)
    have_keys = keys in have  # version 3: requests rows are counted too
    v2_present = all(t.name in have for t in _V2)
    try:
        # a few small queries, not one with scalar subqueries and NOT IN (planned as mark joins: that one
        # query cost 45-80 ms on a 5M-row store, these 10-25 ms together)
        raw_n, raw_s, raw_q = con.execute(f"SELECT (SELECT count(*) FROM {RS}), (SELECT count(*) FROM {STEPS}), "
                                          f"{f'(SELECT count(*) FROM {REQ})' if have_keys else '0'}").fetchone()
        sum_n, sum_s, sum_q = con.execute(
            f"SELECT (SELECT coalesce(sum(n), 0) FROM {cells}), (SELECT coalesce(sum(n), 0) FROM {steps}), "
            f"{f'(SELECT coalesce(sum(n_requests), 0) FROM {keys})' if have_keys else '0'}").fetchone()
        summarised = {r for (r,) in con.execute(f"SELECT run_id FROM {cells} UNION SELECT run_id FROM {steps}").fetchall()}
        orphans = summarised - {r for (r,) in con.execute(f"SELECT run_id FROM {RUNS}").fetchall()}
        bare = [r for r in ids if r not in summarised]  # requested runs without a summary row: rows past add?
        lit = ", ".join("'" + r.replace("'", "''") + "'" for r in bare)  # literals: the scans prune by zone maps
        unsummarised = bool(bare) and con.execute(
            f"SELECT EXISTS (SELECT 1 FROM {RS} WHERE run_id IN ({lit})) "
            f"OR EXISTS (SELECT 1 FROM {STEPS} WHERE run_id IN ({lit}))").fetchone()[0]
        if (raw_n, raw_s, raw_q) == (sum_n, sum_s, sum_q) and not orphans and not unsummarised and v2_present:
            return marked
    except duckdb.CatalogException:  # no summary tables: a file from before schema version 2
        pass
    where, p = ("", []) if run_ids is None else (" WHERE run_id IN (SELECT unnest(?))", [list(run_ids)])
    raw_rs = _counts(con, f"SELECT run_id, count(*) FROM {RS}{where} GROUP BY run_id", p)
    raw_st = _counts(con, f"SELECT run_id, count(*) FROM {STEPS}{where} GROUP BY run_id", p)
    if not v2_present:
        return set(raw_rs) | set(raw_st)
    sum_rs = _counts(con, f"SELECT run_id, sum(n) FROM {schema.SUM_CELLS.name}{where} GROUP BY run_id", p)
    sum_st = _counts(con, f"SELECT run_id, n FROM {schema.SUM_STEPS.name}{where}", p)
    raw_q = _counts(con, f"SELECT run_id, count(*) FROM {REQ}{where} GROUP BY run_id", p) if have_keys else {}
    sum_q = _counts(con, f"SELECT run_id, sum(n_requests) FROM {keys}{where} GROUP BY run_id", p) if have_keys else {}
    runs = set(raw_rs) | set(raw_st) | set(sum_rs) | set(sum_st) | set(raw_q) | set(sum_q)
    return marked | {r for r in runs if raw_rs.get(r, 0) != sum_rs.get(r, 0) or raw_st.get(r, 0) != sum_st.get(r, 0)
                     or raw_q.get(r, 0) != sum_q.get(r, 0)}


def rebuild(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str],
            tables: Sequence[schema.Table] = schema.SUMMARY_TABLES,
            each: Step = _inline) -> None:
    """Recompute the summaries ``tables`` of ``run_ids`` from the raw tables (DuckDB aggregation).

    ``each`` runs every step (a summary table's delete, then its insert; then the pairs, then the pages):
    in the caller's transaction by default; :func:`ensure` gives each step a transaction of its own (a
    delete and an insert of 3.9M ``sum_requests`` rows in one ran out of 1 GB: the key index holds both)."""
    ids = list(run_ids)
    if not ids:
        return
    for base, sums in _OF.items():
        src = f"(SELECT * FROM {_q(base)} WHERE run_id IN (SELECT unnest($ids)))"
        for t in sums:
            if t not in tables:
                continue
            each(lambda t=t: con.execute(f"DELETE FROM {_q(t.name)} WHERE run_id IN (SELECT unnest($ids))",
                                         {"ids": ids}))
            each(lambda t=t, src=src: con.execute(f"INSERT INTO {_q(t.name)} {_agg_sql(t, src)}", {"ids": ids}))
    each(lambda: rebuild_pairs(con, ids, tables))  # version 5: pairs of these runs from their rebuilt request keys
    rebuild_pages(con, ids, tables, each)  # version 6: the drill-down's rows from requests + sum_requests


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The file's schema version (1: written before ``store_meta`` existed)."""
    have = {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()").fetchall()}
    if schema.STORE_META.name not in have:
        return 1
    row = con.execute(f"SELECT value FROM {schema.STORE_META.name} WHERE key = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row else 1
    except ValueError:
        raise ValueError(f"{schema.STORE_META.name}.schema_version is {row[0]!r}, not an integer") from None


def check_version(con: duckdb.DuckDBPyConnection, path: object) -> int:
    v = schema_version(con)
    if v > schema.SCHEMA_VERSION:
        raise ValueError(f"{path}: written by a newer acceptscope (schema version {v}; this one reads up to "
                         f"{schema.SCHEMA_VERSION}): upgrade acceptscope to read it")
    return v


# DuckDB's memory for a rebuild (its default is 80% of RAM): the aggregation of a 100M request-step run
# spills to the database's temp directory instead (bench/scale.py's 100M store: see docs/scale.md §8). What
# cannot spill grows with a run's requests: a transaction's changes to the key indexes of sum_requests and
# sum_request_page, hence one step per delete and per insert in ensure() (3.9M requests in that store: 502 CPU-s,
# 1,221 MB peak; with the delete and the insert in one transaction it ran out of 1GB)
REBUILD_MEMORY = "1GB"
# store_meta key holding the runs (a JSON list) whose summaries a rebuild is rewriting: set before the
# first table is touched, cleared with the schema version in the last step; stale_runs() counts them stale
REBUILDING = "rebuilding_runs"


def record_version(con: duckdb.DuckDBPyConnection, new_file: bool = False) -> None:
    """Mark the file as holding this release's summaries (``store_meta.schema_version``).

    ``new_file``: ``store_meta`` was created in this transaction, so a plain INSERT (an INSERT OR REPLACE
    costs ~4 ms more: its first conflict check, on every new store)."""
    verb = "INSERT" if new_file else "INSERT OR REPLACE"
    con.execute(f"{verb} INTO {schema.STORE_META.name} VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)])


def _rebuilding(con: duckdb.DuckDBPyConnection, have: set[str]) -> set[str]:
    """Runs an unfinished rebuild left marked (none when the file has no mark, or no store_meta;
    ``have``: the file's tables)."""
    if schema.STORE_META.name not in have:
        return set()
    row = con.execute(f"SELECT value FROM {schema.STORE_META.name} WHERE key = ?", [REBUILDING]).fetchone()
    if row is None:
        return set()
    try:
        marked = json.loads(row[0])
        if isinstance(marked, list) and all(isinstance(r, str) for r in marked):
            return set(marked)
    except (TypeError, ValueError):
        pass
    # a mark that does not read as a list of run ids (edited by hand, cut short): every run is suspect
    return {r for (r,) in con.execute(f"SELECT run_id FROM {RUNS}").fetchall()}


def _in_transaction(con: duckdb.DuckDBPyConnection, step: Callable[[], Any]) -> Any:
    """Run ``step`` in a transaction of its own: committed, or rolled back when it raises."""
    con.execute("BEGIN TRANSACTION")
    try:
        out = step()
        con.execute("COMMIT")
        return out
    except BaseException:
        con.execute("ROLLBACK")
        raise


def ensure(con: duckdb.DuckDBPyConnection, path: object = "store") -> list[str]:
    """On a read-write open (the store has created any missing summary table): rebuild stale runs and
    record the schema version.

    A transaction per step of :func:`rebuild` (a table's delete, its insert, ...), not one for the whole
    rebuild: DuckDB holds a transaction's new rows and key-index changes in memory, and a 100M request-step
    run's ``sum_requests`` (3.9M rows) ran out of the rebuild's 1 GB, with the statements after it and then
    alone with its delete. Between those commits the runs being rebuilt stay marked in
    ``store_meta`` (:data:`REBUILDING`), so a reader, or the next open after a crash, counts them stale
    (:func:`stale_runs`) and aggregates their raw rows. Returns the runs rebuilt (a file from before schema
    version 2 rebuilds every run once; one from version 2 gets the step bins of every run with steps, from
    the steps table only).
    """
    v = check_version(con, path)
    limit = con.execute("SELECT current_setting('memory_limit')").fetchone()[0]
    con.execute(f"SET memory_limit='{REBUILD_MEMORY}'")  # a rebuild aggregates whole runs: spill, not grow with them
    meta = schema.STORE_META.name

    def own(step: Callable[[], Any]) -> Any:
        return _in_transaction(con, step)
    try:
        stale = sorted(stale_runs(con))
        if stale:
            own(lambda: con.execute(f"INSERT OR REPLACE INTO {meta} VALUES (?, ?)", [REBUILDING, json.dumps(stale)]))
        rebuild(con, stale, each=own)
        if v < 3:  # step bins and request keys are new in version 3: fill them for the runs kept above
            done = set(stale)
            todo = [r for (r,) in con.execute(f"SELECT run_id FROM {STEPS} UNION SELECT run_id FROM {REQ}").fetchall()
                    if r not in done]
            rebuild(con, todo, _NEW_IN_3, each=own)
            stale = sorted(done | set(todo))
        if v < 4:  # the per-run request counts are new in version 4
            done = set(stale)
            todo = [r for (r,) in con.execute(f"SELECT DISTINCT run_id FROM {RS}").fetchall() if r not in done]
            rebuild(con, todo, _NEW_IN_4, each=own)
            stale = sorted(done | set(todo))
        stale = own(lambda: ensure_pairs(con, v, stale))  # version 5: sum_key_pairs
        stale = own(lambda: ensure_pages(con, v, stale))  # version 6: sum_request_page

        def finish() -> None:
            record_version(con)
            con.execute(f"DELETE FROM {meta} WHERE key = ?", [REBUILDING])
        own(finish)
    finally:
        con.execute(f"SET memory_limit='{limit}'")
    return stale


# ---------------------------------------------------------------------------
# reads: summary rows for fresh runs, the same aggregation over raw rows for stale ones
# ---------------------------------------------------------------------------
def _source(con: duckdb.DuckDBPyConnection, t: schema.Table, run_ids: Sequence[str],
            stale: set[str] | None = None, n_bins: int = RELIABILITY_BINS) -> str:
    """A relation with summary ``t``'s columns for ``run_ids`` (literal ids, quoted)."""
    ids = list(dict.fromkeys(str(r) for r in run_ids))
    if stale is None:
        stale = stale_runs(con, ids) if ids else set()
    fresh = [r for r in ids if r not in stale] if n_bins == RELIABILITY_BINS else []
    if t in _NEW_IN_3 + _NEW_IN_4 and not present(con, (t,)):  # an older file opened read-only
        fresh = []
    raw = [r for r in ids if r not in fresh]
    cols = ", ".join(_q(c) for c in t.names)

    parts = []
    if fresh:
        parts.append(f"SELECT {cols} FROM {_q(t.name)} WHERE run_id IN (SELECT unnest({_lit_list(fresh)}))")
    if raw or not fresh:
        base = next(b for b, ts in _OF.items() if t in ts)
        src = f"(SELECT * FROM {_q(base)} WHERE run_id IN (SELECT unnest({_lit_list(raw)})))"
        parts.append(f"SELECT * FROM ({_agg_sql(t, src, n_bins)}) AS x({cols})")
    return "(" + " UNION ALL ".join(parts) + ")"


def _df(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence | dict | None = None) -> pd.DataFrame:
    return con.execute(sql, params if isinstance(params, dict) else list(params or [])).df()


def _avg(s: str, n: str) -> str:
    return f"sum({s}) / nullif(sum({n}), 0)"


def _in_workloads(workloads: Sequence[str] | None, alias: str) -> str:
    """``WHERE`` clause restricting summary rows to ``workloads`` (none: every workload), as literals."""
    if not workloads:
        return ""
    lit = ", ".join("'" + str(w).replace("'", "''") + "'" for w in workloads)
    return f" WHERE {alias}.workload IN ({lit})"


def run_summary(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str],
                workloads: Sequence[str] | None = None) -> pd.DataFrame:
    """Headline numbers per run (``acceptscope.reader.Reader.run_summary`` documents the columns);
    ``workloads`` restricts the block figures, steps and wall time stay whole-run."""
    stale = stale_runs(con, run_ids)
    cells = _source(con, schema.SUM_CELLS, run_ids, stale)
    steps = _source(con, schema.SUM_STEPS, run_ids, stale)
    seen = _requests_seen_sql(con, run_ids, stale, workloads)
    return _df(con, f"""
        WITH b AS (
          SELECT run_id, sum(n)::BIGINT AS blocks,
                 {_avg('sum_acc_len', 'n_acc_len')} AS mean_acc_len,
                 {_avg('sum_window', 'n_window')} AS mean_window,
                 CASE WHEN sum(n_acc_len) > 0 THEN sum(sum_acc_len) END AS committed_tokens,
                 CASE WHEN sum(n_window) > 0 THEN sum(sum_window) END AS verified_drafts,
                 CASE WHEN sum(n_correct) > 0 THEN sum(sum_correct) END AS correct_drafts,
                 {_avg('sum_ceil1', 'n_ceil')} AS ceiling_accept_len,
                 sum(sum_acc_len_ceil) / nullif(sum(sum_ceil1) FILTER (WHERE n_ceil > 0), 0) AS utilization,
                 {_avg('sum_cap_trim', 'n_cap_trim')} AS mean_cap_trim
          FROM {cells} c{_in_workloads(workloads, "c")} GROUP BY run_id),
        q AS ({seen}),
        s AS (
          SELECT run_id, n AS steps, max_wall_s AS wall_s, sum_bs / nullif(n_bs, 0) AS mean_bs,
                 CASE WHEN n_executed > 0 THEN sum_executed END AS executed_verify_tokens
          FROM {steps} s)
        SELECT r.run_id, r.arm, r.engine, r.gamma, r.audit_group, b.blocks, q.requests_seen, b.* EXCLUDE (run_id, blocks),
               b.correct_drafts / nullif(b.verified_drafts, 0) AS in_window_accept_rate,
               s.steps, s.wall_s, s.mean_bs, s.executed_verify_tokens,
               b.committed_tokens / nullif(s.wall_s, 0) AS tokens_per_s
        FROM {RUNS} r LEFT JOIN b USING (run_id) LEFT JOIN q USING (run_id) LEFT JOIN s USING (run_id)
        WHERE r.run_id IN (SELECT unnest(?))
        ORDER BY r.arm, r.run_id""", [list(run_ids)])


def _requests_seen_sql(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], stale: set[str],
                       workloads: Sequence[str] | None) -> str:
    """(run_id, requests_seen): distinct requests with blocks (in ``workloads``) per run, from the run's
    counts in ``sum_run_rids``. Per-workload counts add up exactly unless a request has blocks under two
    workloads; such a run (rare) counts its distinct requests over ``sum_requests`` instead."""
    rids = _source(con, schema.SUM_RUN_RIDS, run_ids, stale)
    if not workloads:
        return f"SELECT run_id, n::BIGINT AS requests_seen FROM {rids} x WHERE scope = 1"
    split = [r for (r,) in con.execute(
        f"SELECT run_id FROM {rids} x GROUP BY run_id "
        "HAVING sum(n) FILTER (WHERE scope = 0) <> sum(n) FILTER (WHERE scope = 1)").fetchall()]
    lit = "[" + ", ".join("'" + r.replace("'", "''") + "'" for r in split) + "]::VARCHAR[]"
    sql = (f"SELECT run_id, sum(n)::BIGINT AS requests_seen FROM {rids} x{_in_workloads(workloads, 'x')} "
           f"AND scope = 0 AND NOT list_contains({lit}, run_id) GROUP BY run_id")
    if split:
        reqs = _source(con, schema.SUM_REQUESTS, split, stale)
        sql += (f" UNION ALL SELECT run_id, count(DISTINCT rid) AS requests_seen FROM {reqs} r"
                f"{_in_workloads(workloads, 'r')} GROUP BY run_id")
    return sql


def window_distribution(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> pd.DataFrame:
    """Blocks per (run, workload, window)."""
    cells = _source(con, schema.SUM_CELLS, run_ids)
    return _df(con, f"""
        SELECT c.run_id, r.arm, c.workload, CASE WHEN c."window" >= 0 THEN c."window" END AS "window",
               sum(c.n)::BIGINT AS blocks
        FROM {cells} c JOIN {RUNS} r USING (run_id)
        GROUP BY ALL ORDER BY c.run_id, c.workload, "window" NULLS LAST""")


def utilization_by_workload(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> pd.DataFrame:
    """Realized accept length against the observed ceiling per (run, workload)."""
    cells = _source(con, schema.SUM_CELLS, run_ids)
    return _df(con, f"""
        SELECT c.run_id, r.arm, c.workload, sum(n)::BIGINT AS blocks,
               {_avg('sum_acc_len', 'n_acc_len')} AS mean_acc_len,
               {_avg('sum_ceil1', 'n_ceil')} AS ceiling_accept_len,
               sum(sum_acc_len_ceil) / nullif(sum(sum_ceil1) FILTER (WHERE n_ceil > 0), 0) AS utilization
        FROM {cells} c JOIN {RUNS} r USING (run_id)
        GROUP BY ALL ORDER BY c.run_id, c.workload""")


def regime_by_workload(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> pd.DataFrame:
    """Per (run, workload): window shares, accept length, utilization (``Reader.regime_by_workload``)."""
    cells = _source(con, schema.SUM_CELLS, run_ids)
    return _df(con, f"""
        SELECT c.run_id, r.arm, c.workload, sum(n)::BIGINT AS blocks,
               {_avg('sum_window', 'n_window')} AS mean_window,
               coalesce(sum(n) FILTER (WHERE c."window" >= r.gamma), 0) / sum(n) AS share_full_window,
               coalesce(sum(n) FILTER (WHERE c."window" BETWEEN 0 AND 3), 0) / sum(n) AS share_window_le3,
               coalesce(sum(n) FILTER (WHERE c."window" BETWEEN 0 AND r.gamma - 1), 0) / sum(n) AS share_trimmed,
               {_avg('sum_acc_len', 'n_acc_len')} AS mean_acc_len,
               sum(sum_acc_len_ceil) / nullif(sum(sum_ceil1) FILTER (WHERE n_ceil > 0), 0) AS utilization,
               any_value(r.gamma) AS gamma
        FROM {cells} c JOIN {RUNS} r USING (run_id)
        GROUP BY c.run_id, r.arm, c.workload ORDER BY c.run_id, c.workload""")


def position_acceptance(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str],
                        workloads: Sequence[str] | None = None) -> pd.DataFrame:
    """Per position k: mean predicted survival vs empirical P(ceiling >= k) (``Reader.position_acceptance``)."""
    pos = _source(con, schema.SUM_POSITIONS, run_ids)
    return _df(con, f"""
        SELECT p.run_id, r.arm, p.k, sum(p.n)::BIGINT AS n, sum(sum_s) / nullif(sum(n_s), 0) AS mean_survival,
               sum(sum_emp) / nullif(sum(n_emp), 0) AS empirical_survival,
               sum(n_reached)::BIGINT AS reached_in_window,
               sum(sum_acc_given) / nullif(sum(n_acc_given), 0) AS accepted_given_verified
        FROM {pos} p JOIN {RUNS} r USING (run_id){_in_workloads(workloads, "p")}
        GROUP BY ALL ORDER BY p.run_id, p.k""")


def reliability_bins(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], n_bins: int = RELIABILITY_BINS,
                     workloads: Sequence[str] | None = None) -> pd.DataFrame:
    """Per (run, position, variant, bin): mean predicted confidence, observed rate, hits, n."""
    rel = _source(con, schema.SUM_RELIABILITY, run_ids, n_bins=n_bins)
    return _df(con, f"""
        SELECT run_id, position, variant, bin, sum(sum_p) / sum(n) AS mean_pred, sum(hits) / sum(n) AS rate,
               sum(hits)::BIGINT AS hits, sum(n)::BIGINT AS n
        FROM {rel} x{_in_workloads(workloads, "x")} GROUP BY ALL ORDER BY run_id, position, variant, bin""")


def requests(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = 5000, offset: int = 0) -> pd.DataFrame:
    """One page of a run's requests (``limit`` from ``offset``, in workload, prompt order) with their
    block statistics: from the sorted page rows (:func:`page_of_requests`, version 6), else the page is
    picked from ``requests`` first and only its requests' summary rows are summed."""
    page = page_of_requests(con, run_id, limit, offset)
    if page is not None:
        return page
    reqs = _source(con, schema.SUM_REQUESTS, [run_id])
    return _df(con, f"""
        WITH q AS MATERIALIZED (
          SELECT rid, workload, prompt_index, seed, temperature, completion_tokens, finish_reason, latency_s
          FROM {REQ} WHERE run_id = ? ORDER BY workload, prompt_index, rid LIMIT ? OFFSET ?),
        b AS (SELECT rid, sum(n) AS n, sum(sum_acc_len) AS sum_acc_len, sum(n_acc_len) AS n_acc_len,
                     sum(sum_window) AS sum_window, sum(n_window) AS n_window, sum(sum_ceil1) AS sum_ceil1,
                     sum(n_ceil) AS n_ceil
              FROM {reqs} r WHERE rid IN (SELECT rid FROM q) GROUP BY rid)
        SELECT q.*, b.n AS blocks, b.sum_acc_len / nullif(b.n_acc_len, 0) AS mean_acc_len,
               b.sum_window / nullif(b.n_window, 0) AS mean_window,
               b.sum_ceil1 / nullif(b.n_ceil, 0) AS ceiling_accept_len
        FROM q LEFT JOIN b USING (rid)
        ORDER BY q.workload, q.prompt_index, q.rid""", [run_id, int(limit), int(offset)])


def request_count(con: duckdb.DuckDBPyConnection, run_id: str) -> int:
    """Requests of one run (how many pages :func:`requests` has)."""
    return int(con.execute(f"SELECT count(*) FROM {REQ} WHERE run_id = ?", [run_id]).fetchone()[0])


def _per_request_sql(con: duckdb.DuckDBPyConnection, compact_run: str, audit_run: str) -> str:
    """The SELECT of :func:`per_request` (parameters ``$c``, ``$a``), unordered: the compact run's
    request-key summaries (one row per key) joined with the audit run's on the key; the join with the
    requests rows was made as they were written."""
    keys = _source(con, schema.SUM_REQUEST_KEYS, [compact_run, audit_run])
    # a key with a NULL part pairs with nothing (as a join on it would not)
    return f"""
        SELECT CASE WHEN c.nulls & 1 = 0 THEN c.workload END AS workload,
               CASE WHEN c.nulls & 2 = 0 THEN c.prompt_index END AS prompt_index,
               CASE WHEN c.nulls & 4 = 0 THEN c.seed END AS seed, c.n::BIGINT AS w,
               c.sum_acc_len / nullif(c.n_acc_len, 0) AS a, c.sum_x / nullif(c.n_x, 0) AS x,
               t.sum_ceil1 / t.n_ceil AS y, t.n_ceil::BIGINT AS audit_blocks
        FROM (SELECT * FROM {keys} k WHERE run_id = $c AND n > 0) c
        LEFT JOIN (SELECT * FROM {keys} k WHERE run_id = $a AND n_ceil > 0 AND nulls = 0) t
          ON t.workload = c.workload AND t.prompt_index = c.prompt_index AND t.seed = c.seed AND c.nulls = 0"""


def per_request(con: duckdb.DuckDBPyConnection, compact_run: str, audit_run: str) -> pd.DataFrame:
    """One row per compact request key with w, a, x and (where audited) y (``audit_sampling.per_request``).

    One join of both runs' request summaries with their keys and one group-by (half the work of
    aggregating each arm and joining the two)."""
    return _df(con, _per_request_sql(con, compact_run, audit_run) + " ORDER BY workload, prompt_index, seed",
               {"c": compact_run, "a": audit_run})


def per_request_columns(con: duckdb.DuckDBPyConnection, compact_run: str, audit_run: str,
                        ordered: bool = False) -> tuple[np.ndarray, ...]:
    """:func:`per_request`'s w, a, x, y as float arrays (NaN for NULL): what sampling inference needs,
    without building a frame of keys. ``ordered``: in :func:`per_request`'s order (a sort of every
    request; the exact bootstrap's replicates depend on the order, the totals only to the last bit)."""
    order = "ORDER BY workload, prompt_index, seed" if ordered else ""
    got = con.execute(f"""SELECT coalesce(w::DOUBLE, 'NaN'), coalesce(a::DOUBLE, 'NaN'), coalesce(x::DOUBLE, 'NaN'),
                                 coalesce(y::DOUBLE, 'NaN')
                          FROM ({_per_request_sql(con, compact_run, audit_run)}) {order}""",
                      {"c": compact_run, "a": audit_run}).fetchnumpy()
    return tuple(np.asarray(v, dtype=float) for v in got.values())


def throughput_curve(con: duckdb.DuckDBPyConnection, audit_group: str) -> pd.DataFrame:
    """Decode throughput per (workload, batch, arm) of ``audit_group``'s runs on the virtual clock
    (``Reader.throughput_curve``); step totals come from the summaries."""
    ids = [r[0] for r in con.execute(f"SELECT run_id FROM {RUNS} WHERE audit_group = ?", [audit_group]).fetchall()]
    steps = _source(con, schema.SUM_STEPS, ids)
    return _df(con, f"""
        WITH t AS (SELECT run_id, sum_modeled_ms / 1e3 AS modeled_s, n AS steps,
                          CASE WHEN n_executed > 0 THEN sum_executed END AS verify_tokens
                   FROM {steps} s WHERE n_modeled > 0),
             q AS (SELECT run_id, any_value(workload) AS workload, sum(completion_tokens - 1) AS tokens,
                          count(*) AS requests
                   FROM {REQ} WHERE run_id IN (SELECT unnest(?)) GROUP BY run_id)
        SELECT q.workload, CAST(json_extract_string(r.config_json, '$.max_running_requests') AS INTEGER) AS batch,
               r.arm, r.run_id, q.requests, q.tokens, t.steps, t.modeled_s,
               q.tokens / t.modeled_s AS tokens_per_s,
               t.verify_tokens / t.steps AS verify_tokens_per_step
        FROM {RUNS} r JOIN t USING (run_id) JOIN q USING (run_id)
        WHERE r.audit_group = ?
        ORDER BY q.workload, batch, r.arm""", [ids, audit_group])


def runs(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """All runs with their size (requests, request-steps), newest first."""
    ids = [r[0] for r in con.execute(f"SELECT run_id FROM {RUNS}").fetchall()]
    cells = _source(con, schema.SUM_CELLS, ids)
    return _df(con, f"""
        SELECT r.*, coalesce(q.n_requests, 0) AS n_requests, coalesce(s.n_blocks, 0) AS n_blocks
        FROM {RUNS} r
        LEFT JOIN (SELECT run_id, count(*) AS n_requests FROM {REQ} GROUP BY run_id) q USING (run_id)
        LEFT JOIN (SELECT run_id, sum(n)::BIGINT AS n_blocks FROM {cells} c GROUP BY run_id) s USING (run_id)
        ORDER BY r.started_at DESC NULLS LAST, r.run_id""")


def step_costs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], max_rows_per_run: int | None = None,
               means: bool = True) -> pd.DataFrame:
    """Per-step cost telemetry. With ``max_rows_per_run``, a run with more steps than that is read from
    the step bins instead (``sum_step_bins``: sums over ``schema.STEP_BIN`` consecutive ``forward_ct``,
    merged k at a time to at most that many rows): one row per stretch of steps with the same columns
    holding the stretch's means (``wall_time_s``: its end; ``forward_ct``: its first), and ``steps``
    the steps it averages (1 for a step row). A 200k-step run costs a few thousand summary rows.
    ``means=False``: every k-th ``forward_ct`` of a longer run instead (real steps, for per-step error
    statistics such as the report's step-time error; scans the run's steps)."""
    ids = list(dict.fromkeys(run_ids))
    raw_ids, binned, every = ids, {}, {}
    if max_rows_per_run and ids:
        stale = stale_runs(con, ids)  # once for both summaries read here
        n = dict(con.execute(f"SELECT run_id, n FROM {_source(con, schema.SUM_STEPS, ids, stale)} s").fetchall())
        raw_ids = [r for r in ids if int(n.get(r, 0)) <= int(max_rows_per_run)]
        long_ = [r for r in ids if r not in raw_ids]
        if long_ and not means:
            every = {r: -(-int(n[r]) // int(max_rows_per_run)) for r in long_}
        elif long_:
            bins = _source(con, schema.SUM_STEP_BINS, long_, stale)
            nb = dict(con.execute(f"SELECT run_id, count(*) FROM {bins} b "
                                  "GROUP BY run_id").fetchall())
            binned = {r: max(1, -(-int(nb.get(r, 0)) // int(max_rows_per_run))) for r in long_}
    parts = []
    if raw_ids or not binned:
        terms = ["run_id IN (SELECT unnest(?))"] + [f"(run_id = ? AND forward_ct % {int(k)} = 0)" for k in every.values()]
        params = [raw_ids, *every]
        sql = f"""
            SELECT run_id, rank, epoch, forward_ct, bs, budget, num_verify_tokens, executed_verify_tokens,
                   predicted_step_ms, predicted_theta, step_cpu_ms, step_gpu_ms, wall_time_s{{modeled}}, 1 AS steps
            FROM {STEPS} WHERE {" OR ".join(terms)} ORDER BY run_id, rank, epoch, forward_ct"""
        try:
            parts.append(_df(con, sql.format(modeled=", modeled_step_ms"), params))
        except duckdb.BinderException:  # a file from before the virtual clock (no modeled_step_ms column)
            parts.append(_df(con, sql.format(modeled=""), params))
    if binned:
        # runs merged k bins at a time (k > 1) are grouped; a run with k = 1 is read row for row, the same
        # values without a GROUP BY (1/4 of the query's CPU on 2 x 6k bins)
        def m(c: str, one: bool) -> str:
            return f"sum_{c} / nullif(n_{c}, 0)" if one else f"sum(sum_{c}) / nullif(sum(n_{c}), 0)"

        def cols(one: bool) -> str:
            def agg(x: str, f: str) -> str:
                return x if one else f"{f}({x})"
            return f"""b.run_id, rank, epoch, {agg('bin', 'min')} * {schema.STEP_BIN} AS forward_ct, {m('bs', one)} AS bs,
                   {m('budget', one)} AS budget, {m('num_verify', one)} AS num_verify_tokens,
                   {m('executed', one)} AS executed_verify_tokens, {m('predicted_ms', one)} AS predicted_step_ms,
                   {m('theta', one)} AS predicted_theta, {m('cpu_ms', one)} AS step_cpu_ms,
                   {m('gpu_ms', one)} AS step_gpu_ms, {agg('max_wall_s', 'max')} AS wall_time_s,
                   {m('modeled_ms', one)} AS modeled_step_ms, {agg('n', 'sum')}::HUGEINT AS steps"""
        ones, many = [r for r, g in binned.items() if g == 1], {r: g for r, g in binned.items() if g > 1}
        sel = []
        if ones:
            sel.append(f"SELECT {cols(True)} FROM {bins} b WHERE list_contains({_lit_list(ones)}, b.run_id)")
        if many:
            k = "(" + " UNION ALL ".join(f"SELECT '{r.replace(chr(39), chr(39) * 2)}' AS run_id, {int(g)} AS g"
                                         for r, g in many.items()) + ")"
            sel.append(f"SELECT {cols(False)} FROM {bins} b JOIN {k} k USING (run_id) "
                       "GROUP BY b.run_id, rank, epoch, bin // k.g")
        parts.append(_df(con, " UNION ALL ".join(sel) + " ORDER BY run_id, rank, epoch, forward_ct"))
    out = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return out.sort_values(["run_id", "rank", "epoch", "forward_ct"], kind="stable", ignore_index=True) \
        if len(parts) > 1 else out


# ---------------------------------------------------------------------------
# schema version 5: each (compact, cap-accept) pair's request keys side by side (sum_key_pairs), so
# sampling inference reads one table and DuckDB returns its totals (no join of 2 x n keys per call)
# ---------------------------------------------------------------------------
_PAIR_TABLES = _NEW_IN_5
MAX_PAIRS_PER_GROUP = 4  # a group (audit_group, NULL counting as one) with more arm combinations keeps none


def _lit_list(xs: Sequence[str]) -> str:
    return "[" + ", ".join("'" + str(x).replace("'", "''") + "'" for x in xs) + "]::VARCHAR[]"


def _derived_pairs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> set[tuple[str, str]]:
    """The (compact, cap-accept) pairs of ``run_ids``' audit groups that the store keeps: the two arms
    of one audit (a group of up to MAX_PAIRS_PER_GROUP combinations; thousands of ungrouped runs
    pair nothing)."""
    if not run_ids:
        return set()
    rows = con.execute(f"""
        WITH r AS (SELECT run_id, arm, coalesce(audit_group, '') AS g FROM {RUNS} WHERE arm IN ('compact', 'cap-accept')),
             ok AS (SELECT g FROM r GROUP BY g HAVING count(*) FILTER (WHERE arm = 'compact')
                                                      * count(*) FILTER (WHERE arm = 'cap-accept') <= {MAX_PAIRS_PER_GROUP})
        SELECT c.run_id, a.run_id FROM r c JOIN r a USING (g)
        WHERE c.arm = 'compact' AND a.arm = 'cap-accept' AND g IN (SELECT g FROM ok)
          AND (list_contains({_lit_list(run_ids)}, c.run_id) OR list_contains({_lit_list(run_ids)}, a.run_id))""").fetchall()
    return {(c, a) for c, a in rows}


def _kept_pairs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> set[tuple[str, str]]:
    """The pairs in sum_pairs that one of ``run_ids`` belongs to."""
    ids = _lit_list(run_ids)
    return {(c, a) for c, a in con.execute(
        f"SELECT compact_run, audit_run FROM {schema.SUM_PAIRS.name} "
        f"WHERE list_contains({ids}, compact_run) OR list_contains({ids}, audit_run)").fetchall()}


def _pair_rows_sql(pairs: str, keys: str | None) -> str:
    """sum_key_pairs rows of the pairs in relation ``pairs`` (c, a) from sum_request_keys: every key of
    the compact run, or (``keys``: a relation of run_id + key) only the keys touched on either side."""
    k = schema.SUM_REQUEST_KEYS.name

    def on(u: str, v: str) -> str:
        return " AND ".join(f"{u}.{c} = {v}.{c}" for c in ("workload", "prompt_index", "seed", "nulls"))
    if keys is None:
        tk = f"(SELECT p.c, p.a, x.workload, x.prompt_index, x.seed, x.nulls FROM {pairs} p JOIN {k} x ON x.run_id = p.c)"
    else:
        tk = (f"(SELECT DISTINCT p.c, p.a, t.workload, t.prompt_index, t.seed, t.nulls FROM {pairs} p "
              f"JOIN {keys} t ON t.run_id = p.c OR t.run_id = p.a)")
    return f"""
        SELECT tk.c, tk.a, x.workload, x.prompt_index, x.seed, x.nulls, x.n, x.sum_acc_len, x.n_acc_len, x.sum_x, x.n_x,
               CASE WHEN y.n_ceil > 0 AND y.nulls = 0 THEN y.sum_ceil1 END,
               CASE WHEN y.n_ceil > 0 AND y.nulls = 0 THEN y.n_ceil END
        FROM {tk} tk JOIN {k} x ON x.run_id = tk.c AND {on('x', 'tk')}
        LEFT JOIN {k} y ON y.run_id = tk.a AND {on('y', 'tk')}"""


def _pairs_relation(pairs: Sequence[tuple[str, str]]) -> str:
    vals = ", ".join("('" + c.replace("'", "''") + "', '" + a.replace("'", "''") + "')" for c, a in pairs)
    return f"(SELECT * FROM (VALUES {vals}) v(c, a))"


def _build_pairs(con: duckdb.DuckDBPyConnection, pairs: Sequence[tuple[str, str]]) -> None:
    """(Re)build ``pairs``' rows from sum_request_keys and record them as kept."""
    if not pairs:
        return
    rel = _pairs_relation(sorted(pairs))
    for t in _PAIR_TABLES:
        con.execute(f"DELETE FROM {t.name} WHERE (compact_run, audit_run) IN (SELECT (c, a) FROM {rel})")
    con.execute(f"INSERT INTO {schema.SUM_KEY_PAIRS.name} {_pair_rows_sql(rel, None)}")
    con.execute(f"INSERT INTO {schema.SUM_PAIRS.name} SELECT c, a FROM {rel}")


def _drop_pairs(con: duckdb.DuckDBPyConnection, pairs: Sequence[tuple[str, str]]) -> None:
    if pairs:
        rel = _pairs_relation(sorted(pairs))
        for t in _PAIR_TABLES:
            con.execute(f"DELETE FROM {t.name} WHERE (compact_run, audit_run) IN (SELECT (c, a) FROM {rel})")


def add_pairs(con: duckdb.DuckDBPyConnection, table: str, view: str, runs: Sequence[str] | None = None) -> None:
    """After :func:`add` folded the rows of ``view`` into ``sum_request_keys``: copy the keys they touched
    into the pairs of their runs (sum_request_keys' current rows, so a key is never counted twice). A
    pair seen for the first time is built from every key its runs have; a pair whose group no longer
    pairs its runs (a third run in the group, an arm changed) is dropped and read by the join. ``runs``: the
    distinct run ids of ``view`` when the caller knows them (read from it otherwise)."""
    if table not in (RS, REQ) or not present(con, _PAIR_TABLES):
        return
    if runs is None:
        runs = [r for (r,) in con.execute(f"SELECT DISTINCT run_id FROM {view}").fetchall()]
    want = _derived_pairs(con, runs)
    have = _kept_pairs(con, runs)
    _drop_pairs(con, sorted(have - want))
    _build_pairs(con, sorted(want - have))
    kept = sorted(want & have)
    if not kept:
        return
    if table == REQ:
        keys = (f"(SELECT DISTINCT run_id, coalesce(workload, '') AS workload, coalesce(prompt_index, 0)::INTEGER "
                f"AS prompt_index, coalesce(seed, 0)::BIGINT AS seed, ((workload IS NULL)::INT + 2 * (prompt_index "
                f"IS NULL)::INT + 4 * (seed IS NULL)::INT) AS nulls FROM {view})")
    else:  # the blocks' keys are on their requests rows
        keys = (f"(SELECT DISTINCT q.run_id, coalesce(q.workload, '') AS workload, coalesce(q.prompt_index, 0)::INTEGER "
                f"AS prompt_index, coalesce(q.seed, 0)::BIGINT AS seed, ((q.workload IS NULL)::INT + 2 * "
                f"(q.prompt_index IS NULL)::INT + 4 * (q.seed IS NULL)::INT) AS nulls FROM {REQ} q "
                f"JOIN (SELECT DISTINCT run_id, rid FROM {view}) v ON v.run_id = q.run_id AND v.rid = q.rid "
                f"WHERE list_contains({_lit_list(runs)}, q.run_id))")
    con.execute(f"INSERT OR REPLACE INTO {schema.SUM_KEY_PAIRS.name} {_pair_rows_sql(_pairs_relation(kept), keys)}")


def rebuild_pairs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str],
                  tables: Sequence[schema.Table] = schema.SUMMARY_TABLES) -> list[str]:
    """After :func:`rebuild` (request keys of ``run_ids`` recomputed): rebuild their runs' pairs; returns
    the runs of the pairs built."""
    if not run_ids or not present(con, _PAIR_TABLES) or not (
            schema.SUM_REQUEST_KEYS in tables or schema.SUM_KEY_PAIRS in tables):
        return []
    ids = list(run_ids)
    want = _derived_pairs(con, ids)
    have = _kept_pairs(con, ids)
    _drop_pairs(con, sorted(have - want))
    _build_pairs(con, sorted(want))
    return sorted({r for p in want for r in p})


def ensure_pairs(con: duckdb.DuckDBPyConnection, version: int, rebuilt: list[str]) -> list[str]:
    """In :func:`ensure`, a file from before version 5: build every pair its runs make; returns the
    runs rebuilt so far plus those."""
    if version >= 5:
        return rebuilt
    ids = [r for (r,) in con.execute(f"SELECT run_id FROM {RUNS}").fetchall()]
    return sorted(set(rebuilt) | set(rebuild_pairs(con, ids, _PAIR_TABLES)))


def pair_totals(con: duckdb.DuckDBPyConnection, compact_run: str, audit_run: str) -> dict | None:
    """What sampling inference needs from a kept pair, read from ``sum_key_pairs`` (no join): the
    compact keys' count and weighted totals (Σw, Σwa, Σwx, Σwz), the audited keys' count, tail count
    and six totals, and, unless every key is audited, the audited keys' (w, t, z, y) rows in
    :func:`per_request`'s order (the bootstrap resamples them). None when the pair is not kept, a run
    is stale, or a key lacks a or x or has a NaN one (a NaN survival: :func:`per_request_columns` answers,
    with numpy's NaN semantics)."""
    p = {"c": compact_run, "a": audit_run}
    try:
        kept = con.execute(f"SELECT count(*) FROM {schema.SUM_PAIRS.name} WHERE compact_run = $c AND audit_run = $a",
                           p).fetchone()[0]
    except duckdb.CatalogException:  # a file from before version 5, read-only
        return None
    if not kept or stale_runs(con, [compact_run, audit_run]):
        return None
    rows = f"""
        WITH k AS (SELECT workload, prompt_index, seed, n::DOUBLE AS w, sum_acc_len / nullif(n_acc_len, 0) AS a,
                          sum_x / nullif(n_x, 0) AS x, audit_sum_ceil1 / audit_n_ceil AS y
                   FROM {schema.SUM_KEY_PAIRS.name} WHERE compact_run = $c AND audit_run = $a AND n > 0)
        SELECT workload, prompt_index, seed, w, a, x, y, y - a AS t, greatest(x - a, 0) AS z FROM k"""
    au = "FILTER (WHERE y IS NOT NULL)"
    got = con.execute(f"""
        SELECT count(*), count(a) - count(*) FILTER (WHERE isnan(a)), count(x) - count(*) FILTER (WHERE isnan(x)),
               sum(w), sum(w * a), sum(w * x), sum(w * z),
               count(*) {au}, count(*) FILTER (WHERE y IS NOT NULL AND t > 1e-9),
               sum(w) {au}, sum(w * t) {au}, sum(w * z) {au}, sum(w * z * z) {au}, sum(w * z * t) {au}, sum(w * y) {au}
        FROM ({rows})""", p).fetchone()
    n, n_a, n_x = got[:3]
    if n == 0 or n_a < n or n_x < n:
        return None
    out = {"n_requests": int(n), "sw": got[3], "swa": got[4], "swx": got[5], "swz": got[6], "m": int(got[7]),
           "n_with_tail": int(got[8]), "sums": np.array([v if v is not None else 0.0 for v in got[9:15]], float),
           "rows": None}
    if out["m"] < out["n_requests"]:
        cols = con.execute(f"SELECT w, t, z, y FROM ({rows}) WHERE y IS NOT NULL "
                           "ORDER BY workload, prompt_index, seed", p).fetchnumpy()
        out["rows"] = tuple(np.asarray(cols[c], dtype=float) for c in ("w", "t", "z", "y"))
    return out


# ---------------------------------------------------------------------------
# schema version 6: the drill-down's rows (sum_request_page), kept sorted per run, so a page of requests
# is a range of positions plus the rows added since the run was last sorted (no sort of every request)
# ---------------------------------------------------------------------------
PAGE_TAIL_MIN = 4096  # rows added since a run's last sort past which add() sorts it again ...
PAGE_TAIL_SHARE = 8  # ... or past 1/PAGE_TAIL_SHARE of its sorted rows, whichever is more (amortised rewrites)
_PAGE = schema.SUM_REQUEST_PAGE.name
_PAGE_RUNS = schema.SUM_PAGE_RUNS.name
_PAGE_REQ = ("workload", "prompt_index", "seed", "temperature", "completion_tokens", "finish_reason", "latency_s")
_PAGE_SUMS = ("n", "sum_acc_len", "n_acc_len", "sum_window", "n_window", "sum_ceil1", "n_ceil")
_PAGE_ORDER = "workload, prompt_index, rid"  # requests()' order (DuckDB's default: NULLS LAST)


def _page_limit(n_base: int) -> int:
    return max(PAGE_TAIL_MIN, int(n_base) // PAGE_TAIL_SHARE)


def add_pages(con: duckdb.DuckDBPyConnection, table: str, view: str, req_view: str,
              runs: Sequence[str] | None = None) -> None:
    """In :func:`add`: fold a batch into ``sum_request_page`` (blocks: the per-request sums ``req_view``
    of the batch; requests rows: their columns), new rows unsorted (``pos`` NULL); then sort a run
    whose unsorted requests outgrow :func:`_page_limit` (:func:`_sort_pages`)."""
    if table not in (RS, REQ) or not present(con, _NEW_IN_6):
        return
    if runs is None:  # (add() passes the batch's runs, read off its Arrow columns)
        runs = [r for (r,) in con.execute(f"SELECT DISTINCT run_id FROM {view}").fetchall()]
    sums = ", ".join(_PAGE_SUMS)
    if table == RS:
        # only listed requests (a requests row stored) have a page row to add to; the blocks of the others
        # stay in sum_requests, which a requests row's insert below reads. A server dump's ingest lists no
        # requests: no statement (an upsert of every batch's requests cost ~0.35 CPU-s per 100k
        # request-steps, 22% of that ingest)
        if _has_rows(con, _PAGE, runs):
            con.execute(f"""
                UPDATE {_PAGE} SET grown = CASE WHEN pos IS NOT NULL THEN true END,
                       {", ".join(f"{c} = {_PAGE}.{c} + v.{c}" for c in _PAGE_SUMS)}
                FROM (SELECT run_id, rid, {", ".join(f"sum({c}) AS {c}" for c in _PAGE_SUMS)} FROM {req_view}
                      GROUP BY run_id, rid) v
                WHERE {_PAGE}.run_id = v.run_id AND {_PAGE}.rid = v.rid""")
    else:  # rows already there get the request's columns by an UPDATE join (ON CONFLICT DO UPDATE took
        # ~45 us a row here: 0.7 CPU-s per 16k requests rows); new ones are inserted with the blocks stored
        # so far (sum_requests)
        cols = ", ".join(_q(c) for c in _PAGE_REQ)
        con.execute(f"""
            UPDATE {_PAGE} SET has_req = true, {", ".join(f"{c} = v.{c}" for c in cols.split(", "))}
            FROM {view} v WHERE {_PAGE}.run_id = v.run_id AND {_PAGE}.rid = v.rid""")
        con.execute(f"""
            INSERT INTO {_PAGE} (run_id, rid, pos, has_req, {cols}, {sums})
            SELECT v.run_id, v.rid, NULL, true, {", ".join(f"v.{c}" for c in cols.split(", "))},
                   {", ".join(f"coalesce(b.{c}, 0)" for c in _PAGE_SUMS)}
            FROM {view} v LEFT JOIN (
                SELECT s.run_id, s.rid, {", ".join(f"sum(s.{c}) AS {c}" for c in _PAGE_SUMS)}
                FROM {schema.SUM_REQUESTS.name} s SEMI JOIN {view} w ON s.run_id = w.run_id AND s.rid = w.rid
                GROUP BY s.run_id, s.rid) b ON v.run_id = b.run_id AND v.rid = b.rid
            ON CONFLICT DO NOTHING""")
    con.execute(f"INSERT INTO {_PAGE_RUNS} SELECT unnest({_lit_list(runs)}), 0 ON CONFLICT DO NOTHING")
    if table == REQ:
        _sort_pages(con, runs)


def _page_tails(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Per run: (sorted rows, listed rows added since)."""
    lit = _lit_list(runs)
    base = dict(con.execute(f"SELECT run_id, n_base FROM {_PAGE_RUNS} WHERE list_contains({lit}, run_id)").fetchall())
    tail = dict(con.execute(f"SELECT run_id, count(*) FROM {_PAGE} WHERE pos IS NULL AND has_req "
                            f"AND list_contains({lit}, run_id) GROUP BY run_id").fetchall())
    return {r: (int(base.get(r, 0)), int(tail.get(r, 0))) for r in runs}


_SORTED = schema.SUM_REQUEST_SORTED.name
_SORTED_COLS = ", ".join(_q(c.name) for c in schema.SUM_REQUEST_SORTED.columns)


def _create_sorted(con: duckdb.DuckDBPyConnection) -> None:
    """``sum_request_sorted`` without a primary key (column types from the record model via Arrow)."""
    empty = pa.Table.from_pylist([], schema=schema.SUM_REQUEST_SORTED.arrow_schema)
    con.register("_acceptscope_sorted_type", empty)
    try:
        con.execute(f"CREATE TABLE IF NOT EXISTS {_SORTED} AS SELECT * FROM _acceptscope_sorted_type")
    finally:
        con.unregister("_acceptscope_sorted_type")


def _sort_pages(con: duckdb.DuckDBPyConnection, runs: Sequence[str], force: bool = False) -> None:
    """For each run in ``runs`` whose unsorted page rows outgrew :func:`_page_limit` (every one, ``force``):
    rank its listed rows in (workload, prompt_index, rid) order (``pos``, an UPDATE in place; ``grown`` cleared)
    and rewrite its copy in ``sum_request_sorted`` in that order (a table without an index: deleting
    the run's rows from the ART-indexed ``sum_request_page`` would cost ~70 us a row at commit)."""
    _create_sorted(con)
    for r, (n_base, n_tail) in _page_tails(con, runs).items():
        if not n_tail or (not force and n_tail <= _page_limit(n_base)):
            continue
        p = {"r": r}
        con.execute(f"""
            UPDATE {_PAGE} SET pos = s.pos, grown = NULL
            FROM (SELECT rid, row_number() OVER (ORDER BY {_PAGE_ORDER}) - 1 AS pos
                  FROM {_PAGE} WHERE run_id = $r AND has_req) s
            WHERE {_PAGE}.run_id = $r AND {_PAGE}.rid = s.rid""", p)
        con.execute(f"DELETE FROM {_SORTED} WHERE run_id = $r", p)
        con.execute(f"INSERT INTO {_SORTED} SELECT {_SORTED_COLS} FROM {_PAGE} WHERE run_id = $r AND pos IS NOT NULL "
                    "ORDER BY pos", p)
        con.execute(f"UPDATE {_PAGE_RUNS} SET n_base = {int(n_base) + int(n_tail)} WHERE run_id = $r", p)


def rebuild_pages(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str],
                  tables: Sequence[schema.Table] = schema.SUMMARY_TABLES,
                  each: Step = _inline) -> None:
    """After :func:`rebuild`: ``run_ids``' page rows from their requests rows and ``sum_requests``
    (unsorted, then sorted by the rule :func:`add` follows). ``each`` runs the two steps (the old rows'
    delete; the insert and the sort), as in :func:`rebuild`."""
    if not run_ids or schema.SUM_REQUEST_PAGE not in tables or not present(con, _NEW_IN_6):
        return
    ids = {"ids": list(run_ids)}

    def clear() -> None:
        _create_sorted(con)
        for t in (*_NEW_IN_6, schema.SUM_REQUEST_SORTED):
            con.execute(f"DELETE FROM {t.name} WHERE run_id IN (SELECT unnest($ids))", ids)

    def fill() -> None:
        cols = ", ".join(_q(c) for c in _PAGE_REQ)
        con.execute(f"""
            INSERT INTO {_PAGE} (run_id, rid, pos, has_req, {cols}, {", ".join(_PAGE_SUMS)})
            WITH b AS (SELECT run_id, rid, {", ".join(f"sum({c}) AS {c}" for c in _PAGE_SUMS)}
                       FROM {schema.SUM_REQUESTS.name} WHERE run_id IN (SELECT unnest($ids)) GROUP BY run_id, rid),
                 q AS (SELECT run_id, rid, {cols} FROM {REQ} WHERE run_id IN (SELECT unnest($ids)))
            SELECT q.run_id, q.rid, NULL, true,
                   {", ".join(f"q.{c}" for c in cols.split(", "))}, {", ".join(f"coalesce(b.{c}, 0)" for c in _PAGE_SUMS)}
            FROM q LEFT JOIN b ON q.run_id = b.run_id AND q.rid = b.rid""", ids)
        con.execute(f"INSERT INTO {_PAGE_RUNS} SELECT run_id, 0 FROM (SELECT run_id FROM {REQ} UNION SELECT run_id "
                    f"FROM {schema.SUM_REQUESTS.name}) WHERE run_id IN (SELECT unnest($ids))", ids)  # as add() lists them
        _sort_pages(con, list(run_ids))
    each(clear)
    each(fill)


def ensure_pages(con: duckdb.DuckDBPyConnection, version: int, rebuilt: list[str]) -> list[str]:
    """In :func:`ensure`, a file from before version 6: build every run's page rows; returns the runs
    rebuilt so far plus those."""
    if version >= 6:
        return rebuilt
    ids = [r for (r,) in con.execute(f"SELECT run_id FROM {REQ} UNION SELECT run_id FROM {schema.SUM_REQUESTS.name}")
           .fetchall()]
    rebuild_pages(con, ids)
    return sorted(set(rebuilt) | set(ids))


def page_of_requests(con: duckdb.DuckDBPyConnection, run_id: str, limit: int, offset: int) -> pd.DataFrame | None:
    """:func:`requests`' page from the sorted copy (None: an older file, or a stale run). The run's rows
    ranked ``offset .. offset + limit`` are among its sorted rows at positions ``offset - t .. offset +
    limit`` and its ``t`` unsorted ones (each unsorted row sorting before a page row shifts it by one):
    one ordered LIMIT over those few rows answers, with the same ordering SQL. A sorted row whose blocks
    grew since the sort (``grown``: a constant filter, so zone maps skip row groups without one) takes its
    current sums from ``sum_request_page``."""
    try:  # the unsorted rows: mostly the last row groups (zone maps on pos skip the others)
        t = con.execute(f"SELECT count(*) FROM {_PAGE} WHERE run_id = $r AND pos IS NULL AND has_req",
                        {"r": run_id}).fetchone()[0]
        con.execute(f"SELECT 1 FROM {_SORTED} LIMIT 0")
    except duckdb.CatalogException:  # a file from before version 6, read-only
        return None
    if stale_runs(con, [run_id]):
        return None
    limit, offset = int(limit), int(offset)
    lo, hi = max(0, offset - int(t)), offset + limit
    rng = f"pos >= {lo} AND pos < {hi}"
    cols = ", ".join(_PAGE_REQ)
    sums = ", ".join(_PAGE_SUMS)

    def cur(c: str) -> str:  # the current sum: the page row's, where its blocks grew since the sort
        return f"coalesce(d.{c}, c.{c})"
    return _df(con, f"""
        WITH c AS (SELECT rid, {cols}, {sums} FROM {_SORTED} WHERE run_id = $r AND {rng}
                   UNION ALL
                   SELECT rid, {cols}, {sums} FROM {_PAGE} WHERE run_id = $r AND pos IS NULL AND has_req),
             d AS (SELECT rid, {sums} FROM {_PAGE} WHERE run_id = $r AND grown AND {rng})
        SELECT c.rid, c.workload, c.prompt_index, c.seed, c.temperature, c.completion_tokens, c.finish_reason,
               c.latency_s, CASE WHEN {cur('n')} > 0 THEN {cur('n')}::HUGEINT END AS blocks,
               {cur('sum_acc_len')} / nullif({cur('n_acc_len')}, 0) AS mean_acc_len,
               {cur('sum_window')} / nullif({cur('n_window')}, 0) AS mean_window,
               {cur('sum_ceil1')} / nullif({cur('n_ceil')}, 0) AS ceiling_accept_len
        FROM c LEFT JOIN d USING (rid)
        ORDER BY c.workload, c.prompt_index, c.rid LIMIT {limit} OFFSET {offset - lo}""", {"r": run_id})
