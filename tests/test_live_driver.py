"""Traffic driver against the loopback fake SGLang server: both APIs, pairing, hard caps, loopback guard."""

from __future__ import annotations

import json

import pytest

from acceptscope.live import driver as D
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer


@pytest.fixture(scope="module")
def server():
    with FakeSGLangServer(FakeConfig(mode="cap-accept", gamma=4, dp_ranks=2, seed=3)) as s:
        yield s


def test_load_prompts_shared_and_paths(tmp_path):
    ps = D.load_prompts("gsm8k,mbpp", 6)
    assert [p.workload for p in ps] == ["gsm8k", "mbpp"] * 3
    assert [p.prompt_index for p in ps] == [0, 0, 1, 1, 2, 2]
    assert "eggs" in ps[0].text  # read from /work/shared/data/workloads/gsm8k.jsonl at run time
    f = tmp_path / "mine.jsonl"
    f.write_text(json.dumps({"turns": ["a b c"]}) + "\n" + json.dumps({"turns": ["d e", "f"]}) + "\n")
    ps = D.load_prompts(str(f), 2)
    assert [(p.workload, p.text) for p in ps] == [("mine", "a b c"), ("mine", "d e")]
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"turns": ["ok"]}) + "\n" + json.dumps({"prompt": "x"}) + "\n")
    with pytest.raises(D.WorkloadError, match=r"bad\.jsonl.*2.*turns"):
        D.load_prompts(str(bad), 5)
    with pytest.raises(D.WorkloadError, match="gsm8k"):
        D.load_prompts("no-such-workload", 2)
    # the reference engine's built-in names mean the same prompts as in a reference audit
    builtin = D.load_prompts("poetry", 2)
    assert [p.workload for p in builtin] == ["poetry", "poetry"] and "thuggish" not in builtin[0].text


def test_loopback_guard():
    assert D.check_target("http://127.0.0.1:1234/", True) == "http://127.0.0.1:1234"
    assert D.check_target("http://localhost:1234", True)
    with pytest.raises(D.TargetRefused, match="non-loopback"):
        D.check_target("http://10.1.2.3:30000", True)
    with pytest.raises(D.TargetRefused, match="must be http"):
        D.check_target("ftp://127.0.0.1/x", True)
    with pytest.raises(D.TargetRefused):
        D.Driver(D.DriveConfig(base_url="http://192.0.2.10:30000", run_id="r", loopback_only=True))


def test_generate_api_records_meta_info(server):
    prompts = D.load_prompts("mbpp", 5)
    got: list[dict] = []
    cfg = D.DriveConfig(base_url=server.url, run_id="run-a", concurrency=(1, 3), max_new_tokens=12,
                        temperature=0.7, seed=100, loopback_only=True)
    res = D.Driver(cfg, on_rows=got.extend).run(prompts)
    assert res.stopped_by == "done" and not res.errors
    assert res.sent == 10 and len(res.rows) == 10 and len(got) == 10
    assert set(res.per_level) == {1, 3}
    by_rid = {r["rid"]: r for r in res.rows}
    r = by_rid["run-a-c3-mbpp-2"]
    assert r["prompt_index"] == 2 and r["seed"] == 102 and r["workload"] == "mbpp"
    assert r["completion_tokens"] == 12 == len(r["output_tokens"]) and r["finish_reason"] == "length"
    # meta_info spec fields, with SGLang's definitions
    assert r["spec_num_proposed_drafts"] == r["spec_verify_ct"] * 4
    assert r["spec_accept_rate"] == pytest.approx(r["spec_num_correct_drafts"] / (r["spec_verify_ct"] * 4))
    assert r["spec_accept_length"] == pytest.approx(12 / r["spec_verify_ct"])
    assert r["spec_block_accept_length"] >= r["spec_accept_length"] - 1  # cap-accept only key is present
    assert sum(r["spec_correct_drafts_histogram"]) == r["spec_verify_ct"]


def test_openai_api_reads_sglext(server):
    prompts = D.load_prompts("mt-bench", 3)
    cfg = D.DriveConfig(base_url=server.url, run_id="run-o", api="openai", max_new_tokens=8, temperature=1.0, loopback_only=True)
    res = D.Driver(cfg).run(prompts)
    assert len(res.rows) == 3 and not res.errors
    r = res.rows[0]
    assert r["rid"] == "run-o-c1-mt-bench-0" and r["completion_tokens"] == 8 and r["finish_reason"] == "length"
    assert r["spec_verify_ct"] > 0 and r["spec_cap_length"] > 0
    assert len(r["output_tokens"]) == 8


def test_bad_response_becomes_a_reject(server):
    """A malformed meta_info (here: NaN accept length) is rejected with its field, not stored."""
    orig = server.engine.meta_info

    def broken(q):
        m = orig(q)
        m["spec_accept_length"] = float("nan")
        return m

    server.engine.meta_info = broken
    try:
        got = []
        cfg = D.DriveConfig(base_url=server.url, run_id="bad", max_new_tokens=4, loopback_only=True)
        res = D.Driver(cfg, on_rejects=got.extend).run(D.load_prompts("mbpp", 2))
    finally:
        server.engine.meta_info = orig
    assert res.rows == [] and len(res.rejects) == 2 == len(got)
    r = res.rejects[0]
    assert r["field"] == "meta_info.spec_accept_length" and r["run_id"] == "bad" and "/generate#bad-c1-mbpp-" in r["source"]
    assert "spec_accept_length" in res.errors[0]


def test_hard_caps(server):
    prompts = D.load_prompts("gsm8k", 20)
    cfg = D.DriveConfig(base_url=server.url, run_id="cap", concurrency=(2, 4), max_new_tokens=4, max_requests=5, loopback_only=True)
    res = D.Driver(cfg).run(prompts)
    assert res.sent == 5 and res.stopped_by == "max_requests" and list(res.per_level) == [2]
    # time cap: long generations, tiny budget; the driver returns without waiting for them
    cfg = D.DriveConfig(base_url=server.url, run_id="cap2", concurrency=(2,), max_new_tokens=5000, max_seconds=0.3,
                        loopback_only=True, ignore_eos=True)
    res = D.Driver(cfg).run(prompts)
    assert res.stopped_by == "max_seconds" and res.wall_s < 5
    server.engine.abort_all()
