"""The bootstrap module's draws made many replicates at a time are the one-replicate draws, and the
audit's iid bootstrap (moved here from audit_sampling) draws what it drew before."""

from __future__ import annotations

import numpy as np
import pandas as pd

from acceptscope.estimators.bootstrap import (aggregate_stats, cluster_weights, iid_replicates,
                                              normal_draws, poisson_weights, replicate_blocks, request_keys,
                                              request_stats, uniforms)


def _keys(n: int) -> np.ndarray:
    return request_keys(np.array(["run"] * n, dtype=object), np.array([f"r{i}" for i in range(n)], dtype=object))


def test_a_block_of_replicates_is_each_replicate_alone():
    keys = _keys(500)
    idx = np.array([0, 1, 7, 399])
    for stream in (0, 1, 2, 4):
        block = uniforms(keys, idx, seed=3, stream=stream)
        assert block.shape == (4, 500)
        for row, i in zip(block, idx):
            assert np.array_equal(row, uniforms(keys, int(i), seed=3, stream=stream))
    assert np.array_equal(normal_draws(keys, idx, 5)[2], normal_draws(keys, 7, 5))
    assert np.array_equal(poisson_weights(keys, idx, 5)[3], poisson_weights(keys, 399, 5))
    w = cluster_weights(keys, 6, seed=2, start=10)
    assert all(np.array_equal(w[j], poisson_weights(keys, 10 + j, 2)) for j in range(6))
    assert [b.tolist() for b in replicate_blocks(9, 3, cells=12)] == [[0, 1, 2, 3], [4, 5, 6, 7], [8]]
    assert [b.tolist() for b in replicate_blocks(3, 3, cells=6)] == [[0], [1], [2]]


def test_noise_group_sums_are_the_sums_of_their_rows_replicates():
    """A block of replicates' group sums, made as products of the draws with per-request columns, are the
    (group, request) rows' own replicates ``s0 + z sd`` (``w (s0 + z sd)`` and ``w n`` for the population)
    summed per group, within rounding; and a replicate's numbers do not depend on the block it is made in."""
    import acceptscope.estimators.bootstrap as bs

    rng = np.random.default_rng(1)
    n = 3000
    b = pd.DataFrame({"run_id": "r", "rid": rng.integers(0, 400, n).astype(str), "workload": rng.choice(["a", "b", "c"], n),
                      "mean": rng.random(n) * 4, "var": np.where(rng.random(n) < 0.6, 0.0, rng.random(n)),
                      "censored": rng.random(n) < 0.4})
    st = request_stats(b, ["workload"])
    g, _ = bs.group_codes(st, ["workload"])
    key = st[bs.KEY].to_numpy(np.uint64)
    s0, cnt = st["sum_mean"].to_numpy(float), st["n"].to_numpy(float)
    sd = np.sqrt(st["sum_var"].to_numpy(float))
    assert 0 < (sd > 0).sum() < len(sd)  # rows with noise and rows without
    i = np.arange(40)
    z = np.where(sd > 0, normal_draws(key, i, 5), 0.0)  # a request's draw, whatever row it is on
    w = poisson_weights(key, i, 5)
    for population in (False, True):
        noise = bs._Noise(key, s0, sd, cnt, g, 3, 40, 5, population)
        num, den = noise.group_sums(i)
        rows = s0 + z * sd
        want = np.stack([np.bincount(g, weights=r, minlength=3) for r in (w * rows if population else rows)])
        np.testing.assert_allclose(num, want, rtol=1e-12)
        if population:
            np.testing.assert_allclose(den, np.stack([np.bincount(g, weights=r, minlength=3) for r in w * cnt]), rtol=1e-12)
        else:
            assert den is None
        assert np.array_equal(noise.group_sums(i[7:9])[0], num[7:9])  # the same numbers in a smaller block


def test_poisson_weights_are_the_cdf_searched():
    """The table of the hash's leading bits gives exactly ``searchsorted(CDF, uniform)``: over random keys,
    and over hashes on either side of every step of the CDF (the cells where the table defers to the search)."""
    import acceptscope.estimators.bootstrap as bs

    keys = _keys(3000)
    i = np.arange(30)
    want = np.searchsorted(bs._P1_CDF, uniforms(keys, i, 9, stream=1), side="right").astype(float)
    assert np.array_equal(poisson_weights(keys, i, 9), want) and want.max() >= 4
    steps = (bs._P1_TABLE == 255).sum()
    assert 1 <= steps <= 25
    shift = np.uint64(53 - bs._P1_BITS)
    for c in bs._P1_CDF[:10]:
        h = (np.arange(-5000, 5000) + int(c * 2.0 ** 53)).astype(np.uint64)
        v = bs._P1_TABLE[h >> shift].astype(int)
        at = v == 255
        v[at] = np.searchsorted(bs._P1_CDF, bs._to_uniform(h[at]), side="right")
        assert np.array_equal(v, np.searchsorted(bs._P1_CDF, bs._to_uniform(h), side="right"))


