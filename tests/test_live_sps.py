"""SPS profiling: SGLang's profiler command as data, and our own sweep over the loopback fake server."""

from __future__ import annotations

import json

import pytest

from acceptscope.live.sps import SglangProfilerCommand, SweepConfig, ingest_profiler_outputs, sps_sweep
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer


def test_profiler_command_lines():
    cmd = SglangProfilerCommand(subcommand="run", base_url="http://127.0.0.1:30000", out="/o/sps.json",
                                batch_sizes=[1, 8], fracs=[0.5], min_steady_steps=16, round_timeout=60.0, python="py")
    assert cmd.argv() == ["py", "-m", "sglang.benchmark.dspark_sps_profiler", "run", "--out", "/o/sps.json",
                          "--base-url", "http://127.0.0.1:30000", "--fracs", "0.5", "--batch-size", "1", "8",
                          "--min-steady-steps", "16", "--round-timeout", "60.0"]
    fit = SglangProfilerCommand(subcommand="fit", out="t.json", max_batch_tokens=512, self_check=False, python="py")
    assert fit.argv() == ["py", "-m", "sglang.benchmark.dspark_sps_profiler", "fit", "--out", "t.json",
                          "--max-batch-tokens", "512", "--no-self-check", "--no-plot"]
    assert {k: str(v) for k, v in fit.outputs().items()} == {
        "table": "t.json", "records": "t.records.jsonl", "rounds": "t.rounds.jsonl", "manifest": "t.json.manifest.json"}
    with pytest.raises(ValueError, match="base-url"):
        SglangProfilerCommand(subcommand="all").argv()
    with pytest.raises(ValueError, match="run\\|fit\\|all"):
        SglangProfilerCommand(subcommand="sweep", base_url="x").argv()


class _Rows:
    def __init__(self):
        self.t = {}

    def __call__(self, tables):
        for k, v in tables.items():
            self.t.setdefault(k, []).extend(v)


def test_diagonal_sweep_two_dp_ranks(tmp_path):
    rows = _Rows()
    out = tmp_path / "sps.json"
    cfg = FakeConfig(mode="static", gamma=3, dp_ranks=2, shuffle_ranks=True, tick_s=0.001, step_cost_s_per_token=0.0003,
                     components=("core", "step_cpu_time"), simulate_acc_len=1.0)
    with FakeSGLangServer(cfg) as s:
        res = sps_sweep(SweepConfig(base_url=s.url, run_id="sw", batch_sizes=(1, 4, 8), min_steady_steps=12,
                                    poll_interval_s=0.05, round_timeout_s=10, out=str(out)), rows)
    assert not res.failures and [r["batch_size_per_rank"] for r in res.rounds] == [1, 4, 8]
    assert [r["batch_size"] for r in res.rounds] == [2, 8, 16]  # bs x DP ranks
    sps = [r["steps_per_sec"] for r in res.rounds]
    assert sps[0] > sps[1] > sps[2]  # step time grows with the verify tokens of a step
    assert all(len(r["per_rank_median_step_time"]) == 2 and r["match_fraction"] > 0.5 for r in res.rounds)
    table = json.loads(out.read_text())
    assert table == {"sample_batch_tokens": [4, 16, 32], "sample_steps_per_sec": sps, "max_batch_tokens": 32}
    assert "bias_seconds" not in out.read_text()  # SGLang would parse it as the additive format
    assert len(rows.t["sps_profile_rounds"]) == 3 and {r["frac"] for r in rows.t["sps_profile_rounds"]} == {-1.0}
    assert {r["dp_rank"] for r in rows.t["sps_profile_records"]} == {0, 1}
    man = json.loads(rows.t["sps_profile_manifests"][0]["body_json"])
    assert man["simulate_acc_len"] == pytest.approx(1.0) and man["dp_ranks"] == 2 and man["verify_num_draft_tokens"] == 4
    # the files are in SGLang's profiler format: the ingest package's parsers read them back identically
    back = ingest_profiler_outputs(out, "sw")
    assert not back.rejects
    got = {(r["batch_size"], r["steps_per_sec"]) for r in back.tables["sps_profile_rounds"]}
    assert got == {(r["batch_size"], r["steps_per_sec"]) for r in res.rounds}
    timed = [r for r in rows.t["sps_profile_records"] if r["step_time_s"] is not None]
    assert len(back.tables["sps_profile_records"]) == len(timed)


def test_offdiagonal_sweep_pins_and_resets_the_budget():
    rows = _Rows()
    with FakeSGLangServer(FakeConfig(mode="compact", gamma=4, tick_s=0.001, components=("core", "step_cpu_time"))) as s:
        res = sps_sweep(SweepConfig(base_url=s.url, run_id="off", batch_sizes=(2, 4), fracs=(0.25, 1.0),
                                    min_steady_steps=8, poll_interval_s=0.05, round_timeout_s=10), rows)
        assert s.engine.force_frac is None  # restored to the planner's own budget
    cells = {(r["batch_size_per_rank"], r["frac"]): r["batch_tokens"] for r in res.rounds}
    assert cells == {(2, 0.25): 2 + int(0.25 * 2 * 4), (2, 1.0): 2 + 8, (4, 0.25): 4 + 4, (4, 1.0): 4 + 16}
    # the pinned budget shows in the recorded (graph-tier padded) verify tokens: N + M rounded up to 8
    tiers = {r["frac"]: {x["num_verify_tokens"] for x in rows.t["sps_profile_records"]
                         if x["frac"] == r["frac"] and x["batch_size_per_rank"] == 4 and x["num_running_reqs"] == 4}
             for r in res.rounds}
    assert tiers == {0.25: {8}, 1.0: {24}}


def test_sweep_preconditions():
    with FakeSGLangServer(FakeConfig(mode="static", components=("reqs",))) as s:
        with pytest.raises(RuntimeError, match="core,step_cpu_time"):
            sps_sweep(SweepConfig(base_url=s.url, run_id="x"), _Rows())
    with FakeSGLangServer(FakeConfig(mode="static", components=("core", "step_cpu_time"))) as s:
        with pytest.raises(RuntimeError, match="compact or cap-accept"):
            sps_sweep(SweepConfig(base_url=s.url, run_id="x", fracs=(0.5,)), _Rows())
