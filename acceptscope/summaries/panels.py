"""The dashboard's and report's panel reads: summary rows for fresh runs, the same aggregation over raw rows
for stale ones (:func:`.freshness.source`).
"""

from __future__ import annotations

from typing import Sequence

import duckdb
import pandas as pd

from acceptscope import schema
from acceptscope.summaries import freshness
from acceptscope.summaries.definitions import RELIABILITY_BINS, REQ, RUNS, STEPS, lit_list, query_df


def _avg(s: str, n: str) -> str:
    """SQL for the mean of summed values ``s`` over their summed count ``n`` (NULL where none)."""
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
    stale = freshness.stale_runs(con, run_ids)
    cells = freshness.source(con, schema.SUM_CELLS, run_ids, stale)
    steps = freshness.source(con, schema.SUM_STEPS, run_ids, stale)
    seen = _requests_seen_sql(con, run_ids, stale, workloads)
    return query_df(con, f"""
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
    rids = freshness.source(con, schema.SUM_RUN_RIDS, run_ids, stale)
    if not workloads:
        return f"SELECT run_id, n::BIGINT AS requests_seen FROM {rids} x WHERE scope = 1"
    split = [r for (r,) in con.execute(
        f"SELECT run_id FROM {rids} x GROUP BY run_id "
        "HAVING sum(n) FILTER (WHERE scope = 0) <> sum(n) FILTER (WHERE scope = 1)").fetchall()]
    sql = (f"SELECT run_id, sum(n)::BIGINT AS requests_seen FROM {rids} x{_in_workloads(workloads, 'x')} "
           f"AND scope = 0 AND NOT list_contains({lit_list(split)}, run_id) GROUP BY run_id")
    if split:
        reqs = freshness.source(con, schema.SUM_REQUESTS, split, stale)
        sql += (f" UNION ALL SELECT run_id, count(DISTINCT rid) AS requests_seen FROM {reqs} r"
                f"{_in_workloads(workloads, 'r')} GROUP BY run_id")
    return sql


def window_distribution(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> pd.DataFrame:
    """Blocks per (run, workload, window)."""
    cells = freshness.source(con, schema.SUM_CELLS, run_ids)
    return query_df(con, f"""
        SELECT c.run_id, r.arm, c.workload, CASE WHEN c."window" >= 0 THEN c."window" END AS "window",
               sum(c.n)::BIGINT AS blocks
        FROM {cells} c JOIN {RUNS} r USING (run_id)
        GROUP BY ALL ORDER BY c.run_id, c.workload, "window" NULLS LAST""")


def utilization_by_workload(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> pd.DataFrame:
    """Realized accept length against the observed ceiling per (run, workload)."""
    cells = freshness.source(con, schema.SUM_CELLS, run_ids)
    return query_df(con, f"""
        SELECT c.run_id, r.arm, c.workload, sum(n)::BIGINT AS blocks,
               {_avg('sum_acc_len', 'n_acc_len')} AS mean_acc_len,
               {_avg('sum_ceil1', 'n_ceil')} AS ceiling_accept_len,
               sum(sum_acc_len_ceil) / nullif(sum(sum_ceil1) FILTER (WHERE n_ceil > 0), 0) AS utilization
        FROM {cells} c JOIN {RUNS} r USING (run_id)
        GROUP BY ALL ORDER BY c.run_id, c.workload""")


def regime_by_workload(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str]) -> pd.DataFrame:
    """Per (run, workload): window shares, accept length, utilization (``Reader.regime_by_workload``)."""
    cells = freshness.source(con, schema.SUM_CELLS, run_ids)
    return query_df(con, f"""
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
    pos = freshness.source(con, schema.SUM_POSITIONS, run_ids)
    return query_df(con, f"""
        SELECT p.run_id, r.arm, p.k, sum(p.n)::BIGINT AS n, sum(sum_s) / nullif(sum(n_s), 0) AS mean_survival,
               sum(sum_emp) / nullif(sum(n_emp), 0) AS empirical_survival,
               sum(n_reached)::BIGINT AS reached_in_window,
               sum(sum_acc_given) / nullif(sum(n_acc_given), 0) AS accepted_given_verified
        FROM {pos} p JOIN {RUNS} r USING (run_id){_in_workloads(workloads, "p")}
        GROUP BY ALL ORDER BY p.run_id, p.k""")


def reliability_bins(con: duckdb.DuckDBPyConnection, run_ids: Sequence[str], n_bins: int = RELIABILITY_BINS,
                     workloads: Sequence[str] | None = None) -> pd.DataFrame:
    """Per (run, position, variant, bin): mean predicted confidence, observed rate, hits, n."""
    rel = freshness.source(con, schema.SUM_RELIABILITY, run_ids, n_bins=n_bins)
    return query_df(con, f"""
        SELECT run_id, position, variant, bin, sum(sum_p) / sum(n) AS mean_pred, sum(hits) / sum(n) AS rate,
               sum(hits)::BIGINT AS hits, sum(n)::BIGINT AS n
        FROM {rel} x{_in_workloads(workloads, "x")} GROUP BY ALL ORDER BY run_id, position, variant, bin""")


def throughput_curve(con: duckdb.DuckDBPyConnection, audit_group: str) -> pd.DataFrame:
    """Decode throughput per (workload, batch, arm) of ``audit_group``'s runs on the virtual clock
    (``Reader.throughput_curve``); step totals come from the summaries."""
    ids = [r[0] for r in con.execute(f"SELECT run_id FROM {RUNS} WHERE audit_group = ?", [audit_group]).fetchall()]
    steps = freshness.source(con, schema.SUM_STEPS, ids)
    return query_df(con, f"""
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


def run_sizes(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every run's size: ``n_requests`` and ``n_blocks`` (request-steps), 0 for a run without any. The runs'
    own rows are ``acceptscope.runs_table``'s (``Reader.runs`` joins the two)."""
    ids = [r[0] for r in con.execute(f"SELECT run_id FROM {RUNS}").fetchall()]
    cells = freshness.source(con, schema.SUM_CELLS, ids)
    return query_df(con, f"""
        SELECT r.run_id, coalesce(q.n_requests, 0) AS n_requests, coalesce(s.n_blocks, 0) AS n_blocks
        FROM {RUNS} r
        LEFT JOIN (SELECT run_id, count(*) AS n_requests FROM {REQ} GROUP BY run_id) q USING (run_id)
        LEFT JOIN (SELECT run_id, sum(n)::BIGINT AS n_blocks FROM {cells} c GROUP BY run_id) s USING (run_id)""")


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
        stale = freshness.stale_runs(con, ids)  # once for both summaries read here
        n = dict(con.execute(f"SELECT run_id, n FROM {freshness.source(con, schema.SUM_STEPS, ids, stale)} s").fetchall())
        raw_ids = [r for r in ids if int(n.get(r, 0)) <= int(max_rows_per_run)]
        long_ = [r for r in ids if r not in raw_ids]
        if long_ and not means:
            every = {r: -(-int(n[r]) // int(max_rows_per_run)) for r in long_}
        elif long_:
            bins = freshness.source(con, schema.SUM_STEP_BINS, long_, stale)
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
            parts.append(query_df(con, sql.format(modeled=", modeled_step_ms"), params))
        except duckdb.BinderException:  # a file from before the virtual clock (no modeled_step_ms column)
            parts.append(query_df(con, sql.format(modeled=""), params))
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
            sel.append(f"SELECT {cols(True)} FROM {bins} b WHERE list_contains({lit_list(ones)}, b.run_id)")
        if many:
            k = "(" + " UNION ALL ".join(f"SELECT '{r.replace(chr(39), chr(39) * 2)}' AS run_id, {int(g)} AS g"
                                         for r, g in many.items()) + ")"
            sel.append(f"SELECT {cols(False)} FROM {bins} b JOIN {k} k USING (run_id) "
                       "GROUP BY b.run_id, rank, epoch, bin // k.g")
        parts.append(query_df(con, " UNION ALL ".join(sel) + " ORDER BY run_id, rank, epoch, forward_ct"))
    out = pd.concat(parts, ignore_index=True) if len(parts) > 1 else parts[0]
    return out.sort_values(["run_id", "rank", "epoch", "forward_ct"], kind="stable", ignore_index=True) \
        if len(parts) > 1 else out
