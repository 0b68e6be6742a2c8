"""Plotly figures drawn straight from the telemetry tables.

Why this module exists: some views are plain aggregates of the raw tables
(window distributions, survival against empirical acceptance, realized accept
length against the observed ceiling, per-request drill-down) and need no
estimator. The report, the dashboard and the notebook share these functions so
all three show the same picture. Estimator results are drawn by
:mod:`acceptscope.figures.estimates`; :mod:`acceptscope.estimate_views` adapts them.

The raw reliability table here is the upstream-comparable plug-in view
(15 equal-width bins, Wilson intervals, label = uncapped ceiling reaches k
given it reached k-1), computed in SQL from blocks whose ceiling is observed.
"""

from __future__ import annotations

import html
import math
from typing import Sequence

import numpy as np
import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

from acceptscope import summaries
from acceptscope.figures.estimates import thin, thinned_note
from acceptscope.reader import Reader
from acceptscope.runs_table import read_runs
from acceptscope.estimators.calibration_metrics import ece_binned
from acceptscope.outputs import plain_links

ARM_COLORS = {"compact": "#1f77b4", "cap-accept": "#d62728", "static": "#2ca02c"}
WILSON_Z = 1.96


def _layout(fig: go.Figure, title: str, height: int = 380) -> go.Figure:
    fig.update_layout(title=title, height=height, template="plotly_white",
                      margin=dict(l=50, r=20, t=60, b=40), legend=dict(orientation="h", y=-0.18))
    return plain_links(fig)  # run ids and workloads are data: a link in one shows as text


def wilson(k: np.ndarray, n: np.ndarray, z: float = WILSON_Z) -> tuple[np.ndarray, np.ndarray]:
    """Wilson score interval for k successes out of n (vectorised)."""
    k = np.asarray(k, float)
    n = np.asarray(n, float)
    with np.errstate(invalid="ignore", divide="ignore"):
        p = k / n
        den = 1 + z * z / n
        centre = (p + z * z / (2 * n)) / den
        half = z * np.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return centre - half, centre + half


# ---------------------------------------------------------------------------
# reliability (raw, plug-in)
# ---------------------------------------------------------------------------
def reliability_bins(reader: Reader, run_ids: Sequence[str], n_bins: int = 15,
                     workloads: Sequence[str] | None = None) -> pd.DataFrame:
    """Per (run, position, variant, bin): mean predicted confidence, observed rate, n, Wilson CI.

    ``variant`` is ``after`` (post-STS ``confidence``) and, where logits are
    recorded, ``before`` (sigmoid of ``confidence_logit``). ``workloads``: only their blocks.
    """
    df = reader.summary(summaries.reliability_bins, list(run_ids), n_bins, workloads)
    if len(df):
        df["lo"], df["hi"] = wilson(df["hits"].to_numpy(), df["n"].to_numpy())
    return df


def ece_table(bins: pd.DataFrame, n_bins: int = 15) -> pd.DataFrame:
    """Plug-in ECE per (run, position, variant) from reliability bins, by
    :func:`estimators.calibration_metrics.ece_binned` (the one ECE formula).

    A bin's mean prediction falls in that same equal-width bin, so weighting each bin's (mean_pred,
    rate) by its n gives :func:`estimators.calibration_metrics.ece` of the underlying samples
    (``n_bins`` must be the one :func:`reliability_bins` used; the bins arrive made).
    """
    cols = ["run_id", "position", "variant", "ece", "n", "mean_pred", "rate"]
    if bins.empty:
        return pd.DataFrame(columns=cols)
    out = ece_binned(bins, ["run_id", "position", "variant"])
    out["n"] = out["n"].astype(np.int64)
    return out[cols]


