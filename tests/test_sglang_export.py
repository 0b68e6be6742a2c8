"""The fixture drafter exported to SGLang 0.5.23's DSpark checkpoint layout (issue 33).

Core tier: names, shapes and values of every exported tensor, the config keys SGLang's DSpark parser
reads, and the refusals (one line naming the file and field; nothing written). The ``sglang`` tier
loads the export with SGLang's own ``Qwen3DSparkModel`` / ``Qwen3ForCausalLM`` ``load_weights`` on CPU
(``scripts/h200/check_sglang_layout.py``) in ``.venv-sglang``.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from safetensors.torch import load_file

from acceptscope.engine.sglang_export import ExportError, export_drafter, main, sglang_tensor_name

ROOT = Path(__file__).resolve().parent.parent
DRAFTER = ROOT / "fixtures" / "models" / "drafter"
TARGET = ROOT / "fixtures" / "models" / "target"
SGLANG_PY = ROOT / ".venv-sglang" / "bin" / "python"


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    out = tmp_path_factory.mktemp("sglang_export") / "drafter"
    summary = export_drafter(DRAFTER, out)
    return out, summary


def test_every_tensor_renamed_and_equal(exported):
    out, summary = exported
    src = load_file(str(DRAFTER / "model.safetensors"))
    got = load_file(str(out / "model.safetensors"))
    expected_names = {sglang_tensor_name(k) for k in src} - {None}
    assert set(got) == expected_names
    assert summary["tensors"] == len(got) == 40
    for name, t in src.items():
        new = sglang_tensor_name(name)
        assert new is not None
        assert got[new].dtype == t.dtype and tuple(got[new].shape) == tuple(t.shape)
        assert torch.equal(got[new], t), name
    assert summary["renamed"] == {
        "markov_w1.weight": "markov_head.markov_w1.weight",
        "markov_w2.weight": "markov_head.markov_w2.weight",
        "confidence_head.weight": "confidence_head.proj.weight",
        "confidence_head.bias": "confidence_head.proj.bias",
    }
    assert not [p.name for p in out.iterdir() if p.name.endswith(".tmp")]


def test_shared_weights_left_out():
    assert sglang_tensor_name("embed_tokens.weight") is None
    assert sglang_tensor_name("lm_head.weight") is None
    assert sglang_tensor_name("layers.2.self_attn.q_proj.weight") == "layers.2.self_attn.q_proj.weight"


def test_config_carries_sglang_dspark_keys(exported):
    out, _ = exported
    cfg = json.loads((out / "config.json").read_text())
    ours = json.loads((DRAFTER / "config.json").read_text())
    target = json.loads((TARGET / "config.json").read_text())
    assert cfg["architectures"] == ["Qwen3DSparkModel"] and cfg["model_type"] == "qwen3"
    assert cfg["dspark_block_size"] == cfg["block_size"] == ours["gamma"]
    assert cfg["dspark_target_layer_ids"] == cfg["target_layer_ids"] == ours["target_layer_ids"]
    assert cfg["dspark_noise_token_id"] == cfg["mask_token_id"] == ours["mask_token_id"]
    assert cfg["dspark_markov_rank"] == cfg["markov_rank"] == ours["markov_rank"]
    assert cfg["markov_head_type"] == "vanilla" and cfg["confidence_head_with_markov"] is True
    assert cfg["num_target_layers"] == target["num_hidden_layers"]
    assert cfg["num_key_value_heads"] == ours["num_kv_heads"] and cfg["num_hidden_layers"] == ours["num_layers"]
    assert cfg["vocab_size"] == target["vocab_size"] and cfg["hidden_size"] == target["hidden_size"]
    # the confidence head SGLang builds: Linear(hidden + markov_rank -> 1)
    with safe_open(str(out / "model.safetensors"), "pt") as f:
        assert f.get_slice("confidence_head.proj.weight").get_shape() == [1, cfg["hidden_size"] + cfg["markov_rank"]]
    for name in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / name).read_bytes() == (TARGET / name).read_bytes()


def _drafter_copy(tmp_path: Path, **changes) -> Path:
    d = tmp_path / "drafter"
    d.mkdir()
    shutil.copy(DRAFTER / "model.safetensors", d / "model.safetensors")
    cfg = json.loads((DRAFTER / "config.json").read_text())
    cfg.update(changes)
    cfg["target_path"] = str(TARGET)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


@pytest.mark.parametrize("changes, field", [
    ({"markov_head_type": "rnn"}, "markov_head_type"),
    ({"markov_head_type": "none"}, "markov_head_type"),
    ({"target_layer_ids": [0, 2, 6]}, "target_layer_ids"),
    ({"target_hidden_size": 512}, "target_hidden_size"),
])
def test_refusals_name_file_and_field_and_write_nothing(tmp_path, changes, field):
    src = _drafter_copy(tmp_path, **changes)
    out = tmp_path / "out"
    out.mkdir()
    (out / "config.json").write_text("keep")
    with pytest.raises(ExportError) as e:
        export_drafter(src, out)
    msg = str(e.value)
    assert "\n" not in msg and str(src / "config.json") in msg and field in msg
    assert (out / "config.json").read_text() == "keep" and sorted(p.name for p in out.iterdir()) == ["config.json"]


def test_bad_json_and_cli_one_line(tmp_path, capsys):
    src = _drafter_copy(tmp_path)
    (src / "config.json").write_text('{"dspark": true,\n  oops}')
    assert main([str(src), str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "config.json: line 2: invalid JSON" in err
    assert not (tmp_path / "out").exists()


def test_torn_weights_refused(tmp_path):
    src = _drafter_copy(tmp_path)
    data = (src / "model.safetensors").read_bytes()
    (src / "model.safetensors").write_bytes(data[: len(data) // 3])
    with pytest.raises(ExportError, match="model.safetensors: not a readable safetensors file"):
        export_drafter(src, tmp_path / "out")


@pytest.mark.sglang
@pytest.mark.skipif(not SGLANG_PY.exists(), reason=".venv-sglang not present")
def test_sglang_loads_the_export_on_cpu(exported):
    """SGLang 0.5.23's own config parser, server-arg resolution and model classes accept the pair and
    hold exactly our tensors (every parameter NaN-filled before the load)."""
    out, _ = exported
    r = subprocess.run([str(SGLANG_PY), str(ROOT / "scripts" / "h200" / "check_sglang_layout.py"),
                        "--target", str(TARGET), "--draft", str(out)], capture_output=True, text=True, timeout=600)
    line = [ln for ln in r.stdout.splitlines() if ln.startswith("OK ")]
    assert r.returncode == 0 and line, r.stderr[-2000:]
    res = json.loads(line[0][3:])
    assert res["runtime"] == {"gamma": 7, "verify_num_draft_tokens": 8, "mask_token_id": 3}
    assert res["draft_model"]["parameters"] == 31 and res["target_model"]["parameters"] == 50
    assert res["heads"]["markov_bias_max_rel_err"] < 0.02 and res["heads"]["confidence_logit_max_rel_err"] < 0.02
