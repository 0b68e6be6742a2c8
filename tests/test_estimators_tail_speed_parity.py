"""The vectorised tail-estimator plumbing gives the same answers as before it was made fast.

* frame arrays, the committed stream and the walk are pinned by digests of what the pre-speed-up
  implementation produced on a small seeded stream (DataFrame, sorted Arrow and shuffled Arrow
  input; every walk mode);
* ``TailEstimator.estimate`` is checked against a direct, unchunked assembly of the same
  statistics (the pre-speed-up ``estimate`` body), whatever the chunking and the input type, so
  the check survives changes to the statistics themselves;
* the one-pass ``HazardModel._bin_index``, the matrix-free logistic ``HazardModel._linear`` and
  ``padded`` against naive references.
"""

from __future__ import annotations

import hashlib

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from acceptscope.estimators.frame import BlockFrame, padded
from acceptscope.estimators.hazard import HazardModel
from acceptscope.estimators.synthetic import compact_view, simulate
from acceptscope.estimators.margin import shift_hazards
from acceptscope.estimators.tail import TailEstimator, _block_uniforms, quantile_intervals, walk
from tests._close import assert_close

# digests of the pre-speed-up implementation's outputs on `_stream()` (see `_digest`)
PINNED = {
    "frame_pandas": "7638b7e464e23303", "frame_arrow": "7638b7e464e23303",
    "frame_arrow_unsorted": "8faa5cc6994a3dad", "walk_logprob": "99cda1a24cd53599",
    "walk_confidence": "60cc815232995f04", "walk_gather": "cf38559e6b770a44",
    "walk_no_exact_first": "c53cd9972a2b2d21",
}


def _digest(arrays) -> str:
    h = hashlib.sha256()
    for a in arrays:
        a = np.asarray(a)
        if a.dtype.kind == "f":
            a = np.where(np.isnan(a), -12345.0, np.round(a, 9)).astype(np.float64)
        else:
            a = a.astype(np.int8 if a.dtype.kind == "b" else np.int64)
        h.update(str(a.shape).encode())
        h.update(np.ascontiguousarray(a).tobytes())
    return h.hexdigest()[:16]


@pytest.fixture(scope="module")
def stream():
    sim = simulate(n_requests=60, seed=11)
    comp = compact_view(sim.tables["request_steps"])
    gather = {"gather": sim.tables["estimator_gather"], "rows": sim.tables["estimator_rows"]}
    return sim, comp, gather


def test_frame_and_stream_match_pinned(stream):
    sim, comp, _ = stream
    inputs = {"frame_pandas": comp,
              "frame_arrow": pa.Table.from_pandas(comp.sort_values(["rid", "step_index"]), preserve_index=False),
              "frame_arrow_unsorted": pa.Table.from_pandas(sim.tables["request_steps"].sample(frac=1, random_state=1),
                                                           preserve_index=False)}
    for name, data in inputs.items():
        fr = BlockFrame.from_request_steps(data)
        st, lt = fr.stream(), fr.later(np.flatnonzero(fr.censored))
        got = _digest([fr.draft, fr.committed, fr.confidence, fr.draft_logprob, fr.target_logprob, fr.window,
                       fr.correct, fr.prefix, fr.bonus, fr.request, fr.segment,
                       *[st[k] for k in sorted(st)], *[lt[k] for k in sorted(lt)]])
        assert got == PINNED[name], name


def test_walk_matches_pinned(stream):
    _, comp, gather = stream
    fr = BlockFrame.from_request_steps(comp)
    rows = np.flatnonzero(fr.censored)
    for name, kw in (("walk_logprob", {}), ("walk_confidence", dict(use_logprobs=False)),
                     ("walk_gather", dict(gather=gather)), ("walk_no_exact_first", dict(exact_first=False))):
        wk = walk(fr, rows, **kw)
        assert wk["state"].dtype == np.int64 and wk["walked"].dtype == np.int64
        assert _digest([wk[k] for k in ("h", "walked", "path_ok", "state", "has_q")]) == PINNED[name], name


