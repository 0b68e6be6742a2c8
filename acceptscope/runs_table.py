"""Reading the ``runs`` table, in one place: which columns, which runs, in which order.

Why: runs were read by ``Store.runs``, ``Reader.runs``, the lake's ``LakeStore.runs`` (a copy of the
first) and ad-hoc ``SELECT ... FROM runs`` in the estimators, the figures, the export and the ingest, each
with its own columns and order (oldest first in one, newest first in another, none in the rest). Each
now says here what it wants and gets the same rows in the same order from whichever SQL engine runs the
query: a DuckDB store, a read-only snapshot, Spark over the Parquet lake (plain ``?`` parameters, bare
identifiers checked against the record model, explicit NULL ordering: what both dialects read alike).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import pandas as pd

from acceptscope import schema

# a query function: (sql, positional parameters) -> frame (Store.query_df, Reader.query_df, LakeStore.query_df)
Query = Callable[[str, list], pd.DataFrame]

OLDEST_FIRST = "started_at ASC NULLS LAST, run_id"
NEWEST_FIRST = "started_at DESC NULLS LAST, run_id"


def runs_sql(columns: Sequence[str] | None = None, n_ids: int | None = None, newest_first: bool = False) -> str:
    """The one SELECT over ``runs``: ``columns`` (None: every column; a name the record model lacks raises
    KeyError), restricted to ``n_ids`` bound run ids when given, oldest first (``newest_first``: newest)."""
    if columns is None:
        cols = "*"
    else:
        for c in columns:
            schema.RUNS.column(c)
        cols = ", ".join(columns)  # record-model names: plain identifiers in DuckDB and Spark alike
    where = ""
    if n_ids is not None:
        where = f" WHERE run_id IN ({', '.join('?' * n_ids)})" if n_ids else " WHERE FALSE"
    order = NEWEST_FIRST if newest_first else OLDEST_FIRST
    return f"SELECT {cols} FROM {schema.RUNS.name}{where} ORDER BY {order}"


def read_runs(query: Query, run_ids: Sequence[Any] | None = None, columns: Sequence[str] | None = None, *,
              newest_first: bool = False) -> pd.DataFrame:
    """The rows of ``runs`` (only ``run_ids`` when given) through ``query``, as :func:`runs_sql` states them.
    Whole rows come with every ``role`` set (``schema.with_roles``: a writer may leave it NULL)."""
    ids = None if run_ids is None else [run_ids] if isinstance(run_ids, str) else list(run_ids)
    runs = query(runs_sql(columns, None if ids is None else len(ids), newest_first), ids or [])
    return schema.with_roles(runs) if columns is None else runs
