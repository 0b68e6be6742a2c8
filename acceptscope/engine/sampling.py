"""Exact speculative (rejection) sampling and greedy acceptance for one verify step.

Why one vectorised function for every verify mode: compact and cap-accept must commit
identical tokens for the same random draws. Both call :func:`verify_block` with the
same uniforms; they differ only in how many target rows are real (``rows``).

Rule per request (window ``w`` = verified drafts, ``G`` = gamma, ``rows`` = real target
rows, ``w + 1 <= rows <= G + 1``):

* draft ``d_k`` is tested against target row ``k`` for every ``k < min(rows, G)``
  (the row after the window is real in every mode, so ``d_w`` is always tested):
  greedy accepts iff ``d_k == argmax p_k``; sampling accepts iff
  ``u_k < p_k(d_k) / max(q_k(d_k), 1e-8)`` (DeepSpec / SGLang rule);
* ``raw`` = leading accepted drafts over the tested rows; ``correct = min(raw, w)``;
  ``cap_trim = raw - correct``;
* the token after the accepted drafts (row ``j = correct``) is ``d_j`` when the draft
  at row ``j`` was accepted (``cap_trim > 0``), a residual sample from
  ``norm(max(0, p_j - q_j))`` when it was rejected, and a plain sample from ``p_G``
  when all ``G`` drafts were accepted. Greedy takes ``argmax p_j``.

Each output token is thus distributed exactly as the target's (standard speculative
sampling at every committed position), whatever ``w`` the scheduler chose.

Sampling uses inverse-CDF with caller-supplied uniforms, so randomness is consumed
identically in every mode and tiny float differences between batch shapes cannot
change a draw except on a measure-zero boundary.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

Q_FLOOR = 1e-8


@dataclass
class BlockDecision:
    """Outcome of verifying one block per request (all tensors have leading dim B)."""

    correct: torch.Tensor  # [B] accepted drafts after capping (<= window)
    raw: torch.Tensor  # [B] uncapped leading accepts over the tested rows
    bonus: torch.Tensor  # [B] token committed after the accepted drafts
    target_logprob: torch.Tensor  # [B, G] log p(d_k) where tested, NaN elsewhere


def sample_inverse_cdf(probs: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Draw one index per row of (unnormalised, non-negative) ``probs`` from uniforms ``u`` in [0,1)."""
    cdf = probs.cumsum(-1)
    x = (u * cdf[..., -1]).unsqueeze(-1)
    idx = torch.searchsorted(cdf, x, right=True).squeeze(-1)
    return idx.clamp_(max=probs.shape[-1] - 1)


def target_probs(logits: torch.Tensor, temperatures: torch.Tensor) -> torch.Tensor:
    """p = softmax(logits / T) per row; T = 0 (greedy) uses T = 1 (only for logprobs)."""
    t = torch.where(temperatures > 0, temperatures, torch.ones_like(temperatures))
    return torch.softmax(logits.float() / t.unsqueeze(-1).float(), dim=-1)


def verify_block(
    target_logits: torch.Tensor,
    cu_seqlens: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_logprobs: torch.Tensor,
    temperatures: torch.Tensor,
    windows: torch.Tensor,
    u_accept: torch.Tensor,
    u_sample: torch.Tensor,
) -> BlockDecision:
    """Verify a batch of blocks from *packed* target rows.

    target_logits [T, V]: request b's rows are ``cu_seqlens[b]:cu_seqlens[b+1]`` (row k
    predicts the token after input k: anchor, d_0, ...), so ``rows_b = cu[b+1] - cu[b]``
    with ``window_b + 1 <= rows_b <= G + 1``. draft_tokens [B, G]; draft_logprobs [B, G, V]
    (log q actually sampled from); temperatures [B] (0 = greedy); windows [B];
    u_accept [B, G]; u_sample [B, G+1]. Never materialises a [B, G+1, V] tensor.
    """
    B, G = draft_tokens.shape
    dev = target_logits.device
    cu = cu_seqlens.to(dev)
    rows = cu[1:] - cu[:-1]
    greedy = temperatures <= 0
    t_eff = torch.where(greedy, torch.ones_like(temperatures), temperatures).float()
    scaled = target_logits.float() / torch.repeat_interleave(t_eff, rows).unsqueeze(1)
    lse = torch.logsumexp(scaled, dim=-1)  # [T]
    ar = torch.arange(G, device=dev)
    tested = ar.unsqueeze(0) < torch.clamp(rows, max=G).unsqueeze(1)  # [B, G]
    idx = cu[:-1].unsqueeze(1) + torch.minimum(ar.unsqueeze(0), (rows - 1).unsqueeze(1))  # [B, G]

    logp_d = scaled[idx, draft_tokens] - lse[idx]  # [B, G]
    q_d = draft_logprobs.gather(-1, draft_tokens.unsqueeze(-1)).squeeze(-1).exp()
    accept_s = u_accept < logp_d.exp() / q_d.clamp_min(Q_FLOOR)
    amax = target_logits.argmax(-1)  # [T]
    accept_g = draft_tokens == amax[idx]
    accept = torch.where(greedy.unsqueeze(1), accept_g, accept_s) & tested
    raw = accept.long().cumprod(-1).sum(-1)
    correct = torch.minimum(raw, windows)

    # token at row j = correct (always a real row: correct <= window <= rows - 1)
    j = correct
    bidx = torch.arange(B, device=dev)
    row_j = cu[:-1] + j
    p_j = torch.softmax(scaled[row_j], dim=-1)  # [B, V]
    jd = j.clamp(max=G - 1)
    q_j = draft_logprobs[bidx, jd].exp()
    resid = (p_j - q_j).clamp_min(0.0)
    full = j >= G
    resid = torch.where(full.unsqueeze(1), p_j, resid)
    empty = resid.sum(-1) <= 0
    resid = torch.where(empty.unsqueeze(1), p_j, resid)
    sampled = sample_inverse_cdf(resid, u_sample[bidx, j])
    took_draft = raw > correct
    sampled = torch.where(took_draft, draft_tokens[bidx, jd], sampled)
    bonus = torch.where(greedy, amax[row_j], sampled)

    target_lp = torch.where(tested, logp_d, torch.full_like(logp_d, float("nan")))
    return BlockDecision(correct=correct, raw=raw, bonus=bonus, target_logprob=target_lp)


def sample_tokens(logits: torch.Tensor, temperatures: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """Plain target sampling (prefill token): argmax for T = 0, inverse-CDF of softmax(l/T) otherwise."""
    p = target_probs(logits, temperatures)
    s = sample_inverse_cdf(p, u)
    return torch.where(temperatures <= 0, logits.argmax(-1), s)
