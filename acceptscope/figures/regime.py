"""The seeds' regime, side by side with the SGLang DSpark blog: windows that contract with difficulty,
utilization against the ceiling, and compact vs static throughput over batch size.

Why this module exists: the point of a confidence scheduler is the trade-off the SGLang blog shows on a
gsm8k / arena-hard / poetry mix (windows contract 5.24 -> 3.78 -> 2.91 tokens while utilization stays at
0.88-0.97; about 55% of gsm8k steps fill the full window, about 80% of poetry steps use three or fewer;
compact ties static at batch 1 and pulls ahead once throughput plateaus). The report and the dashboard
put an audit's own numbers next to those, from the same functions.

Blog figures are quoted from https://www.lmsys.org/blog/2026-07-06-dspark-sglang as summarised in the
project's issue 13; the blog's block holds six drafts, the reference engine's seven, so "full window"
means gamma drafts in each.
"""

from __future__ import annotations

import html
import json
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go
from plotly.subplots import make_subplots

BLOG_URL = "https://www.lmsys.org/blog/2026-07-06-dspark-sglang"
# our workload -> the blog's workload of the same difficulty class, with its published figures
BLOG = {
    "math": {"blog_workload": "gsm8k", "mean_window": 5.24, "share_full_window": 0.55, "share_window_le3": None},
    "chat": {"blog_workload": "arena-hard", "mean_window": 3.78, "share_full_window": None, "share_window_le3": None},
    "poetry": {"blog_workload": "poetry", "mean_window": 2.91, "share_full_window": None, "share_window_le3": 0.80},
}
BLOG_UTILIZATION = (0.88, 0.97)  # per-workload range reported by the blog
ARM_COLORS = {"compact": "#1f77b4", "static": "#2ca02c"}


def blog_comparison(regime: pd.DataFrame) -> pd.DataFrame:
    """One row per workload: the audit's figures next to the blog's (NaN where the blog gives none).

    ``regime`` is :meth:`acceptscope.reader.Reader.regime_by_workload` of one run (the cap-accept arm carries both
    the windows, which parity makes identical to compact's, and the ceiling that utilization needs).
    """
    rows = []
    for r in regime.itertuples(index=False):
        b = BLOG.get(r.workload, {})
        rows.append({
            "workload": r.workload, "blog_workload": b.get("blog_workload", "–"), "blocks": r.blocks,
            "mean_window": r.mean_window, "blog_mean_window": b.get("mean_window"),
            "utilization": r.utilization,
            "blog_utilization": f"{BLOG_UTILIZATION[0]:.2f}–{BLOG_UTILIZATION[1]:.2f}" if b else None,
            "share_full_window": r.share_full_window, "blog_share_full_window": b.get("share_full_window"),
            "share_window_le3": r.share_window_le3, "blog_share_window_le3": b.get("share_window_le3"),
            "share_trimmed": r.share_trimmed,
        })
    out = pd.DataFrame(rows)
    if len(out):
        order = {w: i for i, w in enumerate(BLOG)}
        out = out.sort_values("workload", key=lambda s: s.map(lambda w: order.get(w, 99))).reset_index(drop=True)
    return out


def fig_regime(cmp: pd.DataFrame, arm: str = "") -> go.Figure:
    """Mean window per workload, ours next to the blog's, and utilization against the blog's band.

    ``arm``: the arm whose windows and utilization ``cmp`` holds (named in the legend and the titles, so the
    report and the dashboard say the same about whose utilization it is)."""
    arm = html.escape(arm)  # data: plotly renders names and titles as HTML
    who = f"this audit ({arm})" if arm else "this audit"
    fig = make_subplots(rows=1, cols=2, subplot_titles=("mean verified window (drafts)",
                                                        f"{arm or 'audit'} utilization against its ceiling"))
    wl = list(cmp["workload"])
    fig.add_bar(x=wl, y=cmp["mean_window"], name=who, marker_color="#1f77b4", row=1, col=1)
    fig.add_bar(x=wl, y=cmp["blog_mean_window"], name="SGLang blog", marker_color="#9ca3af",
                text=[html.escape(str(b)) for b in cmp["blog_workload"]], textposition="inside", row=1, col=1)
    fig.add_bar(x=wl, y=cmp["utilization"], name=f"{who} utilization", marker_color="#1f77b4",
                showlegend=False, row=1, col=2)
    lo, hi = BLOG_UTILIZATION
    fig.add_hrect(y0=lo, y1=hi, fillcolor="#9ca3af", opacity=0.35, line_width=0, layer="below", row=1, col=2)
    fig.update_yaxes(title="drafts", row=1, col=1)
    fig.update_yaxes(title="Σ accept length / Σ ceiling", range=[0, 1.05], row=1, col=2)
    fig.update_layout(title="Windows contract with difficulty (grey: SGLang blog; band: blog's 0.88–0.97)",
                      height=380, template="plotly_white", barmode="group",
                      margin=dict(l=50, r=20, t=70, b=40), legend=dict(orientation="h", y=-0.18))
    return fig


