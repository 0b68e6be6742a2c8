"""The DSpark block drafter: a parallel backbone with target-context KV injection, a Markov head and a
confidence head (DSpark paper §2.2, §3.1-3.2; DeepSpec ``Qwen3DSparkModel``), written from the paper's
equations for CPU/GPU PyTorch.

Data flow for one request whose anchor (last committed token) sits at absolute position ``s``:

* context: the target hidden states of positions ``0..s-1`` (the chosen layers, concatenated) go through
  ``H_ctx = RMSNorm(fc(.))``; every draft layer turns ``H_ctx`` into its own context K/V
  (``k_norm(k_proj(H_ctx))`` with RoPE at the absolute position, ``v_proj(H_ctx)``). Those K/V are computed
  once per position and cached in a :class:`DraftState` (``extend_context``).
* block: ``gamma`` input slots ``[anchor, MASK x (gamma-1)]`` at positions ``s .. s+gamma-1`` (the anchor is
  the first prediction slot); queries come from the block only, attend to all the context and
  bidirectionally to the whole block; slot ``k`` yields the base logits ``U_k`` of draft ``d_k`` at position
  ``s+k+1``.
* Markov head: ``B(prev) = W2(W1[prev])`` is added to ``U_k`` and tokens are sampled left to right
  (``prev`` = anchor for ``k = 0``, else the previous sampled draft). The corrected softmax is the draft
  distribution ``q_k`` used for verification. ``markov_head_type="rnn"`` swaps in the paper's RNN head
  (Eq. 6: a gated state over the block); the shipped fixture uses the vanilla head, the paper's default.
* confidence head: ``z_k = w^T [h_k ; W1[prev_k]] + b`` (a logit; sigmoid is the conditional probability
  that ``d_k`` survives given that all earlier drafts did).

The embedding and LM head are frozen copies of the target's; they are not saved with the drafter unless
asked (``save_pretrained(..., save_shared=True)``) and are restored from the target on load.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any, Sequence

import torch
import torch.nn.functional as F
from safetensors.torch import load_file, save_file
from torch import Tensor, nn

from acceptscope.engine.sampling import sample_inverse_cdf
from acceptscope.engine.target import load_target

__all__ = [
    "DrafterConfig",
    "DraftState",
    "Proposal",
    "DSparkDrafter",
    "SHARED_KEYS",
    "position_weights",
]

DSPARK_MARKER = "dspark"
FORMAT_VERSION = 1
SHARED_KEYS = ("embed_tokens.weight", "lm_head.weight")


@dataclass
class DrafterConfig:
    """Drafter hyper-parameters; saved as ``config.json`` with a ``"dspark"`` marker."""

    vocab_size: int
    hidden_size: int
    num_layers: int
    num_heads: int
    head_dim: int
    intermediate_size: int
    target_layer_ids: list[int]
    target_hidden_size: int
    mask_token_id: int
    gamma: int = 7
    markov_rank: int = 64
    markov_head_type: str = "vanilla"  # "vanilla" | "rnn" | "none"
    confidence_with_markov: bool = True
    num_kv_heads: int | None = None
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    max_position_embeddings: int = 4096
    eos_token_id: int | None = None
    target_path: str | None = None  # hint: where the target lives, relative to the drafter dir or absolute
    loss_decay_gamma: float = 4.0
    extra: dict[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        self.target_layer_ids = [int(i) for i in self.target_layer_ids]
        if self.num_kv_heads is None:
            self.num_kv_heads = self.num_heads
        if self.num_heads % self.num_kv_heads:
            raise ValueError("num_heads must be a multiple of num_kv_heads")
        if self.gamma < 1:
            raise ValueError("gamma must be >= 1")
        if self.markov_head_type not in ("vanilla", "rnn", "none"):
            raise ValueError(f"markov_head_type {self.markov_head_type!r}: supported are 'vanilla', 'rnn' and 'none'")
        if not 0 <= self.mask_token_id < self.vocab_size:
            raise ValueError(f"mask_token_id {self.mask_token_id} outside the vocabulary (size {self.vocab_size})")

    @property
    def context_dim(self) -> int:
        """Width of the concatenated target features ``extend_context`` expects."""
        return len(self.target_layer_ids) * self.target_hidden_size

    @property
    def markov_enabled(self) -> bool:
        return self.markov_head_type != "none" and self.markov_rank > 0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        return {DSPARK_MARKER: True, "format_version": FORMAT_VERSION, "model_type": "dspark_drafter", **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "DrafterConfig":
        if not d.get(DSPARK_MARKER):
            raise ValueError("config has no 'dspark' marker: not an acceptscope DSpark drafter config")
        names = {f.name for f in fields(cls)}
        unknown = sorted(set(d) - names - {DSPARK_MARKER, "format_version", "model_type"})
        kwargs = {k: v for k, v in d.items() if k in names}
        cfg = cls(**kwargs)
        if unknown:
            cfg.extra.setdefault("unknown_keys", unknown)
        return cfg


@dataclass
class DraftState:
    """Per-request drafter context: the injected context K/V of every draft layer, cached once per position.

    ``k``/``v`` are ``[num_layers, num_kv_heads, capacity, head_dim]``; only ``[:, :, :length]`` is valid.
    """

    k: Tensor
    v: Tensor
    length: int = 0

    @property
    def capacity(self) -> int:
        return int(self.k.shape[2])

    def truncate(self, length: int) -> None:
        """Forget context positions ``>= length`` (e.g. after a rollback)."""
        if not 0 <= length <= self.length:
            raise ValueError(f"truncate({length}) outside 0..{self.length}")
        self.length = int(length)

    def _ensure(self, need: int) -> None:
        if need <= self.capacity:
            return
        cap = max(need, 2 * self.capacity, 16)
        L, H, _, D = self.k.shape
        k = self.k.new_zeros((L, H, cap, D))
        v = self.v.new_zeros((L, H, cap, D))
        k[:, :, : self.length] = self.k[:, :, : self.length]
        v[:, :, : self.length] = self.v[:, :, : self.length]
        self.k, self.v = k, v


@dataclass
class Proposal:
    """One drafted block per request.

    ``tokens[b, k]`` is draft ``d_k`` (position ``s_b + k + 1``); ``logprobs[b, k]`` is ``log q_k`` of the
    Markov-corrected distribution the token was sampled from, at the row's temperature (for greedy rows:
    the T=1 distribution, tokens are its argmax); ``confidence_logits[b, k]`` is the raw (pre-STS) ``z_k``.
    """

    tokens: Tensor
    logprobs: Tensor
    confidence_logits: Tensor


def position_weights(gamma: int, decay: float = 4.0, device: Any = None) -> Tensor:
    """Loss weight of block slot k (0-based): ``exp(-k / decay)`` (DeepSpec's ``loss_decay_gamma``)."""
    return torch.exp(-torch.arange(gamma, dtype=torch.float32, device=device) / float(decay))


# --------------------------------------------------------------------------------------------------
# building blocks


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float = 1e-6) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(dim))
        self.eps = eps

    def forward(self, x: Tensor) -> Tensor:
        dt = x.dtype
        x32 = x.float()
        x32 = x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x32.to(dt)


