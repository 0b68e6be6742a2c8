"""The streaming estimator pass (estimators.stream) and the request-keyed bootstrap (estimators.bootstrap)."""

import json
import re

import numpy as np
import pandas as pd
import pytest

from acceptscope.store import Store
from acceptscope.estimators.frame import NO_WORKLOAD
from acceptscope.estimators import run_all, to_jsonable
from acceptscope.estimators.bootstrap import aggregate_stats, poisson_weights, request_keys, request_stats
from acceptscope.estimators.stream import run_all_stream
from acceptscope.estimators.synthetic import compact_view, simulate
from tests._close import assert_close


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    st = Store(tmp_path_factory.mktemp("stream") / "s.duckdb")
    st.append(simulate(n_requests=60, seed=1).tables)  # syn-cap: truth
    t = dict(simulate(n_requests=50, seed=2, run_id="syn-c").tables)
    rs = compact_view(t["request_steps"])
    rs.loc[rs.rid.isin(["r3", "r7"]), "workload"] = None  # a NULL workload is a group of its own
    t["request_steps"], t["runs"] = rs, t["runs"].assign(arm="compact")
    st.append(t)
    return st


def _drop_timings(j):
    j = json.loads(json.dumps(j))
    j.get("calibration", {}).pop("fit_seconds", None)
    return j


def test_stream_equals_in_memory_and_does_not_depend_on_chunking(store):
    whole = run_all_stream(store, n_boot=40, chunk_rows=1 << 20)
    small = run_all_stream(store, n_boot=40, chunk_rows=250)  # several chunks per run
    for rid in ("syn-cap", "syn-c"):
        mem = to_jsonable(run_all(store, rid, n_boot=40))
        a, b = to_jsonable(whole[rid]), to_jsonable(small[rid])
        assert_close(a["tail"]["aggregate"], mem["tail"]["aggregate"], rtol=1e-12)
        pd.testing.assert_frame_equal(pd.DataFrame(b["tail"]["aggregate"]), pd.DataFrame(a["tail"]["aggregate"]),
                                      check_exact=False, rtol=1e-12)  # 250-row chunks: the same intervals
        assert a["tail"]["summary"]["n_censored"] == mem["tail"]["summary"]["n_censored"] > 0
        assert_close(_drop_timings(a)["calibration"], _drop_timings(mem)["calibration"], rtol=1e-12)
        ra, rb = whole[rid]["tail"].aggregate(by="workload", n_boot=60, target="population"), \
            small[rid]["tail"].aggregate(by="workload", n_boot=60, target="population")
        pd.testing.assert_frame_equal(ra, rb, check_exact=False, rtol=1e-12)
        ua = pd.DataFrame(a["utilization"]["by_group"]).set_index(["by", "group"])
        um = pd.DataFrame(mem["utilization"]["by_group"]).set_index(["by", "group"])
        common = um.index.intersection(ua.index)
        assert len(common) >= 3
        pd.testing.assert_frame_equal(ua.loc[common], um.loc[common], check_exact=False, rtol=1e-9)
    agg = small["syn-c"]["tail"].aggregate(by="workload", n_boot=40)
    assert NO_WORKLOAD in set(agg.workload) and (agg.lo <= agg.mean_ceiling).all() and (agg.mean_ceiling <= agg.hi).all()
    assert any("chunks of whole requests" in n for n in small["syn-c"]["tail"].notes)


def test_bootstrap_draws_are_keyed_by_request_not_position():
    k = request_keys(["run"] * 4, ["a", "b", "c", "d"])
    assert np.array_equal(poisson_weights(k, 3, seed=5)[::-1], poisson_weights(k[::-1], 3, seed=5))
    w = np.concatenate([poisson_weights(request_keys(["r"] * 20000, [f"q{i}" for i in range(20000)]), i) for i in range(3)])
    assert abs(w.mean() - 1) < 0.02 and abs(w.var() - 1) < 0.05  # Poisson(1)
    b = pd.DataFrame({"run_id": "r", "rid": np.repeat([f"q{i}" for i in range(50)], 3),
                      "workload": np.tile(["x", "y", None], 50), "mean": np.linspace(0, 3, 150),
                      "var": 0.1, "censored": True})
    shuffled = b.sample(frac=1.0, random_state=0)
    a1 = aggregate_stats(request_stats(b, ["workload"]), ["workload"], n_boot=80, target="population")
    a2 = aggregate_stats(request_stats(shuffled, ["workload"]), ["workload"], n_boot=80, target="population")
    pd.testing.assert_frame_equal(a1, a2, check_exact=False, rtol=1e-12)
    assert a1.workload.tolist() == ["None", "x", "y"] and (a1.hi > a1.lo).all()


