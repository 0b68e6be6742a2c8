"""The report on long runs: figures get bounded data, the tail table is summed in chunks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from acceptscope.figures import tables as F
from acceptscope.figures.estimates import PLOT_POINTS, budget_audit_figure, thin
from acceptscope.parity import check_parity
from acceptscope.reader import Reader
from acceptscope.report import _parity_all_identical, _TailSums, _tail_by_workload
from acceptscope.store import Store
from acceptscope.estimators.synthetic import simulate
from tests._close import assert_close


def _steps(n: int, run_id: str) -> pd.DataFrame:
    rng = np.random.default_rng(len(run_id) + n)
    return pd.DataFrame({"run_id": run_id, "wall_time_s": np.arange(n) * 0.01, "predicted_step_ms": rng.uniform(5, 9, n),
                         "step_gpu_ms": rng.uniform(5, 9, n), "step_cpu_ms": np.nan,
                         "executed_verify_tokens": rng.integers(100, 400, n), "num_verify_tokens": 400})


def test_thin_keeps_ends_and_small_frames():
    df = pd.DataFrame({"i": np.arange(123_457)})
    t = thin(df)
    assert len(t) == PLOT_POINTS and t["i"].iloc[0] == 0 and t["i"].iloc[-1] == 123_456
    assert t["i"].is_monotonic_increasing
    small = df.head(PLOT_POINTS)
    assert thin(small) is small


def test_step_figures_are_bounded_and_say_so():
    """A 60k-step run is drawn with PLOT_POINTS points per trace and the title says it; a short run
    is drawn whole with the title it always had."""
    long = pd.concat([_steps(60_000, "c"), _steps(900, "s")])
    runs = pd.DataFrame({"run_id": ["c", "s"], "arm": ["compact", "static"]})
    for fig in (F.fig_step_costs(long, runs), F.fig_throughput(long, runs)):
        sizes = [len(t.x) for t in fig.data if t.name in ("compact", "static")]
        assert sizes == [PLOT_POINTS, 900]
        assert f"{PLOT_POINTS:,} evenly spaced of 60,000" in fig.layout.title.text
    short = F.fig_throughput(_steps(900, "s"), runs)
    assert short.layout.title.text == "Verify tokens per step" and len(short.data[0].x) == 900
    ps = pd.DataFrame({"forward_ct": np.arange(30_000), "recomputed_budget": 1.0, "scheduled_window_tokens": 2.0})
    assert {len(t.x) for t in budget_audit_figure(ps).data} == {PLOT_POINTS}


def test_tail_sums_in_chunks_equal_one_pass():
    """Chunks of requests (in per_request's order) give the one-pass table: the bootstrap weights are
    keyed by request, so only float summation order differs."""
    rng = np.random.default_rng(7)
    n = 3_000
    pr = pd.DataFrame({"workload": np.repeat(["a", "b", "c"], n // 3), "prompt_index": np.arange(n) % 211,
                       "seed": np.arange(n) // 211, "w": rng.integers(1, 40, n).astype(float),
                       "x": rng.uniform(2, 4, n)})
    pr["y"] = pr.x + rng.uniform(0, 1.5, n)
    pr.loc[5, "y"] = np.nan  # unaudited: dropped in both
    whole = _tail_by_workload(pr, n_boot=200)
    sums = _TailSums(200)
    for a in range(0, n, 700):
        sums.add(pr.iloc[a:a + 700])
    chunked = sums.table()
    assert list(chunked["workload"]) == ["a", "b", "c"] and chunked["requests"].tolist() == [999, 1000, 1000]
    num = ["truth", "truth_lo", "truth_hi", "conf_only", "conf_lo", "conf_hi"]
    np.testing.assert_allclose(chunked[num].to_numpy(float), whole[num].to_numpy(float), rtol=1e-12)


def _parity_store(tmp_path, edit=None) -> Path:
    """Two arms of the same 30 requests (the synthetic generator's, with seeds and output tokens); ``edit``
    changes arm B's requests frame first."""
    t = simulate(n_requests=30, seed=1).tables
    req = t["requests"].assign(seed=7, output_tokens=[[i, i + 1, i + 2] for i in range(len(t["requests"]))])
    a = req.assign(run_id="arm-a")
    b = req.assign(run_id="arm-b", rid=req["rid"] + "-b")
    b = edit(b) if edit else b
    st = Store(tmp_path / "p.duckdb")
    runs = t["runs"]
    st.append({"runs": pd.concat([runs.assign(run_id="arm-a", arm="compact"), runs.assign(run_id="arm-b")]),
               "requests": pd.concat([a, b], ignore_index=True)})
    return tmp_path / "p.duckdb"


def _mutate_tokens(b):
    b = b.copy()
    b.at[b.index[3], "output_tokens"] = [9, 9, 9]
    return b


def _null_seed(b):
    b = b.copy()
    b["seed"] = b["seed"].astype("Int64")
    b.loc[b.index[2], "seed"] = pd.NA
    return b


@pytest.mark.parametrize("edit, fast", [(None, True), (lambda b: b.iloc[5:], True), (lambda b: b.iloc[1:-1], True),
                                        (_mutate_tokens, False), (_null_seed, False),
                                        (lambda b: b.assign(output_tokens=None), True)])
def test_parity_fast_path_is_check_paritys_report(tmp_path, edit, fast):
    """The DuckDB aggregate answers only when check_parity would find nothing, and then says what it says."""
    reader = Reader(_parity_store(tmp_path, edit))
    got = _parity_all_identical(reader, "arm-a", "arm-b")
    full = check_parity(reader, "arm-a", "arm-b")
    assert (got is not None) == fast
    if fast:
        assert_close(got.to_dict(), full.to_dict())
        assert full.ok
    else:
        assert not full.ok
