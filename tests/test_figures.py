"""The figure library (acceptscope.figures): what every surface draws, checked on the figures themselves.

Positions read 1..gamma on every plot, reliability plots carry axis titles, a group of one draws no
interval or coverage line, the utilization figures name their arm, and the raw-table ECE is
estimators.calibration_metrics.ece (one ECE, not a copy).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from acceptscope.figures import figure_of
from acceptscope.figures.estimates import coverage_figure, interval_figure
from acceptscope.figures.regime import blog_comparison, fig_regime
from acceptscope.figures.tables import ece_table, fig_reliability, wilson
from acceptscope.estimators.calibration import CalibrationResult
from acceptscope.estimators.calibration_metrics import ece, reliability_table

GAMMA = 7


def _survival(n: int = 4000, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    c = rng.uniform(0.3, 0.98, size=(n, GAMMA))
    P = np.cumprod(c, axis=1)
    Y = (rng.random((n, GAMMA)) < P ** 1.2).astype(float)
    return P, Y


def test_estimator_reliability_positions_are_one_based_with_axis_titles():
    P, Y = _survival()
    rel = reliability_table(P, Y).assign(method="identity")  # compare()'s shape: positions 0..gamma-1
    res = CalibrationResult(label="realized", metrics=pd.DataFrame(), temperatures={}, fit_seconds={},
                            reliability=rel, n_train=0, n_test=len(P))
    fig = figure_of(res)
    titles = [a.text for a in fig.layout.annotations]
    assert titles == [f"position {k}" for k in range(1, GAMMA + 1)]
    x_titles = {fig.layout[k].title.text for k in fig.layout if k.startswith("xaxis") and fig.layout[k].title.text}
    y_titles = {fig.layout[k].title.text for k in fig.layout if k.startswith("yaxis") and fig.layout[k].title.text}
    assert x_titles == {"predicted survival"} and y_titles == {"observed rate"}
    # positions asked for by the caller are the 1-based ones the figure shows
    assert [a.text for a in figure_of(res, positions=[1, 7]).layout.annotations] == ["position 1", "position 7"]


def _raw_bins(P: np.ndarray, Y: np.ndarray, n_bins: int = 15) -> pd.DataFrame:
    """reliability_bins' shape, computed here from samples (the SQL version is exercised by test_report)."""
    rows = []
    for k in range(GAMMA):
        b = np.minimum((P[:, k] * n_bins).astype(int), n_bins - 1)
        for j in np.unique(b):
            m = b == j
            rows.append(dict(run_id="r", position=k + 1, variant="after", bin=j, mean_pred=P[m, k].mean(),
                             rate=Y[m, k].mean(), hits=Y[m, k].sum(), n=int(m.sum())))
    df = pd.DataFrame(rows)
    df["lo"], df["hi"] = wilson(df["hits"].to_numpy(), df["n"].to_numpy())
    return df


def test_raw_table_ece_is_the_calibration_metrics_ece_and_the_figure_is_titled():
    P, Y = _survival(seed=1)
    bins = _raw_bins(P, Y)
    got = ece_table(bins).set_index("position")["ece"]
    for k in range(GAMMA):
        assert np.isclose(got[k + 1], ece(P[:, k], Y[:, k], 15))
    fig = fig_reliability(bins, "r")
    assert [a.text.split(" ")[0] for a in fig.layout.annotations] == [f"k={k}" for k in range(1, GAMMA + 1)]
    assert {fig.layout[k].title.text for k in fig.layout if k.startswith("yaxis") and fig.layout[k].title.text} \
        == {"observed rate"}
    assert "predicted confidence" in {fig.layout[k].title.text for k in fig.layout if k.startswith("xaxis")}


def test_a_group_of_one_draws_no_interval_and_no_coverage_line():
    agg = pd.DataFrame({"workload": ["math", "poetry"], "n": [12, 1], "mean_ceiling": [4.0, 2.0],
                        "lo": [3.5, 2.0], "hi": [4.5, 2.0]})
    fig = interval_figure(agg, x="workload", est="mean_ceiling", lo="lo", hi="hi", yaxis="drafts")
    tr = fig.data[0]
    assert list(tr.x) == ["math", "poetry (n = 1: no interval)"]
    assert np.isclose(tr.error_y.array[0], 0.5) and np.isnan(tr.error_y.array[1])
    per_mode = pd.DataFrame({"mode": ["auto", "tiny"], "n_blocks": [50, 1], "n_resolved": [20, 0],
                             **{f"cov{L}_unresolved": [L / 100, 0.0] for L in (80, 90, 95)},
                             **{f"cov{L}": [L / 100, 0.0] for L in (80, 90, 95)}})
    fig = coverage_figure(per_mode)
    drawn = [t for t in fig.data if t.name.startswith("tiny") and t.visible != "legendonly"]
    assert drawn == []
    assert [t.name for t in fig.data if t.name.startswith("tiny")] == [
        "tiny (unresolved, n=1: too few to draw)", "tiny (all censored, n=1: too few to draw)"]
    auto = [t for t in fig.data if t.name.startswith("auto")]
    assert len(auto) == 2 and all(len(t.y) == 3 for t in auto)


def test_regime_figure_names_the_arm_whose_utilization_it_shows():
    reg = pd.DataFrame({"workload": ["math", "poetry"], "blocks": [10, 20], "mean_window": [6.0, 3.0],
                        "utilization": [0.95, 0.9], "share_full_window": [0.5, 0.1],
                        "share_window_le3": [0.1, 0.8], "share_trimmed": [0.3, 0.9]})
    fig = fig_regime(blog_comparison(reg), arm="cap-accept")
    assert "cap-accept utilization against its ceiling" in [a.text for a in fig.layout.annotations]
    assert "this audit (cap-accept) utilization" in [t.name for t in fig.data]
