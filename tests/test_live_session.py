"""Two-arm SGLang audit sessions: attach to two servers, or launch both arms as real subprocesses."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

import pytest

from acceptscope import live
from acceptscope.live.driver import DriveConfig, load_prompts
from acceptscope.live.session import run_sglang_audit
from acceptscope.store import Store
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer

FAKE = [sys.executable, str(Path(__file__).with_name("fake_sglang_server.py"))]


def two_free_ports() -> int:
    for _ in range(50):
        with socket.socket() as a:
            a.bind(("127.0.0.1", 0))
            p = a.getsockname()[1]
        if p >= 65000:
            continue
        try:
            with socket.socket() as b:
                b.bind(("127.0.0.1", p + 1))
            return p
        except OSError:
            continue
    raise RuntimeError("no two consecutive free ports")


def test_attach_two_arms_into_one_db(tmp_path):
    with FakeSGLangServer(FakeConfig(mode="compact", gamma=4, seed=1)) as c, \
         FakeSGLangServer(FakeConfig(mode="cap-accept", gamma=4, seed=2)) as a:
        prompts = load_prompts("math500", 8)
        res = run_sglang_audit(
            tmp_path / "audit.duckdb", prompts, urls={"compact": c.url, "cap-accept": a.url},
            drive=DriveConfig(base_url="http://127.0.0.1", run_id="", concurrency=(4,), max_new_tokens=16, temperature=0.6,
                              loopback_only=True),
            audit_group="grp-1", capture_defaults={"poll_interval_s": 0.1, "scrape_metrics": False},
        )
    assert res.run_ids == {"compact": "grp-1-compact", "cap-accept": "grp-1-cap-accept"}
    store = Store(tmp_path / "audit.duckdb")
    runs = store.runs().set_index("run_id")
    assert set(runs["audit_group"]) == {"grp-1"}
    assert runs.loc["grp-1-compact", "arm"] == "compact" and runs.loc["grp-1-cap-accept", "arm"] == "cap-accept"
    req = store.read_table("requests")
    pairs = req.pivot_table(index=["workload", "prompt_index"], columns="run_id", values="seed")
    assert len(pairs) == 8 and (pairs["grp-1-compact"] == pairs["grp-1-cap-accept"]).all()  # same prompts, same seeds
    rs = store.query_df("SELECT run_id, count(*) n, count(ceiling) n_ceiling FROM request_steps GROUP BY run_id").set_index("run_id")
    assert rs.loc["grp-1-cap-accept", "n_ceiling"] == rs.loc["grp-1-cap-accept", "n"] > 0  # exact ceiling in cap-accept
    assert rs.loc["grp-1-compact", "n_ceiling"] == 0  # must be estimated in compact
    assert all(s.drive["ok"] == 8 for s in res.arms.values())


def test_run_audit_launches_both_arms(tmp_path):
    port = two_free_ports()
    out = live.run_audit(
        db=str(tmp_path / "a.duckdb"), audit_group="g2", arms=["compact", "cap-accept"], workload="mbpp",
        audit_fraction=0.5, sample_seed=3, target="fake/T", drafter="fake/D", gamma=3, num_requests=6,
        max_new_tokens=10, temperature=0.8, base_port=port, log_dir=str(tmp_path / "logs"), entry=FAKE,
        concurrency=(3,), ready_timeout_s=30, capture_defaults={"poll_interval_s": 0.1, "scrape_metrics": True,
                                                                "metrics_interval_s": 0.2},
        threads=2,  # a reference-engine option: ignored here
    )
    assert set(out) == {"compact", "cap-accept"}
    assert out["compact"]["drive"]["ok"] == 6 and out["cap-accept"]["drive"]["ok"] == 3  # audit sample
    store = Store(tmp_path / "a.duckdb")
    runs = store.runs().set_index("run_id")
    assert list(runs.loc[["g2-compact", "g2-cap-accept"], "gamma"]) == [3, 3]
    cfg = runs.loc["g2-cap-accept", "config_json"]
    assert "SGLANG_DSPARK_STS_COLLECT_PATH" in cfg and "--speculative-dspark-block-size" in cfg  # launch recorded
    logs = tmp_path / "logs"
    assert (logs / "compact.stderr.log").read_text().count("shut down") == 1  # stopped cleanly, one after the other
    assert (logs / "compact.estimator.jsonl").exists() and (logs / "cap-accept.estimator.jsonl").exists()
    with pytest.raises(ValueError, match="unknown option"):
        live.run_audit(db=str(tmp_path / "b.duckdb"), audit_group="g3", urls={"compact": "http://127.0.0.1:1"}, bogus=1)
    with pytest.raises(ValueError, match="no URL for arm"):
        live.run_audit(db=str(tmp_path / "b.duckdb"), audit_group="g3", urls="compact=http://127.0.0.1:1")
    with pytest.raises(ValueError, match="--target"):
        live.run_audit(db=str(tmp_path / "b.duckdb"), audit_group="g3")
