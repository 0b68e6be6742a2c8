"""The target language model: a Qwen3-architecture config factory, offline loading, and hidden-state taps.

The reference engine verifies drafts with any Hugging Face causal LM that loads from a local directory
through ``AutoModelForCausalLM``. The drafter reads the target's hidden states of a few chosen decoder
layers; this module owns the convention that maps a layer id to an entry of HF's ``hidden_states``:

* ``hidden_states[0]``      = the embedding output (layer id ``-1``),
* ``hidden_states[l + 1]``  = the output of decoder layer ``l`` (0-based),
* ``hidden_states[-1]``     = HF replaces the last layer's output with the *final-normed* state, so the
  last decoder layer can not be tapped (DeepSpec's ``assert_no_final_target_layer``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import torch
from transformers import AutoModelForCausalLM, Qwen3Config
from transformers.utils import logging as hf_logging

__all__ = [
    "make_target_config",
    "load_target",
    "default_target_layer_ids",
    "validate_target_layer_ids",
    "target_hidden_for",
    "target_num_layers",
    "target_hidden_size",
]


def make_target_config(
    vocab_size: int,
    *,
    hidden_size: int = 256,
    num_layers: int = 6,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    head_dim: int = 64,
    intermediate_size: int = 640,
    max_position_embeddings: int = 2048,
    rope_theta: float = 10000.0,
    rms_norm_eps: float = 1e-6,
    bos_token_id: int | None = None,
    eos_token_id: int | None = None,
    pad_token_id: int | None = None,
    tie_word_embeddings: bool = True,
) -> Any:
    """A small ``Qwen3Config`` (tied embeddings, full attention everywhere) for the reference target."""
    cfg = Qwen3Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=max_position_embeddings,
        rms_norm_eps=rms_norm_eps,
        tie_word_embeddings=tie_word_embeddings,
        bos_token_id=bos_token_id,
        eos_token_id=eos_token_id,
        pad_token_id=pad_token_id,
        attention_dropout=0.0,
        use_sliding_window=False,
    )
    # transformers 5 keeps RoPE settings in ``rope_parameters``; older versions read ``rope_theta``.
    rp = getattr(cfg, "rope_parameters", None)
    if isinstance(rp, dict):
        rp["rope_theta"] = float(rope_theta)
    else:
        cfg.rope_theta = float(rope_theta)
    return cfg


def load_target(
    path: str | Path,
    *,
    device: str | torch.device = "cpu",
    dtype: torch.dtype | None = torch.float32,
) -> Any:
    """Load a causal LM from a local directory, offline, frozen and in eval mode.

    ``dtype=None`` keeps the checkpoint's own dtype; the default casts to float32 because CPU kernels
    for bf16 are slow and the fixtures store bf16 to stay small.
    """
    p = Path(path)
    if not (p / "config.json").is_file():
        raise FileNotFoundError(f"{p}: no config.json; not a Hugging Face model directory")
    kwargs: dict[str, Any] = {"local_files_only": True}
    hf_logging.disable_progress_bar()  # transformers 5 prints a "Loading weights" bar per load: not our output
    if dtype is not None:
        kwargs["dtype"] = dtype
    try:
        model = AutoModelForCausalLM.from_pretrained(str(p), **kwargs)
    except TypeError:  # transformers 4.x spells it torch_dtype
        kwargs["torch_dtype"] = kwargs.pop("dtype", None)
        model = AutoModelForCausalLM.from_pretrained(str(p), **kwargs)
    model.to(device)
    model.eval()
    for prm in model.parameters():
        prm.requires_grad_(False)
    return model


def target_num_layers(target: Any) -> int:
    return int(target.config.num_hidden_layers)


def target_hidden_size(target: Any) -> int:
    return int(target.config.hidden_size)


def default_target_layer_ids(num_layers: int, m: int = 3) -> list[int]:
    """Spread ``m`` taps over layers ``0 .. num_layers-2`` (the last layer is not tappable)."""
    if num_layers < 2:
        raise ValueError("the target needs at least 2 decoder layers to expose an intermediate layer")
    last = num_layers - 2
    m = max(1, min(m, last + 1))
    if m == 1:
        return [last // 2]
    ids = sorted({round(i * last / (m - 1)) for i in range(m)})
    return [int(i) for i in ids]


def validate_target_layer_ids(layer_ids: Sequence[int], num_layers: int) -> list[int]:
    """Strictly increasing ids in ``[-1, num_layers-2]``; ``-1`` is the embedding output."""
    ids = [int(i) for i in layer_ids]
    if not ids:
        raise ValueError("target_layer_ids is empty")
    if any(b <= a for a, b in zip(ids, ids[1:])):
        raise ValueError(f"target_layer_ids must be strictly increasing, got {ids}")
    if ids[0] < -1:
        raise ValueError(f"target_layer_ids: {ids[0]} < -1 (use -1 for the embedding output)")
    if ids[-1] >= num_layers - 1:
        raise ValueError(
            f"target_layer_ids: layer {ids[-1]} is the last decoder layer (or beyond) of a {num_layers}-layer "
            "target; HF replaces its output with the final-normed state, so it can not be tapped"
        )
    return ids


def target_hidden_for(target_outputs: Any, layer_ids: Sequence[int]) -> torch.Tensor:
    """Concatenate the chosen layers' hidden states: ``[..., len(layer_ids) * hidden_size]``.

    ``target_outputs`` is what an HF model returns with ``output_hidden_states=True`` (or the bare
    ``hidden_states`` tuple). Layer id ``l`` reads ``hidden_states[l + 1]``; ``-1`` reads the embeddings.
    The concatenation follows ``layer_ids`` order, which is the order the drafter's ``fc`` expects.
    """
    hs = target_outputs if isinstance(target_outputs, (tuple, list)) else target_outputs.hidden_states
    if hs is None:
        raise ValueError("target outputs carry no hidden_states; call the target with output_hidden_states=True")
    n_layers = len(hs) - 1
    ids = validate_target_layer_ids(layer_ids, n_layers)
    return torch.cat([hs[0 if i == -1 else i + 1] for i in ids], dim=-1)
