"""Greedy block acceptance of a drafter against its target, per workload.

A minimal, self-contained speculative decoding loop (batch 1, full-window static verification, greedy on
both sides) that drives the drafter exactly through its public API (``new_state`` / ``extend_context`` /
``propose``) with the runtime's convention: the context of an anchor at position ``s`` is the target
hidden states of positions ``0..s-1``; after a verify with ``a`` accepted drafts the hidden states of
``[anchor, d_0..d_{a-1}]`` are appended. It measures the mean accepted length ``tau`` (bonus included),
the per-position conditional acceptance and the raw confidence head's mean per position. It is a
check on the trained pair, not the runtime (which lives in ENGINE-RUNTIME's modules).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable, Sequence

import numpy as np
import torch

from acceptscope.domain import corpus as corpus_mod
from acceptscope.engine.drafter import DSparkDrafter
from acceptscope.engine.target import target_hidden_for
from acceptscope.domain.workloads import read_turns_jsonl

# kept importable under its old name; the one reader is workloads.read_turns_jsonl
read_prompt_file = read_turns_jsonl

__all__ = ["greedy_acceptance", "evaluate_workloads", "read_prompt_file"]


def _pick(logits: torch.Tensor, temperature: float, gen: torch.Generator) -> int:
    if temperature < 1e-5:
        return int(logits.argmax())
    probs = torch.softmax(logits.float() / temperature, -1)
    return int(torch.multinomial(probs, 1, generator=gen))


def _verify(drafts: list[int], q_logprobs: torch.Tensor, t_logits: torch.Tensor, temperature: float,
            gen: torch.Generator) -> tuple[int, int]:
    """(accepted drafts, the target's correction or bonus token)."""
    g = len(drafts)
    if temperature < 1e-5:
        pred = t_logits.argmax(-1).tolist()
        a = 0
        while a < g and drafts[a] == pred[a]:
            a += 1
        return a, int(pred[a])
    p = torch.softmax(t_logits / temperature, -1)
    q = q_logprobs.float().exp()
    for k, d in enumerate(drafts):
        ratio = float(p[k, d] / q[k, d].clamp(min=1e-8))
        u = float(torch.rand((), generator=gen, device=p.device))
        if u >= min(1.0, ratio):
            resid = (p[k] - q[k]).clamp(min=0)
            if float(resid.sum()) <= 0:
                resid = p[k]
            return k, int(torch.multinomial(resid / resid.sum(), 1, generator=gen))
    return g, int(torch.multinomial(p[g], 1, generator=gen))


@torch.no_grad()
def greedy_acceptance(
    target: Any,
    drafter: DSparkDrafter,
    tokenizer: Any,
    prompts: Sequence[str],
    max_new_tokens: int = 96,
    max_prompt_tokens: int = 384,
    device: str | torch.device = "cpu",
    temperature: float = 0.0,
    seed: int = 0,
) -> dict[str, Any]:
    """Run static speculative decoding on each prompt; return acceptance statistics.

    ``temperature == 0``: greedy on both sides, a draft survives iff it equals the target's argmax.
    ``temperature > 0``: drafts are sampled from ``q`` and verified by standard rejection sampling against
    the target's ``p`` at the same temperature (accept with ``min(1, p/q)``, residual on rejection).
    """
    dev = torch.device(device)
    gen = torch.Generator(device=dev).manual_seed(seed)
    g = drafter.config.gamma
    ids_l = drafter.config.target_layer_ids
    eos = {i for i in (tokenizer.eos_token_id, tokenizer.pad_token_id) if i is not None}
    accepted: list[int] = []
    conf_sum = np.zeros(g)
    conf_n = np.zeros(g)
    reach = np.zeros(g)  # rounds in which position k was reached (all earlier drafts accepted)
    acc = np.zeros(g)  # ... and accepted
    gen_tokens = 0
    t0 = time.time()
    for prompt in prompts:
        msgs = [{"role": "user", "content": prompt}]
        p_ids = tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
        if isinstance(p_ids, dict) or hasattr(p_ids, "keys"):
            p_ids = p_ids["input_ids"]
        p_ids = list(p_ids)[-max_prompt_tokens:]
        seq = torch.tensor([p_ids], device=dev)
        out = target(seq, output_hidden_states=True)
        feats = target_hidden_for(out, ids_l)[0]
        anchor = _pick(out.logits[0, -1], temperature, gen)
        state = drafter.new_state(capacity=len(p_ids) + max_new_tokens + g + 8)
        drafter.extend_context(state, feats)
        committed = list(p_ids) + [anchor]
        produced = 1
        if anchor in eos:
            continue
        while produced < max_new_tokens:
            prop = drafter.propose([state], torch.tensor([anchor], device=dev),
                                   torch.full((1,), float(temperature), device=dev), generator=gen)
            drafts = prop.tokens[0].tolist()
            cand = torch.tensor([committed + drafts], device=dev)
            vout = target(cand, output_hidden_states=True)
            s = len(committed) - 1  # anchor position
            t_logits = vout.logits[0, s : s + g + 1].float()  # row k predicts position s+k+1
            a, fix = _verify(drafts, prop.logprobs[0], t_logits, temperature, gen)
            t_pred = [None] * a + [fix]
            conf = torch.sigmoid(prop.confidence_logits[0]).cpu().numpy()
            for k in range(min(a + 1, g)):
                reach[k] += 1
                acc[k] += k < a
                conf_sum[k] += conf[k]
                conf_n[k] += 1
            accepted.append(a)
            new = drafts[:a] + [t_pred[a]]
            vfeats = target_hidden_for(vout, ids_l)[0]
            drafter.extend_context(state, vfeats[s : s + a + 1])
            committed.extend(new)
            produced += len(new)
            anchor = new[-1]
            if any(t in eos for t in new):
                break
        gen_tokens += produced
    acc_arr = np.asarray(accepted, dtype=float)
    return {
        "prompts": len(prompts),
        "rounds": int(len(acc_arr)),
        "generated_tokens": int(gen_tokens),
        "tau_mean": float(1.0 + acc_arr.mean()) if len(acc_arr) else None,
        "accepted_drafts_mean": float(acc_arr.mean()) if len(acc_arr) else None,
        "full_block_rate": float((acc_arr == g).mean()) if len(acc_arr) else None,
        "conditional_accept_rate": [float(a / r) if r else None for a, r in zip(acc, reach)],
        "confidence_mean": [float(c / n) if n else None for c, n in zip(conf_sum, conf_n)],
        "wall_s": round(time.time() - t0, 2),
    }


def evaluate_workloads(
    target: Any,
    drafter: DSparkDrafter,
    tokenizer: Any,
    n_prompts: int = 24,
    max_new_tokens: int = 96,
    device: str | torch.device = "cpu",
    extra_prompt_files: dict[str, str | Path] | None = None,
    progress: Callable[[str], None] | None = None,
    seed: int = 12345,
    temperature: float = 0.0,
) -> dict[str, Any]:
    """Acceptance per built-in workload (``corpus.EVAL_WORKLOADS``), plus any ``name=file`` prompt sets."""
    res: dict[str, Any] = {}
    sets = {w: corpus_mod.eval_prompts(w, n_prompts, seed=seed) for w in corpus_mod.EVAL_WORKLOADS}
    for name, path in (extra_prompt_files or {}).items():
        sets[name] = read_turns_jsonl(path, limit=n_prompts)
    for name, prompts in sets.items():
        if progress:
            progress(name)
        res[name] = greedy_acceptance(target, drafter, tokenizer, prompts, max_new_tokens, device=device,
                                      temperature=temperature)
        res[name]["temperature"] = temperature
    return res
