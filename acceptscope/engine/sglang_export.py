"""Write an acceptscope DSpark drafter in the checkpoint layout SGLang 0.5.23's DSpark worker loads.

Why (issue 33): a live SGLang server needs a target and a drafter that SGLang's own loader accepts.
The fixture target is already a plain Hugging Face ``Qwen3ForCausalLM`` checkpoint, which SGLang's
``Qwen3ForCausalLM`` loads as it is, so only the drafter is rewritten. Checked against the 0.5.23 wheel:

* ``sglang/srt/models/dspark.py``: ``Qwen3DSparkModel`` (a ``DFlashDraftModel`` backbone plus
  ``markov_head`` and ``confidence_head``); ``build_markov_head`` / ``build_confidence_head`` read the
  top-level ``markov_rank``, ``markov_head_type`` and ``confidence_head_with_markov``; the confidence
  head is ``confidence_head.proj`` (``Linear(hidden [+ markov_rank] -> 1)``, with bias).
* ``sglang/srt/speculative/dspark_components/dspark_config.py``: ``dspark_block_size`` (gamma),
  ``dspark_markov_rank``, ``dspark_noise_token_id`` (the mask token), ``dspark_target_layer_ids``.
* ``sglang/srt/models/dflash.py``: backbone names ``fc``, ``hidden_norm``, ``layers.{i}.*``, ``norm``;
  ``fc`` takes ``len(target_layer_ids) * hidden_size``, so the target width must equal the draft's.
* ``sglang/srt/models/qwen3.py``: ``target_layer_ids`` are Hugging Face style (the output of layer k,
  captured "before layer k + 1"), the same convention as ours (``hidden_states[k + 1]``).

The renames are ours -> SGLang's: ``markov_w{1,2}.weight`` -> ``markov_head.markov_w{1,2}.weight``,
``confidence_head.{weight,bias}`` -> ``confidence_head.proj.{weight,bias}``; every other tensor keeps
its name (SGLang stacks ``q/k/v_proj`` and ``gate/up_proj`` itself). Only the vanilla Markov head is
exported: the RNN head's SGLang counterpart (``joint_proj``) was not checked against ours.

Use: ``python -m acceptscope.engine.sglang_export DRAFTER_DIR OUT_DIR [--target TARGET_DIR]``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

from safetensors import safe_open
from safetensors.torch import save as st_save

from acceptscope.engine.drafter import SHARED_KEYS, DrafterConfig
from acceptscope.outputs import atomic_write, dumps_strict

__all__ = ["ExportError", "sglang_draft_config", "sglang_tensor_name", "export_drafter", "main"]

ARCHITECTURE = "Qwen3DSparkModel"
MASK_TOKEN = "<|mask|>"
# Files a loader opening the draft path as a model directory may look for; copied from the target.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja")
_RENAMES = {
    "markov_w1.weight": "markov_head.markov_w1.weight",
    "markov_w2.weight": "markov_head.markov_w2.weight",
    "confidence_head.weight": "confidence_head.proj.weight",
    "confidence_head.bias": "confidence_head.proj.bias",
}


class ExportError(ValueError):
    """A drafter (or its target) that SGLang's DSpark loader would refuse; the message names the file."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise ExportError(f"{path}: missing")
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as e:
        raise ExportError(f"{path}: line {e.lineno}: invalid JSON ({e.msg})") from None
    except UnicodeDecodeError as e:
        raise ExportError(f"{path}: not UTF-8 text ({e.reason})") from None
    if not isinstance(doc, dict):
        raise ExportError(f"{path}: expected a JSON object, got {type(doc).__name__}")
    return doc


def sglang_tensor_name(name: str) -> str | None:
    """SGLang's name for one of our drafter tensors; None for the shared embedding / LM head (the
    target's, which SGLang attaches itself and skips in a draft checkpoint)."""
    if name in SHARED_KEYS:
        return None
    return _RENAMES.get(name, name)