def _rope(positions: Tensor, head_dim: int, theta: float, dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """cos/sin ``[..., n, head_dim]`` for integer positions ``[..., n]`` (HF's rotate-half layout)."""
    inv = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=positions.device, dtype=torch.float32) / head_dim))
    ang = positions.float().unsqueeze(-1) * inv
    emb = torch.cat([ang, ang], dim=-1)
    return emb.cos().to(dtype), emb.sin().to(dtype)


def _rotate_half(x: Tensor) -> Tensor:
    h = x.shape[-1] // 2
    return torch.cat([-x[..., h:], x[..., :h]], dim=-1)


def _apply_rope(x: Tensor, cos: Tensor, sin: Tensor) -> Tensor:
    # x [B, H, n, D]; cos/sin [B, n, D]
    return x * cos.unsqueeze(1) + _rotate_half(x) * sin.unsqueeze(1)


class DraftAttention(nn.Module):
    """Qwen3-style attention whose keys/values are ``[context K/V ; block K/V]`` (paper Eq. 3)."""

    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        d, H, KV, D = cfg.hidden_size, cfg.num_heads, cfg.num_kv_heads, cfg.head_dim
        self.H, self.KV, self.D = H, KV, D
        self.q_proj = nn.Linear(d, H * D, bias=False)
        self.k_proj = nn.Linear(d, KV * D, bias=False)
        self.v_proj = nn.Linear(d, KV * D, bias=False)
        self.o_proj = nn.Linear(H * D, d, bias=False)
        self.q_norm = RMSNorm(D, cfg.rms_norm_eps)
        self.k_norm = RMSNorm(D, cfg.rms_norm_eps)

    def kv(self, x: Tensor, cos: Tensor, sin: Tensor) -> tuple[Tensor, Tensor]:
        """K/V ``[B, KV, n, D]`` of hidden states ``x [B, n, d]`` at the positions encoded by cos/sin."""
        B, n, _ = x.shape
        k = self.k_norm(self.k_proj(x).view(B, n, self.KV, self.D)).transpose(1, 2)
        v = self.v_proj(x).view(B, n, self.KV, self.D).transpose(1, 2)
        return _apply_rope(k, cos, sin), v

    def forward(
        self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor
    ) -> Tensor:
        """``x [B, Q, d]`` block hidden; ``ctx_k/v [B, KV, L, D]``; ``mask [B, 1, Q, L+Q]`` (True = attend)."""
        B, Q, _ = x.shape
        q = self.q_norm(self.q_proj(x).view(B, Q, self.H, self.D)).transpose(1, 2)
        q = _apply_rope(q, cos, sin)
        bk, bv = self.kv(x, cos, sin)
        k = torch.cat([ctx_k.to(bk.dtype), bk], dim=2)
        v = torch.cat([ctx_v.to(bv.dtype), bv], dim=2)
        if self.KV != self.H:
            rep = self.H // self.KV
            k = k.repeat_interleave(rep, dim=1)
            v = v.repeat_interleave(rep, dim=1)
        o = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.o_proj(o.transpose(1, 2).reshape(B, Q, self.H * self.D))


