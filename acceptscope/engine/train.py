"""Training loops for the reference engine: the Qwen3-architecture target LM and its DSpark drafter.

``train_target``: corpus generation -> byte-level BPE -> causal-LM training -> ``save_pretrained`` (+ tokenizer).
``train_drafter``: the frozen target (loaded from its directory, as the runtime will load it) provides the
context features of the chosen layers and its next-token distributions; the drafter is trained on many
anchor blocks per sequence with the DSpark loss (paper Eq. 9-12, DeepSpec ``loss.py``):

    L = a_ce * CE(q, corpus token) + a_l1 * ||q - p_t||_1 + a_kl * KL(p_t || q) + a_conf * BCE(z, c*)

with per-slot weights ``exp(-k / 4)``, ``q`` the Markov-corrected teacher-forced draft distribution and
``c* = 1 - TV(q, p_t)`` (stop-gradient). The KL term is our addition (DeepSpec uses CE + L1 only): it
speeds up convergence of small drafters trained for minutes.

Both loops are seeded, run on CPU (tiny step counts) and CUDA (bf16 autocast), and can fit their step
count to a wall-clock budget (``time_budget_s``) after timing the first steps.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import random
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
import torch.nn.functional as F
from transformers import GenerationConfig, Qwen3ForCausalLM

import acceptscope.engine as eng_pkg
from acceptscope.engine import EngineConfig, load_models, run_engine
from acceptscope.domain import corpus as corpus_mod
from acceptscope.engine import runner as runner_mod
from acceptscope.engine.drafter import DrafterConfig, DSparkDrafter, position_weights
from acceptscope.engine.eval_acceptance import evaluate_workloads
from acceptscope.domain.scheduler import LaggedSurvival
from acceptscope.engine.target import (
    default_target_layer_ids,
    load_target,
    make_target_config,
    target_hidden_for,
    validate_target_layer_ids,
)
from acceptscope.engine.tokenizer import load_tokenizer, special_token_ids, train_tokenizer
from acceptscope.domain.workloads import disjoint_prompts

# The confidence-head refit's data (issue 13): the main job's workload mix, prompts text-disjoint from the first
# REFIT_EXCLUDE_FIRST of that mix (the audit's 240 and its calibration split), greedy.
REFIT_WORKLOAD = "math,chat,poetry"
REFIT_REQUESTS = 960
REFIT_EXCLUDE_FIRST = 720
REFIT_NEW_TOKENS = 64
REFIT_L2 = 1e-4

__all__ = [
    "TargetTrainConfig",
    "DrafterTrainConfig",
    "train_target",
    "train_drafter",
    "tokenize_docs",
    "seed_everything",
    "train_pair",
    "drafter_loss",
    "drafter_config_for",
    "generate_onpolicy",
]

ProgressFn = Callable[[int, int, dict[str, float]], None]

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def seed_everything(seed: int) -> None:
    random.seed(seed)
    np.random.seed(seed % (2**32))
    torch.manual_seed(seed)
    if torch.cuda.is_available():
        torch.cuda.manual_seed_all(seed)


def _device(name: str) -> torch.device:
    if name == "cuda" and not torch.cuda.is_available():
        raise RuntimeError("--device cuda requested but torch sees no CUDA device")
    return torch.device(name)


def _autocast(device: torch.device):
    if device.type == "cuda":
        return torch.autocast("cuda", dtype=torch.bfloat16)
    return torch.autocast("cpu", enabled=False)


def tokenize_docs(tokenizer: Any, docs: list[corpus_mod.Doc]) -> tuple[np.ndarray, dict[str, int]]:
    """Concatenate the documents' token ids into one int32 stream; also count tokens per workload."""
    backend = getattr(tokenizer, "backend_tokenizer", None)
    if backend is not None:  # the Rust batch encoder: parallel and much faster than the Python wrapper
        enc = [e.ids for e in backend.encode_batch([d.text for d in docs], add_special_tokens=False)]
    else:
        enc = tokenizer([d.text for d in docs], add_special_tokens=False)["input_ids"]
    counts: dict[str, int] = {}
    for d, ids in zip(docs, enc):
        counts[d.workload] = counts.get(d.workload, 0) + len(ids)
    stream = np.fromiter((t for ids in enc for t in ids), dtype=np.int32)
    return stream, counts


