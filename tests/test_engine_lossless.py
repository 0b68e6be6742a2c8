"""Losslessness of the reference engine on tiny random models (CI property tests).

* greedy output is token-identical to the target's own argmax loop in every verify mode,
  with continuous batching, EOS and length finishes;
* compact and cap-accept commit identical tokens for the same seed under sampling;
* the sampled output distribution equals the target's (chi-square over the joint of two
  speculatively generated tokens, exact reference by enumeration).
"""

from __future__ import annotations

import numpy as np
import pytest
import torch
from scipy import stats

from acceptscope.engine.runner import Engine, RequestSpec
from acceptscope.domain.sps import SpsTable1D, SpsTableAdditive
from tests._engine_tiny import single_torch_thread, target  # noqa: F401 (fixtures)
from tests._engine_tiny import OracleDrafter, hf_greedy, tiny_dspark, tiny_target

MODES = ("static", "compact", "cap-accept")
# a table whose token cost is steep, so the scheduler really trims windows
TRIM_SPS = SpsTableAdditive(0.001, [1, 256], [0.0, 0.0], [1, 512], [0.0, 0.05])
# a 1-D table with a throughput cliff at 160 batch tokens: short requests never have lagged
# history (survival 1), so the budget is what the cliff leaves and the windows are trimmed
CLIFF_SPS = SpsTable1D([1, 160], [1.0, 0.01], 512)


pytestmark = pytest.mark.usefixtures("single_torch_thread")


def _prompts(n: int, V: int, seed: int = 0) -> list[list[int]]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, V, (3 + i % 6,), generator=g).tolist() for i in range(n)]


@pytest.mark.parametrize("drafter_kind", ["oracle", "dspark"])
def test_greedy_is_token_identical_to_target_argmax_in_every_mode(target, drafter_kind):
    prompts = _prompts(10, 48)
    free = [hf_greedy(target, p, 16) for p in prompts]
    eos = free[0][6]  # a token the target really emits: exercises EOS finishes mid-block
    ref = [hf_greedy(target, p, 16, eos=eos) for p in prompts]
    assert any(len(r) < 16 for r in ref) and any(len(r) == 16 for r in ref)
    specs = [RequestSpec(rid=f"r{i}", prompt_ids=p, max_new_tokens=16, seed=i) for i, p in enumerate(prompts)]
    total_correct = 0
    for mode in MODES:
        dr = OracleDrafter(target, gamma=4) if drafter_kind == "oracle" else tiny_dspark(target, gamma=4)
        eng = Engine(target, dr, mode=mode, max_running_requests=4, max_seq_len=64, eos_token_id=eos, sps=TRIM_SPS)
        res = {r.rid: r for r in eng.run(specs)}
        req_steps = sum(r.verify_ct for r in res.values())
        if mode == "compact":
            assert eng.executed_tokens < req_steps * 5  # windows were really trimmed
        for i in range(len(prompts)):
            r = res[f"r{i}"]
            assert r.output_tokens == ref[i], (mode, i)
            assert r.finish_reason == ("stop" if ref[i][-1] == eos else "length")
        total_correct += sum(r.correct_drafts for r in res.values())
    assert total_correct > 0  # drafts were actually accepted, not just bonus tokens


def test_compact_and_cap_accept_commit_identical_tokens_when_sampling(target):
    prompts = _prompts(16, 48, seed=1)
    specs = [RequestSpec(rid=f"r{i}", prompt_ids=p, max_new_tokens=24, temperature=0.9, seed=11)
             for i, p in enumerate(prompts)]
    out = {}
    for mode in ("compact", "cap-accept"):
        eng = Engine(target, OracleDrafter(target, gamma=4), mode=mode, max_running_requests=6, max_seq_len=64,
                     sps=TRIM_SPS, seed=11)
        out[mode] = {r.rid: (r.output_tokens, r.correct_drafts, r.verify_ct) for r in eng.run(specs)}
        if mode == "compact":
            assert eng.executed_tokens < eng.decode_steps * 6 * 5  # compact really ran fewer target rows
    assert out["compact"] == out["cap-accept"]
    # another seed gives other tokens (the seed is really used)
    eng = Engine(target, OracleDrafter(target, gamma=4), mode="compact", max_running_requests=6, max_seq_len=64,
                 sps=TRIM_SPS, seed=12)
    specs2 = [RequestSpec(rid=s.rid, prompt_ids=s.prompt_ids, max_new_tokens=24, temperature=0.9, seed=12) for s in specs]
    assert {r.rid: r.output_tokens for r in eng.run(specs2)} != {k: v[0] for k, v in out["compact"].items()}


