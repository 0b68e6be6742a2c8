"""Request pages: the drill-down's rows (``sum_request_page``), kept sorted per run, and the page reads.

Why: a page of requests is then a range of positions plus the rows added since the run was last sorted (no
sort of every request on each page of a 100M request-step store; docs/scale.md).
"""

from __future__ import annotations

from typing import Sequence

import duckdb
import pandas as pd
import pyarrow as pa

from acceptscope import schema
from acceptscope.summaries import freshness
from acceptscope.summaries.definitions import (PAGE_TABLES, REQ, RS, Step, has_rows, ident, inline_step,
                                               lit_list, present, query_df)

PAGE_TAIL_MIN = 4096  # rows added since a run's last sort past which add() sorts it again ...
PAGE_TAIL_SHARE = 8  # ... or past 1/PAGE_TAIL_SHARE of its sorted rows, whichever is more (amortised rewrites)
_PAGE = schema.SUM_REQUEST_PAGE.name
_PAGE_RUNS = schema.SUM_PAGE_RUNS.name
_PAGE_REQ = ("workload", "prompt_index", "seed", "temperature", "completion_tokens", "finish_reason", "latency_s")
_PAGE_SUMS = ("n", "sum_acc_len", "n_acc_len", "sum_window", "n_window", "sum_ceil1", "n_ceil")
_PAGE_ORDER = "workload, prompt_index, rid"  # requests()' order (DuckDB's default: NULLS LAST)


