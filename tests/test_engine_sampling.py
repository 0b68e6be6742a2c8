"""Exactness of the speculative (rejection) sampler on fixed distributions, many independent draws."""

from __future__ import annotations

import torch

from acceptscope.engine.sampling import sample_inverse_cdf, sample_tokens, verify_block

N = 60_000


def _tv(counts: torch.Tensor, p: torch.Tensor) -> float:
    return 0.5 * float((counts / counts.sum() - p).abs().sum())


def _setup(G: int = 2, V: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    t_logits = torch.randn(G + 1, V, generator=g) * 1.5
    d_logits = torch.randn(G, V, generator=g) * 1.5
    q = torch.softmax(d_logits, -1)
    # drafts really sampled from q, independently per row
    drafts = torch.stack([sample_inverse_cdf(q[k].expand(N, V), torch.rand(N, generator=g)) for k in range(G)], 1)
    lq = torch.log(q).expand(N, G, V)
    return g, t_logits, q, drafts, lq


def _packed(t_logits: torch.Tensor, rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = t_logits[:rows].unsqueeze(0).expand(N, rows, -1).reshape(N * rows, -1)
    cu = torch.arange(0, N * rows + 1, rows)
    return logits, cu


def test_inverse_cdf_matches_probabilities():
    g = torch.Generator().manual_seed(3)
    p = torch.tensor([0.1, 0.0, 0.6, 0.3])
    idx = sample_inverse_cdf(p.expand(N, 4), torch.rand(N, generator=g))
    counts = torch.bincount(idx, minlength=4).float()
    assert counts[1] == 0  # a zero-probability token is never drawn
    assert _tv(counts, p) < 0.01


def test_committed_tokens_follow_target_in_every_window():
    G, V = 2, 5
    g, t_logits, q, drafts, lq = _setup(G, V)
    p = torch.softmax(t_logits, -1)
    temps = torch.ones(N)
    u_acc = torch.rand(N, G, generator=g)
    u_s = torch.rand(N, G + 1, generator=g)
    for w, rows in ((0, 1), (1, 2), (2, 3), (0, 3), (1, 3)):  # compact windows, and capped full-width verifies
        logits, cu = _packed(t_logits, rows)
        d = verify_block(logits, cu, drafts, lq, temps, torch.full((N,), w), u_acc, u_s)
        first = torch.where(d.correct > 0, drafts[:, 0], d.bonus)
        assert _tv(torch.bincount(first, minlength=V).float(), p[0]) < 0.01, (w, rows)
        if w >= 1:
            sel = d.correct >= 1
            second = torch.where(d.correct[sel] > 1, drafts[sel, 1], d.bonus[sel])
            assert _tv(torch.bincount(second, minlength=V).float(), p[1]) < 0.015, (w, rows)
        assert bool((d.correct <= w).all()) and bool((d.raw >= d.correct).all())
        # the acceptance rate of d_0 is sum_x min(p, q)
        if rows >= 1:
            acc0 = float((d.raw >= 1).float().mean())
            assert abs(acc0 - float(torch.minimum(p[0], q[0]).sum())) < 0.01


def test_compact_and_cap_accept_commit_identically():
    G, V = 2, 5
    g, t_logits, q, drafts, lq = _setup(G, V, seed=5)
    temps = torch.full((N,), 0.7)
    u_acc = torch.rand(N, G, generator=g)
    u_s = torch.rand(N, G + 1, generator=g)
    for w in (0, 1, 2):
        lc, cuc = _packed(t_logits, w + 1)
        lf, cuf = _packed(t_logits, G + 1)
        win = torch.full((N,), w)
        dc = verify_block(lc, cuc, drafts, lq, temps, win, u_acc, u_s)
        df = verify_block(lf, cuf, drafts, lq, temps, win, u_acc, u_s)
        assert torch.equal(dc.correct, df.correct)
        assert torch.equal(dc.bonus, df.bonus)
        # cap-accept knows the uncapped count; compact can exceed the window by at most one
        assert bool(((dc.raw - dc.correct) <= 1).all())
        assert bool((df.raw >= dc.raw).all())
        # p is scored for every drafted position in full width, only for k <= w in compact
        assert not torch.isnan(df.target_logprob).any()
        assert torch.isnan(dc.target_logprob[:, w + 1 :]).all() and not torch.isnan(dc.target_logprob[:, : w + 1]).any()


def test_greedy_acceptance_and_bonus():
    V, G = 6, 3
    t_logits = torch.tensor([[0, 5, 0, 0, 0, 0], [0, 0, 5, 0, 0, 0], [0, 0, 0, 5, 0, 0], [0, 0, 0, 0, 5, 0]], dtype=torch.float)
    drafts = torch.tensor([[1, 2, 3], [1, 4, 3], [0, 2, 3]])
    lq = torch.log_softmax(torch.zeros(3, G, V), -1)
    logits = t_logits.repeat(3, 1)
    cu = torch.tensor([0, 4, 8, 12])
    d = verify_block(logits, cu, drafts, lq, torch.zeros(3), torch.tensor([3, 3, 3]), torch.rand(3, G), torch.rand(3, G + 1))
    assert d.correct.tolist() == [3, 1, 0]
    assert d.bonus.tolist() == [4, 2, 1]  # argmax of the first unverified row
    # cap at window 1: raw 3, capped 1, bonus = the accepted next draft d_1
    d = verify_block(logits, cu, drafts, lq, torch.zeros(3), torch.tensor([1, 1, 1]), torch.rand(3, G), torch.rand(3, G + 1))
    assert d.correct.tolist() == [1, 1, 0] and d.raw.tolist() == [3, 1, 0] and d.bonus.tolist() == [2, 2, 1]


def test_prefill_sampling_greedy_and_tempered():
    g = torch.Generator().manual_seed(0)
    logits = torch.tensor([[0.0, 1.0, 2.0]]).expand(N, 3)
    tok = sample_tokens(logits, torch.full((N,), 2.0), torch.rand(N, generator=g))
    assert _tv(torch.bincount(tok, minlength=3).float(), torch.softmax(torch.tensor([0.0, 0.5, 1.0]), -1)) < 0.01
    assert sample_tokens(logits[:2], torch.zeros(2), torch.rand(2)).tolist() == [2, 2]
