"""Plotly figures for estimator results, shared by the dashboard, the HTML report and the notebook.

Each function takes a result table (never the raw store) and returns a
``plotly.graph_objects.Figure``; :func:`figure_of` picks the figure for an estimator result, so the
estimators themselves never import plotly (they sit a layer below).
"""

from __future__ import annotations

from functools import singledispatch
from typing import Any, Callable

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from acceptscope.estimators import ResultTable as BracketTable
from acceptscope.estimators.calibration import CalibrationResult
from acceptscope.estimators.cost import CostResult
from acceptscope.estimators.planner import PlannerAudit
from acceptscope.estimators.accumulator import StreamTail
from acceptscope.estimators.tail import TailResult
from acceptscope.estimators.utilization import UtilizationResult
from acceptscope.estimators.validation import ValidationResult
from acceptscope.outputs import plain_links

MIN_COVERAGE_N = 2  # blocks a coverage group needs before its line is drawn
PLOT_POINTS = 5_000  # points per trace at most: a per-step series of a long run is thinned evenly (HTML size)
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#17becf", "#7f7f7f"]


def thin(df: pd.DataFrame, n: int = PLOT_POINTS) -> pd.DataFrame:
    """At most ``n`` evenly spaced rows of ``df`` (first and last kept): a plot cannot show 200k points, and
    each one costs the report's HTML ~25 bytes. A frame of ``n`` rows or fewer comes back as it is."""
    if len(df) <= n:
        return df
    return df.iloc[np.unique(np.linspace(0, len(df) - 1, n).round().astype(np.int64))]


def thinned_note(rows: int, n: int = PLOT_POINTS) -> str:
    """The title suffix of a figure whose traces were thinned (empty when none was)."""
    return f" ({n:,} evenly spaced of {rows:,} points per trace)" if rows > n else ""


def _layout(fig: go.Figure, title: str, height: int = 400) -> go.Figure:
    fig.update_layout(title=title, height=height, template="plotly_white", margin=dict(l=55, r=20, t=60, b=45),
                      legend=dict(orientation="h", y=-0.2))
    return plain_links(fig)  # run ids and workloads are data: a link in one shows as text


def interval_figure(df: pd.DataFrame, x: str, est: str, lo: str, hi: str, truth: str | None = None,
                    title: str = "", yaxis: str = "") -> go.Figure:
    """Point estimates with interval bars per group, with the truth as markers when known.

    A group of one request (``n`` = 1) gets no bar: its bootstrap interval is a single resample, a
    zero-width bar that reads as certainty."""
    fig = go.Figure()
    one = (df["n"] <= 1).to_numpy() if "n" in df else np.zeros(len(df), bool)
    up = np.where(one, np.nan, df[hi] - df[est])
    down = np.where(one, np.nan, df[est] - df[lo])
    names = [f"{g} (n = 1: no interval)" if o else g for g, o in zip(df[x].astype(str), one)]
    fig.add_trace(go.Scatter(x=names, y=df[est], mode="markers", name="estimate",
                             error_y=dict(type="data", symmetric=False, array=up, arrayminus=down),
                             marker=dict(size=9, color=PALETTE[0])))
    if truth and truth in df:
        fig.add_trace(go.Scatter(x=names, y=df[truth], mode="markers", name="truth",
                                 marker=dict(symbol="x", size=10, color=PALETTE[1])))
    fig.update_xaxes(title=x)
    fig.update_yaxes(title=yaxis)
    return _layout(fig, title)


def coverage_figure(per_mode: pd.DataFrame) -> go.Figure:
    """Empirical coverage of per-block intervals against the nominal level, per mode.

    A group of fewer than :data:`MIN_COVERAGE_N` blocks is not drawn (one block covers 0% or 100%: a line
    at 0 that says nothing); its legend entry says so."""
    fig = go.Figure()
    levels = sorted(int(c[3:5]) for c in per_mode.columns if c.startswith("cov") and c.endswith("_unresolved"))
    for i, r in per_mode.reset_index(drop=True).iterrows():
        color = PALETTE[i % len(PALETTE)]
        groups = ((f"{r['mode']} (unresolved", r.n_blocks - r.n_resolved, "_unresolved", "lines+markers"),
                  (f"{r['mode']} (all censored", r.n_blocks, "", "markers"))
        for name, n, suffix, mode in groups:
            if n < MIN_COVERAGE_N:
                fig.add_trace(go.Scatter(x=[None], y=[None], mode="markers", name=f"{name}, n={n}: too few to draw)",
                                         marker=dict(color=color), visible="legendonly"))
                continue
            fig.add_trace(go.Scatter(x=[L / 100 for L in levels], y=[r[f"cov{L}{suffix}"] for L in levels],
                                     mode=mode, name=f"{name}, n={n})", line=dict(color=color),
                                     marker=dict(symbol="diamond-open" if mode == "markers" else "circle", size=9,
                                                 color=color)))
    fig.add_trace(go.Scatter(x=[0.75, 1.0], y=[0.75, 1.0], mode="lines", name="nominal", line=dict(dash="dash", color="grey")))
    fig.update_xaxes(title="nominal level")
    fig.update_yaxes(title="empirical coverage of the true ceiling")
    return _layout(fig, "Per-block predictive interval coverage (cross-fitted)")


