"""Audit pairs: each (compact, cap-accept) pair's request keys side by side (``sum_key_pairs``), and the
per-request reads sampling inference makes of a pair.

Why: sampling inference then reads one table and DuckDB returns its totals (no join of 2 x n keys per call);
a pair that is not kept is answered by the join of both runs' request keys (:func:`per_request`).
"""

from __future__ import annotations

from typing import Sequence

import duckdb
import numpy as np
import pandas as pd

from acceptscope import schema
from acceptscope.summaries import freshness
from acceptscope.summaries.definitions import PAIR_TABLES, REQ, RS, RUNS, lit_list, present, query_df

MAX_PAIRS_PER_GROUP = 4  # a group (audit_group, NULL counting as one) with more arm combinations keeps none


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
          AND (list_contains({lit_list(run_ids)}, c.run_id) OR list_contains({lit_list(run_ids)}, a.run_id))""").fetchall()
    return {(c, a) for c, a in rows}


def _kept_pairs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> set[tuple[str, str]]:
    """The pairs in sum_pairs that one of ``run_ids`` belongs to."""
    ids = lit_list(run_ids)
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
    for t in PAIR_TABLES:
        con.execute(f"DELETE FROM {t.name} WHERE (compact_run, audit_run) IN (SELECT (c, a) FROM {rel})")
    con.execute(f"INSERT INTO {schema.SUM_KEY_PAIRS.name} {_pair_rows_sql(rel, None)}")
    con.execute(f"INSERT INTO {schema.SUM_PAIRS.name} SELECT c, a FROM {rel}")


def _drop_pairs(con: duckdb.DuckDBPyConnection, pairs: Sequence[tuple[str, str]]) -> None:
    if pairs:
        rel = _pairs_relation(sorted(pairs))
        for t in PAIR_TABLES:
            con.execute(f"DELETE FROM {t.name} WHERE (compact_run, audit_run) IN (SELECT (c, a) FROM {rel})")


def add_pairs(con: duckdb.DuckDBPyConnection, table: str, view: str, runs: Sequence[str] | None = None) -> None:
    """After :func:`.maintenance.add` folded the rows of ``view`` into ``sum_request_keys``: copy the keys they touched
    into the pairs of their runs (sum_request_keys' current rows, so a key is never counted twice). A
    pair seen for the first time is built from every key its runs have; a pair whose group no longer
    pairs its runs (a third run in the group, an arm changed) is dropped and read by the join. ``runs``: the
    distinct run ids of ``view`` when the caller knows them (read from it otherwise)."""
    if table not in (RS, REQ) or not present(con, PAIR_TABLES):
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
                f"WHERE list_contains({lit_list(runs)}, q.run_id))")
    con.execute(f"INSERT OR REPLACE INTO {schema.SUM_KEY_PAIRS.name} {_pair_rows_sql(_pairs_relation(kept), keys)}")


def rebuild_pairs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str],
                  tables: Sequence[schema.Table] = schema.SUMMARY_TABLES) -> list[str]:
    """After :func:`.maintenance.rebuild` (request keys of ``run_ids`` recomputed): rebuild their runs' pairs; returns
    the runs of the pairs built."""
    if not run_ids or not present(con, PAIR_TABLES) or not (
            schema.SUM_REQUEST_KEYS in tables or schema.SUM_KEY_PAIRS in tables):
        return []
    ids = list(run_ids)
    want = _derived_pairs(con, ids)
    have = _kept_pairs(con, ids)
    _drop_pairs(con, sorted(have - want))
    _build_pairs(con, sorted(want))
    return sorted({r for p in want for r in p})


def ensure_pairs(con: duckdb.DuckDBPyConnection, version: int, rebuilt: list[str]) -> list[str]:
    """In :func:`.maintenance.ensure`, a file from before version 5: build every pair its runs make; returns the
    runs rebuilt so far plus those."""
    if version >= 5:
        return rebuilt
    ids = [r for (r,) in con.execute(f"SELECT run_id FROM {RUNS}").fetchall()]
    return sorted(set(rebuilt) | set(rebuild_pairs(con, ids, PAIR_TABLES)))


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
    if not kept or freshness.stale_runs(con, [compact_run, audit_run]):
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


def per_request_sql(con: duckdb.DuckDBPyConnection, compact_run: str, audit_run: str) -> str:
    """The SELECT of :func:`per_request` (parameters ``$c``, ``$a``), unordered: the compact run's
    request-key summaries (one row per key) joined with the audit run's on the key; the join with the
    requests rows was made as they were written."""
    keys = freshness.source(con, schema.SUM_REQUEST_KEYS, [compact_run, audit_run])
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
    return query_df(con, per_request_sql(con, compact_run, audit_run) + " ORDER BY workload, prompt_index, seed",
               {"c": compact_run, "a": audit_run})


def per_request_columns(con: duckdb.DuckDBPyConnection, compact_run: str, audit_run: str,
                        ordered: bool = False) -> tuple[np.ndarray, ...]:
    """:func:`per_request`'s w, a, x, y as float arrays (NaN for NULL): what sampling inference needs,
    without building a frame of keys. ``ordered``: in :func:`per_request`'s order (a sort of every
    request; the exact bootstrap's replicates depend on the order, the totals only to the last bit)."""
    order = "ORDER BY workload, prompt_index, seed" if ordered else ""
    got = con.execute(f"""SELECT coalesce(w::DOUBLE, 'NaN'), coalesce(a::DOUBLE, 'NaN'), coalesce(x::DOUBLE, 'NaN'),
                                 coalesce(y::DOUBLE, 'NaN')
                          FROM ({per_request_sql(con, compact_run, audit_run)}) {order}""",
                      {"c": compact_run, "a": audit_run}).fetchnumpy()
    return tuple(np.asarray(v, dtype=float) for v in got.values())
