"""The trim-regret figure (:mod:`acceptscope.estimators.trim_regret`): per run and workload, TensorRT-LLM's
rate beside the part of it known to be real, each with its bootstrap interval.

Why its own module: a registered estimator brings its figure in one decorated function
(:func:`acceptscope.figures.figure_for`); the report, the dashboard and the notebook draw it by type.
"""

from __future__ import annotations

import numpy as np
import plotly.graph_objects as go

from acceptscope.estimators.trim_regret import TrimRegretResult
from acceptscope.figures.estimates import PALETTE, figure_for
from acceptscope.outputs import plain_links

SERIES = (("trim_regret_rate", "trim_regret_lo", "trim_regret_hi", "trim regret (whole window accepted)"),
          ("first_accepted_rate", "first_accepted_lo", "first_accepted_hi", "first trimmed draft accepted (lost a token)"))


@figure_for(TrimRegretResult)
def trim_regret_figure(result: TrimRegretResult, **kw) -> go.Figure:
    """Both rates per group with asymmetric interval bars (the known rate's bar reaches its identified upper bound)."""
    d = result.by_group
    x = ["run" if by == "run" else f"{g}" for by, g in zip(d["by"], d["group"])]
    fig = go.Figure()
    for i, (est, lo, hi, name) in enumerate(SERIES):
        y = d[est].to_numpy(float)
        up = d[hi].astype(float).to_numpy() - y
        down = y - d[lo].astype(float).to_numpy()
        fig.add_trace(go.Scatter(x=x, y=y, mode="markers", name=name, marker=dict(size=9, color=PALETTE[i]),
                                 error_y=dict(type="data", symmetric=False, array=np.maximum(up, 0),
                                              arrayminus=np.maximum(down, 0))))
    fig.update_yaxes(title="share of trimmed blocks", tickformat=".0%", rangemode="tozero")
    fig.update_xaxes(title="run / workload")
    fig.update_layout(title=f"Trim regret ({result.level:.0%} request-clustered bootstrap, {result.n_boot} replicates)",
                      height=400, template="plotly_white", margin=dict(l=55, r=20, t=60, b=45),
                      legend=dict(orientation="h", y=-0.2))
    return plain_links(fig)  # workload names are data
