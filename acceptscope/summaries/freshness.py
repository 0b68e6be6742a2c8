"""Which runs' summaries count exactly the stored rows, and the relation that answers a read either way.

Why: rows appended past :func:`.maintenance.add` (an older writer, a raw INSERT) or a rebuild cut short leave
a run's summaries stale; :func:`source` then aggregates that run's raw rows with the same SQL
(:func:`.definitions.agg_sql`), so a panel answers the same either way.
"""

from __future__ import annotations

import json
from typing import Sequence

import duckdb

from acceptscope import schema
from acceptscope.summaries.definitions import (NEW_IN_3, NEW_IN_4, REQ, RELIABILITY_BINS, RS, RUNS, STEPS,
                                               SUMMARIES_OF, V2_TABLES, agg_sql, ident, lit_list, present,
                                               table_names)

# store_meta key holding the runs (a JSON list) whose summaries a rebuild is rewriting: set before the
# first table is touched, cleared with the schema version in the last step; stale_runs() counts them stale
REBUILDING = "rebuilding_runs"


def _counts(con: duckdb.DuckDBPyConnection, sql: str, params: list) -> dict[str, int]:
    return {r[0]: int(r[1]) for r in con.execute(sql, params).fetchall()}


def stale_runs(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str] | None = None) -> set[str]:
    """Runs (of ``run_ids``, default all) whose summaries do not count exactly the stored rows.

    A row count per run (one column scan, pruned by zone maps) against the summaries' own counts:
    rows appended past :func:`.maintenance.add` (an older writer, a raw INSERT) make the run stale.
    """
    # fast path. Nothing deletes rows, so equal totals mean every run is counted exactly,
    # unless a run_id was rewritten in place: then the summaries hold an id the runs table no longer
    # has, or a requested run has rows but no summary (both checked; the full count settles it).
    ids = [] if run_ids is None else list(run_ids)
    cells, steps = schema.SUM_CELLS.name, schema.SUM_STEPS.name
    keys = schema.SUM_REQUEST_KEYS.name
    have = table_names(con)
    marked = _rebuilding(con, have)  # an unfinished rebuild's runs (ensure): stale whatever the counts say
    if run_ids is not None:
        marked &= set(ids)
    have_keys = keys in have  # version 3: requests rows are counted too
    v2_present = all(t.name in have for t in V2_TABLES)
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


def source(con: duckdb.DuckDBPyConnection, t: schema.Table, run_ids: Sequence[str],
           stale: set[str] | None = None, n_bins: int = RELIABILITY_BINS) -> str:
    """A relation with summary ``t``'s columns for ``run_ids`` (literal ids, quoted): the summary rows of
    fresh runs, the same aggregation (:func:`.definitions.agg_sql`) over the raw rows of stale ones."""
    ids = list(dict.fromkeys(str(r) for r in run_ids))
    if stale is None:
        stale = stale_runs(con, ids) if ids else set()
    fresh = [r for r in ids if r not in stale] if n_bins == RELIABILITY_BINS else []
    if t in NEW_IN_3 + NEW_IN_4 and not present(con, (t,)):  # an older file opened read-only
        fresh = []
    raw = [r for r in ids if r not in fresh]
    cols = ", ".join(ident(c) for c in t.names)

    parts = []
    if fresh:
        parts.append(f"SELECT {cols} FROM {ident(t.name)} WHERE run_id IN (SELECT unnest({lit_list(fresh)}))")
    if raw or not fresh:
        base = next(b for b, ts in SUMMARIES_OF.items() if t in ts)
        src = f"(SELECT * FROM {ident(base)} WHERE run_id IN (SELECT unnest({lit_list(raw)})))"
        parts.append(f"SELECT * FROM ({agg_sql(t, src, n_bins)}) AS x({cols})")
    return "(" + " UNION ALL ".join(parts) + ")"
