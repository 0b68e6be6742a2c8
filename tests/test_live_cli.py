"""`acceptscope live ...` commands end to end against the loopback fake server."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.store import Store
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer

runner = CliRunner()


def _json(result):
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


def test_launch_dry_run_and_validation():
    out = _json(runner.invoke(app, ["live", "launch", "--arm", "cap-accept", "--model-path", "T", "--draft-model-path", "D",
                                    "--block-size", "5", "--port", "31234", "--estimator-jsonl", "e.jsonl",
                                    "--sts-collect-stem", "s/cap", "--dry-run", "--json"]))
    assert out["argv"][1:3] == ["-m", "sglang.launch_server"] and "--enable-metrics" in out["argv"]
    assert out["env"]["SGLANG_DSPARK_STS_COLLECT_PATH"] == "s/cap" and out["url"] == "http://127.0.0.1:31234"
    bad = runner.invoke(app, ["live", "launch", "--arm", "compact", "--model-path", "T", "--attn-dp-size", "2", "--dry-run"])
    assert bad.exit_code == 2 and "disable-cuda-graph" in bad.output
    # no sglang / GPU here: a real launch fails clearly with exit code 1
    real = runner.invoke(app, ["live", "launch", "--arm", "compact", "--model-path", "T", "--port", "31235"])
    assert real.exit_code == 1 and ("sglang is not installed" in real.output or "no GPU" in real.output)


def test_attach_drive_and_sps_profile(tmp_path):
    db = tmp_path / "cli.duckdb"
    with FakeSGLangServer(FakeConfig(mode="cap-accept", gamma=3, dp_ranks=2, shuffle_ranks=True,
                                     components=("core", "reqs", "step_cpu_time"), step_cost_s_per_token=0.0001)) as s:
        out = _json(runner.invoke(app, ["live", "attach", "--url", s.url, "--db", str(db), "--arm", "cap-accept",
                                        "--workload", "mbpp", "-n", "4", "--concurrency", "2", "--max-new-tokens", "12",
                                        "--temperature", "0.5", "--poll-interval", "0.1", "--run-id", "cli-1",
                                        "--loopback-only", "--json"]))
        assert out["run_id"] == "cli-1" and out["drive"]["ok"] == 4 and out["polls"]["ranks_seen"] == 2
        out = _json(runner.invoke(app, ["live", "drive", "--url", s.url, "--db", str(db), "--run-id", "cli-2",
                                        "-w", "poetry", "-n", "3", "--api", "openai", "--max-new-tokens", "6", "--json"]))
        assert out["ok"] == 3
        out = _json(runner.invoke(app, ["live", "sps-profile", "--url", s.url, "--db", str(db), "--run-id", "sps-cli",
                                        "--batch-size", "1,3", "--min-steady-steps", "6", "--round-timeout", "10",
                                        "--out", str(tmp_path / "sps.json"), "--loopback-only", "--json"]))
        assert [r["batch_size_per_rank"] for r in out["rounds"]] == [1, 3]
        assert out["table"]["sample_batch_tokens"] == [4, 12]
        capture_only = runner.invoke(app, ["live", "attach", "--url", s.url, "--db", str(db), "--duration", "2",
                                           "--poll-interval", "0.1", "--run-id", "cli-3"])
        assert capture_only.exit_code == 0, capture_only.output
    st = Store(db)
    counts = st.query_df("SELECT run_id, count(*) n FROM requests GROUP BY run_id").set_index("run_id")["n"].to_dict()
    assert counts == {"cli-1": 4, "cli-2": 3}
    rounds = st.read_table("sps_profile_rounds", "sps-cli")
    assert len(rounds) == 2 and (rounds["frac"] - -1.0).abs().max() < 1e-12
    assert json.loads((tmp_path / "sps.json").read_text())["sample_batch_tokens"] == [4, 12]
    assert st.read_table("runs", "cli-3").loc[0, "arm"] == "cap-accept"
    # usage errors
    r = runner.invoke(app, ["live", "attach", "--url", "http://127.0.0.1:9", "--db", str(db)])
    assert r.exit_code == 2 and "--workload" in r.output
    r = runner.invoke(app, ["live", "drive", "--url", "http://10.0.0.1:30000", "--db", str(db), "--run-id", "x",
                            "-w", "gsm8k", "-n", "1", "--loopback-only"])
    assert r.exit_code == 2 and "non-loopback" in r.output


def test_sglang_profiler_command_dry_run():
    out = _json(runner.invoke(app, ["live", "sps-profile", "--url", "http://127.0.0.1:30000", "--sglang", "--fracs",
                                    "0.25,0.5", "--batch-size", "1,2", "--out", "t.json", "--dry-run", "--json"]))
    argv = out["argv"]
    assert argv[1:4] == ["-m", "sglang.benchmark.dspark_sps_profiler", "all"]
    assert argv[argv.index("--fracs") + 1: argv.index("--fracs") + 3] == ["0.25", "0.5"]
    assert "--no-plot" in argv and out["outputs"]["rounds"] == "t.rounds.jsonl"
    assert out["outputs"]["manifest"] == "t.json.manifest.json"


def test_export_metrics_command(tmp_path):
    r = runner.invoke(app, ["live", "export-metrics", "--db", str(tmp_path / "none.duckdb"), "--port", "0"])
    assert r.exit_code == 2 and "no such" in r.output
    Store(tmp_path / "e.duckdb")
    out = _json(runner.invoke(app, ["live", "export-metrics", "--db", str(tmp_path / "e.duckdb"), "--port", "0",
                                    "--duration", "0.2", "--json"]))
    assert out["url"].startswith("http://127.0.0.1:") and out["url"].endswith("/metrics")


@pytest.mark.parametrize("cmd", ["launch", "attach", "drive", "export-metrics", "sps-profile"])
def test_help_has_an_example(cmd):
    r = runner.invoke(app, ["live", cmd, "--help"])
    assert r.exit_code == 0 and "acceptscope live" in r.output


def test_launch_holds_then_stops(tmp_path):
    import socket
    import sys
    from pathlib import Path

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    fake = f"{sys.executable} {Path(__file__).with_name('fake_sglang_server.py')}"
    r = runner.invoke(app, ["live", "launch", "--arm", "compact", "--model-path", "T", "--block-size", "3",
                            "--port", str(port), "--log-dir", str(tmp_path), "--entry", fake, "--hold", "0.5",
                            "--ready-timeout", "30", "--json"])
    assert r.exit_code == 0, r.output
    out = json.loads(r.stdout)
    assert out["url"] == f"http://127.0.0.1:{port}" and out["pid"] > 0
    assert any("verify-all" in w for w in out["warnings"])  # compact without an SPS table
    assert "server stopped (exit code 0)" in r.output
    assert "shut down" in (tmp_path / "compact.stderr.log").read_text()
