"""Load an exported DSpark pair with SGLang 0.5.23's own classes on CPU and check every tensor (issue 33).

Run it in an environment that has sglang 0.5.23 (``.venv-sglang``, or the device after the wheels are
installed); it needs no GPU:

    python scripts/h200/check_sglang_layout.py --target fixtures/models/target --draft OUT/drafter

What it proves, in order (a failure stops with a one-line reason and exit status 1):

1. ``ServerArgs`` from the real CLI parser, resolved by SGLang's own pipeline (``publish``), which runs
   ``_handle_dspark`` and reads the draft checkpoint's config (gamma, mask token) as a launch would;
2. ``parse_dspark_draft_config`` / ``resolve_runtime_config`` on the draft config as ``get_config`` reads it;
3. SGLang's ``Qwen3DSparkModel`` and ``Qwen3ForCausalLM`` built on CPU (TP 1, gloo) and filled through
   their own ``load_weights`` from the checkpoint files; every parameter was NaN before the load, so a
   tensor SGLang silently skips shows up as NaN; each one must equal the source tensor (qkv / gate_up
   as SGLang stacks them; the confidence head upcast to fp32).

Two accommodations, both only for building on a machine without CUDA (neither touches a weight name or
shape): ``--device cuda`` is given to the parser (DSpark refuses ``cpu``; nothing here calls CUDA), and
the rotary module's ``_is_cpu`` flag is set so it picks its pure-torch path instead of a CUDA / vllm op.
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
from pathlib import Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _fail(msg: str) -> None:
    print(f"FAIL: {msg}", file=sys.stderr)
    raise SystemExit(1)


def _expected(source: dict, name: str):
    """The source tensor SGLang's parameter ``name`` should hold (stacked params concatenated)."""
    import torch

    for fused, parts in (("qkv_proj", ("q_proj", "k_proj", "v_proj")), ("gate_up_proj", ("gate_proj", "up_proj"))):
        if f".{fused}." in name:
            return torch.cat([source[name.replace(fused, p)] for p in parts], dim=0)
    return source.get(name)


def _check_model(model, files: list[str], source: dict, label: str) -> dict:
    import torch
    from sglang.srt.model_loader.weight_utils import safetensors_weights_iterator

    with torch.no_grad():
        for p in model.parameters():
            p.fill_(float("nan"))
    model.load_weights(safetensors_weights_iterator(files))
    checked = 0
    for name, p in model.named_parameters():
        if torch.isnan(p.float()).any():
            _fail(f"{label}: parameter {name} was not filled by SGLang's load_weights")
        want = _expected(source, name)
        if want is None:
            _fail(f"{label}: parameter {name} has no source tensor")
        if tuple(want.shape) != tuple(p.shape):
            _fail(f"{label}: parameter {name} has shape {tuple(p.shape)}, source {tuple(want.shape)}")
        if not torch.allclose(p.float(), want.float(), rtol=0, atol=1e-6):
            _fail(f"{label}: parameter {name} differs from the source tensor")
        checked += 1
    return {"parameters": checked}


