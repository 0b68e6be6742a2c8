"""bench/paired_grid.py: the seeded design keeps its splits apart, the truth of a pair is read from real
DuckDB files block by block, and coverage is pooled with exact binomial intervals."""

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

from acceptscope.store import Store
from acceptscope.estimators.synthetic import compact_view, simulate

ROOT = Path(__file__).resolve().parents[1]


def _load(name: str):
    sys.path.insert(0, str(ROOT / "bench"))  # paired_grid imports its report half by name, as a script does
    try:
        spec = importlib.util.spec_from_file_location(name, ROOT / "bench" / f"{name}.py")
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod
    finally:
        sys.path.remove(str(ROOT / "bench"))


@pytest.fixture(scope="module")
def grid():
    return _load("paired_grid")


@pytest.fixture(scope="module")
def report():
    return _load("paired_grid_report")


def test_design_is_seeded_balanced_and_its_splits_never_share_a_seed(grid):
    score = grid.design("score", 48, volume=len(grid.VOLUME))
    tune = grid.design("tune", 48, volume=len(grid.VOLUME))
    assert score == grid.design("score", 48, volume=len(grid.VOLUME))  # seeded
    assert not {c["seed"] for c in score} & {c["seed"] for c in tune}
    assert grid.design("score", 6) == score[:6]  # the smoke grid is the full grid's prefix
    g = [c for c in score if c["kind"] == "grid"]
    assert len(g) >= 40
    assert all(0.3 <= c["temperature"] <= 1.0 for c in g)
    assert {c["batch"] for c in g} == set(grid.BATCHES)
    assert {c["workload"] for c in g} == {w for w, _ in grid.workloads()}  # every workload alone, and mixed
    assert 0.4 <= np.mean([c["sts"] for c in g]) <= 0.6
    assert 0.4 <= np.mean([c["cost_profile"] is not None for c in g]) <= 0.6
    temps = sorted(c["temperature"] for c in g[:8])  # one per stratum of each block of 8
    assert all(0.3 + 0.7 * i / 8 - 0.01 <= t <= 0.3 + 0.7 * (i + 1) / 8 + 0.01 for i, t in enumerate(temps))
    assert len({grid.config_hash(c, "x") for c in score}) == len(score)


def test_clopper_pearson_matches_the_closed_forms(report):
    lo, hi = report.clopper_pearson(0, 10)
    assert lo == 0.0 and hi == pytest.approx(1 - 0.025 ** (1 / 10), rel=1e-9)
    lo, hi = report.clopper_pearson(40, 40)
    assert hi == 1.0 and lo == pytest.approx(0.025 ** (1 / 40), rel=1e-9)
    lo, hi = report.clopper_pearson(5, 10)
    assert lo == pytest.approx(0.187086, abs=1e-5) and hi == pytest.approx(0.812914, abs=1e-5)
    p = report.pooled([True] * 38 + [False] * 2)
    assert (p["k"], p["n"]) == (38, 40) and p["cp_lo"] < 0.95 < p["cp_hi"]


def _pair(tmp_path: Path, seed: int = 3):
    sim = simulate(n_requests=30, seed=seed, run_id="k")
    truth = sim.tables["request_steps"]
    comp = compact_view(truth).assign(run_id="c")
    kdb, cdb = tmp_path / "truth.duckdb", tmp_path / "compact.duckdb"
    Store(kdb).append({"request_steps": truth})
    Store(cdb).append({"request_steps": comp})
    return truth, str(cdb), str(kdb)


def test_paired_truth_reads_the_ceiling_of_every_compact_block(tmp_path, report):
    truth, cdb, kdb = _pair(tmp_path)
    t = report.paired_truth(cdb, kdb)
    K, c = truth.ceiling.to_numpy(float), truth.correct_drafts.to_numpy(float)
    assert t["n_blocks"] == len(truth) and t["pair_mismatch"] == 0 and t["pair_missing"] == 0
    assert t["mean_ceiling"] == pytest.approx(K.mean(), rel=1e-12)
    assert t["utilization"] == pytest.approx((c + 1).sum() / (K + 1).sum(), rel=1e-12)
    assert t["mean_ceiling_eos"] == pytest.approx(t["mean_ceiling"])  # no EOS given: nothing to cut
    eos = int(truth.draft_tokens.iloc[0][0])  # a token that is drafted: cutting at it lowers the mean
    cut = report.paired_truth(cdb, kdb, eos=[eos])
    assert cut["mean_ceiling_eos"] < t["mean_ceiling"] and cut["mean_ceiling"] == pytest.approx(t["mean_ceiling"], rel=1e-12)


