"""Keeping the summaries: fold each append into them, rebuild stale runs, and record the schema version.

Why: ``Store.write_arrow`` calls :func:`add` in the transaction of every append (ingest, the engine's writer
and live capture all go through it), counting only rows actually inserted; a read-write open calls
:func:`ensure`, which rebuilds what an older file or a raw INSERT left stale.
"""

from __future__ import annotations

import json
from typing import Any, Callable, Sequence

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope import batch_summaries, schema
from acceptscope.domain import temperature
from acceptscope.summaries import freshness, pages, pairs
from acceptscope.summaries.definitions import (KEY_SUMS, NEW_IN_3, NEW_IN_4, RELIABILITY_BINS, REQ, RS, STEPS,
                                               SUMMARIES_OF, Step, agg_sql, has_rows, ident, inline_step,
                                               keys_sql, table_names)
from acceptscope.summaries.freshness import REBUILDING

# DuckDB's memory for a rebuild (its default is 80% of RAM): the aggregation of a 100M request-step run
# spills to the database's temp directory instead (bench/scale.py's 100M store: see docs/scale.md §8). What
# cannot spill grows with a run's requests: a transaction's changes to the key indexes of sum_requests and
# sum_request_page, hence one step per delete and per insert in ensure() (3.9M requests in that store: 502 CPU-s,
# 1,221 MB peak; with the delete and the insert in one transaction it ran out of 1GB)
REBUILD_MEMORY = "1GB"


def _upsert_sql(t: schema.Table, select: str, first: bool = False) -> str:
    """INSERT the SELECT's rows, adding sums and counts into rows whose key already exists.

    ``first``: no stored row can share a key with them (the caller knows the table holds no row of their
    runs, and the SELECT yields each key once): a plain INSERT, which skips the conflict check (~1-5 ms a
    statement, what a small flush's summaries mostly cost)."""
    if first:
        return f"INSERT INTO {ident(t.name)} {select}"
    sets = []
    for c in t.columns:
        if c.name in t.key:
            continue
        q = ident(c.name)
        sets.append(f"{q} = greatest({q}, EXCLUDED.{q})" if c.name.startswith("max_") else f"{q} = {q} + EXCLUDED.{q}")
    return f"INSERT INTO {ident(t.name)} {select} ON CONFLICT DO UPDATE SET {', '.join(sets)}"


