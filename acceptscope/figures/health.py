"""The interval-health figure (:mod:`acceptscope.estimators.health`): per group, the production arm's own
interval as an error bar and the audit's recorded mean ceiling as a mark, covered or not.

Why its own module: a result type brings its figure in one decorated function
(:func:`acceptscope.figures.figure_for`); the report, the dashboard and the notebook draw it by type.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from acceptscope.estimators.health import LEVEL, IntervalHealth
from acceptscope.figures.estimates import PALETTE, figure_for
from acceptscope.outputs import plain_links


@figure_for(IntervalHealth)
def interval_health_figure(result: IntervalHealth, **kw) -> go.Figure:
    """The production arm's estimate with its interval per group, the audit's truth beside it."""
    d = result.table
    x = [str(g) for g in d["group"]]
    y = d["estimate"].to_numpy(float)
    fig = go.Figure()
    fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name="production arm alone: estimate and interval",
                             marker=dict(size=9, color=PALETTE[0]),
                             error_y=dict(type="data", symmetric=False,
                                          array=np.maximum(d["hi"].to_numpy(float) - y, 0),
                                          arrayminus=np.maximum(y - d["lo"].to_numpy(float), 0))))
    cov = d["covered"].to_numpy(bool)
    fig.add_trace(go.Scatter(x=x, y=d["truth"].to_numpy(float), mode="markers", name="audit truth (recorded)",
                             marker=dict(size=11, symbol=np.where(cov, "diamond", "x").tolist(),
                                         color=np.where(cov, PALETTE[2], "#c0392b").tolist())))
    fig.update_yaxes(title="mean ceiling (drafts per block)")
    fig.update_xaxes(title="run / workload")
    fig.update_layout(title=f"Interval health: {int(cov.sum())} of {len(cov)} groups covered ({LEVEL:.0%} intervals)",
                      height=400, template="plotly_white", margin=dict(l=55, r=20, t=60, b=45),
                      legend=dict(orientation="h", y=-0.2))
    return plain_links(fig)  # workload names are data