def test_cluster_weights_are_shared_per_cluster_and_keyed_by_it():
    from acceptscope.estimators.bootstrap import cluster_weights

    g = np.array(["a", "b", "a", "c", "b", "a"], dtype=object)
    W = cluster_weights(g, 50, seed=3)
    assert W.shape == (50, 6)
    assert np.array_equal(W[:, 0], W[:, 2]) and np.array_equal(W[:, 0], W[:, 5]) and np.array_equal(W[:, 1], W[:, 4])
    # a cluster's draws do not depend on row order or on the other clusters present
    assert np.array_equal(cluster_weights(g[::-1], 50, seed=3)[:, ::-1], W)
    assert np.array_equal(cluster_weights(np.array(["c"], dtype=object), 50, seed=3)[:, 0], W[:, 3])
    assert not np.array_equal(cluster_weights(g, 50, seed=4), W)


def test_logistic_hazard_fit_on_distinct_rows_equals_the_row_by_row_fit():
    """The fit on distinct design rows (summed weights) optimises the same objective as one row per
    training position: the penalised objective at its solution equals the row-by-row fit's (scikit-learn's lbfgs
    at a tight tolerance; to 1e-9), and Newton's optimum is never worse."""
    from acceptscope.estimators.frame import BlockFrame
    from acceptscope.estimators.tail import TailEstimator

    rs = compact_view(simulate(n_requests=60, seed=4).tables["request_steps"])
    est = TailEstimator().fit(BlockFrame.from_request_steps(rs))  # observed source: many repeated rows
    L = est.hazard._train
    cells = L["_logistic_cells"]
    for g, (m, cell, X) in cells.items():  # every position maps to its own design row
        assert X.shape[0] <= m.size
        assert_close(X[cell], est.hazard._design(L["k"][m], L["x"][m], L["state"][m], L["t"][m],
                                                                  L["w"][m], g))
    from sklearn.linear_model import LogisticRegression

    # the base fit with the production solver settings, one row per training position
    for g, coef in est.hazard.coef_.items():
        sel = L["greedy"] == g
        X = est.hazard._design(L["k"][sel], L["x"][sel], L["state"][sel], L["t"][sel], L["w"][sel], g)
        y, w = L["y"][sel], L["wt"][sel]
        Xd, yd = np.concatenate([X, X]), np.concatenate([np.ones(y.size), np.zeros(y.size)])
        wd = np.concatenate([w * y, w * (1 - y)])
        keep = wd > 0
        lr = LogisticRegression(C=10.0, fit_intercept=False, max_iter=10_000, tol=1e-12).fit(
            Xd[keep], yd[keep], sample_weight=wd[keep])

        def objective(c):  # sklearn's: mean weighted log-loss + ||c||^2 / (2 C sum(w))
            z = Xd[keep] @ c
            ll = np.logaddexp(0, z) - yd[keep] * z
            return (wd[keep] * ll).sum() / wd[keep].sum() + c @ c / (2 * 10.0 * wd[keep].sum())

        assert objective(coef) == pytest.approx(objective(lr.coef_[0]), rel=1e-9)
        assert objective(coef) <= objective(lr.coef_[0]) * (1 + 1e-12)