def add(con: duckdb.DuckDBPyConnection, table: str, inserted: pa.Table) -> None:
    """Fold rows just inserted into ``table`` into its summaries (inside the caller's transaction).

    Per-request sums are aggregated once and feed both ``sum_requests`` and ``sum_request_keys``."""
    sums = SUMMARIES_OF.get(table)
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
        first = table in (RS, schema.STEPS.name) and runs is not None and not has_rows(
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
            max_len = max_list_len(inserted, "survival") if t is schema.SUM_POSITIONS else None
            con.execute(_upsert_sql(t, agg_sql(t, view, max_len=max_len), first))
        # request keys: new blocks of requests whose requests row is stored, and new requests rows with the
        # blocks stored so far (whichever comes second in a transaction sees the first; nothing counts twice)
        if table == RS:
            rt = schema.SUM_REQUESTS
            req_rows = batch_summaries.requests_rows(inserted, groups)
            if req_rows is None:
                rel = con.sql(f"SELECT * FROM ({agg_sql(rt, view)}) AS x({', '.join(ident(c) for c in rt.names)})")
                req_rows = (getattr(rel, "to_arrow_table", None) or rel.arrow)()
            con.register(req_view, req_rows)
            con.execute(_upsert_sql(schema.SUM_RUN_RIDS, _new_rids_sql(req_view), first))  # before sum_requests grows
            con.execute(_upsert_sql(rt, f"SELECT * FROM {req_view}", first))
            # (an inner join with the requests rows: none stored for these runs, as in a server dump's ingest,
            # adds nothing; the probe is ~1 ms, the statement ~25 ms per 100k rows)
            if runs is None or has_rows(con, REQ, runs):
                cols = ", ".join(f"sum({c}) AS {c}" for c in KEY_SUMS)
                per_rid = f"(SELECT run_id, rid, {cols} FROM {req_view} GROUP BY run_id, rid)"
                con.execute(_upsert_sql(keys, keys_sql(REQ, per_rid, "", "0")))
        elif table == REQ:
            cols = ", ".join(f"sum(s.{c}) AS {c}" for c in KEY_SUMS)
            per_rid = (f"(SELECT s.run_id, s.rid, {cols} FROM {schema.SUM_REQUESTS.name} s "
                       f"JOIN {view} v ON v.run_id = s.run_id AND v.rid = s.rid GROUP BY s.run_id, s.rid)")
            con.execute(_upsert_sql(keys, keys_sql(view, per_rid, "LEFT", "count(*)")))
        pairs.add_pairs(con, table, view, runs)  # the audit pairs' copies of the keys just touched
        pages.add_pages(con, table, view, req_view, runs)  # the drill-down's rows of the requests just touched
    finally:
        con.unregister(view)
        if table == RS:
            con.unregister(req_view)


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
    of ``t``: the caller then runs :func:`agg_sql`."""
    if groups is None:
        return None
    if t is schema.SUM_CELLS:
        return batch_summaries.cells_rows(tbl, groups)
    if t is schema.SUM_POSITIONS:
        return batch_summaries.positions_rows(tbl, groups)
    if t is schema.SUM_RELIABILITY:
        return batch_summaries.reliability_rows(con, tbl, groups, RELIABILITY_BINS)
    return None


def max_list_len(tbl: pa.Table, column: str) -> int:
    """Longest list in ``tbl[column]`` (0 when all are NULL or empty)."""
    m = pc.max(pc.list_value_length(tbl[column])).as_py()
    return int(m or 0)


def rebuild(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str],
            tables: Sequence[schema.Table] = schema.SUMMARY_TABLES,
            each: Step = inline_step) -> None:
    """Recompute the summaries ``tables`` of ``run_ids`` from the raw tables (DuckDB aggregation).

    ``each`` runs every step (a summary table's delete, then its insert; then the pairs, then the pages):
    in the caller's transaction by default; :func:`ensure` gives each step a transaction of its own (a
    delete and an insert of 3.9M ``sum_requests`` rows in one ran out of 1 GB: the key index holds both)."""
    ids = list(run_ids)
    if not ids:
        return
    for base, sums in SUMMARIES_OF.items():
        src = f"(SELECT * FROM {ident(base)} WHERE run_id IN (SELECT unnest($ids)))"
        for t in sums:
            if t not in tables:
                continue
            each(lambda t=t: con.execute(f"DELETE FROM {ident(t.name)} WHERE run_id IN (SELECT unnest($ids))",
                                         {"ids": ids}))
            each(lambda t=t, src=src: con.execute(f"INSERT INTO {ident(t.name)} {agg_sql(t, src)}", {"ids": ids}))
    each(lambda: pairs.rebuild_pairs(con, ids, tables))  # the audit pairs of these runs from their rebuilt keys
    pages.rebuild_pages(con, ids, tables, each)  # the drill-down's rows from requests + sum_requests


def schema_version(con: duckdb.DuckDBPyConnection) -> int:
    """The file's schema version (1: written before ``store_meta`` existed)."""
    if schema.STORE_META.name not in table_names(con):
        return 1
    row = con.execute(f"SELECT value FROM {schema.STORE_META.name} WHERE key = 'schema_version'").fetchone()
    try:
        return int(row[0]) if row else 1
    except ValueError:
        raise ValueError(f"{schema.STORE_META.name}.schema_version is {row[0]!r}, not an integer") from None


def check_version(con: duckdb.DuckDBPyConnection, path: object) -> int:
    """The file's schema version; refuses a file a newer acceptscope wrote (``path`` names it)."""
    v = schema_version(con)
    if v > schema.SCHEMA_VERSION:
        raise ValueError(f"{path}: written by a newer acceptscope (schema version {v}; this one reads up to "
                         f"{schema.SCHEMA_VERSION}): upgrade acceptscope to read it")
    return v


def record_version(con: duckdb.DuckDBPyConnection, new_file: bool = False) -> None:
    """Mark the file as holding this release's summaries (``store_meta.schema_version``).

    ``new_file``: ``store_meta`` was created in this transaction, so a plain INSERT (an INSERT OR REPLACE
    costs ~4 ms more: its first conflict check, on every new store)."""
    verb = "INSERT" if new_file else "INSERT OR REPLACE"
    con.execute(f"{verb} INTO {schema.STORE_META.name} VALUES ('schema_version', ?)", [str(schema.SCHEMA_VERSION)])


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
    ``store_meta`` (:data:`.freshness.REBUILDING`), so a reader, or the next open after a crash, counts them stale
    (:func:`.freshness.stale_runs`) and aggregates their raw rows. Returns the runs rebuilt (a file from before schema
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
        stale = sorted(freshness.stale_runs(con))
        if stale:
            own(lambda: con.execute(f"INSERT OR REPLACE INTO {meta} VALUES (?, ?)", [REBUILDING, json.dumps(stale)]))
        rebuild(con, stale, each=own)
        if v < 3:  # step bins and request keys are new in version 3: fill them for the runs kept above
            done = set(stale)
            todo = [r for (r,) in con.execute(f"SELECT run_id FROM {STEPS} UNION SELECT run_id FROM {REQ}").fetchall()
                    if r not in done]
            rebuild(con, todo, NEW_IN_3, each=own)
            stale = sorted(done | set(todo))
        if v < 4:  # the per-run request counts are new in version 4
            done = set(stale)
            todo = [r for (r,) in con.execute(f"SELECT DISTINCT run_id FROM {RS}").fetchall() if r not in done]
            rebuild(con, todo, NEW_IN_4, each=own)
            stale = sorted(done | set(todo))
        stale = own(lambda: pairs.ensure_pairs(con, v, stale))  # new in version 5: sum_key_pairs
        stale = own(lambda: pages.ensure_pages(con, v, stale))  # new in version 6: sum_request_page
        if v < 7:  # runs.role is new in version 7: each stored run's role from its arm and audit group
            own(lambda: con.execute(f"UPDATE {schema.RUNS.name} SET role = {schema.ROLE_SQL} WHERE role IS NULL"))
        if v < schema.TEMPERATURES_FILLED_SINCE:  # version 8: request-step temperatures filled on write
            own(lambda: temperature.fill_stored(con))

        def finish() -> None:
            record_version(con)
            con.execute(f"DELETE FROM {meta} WHERE key = ?", [REBUILDING])
        own(finish)
    finally:
        con.execute(f"SET memory_limit='{limit}'")
    return stale
