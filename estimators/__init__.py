"""acceptscope estimators: the counterfactual tail, validation, STS calibration, utilization,
cost model and planner audit, over the telemetry store's tables.

:func:`run_all` is the facade the CLI, the report and the dashboard use: one call per run,
a dict of results, each with ``to_json()`` (``acceptscope.figures.figure_of`` draws them). Steps that cannot run on a
run (no timing, no truth, no SPS table) are reported under ``skipped`` with the reason.

Example::

    >>> import tempfile, os
    >>> from acceptscope.store import Store
    >>> from acceptscope.estimators.synthetic import simulate
    >>> from acceptscope.estimators import run_all
    >>> sim = simulate(n_requests=40, seed=1)
    >>> st = Store(os.path.join(tempfile.mkdtemp(), "t.duckdb"))
    >>> _ = st.append({k: v for k, v in sim.tables.items()})
    >>> res = run_all(st, "syn-cap", n_boot=20)
    >>> sorted(k for k in res if k != "skipped")[:3]
    ['bracket', 'calibration', 'cost']
"""

from __future__ import annotations

# the facade lives in estimators.run, the one pipeline in estimators.pipeline (its accumulator in
# estimators.accumulator, extension estimators in estimators.registry). Importing them here costs
# `import acceptscope.estimators.tail` +1.2 s and nothing after `import acceptscope.report` or `acceptscope.figures`.
from acceptscope.estimators.registry import Chunk, RunInfo, Skip, register, registered
from acceptscope.estimators import trim_regret  # noqa: F401 - registers TrimRegret (estimators.registry)
from acceptscope.estimators.run import STREAM_ROWS, run_all, run_all_runs
from acceptscope.estimators.run_data import (RUN_KEYS, ResultTable, fit_calibration, fit_cost, hazard_compatibility,
                                             hazard_runs, load_run, read_training, sglang_bracket, sts_in_force,
                                             to_jsonable)

__all__ = ["run_all", "run_all_runs", "load_run", "to_jsonable", "sts_in_force", "hazard_compatibility", "hazard_runs",
           "read_training", "RUN_KEYS", "STREAM_ROWS", "sglang_bracket", "fit_calibration", "fit_cost", "ResultTable",
           "register", "registered", "Chunk", "RunInfo", "Skip"]
