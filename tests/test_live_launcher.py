"""Launcher: arm command lines/environments as data, SGLang's validation rules, and real process management."""

from __future__ import annotations

import json
import os
import socket
import sys
import time
from pathlib import Path

import pytest
import requests

from acceptscope.live import launcher as L

FAKE = [sys.executable, str(Path(__file__).with_name("fake_sglang_server.py"))]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_compact_arm_argv_and_env_are_exact():
    spec = L.ArmSpec(arm="compact", target_model="T", draft_model="D", gamma=7, port=31000,
                     sps_table_path="sps.json", attn_dp_size=4, disable_cuda_graph=True,
                     estimator_path="/data/est.jsonl", python="/usr/bin/python3")
    assert spec.argv() == [
        "/usr/bin/python3", "-m", "sglang.launch_server",
        "--model-path", "T", "--host", "127.0.0.1", "--port", "31000",
        "--speculative-algorithm", "DSPARK", "--speculative-draft-model-path", "D",
        "--speculative-dspark-block-size", "7", "--speculative-dspark-sps-table-path", "sps.json",
        "--attn-dp-size", "4", "--enable-dp-lm-head", "--disable-cuda-graph", "--enable-metrics",
    ]
    assert spec.env() == {
        "SGLANG_RAGGED_VERIFY_MODE": "compact",
        "SGLANG_DSPARK_DEBUG_DUMP": "core,reqs,step_cpu_time",
        "SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH": "/data/est.jsonl",
        "SGLANG_DSPARK_FOLDED_PROPOSAL": "0",
    }
    assert spec.base_url == "http://127.0.0.1:31000"
    cfg = spec.to_config()
    assert cfg["argv"] == spec.argv() and json.dumps(cfg)


def test_audit_arms_pair(tmp_path):
    sts = tmp_path / "sts.json"
    sts.write_text(json.dumps({"temperatures": [1.0, 1.0, 1.0]}))
    compact, cap = L.audit_arms("T", "D", 3, out_dir=tmp_path, base_port=32000, sts_table_path=str(sts), attn_dp_size=2)
    assert (compact.arm, cap.arm) == ("compact", "cap-accept")
    assert (compact.port, cap.port) == (32000, 32001)
    # compact + DP attention + dense draft: cuda graph must be off or SGLang refuses
    assert compact.disable_cuda_graph and "--disable-cuda-graph" in compact.argv()
    assert cap.env()["SGLANG_RAGGED_VERIFY_MODE"] == "cap-accept"
    assert cap.env()["SGLANG_DSPARK_STS_COLLECT_PATH"] == str(tmp_path / "cap-accept.sts")  # identity table: allowed
    assert "SGLANG_DSPARK_STS_COLLECT_PATH" not in compact.env()
    assert cap.env()["SGLANG_DSPARK_FOLDED_PROPOSAL"] == "0"
    assert "step_gpu_time" in cap.env()["SGLANG_DSPARK_DEBUG_DUMP"]
    for s in (compact, cap):
        s.validate()
    # a calibrated (non-identity) table: no STS collection on either arm
    sts.write_text(json.dumps({"temperatures": [1.3, 0.9, 1.1]}))
    _, cap2 = L.audit_arms("T", "D", 3, out_dir=tmp_path, sts_table_path=str(sts))
    assert cap2.sts_collect_stem is None and "SGLANG_DSPARK_STS_COLLECT_PATH" not in cap2.env()


@pytest.mark.parametrize(
    "kwargs, needle",
    [
        (dict(arm="fast"), "must be one of"),
        (dict(gamma=0), "must be > 0"),
        (dict(debug_dump=("core", "timing")), "invalid"),
        (dict(arm="compact", attn_dp_size=2), "--disable-cuda-graph"),
        (dict(arm="static", sts_collect_stem="/x/sts"), "confidence head"),
        (dict(estimator_path="e.jsonl", extra_env={"SGLANG_SIMULATE_ACC_LEN": "1.0"}), "SIMULATE_ACC_LEN"),
    ],
)
def test_validation_rules(kwargs, needle):
    spec = L.ArmSpec(**{"arm": "cap-accept", "target_model": "T", **kwargs})
    with pytest.raises(L.LaunchConfigError, match=needle):
        spec.validate()