def fig_reliability(bins: pd.DataFrame, run_id: str, max_positions: int = 8) -> go.Figure:
    """One facet per draft position: observed rate vs predicted confidence, before/after STS."""
    b = bins[bins["run_id"] == run_id]
    positions = sorted(b["position"].unique())[:max_positions] or [1]
    cols = min(4, len(positions))
    rows = math.ceil(len(positions) / cols)
    ece = ece_table(b).set_index(["position", "variant"])["ece"]
    titles = []
    for k in positions:
        parts = [f"{v} {ece[(k, v)]:.3f}" for v in ("before", "after") if (k, v) in ece.index]
        titles.append(f"k={k} ECE " + ", ".join(parts))
    fig = make_subplots(rows=rows, cols=cols, subplot_titles=titles, horizontal_spacing=0.06,
                        vertical_spacing=0.14)
    colors = {"before": "#999999", "after": "#d62728"}
    for i, k in enumerate(positions):
        r, c = i // cols + 1, i % cols + 1
        fig.add_trace(go.Scatter(x=[0, 1], y=[0, 1], mode="lines", line=dict(dash="dash", color="#bbb"),
                                 showlegend=False, hoverinfo="skip"), row=r, col=c)
        for variant in ("before", "after"):
            s = b[(b["position"] == k) & (b["variant"] == variant)].sort_values("mean_pred")
            if s.empty:
                continue
            col = colors[variant]
            fig.add_trace(go.Scatter(
                x=np.concatenate([s["mean_pred"], s["mean_pred"][::-1]]),
                y=np.concatenate([s["hi"], s["lo"][::-1]]), fill="toself", mode="lines",
                line=dict(width=0), fillcolor=col, opacity=0.18, showlegend=False, hoverinfo="skip"),
                row=r, col=c)
            fig.add_trace(go.Scatter(
                x=s["mean_pred"], y=s["rate"], mode="lines+markers", line=dict(color=col),
                name=f"{variant} STS", legendgroup=variant, showlegend=(i == 0),
                customdata=s["n"], hovertemplate="pred %{x:.3f}<br>observed %{y:.3f}<br>n=%{customdata}"),
                row=r, col=c)
        fig.update_xaxes(range=[0, 1], row=r, col=c, title="predicted confidence" if r == rows else None)
        fig.update_yaxes(range=[0, 1], row=r, col=c, title="observed rate" if c == 1 else None)
    fig.update_annotations(font_size=11)
    return _layout(fig, f"Reliability per position (Wilson 95% bands) - {run_id}", height=270 * rows + 90)


# ---------------------------------------------------------------------------
# acceptance, windows, utilization, cost
# ---------------------------------------------------------------------------
def fig_survival(pos: pd.DataFrame) -> go.Figure:
    """Mean predicted survival S(k) against the empirical P(ceiling >= k) per run."""
    fig = go.Figure()
    for run_id, g in pos.groupby("run_id", sort=False):
        arm = g["arm"].iloc[0]
        color = ARM_COLORS.get(arm)
        fig.add_trace(go.Scatter(x=g["k"], y=g["mean_survival"], mode="lines+markers", name=f"{arm} predicted",
                                 line=dict(color=color, dash="dot")))
        if g["empirical_survival"].notna().any():
            lo, hi = wilson(g["empirical_survival"] * g["n"], g["n"])
            fig.add_trace(go.Scatter(x=g["k"], y=g["empirical_survival"], mode="lines+markers",
                                     name=f"{arm} empirical (ceiling ≥ k)", line=dict(color=color),
                                     error_y=dict(type="data", array=hi - g["empirical_survival"],
                                                  arrayminus=g["empirical_survival"] - lo)))
    fig.update_xaxes(title="draft position k", dtick=1)
    fig.update_yaxes(title="P(first k drafts accepted)", range=[0, 1.02])
    return _layout(fig, "Survival: predicted vs empirical acceptance")


def fig_windows(win: pd.DataFrame) -> go.Figure:
    """Distribution of verified windows, one facet per workload, bars per arm."""
    workloads = sorted(win["workload"].unique()) or ["?"]
    fig = make_subplots(rows=1, cols=len(workloads), subplot_titles=workloads, shared_yaxes=True)
    seen = set()
    for j, w in enumerate(workloads):
        g = win[win["workload"] == w]
        for run_id, h in g.groupby("run_id", sort=False):
            arm = h["arm"].iloc[0]
            frac = h["blocks"] / h["blocks"].sum()
            fig.add_trace(go.Bar(x=h["window"], y=frac, name=arm, legendgroup=arm,
                                 marker_color=ARM_COLORS.get(arm), showlegend=arm not in seen,
                                 customdata=h["blocks"], hovertemplate="window %{x}: %{y:.1%} (%{customdata} blocks)"),
                          row=1, col=j + 1)
            seen.add(arm)
        fig.update_xaxes(title="window (verified drafts)", dtick=1, row=1, col=j + 1)
    fig.update_yaxes(title="share of blocks", row=1, col=1)
    fig.update_layout(barmode="group")
    return _layout(fig, "Window distribution per workload")


def fig_utilization(util: pd.DataFrame) -> go.Figure:
    """Realized accept length next to the observed ceiling, per workload and arm."""
    fig = go.Figure()
    for run_id, g in util.groupby("run_id", sort=False):
        arm = g["arm"].iloc[0]
        fig.add_trace(go.Bar(x=g["workload"], y=g["mean_acc_len"], name=f"{arm} realized accept length",
                             marker_color=ARM_COLORS.get(arm)))
        if g["ceiling_accept_len"].notna().any():
            fig.add_trace(go.Scatter(
                x=g["workload"], y=g["ceiling_accept_len"], mode="markers", name=f"{arm} ceiling",
                marker=dict(symbol="line-ew-open", size=40, line=dict(width=3, color=ARM_COLORS.get(arm))),
                customdata=g["utilization"],
                hovertemplate=f"{html.escape(str(arm))} ceiling %{{y:.2f}}<br>{html.escape(str(arm))} utilization "
                              "%{customdata:.1%}"))
    fig.update_yaxes(title="tokens per block (incl. bonus)")
    fig.update_layout(barmode="group")
    return _layout(fig, "Utilization: realized accept length against the ceiling")


