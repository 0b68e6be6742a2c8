"""What each summary table holds: the SQL that builds its rows from raw rows, which raw table feeds
which summaries, and the small SQL helpers the other summary modules share.

Why a module of its own: the same definition answers on an append (:mod:`.maintenance`), on a rebuild, and
for a stale run's panel read (:func:`.freshness.source`), so every path counts alike.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import duckdb
import pandas as pd

from acceptscope import schema

RELIABILITY_BINS = 15  # equal-width bins kept by sum_reliability; other bin counts read the raw table
RS, STEPS, REQ, RUNS = (schema.REQUEST_STEPS.name, schema.STEPS.name, schema.REQUESTS.name, schema.RUNS.name)
Step = Callable[[Callable[[], Any]], Any]  # runs one step of a rebuild: inline, or in a transaction of its own


def inline_step(step: Callable[[], Any]) -> Any:
    """A rebuild step in the caller's transaction (the default :data:`Step`)."""
    return step()


_COUNTS = """count(*) AS n,
  coalesce(sum(acc_len), 0)::BIGINT AS sum_acc_len, count(acc_len) AS n_acc_len,
  coalesce(sum("window"), 0)::BIGINT AS sum_window, count("window") AS n_window,
  coalesce(sum(correct_drafts), 0)::BIGINT AS sum_correct, count(correct_drafts) AS n_correct,
  coalesce(sum(ceiling::BIGINT + 1), 0)::BIGINT AS sum_ceil1, count(ceiling) AS n_ceil,
  coalesce(sum(acc_len) FILTER (WHERE ceiling IS NOT NULL), 0)::BIGINT AS sum_acc_len_ceil,
  coalesce(sum(cap_trim), 0)::BIGINT AS sum_cap_trim, count(cap_trim) AS n_cap_trim"""


def agg_sql(t: schema.Table, src: str, n_bins: int = RELIABILITY_BINS, max_len: int | None = None) -> str:
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
        return keys_sql(src, per_rid, "LEFT", "count(*)")
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


KEY_SUMS = [c.name for c in schema.SUM_REQUEST_KEYS.columns[6:]]  # n, sum_acc_len, ..., sum_x, n_x
_PER_RID = _COUNTS + ", coalesce(sum(1 + list_sum(survival)), 0)::DOUBLE AS sum_x, count(1 + list_sum(survival)) AS n_x"


def keys_sql(req: str, per_rid: str, join: str, n_requests: str) -> str:
    """sum_request_keys rows: requests rows ``req`` joined with per-(run, rid) block sums ``per_rid``
    (columns named as the summary's), summed per key; NULL key parts become sentinels plus a mask."""
    sums = ", ".join(f"coalesce(sum(r.{c}), 0)::{'DOUBLE' if c == 'sum_x' else 'BIGINT'}" for c in KEY_SUMS)
    return f"""
        SELECT q.run_id, coalesce(q.workload, ''), coalesce(q.prompt_index, 0)::INTEGER, coalesce(q.seed, 0)::BIGINT,
               ((q.workload IS NULL)::INT + 2 * (q.prompt_index IS NULL)::INT + 4 * (q.seed IS NULL)::INT),
               {n_requests}, {sums}
        FROM {req} q {join} JOIN {per_rid} r ON r.run_id = q.run_id AND r.rid = q.rid
        GROUP BY ALL"""


_INT_BINS = ("bs", "budget", "num_verify", "executed")


# the summaries each record-model table feeds (requests after request_steps: a rebuild reads sum_requests' base)
SUMMARIES_OF = {schema.REQUEST_STEPS.name: (schema.SUM_CELLS, schema.SUM_REQUESTS, schema.SUM_POSITIONS,
                                            schema.SUM_RELIABILITY, schema.SUM_RUN_RIDS),
                schema.STEPS.name: (schema.SUM_STEPS, schema.SUM_STEP_BINS),
                schema.REQUESTS.name: (schema.SUM_REQUEST_KEYS,)}
# the summary tables each schema version added (an older file gets them on its first read-write open)
NEW_IN_3 = (schema.SUM_STEP_BINS, schema.SUM_REQUEST_KEYS)
NEW_IN_4 = (schema.SUM_RUN_RIDS,)
PAIR_TABLES = (schema.SUM_KEY_PAIRS, schema.SUM_PAIRS)  # version 5: the audit pairs (.pairs)
PAGE_TABLES = (schema.SUM_REQUEST_PAGE, schema.SUM_PAGE_RUNS)  # version 6: the request pages (.pages)
V2_TABLES = tuple(t for t in schema.SUMMARY_TABLES
                  if t not in NEW_IN_3 + NEW_IN_4 + PAIR_TABLES + PAGE_TABLES)  # what a version-2 file has


SUMMARISED = frozenset(SUMMARIES_OF)  # record-model tables whose appends update summaries


def ident(name: str) -> str:
    """``name`` as a quoted SQL identifier."""
    return '"' + name.replace('"', '""') + '"'


def table_names(con: duckdb.DuckDBPyConnection) -> set[str]:
    """The tables of the connection's current database."""
    return {r[0] for r in con.execute("SELECT table_name FROM duckdb_tables() WHERE database_name = current_database()").fetchall()}


def present(con: duckdb.DuckDBPyConnection, tables: Sequence[schema.Table] = V2_TABLES) -> bool:
    """Whether every summary table of ``tables`` (default: those of schema version 2) exists in this file.

    A version-2 file opened read-only lacks only the step bins and request keys: its other summaries
    still answer, and those two come from the raw tables (:func:`.freshness.source`) until a read-write open
    adds them."""
    have = table_names(con)
    return all(t.name in have for t in tables)


def has_rows(con: duckdb.DuckDBPyConnection, table: str, run_ids: Sequence[str]) -> bool:
    """Whether ``table`` holds a row of any of ``run_ids``."""
    return bool(run_ids) and con.execute(
        f"SELECT EXISTS (SELECT 1 FROM {ident(table)} WHERE run_id IN (SELECT UNNEST(?)))", [list(run_ids)]).fetchall()[0][0]


def lit_list(xs: Sequence[str]) -> str:
    """``xs`` as a VARCHAR[] literal (literals, not parameters: DuckDB prunes scans on them by zone maps)."""
    return "[" + ", ".join("'" + str(x).replace("'", "''") + "'" for x in xs) + "]::VARCHAR[]"


def query_df(con: duckdb.DuckDBPyConnection, sql: str, params: Sequence | dict | None = None) -> pd.DataFrame:
    """The rows of ``sql`` as a frame (``params``: positional, or named when a dict)."""
    return con.execute(sql, params if isinstance(params, dict) else list(params or [])).df()