def _direct(est: TailEstimator, frame: BlockFrame, gather=None, seed: int = 0):
    """The pre-speed-up ``estimate`` body: every censored row at once, columns assembled one by one."""
    G, n = frame.gamma, frame.n
    cens = frame.censored
    rows = np.flatnonzero(cens)
    wk = est._walk(frame, rows, gather)
    Hk = wk["h"]
    pmf = np.zeros((n, G + 1))
    pmf[np.flatnonzero(~cens), frame.correct[~cens]] = 1.0
    Hm = est.hazard.predict(frame, rows, wk["state"])
    prior = est.prior_  # hazards fitted without truth: the unobserved-position prior
    lp_rows = ~np.isnan(frame.draft_logprob).all(1)
    lp_rows[rows] |= wk["has_q"]
    lp = ~frame.greedy[rows] & lp_rows[rows] & (est.mode != "confidence")  # the blocks the prior shifts

    def shifted(d):
        return np.where(lp[:, None], shift_hazards(Hm, d), Hm)

    pm, mean_c, var_c = est._pmf(frame, rows, Hk, shifted(prior.center) if prior else Hm)
    sens = [est._pmf(frame, rows, Hk, shifted(d))[1] for d in prior.band()] if prior else [mean_c, mean_c]
    pmf[rows] = pm
    mean, var = frame.correct.astype(float), np.zeros(n)
    mean[rows], var[rows] = mean_c, var_c
    tail = np.arange(G)[None, :] >= frame.window[rows][:, None]
    known = ~np.isnan(Hk)
    lead1 = np.cumprod(np.where(tail, known & (Hk == 1.0), True), 1).astype(bool) & tail
    notzero = np.cumprod(np.where(tail, ~(known & (Hk == 0.0)), True), 1).astype(bool) & tail
    has_lp = ~np.isnan(frame.draft_logprob).all(1)
    has_lp[rows] |= wk["has_q"]
    df = frame.df
    b = pd.DataFrame({
        "run_id": df["run_id"].array, "rid": df["rid"].array, "forward_ct": df["forward_ct"].to_numpy(),
        "rank": df["rank"].to_numpy(), "epoch": df["epoch"].to_numpy(),
        "workload": df["workload"].array if "workload" in df else None,
        "temperature": frame.temperature, "window": frame.window, "correct": frame.correct,
        "acc_len": frame.correct + 1, "censored": cens,
        "mode": np.where(~cens, "exact-in-window", np.where(frame.greedy, "greedy", np.where(
            has_lp & (est.mode != "confidence"), "logprob", "confidence"))),
        "mean": mean, "var": var})
    for col, v in (("bound_lo", lead1), ("bound_hi", notzero)):
        b[col] = frame.correct.copy()
        b.loc[rows, col] = frame.window[rows] + v.sum(1)
    resolved = (b.bound_lo == b.bound_hi).to_numpy()
    for col, v in (("sens_lo", sens[0]), ("sens_hi", sens[1])):  # a resolved block has its bound whatever the model
        b[col] = mean.copy()
        b.loc[rows, col] = np.where(resolved[rows], mean[rows], v)
    b["resolved"] = resolved
    b["walked"] = 0
    b.loc[rows, "walked"] = wk["walked"]
    u = _block_uniforms(frame, rows, seed)
    for L, (lo, hi, m) in quantile_intervals(pmf[rows], est.levels, est.interval, u).items():
        tag = int(round(L * 100))
        for name, exact, v in (("lo", frame.correct, lo), ("hi", frame.correct, hi), ("mass", np.ones(n), m)):
            col = exact.copy()
            col[rows] = v
            b[f"{name}{tag}"] = col
    if frame.has_truth.any():
        b["truth"] = np.where(frame.has_truth, frame.ceiling, np.nan)
    return b, pmf


@pytest.mark.parametrize("kw, use_gather", [({}, False), (dict(mode="confidence"), False), ({}, True),
                                            (dict(interval="nearest", exact_first=False), False),
                                            (dict(hazard=HazardModel(method="binned")), False),
                                            (dict(hazard=HazardModel(method="logistic")), False)])