class _Batcher:
    """Random fixed-length windows from a token stream (seeded)."""

    def __init__(self, stream: np.ndarray, seq_len: int, batch_size: int, seed: int) -> None:
        if len(stream) <= seq_len + 1:
            raise ValueError(f"corpus has {len(stream)} tokens, fewer than seq_len+1 = {seq_len + 1}")
        self.t = torch.from_numpy(stream.astype(np.int64))
        self.seq_len, self.batch_size = seq_len, batch_size
        self.g = torch.Generator().manual_seed(seed)

    def __call__(self) -> torch.Tensor:
        starts = torch.randint(0, len(self.t) - self.seq_len, (self.batch_size,), generator=self.g)
        idx = starts.unsqueeze(1) + torch.arange(self.seq_len).unsqueeze(0)
        return self.t[idx]


def _lr_at(step: int, total: int, lr: float, warmup: int) -> float:
    if step < warmup:
        return lr * (step + 1) / max(1, warmup)
    prog = (step - warmup) / max(1, total - warmup)
    return lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * min(1.0, prog))))


class _StepBudget:
    """Fits the step count to a wall-clock budget from the step rate between steps 20 and 60 (the first
    steps carry one-off costs such as CUDA start-up and kernel selection)."""

    def __init__(self, steps: int, budget: float | None) -> None:
        self.steps, self.budget = steps, budget
        self.t0 = time.time()
        self.t20: float | None = None

    def update(self, step: int) -> int:
        if self.budget is None:
            return self.steps
        if step == 20:
            self.t20 = time.time()
        elif step == 60 and self.t20 is not None:
            per = (time.time() - self.t20) / 40.0
            left = self.budget - (time.time() - self.t0)
            self.steps = max(61, min(self.steps, 60 + int(left / per)))
        return self.steps


# --------------------------------------------------------------------------------------------------
# target


@dataclass
class TargetTrainConfig:
    steps: int = 2000
    batch_size: int = 64
    seq_len: int = 256
    lr: float = 3e-3
    warmup: int = 100
    weight_decay: float = 0.05
    seed: int = 0
    device: str = "cpu"
    corpus_chars: int = 4_000_000
    tokenizer_chars: int = 3_000_000
    vocab_size: int = 2048
    hidden_size: int = 256
    num_layers: int = 6
    num_heads: int = 4
    num_kv_heads: int = 2
    head_dim: int = 64
    intermediate_size: int = 640
    max_position_embeddings: int = 2048
    save_dtype: str = "bfloat16"
    time_budget_s: float | None = None
    eval_tokens: int = 40_000  # held-out tokens per workload for the loss report
    mix: dict[str, float] = field(default_factory=lambda: dict(corpus_mod.DEFAULT_MIX))