def test_big_run_keeps_replicate_sums_not_per_request_statistics(store, monkeypatch):
    """Past ``sample_rows`` a run keeps only the keyed bootstrap's per-replicate partial sums, added
    chunk by chunk (memory flat in rows): the same aggregates as the per-request statistics."""
    kept = run_all_stream(store, n_boot=40, chunk_rows=250)
    monkeypatch.setattr("acceptscope.estimators.accumulator.FOLD_CHUNKS", 2)  # per-chunk group sums folded as they come
    flat = run_all_stream(store, n_boot=40, chunk_rows=250, sample_rows=100)  # every run "big" here
    for rid in ("syn-cap", "syn-c"):
        t, k = flat[rid]["tail"], kept[rid]["tail"]
        assert t.stats == {} and len(t.sums) >= 4 and all(len(v) == 1 for v in t.sums.values())
        pd.testing.assert_frame_equal(t.aggregate(), k.aggregate(), check_exact=False, rtol=1e-12)
        for by in ("workload", "band"):
            pd.testing.assert_frame_equal(t.aggregate(by=by, n_boot=200), k.aggregate(by=by, n_boot=200),
                                          check_exact=False, rtol=1e-12)
        ua = pd.DataFrame(to_jsonable(flat[rid])["utilization"]["by_group"])
        ub = pd.DataFrame(to_jsonable(kept[rid])["utilization"]["by_group"])
        pd.testing.assert_frame_equal(ua, ub, check_exact=False, rtol=1e-12)
        with pytest.raises(ValueError, match="aggregates"):
            t.aggregate(by="workload", n_boot=60, target="population")


