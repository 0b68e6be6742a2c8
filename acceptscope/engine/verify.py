"""The three SGLang verify modes over the packed target forward.

* ``static``: no scheduler; every request verifies all gamma drafts (gamma + 1 rows).
* ``compact``: the scheduler's window ``w`` per request; ONLY ``w + 1`` rows per request
  (anchor + ``w`` drafts) go through the target, packed back to back (``cu_seqlens``).
* ``cap-accept``: the same window, but all gamma + 1 rows run; acceptance is capped at the
  window and the uncapped count (the exact ceiling) is recorded.

Commit rule and randomness are shared (:func:`acceptscope.engine.sampling.verify_block`),
so compact and cap-accept commit identical tokens for identical draws.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import torch

from acceptscope.engine.kv import CachedTarget, pack
from acceptscope.engine.sampling import BlockDecision, verify_block

MODES = ("compact", "cap-accept", "static")


def check_mode(mode: str) -> str:
    if mode not in MODES:
        raise ValueError(f"unknown verify mode {mode!r}; expected one of {MODES}")
    return mode


@dataclass
class VerifyResult:
    decision: BlockDecision
    rows: torch.Tensor  # [B] target rows executed per request
    cu_seqlens: torch.Tensor  # [B+1]
    hidden: torch.Tensor  # [T, m*H] chosen-layer hidden of every executed row
    ceiling: Optional[torch.Tensor]  # [B] uncapped accepted drafts (None in compact)
    cap_trim: torch.Tensor  # [B]
    executed_tokens: int


def run_verify(
    target: CachedTarget,
    mode: str,
    slots: list[int],
    prefix_lens: list[int],
    anchors: torch.Tensor,
    draft_tokens: torch.Tensor,
    draft_logprobs: torch.Tensor,
    windows: torch.Tensor,
    temperatures: torch.Tensor,
    u_accept: torch.Tensor,
    u_sample: torch.Tensor,
) -> VerifyResult:
    """One batched target verify; the anchor of request b sits at absolute position prefix_lens[b]."""
    B, G = draft_tokens.shape
    block = torch.cat([anchors.view(B, 1), draft_tokens], dim=1)  # [B, G+1]
    if mode == "compact":
        rows = windows + 1
        keep = torch.arange(G + 1).unsqueeze(0) < rows.unsqueeze(1)
        tokens = block[keep]  # row-major: packed per request
    else:
        rows = torch.full((B,), G + 1, dtype=torch.long)
        tokens = block.reshape(-1)
    rows_l = rows.tolist()
    pb = pack(slots, prefix_lens, rows_l)
    logits, hidden = target.forward(pb, tokens)
    d = verify_block(logits, pb.cu_seqlens, draft_tokens, draft_logprobs, temperatures, windows, u_accept, u_sample)
    cap_trim = d.raw - d.correct
    ceiling = None if mode == "compact" else d.raw
    return VerifyResult(d, rows, pb.cu_seqlens, hidden, ceiling, cap_trim, int(tokens.numel()))
