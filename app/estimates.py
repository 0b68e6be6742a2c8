"""Adapter between the ``estimators`` package and the surfaces.

Why this module exists: the report, the dashboard and the notebook all show the
estimators' own plotly figures and numbers. This module runs
``estimators.run_all(store, run_id)`` once per run and normalises each result to
``EstimateView(name, figure, summary, error)`` so a surface does not care how a
particular estimator spells its accessors. An estimator that fails is shown as
failed with its error, never as a made-up number.
"""

from __future__ import annotations

import dataclasses
import math
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np


@dataclass
class EstimateView:
    name: str
    figures: list = field(default_factory=list)  # plotly figures
    summary: dict = field(default_factory=dict)  # flat, JSON-able headline numbers
    error: str | None = None
    raw: Any = None


def _figures_of(result: Any) -> list:
    """Collect plotly figures a result offers (``figure()``, ``figures()``, ``fig``...)."""
    import plotly.graph_objects as go

    out: list = []
    for attr in ("figures", "figure", "plot", "to_figure", "fig"):
        obj = getattr(result, attr, None)
        if obj is None:
            continue
        try:
            val = obj() if callable(obj) and not isinstance(obj, go.Figure) else obj
        except TypeError:
            continue
        if isinstance(val, go.Figure):
            out.append(val)
        elif isinstance(val, dict):
            out.extend(v for v in val.values() if isinstance(v, go.Figure))
        elif isinstance(val, (list, tuple)):
            out.extend(v for v in val if isinstance(v, go.Figure))
        if out:
            break
    return out


def _jsonable(v: Any) -> Any:
    if isinstance(v, (np.floating, float)):
        f = float(v)
        return None if math.isnan(f) else f
    if isinstance(v, (np.integer,)):
        return int(v)
    if isinstance(v, (str, int, bool)) or v is None:
        return v
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)) and len(v) <= 64:
        return [_jsonable(x) for x in v]
    return None


def _summary_of(result: Any) -> dict:
    for attr in ("summary", "to_dict", "as_dict"):
        obj = getattr(result, attr, None)
        if obj is None:
            continue
        val = obj() if callable(obj) else obj
        if isinstance(val, dict):
            return {k: v for k, v in _jsonable(val).items() if v is not None}
    if dataclasses.is_dataclass(result):
        flat = {f.name: _jsonable(getattr(result, f.name)) for f in dataclasses.fields(result)}
        return {k: v for k, v in flat.items() if v is not None}
    if isinstance(result, dict):
        return {k: v for k, v in _jsonable(result).items() if v is not None}
    return {}


def available() -> tuple[bool, str]:
    """Whether ``estimators.run_all`` can be called, and why not."""
    try:
        import estimators
    except Exception as e:  # pragma: no cover - import failure is an install problem
        return False, f"cannot import estimators: {e}"
    if not hasattr(estimators, "run_all"):
        return False, "the estimators package has no run_all() in this install"
    return True, ""


def view(name: str, result: Any) -> EstimateView:
    if isinstance(result, Exception):
        return EstimateView(name, error=f"{type(result).__name__}: {result}")
    err = getattr(result, "error", None)
    try:
        figs = _figures_of(result)
    except Exception as e:
        return EstimateView(name, summary=_summary_of(result), error=f"figure failed: {e}", raw=result)
    return EstimateView(name, figs, _summary_of(result), err if isinstance(err, str) else None, result)


def run_estimates(db: str | Path, run_id: str) -> tuple[dict[str, EstimateView], str | None]:
    """Run every estimator on one run. Returns (views by name, reason if none could run)."""
    ok, why = available()
    if not ok:
        return {}, why
    import estimators
    from acceptscope.store import Store

    try:
        results = estimators.run_all(Store(db), run_id)
    except Exception as e:
        return {}, f"estimators.run_all failed: {type(e).__name__}: {e}\n{traceback.format_exc(limit=3)}"
    return {name: view(name, res) for name, res in (results or {}).items()}, None