def test_estimate_matches_direct_assembly_whatever_the_chunking(stream, kw, use_gather):
    sim, comp, gather = stream
    g = gather if use_gather else None
    est = TailEstimator(**kw).fit(simulate(n_requests=60, seed=12).tables["request_steps"], gather=g)
    frame = BlockFrame.from_request_steps(comp, gamma=sim.gamma)
    want, want_pmf = _direct(est, frame, g, seed=3)
    arrow = pa.Table.from_pandas(comp.sort_values(["rid", "step_index"]), preserve_index=False)
    for data, chunk_rows in ((frame, 1 << 20), (comp, 37), (arrow, 101)):
        res = est.estimate(data, gamma=sim.gamma, gather=g, seed=3, chunk_rows=chunk_rows)
        pd.testing.assert_frame_equal(res.blocks, want, check_dtype=False, check_exact=False, rtol=1e-12,
                                      atol=1e-12)
        assert (res.blocks.dtypes.drop("mode") == want.dtypes.drop("mode")).all()
        assert_close(res.pmf, want_pmf)


def test_estimate_hazard_boot_path_runs(stream):
    sim, comp, _ = stream
    est = TailEstimator(hazard=HazardModel(method="binned")).fit(simulate(n_requests=60, seed=12).tables["request_steps"])
    res = est.estimate(comp, gamma=sim.gamma, hazard_boot=3, seed=1)
    assert res._boot["means"].shape == (3, len(res.blocks))
    assert np.array_equal(res._boot["means"][:, ~res.blocks.censored.to_numpy()],
                          np.broadcast_to(res.blocks["mean"].to_numpy()[~res.blocks.censored.to_numpy()],
                                          (3, int((~res.blocks.censored).sum()))))


def test_bin_index_matches_per_position_searchsorted(stream):
    sim, *_ = stream
    hm = HazardModel(method="binned").fit(BlockFrame.from_request_steps(sim.tables["request_steps"]))
    rng = np.random.default_rng(0)
    edges = np.concatenate([hm.edges_[kk] for kk in range(hm.gamma_)])
    x = np.concatenate([rng.normal(0, 3, 5000), edges, [np.nan, -np.inf, np.inf]])  # edges themselves: ties
    k = rng.integers(0, hm.gamma_, x.size)
    want = np.array([np.searchsorted(hm.edges_[kk], xx, side="right") for kk, xx in zip(k, x)])
    assert_close(hm._bin_index(k, x), want)


def test_logistic_predict_matches_design_matrix_product(stream):
    sim, comp, _ = stream
    hm = HazardModel(method="logistic").fit(BlockFrame.from_request_steps(sim.tables["request_steps"]))
    rng = np.random.default_rng(1)
    k = rng.integers(0, hm.gamma_, 4000)
    st = rng.integers(0, hm.NSTATE, 4000)
    x = rng.normal(0, 3, 4000)
    for coef in hm.coef_.values():
        np.testing.assert_allclose(hm._linear(k, x, st, coef), hm._design(k, x, st) @ coef, rtol=1e-12, atol=1e-12)


def test_padded_matches_per_row_reference():
    rows = [[1, 2, 3], None, [4, None], [], [5, 6, 7, 8, 9], [10]]
    for typ, fill in ((pa.int64(), -1), (pa.float32(), np.nan)):
        arr = pa.array(rows, pa.list_(typ))
        chunked = pa.chunked_array([arr.slice(0, 2), arr.slice(2, 3), arr.slice(5)])
        want = np.full((len(rows), 4), fill, float)
        for i, r in enumerate(rows):
            for j, v in enumerate((r or [])[:4]):
                want[i, j] = fill if v is None else v
        for a in (arr, chunked, pd.Series(rows, dtype=object)):
            got = padded(a, 4, fill, np.float64)
            assert_close(got, want)
        fixed = pa.chunked_array([pa.array([[1, None], [3, 4]], pa.list_(typ)), pa.array([[5, 6]], pa.list_(typ))])
        assert_close(padded(fixed, 2, fill, np.float64), [[1, fill], [3, 4], [5, 6]])