def _target_shape(target_cfg: dict[str, Any], where: Path) -> tuple[int, int, int]:
    """(vocab_size, hidden_size, num_hidden_layers) of a Hugging Face target config."""
    text = target_cfg.get("text_config") if isinstance(target_cfg.get("text_config"), dict) else target_cfg
    out = []
    for key in ("vocab_size", "hidden_size", "num_hidden_layers"):
        v = text.get(key)
        if not isinstance(v, int) or isinstance(v, bool) or v <= 0:
            raise ExportError(f"{where}: field {key}: expected a positive integer, got {v!r}")
        out.append(v)
    return out[0], out[1], out[2]


def sglang_draft_config(cfg: DrafterConfig, target_cfg: dict[str, Any], *, where: Path,
                        target_where: Path) -> dict[str, Any]:
    """The ``config.json`` of the exported drafter: a Qwen3-shaped config with SGLang's DSpark keys.

    Refuses (``ExportError``) what SGLang 0.5.23 would refuse at load or serve wrongly: no Markov
    head (``markov_rank > 0`` is required), an RNN head (unverified mapping), a target whose width
    differs from the drafter's (``fc`` is sized from the draft width), layer ids or a mask token
    outside the target."""
    vocab, hidden, n_layers = _target_shape(target_cfg, target_where)
    if not cfg.markov_enabled:
        raise ExportError(f"{where}: field markov_head_type: SGLang's DSpark draft needs a Markov head "
                          f"(markov_rank > 0), got {cfg.markov_head_type!r} / rank {cfg.markov_rank}")
    if cfg.markov_head_type != "vanilla":
        raise ExportError(f"{where}: field markov_head_type: only 'vanilla' is exported "
                          f"(the {cfg.markov_head_type!r} head's SGLang layout is not verified)")
    if cfg.target_hidden_size != cfg.hidden_size or hidden != cfg.hidden_size:
        raise ExportError(f"{where}: field target_hidden_size: SGLang sizes fc as len(target_layer_ids) x the draft "
                          f"width, so target ({hidden}), target_hidden_size ({cfg.target_hidden_size}) and "
                          f"hidden_size ({cfg.hidden_size}) must be equal")
    if cfg.vocab_size != vocab:
        raise ExportError(f"{where}: field vocab_size: {cfg.vocab_size} differs from the target's {vocab}")
    bad = [i for i in cfg.target_layer_ids if not 0 <= i < n_layers]
    if not cfg.target_layer_ids or bad:
        raise ExportError(f"{where}: field target_layer_ids: {cfg.target_layer_ids} must be non-empty and inside "
                          f"the target's {n_layers} layers")
    layer_ids = [int(i) for i in cfg.target_layer_ids]
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "qwen3",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "num_hidden_layers": cfg.num_layers,
        "num_attention_heads": cfg.num_heads,
        "num_key_value_heads": cfg.num_kv_heads,
        "head_dim": cfg.head_dim,
        "intermediate_size": cfg.intermediate_size,
        "hidden_act": "silu",
        "attention_bias": False,
        "rms_norm_eps": cfg.rms_norm_eps,
        "rope_theta": cfg.rope_theta,
        "rope_parameters": {"rope_theta": cfg.rope_theta, "rope_type": "default"},
        "max_position_embeddings": cfg.max_position_embeddings,
        "tie_word_embeddings": False,
        "dtype": "bfloat16",
        "eos_token_id": cfg.eos_token_id,
        # the block: gamma query rows [anchor, mask x (gamma - 1)], the anchor row drafting d_0
        "block_size": cfg.gamma,
        "dspark_block_size": cfg.gamma,
        "sample_from_anchor": True,
        "num_target_layers": n_layers,
        "target_layer_ids": layer_ids,
        "dspark_target_layer_ids": layer_ids,
        "mask_token": MASK_TOKEN,
        "mask_token_id": cfg.mask_token_id,
        "dspark_noise_token_id": cfg.mask_token_id,
        "markov_rank": cfg.markov_rank,
        "dspark_markov_rank": cfg.markov_rank,
        "markov_head_type": cfg.markov_head_type,
        "enable_confidence_head": True,
        "confidence_head_with_markov": bool(cfg.confidence_with_markov),
    }


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def export_drafter(drafter_dir: str | Path, out_dir: str | Path, *, target_dir: str | Path | None = None
                   ) -> dict[str, Any]:
    """Write ``out_dir/config.json`` and ``out_dir/model.safetensors`` (atomic files) for SGLang's
    ``--speculative-draft-model-path``, plus the target's tokenizer files. ``target_dir`` defaults to
    the drafter's ``target_path``. Returns a summary (tensor count, renames, source hash)."""
    src = Path(drafter_dir)
    cfg_file = src / "config.json"
    raw = _read_json(cfg_file)
    try:
        cfg = DrafterConfig.from_dict(raw)
    except (TypeError, ValueError) as e:
        raise ExportError(f"{cfg_file}: {e}") from None
    if target_dir is None:
        if not cfg.target_path:
            raise ExportError(f"{cfg_file}: field target_path: empty; pass the target directory")
        tp = Path(cfg.target_path)
        target_dir = tp if tp.is_absolute() else src / tp
    tgt = Path(target_dir)
    target_cfg = _read_json(tgt / "config.json")
    config = sglang_draft_config(cfg, target_cfg, where=cfg_file, target_where=tgt / "config.json")

    weights = src / "model.safetensors"
    if not weights.is_file():
        raise ExportError(f"{weights}: missing")
    tensors = {}
    renamed = {}
    try:
        with safe_open(str(weights), "pt") as f:
            for name in f.keys():
                new = sglang_tensor_name(name)
                if new is None:
                    continue
                tensors[new] = f.get_tensor(name).contiguous()
                if new != name:
                    renamed[name] = new
    except Exception as e:  # safetensors raises its own error types for torn or foreign files
        raise ExportError(f"{weights}: not a readable safetensors file ({type(e).__name__}: {e})") from None
    missing = sorted(n for n in _RENAMES.values() if n not in tensors)
    if missing:
        raise ExportError(f"{weights}: tensors {missing} missing (SGLang refuses a confidence-enabled draft without them)")
    conf_in = cfg.hidden_size + (cfg.markov_rank if cfg.confidence_with_markov else 0)
    got = tuple(tensors["confidence_head.proj.weight"].shape)
    if got != (1, conf_in):
        raise ExportError(f"{weights}: tensor confidence_head.weight has shape {got}, SGLang builds (1, {conf_in})")

    source_hash = _sha256(weights)
    config["acceptscope_export"] = {"source": str(src), "source_sha256": source_hash, "renamed": renamed}
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    atomic_write(out / "model.safetensors", st_save(tensors, metadata={"format": "pt"}))
    atomic_write(out / "config.json", dumps_strict(config, indent=2, sort_keys=True) + "\n")
    copied = []
    for name in TOKENIZER_FILES:
        if (tgt / name).is_file():
            atomic_write(out / name, (tgt / name).read_bytes())
            copied.append(name)
    return {"out": str(out), "tensors": len(tensors), "renamed": renamed, "copied": copied,
            "source_sha256": source_hash, "gamma": cfg.gamma}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m acceptscope.engine.sglang_export", description=__doc__.split("\n")[0])
    p.add_argument("drafter", help="acceptscope drafter directory (config.json + model.safetensors)")
    p.add_argument("out", help="output directory for SGLang's --speculative-draft-model-path")
    p.add_argument("--target", default=None, help="target directory (default: the drafter's target_path)")
    a = p.parse_args(argv)
    try:
        summary = export_drafter(a.drafter, a.out, target_dir=a.target)
    except (ExportError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    print(json.dumps(summary, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