def _check_heads(draft, source: dict) -> dict:
    """SGLang's Markov bias and confidence logit against ours computed from the source tensors:
    ``W2(W1[prev])`` and ``w . [h ; W1[prev]] + b`` (the concatenation order is the point)."""
    import torch

    g = torch.Generator().manual_seed(0)
    bs, gamma = 3, 7
    hidden = int(draft.config.hidden_size)
    vocab = int(draft.config.vocab_size)
    h = torch.randn(bs * gamma, hidden, generator=g)
    anchors = torch.randint(0, vocab, (bs,), generator=g)
    drafts = torch.randint(0, vocab, (bs, gamma), generator=g)
    prev = torch.cat([anchors.view(-1, 1), drafts[:, : gamma - 1]], dim=1)
    w1 = source["markov_head.markov_w1.weight"].float()
    w2 = source["markov_head.markov_w2.weight"].float()
    cw = source["confidence_head.proj.weight"].float()
    cb = source["confidence_head.proj.bias"].float()
    with torch.no_grad():
        bias, _ = draft.markov_head.step_bias(prev, hidden_states=None, state=None)
        conf, raw = draft.confidence_head.predict(h.to(torch.bfloat16), anchor_tokens=anchors, draft_tokens=drafts,
                                                  markov_head=draft.markov_head)
    ours_bias = w1[prev] @ w2.T
    feats = torch.cat([h.to(torch.bfloat16).float().view(bs, gamma, hidden), w1[prev]], dim=-1)
    ours_raw = feats @ cw.view(-1) + cb
    # relative to the largest value: SGLang's Markov head runs in bf16 (8 mantissa bits), ours here in fp32
    err_bias = float((bias.float() - ours_bias).abs().max() / ours_bias.abs().max().clamp_min(1e-6))
    err_raw = float((raw.float() - ours_raw).abs().max() / ours_raw.abs().max().clamp_min(1e-6))
    if err_bias > 0.02 or err_raw > 0.02:
        _fail(f"SGLang's heads disagree with ours: markov bias max err {err_bias:.3g}, confidence logit {err_raw:.3g}")
    return {"markov_bias_max_rel_err": err_bias, "confidence_logit_max_rel_err": err_raw,
            "confidence_range": [float(conf.min()), float(conf.max())]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--target", required=True)
    ap.add_argument("--draft", required=True)
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--mode", default="cap-accept", help="SGLANG_RAGGED_VERIFY_MODE (the confidence head is "
                                                          "built outside static)")
    a = ap.parse_args(argv)
    os.environ["SGLANG_RAGGED_VERIFY_MODE"] = a.mode
    import torch
    from safetensors.torch import load_file
    from sglang.srt.runtime_context import SpawnRanks, publish
    from sglang.srt.server_args import ServerArgs

    out: dict = {}
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    ns = parser.parse_args(["--model-path", a.target, "--speculative-algorithm", "DSPARK",
                            "--speculative-draft-model-path", a.draft, "--speculative-dspark-block-size",
                            str(a.gamma), "--device", "cuda", "--dtype", "bfloat16"])
    sa = ServerArgs.from_cli_args(ns)
    publish(sa, role="scheduler", ranks=SpawnRanks(world_rank=0, dp_rank=None, gpu_id=None))
    from sglang.srt.arg_groups.overrides import resolved_view

    view = resolved_view(sa)
    out["resolved"] = {"speculative_algorithm": str(view.speculative_algorithm),
                       "speculative_num_draft_tokens": view.speculative_num_draft_tokens,
                       "speculative_dspark_block_size": view.speculative_dspark_block_size}

    from sglang.srt.speculative.dspark_components.dspark_config import (
        parse_dspark_draft_config,
        resolve_runtime_config,
    )
    from sglang.srt.utils.hf_transformers_utils import get_config

    dcfg = get_config(a.draft, trust_remote_code=False)
    tcfg = get_config(a.target, trust_remote_code=False)
    parsed = parse_dspark_draft_config(draft_hf_config=dcfg)
    runtime = resolve_runtime_config(draft_hf_config=dcfg, speculative_num_draft_tokens=a.gamma + 1,
                                     target_vocab_size=int(tcfg.vocab_size))
    out["draft_config"] = {"architectures": list(dcfg.architectures), "gamma": parsed.gamma,
                           "target_layer_ids": parsed.target_layer_ids, "mask_token_id": parsed.mask_token_id,
                           "markov_rank": parsed.markov_rank, "markov_head_type": parsed.markov_head_type,
                           "num_target_layers": parsed.num_target_layers}
    out["runtime"] = {"gamma": runtime.gamma, "verify_num_draft_tokens": runtime.verify_num_draft_tokens,
                      "mask_token_id": runtime.mask_token_id}
    if runtime.gamma != a.gamma:
        _fail(f"{a.draft}: SGLang resolved gamma {runtime.gamma}, expected {a.gamma}")

    from sglang.srt.distributed.parallel_state import init_distributed_environment, initialize_model_parallel

    init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                 distributed_init_method=f"tcp://127.0.0.1:{_free_port()}")
    initialize_model_parallel(backend="gloo")
    import sglang.srt.layers.rotary_embedding.base as rotary_base
    from sglang.srt.models.dspark import Qwen3DSparkModel
    from sglang.srt.models.qwen3 import Qwen3ForCausalLM

    rotary_base._is_cpu = True
    draft_files = sorted(str(p) for p in Path(a.draft).glob("*.safetensors"))
    target_files = sorted(str(p) for p in Path(a.target).glob("*.safetensors"))
    draft_src: dict = {}
    for f in draft_files:
        draft_src.update(load_file(f))
    target_src: dict = {}
    for f in target_files:
        target_src.update(load_file(f))

    torch.set_default_dtype(torch.bfloat16)
    try:
        draft = Qwen3DSparkModel(dcfg)
        target = Qwen3ForCausalLM(tcfg)
    finally:
        torch.set_default_dtype(torch.float32)
    if draft.confidence_head is None:
        _fail(f"SGLang built no confidence head under SGLANG_RAGGED_VERIFY_MODE={a.mode}")
    out["draft_model"] = {"class": type(draft).__name__, "markov_head": type(draft.markov_head).__name__,
                          **_check_model(draft, draft_files, draft_src, f"draft {a.draft}")}
    out["heads"] = _check_heads(draft, draft_src)
    out["target_model"] = {"class": type(target).__name__, "tied_lm_head": target.lm_head is target.model.embed_tokens,
                           **_check_model(target, target_files, target_src, f"target {a.target}")}
    print("OK " + json.dumps(out, sort_keys=True))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