def test_sts_guards_name_the_file(tmp_path):
    bad = tmp_path / "sts.json"
    bad.write_text(json.dumps({"temperatures": [1.5, 1.0, 1.0, 1.0]}))
    spec = L.ArmSpec(arm="cap-accept", target_model="T", gamma=4, sts_table_path=str(bad), sts_collect_stem=str(tmp_path / "s"))
    with pytest.raises(L.LaunchConfigError, match=r"sts\.json: STS collection requires identity"):
        spec.validate()
    spec = L.ArmSpec(arm="cap-accept", target_model="T", gamma=7, sts_table_path=str(bad))
    with pytest.raises(L.LaunchConfigError, match=r"'temperatures' has 4 entries but gamma is 7"):
        spec.validate()
    broken = tmp_path / "broken.json"
    broken.write_text("{\n  \"temperatures\": [1.0,\n")
    with pytest.raises(L.LaunchConfigError, match=r"broken\.json:\d+: invalid JSON"):
        L.ArmSpec(arm="compact", target_model="T", sts_table_path=str(broken)).validate()
    ok = L.ArmSpec(arm="compact", target_model="T", gamma=4)
    assert any("verify-all" in w for w in ok.validate())  # compact without SPS: warned, not refused


def test_preflight_reports_missing_sglang_or_gpu():
    # this machine has neither sglang nor a GPU: the real launch must refuse clearly
    with pytest.raises(L.SGLangUnavailable, match="sglang is not installed|no GPU"):
        L.preflight()
    with pytest.raises(L.SGLangUnavailable):
        L.ServerProcess(L.ArmSpec(arm="compact", target_model="T"), "/tmp").start()


def test_launch_ready_and_clean_shutdown(tmp_path):
    est = tmp_path / "est.jsonl"
    spec = L.ArmSpec(arm="cap-accept", target_model="fake/T", draft_model="fake/D", gamma=4, port=free_port(),
                     estimator_path=str(est), extra_env={"FAKE_SGLANG_STARTUP_DELAY_S": "1.5"})
    proc = L.ServerProcess(spec, tmp_path / "logs", entry=FAKE).start()
    try:
        assert L.health(spec.base_url, 0.5) is False  # not listening yet, or 503 while starting
        info = proc.wait_ready(timeout_s=30)
        st = info["internal_states"][0]
        assert info["speculative_algorithm"] == "DSPARK" and st["dspark_info_record"]["mode"] == "cap-accept"
        assert st["dspark_info_record"]["gamma"] == 4 and proc.healthy()
        assert est.exists()  # the server opened its estimator JSONL, as SGLang does
    finally:
        code = proc.stop(grace_s=10)
    assert code == 0 and not proc.alive()
    assert "shut down" in proc.stderr_path.read_text()
    assert "fired up" in proc.stdout_path.read_text()


def test_sigkill_after_grace_when_sigterm_is_ignored(tmp_path):
    spec = L.ArmSpec(arm="compact", target_model="T", gamma=3, port=free_port(),
                     extra_env={"FAKE_SGLANG_IGNORE_SIGTERM": "1"})
    proc = L.ServerProcess(spec, tmp_path, entry=FAKE).start()
    proc.wait_ready(30)
    t0 = time.monotonic()
    code = proc.stop(grace_s=0.5)
    assert code == -9 and time.monotonic() - t0 < 10
    assert "ignoring SIGTERM" in proc.stderr_path.read_text()


def test_early_exit_and_timeout_are_clear_errors(tmp_path):
    # an invalid dump token makes the (fake) server exit at start, like SGLang's ValueError
    spec = L.ArmSpec(arm="compact", target_model="T", port=free_port(), extra_env={"SGLANG_DSPARK_DEBUG_DUMP": "bogus"})
    proc = L.ServerProcess(spec, tmp_path, entry=FAKE)
    proc.spec.debug_dump = ()  # skip our own validation to exercise the process path
    proc.start()
    with pytest.raises(L.ServerStartError, match="exited with code"):
        proc.wait_ready(20)
    proc.stop()
    assert "Invalid SGLANG_DSPARK_DEBUG_DUMP" in proc.stderr_path.read_text()
    with pytest.raises(L.ServerStartError, match="not ready after"):
        L.wait_ready(f"http://127.0.0.1:{free_port()}", 0.6, interval_s=0.1)
    with pytest.raises(requests.RequestException):
        requests.get(f"http://127.0.0.1:{free_port()}/health", timeout=0.5)
    assert os.path.exists(proc.stdout_path)