def fig_step_costs(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> go.Figure:
    """Predicted vs measured step time (ms) per step; the diagonal is a perfect cost model."""
    fig = go.Figure()
    arms = {} if runs is None else dict(zip(runs["run_id"], runs["arm"]))
    s = steps.dropna(subset=["predicted_step_ms"])
    measured = s["step_gpu_ms"].where(s["step_gpu_ms"].notna(), s["step_cpu_ms"])
    s = s.assign(measured=measured).dropna(subset=["measured"])
    most = 0
    for run_id, g in s.groupby("run_id", sort=False):
        arm = arms.get(run_id, run_id)
        most, g = max(most, len(g)), thin(g)
        fig.add_trace(go.Scatter(x=g["predicted_step_ms"], y=g["measured"], mode="markers", name=arm,
                                 marker=dict(size=5, opacity=0.5, color=ARM_COLORS.get(arm))))
    if len(s):
        hi = float(np.nanmax([s["predicted_step_ms"].max(), s["measured"].max()]))
        fig.add_trace(go.Scatter(x=[0, hi], y=[0, hi], mode="lines", line=dict(dash="dash", color="#888"),
                                 name="perfect model"))
    fig.update_xaxes(title="predicted step (ms)")
    fig.update_yaxes(title="measured step (ms)")
    return _layout(fig, "Cost model: predicted vs measured step time" + thinned_note(most))


def fig_throughput(steps: pd.DataFrame, runs: pd.DataFrame | None = None) -> go.Figure:
    """Verify tokens executed per step over the run (what the budget spent)."""
    fig = go.Figure()
    arms = {} if runs is None else dict(zip(runs["run_id"], runs["arm"]))
    most = 0
    for run_id, g in steps.groupby("run_id", sort=False):
        most, g = max(most, len(g)), thin(g)
        y = g["executed_verify_tokens"].where(g["executed_verify_tokens"].notna(), g["num_verify_tokens"])
        arm = arms.get(run_id, run_id)
        fig.add_trace(go.Scatter(x=g["wall_time_s"], y=y, mode="lines", name=arm,
                                 line=dict(color=ARM_COLORS.get(arm))))
    fig.update_xaxes(title="time since run start (s)")
    fig.update_yaxes(title="verify tokens per step")
    return _layout(fig, "Verify tokens per step" + thinned_note(most))


def fig_request(steps: pd.DataFrame, rid: str) -> go.Figure:
    """One request, block by block: window, accepted drafts and (where known) the ceiling."""
    fig = go.Figure()
    x = np.arange(1, len(steps) + 1)
    fig.add_trace(go.Bar(x=x, y=steps["window"], name="window (verified)", marker_color="#c7d7ee"))
    fig.add_trace(go.Bar(x=x, y=steps["correct_drafts"], name="accepted drafts", marker_color="#1f77b4"))
    if steps["ceiling"].notna().any():
        fig.add_trace(go.Scatter(x=x, y=steps["ceiling"], mode="markers", name="ceiling (uncapped)",
                                 marker=dict(symbol="diamond", size=8, color="#d62728")))
    exp_ceiling = [float(np.sum(s)) if s is not None else None for s in steps["survival"]]
    fig.add_trace(go.Scatter(x=x, y=exp_ceiling, mode="lines", name="Σ survival (expected ceiling)",
                             line=dict(color="#ff7f0e", dash="dot")))
    fig.update_layout(barmode="overlay")
    fig.update_xaxes(title="block (commit order)")
    fig.update_yaxes(title="drafts")
    return _layout(fig, f"Request {rid}: blocks")


def fig_confidence_heatmap(steps: pd.DataFrame, rid: str) -> go.Figure:
    """Per-block confidence by position (rows: blocks)."""
    conf = [list(c) if c is not None else [] for c in steps["confidence"]]
    width = max((len(c) for c in conf), default=0)
    z = np.full((len(conf), width), np.nan)
    for i, c in enumerate(conf):
        z[i, : len(c)] = c
    fig = go.Figure(go.Heatmap(z=z, x=list(range(1, width + 1)), colorscale="Viridis", zmin=0, zmax=1,
                               colorbar=dict(title="conf")))
    fig.update_xaxes(title="draft position k", dtick=1)
    fig.update_yaxes(title="block", autorange="reversed")
    return _layout(fig, f"Request {rid}: confidence per position", height=320)


def runs_in(reader: Reader, run_ids: Sequence[str]) -> pd.DataFrame:
    return read_runs(reader.df, run_ids, ["run_id", "arm", "engine", "gamma", "audit_group"])