def train_target(cfg: TargetTrainConfig, out_dir: str | Path, progress: ProgressFn | None = None) -> dict[str, Any]:
    """Generate the corpus, train the tokenizer and the target LM; save both to ``out_dir``."""
    t0 = time.time()
    seed_everything(cfg.seed)
    dev = _device(cfg.device)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    docs = corpus_mod.build_corpus(cfg.seed, cfg.corpus_chars, cfg.mix)
    tok_rng = random.Random(cfg.seed + 1)
    tok_docs = list(docs)
    tok_rng.shuffle(tok_docs)
    sample, n = [], 0
    for d in tok_docs:
        sample.append(d.text)
        n += len(d.text)
        if n >= cfg.tokenizer_chars:
            break
    tokenizer = train_tokenizer(sample, vocab_size=cfg.vocab_size)
    sp = special_token_ids(tokenizer)
    stream, counts = tokenize_docs(tokenizer, docs)
    t_data = time.time() - t0

    mcfg = make_target_config(
        len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=cfg.head_dim,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        eos_token_id=sp["eos"],
        pad_token_id=sp["pad"],
    )
    model = Qwen3ForCausalLM(mcfg).to(dev)
    model.train()
    decay = [p for n_, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n_, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": no_decay, "weight_decay": 0.0}],
        lr=cfg.lr, betas=(0.9, 0.95), fused=dev.type == "cuda",
    )
    batcher = _Batcher(stream, cfg.seq_len, cfg.batch_size, cfg.seed)
    steps = cfg.steps
    losses: list[float] = []
    t_train = time.time()
    budget = _StepBudget(steps, cfg.time_budget_s)
    step = 0
    while step < steps:
        lr = _lr_at(step, steps, cfg.lr, min(cfg.warmup, max(1, steps // 10)))
        for g in opt.param_groups:
            g["lr"] = lr
        ids = batcher().to(dev, non_blocking=True)
        with _autocast(dev):
            logits = model(ids).logits
        loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        step += 1
        if step % 10 == 0 or step == steps:
            lv = float(loss.item())
            losses.append(lv)
            steps = budget.update(step)
            if progress:
                progress(step, steps, {"loss": lv, "lr": lr})
    train_s = time.time() - t_train

    # held-out loss per workload (fresh generated docs + held-out stdlib)
    eval_chars = max(20 * cfg.eval_tokens, cfg.corpus_chars // 50)
    eval_docs = corpus_mod.build_corpus(cfg.seed + 1000, eval_chars, cfg.mix, code_split="eval")
    model.eval()
    per_wl = _eval_loss(model, tokenizer, eval_docs, cfg.seq_len, dev, max_tokens=cfg.eval_tokens)

    model = model.to(_DTYPES[cfg.save_dtype])
    model.config.use_cache = True
    model.save_pretrained(str(out))
    model.generation_config = GenerationConfig(eos_token_id=[sp["eos"], sp["pad"]], pad_token_id=sp["pad"])
    model.generation_config.save_pretrained(str(out))
    tokenizer.save_pretrained(str(out))
    n_params = int(sum(p.numel() for p in model.parameters()))
    metrics = {
        "config": asdict(cfg),
        "steps_run": step,
        "final_loss": float(np.mean(losses[-10:])) if losses else None,
        "loss_curve_every_10": losses[:: max(1, len(losses) // 50)],
        "heldout_loss_per_workload": per_wl,
        "corpus_tokens": int(len(stream)),
        "corpus_tokens_per_workload": counts,
        "vocab_size": len(tokenizer),
        "special_token_ids": sp,
        "parameters": n_params,
        "data_s": round(t_data, 2),
        "train_s": round(train_s, 2),
        "tokens_seen": int(step * cfg.batch_size * cfg.seq_len),
        "python": _py_version(),
        "torch": torch.__version__,
        "device": str(dev),
    }
    (out / "training.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


def _py_version() -> str:
    return sys.version.split()[0]


@torch.no_grad()
def _eval_loss(model: Any, tokenizer: Any, docs: list[corpus_mod.Doc], seq_len: int, dev: torch.device,
               max_tokens: int = 40_000) -> dict[str, float]:
    out: dict[str, float] = {}
    for w in corpus_mod.WORKLOADS:
        sel = [d for d in docs if d.workload == w]
        if not sel:
            continue
        stream, _ = tokenize_docs(tokenizer, sel)
        stream = stream[:max_tokens]
        n = len(stream) // seq_len
        if n == 0:
            continue
        x = torch.from_numpy(stream[: n * seq_len].astype(np.int64)).view(n, seq_len)
        tot, cnt = 0.0, 0
        for i in range(0, n, 32):
            ids = x[i : i + 32].to(dev)
            with _autocast(dev):
                logits = model(ids).logits
            tot += float(F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.shape[-1]),
                                         ids[:, 1:].reshape(-1), reduction="sum"))
            cnt += ids[:, 1:].numel()
        out[w] = round(tot / cnt, 4)
    return out


# --------------------------------------------------------------------------------------------------
# drafter


@dataclass
class DrafterTrainConfig:
    steps: int = 2000
    batch_size: int = 32
    seq_len: int = 256
    num_anchors: int = 32
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 0.0
    seed: int = 0
    device: str = "cpu"
    corpus_chars: int = 4_000_000
    gamma: int = 7
    num_layers: int = 3
    num_heads: int = 4
    num_kv_heads: int | None = None
    head_dim: int | None = None
    intermediate_size: int | None = None
    markov_rank: int = 64
    markov_head_type: str = "vanilla"
    target_layer_ids: list[int] | None = None
    num_target_taps: int = 3
    ce_alpha: float = 0.1
    l1_alpha: float = 0.9
    kl_alpha: float = 1.0
    conf_alpha: float = 1.0
    loss_decay_gamma: float = 4.0
    save_dtype: str = "bfloat16"
    target_path_hint: str | None = None  # None: the target dir relative to the drafter dir
    # on-policy distillation data (the paper trains on target-generated responses): continuations the
    # target writes after random corpus windows, half greedy and half sampled at T=1
    onpolicy_sequences: int = 0
    onpolicy_fraction: float = 0.5
    onpolicy_prompt_len: int = 64
    onpolicy_greedy_fraction: float = 0.5
    onpolicy_batch: int = 512
    time_budget_s: float | None = None
    mix: dict[str, float] = field(default_factory=lambda: dict(corpus_mod.DEFAULT_MIX))


def drafter_config_for(target: Any, tokenizer: Any, cfg: DrafterTrainConfig) -> DrafterConfig:
    tc = target.config
    n_layers = int(tc.num_hidden_layers)
    ids = (validate_target_layer_ids(cfg.target_layer_ids, n_layers) if cfg.target_layer_ids
           else default_target_layer_ids(n_layers, cfg.num_target_taps))
    sp = special_token_ids(tokenizer)
    head_dim = cfg.head_dim or int(getattr(tc, "head_dim", tc.hidden_size // tc.num_attention_heads))
    return DrafterConfig(
        vocab_size=int(tc.vocab_size),
        hidden_size=int(tc.hidden_size),
        num_layers=cfg.num_layers,
        num_heads=cfg.num_heads,
        num_kv_heads=cfg.num_kv_heads,
        head_dim=head_dim,
        intermediate_size=cfg.intermediate_size or int(tc.intermediate_size),
        gamma=cfg.gamma,
        target_layer_ids=ids,
        target_hidden_size=int(tc.hidden_size),
        markov_rank=cfg.markov_rank,
        markov_head_type=cfg.markov_head_type,
        mask_token_id=sp["mask"],
        rms_norm_eps=float(getattr(tc, "rms_norm_eps", 1e-6)),
        rope_theta=_rope_theta(tc),
        max_position_embeddings=int(getattr(tc, "max_position_embeddings", 4096)),
        eos_token_id=sp["eos"],
        target_path=cfg.target_path_hint,
        loss_decay_gamma=cfg.loss_decay_gamma,
    )


def _rope_theta(tc: Any) -> float:
    rp = getattr(tc, "rope_parameters", None)
    if isinstance(rp, dict) and "rope_theta" in rp:
        return float(rp["rope_theta"])
    return float(getattr(tc, "rope_theta", 10000.0))


def drafter_loss(
    drafter: DSparkDrafter,
    target: Any,
    ids: torch.Tensor,
    num_anchors: int,
    cfg: DrafterTrainConfig,
    gen: torch.Generator,
) -> tuple[torch.Tensor, dict[str, float]]:
    """One batch of the DSpark loss (see the module docstring); returns (loss, diagnostics)."""
    dev = ids.device
    B, T = ids.shape
    g = drafter.config.gamma
    with torch.no_grad(), _autocast(dev):
        tout = target(ids, output_hidden_states=True)
    feats = target_hidden_for(tout, drafter.config.target_layer_ids).float()
    t_logits = tout.logits.float()

    n = min(num_anchors, T - 2)
    anchors = (torch.rand(B, T - 2, generator=gen).argsort(dim=1)[:, :n] + 1).to(dev)
    anchors, _ = anchors.sort(dim=1)
    with _autocast(dev):
        o = drafter.forward_train(feats, ids, anchors)
    logits = o["logits"].float()  # [B,N,g,V]
    label_pos = o["label_pos"]
    valid = label_pos < T
    lp_c = label_pos.clamp(max=T - 1)
    labels = ids.gather(1, lp_c.view(B, -1)).view_as(lp_c)
    V = logits.shape[-1]
    tl = t_logits.gather(1, (lp_c - 1).view(B, -1, 1).expand(-1, -1, V)).view(*lp_c.shape, V)

    w = position_weights(g, cfg.loss_decay_gamma, dev).view(1, 1, g) * valid.float()
    wsum = w.sum().clamp(min=1.0)
    logq = torch.log_softmax(logits, -1)
    q = logq.exp()
    logp = torch.log_softmax(tl, -1)
    p = logp.exp()
    ce = -logq.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    l1 = (q - p).abs().sum(-1)
    kl = (p * (logp - logq)).sum(-1)
    c_star = (1.0 - 0.5 * l1).clamp(0.0, 1.0).detach()
    bce = F.binary_cross_entropy_with_logits(o["confidence_logits"].float(), c_star, reduction="none")
    loss = ((cfg.ce_alpha * ce + cfg.l1_alpha * l1 + cfg.kl_alpha * kl + cfg.conf_alpha * bce) * w).sum() / wsum

    with torch.no_grad():
        match = (logits.argmax(-1) == tl.argmax(-1)).float()
        vf = valid.float()
        surv = torch.cumprod(match * vf, dim=-1)
        conf = torch.sigmoid(o["confidence_logits"].float())
        diag = {
            "loss": float(loss.item()),
            "ce": float((ce * w).sum() / wsum),
            "l1": float((l1 * w).sum() / wsum),
            "kl": float((kl * w).sum() / wsum),
            "bce": float((bce * w).sum() / wsum),
            "argmax_match": float((match * vf).sum() / vf.sum().clamp(min=1)),
            "tau_greedy_tf": float(1.0 + surv.sum(-1).mean()),
            "tau_probabilistic": float(1.0 + torch.cumprod(c_star, -1).sum(-1).mean()),
            "confidence_bias": float(((conf - c_star) * vf).sum() / vf.sum().clamp(min=1)),
        }
    return loss, diag


@torch.no_grad()
def generate_onpolicy(
    target: Any,
    stream: np.ndarray,
    n_seqs: int,
    prompt_len: int,
    total_len: int,
    greedy_fraction: float,
    batch: int,
    seed: int,
    device: torch.device,
) -> torch.Tensor:
    """``[n_seqs, total_len]`` token rows: a random corpus window of ``prompt_len`` tokens continued by the
    target (KV-cached), greedily in the first ``greedy_fraction`` of each batch and at T=1 in the rest."""
    if total_len <= prompt_len:
        raise ValueError("total_len must exceed prompt_len")
    starts_gen = torch.Generator().manual_seed(seed)
    samp_gen = torch.Generator(device=device).manual_seed(seed + 1)
    src = torch.from_numpy(stream.astype(np.int64))
    rows = []
    for i in range(0, n_seqs, batch):
        b = min(batch, n_seqs - i)
        st = torch.randint(0, len(src) - prompt_len, (b,), generator=starts_gen)
        ids = src[st.unsqueeze(1) + torch.arange(prompt_len)].to(device)
        n_greedy = int(round(b * greedy_fraction))
        greedy = (torch.arange(b, device=device) < n_greedy).unsqueeze(1)
        with _autocast(device):
            res = target(ids, use_cache=True)
        past, logits = res.past_key_values, res.logits[:, -1].float()
        seq = [ids]
        for step in range(total_len - prompt_len):
            sampled = torch.multinomial(torch.softmax(logits, -1), 1, generator=samp_gen)
            nxt = torch.where(greedy, logits.argmax(-1, keepdim=True), sampled)
            seq.append(nxt)
            if step == total_len - prompt_len - 1:
                break
            with _autocast(device):
                res = target(nxt, past_key_values=past, use_cache=True)
            past, logits = res.past_key_values, res.logits[:, -1].float()
        rows.append(torch.cat(seq, dim=1).cpu())
    return torch.cat(rows, dim=0)


def train_drafter(
    target_dir: str | Path, out_dir: str | Path, cfg: DrafterTrainConfig, progress: ProgressFn | None = None
) -> dict[str, Any]:
    """Train a DSpark drafter against the target saved in ``target_dir``; save it to ``out_dir``."""
    t0 = time.time()
    seed_everything(cfg.seed)
    dev = _device(cfg.device)
    target = load_target(target_dir, device=dev, dtype=torch.float32)
    tokenizer = load_tokenizer(target_dir)
    if cfg.target_path_hint is None:  # a copy, so the caller's config is not modified
        rel = os.path.relpath(Path(target_dir).resolve(), Path(out_dir).resolve())
        cfg = dataclasses.replace(cfg, target_path_hint=Path(rel).as_posix())
    dcfg = drafter_config_for(target, tokenizer, cfg)
    drafter = DSparkDrafter(dcfg)
    drafter.load_shared_from_target(target)
    drafter.to(dev)
    drafter.train()

    docs = corpus_mod.build_corpus(cfg.seed + 17, cfg.corpus_chars, cfg.mix)
    stream, counts = tokenize_docs(tokenizer, docs)
    pool = None
    n_on = 0
    t_gen = time.time()
    if cfg.onpolicy_sequences > 0:
        pool = generate_onpolicy(target, stream, cfg.onpolicy_sequences, cfg.onpolicy_prompt_len, cfg.seq_len,
                                 cfg.onpolicy_greedy_fraction, cfg.onpolicy_batch, cfg.seed + 23, dev)
        n_on = min(cfg.batch_size - 1, int(round(cfg.batch_size * cfg.onpolicy_fraction)))
    t_gen = time.time() - t_gen
    batcher = _Batcher(stream, cfg.seq_len, cfg.batch_size - n_on, cfg.seed + 17)
    pool_gen = torch.Generator().manual_seed(cfg.seed + 31)
    gen = torch.Generator().manual_seed(cfg.seed + 29)
    params = drafter.trainable_parameters()
    opt = torch.optim.AdamW(params, lr=cfg.lr, betas=(0.9, 0.95), weight_decay=cfg.weight_decay,
                            fused=dev.type == "cuda")
    steps = cfg.steps
    hist: list[dict[str, float]] = []
    t_train = time.time()
    budget = _StepBudget(steps, cfg.time_budget_s)
    step = 0
    while step < steps:
        lr = _lr_at(step, steps, cfg.lr, min(cfg.warmup, max(1, steps // 10)))
        for g_ in opt.param_groups:
            g_["lr"] = lr
        ids = batcher()
        if pool is not None and n_on:
            ids = torch.cat([ids, pool[torch.randint(0, len(pool), (n_on,), generator=pool_gen)]], dim=0)
        ids = ids.to(dev, non_blocking=True)
        loss, diag = drafter_loss(drafter, target, ids, cfg.num_anchors, cfg, gen)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        step += 1
        if step % 10 == 0 or step == steps:
            hist.append({"step": step, **diag})
            steps = budget.update(step)
            if progress:
                progress(step, steps, diag)
    train_s = time.time() - t_train

    drafter.eval()
    drafter.save_pretrained(out_dir, dtype=_DTYPES[cfg.save_dtype])
    final = {k: float(np.mean([h[k] for h in hist[-5:]])) for k in hist[-1] if k != "step"} if hist else {}
    metrics = {
        "config": asdict(cfg),
        "drafter_config": dcfg.to_dict(),
        "steps_run": step,
        "final": final,
        "history": hist[:: max(1, len(hist) // 50)],
        "corpus_tokens": int(len(stream)),
        "corpus_tokens_per_workload": counts,
        "trainable_parameters": drafter.num_parameters(True),
        "total_parameters_incl_shared": drafter.num_parameters(False),
        "onpolicy_sequences": 0 if pool is None else int(len(pool)),
        "onpolicy_tokens_generated": 0 if pool is None else int(len(pool) * (cfg.seq_len - cfg.onpolicy_prompt_len)),
        "onpolicy_generation_s": round(t_gen, 2),
        "train_s": round(train_s, 2),
        "total_s": round(time.time() - t0, 2),
        "device": str(dev),
        "torch": torch.__version__,
    }
    Path(out_dir, "training.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


# --------------------------------------------------------------------------------------------------
# the whole pair


def train_pair(
    out_root: str | Path,
    tcfg: TargetTrainConfig,
    dcfg: DrafterTrainConfig,
    *,
    eval_prompts: int = 24,
    eval_new_tokens: int = 96,
    eval_temperatures: tuple[float, ...] = (0.0, 1.0),
    progress: ProgressFn | None = None,
    log: Callable[[str], None] = print,
) -> dict[str, Any]:
    """Train target then drafter into ``out_root/{target,drafter}``, evaluate acceptance per workload and
    write ``out_root/metrics.json``."""
    root = Path(out_root)
    tdir, ddir = root / "target", root / "drafter"
    log("training target ...")
    tm = train_target(tcfg, tdir, progress)
    log(f"target: {tm['parameters']:,} params, loss {tm['final_loss']:.3f}, {tm['train_s']} s, "
        f"held-out {tm['heldout_loss_per_workload']}")
    log("training drafter ...")
    dm = train_drafter(tdir, ddir, dcfg, progress)
    log(f"drafter: {dm['trainable_parameters']:,} params, final {dm['final']}, {dm['train_s']} s")
    dev = _device(dcfg.device)
    target = load_target(tdir, device=dev)
    drafter = DSparkDrafter.from_pretrained(ddir, target=target, device=dev)
    tok = load_tokenizer(tdir)
    acc: dict[str, Any] = {}
    for temp in eval_temperatures:
        t0 = time.time()
        acc[f"T={temp:g}"] = evaluate_workloads(target, drafter, tok, eval_prompts, eval_new_tokens, device=dev,
                                                temperature=temp)
        log(f"acceptance T={temp:g} ({time.time() - t0:.0f} s): "
            + ", ".join(f"{w}: tau={r['tau_mean']:.2f}" for w, r in acc[f"T={temp:g}"].items() if r["tau_mean"]))
    metrics = {
        "target": {k: v for k, v in tm.items() if k != "loss_curve_every_10"},
        "drafter": {k: v for k, v in dm.items() if k != "history"},
        "acceptance": acc,
        "sizes_bytes": {p.relative_to(root).as_posix(): p.stat().st_size
                        for p in sorted(root.rglob("*")) if p.is_file()},
    }
    (root / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
    return metrics


@dataclass
class ConfidenceFeatures:
    """What the confidence head saw and what happened, per drafted block (one row per request-step)."""

    X: torch.Tensor  # [n, G, F] the head's inputs [h_k ; W1[prev_k]]
    ceiling: torch.Tensor  # [n] uncapped accepted drafts of a full verify
    rid: list[str]  # [n] the request's id (``<workload>-<prompt index>``)

    @property
    def workload(self) -> list[str]:
        return [r.rsplit("-", 1)[0] for r in self.rid]

    def labelled(self, rows: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(features, label, position) of the positions that carry a label: "draft k accepted given drafts
        0..k-1 were"; positions past the first rejection carry none."""
        X, c = (self.X, self.ceiling) if rows is None else (self.X[rows], self.ceiling[rows])
        k = torch.arange(X.shape[1]).unsqueeze(0)
        valid = k <= c.unsqueeze(1)
        return X[valid], (k < c.unsqueeze(1)).float()[valid], k.expand_as(valid)[valid]


def refit_prompt_keys(workload: str, num_requests: int, exclude_first: int) -> tuple[list, int]:
    """(workload, prompt_index) keys of about ``num_requests`` prompts whose *texts* are not among the first
    ``exclude_first`` of ``workload`` (the audit's and its calibration split's), and the request count to load.

    Why: the generators repeat texts (chat has about 300 distinct prompts), so an index offset alone let the
    head be fitted on prompts the audit then evaluates it on."""
    prompts, pool = disjoint_prompts(workload, num_requests, exclude_first)
    return [(p.workload, p.prompt_index) for p in prompts], pool


def collect_confidence_features(target: str | Path, drafter: str | Path, *, workload: str, num_requests: int,
                                exclude_first: int, temperature: float = 0.0, max_new_tokens: int = 64,
                                batch: int = 64, seed: int = 0) -> ConfidenceFeatures:
    """Serve a cap-accept run (every block verified in full, no SPS table) on text-disjoint prompts and record
    the confidence head's inputs, each block's ceiling and its request's workload."""
    seed_everything(seed)
    _, _, model, dr = load_models(target, drafter)
    feats: list[torch.Tensor] = []
    ceilings: list[torch.Tensor] = []
    labels: list[str] = []
    head = dr.confidence_logits

    def record_feats(h: torch.Tensor, prev: torch.Tensor) -> torch.Tensor:
        f = h
        if dr.markov_w1 is not None and dr.config.confidence_with_markov:
            f = torch.cat([h, dr.markov_w1(prev).to(h.dtype)], dim=-1)
        feats.append(f.detach().float().clone())
        return head(h, prev)

    orig_verify = runner_mod.run_verify
    orig_push = LaggedSurvival.push

    def record_verify(*a, **k):
        vr = orig_verify(*a, **k)
        ceilings.append(vr.ceiling.clone())
        return vr

    def record_push(self, rids, survival):  # called once per decode step with the batch's rids, in row order
        labels.extend(rids)
        return orig_push(self, rids, survival)

    orig_load = eng_pkg.load_models
    dr.confidence_logits = record_feats
    runner_mod.run_verify = record_verify
    LaggedSurvival.push = record_push
    eng_pkg.load_models = lambda t, d: (Path(t), Path(d), model, dr)
    keys, pool = refit_prompt_keys(workload, num_requests, exclude_first)
    try:
        cfg = EngineConfig(arm="cap-accept", target=str(target), drafter=str(drafter), workload=workload,
                           num_requests=pool, prompt_offset=int(exclude_first), request_keys=keys,
                           temperature=temperature, max_new_tokens=max_new_tokens, max_running_requests=batch,
                           sps="none", seed=seed)
        run_engine(cfg)
    finally:
        runner_mod.run_verify = orig_verify
        LaggedSurvival.push = orig_push
        eng_pkg.load_models = orig_load
        del dr.confidence_logits
    X, c = torch.cat(feats), torch.cat(ceilings).long()
    if not (X.shape[0] == c.shape[0] == len(labels)):
        raise RuntimeError(f"feature rows {X.shape[0]}, ceilings {c.shape[0]} and labels {len(labels)} disagree")
    return ConfidenceFeatures(X, c, labels)


def fit_confidence_head(X: torch.Tensor, y: torch.Tensor, w0: torch.Tensor, b0: torch.Tensor,
                        l2: float = 1e-3, weight: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """L2-regularised logistic regression of the label on the head's inputs (LBFGS from ``w0, b0``);
    ``weight`` (per sample, mean 1) lets a workload with fewer blocks count as much as the others."""
    w = torch.nn.Parameter(w0.detach().float().clone().view(-1))
    b = torch.nn.Parameter(b0.detach().float().clone().view(-1))
    opt = torch.optim.LBFGS([w, b], max_iter=200, line_search_fn="strong_wolfe")

    def closure():
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(X @ w + b, y, weight=weight) + l2 * (w * w).sum()
        loss.backward()
        return loss

    opt.step(closure)
    return w.detach(), b.detach()


def head_nll(X: torch.Tensor, y: torch.Tensor, w: torch.Tensor, b: torch.Tensor) -> float:
    with torch.no_grad():
        return float(F.binary_cross_entropy_with_logits(X @ w.view(-1) + b.view(-1), y))


def refit_confidence_head(target: str | Path, drafter: str | Path, out_dir: str | Path, *,
                          workload: str = REFIT_WORKLOAD, num_requests: int = REFIT_REQUESTS,
                          exclude_first: int = REFIT_EXCLUDE_FIRST, temperature: float = 0.0,
                          max_new_tokens: int = REFIT_NEW_TOKENS, batch: int = 64, l2: float = REFIT_L2,
                          seed: int = 0) -> dict[str, Any]:
    """Refit the drafter's confidence head on the acceptance the engine actually serves (CPU, minutes).

    Why: the head is trained with ``c* = 1 - TV(q, p)`` (the *sampled* acceptance probability), so at
    greedy decoding it is overconfident on high-entropy text (chat, verse), and one temperature per
    position (STS) cannot undo a miscalibration that differs by workload. This serves a cap-accept
    run on prompts whose texts the audit's do not share (:func:`refit_prompt_keys`), records the head's
    input features ``[h_k ; W1[prev_k]]`` of every drafted position, and refits ``w, b`` by L2-regularised
    logistic regression on the conditional label "draft k accepted given drafts 0..k-1 were".
    Only the confidence head changes; drafts, losslessness and acceptance are unchanged.
    """
    feats = collect_confidence_features(target, drafter, workload=workload, num_requests=num_requests,
                                        exclude_first=exclude_first, temperature=temperature,
                                        max_new_tokens=max_new_tokens, batch=batch, seed=seed)
    _, _, _, dr = load_models(target, drafter)
    Xv, yv, _ = feats.labelled()
    lin = dr.confidence_head
    before = head_nll(Xv, yv, lin.weight.float(), lin.bias.float())
    w, b = fit_confidence_head(Xv, yv, lin.weight, lin.bias, l2=l2)
    after = head_nll(Xv, yv, w, b)
    with torch.no_grad():
        lin.weight.copy_(w.view_as(lin.weight).to(lin.weight.dtype))
        lin.bias.copy_(b.view_as(lin.bias).to(lin.bias.dtype))
    out = Path(out_dir)
    dr.save_pretrained(out, dtype=torch.bfloat16)
    per_wl = {wl: feats.workload.count(wl) for wl in dict.fromkeys(feats.workload)}
    info = {"refit_confidence_head": {"workload": workload, "num_requests": num_requests,
                                      "exclude_first": exclude_first, "blocks_per_workload": per_wl,
                                      "temperature": temperature, "max_new_tokens": max_new_tokens, "batch": batch,
                                      "samples": int(yv.numel()), "positive_rate": float(yv.mean()),
                                      "nll_before": before, "nll_after": after, "l2": l2, "seed": seed}}
    tj = out / "training.json"
    doc = json.loads(tj.read_text()) if tj.is_file() else {}
    doc.update(info)
    tj.write_text(json.dumps(doc, indent=1, sort_keys=True))
    return info