def reliability_figure(rel: pd.DataFrame, positions=None, title: str = "Reliability") -> go.Figure:
    """Reliability curves (observed vs predicted survival) per position, one line per method."""
    pos = sorted(rel.position.unique()) if positions is None else list(positions)
    ncol = min(4, len(pos))
    nrow = int(np.ceil(len(pos) / ncol))
    fig = make_subplots(rows=nrow, cols=ncol, subplot_titles=[f"position {p}" for p in pos],
                        shared_xaxes=True, shared_yaxes=True)
    methods = list(dict.fromkeys(rel.method))
    for j, p in enumerate(pos):
        rr, cc = j // ncol + 1, j % ncol + 1
        for i, m in enumerate(methods):
            d = rel[(rel.position == p) & (rel.method == m) & (rel["count"] > 0)]
            fig.add_trace(go.Scatter(x=d.avg_pred, y=d.avg_target, mode="lines+markers", name=m,
                                     legendgroup=m, showlegend=j == 0, line=dict(color=PALETTE[i % len(PALETTE)]),
                                     customdata=d["count"], hovertemplate="pred %{x:.3f}<br>obs %{y:.3f}<br>n %{customdata:.0f}"),
                          row=rr, col=cc)
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(dash="dash", color="grey"), showlegend=False),
                      row=rr, col=cc)
        if rr == nrow:
            fig.update_xaxes(title="predicted survival", row=rr, col=cc)
        if cc == 1:
            fig.update_yaxes(title="observed rate", row=rr, col=cc)
    return _layout(fig, title, height=280 * nrow + 80)


def pred_vs_measured_figure(pred: pd.DataFrame, title: str = "") -> go.Figure:
    """Predicted vs measured step time, coloured by split."""
    fig = go.Figure()
    d = pred[pred.split != "dropped"]
    most = 0
    for i, (s, g) in enumerate(d.groupby("split")):
        most, g = max(most, len(g)), thin(g)
        fig.add_trace(go.Scatter(x=g.measured_ms, y=g.predicted_ms, mode="markers", name=s, opacity=0.6,
                                 marker=dict(size=5, color=PALETTE[i])))
    if len(d):
        m = float(np.nanmax([d.measured_ms.max(), d.predicted_ms.max()]))
        fig.add_trace(go.Scatter(x=[0, m], y=[0, m], mode="lines", name="y = x", line=dict(dash="dash", color="grey")))
    fig.update_xaxes(title="measured step time (ms)")
    fig.update_yaxes(title="predicted (ms)")
    return _layout(fig, title + thinned_note(most))


def budget_audit_figure(ps: pd.DataFrame) -> go.Figure:
    """Recorded vs recomputed budgets over steps."""
    fig = go.Figure()
    rows, ps = len(ps), thin(ps)
    x = ps.forward_ct
    if "budget" in ps:
        fig.add_trace(go.Scatter(x=x, y=ps.budget, mode="lines", name="recorded budget"))
    fig.add_trace(go.Scatter(x=x, y=ps.recomputed_budget, mode="lines", name="recomputed budget", line=dict(dash="dot")))
    fig.add_trace(go.Scatter(x=x, y=ps.scheduled_window_tokens, mode="lines", name="scheduled window tokens", opacity=0.6))
    fig.update_xaxes(title="forward_ct")
    fig.update_yaxes(title="tokens")
    return _layout(fig, "Planner audit: budget from lagged survival" + thinned_note(rows))


def windows_figure(win: pd.DataFrame, util: pd.DataFrame | None = None) -> go.Figure:
    """Window-length distribution per workload (bars) with utilization per workload (markers)."""
    fig = make_subplots(rows=1, cols=2, column_widths=[0.65, 0.35],
                        subplot_titles=("window length share", "utilization vs ceiling"))
    order = list(win.groupby("workload")["window"].apply(lambda s: -np.average(s, weights=win.loc[s.index, "count"])).sort_values().index)
    for i, w in enumerate(order):
        d = win[win.workload == w]
        fig.add_trace(go.Bar(x=d.window, y=d.share, name=str(w), marker_color=PALETTE[i % len(PALETTE)]), row=1, col=1)
    if util is not None and len(util):
        u = util.set_index("group").reindex([str(w) for w in order])
        err = None
        if "util_lo" in u:
            err = dict(type="data", symmetric=False, array=u.util_hi - u.utilization, arrayminus=u.utilization - u.util_lo)
        fig.add_trace(go.Scatter(x=u.index, y=u.utilization, mode="markers", marker=dict(size=11), error_y=err,
                                 name="utilization", showlegend=False), row=1, col=2)
        fig.update_yaxes(range=[0, 1.02], row=1, col=2)
    fig.update_layout(barmode="group")
    fig.update_xaxes(title="verified drafts (window)", row=1, col=1)
    return _layout(fig, "Windows contract from easy to hard workloads; utilization stays high")


