"""THE reader: read-only queries the surfaces (report, audit, dashboard, notebook) share.

Why this module exists: the dashboard reads a DuckDB file that a run may be
writing at the same moment. DuckDB gives the file lock to one read-write
process, so every query here opens a short ``read_only`` connection, runs, and
closes it again; nothing holds the lock between calls. All filters are bound
parameters; table and column names come from :mod:`acceptscope.schema`.

Same read API as :class:`acceptscope.store.Store` (``query_arrow``, ``query_df``; a ``Reader`` also
accepts a ``Store``), and the same path: results come through Arrow (``fetch_arrow(...).to_pandas()``),
not DuckDB's slower ``.df()``. Unlike ``Store(read_only=True)`` it opens a file whose tables are not
created yet (a run starting up), which the dashboard's change probe needs.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import duckdb
import pandas as pd
import pyarrow as pa

from acceptscope import schema, summaries
from acceptscope.runs_table import read_runs
from acceptscope.store import Store, fetch_arrow
from acceptscope.store_lock import open_read_only

RS = schema.REQUEST_STEPS.name
REQ = schema.REQUESTS.name
STEPS = schema.STEPS.name
RUNS = schema.RUNS.name

# tables whose row counts make up the cheap change probe
_PROBE_TABLES = (schema.RUNS, schema.STEPS, schema.REQUEST_STEPS, schema.REQUESTS, schema.STS_TABLES,
                 schema.REJECTS, schema.GAPS)


def _decimals_as_float(t: pa.Table) -> pa.Table:
    """``sum()`` of an integer column is a HUGEINT, which Arrow carries as decimal128: pandas would get
    Python ``Decimal`` objects that do not mix with floats. Cast them to float64, as ``.df()`` did."""
    idx = [i for i, f in enumerate(t.schema) if pa.types.is_decimal(f.type)]
    for i in idx:
        t = t.set_column(i, t.schema.field(i).name, t.column(i).cast(pa.float64()))
    return t


def select_runs(reader: Any, run_ids: Sequence[str] | None = None, audit_group: str | None = None,
                roles: Sequence[str] | None = None) -> list[str]:
    """Explicit runs, else one audit group's runs, else the newest audit group, else every run; ``roles``
    (``schema.ROLES``) keeps only the runs playing one of them."""
    try:
        runs = reader.runs()
    except duckdb.CatalogException:
        raise ValueError(f"{reader.path}: not an acceptscope telemetry database (it has no runs table)") from None
    if roles:
        unknown = sorted(set(roles) - set(schema.ROLES))
        if unknown:
            raise KeyError(f"unknown role(s): {', '.join(unknown)}; known: {', '.join(schema.ROLES)}")
        runs = runs[runs["role"].isin(list(roles))]
    if runs.empty:
        return []
    if run_ids:
        unknown = sorted(set(run_ids) - set(runs["run_id"]))
        if unknown:
            raise KeyError(f"unknown run id(s): {', '.join(unknown)}; known: {', '.join(runs['run_id'])}")
        return list(run_ids)
    if audit_group:
        sel = runs[runs["audit_group"] == audit_group]
        if sel.empty:
            raise KeyError(f"no runs with audit_group {audit_group!r}")
        return list(sel["run_id"])
    grouped = runs.dropna(subset=["audit_group"])
    # an audit's STS calibration split and throughput-curve runs sit in sub-groups "<group>/..."; the newest
    # audit is the newest top-level group
    top = grouped[~grouped["audit_group"].str.contains("/", regex=False)]
    grouped = top if len(top) else grouped
    if len(grouped):  # runs() is newest first
        return list(runs[runs["audit_group"] == grouped["audit_group"].iloc[0]]["run_id"])
    return list(runs["run_id"])


def runs_with_sizes(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
    """Every run (``runs_table.read_runs``, newest first) with its size (``summaries.run_sizes``)."""
    runs = read_runs(lambda sql, params: con.execute(sql, params).df(), newest_first=True)
    return runs.merge(summaries.run_sizes(con), on="run_id", how="left")


class Reader:
    """Short read-only queries against one telemetry file (never keeps a connection open)."""

    def __init__(self, path: str | Path | Store, *, lock_timeout_s: float = 10.0):
        self.path = Path(path.path if isinstance(path, Store) else path)
        if not self.path.exists():
            raise FileNotFoundError(f"{self.path}: no such database file")
        self.lock_timeout_s = lock_timeout_s

    def query_arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        """One query on a short read-only connection, as Arrow (DuckDB's HUGEINT/DECIMAL sums as float64)."""
        with open_read_only(self.path, self.lock_timeout_s) as con:
            return _decimals_as_float(fetch_arrow(con, sql, list(params or [])))

    def query_df(self, sql: str, params: Sequence[Any] | None = None) -> pd.DataFrame:
        """``query_arrow`` as pandas (list columns become numpy arrays, as in ``Store.read_table``)."""
        return self.query_arrow(sql, params).to_pandas()

    df = query_df  # the short name the query methods below use

    def summary(self, fn: Any, *args: Any) -> Any:
        """``fn(con, *args)`` of :mod:`acceptscope.summaries` on one short read-only connection."""
        with open_read_only(self.path, self.lock_timeout_s) as con:
            return fn(con, *args)

    # -- change probe -----------------------------------------------------
    def data_version(self) -> tuple[int, ...]:
        """Row counts of the tables a run grows; changes whenever a flush commits."""
        sql = " UNION ALL ".join(f'SELECT count(*) AS n FROM "{t.name}"' for t in _PROBE_TABLES)
        try:
            return tuple(int(x) for x in self.df(sql)["n"])
        except Exception:  # tables not created yet (file being initialised)
            return (-1,)

    # -- runs -------------------------------------------------------------
    def runs(self) -> pd.DataFrame:
        """All runs with their size and role, newest first."""
        return self.summary(runs_with_sizes)

    def run_summary(self, run_ids: Sequence[str], workloads: Sequence[str] | None = None) -> pd.DataFrame:
        """Headline numbers per run: accept length, window, ceiling, utilization, throughput.

        ``ceiling_accept_len`` = mean(ceiling + 1) over blocks where the ceiling is observed
        (cap-accept, static); ``utilization`` = Σ acc_len / Σ (ceiling + 1) over those blocks.
        In compact the ceiling is NULL and utilization needs an estimator. ``workloads`` restricts the
        block figures; steps and wall time stay whole-run (a step batches every workload).
        """
        return self.summary(summaries.run_summary, list(run_ids), workloads)

    # -- distributions ----------------------------------------------------
    def window_distribution(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """Count of blocks per (run, workload, window): what the scheduler chose to verify."""
        return self.summary(summaries.window_distribution, list(run_ids))

    def position_acceptance(self, run_ids: Sequence[str], workloads: Sequence[str] | None = None) -> pd.DataFrame:
        """Per position k (1-based): mean predicted survival vs empirical P(ceiling >= k).

        The empirical side needs the uncapped ceiling, so it is NULL for compact runs;
        the in-window side (``reached``/``accepted_in_window``) is observed in every arm.
        """
        return self.summary(summaries.position_acceptance, list(run_ids), workloads)

    def utilization_by_workload(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """Realized accept length against the observed ceiling per (run, workload)."""
        return self.summary(summaries.utilization_by_workload, list(run_ids))

    def step_costs(self, run_ids: Sequence[str], max_rows_per_run: int | None = None,
                   means: bool = True) -> pd.DataFrame:
        """Per-step cost telemetry (what the cost model predicts vs what the step took); with
        ``max_rows_per_run`` a longer run comes as means over stretches of consecutive steps from the
        step bins (``steps``: how many each row averages; a plot cannot show 200k points anyway);
        ``means=False``: evenly spaced real steps instead (per-step error statistics)."""
        return self.summary(summaries.step_costs, list(run_ids), max_rows_per_run, means)

    # -- drill-down -------------------------------------------------------
    def requests(self, run_id: str, limit: int = 5000, offset: int = 0) -> pd.DataFrame:
        """One page of a run's requests with their block statistics."""
        return self.summary(summaries.requests, run_id, limit, offset)

    def request_count(self, run_id: str) -> int:
        """How many requests a run has (pages of :meth:`requests`)."""
        return self.summary(summaries.request_count, run_id)

    def request_steps(self, run_id: str, rid: str) -> pd.DataFrame:
        """Every block of one request, in order: window, confidences, accepted, ceiling."""
        return self.df(
            f"""
            SELECT step_index, forward_ct, rank, prefix_len, verify_len, "window", correct_drafts, acc_len,
                   cap_trim, ceiling, confidence, survival, confidence_logit, committed_tokens, finished
            FROM "{RS}" WHERE run_id = ? AND rid = ? ORDER BY epoch, forward_ct
            """,
            [run_id, rid],
        )

    def data_quality(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """Rejected records and stream gaps per run (coverage first)."""
        return self.df(
            f"""
            SELECT r.run_id,
                   (SELECT count(*) FROM "{schema.REJECTS.name}" x WHERE x.run_id = r.run_id) AS rejects,
                   (SELECT count(*) FROM "{schema.GAPS.name}" g WHERE g.run_id = r.run_id) AS gaps
            FROM "{RUNS}" r WHERE r.run_id IN (SELECT unnest(?)) ORDER BY r.run_id
            """,
            [list(run_ids)],
        )

    # -- the seeds' regime (windows that contract with difficulty; compact vs static) -------------
    def regime_by_workload(self, run_ids: Sequence[str]) -> pd.DataFrame:
        """Per (run, workload): mean window, shares of blocks at the full window / at <= 3 / trimmed,
        utilization against the ceiling (where observed) and the calibrated survival's mean."""
        return self.summary(summaries.regime_by_workload, list(run_ids))

    def throughput_curve(self, audit_group: str) -> pd.DataFrame:
        """Decode throughput per (workload, batch, arm) of the runs in ``audit_group`` on the virtual clock:
        tokens after each request's prefill token / the sum of modeled step times (runs without a
        modeled clock are left out)."""
        return self.summary(summaries.throughput_curve, audit_group)