def test_arrow_input_gives_the_pandas_frame(stream):
    """Arrow input is read column by column (no DataFrame unless asked): two runs, NULL workloads,
    shuffled rows, give the same arrays, workload codes and (lazily built) ``df`` as DataFrame input."""
    sim, comp, _ = stream
    two = pd.concat([comp, comp.assign(run_id="other")], ignore_index=True)
    two["workload"] = two["workload"].astype(object).where(two.index % 3 != 0, None)
    two = two.sample(frac=1, random_state=2).reset_index(drop=True)
    fp = BlockFrame.from_request_steps(two, gamma=sim.gamma)
    fa = BlockFrame.from_request_steps(pa.Table.from_pandas(two, preserve_index=False), gamma=sim.gamma)
    assert fa._df is None  # not built until asked
    for name in ("draft", "committed", "confidence", "draft_logprob", "target_logprob", "window", "correct",
                 "cap_trim", "ceiling", "prefix", "bonus", "temperature", "request", "segment", "finished",
                 "forward_ct", "workload"):
        assert_close(getattr(fa, name), getattr(fp, name), where=name)
    assert (fa.workload == "(unlabelled)").sum() == two["workload"].isna().sum() > 0
    assert fa.request.max() + 1 == two.groupby(["run_id", "rid"]).ngroups
    cols = ["run_id", "rid", "forward_ct", "rank", "epoch", "workload"]
    part = fa.pandas_columns(cols)
    assert fa._df is None
    pd.testing.assert_frame_equal(part, fa.df[cols])
    pd.testing.assert_frame_equal(fa.df[cols], fp.df[cols], check_dtype=False)


def test_chunked_arrow_lists_read_in_place_match_padding(stream):
    """Arrow list columns left unpadded (committed tokens, confidences, log-probs: read per chunk,
    only where needed) give the pinned frame, stream and walk, and the same estimate as padding
    them, however the table is chunked (chunk edges mid-request) and with NULL log-probs."""
    sim, comp, _ = stream
    tbl = pa.Table.from_pandas(comp.sort_values(["rid", "step_index"]), preserve_index=False)
    tlp = tbl.column("target_logprob").combine_chunks()
    with_nulls = pa.array([None if i % 3 == 0 else v for i, v in enumerate(tlp.values.to_pylist())], tlp.type.value_type)
    tbl_nulls = tbl.set_column(tbl.schema.get_field_index("target_logprob"), "target_logprob",
                               pa.ListArray.from_arrays(tlp.offsets, with_nulls))
    est = TailEstimator().fit(simulate(n_requests=60, seed=12).tables["request_steps"])
    shuffled = pa.Table.from_pandas(comp.sample(frac=1, random_state=2), preserve_index=False)
    for base in (tbl, tbl_nulls, shuffled):
        want_frame = BlockFrame.from_request_steps(base.to_pandas(), gamma=sim.gamma)  # padded eagerly
        want = est.estimate(want_frame)
        for size in (None, 37, 1000):
            data = base if size is None else pa.Table.from_batches(base.to_batches(max_chunksize=size))
            fr = BlockFrame.from_request_steps(data, gamma=sim.gamma)
            rows = np.flatnonzero(fr.censored)
            for name in ("confidence", "draft_logprob", "target_logprob", "committed"):
                assert_close(fr.list_rows(name, rows), getattr(want_frame, name)[rows])
            st, st_want = fr.stream(), want_frame.stream()
            for k in st_want:
                assert_close(st[k], st_want[k], where=k)
            if base is tbl:
                lt = fr.later(rows)
                got = _digest([fr.draft, fr.committed, fr.confidence, fr.draft_logprob, fr.target_logprob, fr.window,
                               fr.correct, fr.prefix, fr.bonus, fr.request, fr.segment,
                               *[st[k] for k in sorted(st)], *[lt[k] for k in sorted(lt)]])
                assert got == PINNED["frame_arrow"], size
            res = est.estimate(data, gamma=sim.gamma)
            pd.testing.assert_frame_equal(res.blocks.drop(columns=["run_id", "rid", "workload"]),
                                          want.blocks.drop(columns=["run_id", "rid", "workload"]),
                                          check_exact=False, rtol=1e-12, atol=1e-12)
            assert_close(res.pmf, want.pmf)