def page_limit(n_base: int) -> int:
    """Unsorted rows past which a run of ``n_base`` sorted rows is sorted again (:func:`sort_pages`)."""
    return max(PAGE_TAIL_MIN, int(n_base) // PAGE_TAIL_SHARE)


def add_pages(con: duckdb.DuckDBPyConnection, table: str, view: str, req_view: str,
              runs: Sequence[str] | None = None) -> None:
    """In :func:`.maintenance.add`: fold a batch into ``sum_request_page`` (blocks: the per-request sums ``req_view``
    of the batch; requests rows: their columns), new rows unsorted (``pos`` NULL); then sort a run
    whose unsorted requests outgrow :func:`page_limit` (:func:`sort_pages`)."""
    if table not in (RS, REQ) or not present(con, PAGE_TABLES):
        return
    if runs is None:  # (add() passes the batch's runs, read off its Arrow columns)
        runs = [r for (r,) in con.execute(f"SELECT DISTINCT run_id FROM {view}").fetchall()]
    sums = ", ".join(_PAGE_SUMS)
    if table == RS:
        # only listed requests (a requests row stored) have a page row to add to; the blocks of the others
        # stay in sum_requests, which a requests row's insert below reads. A server dump's ingest lists no
        # requests: no statement (an upsert of every batch's requests cost ~0.35 CPU-s per 100k
        # request-steps, 22% of that ingest)
        if has_rows(con, _PAGE, runs):
            con.execute(f"""
                UPDATE {_PAGE} SET grown = CASE WHEN pos IS NOT NULL THEN true END,
                       {", ".join(f"{c} = {_PAGE}.{c} + v.{c}" for c in _PAGE_SUMS)}
                FROM (SELECT run_id, rid, {", ".join(f"sum({c}) AS {c}" for c in _PAGE_SUMS)} FROM {req_view}
                      GROUP BY run_id, rid) v
                WHERE {_PAGE}.run_id = v.run_id AND {_PAGE}.rid = v.rid""")
    else:  # rows already there get the request's columns by an UPDATE join (ON CONFLICT DO UPDATE took
        # ~45 us a row here: 0.7 CPU-s per 16k requests rows); new ones are inserted with the blocks stored
        # so far (sum_requests)
        cols = ", ".join(ident(c) for c in _PAGE_REQ)
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
    con.execute(f"INSERT INTO {_PAGE_RUNS} SELECT unnest({lit_list(runs)}), 0 ON CONFLICT DO NOTHING")
    if table == REQ:
        sort_pages(con, runs)


def page_tails(con: duckdb.DuckDBPyConnection, runs: Sequence[str]) -> dict[str, tuple[int, int]]:
    """Per run: (sorted rows, listed rows added since)."""
    lit = lit_list(runs)
    base = dict(con.execute(f"SELECT run_id, n_base FROM {_PAGE_RUNS} WHERE list_contains({lit}, run_id)").fetchall())
    tail = dict(con.execute(f"SELECT run_id, count(*) FROM {_PAGE} WHERE pos IS NULL AND has_req "
                            f"AND list_contains({lit}, run_id) GROUP BY run_id").fetchall())
    return {r: (int(base.get(r, 0)), int(tail.get(r, 0))) for r in runs}


_SORTED = schema.SUM_REQUEST_SORTED.name
_SORTED_COLS = ", ".join(ident(c.name) for c in schema.SUM_REQUEST_SORTED.columns)


def _create_sorted(con: duckdb.DuckDBPyConnection) -> None:
    """``sum_request_sorted`` without a primary key (column types from the record model via Arrow)."""
    empty = pa.Table.from_pylist([], schema=schema.SUM_REQUEST_SORTED.arrow_schema)
    con.register("_acceptscope_sorted_type", empty)
    try:
        con.execute(f"CREATE TABLE IF NOT EXISTS {_SORTED} AS SELECT * FROM _acceptscope_sorted_type")
    finally:
        con.unregister("_acceptscope_sorted_type")


def sort_pages(con: duckdb.DuckDBPyConnection, runs: Sequence[str], force: bool = False) -> None:
    """For each run in ``runs`` whose unsorted page rows outgrew :func:`page_limit` (every one, ``force``):
    rank its listed rows in (workload, prompt_index, rid) order (``pos``, an UPDATE in place; ``grown`` cleared)
    and rewrite its copy in ``sum_request_sorted`` in that order (a table without an index: deleting
    the run's rows from the ART-indexed ``sum_request_page`` would cost ~70 us a row at commit)."""
    _create_sorted(con)
    for r, (n_base, n_tail) in page_tails(con, runs).items():
        if not n_tail or (not force and n_tail <= page_limit(n_base)):
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
                  each: Step = inline_step) -> None:
    """After :func:`.maintenance.rebuild`: ``run_ids``' page rows from their requests rows and ``sum_requests``
    (unsorted, then sorted by the rule :func:`.maintenance.add` follows). ``each`` runs the two steps (the old rows'
    delete; the insert and the sort), as in :func:`.maintenance.rebuild`."""
    if not run_ids or schema.SUM_REQUEST_PAGE not in tables or not present(con, PAGE_TABLES):
        return
    ids = {"ids": list(run_ids)}

    def clear() -> None:
        _create_sorted(con)
        for t in (*PAGE_TABLES, schema.SUM_REQUEST_SORTED):
            con.execute(f"DELETE FROM {t.name} WHERE run_id IN (SELECT unnest($ids))", ids)

    def fill() -> None:
        cols = ", ".join(ident(c) for c in _PAGE_REQ)
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
        sort_pages(con, list(run_ids))
    each(clear)
    each(fill)


def ensure_pages(con: duckdb.DuckDBPyConnection, version: int, rebuilt: list[str]) -> list[str]:
    """In :func:`.maintenance.ensure`, a file from before version 6: build every run's page rows; returns the runs
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
    if freshness.stale_runs(con, [run_id]):
        return None
    limit, offset = int(limit), int(offset)
    lo, hi = max(0, offset - int(t)), offset + limit
    rng = f"pos >= {lo} AND pos < {hi}"
    cols = ", ".join(_PAGE_REQ)
    sums = ", ".join(_PAGE_SUMS)

    def cur(c: str) -> str:  # the current sum: the page row's, where its blocks grew since the sort
        return f"coalesce(d.{c}, c.{c})"
    return query_df(con, f"""
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


def requests(con: duckdb.DuckDBPyConnection, run_id: str, limit: int = 5000, offset: int = 0) -> pd.DataFrame:
    """One page of a run's requests (``limit`` from ``offset``, in workload, prompt order) with their
    block statistics: from the sorted page rows (:func:`page_of_requests`, version 6), else the page is
    picked from ``requests`` first and only its requests' summary rows are summed."""
    page = page_of_requests(con, run_id, limit, offset)
    if page is not None:
        return page
    reqs = freshness.source(con, schema.SUM_REQUESTS, [run_id])
    return query_df(con, f"""
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
