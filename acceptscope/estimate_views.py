"""Adapter between the ``estimators`` package and the surfaces.

Why this module exists: the report, the dashboard and the notebook all show the
estimators' own plotly figures and numbers. This module runs
``estimators.run_all(store, run_id)`` (each result has ``to_json()`` and is drawn by
:func:`acceptscope.figures.figure_of`; steps that cannot run are listed under ``skipped`` with the reason)
and the validation harness (``estimators.validation.validate`` on a run that
recorded the ceiling), and normalises each to ``EstimateView``: figures, a flat
summary, small tables, and an error or skip reason. An estimator that fails is
shown as failed with its error, never as a made-up number.
"""

from __future__ import annotations

import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from acceptscope import estimators, glossary
from acceptscope import schema
from acceptscope.figures import figure_of
from acceptscope.figures.estimates import one_based_positions
from acceptscope.reader import Reader
from acceptscope.store import Store
from acceptscope.estimators.calibration import CalibrationResult
from acceptscope.estimators.chunks import read_sample
from acceptscope.estimators.validation import validate

MAX_TABLE_ROWS = 40
VALIDATION_ROWS = 1 << 17  # the validation harness runs on at most this many request-steps of a run: its in-memory
# estimators peak at ~7 GB per million rows (2^19: 3.8 GB, the report's whole peak; 2^18: 2.1 GB; bench/report.py)


@dataclass
class EstimateView:
    name: str
    figures: list = field(default_factory=list)  # plotly figures
    summary: dict = field(default_factory=dict)  # flat, JSON-able headline numbers
    tables: dict = field(default_factory=dict)  # name -> small DataFrame (lists of records in to_json)
    error: str | None = None  # failed: the exception
    skipped: str | None = None  # not applicable to this run: the estimator's reason
    raw: Any = None


def _scalar(v: Any) -> Any:
    if isinstance(v, (bool, np.bool_)):
        return bool(v)
    if isinstance(v, (int, np.integer)):
        return int(v)
    if isinstance(v, (float, np.floating)):
        f = float(v)
        return None if math.isnan(f) else f
    if isinstance(v, str) or v is None:
        return v
    return _NOT_SCALAR


_NOT_SCALAR = object()


def flatten(j: dict) -> tuple[dict, dict]:
    """Split a ``to_json()`` dict into flat scalars (``a.b`` keys, two levels) and record tables."""
    flat: dict = {}
    tables: dict = {}

    def walk(prefix: str, obj: Any, depth: int) -> None:
        if isinstance(obj, dict):
            if depth > 2:
                return
            for k, v in obj.items():
                walk(f"{prefix}.{k}" if prefix else str(k), v, depth + 1)
        elif isinstance(obj, list):
            if obj and all(isinstance(r, dict) for r in obj):
                tables[prefix] = pd.DataFrame(obj).head(MAX_TABLE_ROWS)
            elif obj and all(isinstance(x, str) for x in obj) and prefix.endswith("notes"):
                flat[prefix] = "; ".join(obj)
        else:
            s = _scalar(obj)
            if s is not _NOT_SCALAR and s is not None:
                flat[prefix] = s

    walk("", j, 0)
    return flat, tables


# summary keys whose name reads as another glossary figure, renamed where a surface shows them (the tail's
# "mean_accept_length" is the mean ceiling + 1: the ceiling in tokens per block, not the realized accept length)
RENAMED = {("tail", "summary.mean_accept_length"): "summary.mean_ceiling_tokens_per_block"}