def one_based_positions(df: pd.DataFrame) -> pd.DataFrame:
    """The estimators count draft positions from 0; every surface shows k = 1..gamma (as the raw-table
    figures, the tables and the findings do)."""
    return df.assign(position=df["position"] + 1) if "position" in df else df


def _ceiling_figure(result: Any, by: str = "workload") -> go.Figure:
    """Aggregate estimated ceiling per group (with interval), against truth where known."""
    col = by if isinstance(result, StreamTail) or by in result.blocks else None  # a TailResult may lack `by`
    agg = result.aggregate(by=[col] if col else None, n_boot=200)
    return interval_figure(agg, x=col or "group", est="mean_ceiling", lo="lo", hi="hi",
                           truth="truth" if "truth" in agg else None,
                           title=f"Estimated uncapped ceiling (accepted drafts), 95% interval, by {col or 'run'}",
                           yaxis="mean ceiling (drafts)")


def _bracket_figure(result: BracketTable) -> go.Figure | None:
    if result.df.empty:
        return None
    g = result.df.groupby("category").agg(lo=("lo", "mean"), hi=("hi", "mean"), mid=("mid", "mean")).reset_index()
    return interval_figure(g, x="category", est="mid", lo="lo", hi="hi",
                           title="SGLang block-accept bracket by category (accept length)")


@singledispatch
def figure_of(result: Any, **kw: Any) -> go.Figure | None:
    """The figure of one estimator result (None for a result type that draws none).

    ``kw``: ``by`` for tail results (group column), ``positions`` for calibration results. A result type
    gets its figure by registration (:func:`figure_for`), so a new estimator's figure is one decorated
    function beside the others, and the report, the dashboard and the notebook draw it.
    """
    return None


def figure_for(result_type: type) -> Callable:
    """Decorator: ``fn(result, **kw)`` draws results of ``result_type`` (and its subclasses) in :func:`figure_of`."""
    def deco(fn: Callable) -> Callable:
        figure_of.register(result_type)(fn)
        return fn
    return deco


@figure_for(TailResult)
@figure_for(StreamTail)
def _tail_figure(result, **kw):
    return _ceiling_figure(result, **kw)


@figure_for(CalibrationResult)
def _calibration_figure(result, **kw):
    return reliability_figure(one_based_positions(result.reliability), positions=kw.get("positions"),
                              title=f"STS reliability (label: {result.label})")


@figure_for(UtilizationResult)
def _utilization_figure(result, **kw):
    return windows_figure(result.windows, result.by_group[result.by_group.by == "workload"])


@figure_for(CostResult)
def _cost_figure(result, **kw):
    return pred_vs_measured_figure(result.predictions, title="SPS additive cost model: predicted vs measured step time")


@figure_for(ValidationResult)
def _validation_figure(result, **kw):
    return coverage_figure(result.per_mode)


@figure_for(PlannerAudit)
def _planner_figure(result, **kw):
    return budget_audit_figure(result.per_step)


@figure_for(BracketTable)
def _bracket_result_figure(result, **kw):
    return _bracket_figure(result)


def tail_truth_figure(t: pd.DataFrame) -> go.Figure:
    """Ceiling accept length per workload: compact's confidence-only estimate against the cap-accept truth."""
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=t["workload"], y=t["truth"], mode="markers", name="cap-accept truth",
                             marker=dict(color="#d62728", size=12, symbol="diamond"),
                             error_y=dict(type="data", array=t["truth_hi"] - t["truth"],
                                          arrayminus=t["truth"] - t["truth_lo"])))
    fig.add_trace(go.Scatter(x=t["workload"], y=t["conf_only"], mode="markers", name="compact confidence-only estimate",
                             marker=dict(color="#1f77b4", size=10),
                             error_y=dict(type="data", array=t["conf_hi"] - t["conf_only"],
                                          arrayminus=t["conf_only"] - t["conf_lo"])))
    fig.update_xaxes(title="workload")
    fig.update_yaxes(title="tokens per block (uncapped, incl. bonus)")
    return _layout(fig, "Ceiling accept length per workload: estimate vs truth", height=380)