def _assert_same(a, b, path=""):
    """Equal JSON documents; floats to 1e-12 relative (summation order: the utilization sums)."""
    if isinstance(a, dict):
        assert isinstance(b, dict) and sorted(a) == sorted(b), path
        for k in a:
            _assert_same(a[k], b[k], f"{path}/{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            _assert_same(x, y, f"{path}[{i}]")
    elif isinstance(a, float) and isinstance(b, float):
        assert a == pytest.approx(b, rel=1e-12, nan_ok=True), path
    else:
        assert a == b, path


def test_many_runs_in_one_ordered_pass_equal_run_all_one_run_at_a_time(store, monkeypatch):
    """``run_all_runs``: one scan of ``request_steps`` for every (small) run, each run one chunk: the
    same JSON as ``run_all`` per run (calibration fit time aside; utilization sums to 1e-12: summation
    order); an unknown run maps to its error."""
    import acceptscope.estimators.stream as stream
    from acceptscope.estimators import run_all_runs

    scans = []
    real = stream.request_chunks
    monkeypatch.setattr(stream, "request_chunks", lambda *a, **k: scans.append(list(a[1])) or real(*a, **k))
    many = run_all_runs(store, ["syn-cap", "syn-c", "nope"], n_boot=40)
    assert scans == [["syn-c", "syn-cap"]] or scans == [["syn-cap", "syn-c"]]
    for rid in ("syn-cap", "syn-c"):
        _assert_same(_drop_timings(to_jsonable(many[rid])), _drop_timings(to_jsonable(run_all(store, rid, n_boot=40))))
    assert isinstance(many["nope"], KeyError) and "nope" in str(many["nope"])


def test_many_runs_read_temperatures_as_run_all_on_sglang_ingested_runs(tmp_path):
    """SGLang dumps carry no temperature: a run's temperature set after its rows (``update_run``, as
    ``ingest --temperature`` does) fills them where written (acceptscope.domain.temperature), the other
    runs' stay unknown; the one-pass JSON equals ``run_all``'s on the ingested fixtures."""
    from typer.testing import CliRunner

    from acceptscope.cli import app
    from acceptscope.domain.locations import REPO_ROOT
    from acceptscope.estimators import run_all_runs

    db = tmp_path / "sgl.duckdb"
    res = CliRunner().invoke(app, ["ingest", str(REPO_ROOT / "fixtures" / "sglang"), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    greedy = Store(db).runs().run_id.min()  # one run served greedy (a run-level temperature, none per request-step)
    assert Store(db).update_run(greedy, {"temperature": 0}) == 1
    st = Store(db, read_only=True)
    ids = st.runs().run_id.tolist()
    nulls = st.query_df("SELECT run_id, count(*) FILTER (WHERE temperature IS NULL) AS n, count(*) FILTER "
                        "(WHERE temperature = 0) AS z FROM request_steps GROUP BY run_id").set_index("run_id")
    assert nulls.n[greedy] == 0 and nulls.z[greedy] > 0 and nulls.drop(greedy).n.sum() > 0
    many = run_all_runs(st, ids, n_boot=40)
    for rid in ids:
        one = run_all(st, rid, n_boot=40)
        _assert_same(_drop_timings(to_jsonable(many[rid])), _drop_timings(to_jsonable(one)))


def test_step_sizes_lookup_equals_the_multiindex_reindex():
    """``StepSizes``: the compact per-step batch sizes give what a MultiIndex reindex gave, missing
    steps (and keys outside the table's range) NaN, the first row of a repeated key winning."""
    from acceptscope.estimators.accumulator import StepSizes

    rng = np.random.default_rng(3)
    d = pd.DataFrame({"rank": rng.integers(0, 3, 500), "epoch": rng.integers(0, 2, 500),
                      "forward_ct": rng.integers(100, 400, 500), "bs": rng.integers(1, 257, 500)})
    q = (rng.integers(-1, 4, 2000), rng.integers(0, 3, 2000), rng.integers(90, 420, 2000))
    want = d.drop_duplicates(["rank", "epoch", "forward_ct"]).set_index(["rank", "epoch", "forward_ct"])["bs"] \
        .reindex(pd.MultiIndex.from_arrays(q)).to_numpy(float)
    got = StepSizes(d).lookup(*q)
    assert_close(got, want)
    assert np.isnan(got).any() and (~np.isnan(got)).sum() > 100


def test_big_run_steps_are_read_at_the_end_not_held(store, monkeypatch):
    """Past ``COST_STEPS`` decode steps a run's ``steps`` are not held through the pass: batch sizes
    only (compactly), the cost fit on a stable hash-sample of steps read at the end, the planner
    window found and read in DuckDB. Tail and utilization are unchanged; the window's steps equal
    what the whole-table computation selects."""
    import acceptscope.estimators.pipeline as pipeline
    import acceptscope.estimators.stream as stream

    held = run_all_stream(store, n_boot=40, chunk_rows=250)
    n_steps = pipeline.count_steps(store, "syn-c")
    monkeypatch.setattr(stream, "COST_STEPS", n_steps // 3)
    big = run_all_stream(store, n_boot=40, chunk_rows=250)
    for rid in ("syn-cap", "syn-c"):
        a, b = to_jsonable(held[rid]), to_jsonable(big[rid])
        _assert_same(a["tail"], b["tail"])
        _assert_same(a["utilization"], b["utilization"])
        note = [x for x in b["cost"]["notes"] if "hash-sample" in x]
        assert note and 0 < b["cost"]["n_steps"] < a["cost"]["n_steps"]
        assert b["planner"]["summary"]["audited_steps"] > 0
    steps = pipeline.read_steps(store, "syn-c")
    per = steps.sort_values(["epoch", "forward_ct"]).groupby(["epoch", "forward_ct"])["bs"].max().fillna(0).cumsum()
    for max_rows in (1, 300, 10 ** 9):
        upto = per[per <= max_rows].index
        last, win = stream.window_steps(store, "syn-c", max_rows, None)
        assert last == (upto[-1] if len(upto) else per.index[0])
        want = steps[steps.set_index(["epoch", "forward_ct"]).index.isin(upto if len(upto) else [last])]
        pd.testing.assert_frame_equal(win.reset_index(drop=True), want.reset_index(drop=True), check_dtype=False)


def test_read_request_steps_fills_temperature_request_first_then_run_in_stored_order(tmp_path):
    """The one temperature rule, applied where the data is written (``acceptscope.domain.temperature``): a
    request-step's own temperature, else its request's, else its run's; ``read_request_steps`` returns the
    stored rows in stored order with the record model's types, as ``Store.read_table`` returns them."""
    from acceptscope.estimators.run_data import read_request_steps

    st = Store(tmp_path / "t.duckdb")
    t = dict(simulate(n_requests=12, seed=4, run_id="t-run").tables)
    rs = t["request_steps"].sample(frac=1.0, random_state=0).reset_index(drop=True)  # a stored order not by key
    rs["temperature"] = np.where(rs.rid == "r1", 0.3, np.nan)  # r1 keeps its own
    t["request_steps"], t["runs"] = rs, t["runs"].assign(temperature=1.0)
    t["requests"] = t["requests"].assign(temperature=np.where(t["requests"].rid.isin(["r1", "r2"]), 0.7, np.nan))
    st.append(t)
    plain = st.read_table("request_steps", "t-run")
    got = read_request_steps(st, "t-run")
    assert list(got.columns) == list(plain.columns) and list(got.dtypes) == list(plain.dtypes)
    assert got.rid.tolist() == plain.rid.tolist() and got.forward_ct.tolist() == plain.forward_ct.tolist()
    want = np.where(plain.rid == "r1", 0.3, np.where(plain.rid == "r2", 0.7, 1.0))
    assert_close(got.temperature.to_numpy(), want)
    pd.testing.assert_frame_equal(got.drop(columns="temperature"), plain.drop(columns="temperature"))
    only = read_request_steps(st, "t-run", columns=["rid", "temperature"])
    assert_close(only.temperature.to_numpy(), want)


def test_sort_memory_has_a_floor_and_grows_with_the_square_root_of_the_rows():
    """DuckDB's share for the sort by request: 256 MB up to ~6M request-steps (what every size up to
    10M sorted in), then with the square root of the rows (100M ran out of memory at 256 MB)."""
    from acceptscope.estimators.chunks import DUCKDB_MEMORY, sort_memory

    assert sort_memory(0) == sort_memory(1_000_000) == DUCKDB_MEMORY == "256MB"
    mb = [int(sort_memory(n)[:-2]) for n in (10_000_000, 40_000_000, 100_000_000, 400_000_000)]
    assert mb == sorted(mb) and mb[0] == 320 and abs(mb[1] / mb[0] - 2) < 0.01 and abs(mb[3] / mb[1] - 10 ** 0.5) < 0.01


def test_streamed_request_sample_equals_the_whole_table_selection(store):
    """The hazard sample's requests, chosen from per-request counts streamed in small batches
    (bounded memory), are exactly the lowest-uniform prefix chosen over all requests at once."""
    from acceptscope.estimators.bootstrap import uniforms
    from acceptscope.estimators.chunks import sample_requests

    runs = ["syn-c", "syn-cap"]
    d = store.query_df("SELECT run_id, rid, count(*) AS n FROM request_steps WHERE run_id IN ('syn-c', 'syn-cap') "
                       "GROUP BY ALL")
    d = d.iloc[np.argsort(uniforms(request_keys(d.run_id, d.rid), 0, 3, stream=3), kind="stable")]
    cum = np.cumsum(d.n.to_numpy())
    first = int(d.n.iloc[0])
    for max_rows in (first - 1, first, int(cum[len(cum) // 3]) + 1, int(cum[-1]) - 1):
        want = d[cum <= max_rows] if (cum <= max_rows).any() else d.iloc[:1]
        for batch_rows in (7, 1 << 16):
            got = sample_requests(store, runs, max_rows, 3, batch_rows=batch_rows).to_pandas()
            assert sorted(zip(got.run_id, got.rid)) == sorted(zip(want.run_id, want.rid)), (max_rows, batch_rows)
            assert len(want) >= 1
    assert sample_requests(store, runs, int(cum[-1]), 3, batch_rows=7) is None  # every request fits


def test_specs_differing_in_replicates_share_one_draw_bit_for_bit():
    """The accumulator computes the 400-replicate part once and cuts the 200-replicate part from it
    (grouping_sums): that must be exactly what replicate_sums gives for 200 replicates (run and
    population targets, a grouping with several groups)."""
    from acceptscope.estimators.accumulator import grouping_sums
    from acceptscope.estimators.bootstrap import replicate_sums

    rng = np.random.default_rng(3)
    n = 900
    blocks = pd.DataFrame({"run_id": "r", "rid": [f"q{i}" for i in rng.integers(0, 120, n)],
                           "workload": rng.choice(["a", "b", "c"], n), "mean": rng.random(n) * 4,
                           "var": rng.random(n), "censored": rng.random(n) < 0.4})
    for g in ((), ("workload",)):
        st = request_stats(blocks, list(g))
        specs = [(g, 200, t, 0) for t in ("run", "population")] + [(g, 400, t, 0) for t in ("run", "population")]
        got = dict(grouping_sums(st, g, specs))
        assert sorted(got) == sorted(specs)
        for sp in specs:
            want = replicate_sums(st, list(g), n_boot=sp[1], target=sp[2], seed=sp[3])
            assert np.array_equal(got[sp]["num"], want["num"]) and list(got[sp]["labels"]) == list(want["labels"])
            assert (got[sp]["den"] is None) == (want["den"] is None)
            if want["den"] is not None:
                assert np.array_equal(got[sp]["den"], want["den"])


def test_per_request_table_by_bincount_equals_the_groupby():
    """The accumulator's per-request utilization rows (bincount over request codes) equal the (run_id, rid)
    groupby they replace: order of first appearance, integer counts, float sums to 1e-12."""
    from acceptscope.estimators.accumulator import RunAccumulator

    rng = np.random.default_rng(8)
    n = 700
    df = pd.DataFrame({"run_id": "r", "rid": [f"q{i}" for i in rng.integers(0, 90, n)]})
    acc, ceil, window = rng.integers(1, 6, n), rng.random(n) * 5, rng.integers(1, 7, n)
    got = RunAccumulator._per_request(df, pd.factorize(df["rid"])[0], acc, ceil, window)
    base = df.assign(acc_len=acc, ceiling=ceil, window=window)
    want = base.groupby(["run_id", "rid"], sort=False).agg(n=("acc_len", "size"), committed=("acc_len", "sum"),
                                                            ceiling_tokens=("ceiling", "sum"), mean_window=("window", "mean"))
    want["ceiling_tokens"] += want["n"]
    pd.testing.assert_frame_equal(got, want.reset_index(), check_exact=False, rtol=1e-12, check_dtype=False)
    assert got["n"].dtype.kind == got["committed"].dtype.kind == "i"


def test_untrimmed_truth_runs_fail_their_hazard_fit_on_one_request(tmp_path, monkeypatch):
    """A static arm (every ceiling recorded, nothing trimmed) has no position past a window: fit_estimator
    reads one request for the hazard model's own error, not the whole sample, and the run's results say
    what a fit on all its rows says."""
    import acceptscope.estimators.pipeline as pl
    from acceptscope.estimators.frame import BlockFrame
    from acceptscope.estimators.tail import TailEstimator

    st = Store(tmp_path / "s.duckdb")
    t = dict(simulate(n_requests=30, seed=4, trim=False, run_id="syn-static").tables)
    t["runs"] = t["runs"].assign(arm="static")
    st.append(t)
    with pytest.raises(ValueError) as whole:
        TailEstimator().fit(BlockFrame.from_request_steps(st.read_table("request_steps", "syn-static"), gamma=7))
    seen, real = [], pl.read_sample
    monkeypatch.setattr(pl, "read_sample", lambda store, runs, n, **kw: seen.append(n) or real(store, runs, n, **kw))
    with pytest.raises(ValueError, match=re.escape(str(whole.value))):
        pl.fit_estimator(st, ("syn-static",), 7, 1 << 18, 0)
    assert seen == [1]
    res = run_all_stream(st, n_boot=20)["syn-static"]
    assert res["tail"].hazard_info["why"] == str(whole.value)


@pytest.mark.parametrize("big", [False, True])
def test_planner_window_kept_in_the_pass_equals_the_store_read(store, monkeypatch, big):
    """A run in several chunks audits its planner window on the request-steps the pass kept as its chunks
    went by (Window.keep): the same audit as reading the window from the store after the pass, whether
    the run's steps are held or (``big``) found in DuckDB."""
    import acceptscope.estimators.stream as stream

    monkeypatch.setattr(stream, "PLANNER_ROWS", 300)  # a window shorter than the runs
    if big:  # every run's steps past COST_STEPS: found and read in DuckDB
        from acceptscope.estimators.pipeline import count_steps
        monkeypatch.setattr(stream, "COST_STEPS", min(count_steps(store, r) for r in ("syn-cap", "syn-c")) // 3)
    kept = run_all_stream(store, n_boot=20, chunk_rows=250)
    monkeypatch.setattr(stream.Window, "keep", lambda self, tbl: None)  # nothing kept: read after the pass
    read = run_all_stream(store, n_boot=20, chunk_rows=250)
    for rid in ("syn-cap", "syn-c"):
        a, b = to_jsonable(kept[rid])["planner"], to_jsonable(read[rid])["planner"]
        _assert_same(a, b)
        assert 0 < a["summary"]["audited_request_steps"] < a["summary"]["request_steps"]


def test_runs_sorted_in_memory_give_the_pieces_of_duckdbs_ordered_scan(tmp_path):
    """A run read whole and put in order here (request_chunks, sort_rows) gives the pieces DuckDB's ordered
    scan gives, row for row, and fetch_by_request the table ORDER BY gives, also for rids beyond ASCII,
    rids that are prefixes of others and several runs in one result."""
    from acceptscope.estimators.chunks import ORDER, TAIL_COLUMNS, fetch_by_request, request_chunks, s_columns
    from acceptscope.store import fetch_arrow

    st = Store(tmp_path / "o.duckdb")
    for seed, run in ((1, "b-run"), (2, "a-run")):
        t = dict(simulate(n_requests=30, seed=seed, run_id=run).tables)
        rs = t["request_steps"]
        names = {r: n for r, n in zip(sorted(rs.rid.unique()), ["é1", "e", "ä", "Z", "e1", "日本", "r10", "r2"] * 10)}
        t["request_steps"] = rs.assign(rid=rs.rid.map(lambda r: names[r] + "-" + r if r in names else r))
        st.append(t)
    runs = ["b-run", "a-run"]
    for chunk_rows in (40, 1 << 20):
        memory = [(r, t.to_pandas()) for r, t in request_chunks(st, runs, chunk_rows=chunk_rows)]
        duck = [(r, t.to_pandas()) for r, t in request_chunks(st, runs, chunk_rows=chunk_rows, sort_rows=0)]
        assert [r for r, _ in memory] == [r for r, _ in duck] and len(memory) >= (2 if chunk_rows > 1000 else 10)
        for (_, a), (_, b) in zip(memory, duck):
            pd.testing.assert_frame_equal(a, b)
    with st.connect(read_only=True) as con:
        sql = f"SELECT {s_columns(TAIL_COLUMNS)} FROM request_steps s WHERE s.run_id IN ('a-run', 'b-run')"
        want = fetch_arrow(con, f"{sql} ORDER BY {ORDER}").combine_chunks()
        got = fetch_by_request(con, sql, None, TAIL_COLUMNS)
    assert got.num_rows == want.num_rows > 100 and got.equals(want)
    # read_sample: ordered by request (sorted here, or by DuckDB when the keys are not read), or as stored
    from acceptscope.estimators.chunks import read_sample
    assert read_sample(st, runs, 1 << 20).combine_chunks().equals(want)
    few = ("rid", "ceiling")
    with st.connect(read_only=True) as con:
        want_few = fetch_arrow(con, f"SELECT {s_columns(few)} FROM request_steps s ORDER BY {ORDER}").combine_chunks()
    assert read_sample(st, runs, 1 << 20, columns=few).combine_chunks().equals(want_few)
    stored = read_sample(st, runs, 1 << 20, ordered=False).to_pandas()
    pd.testing.assert_frame_equal(stored.sort_values(["run_id", "rid", "epoch", "forward_ct"], ignore_index=True),
                                  want.to_pandas())