def view(name: str, result: Any) -> EstimateView:
    """Normalise one estimator result."""
    if isinstance(result, Exception):
        return EstimateView(name, error=f"{type(result).__name__}: {result}")
    v = EstimateView(name, raw=result)
    try:
        j = result.to_json() if hasattr(result, "to_json") else {}
        v.summary, v.tables = flatten(j if isinstance(j, dict) else {})
        v.summary = {RENAMED.get((name, k), k): x for k, x in v.summary.items()}
        if isinstance(result, CalibrationResult):  # positions 1..gamma on every surface
            v.tables = {k: one_based_positions(t) for k, t in v.tables.items()}
    except Exception as e:
        v.error = f"to_json failed: {type(e).__name__}: {e}"
    try:
        fig = figure_of(result)
        if fig is not None:
            v.figures = [fig] if not isinstance(fig, (list, tuple)) else [f for f in fig if f is not None]
    except Exception as e:
        v.error = v.error or f"figure failed: {type(e).__name__}: {e}"
    return v


def available() -> tuple[bool, str]:
    """Whether ``estimators.run_all`` can be called, and why not."""
    if not hasattr(estimators, "run_all"):
        return False, "the estimators package has no run_all() in this install"
    return True, ""


def run_estimates(db: str | Path, run_id: str, *, n_boot: int = 200) -> tuple[dict[str, EstimateView], str | None]:
    """Every estimator on one run. Returns (views by name, reason if none could run)."""
    ok, why = available()
    if not ok:
        return {}, why
    try:
        results = estimators.run_all(Store(db, read_only=True), run_id, n_boot=n_boot)  # (reads never create tables)
    except Exception as e:
        return {}, f"estimators.run_all failed: {type(e).__name__}: {e}"
    views: dict[str, EstimateView] = {}
    for name, reason in (results.pop("skipped", None) or {}).items():
        views[name] = EstimateView(name, skipped=str(reason))
    for name, res in results.items():
        views[name] = view(name, res)
    return views, None


def figures(views: dict[str, EstimateView]) -> dict[str, glossary.Value]:
    """The glossary's figures of one run from its views (:func:`acceptscope.glossary.run_figures` on the
    results ``run_estimates`` normalised, in ``to_jsonable`` form: what ``estimate --json`` prints)."""
    raw = {k: v.raw for k, v in views.items() if k in glossary.PIPELINE_KEYS and v.raw is not None}
    return glossary.run_figures(estimators.to_jsonable(raw)) if raw else {}


STEP_KEY = ["run_id", "rank", "epoch", "forward_ct"]


def _steps_of(con: Any, run_id: str, rs: pd.DataFrame) -> pd.DataFrame:
    """The steps the sampled request-steps were verified in, with the one column validation reads of
    them (``bs``: the batch band): the run's whole steps table grows with the run, the sample does not."""
    keys = rs[STEP_KEY[1:]].drop_duplicates()
    con.register("_sample_step_keys", keys)
    try:
        return con.execute(f'''SELECT s.run_id, s.rank, s.epoch, s.forward_ct, s.bs FROM "{schema.STEPS.name}" s
                               SEMI JOIN _sample_step_keys k USING (rank, epoch, forward_ct)
                               WHERE s.run_id = ?''', [run_id]).df()
    finally:
        con.unregister("_sample_step_keys")


def run_validation(db: str | Path, truth_run: str, *, n_boot: int = 100, seed: int = 0) -> EstimateView:
    """Hide the ceiling of a cap-accept/static run, estimate as compact would, compare with the truth."""
    r = Reader(db)
    # a big run is validated on a stable hash-sample of whole requests (bounded memory)
    n_all = int(r.df(f'SELECT count(*) AS n FROM "{schema.REQUEST_STEPS.name}" WHERE run_id = ?', [truth_run]).n.iloc[0])
    rs = read_sample(Store(db, read_only=True), [truth_run], VALIDATION_ROWS, seed=seed,
                     columns=schema.REQUEST_STEPS.names).to_pandas()
    steps = r.summary(_steps_of, truth_run, rs)
    try:
        v = view("validation", validate(rs, steps=steps, n_boot=n_boot, seed=seed))
        if len(rs) < n_all:
            v.summary["sampled_request_steps"] = f"{len(rs)} of {n_all} (stable hash-sample of whole requests)"
        return v
    except Exception as e:
        return EstimateView("validation", error=f"{type(e).__name__}: {e}",
                            raw=traceback.format_exc(limit=2))