def curve_ratios(curve: pd.DataFrame) -> pd.DataFrame:
    """compact / static throughput per (workload, batch)."""
    if curve.empty:
        return pd.DataFrame(columns=["workload", "batch", "compact", "static", "ratio"])
    w = curve.pivot_table(index=["workload", "batch"], columns="arm", values="tokens_per_s").reset_index()
    w.columns.name = None  # the pivot's "arm" label would render as an empty first column in HTML
    for a in ("compact", "static"):
        if a not in w:
            w[a] = float("nan")
    w["ratio"] = w["compact"] / w["static"]
    return w[["workload", "batch", "compact", "static", "ratio"]]


def fig_throughput_curve(curve: pd.DataFrame) -> go.Figure:
    """Decode tokens per modeled second over batch size, compact vs static, per workload; and the ratio."""
    fig = make_subplots(rows=1, cols=2, subplot_titles=("tokens / s on the virtual clock", "compact / static"))
    dashes = ["solid", "dot", "dash", "dashdot"]
    for i, (wl, g) in enumerate(curve.groupby("workload", sort=False)):
        for arm, ga in g.groupby("arm"):
            ga = ga.sort_values("batch")
            fig.add_scatter(x=ga["batch"], y=ga["tokens_per_s"], mode="lines+markers",
                            name=f"{html.escape(str(wl))} · {arm}",
                            line=dict(color=ARM_COLORS.get(arm), dash=dashes[i % len(dashes)]), row=1, col=1)
    r = curve_ratios(curve)
    for i, (wl, g) in enumerate(r.groupby("workload", sort=False)):
        g = g.sort_values("batch")
        fig.add_scatter(x=g["batch"], y=g["ratio"], mode="lines+markers", name=f"{html.escape(str(wl))} ratio",
                        line=dict(color="#111827", dash=dashes[i % len(dashes)]), row=1, col=2)
    fig.add_hline(y=1.0, line_color="#9ca3af", row=1, col=2)
    fig.update_xaxes(type="log", title="batch (max running requests)")
    fig.update_layout(title="Compact vs static (no trim) over batch size, on the GPU cost profile",
                      height=400, template="plotly_white", margin=dict(l=50, r=20, t=70, b=40),
                      legend=dict(orientation="h", y=-0.25))
    return fig


def cost_profile(sps_path: str) -> tuple[dict | None, list[str]]:
    """A measured GPU cost profile's provenance, bound ratio and fit (rows for a key/value table) and its
    virtual-clock checks (one sentence each), read from the manifest and ``.vclock.json`` beside the table;
    (None, [why]) when it has no manifest."""
    p = Path(sps_path)
    man_p = Path(str(p) + ".manifest.json")
    if not man_p.is_file():
        return None, [f"cost table {p.name}: no GPU manifest next to it."]
    man = json.loads(man_p.read_text(encoding="utf-8"))
    prov, bound, shape = man.get("provenance", {}), man.get("bound", {}), man.get("shape", {})
    rows = {
        "profile": p.name, "GPU": prov.get("gpu"), "driver": prov.get("driver"),
        "torch / CUDA": f"{prov.get('torch')} / {prov.get('cuda')}", "measured": prov.get("date_utc"),
        "shape": f"{shape.get('name')} ({man.get('target_layers')} of {shape.get('layers')} layers, hidden "
                 f"{shape.get('hidden')}), drafter {man.get('draft_layers')} layers",
        "context / gamma": f"{man.get('context_len')} tokens / {man.get('gamma')}",
        "HBM copy bandwidth (measured)": f"{(prov.get('copy_bandwidth_bytes_per_s') or 0) / 1e12:.2f} TB/s",
        "batch-1 verify": f"{min((bound.get('batch1_verify_ms') or {'-': float('nan')}).values()):.2f} ms",
        "bandwidth bound (weights / measured BW)": f"{bound.get('bound_ms', float('nan')):.2f} ms "
                                                   f"(ratio {bound.get('ratio_min', float('nan')):.2f})",
        "bandwidth bound (weights / datasheet BW)": f"{bound.get('datasheet_bound_ms', float('nan')):.2f} ms "
                                                    f"(ratio {bound.get('ratio_vs_datasheet', float('nan')):.2f})",
        "additive fit on its cells": "median {:.1%}, max {:.1%} relative error".format(
            man["tables"]["additive"]["fit"]["median_rel_err"], man["tables"]["additive"]["fit"]["max_rel_err"]),
    }
    notes = []
    vc = p.with_name(p.name.removesuffix(".json") + ".vclock.json")
    if vc.is_file():
        doc = json.loads(vc.read_text(encoding="utf-8"))
        for name, r in doc.get("checks", {}).items():
            k = r.get("clock") or r  # the clock = table + context term; older files hold the table alone
            table_alone = (f"; the table alone (profiled at {man.get('context_len')}-token contexts): median "
                           f"{r['median_rel_err']:.1%}, p90 {r['p90_rel_err']:.1%}" if "clock" in r else "")
            notes.append(f"virtual clock vs measured {doc.get('gpu')} step time on {r['steps']} {name} steps "
                         f"(their windows and per-request contexts): median error {k['median_rel_err']:.1%}, "
                         f"p90 {k['p90_rel_err']:.1%}, bias {k['mean_bias_rel']:+.1%}{table_alone}.")
    return rows, notes
