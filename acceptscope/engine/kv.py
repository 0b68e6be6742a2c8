"""Per-request target KV cache and a ragged (packed) cached forward of a Qwen3/Llama-style HF model.

Why not HF's own cache: continuous batching needs every request at its own length, and
compact verify needs only the window rows of each request to run. This module keeps a
slot pool (``[slots, max_len, kv_heads, head_dim]`` per layer, like SGLang's request pool)
and runs the HF model's own submodules (projections, norms, MLP, rotary embedding) on a
*packed* token matrix ``[T, hidden]`` whose request boundaries are ``cu_seqlens``-style
offsets. Every token-wise op (all projections, MLP, norms, LM head) therefore executes
exactly ``T = sum(lens)`` rows. Only the attention core pads queries per request to the
longest query of the batch (CPU SDPA has no varlen kernel); nothing is padded back to
gamma + 1.

KV entries written past the committed length (rejected drafts) are simply overwritten by
the next forward of that slot: the committed length is the caller's bookkeeping.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Optional, Sequence

import torch
import torch.nn.functional as F


def _rotate_half(x: torch.Tensor) -> torch.Tensor:
    h = x.shape[-1] // 2
    return torch.cat((-x[..., h:], x[..., :h]), dim=-1)


@dataclass
class PackedBatch:
    """Index tensors describing one ragged forward (built once, shared by all layers)."""

    slots: torch.Tensor  # [B]
    starts: list[int]
    lens: list[int]
    cu_seqlens: torch.Tensor  # [B+1]
    tok_slot: torch.Tensor  # [T] slot of each packed token
    tok_pos: torch.Tensor  # [T] absolute position of each packed token
    pad_index: torch.Tensor  # [T] index into the [B * max_q] padded query grid
    max_q: int
    max_k: int
    mask: torch.Tensor  # [B, 1, max_q, max_k] bool: key visible to query
    slot_range: Optional[tuple[int, int]] = None  # (lo, hi) if slots are exactly lo..hi-1 ascending


def pack(slots: Sequence[int], starts: Sequence[int], lens: Sequence[int]) -> PackedBatch:
    B = len(slots)
    lens_t = torch.as_tensor(list(lens), dtype=torch.long)
    starts_t = torch.as_tensor(list(starts), dtype=torch.long)
    cu = torch.zeros(B + 1, dtype=torch.long)
    torch.cumsum(lens_t, 0, out=cu[1:])
    T = int(cu[-1])
    max_q = int(lens_t.max())
    max_k = int((starts_t + lens_t).max())
    req_of_tok = torch.repeat_interleave(torch.arange(B), lens_t)
    local = torch.arange(T) - cu[:-1][req_of_tok]
    tok_pos = starts_t[req_of_tok] + local
    slots_t = torch.as_tensor(list(slots), dtype=torch.long)
    qi = torch.arange(max_q)
    kj = torch.arange(max_k)
    limit = starts_t.view(B, 1) + qi.view(1, max_q)  # last visible key per query
    mask = (kj.view(1, 1, max_k) <= limit.view(B, max_q, 1)).unsqueeze(1)
    sl = list(slots)
    contiguous = bool(sl) and sl == list(range(sl[0], sl[0] + B))
    return PackedBatch(
        slot_range=(sl[0], sl[0] + B) if contiguous else None,
        slots=slots_t,
        starts=list(starts),
        lens=list(lens),
        cu_seqlens=cu,
        tok_slot=slots_t[req_of_tok],
        tok_pos=tok_pos,
        pad_index=req_of_tok * max_q + local,
        max_q=max_q,
        max_k=max_k,
        mask=mask,
    )


class SlotKVCache:
    """Fixed pool of request slots; one K and one V tensor per layer."""

    def __init__(self, num_layers: int, num_slots: int, max_len: int, kv_heads: int, head_dim: int, dtype=torch.float32):
        self.num_slots = num_slots
        self.max_len = max_len
        self.k = [torch.zeros(num_slots, max_len, kv_heads, head_dim, dtype=dtype) for _ in range(num_layers)]
        self.v = [torch.zeros(num_slots, max_len, kv_heads, head_dim, dtype=dtype) for _ in range(num_layers)]
        self._free = list(range(num_slots))  # a min-heap: the lowest free slot is reused first

    def alloc(self) -> int:
        """Lowest free slot, so a full batch occupies 0..B-1 and attention reads the cache as a view."""
        if not self._free:
            raise RuntimeError("KV cache: no free request slot")
        return heapq.heappop(self._free)

    def free(self, slot: int) -> None:
        heapq.heappush(self._free, slot)

    @property
    def num_free(self) -> int:
        return len(self._free)


class CachedTarget:
    """Runs an HF decoder-only model (Qwen3 / Llama layout) over packed ragged batches with a slot cache."""

    def __init__(self, model: torch.nn.Module, layer_ids: Sequence[int], num_slots: int, max_len: int):
        inner = getattr(model, "model", model)
        self.model = model
        self.embed = inner.embed_tokens
        self.layers = list(inner.layers)
        self.norm = inner.norm
        self.rotary = inner.rotary_emb
        self.lm_head = model.lm_head
        cfg = model.config
        if getattr(cfg, "use_sliding_window", False):
            raise ValueError("target: sliding-window attention is not supported by the reference engine")
        a0 = self.layers[0].self_attn
        self.head_dim = int(getattr(a0, "head_dim", cfg.hidden_size // cfg.num_attention_heads))
        self.n_heads = int(cfg.num_attention_heads)
        self.n_kv = int(cfg.num_key_value_heads)
        self.scaling = float(getattr(a0, "scaling", self.head_dim**-0.5))
        self.layer_ids = [int(i) for i in layer_ids]
        n = len(self.layers)
        for lid in self.layer_ids:
            if lid < -1 or lid >= n - 1:
                raise ValueError(
                    f"target_layer_ids: {lid} is out of range for a {n}-layer target "
                    "(-1 = embeddings; the last decoder layer is not allowed)"
                )
        self.vocab_size = int(self.lm_head.out_features)
        self.dtype = self.embed.weight.dtype
        self.cache = SlotKVCache(n, num_slots, max_len, self.n_kv, self.head_dim, self.dtype)

    def _attn(self, li: int, attn, x: torch.Tensor, pb: PackedBatch, cos, sin) -> torch.Tensor:
        T = x.shape[0]
        q = attn.q_proj(x).view(T, self.n_heads, self.head_dim)
        k = attn.k_proj(x).view(T, self.n_kv, self.head_dim)
        v = attn.v_proj(x).view(T, self.n_kv, self.head_dim)
        if hasattr(attn, "q_norm"):
            q = attn.q_norm(q)
            k = attn.k_norm(k)
        q = q * cos + _rotate_half(q) * sin
        k = k * cos + _rotate_half(k) * sin
        kc, vc = self.cache.k[li], self.cache.v[li]
        kc[pb.tok_slot, pb.tok_pos] = k
        vc[pb.tok_slot, pb.tok_pos] = v
        B = pb.slots.numel()
        qp = q.new_zeros(B * pb.max_q, self.n_heads, self.head_dim)
        qp[pb.pad_index] = q
        qp = qp.view(B, pb.max_q, self.n_heads, self.head_dim).transpose(1, 2)
        if pb.slot_range is not None:  # a view: no copy of the cache
            lo, hi = pb.slot_range
            K = kc[lo:hi, : pb.max_k].transpose(1, 2)
            V = vc[lo:hi, : pb.max_k].transpose(1, 2)
        else:
            K = kc[pb.slots, : pb.max_k].transpose(1, 2)
            V = vc[pb.slots, : pb.max_k].transpose(1, 2)
        o = F.scaled_dot_product_attention(qp, K, V, attn_mask=pb.mask, scale=self.scaling, enable_gqa=self.n_kv != self.n_heads)
        o = o.transpose(1, 2).reshape(B * pb.max_q, self.n_heads * self.head_dim)[pb.pad_index]
        return attn.o_proj(o)

    @torch.inference_mode()
    def forward(
        self,
        pb: PackedBatch,
        tokens: torch.Tensor,
        logit_rows: Optional[torch.Tensor] = None,
        want_hidden: bool = True,
    ) -> tuple[torch.Tensor, Optional[torch.Tensor]]:
        """Returns (logits of ``logit_rows`` (all rows if None) [R, V] float32, chosen-layer hidden [T, m*H])."""
        x = self.embed(tokens)
        cos, sin = self.rotary(x, pb.tok_pos.unsqueeze(0))
        cos = cos[0].unsqueeze(1).to(x.dtype)
        sin = sin[0].unsqueeze(1).to(x.dtype)
        wanted = {lid + 1: None for lid in self.layer_ids} if want_hidden else {}
        if 0 in wanted:
            wanted[0] = x
        for li, layer in enumerate(self.layers):
            h = layer.input_layernorm(x)
            x = x + self._attn(li, layer.self_attn, h, pb, cos, sin)
            x = x + layer.mlp(layer.post_attention_layernorm(x))
            if li + 1 in wanted:
                wanted[li + 1] = x
        hidden = torch.cat([wanted[lid + 1] for lid in self.layer_ids], dim=-1) if want_hidden else None
        xs = x if logit_rows is None else x[logit_rows]
        logits = self.lm_head(self.norm(xs)).float()
        return logits, hidden