class DraftMLP(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.gate_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.up_proj = nn.Linear(cfg.hidden_size, cfg.intermediate_size, bias=False)
        self.down_proj = nn.Linear(cfg.intermediate_size, cfg.hidden_size, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class DraftLayer(nn.Module):
    def __init__(self, cfg: DrafterConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.self_attn = DraftAttention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.hidden_size, cfg.rms_norm_eps)
        self.mlp = DraftMLP(cfg)

    def forward(self, x: Tensor, cos: Tensor, sin: Tensor, ctx_k: Tensor, ctx_v: Tensor, mask: Tensor) -> Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, ctx_k, ctx_v, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


# --------------------------------------------------------------------------------------------------
# the drafter


class DSparkDrafter(nn.Module):
    """DSpark drafter (vanilla or RNN Markov head + confidence head). See the module docstring."""

    def __init__(self, config: DrafterConfig) -> None:
        super().__init__()
        self.config = config
        c = config
        self.embed_tokens = nn.Embedding(c.vocab_size, c.hidden_size)
        self.lm_head = nn.Linear(c.hidden_size, c.vocab_size, bias=False)
        self.fc = nn.Linear(c.context_dim, c.hidden_size, bias=False)
        self.hidden_norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        self.layers = nn.ModuleList([DraftLayer(c) for _ in range(c.num_layers)])
        self.norm = RMSNorm(c.hidden_size, c.rms_norm_eps)
        r = c.markov_rank if c.markov_enabled else 0
        if r:
            self.markov_w1 = nn.Embedding(c.vocab_size, r)
            self.markov_w2 = nn.Linear(r, c.vocab_size, bias=False)
        else:
            self.markov_w1 = None
            self.markov_w2 = None
        # RNN head (paper Eq. 6): one joint projection of z_k = [s_{k-1} ; W1[x_{k-1}] ; h_k] split into
        # gate / candidate / output; the bias of step k is W2 tanh(output(z_k)); s_0 = 0
        self.rnn_proj = nn.Linear(2 * r + c.hidden_size, 3 * r) if (r and c.markov_head_type == "rnn") else None
        conf_in = c.hidden_size + (r if (r and c.confidence_with_markov) else 0)
        self.confidence_head = nn.Linear(conf_in, 1)
        self._init_weights()
        self.freeze_shared()

    # ---- init / sharing -------------------------------------------------------------------------

    def _init_weights(self) -> None:
        std = 0.02
        for name, p in self.named_parameters():
            if p.dim() < 2:
                continue
            nn.init.normal_(p, mean=0.0, std=std)
        # scaled residual projections, as in GPT-2 style init
        for layer in self.layers:
            nn.init.normal_(layer.self_attn.o_proj.weight, std=std / math.sqrt(2 * len(self.layers)))
            nn.init.normal_(layer.mlp.down_proj.weight, std=std / math.sqrt(2 * len(self.layers)))
        if self.markov_w2 is not None:
            nn.init.zeros_(self.markov_w2.weight)  # start as the plain parallel drafter
        nn.init.zeros_(self.confidence_head.weight)
        nn.init.zeros_(self.confidence_head.bias)

    def freeze_shared(self) -> None:
        self.embed_tokens.weight.requires_grad_(False)
        self.lm_head.weight.requires_grad_(False)

    @torch.no_grad()
    def load_shared_from_target(self, target: Any) -> None:
        """Copy (frozen) the target's input embedding and output head."""
        emb = target.get_input_embeddings().weight
        head = target.get_output_embeddings().weight
        if tuple(emb.shape) != tuple(self.embed_tokens.weight.shape):
            raise ValueError(
                f"target embedding {tuple(emb.shape)} does not match the drafter's "
                f"(vocab {self.config.vocab_size}, hidden {self.config.hidden_size})"
            )
        self.embed_tokens.weight.copy_(emb.to(self.embed_tokens.weight))
        self.lm_head.weight.copy_(head.to(self.lm_head.weight))
        self.freeze_shared()

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.parameters() if p.requires_grad]

    def num_parameters(self, trainable_only: bool = True) -> int:
        ps = self.trainable_parameters() if trainable_only else list(self.parameters())
        return int(sum(p.numel() for p in ps))

    @property
    def device(self) -> torch.device:
        return self.fc.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.fc.weight.dtype

    # ---- save / load ----------------------------------------------------------------------------

    def save_pretrained(self, path: str | Path, *, save_shared: bool = False, dtype: torch.dtype | None = None) -> None:
        """Write ``config.json`` (with the ``dspark`` marker) and ``model.safetensors``.

        The frozen embedding/LM head are left out unless ``save_shared``: they are the target's.
        ``dtype`` casts floating weights on the way out (e.g. ``torch.bfloat16`` to halve the size).
        """
        p = Path(path)
        p.mkdir(parents=True, exist_ok=True)
        sd = {}
        for k, v in self.state_dict().items():
            if not save_shared and k in SHARED_KEYS:
                continue
            t = v.detach().cpu()
            if dtype is not None and t.is_floating_point():
                t = t.to(dtype)
            sd[k] = t.contiguous()
        cfg = self.config.to_dict()
        cfg["shared_weights_saved"] = bool(save_shared)
        cfg["torch_dtype"] = str(dtype or self.dtype).replace("torch.", "")
        (p / "config.json").write_text(json.dumps(cfg, indent=2, sort_keys=True) + "\n")
        save_file(sd, str(p / "model.safetensors"), metadata={"format": "pt", DSPARK_MARKER: "1"})

    @classmethod
    def from_pretrained(
        cls,
        path: str | Path,
        target: Any = None,
        *,
        device: str | torch.device = "cpu",
        dtype: torch.dtype = torch.float32,
    ) -> "DSparkDrafter":
        """Load a drafter directory. ``target`` (a loaded HF model or a path) supplies embed/lm_head when
        they were not saved; if it is None, ``config.target_path`` (relative to ``path``) is tried."""
        p = Path(path)
        cfg_file = p / "config.json"
        if not cfg_file.is_file():
            raise FileNotFoundError(f"{cfg_file}: missing (not a drafter directory)")
        try:
            raw = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise ValueError(f"{cfg_file}: line {e.lineno}: invalid JSON ({e.msg})") from None
        try:
            cfg = DrafterConfig.from_dict(raw)
        except (TypeError, ValueError) as e:
            raise ValueError(f"{cfg_file}: {e}") from None
        model = cls(cfg)
        sd = load_file(str(p / "model.safetensors"))
        missing_shared = [k for k in SHARED_KEYS if k not in sd]
        if missing_shared:
            if target is None and cfg.target_path:
                tp = Path(cfg.target_path)
                target = tp if tp.is_absolute() else (p / tp)
            if target is None:
                raise ValueError(
                    f"{p}: embed_tokens/lm_head were not saved with the drafter; pass target= (model or path)"
                )
            if isinstance(target, (str, Path)):
                target = load_target(target, dtype=torch.float32)
            model.load_shared_from_target(target)
        model_sd = model.state_dict()
        unexpected = sorted(set(sd) - set(model_sd))
        if unexpected:
            raise ValueError(f"{p / 'model.safetensors'}: unexpected tensors {unexpected[:5]}")
        for k, v in sd.items():
            if tuple(v.shape) != tuple(model_sd[k].shape):
                raise ValueError(f"{p / 'model.safetensors'}: tensor {k} has shape {tuple(v.shape)}, "
                                 f"config expects {tuple(model_sd[k].shape)}")
        model.load_state_dict({**{k: model_sd[k] for k in missing_shared}, **sd}, strict=True)
        model.freeze_shared()
        model.to(device=device, dtype=dtype)
        model.eval()
        return model

    # ---- core pieces ----------------------------------------------------------------------------

    def context_features(self, target_hidden: Tensor) -> Tensor:
        """``H_ctx = RMSNorm(fc(concat target layers))`` (paper Eq. 2)."""
        if target_hidden.shape[-1] != self.config.context_dim:
            raise ValueError(
                f"target hidden width {target_hidden.shape[-1]} != {len(self.config.target_layer_ids)} layers x "
                f"{self.config.target_hidden_size}"
            )
        return self.hidden_norm(self.fc(target_hidden.to(self.dtype)))

    def _rope(self, positions: Tensor) -> tuple[Tensor, Tensor]:
        return _rope(positions, self.config.head_dim, self.config.rope_theta, self.dtype)

    def context_kv(self, hctx: Tensor, positions: Tensor) -> list[tuple[Tensor, Tensor]]:
        """Per-layer context K/V ``[B, KV, n, D]`` for ``hctx [B, n, d]`` at ``positions [B, n]``."""
        cos, sin = self._rope(positions)
        return [layer.self_attn.kv(hctx, cos, sin) for layer in self.layers]

    def backbone(
        self, x: Tensor, positions: Tensor, ctx_kv: Sequence[tuple[Tensor, Tensor]], mask: Tensor
    ) -> Tensor:
        """Block hidden ``x [B, Q, d]`` at ``positions [B, Q]`` -> final-normed ``h [B, Q, d]``."""
        cos, sin = self._rope(positions)
        for layer, (ck, cv) in zip(self.layers, ctx_kv):
            x = layer(x, cos, sin, ck, cv, mask)
        return self.norm(x)

    def sequential_bias(
        self, prev_tokens: Tensor, h: Tensor, state: Tensor | None
    ) -> tuple[Tensor | None, Tensor | None]:
        """Bias ``B_k`` of one block step and the head's next state (vanilla: stateless ``W2(W1[prev])``;
        RNN: Eq. 6 with ``state = s_{k-1}``, zeros when None)."""
        if self.markov_w1 is None:
            return None, None
        e = self.markov_w1(prev_tokens)
        if self.rnn_proj is None:
            return self.markov_w2(e), None
        if state is None:
            state = e.new_zeros(e.shape)
        gate, cand, out = self.rnn_proj(torch.cat([state, e, h.to(e.dtype)], dim=-1)).chunk(3, dim=-1)
        g = torch.sigmoid(gate)
        new_state = g * state + (1 - g) * torch.tanh(cand)
        return self.markov_w2(torch.tanh(out)), new_state

    def markov_bias(self, prev_tokens: Tensor) -> Tensor | None:
        """``W2(W1[prev])`` -> ``[..., V]`` (the vanilla head's bias; for the RNN head this is only the
        stateless part and not what sampling uses), or None without a Markov head."""
        if self.markov_w1 is None:
            return None
        return self.markov_w2(self.markov_w1(prev_tokens))

    def confidence_logits(self, h: Tensor, prev_tokens: Tensor) -> Tensor:
        """``z_k = Linear([h_k ; W1[x_{k-1}]])`` -> ``[...]`` (a logit)."""
        feats = h
        if self.markov_w1 is not None and self.config.confidence_with_markov:
            feats = torch.cat([h, self.markov_w1(prev_tokens).to(h.dtype)], dim=-1)
        return self.confidence_head(feats).squeeze(-1)

    def block_input_ids(self, anchors: Tensor) -> Tensor:
        """``[..., gamma]`` ids: the anchor then ``gamma-1`` mask tokens."""
        g = self.config.gamma
        ids = torch.full((*anchors.shape, g), self.config.mask_token_id, dtype=torch.long, device=anchors.device)
        ids[..., 0] = anchors
        return ids

    # ---- inference API --------------------------------------------------------------------------

    def new_state(self, capacity: int = 256) -> DraftState:
        c = self.config
        shape = (c.num_layers, c.num_kv_heads, capacity, c.head_dim)
        return DraftState(k=torch.zeros(shape, device=self.device, dtype=self.dtype),
                          v=torch.zeros(shape, device=self.device, dtype=self.dtype), length=0)

    @torch.no_grad()
    def extend_context(self, state: DraftState, target_hidden: Tensor) -> None:
        """Append the target hidden states ``[n, len(ids)*H]`` of the next ``n`` committed positions."""
        if target_hidden.dim() == 3 and target_hidden.shape[0] == 1:
            target_hidden = target_hidden[0]
        if target_hidden.dim() != 2:
            raise ValueError(f"extend_context expects [n, {self.config.context_dim}], got {tuple(target_hidden.shape)}")
        n = int(target_hidden.shape[0])
        if n == 0:
            return
        start = state.length
        hctx = self.context_features(target_hidden.to(self.device)).unsqueeze(0)
        pos = torch.arange(start, start + n, device=self.device).unsqueeze(0)
        state._ensure(start + n)
        for i, (k, v) in enumerate(self.context_kv(hctx, pos)):
            state.k[i, :, start : start + n] = k[0].to(state.k.dtype)
            state.v[i, :, start : start + n] = v[0].to(state.v.dtype)
        state.length = start + n

    @torch.no_grad()
    def extend_contexts(self, states: Sequence[DraftState], target_hiddens: Sequence[Tensor]) -> None:
        """Batched :meth:`extend_context` for many requests: one projection over all new rows (context K/V
        are position-wise, so the result equals per-request calls)."""
        if len(states) != len(target_hiddens):
            raise ValueError(f"{len(states)} states but {len(target_hiddens)} hidden-state blocks")
        hs = [h[0] if h.dim() == 3 and h.shape[0] == 1 else h for h in target_hiddens]
        pairs = [(st, h) for st, h in zip(states, hs) if int(h.shape[0]) > 0]
        if not pairs:
            return
        ns = [int(h.shape[0]) for _, h in pairs]
        hctx = self.context_features(torch.cat([h.to(self.device) for _, h in pairs], 0)).unsqueeze(0)
        pos = torch.cat([torch.arange(st.length, st.length + n, device=self.device) for (st, _), n in zip(pairs, ns)])
        kvs = self.context_kv(hctx, pos.unsqueeze(0))
        # all layers at once: [L, KV, n_total, D], so each state takes one copy for K and one for V
        ks = torch.stack([k[0] for k, _ in kvs])
        vs = torch.stack([v[0] for _, v in kvs])
        off = 0
        for (st, _), n in zip(pairs, ns):
            a = st.length
            st._ensure(a + n)
            st.k[:, :, a : a + n] = ks[:, :, off : off + n]
            st.v[:, :, a : a + n] = vs[:, :, off : off + n]
            st.length = a + n
            off += n

    @torch.no_grad()
    def propose(
        self,
        states: Sequence[DraftState],
        anchor_tokens: Tensor,
        temperatures: Tensor | None = None,
        generator: torch.Generator | Sequence[torch.Generator] | None = None,
    ) -> Proposal:
        """Draft one block of ``gamma`` tokens for each request (batched; contexts may differ in length).

        ``generator``: a sequence of one ``torch.Generator`` per row makes each row's draws depend on
        that row's generator only (a request's drafts do not change with its batch companions): every
        row then takes exactly ``gamma`` uniforms from its generator per call, greedy or not, and
        samples by inverse CDF. A single generator (or None) keeps the batch-wide ``multinomial``
        draw, whose per-row result depends on the batch.
        """
        c, dev = self.config, self.device
        B, g = len(states), c.gamma
        row_u = None
        if generator is not None and not isinstance(generator, torch.Generator):
            gens = list(generator)
            if len(gens) != B:
                raise ValueError(f"{B} states but {len(gens)} generators (need one per row)")
            row_u = (torch.stack([torch.rand(g, generator=gn, device=gn.device).cpu() for gn in gens])
                     if B else torch.empty((0, g))).to(dev)
        anchors = anchor_tokens.to(dev, torch.long).view(-1)
        if anchors.numel() != B:
            raise ValueError(f"{B} states but {anchors.numel()} anchor tokens")
        temps = (torch.zeros(B) if temperatures is None else torch.as_tensor(temperatures, dtype=torch.float32))
        temps = temps.to(dev, torch.float32).view(-1)
        if B == 0:
            V = c.vocab_size
            return Proposal(tokens=torch.empty((0, g), dtype=torch.long, device=dev),
                            logprobs=torch.empty((0, g, V), device=dev),
                            confidence_logits=torch.empty((0, g), device=dev))
        lens = torch.tensor([s.length for s in states], device=dev, dtype=torch.long)
        L = int(lens.max().item())

        # padded context K/V per layer: [B, KV, L, D]
        ctx_kv = []
        for li in range(c.num_layers):
            ks = torch.zeros((B, c.num_kv_heads, L, c.head_dim), device=dev, dtype=self.dtype)
            vs = torch.zeros_like(ks)
            for b, s in enumerate(states):
                ks[b, :, : s.length] = s.k[li, :, : s.length]
                vs[b, :, : s.length] = s.v[li, :, : s.length]
            ctx_kv.append((ks, vs))
        mask = torch.ones((B, 1, g, L + g), dtype=torch.bool, device=dev)
        mask[:, 0, :, :L] = (torch.arange(L, device=dev).unsqueeze(0) < lens.unsqueeze(1)).unsqueeze(1)

        ids = self.block_input_ids(anchors)  # [B, g]
        positions = lens.unsqueeze(1) + torch.arange(g, device=dev).unsqueeze(0)
        h = self.backbone(self.embed_tokens(ids), positions, ctx_kv, mask)  # [B, g, d]
        base = self.lm_head(h).float()  # U_k

        tokens = torch.empty((B, g), dtype=torch.long, device=dev)
        logprobs = torch.empty((B, g, c.vocab_size), dtype=torch.float32, device=dev)
        greedy = temps < 1e-5
        safe_t = torch.where(greedy, torch.ones_like(temps), temps).unsqueeze(1)
        prev = anchors
        prevs = []
        rnn_state = None
        for k in range(g):
            prevs.append(prev)
            logits = base[:, k]
            bias, rnn_state = self.sequential_bias(prev, h[:, k], rnn_state)
            if bias is not None:
                logits = logits + bias.float()
            lp = torch.log_softmax(logits / safe_t, dim=-1)
            tok = logits.argmax(-1)
            if row_u is not None:
                tok = torch.where(greedy, tok, sample_inverse_cdf(lp.exp(), row_u[:, k]))
            elif not bool(greedy.all()):
                probs = lp.exp()
                if generator is not None and generator.device != probs.device:
                    probs = probs.to(generator.device)  # sample where the generator lives
                sampled = torch.multinomial(probs, 1, generator=generator).squeeze(1).to(dev)
                tok = torch.where(greedy, tok, sampled)
            tokens[:, k] = tok
            logprobs[:, k] = lp
            prev = tok
        conf = self.confidence_logits(h, torch.stack(prevs, dim=1)).float()
        return Proposal(tokens=tokens, logprobs=logprobs, confidence_logits=conf)

    # ---- training forward -----------------------------------------------------------------------

    def forward_train(self, target_hidden: Tensor, input_ids: Tensor, anchors: Tensor) -> dict[str, Tensor]:
        """Teacher-forced block forward for many anchors per sequence.

        ``target_hidden [B, T, m*H]``, ``input_ids [B, T]``, ``anchors [B, N]`` (positions, each with
        ``anchor >= 1``). Block ``n`` sees the context ``< anchors[:, n]`` and its own slots. Returns
        ``h [B,N,g,d]``, ``logits`` (Markov-corrected, teacher-forced prev tokens) ``[B,N,g,V]``,
        ``confidence_logits [B,N,g]``, ``label_pos [B,N,g]`` (position of each slot's label; may be >= T).
        """
        c = self.config
        B, T = input_ids.shape
        N, g = anchors.shape[1], c.gamma
        dev = input_ids.device
        hctx = self.context_features(target_hidden)
        ctx_pos = torch.arange(T, device=dev).unsqueeze(0).expand(B, T)
        ctx_kv = self.context_kv(hctx, ctx_pos)

        slot = torch.arange(g, device=dev)
        block_pos = anchors.unsqueeze(-1) + slot  # [B, N, g]
        anchor_tok = input_ids.gather(1, anchors)
        ids = self.block_input_ids(anchor_tok)  # [B, N, g]
        x = self.embed_tokens(ids).view(B, N * g, -1)

        q_anchor = anchors.unsqueeze(-1).expand(B, N, g).reshape(B, N * g)
        q_block = torch.arange(N, device=dev).repeat_interleave(g).unsqueeze(0)
        ctx_mask = torch.arange(T, device=dev).view(1, 1, T) < q_anchor.unsqueeze(-1)  # [B, Q, T]
        blk_mask = (q_block.unsqueeze(-1) == q_block.unsqueeze(1)).expand(B, N * g, N * g)
        mask = torch.cat([ctx_mask, blk_mask], dim=-1).unsqueeze(1)

        h = self.backbone(x, block_pos.view(B, N * g), ctx_kv, mask).view(B, N, g, -1)
        logits = self.lm_head(h).float()
        prev_pos = block_pos.clamp(max=T - 1)
        prev_tok = input_ids.gather(1, prev_pos.view(B, -1)).view(B, N, g)
        if self.rnn_proj is None:
            bias = self.markov_bias(prev_tok)
            if bias is not None:
                logits = logits + bias.float()
        else:  # unrolled over the block, teacher-forced
            st, steps = None, []
            for k in range(g):
                b_k, st = self.sequential_bias(prev_tok[:, :, k], h[:, :, k], st)
                steps.append(b_k.float())
            logits = logits + torch.stack(steps, dim=2)
        conf = self.confidence_logits(h, prev_tok).float()
        return {"h": h, "logits": logits, "confidence_logits": conf, "label_pos": block_pos + 1}
