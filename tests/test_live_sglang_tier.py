"""sglang tier: our launch data and SPS files checked by SGLang 0.5.23's own code (in .venv-sglang, no GPU).

* every arm's argv goes through SGLang's real ``ServerArgs.add_cli_args`` parser, and
  every arm's environment through SGLang's env readers (verify mode, info-dump
  components, estimator / STS / folded-proposal switches);
* SGLang's own SPS profiler ``fit`` reads the rounds file our sweep wrote and
  produces the same table we did.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from acceptscope.live.launcher import ArmSpec, audit_arms
from acceptscope.live.sps import SglangProfilerCommand, SweepConfig, sps_sweep
from tests._close import assert_close
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer

SGLANG_PY = Path(__file__).resolve().parent.parent / ".venv-sglang" / "bin" / "python"
pytestmark = [pytest.mark.sglang, pytest.mark.skipif(not SGLANG_PY.exists(), reason=".venv-sglang not present")]

_CHECK = r"""
import argparse, json, os, sys
from sglang.srt.server_args import ServerArgs
from sglang.srt.environ import envs
from sglang.srt.speculative.ragged_verify import read_ragged_verify_mode
from sglang.srt.speculative.dspark_components.dspark_observability import resolve_enabled_components
arms = json.loads(sys.stdin.read())
p = argparse.ArgumentParser(prog="sglang serve")
ServerArgs.add_cli_args(p)
out = []
for a in arms:
    ns = p.parse_args(a["argv"])
    for k in [k for k in os.environ if k.startswith("SGLANG_")]:
        del os.environ[k]
    os.environ.update(a["env"])
    out.append({
        "args": {k: getattr(ns, k) for k in ("model_path", "host", "port", "speculative_algorithm",
                 "speculative_draft_model_path", "speculative_dspark_block_size", "speculative_dspark_sps_table_path",
                 "speculative_dspark_confidence_sts_path", "attn_dp_size", "enable_dp_lm_head", "disable_cuda_graph",
                 "enable_metrics", "tp_size", "max_running_requests")},
        "mode": read_ragged_verify_mode().value,
        "components": sorted(c.value for c in resolve_enabled_components()),
        "folded": envs.SGLANG_DSPARK_FOLDED_PROPOSAL.get(),
        "estimator": envs.SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH.get(),
        "sts_collect": envs.SGLANG_DSPARK_STS_COLLECT_PATH.get(),
    })
print("RESULT " + json.dumps(out))
"""


def test_argv_and_env_accepted_by_sglang(tmp_path):
    sts = tmp_path / "sts.json"
    sts.write_text(json.dumps({"temperatures": [1.0] * 7}))
    specs = list(audit_arms("T", "D", 7, out_dir=tmp_path, sps_table_path="sps.json", sts_table_path=str(sts),
                            attn_dp_size=4))
    specs.append(ArmSpec(arm="static", target_model="T", draft_model="D", gamma=5, tp_size=2, max_running_requests=32))
    payload = json.dumps([{"argv": s.argv()[3:], "env": s.env()} for s in specs])
    r = subprocess.run([str(SGLANG_PY), "-c", _CHECK], input=payload, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    res = json.loads(next(ln for ln in r.stdout.splitlines() if ln.startswith("RESULT "))[7:])
    compact, cap, static = res
    assert compact["args"] == {
        "model_path": "T", "host": "127.0.0.1", "port": 30000, "speculative_algorithm": "DSPARK",
        "speculative_draft_model_path": "D", "speculative_dspark_block_size": 7,
        "speculative_dspark_sps_table_path": "sps.json", "speculative_dspark_confidence_sts_path": str(sts),
        "attn_dp_size": 4, "enable_dp_lm_head": True, "disable_cuda_graph": True, "enable_metrics": True,
        "tp_size": 1, "max_running_requests": None,
    }
    assert (compact["mode"], cap["mode"], static["mode"]) == ("compact", "cap-accept", "static")
    assert compact["components"] == ["core", "reqs", "step_cpu_time"]
    assert cap["components"] == ["core", "draft_gpu_time", "reqs", "step_cpu_time", "step_gpu_time", "target_verify_gpu_time"]
    assert compact["folded"] is False and cap["folded"] is False and static["folded"] is True  # SGLang's default
    assert cap["estimator"] == str(tmp_path / "cap-accept.estimator.jsonl")
    assert cap["sts_collect"] == str(tmp_path / "cap-accept.sts") and compact["sts_collect"] == ""
    assert static["args"]["tp_size"] == 2 and static["args"]["max_running_requests"] == 32


def test_sglang_fit_reads_our_sweep_files(tmp_path):
    out = tmp_path / "sps.json"
    cfg = FakeConfig(mode="static", gamma=3, tick_s=0.001, step_cost_s_per_token=0.0003,
                     components=("core", "step_cpu_time"), simulate_acc_len=1.0)
    with FakeSGLangServer(cfg) as s:
        res = sps_sweep(SweepConfig(base_url=s.url, run_id="fit", batch_sizes=(1, 4, 8), min_steady_steps=10,
                                    poll_interval_s=0.05, round_timeout_s=10, out=str(out)), lambda t: None)
    ours = json.loads(out.read_text())
    out.unlink()  # SGLang's fit must rebuild it from the rounds file alone
    cmd = SglangProfilerCommand(subcommand="fit", out=str(out), python=str(SGLANG_PY))
    assert cmd.argv()[3:] == ["fit", "--out", str(out), "--no-plot"]
    code = subprocess.run(cmd.argv(), capture_output=True, text=True, timeout=600)
    assert code.returncode == 0, code.stderr[-3000:]
    theirs = json.loads(out.read_text())
    assert theirs["sample_batch_tokens"] == ours["sample_batch_tokens"] == [4, 16, 32]
    assert theirs["sample_steps_per_sec"] == pytest.approx(ours["sample_steps_per_sec"])
    assert_close(res.table, ours)