def test_a_pair_that_did_not_commit_the_same_tokens_is_counted(tmp_path, report):
    truth, _, kdb = _pair(tmp_path)
    comp = compact_view(truth).assign(run_id="c")
    i = int(np.flatnonzero(comp.committed_tokens.map(len).to_numpy() > 0)[0])
    comp.at[i, "committed_tokens"] = [t + 1 for t in comp.committed_tokens.iloc[i]]
    cdb = tmp_path / "other.duckdb"
    Store(cdb).append({"request_steps": comp})
    assert report.paired_truth(str(cdb), kdb)["pair_mismatch"] == 1


def test_bounds_are_found_in_any_shape_and_scored_against_their_truth(report):
    est = {"tail": {"aggregate": [{"mean_ceiling": 2.0, "lo": 1.9, "hi": 2.1,
                                   "bounds": {"lo": 1.0, "hi": 3.5}}],
                    "summary": {"notes": ["hazards fitted on this run"],
                                "identified": {"mean_ceiling_lo": 2.2, "mean_ceiling_hi": 2.6}}},
           "utilization": {"by_group": [{"by": "run", "utilization": 0.8, "util_lo": 0.78, "util_hi": 0.82,
                                         "identified_lo": 0.5, "identified_hi": 0.79,
                                         "ceiling_bound_lo": 2.4, "ceiling_bound_hi": 2.45}]}}
    h = report.headline(est)
    paths = {b["path"] for b in h["bounds"]}
    assert paths == {"tail.aggregate[0].bounds", "tail.summary.identified.mean_ceiling", "utilization.run.identified",
                     "utilization.run.ceiling_bound"}
    truth = {"mean_ceiling": 2.5, "utilization": 0.81}
    s = report.score(truth, h)
    assert not s["covers"] and s["width"] == pytest.approx(0.2) and s["util_covers"]
    got = {b["path"]: (b["target"], b["contains"]) for b in s["bounds"]}
    assert got == {"tail.aggregate[0].bounds": ("mean_ceiling", True),
                   "tail.summary.identified.mean_ceiling": ("mean_ceiling", True),
                   "utilization.run.identified": ("utilization", False),
                   "utilization.run.ceiling_bound": ("mean_ceiling", False)}
    assert s["bounds_contain"] is False


def test_summary_pools_configurations_and_fits_the_width_curve(report):
    rows = []
    for i, n in enumerate((5, 10, 20, 40, 80)):
        w = 1.0 / np.sqrt(n)
        aud = {"fraction": 0.1, "n_audited": n, "tail": {"covers": True, "util_covers": True, "width": w},
               "sampling": {"covers": i != 0, "util_covers": True, "width": 2 * w}}
        cfg = {"temperature": 0.3 + 0.15 * i, "batch": 8, "workload": "math", "sts": i > 2, "cost_profile": None}
        rows.append({"config": cfg, "compact": {"covers": i % 2 == 0, "util_covers": True, "width": 0.1 * (i + 1), "bias": 0.0,
                                 "util_width": 0.01}, "audits": [aud]})
    s = report.summarize(rows, [0.1])
    assert (s["compact"]["mean_ceiling"]["k"], s["compact"]["mean_ceiling"]["n"]) == (3, 5)
    assert s["compact"]["median_width"] == pytest.approx(0.3)
    assert s["audit"]["0.1"]["sampling"]["mean_ceiling"]["k"] == 4
    sts = {x["level"]: x["mean_ceiling"]["k"] for x in s["by_factor"] if x["factor"] == "sts"}
    assert sts == {"off": 2, "on": 1}  # rows 0, 2 cover with STS off; row 4 with it on
    fit = s["width_curve"]["tail"]["fit"]
    assert fit["c"] == pytest.approx(1.0) and fit["free_slope"] == pytest.approx(-0.5)
    md = report.markdown({"summary": s, "rows": [], "meta": {
        "split": "score", "estimator": "x|y", "engine_commit": "abc", "seeds": [1, 2], "other_split_seeds": [3, 4],
        "truth_key": "mean_ceiling", "timing": {}, "command": "python bench/paired_grid.py"}})
    assert "3/5 = 60%" in md and "x\\|y" in md