def _exact_joint(target, prompt: list[int], V: int, T: float) -> np.ndarray:
    """P(x2, x3) = sum_x1 p(x1) p(x2|x1) p(x3|x1,x2) at temperature T, by enumeration."""
    with torch.no_grad():
        p1 = torch.softmax(target(torch.tensor([prompt])).logits[0, -1] / T, -1)
        seq2 = torch.tensor([prompt + [a] for a in range(V)])
        p2 = torch.softmax(target(seq2).logits[:, -1] / T, -1)  # [x1, x2]
        seq3 = torch.tensor([prompt + [a, b] for a in range(V) for b in range(V)])
        p3 = torch.softmax(target(seq3).logits[:, -1] / T, -1).view(V, V, V)  # [x1, x2, x3]
    joint = (p1.view(V, 1, 1) * p2.view(V, V, 1) * p3).sum(0)
    return joint.double().numpy()


@pytest.mark.parametrize("mode", ["compact", "static"])
def test_sampled_output_distribution_matches_target(mode):
    V, T, N = 8, 1.0, 2400
    tgt = tiny_target(vocab=V, hidden=32, seed=3, sharpen=2.0)
    prompt = [1, 5, 2, 7]
    joint = _exact_joint(tgt, prompt, V, T)
    specs = [RequestSpec(rid=f"s{i}", prompt_ids=prompt, max_new_tokens=3, temperature=T, seed=2024)
             for i in range(N)]
    eng = Engine(tgt, OracleDrafter(tgt, gamma=3, noise=1.0, max_batch=128), mode=mode, max_running_requests=128,
                 max_seq_len=16, sps=CLIFF_SPS, seed=7)
    res = eng.run(specs)
    req_steps = sum(r.verify_ct for r in res)
    if mode == "compact":
        assert eng.executed_tokens < 0.7 * req_steps * 4  # most windows trimmed below gamma
    assert sum(r.correct_drafts for r in res) > N // 4  # speculative path really used
    counts = np.zeros((V, V))
    for r in res:
        counts[r.output_tokens[1], r.output_tokens[2]] += 1
    exp = joint.reshape(-1) * N
    obs = counts.reshape(-1)
    order = np.argsort(exp)
    # pool the smallest-expectation cells so that every pooled cell expects >= 5
    pooled_o, pooled_e, acc_o, acc_e = [], [], 0.0, 0.0
    for i in order:
        acc_o += obs[i]
        acc_e += exp[i]
        if acc_e >= 5:
            pooled_o.append(acc_o)
            pooled_e.append(acc_e)
            acc_o = acc_e = 0.0
    pooled_o[-1] += acc_o
    pooled_e[-1] += acc_e
    pooled_e = np.asarray(pooled_e) * (sum(pooled_o) / sum(pooled_e))  # exact totals for scipy
    chi = stats.chisquare(pooled_o, pooled_e)
    tv = 0.5 * np.abs(obs / N - joint.reshape(-1)).sum()
    assert chi.pvalue > 1e-3, (chi, tv)
    assert tv < 0.08


def test_smaller_gamma_than_the_drafter_block_is_lossless(target):
    prompts = _prompts(6, 48, seed=4)
    ref = [hf_greedy(target, p, 12) for p in prompts]
    specs = [RequestSpec(rid=f"g{i}", prompt_ids=p, max_new_tokens=12) for i, p in enumerate(prompts)]
    eng = Engine(target, tiny_dspark(target, gamma=4), mode="compact", gamma=2, max_running_requests=3,
                 max_seq_len=40, sps=TRIM_SPS)
    res = {r.rid: r.output_tokens for r in eng.run(specs)}
    assert [res[f"g{i}"] for i in range(len(prompts))] == ref
    with pytest.raises(ValueError, match="gamma 5 must be in 1..4"):
        Engine(target, tiny_dspark(target, gamma=4), gamma=5)