def test_aggregate_intervals_do_not_depend_on_the_block_size():
    rng = np.random.default_rng(2)
    n = 2000
    b = pd.DataFrame({"run_id": "r", "rid": rng.integers(0, 300, n).astype(str), "workload": rng.choice(["a", "b"], n),
                      "mean": rng.random(n) * 4, "var": rng.random(n), "censored": rng.random(n) < 0.5})
    st = request_stats(b, ["workload"])
    import acceptscope.estimators.bootstrap as bs

    old = bs.DRAW_CELLS
    try:
        got = []
        for cells in (1, 1 << 16):  # one replicate a call, then ~200 a call
            bs.DRAW_CELLS = cells
            got.append(aggregate_stats(st, ["workload"], n_boot=120, target="population"))
    finally:
        bs.DRAW_CELLS = old
    pd.testing.assert_frame_equal(got[0], got[1], check_exact=True)


def test_iid_replicates_exact_and_normal_limit():
    rng = np.random.default_rng(4)
    rows = (rng.random(50), rng.random(50))

    def stat(a, b):
        return np.array([a.sum(), (a * b).sum()])

    got = iid_replicates(30, 9, rows=rows, stat=stat)
    ref = np.random.default_rng(9)
    want = np.array([stat(*(c[i] for c in rows)) for i in (ref.integers(0, 50, size=50) for _ in range(30))])
    assert got.shape == (30, 2) and np.array_equal(got, want)
    assert iid_replicates(0, 9, rows=rows, stat=stat).shape == (0, 2)
    cov = np.array([[2.0, 0.5], [0.5, 1.0]])
    z = iid_replicates(4000, 1, total=np.array([10.0, -3.0]), cov=cov)
    assert np.allclose(z.mean(0), [10.0, -3.0], atol=0.1) and np.allclose(np.cov(z.T), cov, atol=0.15)


def test_kept_draws_are_the_draws():
    """A chunk's aggregates reuse the last key set's normal draws: the sums equal those drawn afresh."""
    import acceptscope.estimators.bootstrap as bs
    from acceptscope.estimators.bootstrap import replicate_sums

    rng = np.random.default_rng(3)
    n = 900
    b = pd.DataFrame({"run_id": "r", "rid": rng.integers(0, 150, n).astype(str), "band": rng.choice(["x", "y"], n),
                      "mean": rng.random(n) * 4, "var": rng.random(n), "censored": rng.random(n) < 0.5})
    old = bs.MEMO_CELLS
    try:
        got = [replicate_sums(request_stats(b, by), by, n_boot=nb) for by, nb in (([], 400), ([], 200), (["band"], 200))]
        bs.MEMO_CELLS = 0  # nothing kept: every draw made again
        want = [replicate_sums(request_stats(b, by), by, n_boot=nb) for by, nb in (([], 400), ([], 200), (["band"], 200))]
    finally:
        bs.MEMO_CELLS = old
    for g, w in zip(got, want):
        assert np.array_equal(g["num"], w["num"]) and list(g["labels"]) == list(w["labels"])
    assert np.array_equal(got[0]["num"][:200], got[1]["num"])  # the first 200 of 400 replicates are the 200


def test_keyed_uniforms_are_the_splitmix_expression():
    """The in-place hashing draws exactly what the splitmix64 expression form draws (the keyed draws are
    the bootstrap's identity: any change would move every interval)."""
    u64 = np.uint64

    def mix(h):
        with np.errstate(over="ignore"):
            h = (h ^ (h >> u64(30))) * u64(0xBF58476D1CE4E5B9)
            h = (h ^ (h >> u64(27))) * u64(0x94D049BB133111EB)
            return h ^ (h >> u64(31))

    keys = _keys(300)
    idx = np.arange(5, 45)
    for seed, stream in ((0, 0), (7, 2), (123, 1)):
        with np.errstate(over="ignore"):
            salt = mix(u64(seed) * u64(0xD6E8FEB86659FD93) + idx.astype(np.uint64) * u64(0x9E3779B97F4A7C15)
                       + u64(stream) * u64(0xC2B2AE3D27D4EB4F))
        h = mix(keys[None, :] ^ salt[:, None])
        expected = ((h >> u64(11)).astype(np.float64) + 0.5) / float(1 << 53)
        assert np.array_equal(uniforms(keys, idx, seed, stream), expected)
    assert 0.0 < expected.min() and expected.max() < 1.0
