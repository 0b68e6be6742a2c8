"""Per-run summaries the store keeps as it appends, and the panel queries that read them.

Why this package exists: with two 5M-row runs selected, panel queries that aggregate
``request_steps`` took 0.3-13 s and the dashboard process 7.7 GB. The store instead keeps
small summary tables (``schema.SUMMARY_TABLES``: sums per run x workload x window, per
request, per draft position, per calibration bin, per run's steps, per 64 steps, per request
key: ``(workload, prompt_index, seed)``, the audit arms' pairing; distinct requests per run and
workload) in the same transaction as every append (:func:`add`, called by ``Store.write_arrow``:
ingest, the engine's writer and live capture all go through it), counting only rows actually
inserted. A panel reads those (kilobytes) instead of millions of rows.

Stale or missing summaries (a file written before schema version 2, or rows appended by
something that bypassed ``Store.write_arrow``) are detected per run by comparing row counts
(:func:`stale_runs`); such runs are aggregated from the raw tables by DuckDB with the same
SQL (:func:`agg_sql`), so every query answers the same either way. A read-write open
(:func:`ensure`) rebuilds them once. Nothing deletes rows, and the only in-place UPDATE the store
makes (the temperature fill, :mod:`acceptscope.domain.temperature`) touches a column no summary
reads; an UPDATE of a summarised column from outside would not be noticed (row counts are unchanged).

One module per concern:

- :mod:`.definitions`: what each summary holds (the SQL building its rows) and the shared SQL helpers;
- :mod:`.freshness`: which runs' summaries are exact, and the relation that answers a read either way;
- :mod:`.maintenance`: folding appends in, rebuilding stale runs, the schema version;
- :mod:`.panels`: the dashboard's and report's panel reads;
- :mod:`.pairs`: the audit pairs (``sum_key_pairs``) and the per-request reads of a pair;
- :mod:`.pages`: the drill-down's sorted request pages and their reads.

All functions take an open DuckDB connection; the caller owns the locking discipline
(``acceptscope.store``). This package imports nothing from the store (no import cycle).
The names below are the package's public API; a test or bench that replaces a function
replaces it in the module that owns it (``freshness.stale_runs``, ``pages.rebuild_pages``),
since the other modules call it there.
"""

from __future__ import annotations

from acceptscope.summaries.definitions import (PAGE_TABLES, PAIR_TABLES, RELIABILITY_BINS, SUMMARISED,
                                               agg_sql, present)
from acceptscope.summaries.freshness import REBUILDING, stale_runs
from acceptscope.summaries.maintenance import (REBUILD_MEMORY, add, check_version, ensure, max_list_len, rebuild,
                                               record_version, schema_version)
from acceptscope.summaries.pages import (PAGE_TAIL_MIN, PAGE_TAIL_SHARE, page_limit, page_of_requests, page_tails,
                                         request_count, requests, sort_pages)
from acceptscope.summaries.pairs import (MAX_PAIRS_PER_GROUP, pair_totals, per_request, per_request_columns,
                                         per_request_sql)
from acceptscope.summaries.panels import (position_acceptance, regime_by_workload, reliability_bins, run_sizes,
                                          run_summary, step_costs, throughput_curve, utilization_by_workload,
                                          window_distribution)

__all__ = [
    "MAX_PAIRS_PER_GROUP", "PAGE_TABLES", "PAGE_TAIL_MIN", "PAGE_TAIL_SHARE", "PAIR_TABLES", "REBUILDING",
    "REBUILD_MEMORY", "RELIABILITY_BINS", "SUMMARISED", "add", "agg_sql", "check_version", "ensure", "max_list_len",
    "page_limit", "page_of_requests", "page_tails", "pair_totals", "per_request", "per_request_columns",
    "per_request_sql", "position_acceptance", "present", "rebuild", "record_version", "regime_by_workload",
    "reliability_bins", "request_count", "requests", "run_sizes", "run_summary", "schema_version", "sort_pages",
    "stale_runs", "step_costs", "throughput_curve", "utilization_by_workload", "window_distribution",
]
