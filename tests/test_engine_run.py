"""End to end: run_engine / `acceptscope run` / `acceptscope profile` on a tiny random model pair on disk,
checking the telemetry the store receives against SGLang's semantics."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch
from typer.testing import CliRunner

from acceptscope.domain.locations import REPO_ROOT
from acceptscope.engine import EngineConfig, run_engine
from acceptscope.domain import sps as sps_mod
from acceptscope.store import Store
from tests._engine_tiny import save_tiny_pair

GAMMA = 4


@pytest.fixture(scope="module")
def pair(tmp_path_factory):
    old = torch.get_num_threads()
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("tiny_pair")
    td, dd = save_tiny_pair(root, gamma=GAMMA)
    sps_path = root / "sps.json"
    sps_mod.write_sps(sps_mod.SpsTableAdditive(0.001, [1, 64], [0.0, 0.0], [1, 256], [0.0, 0.02]), sps_path)
    yield td, dd, sps_path
    torch.set_num_threads(old)


@pytest.fixture(scope="module")
def db(pair, tmp_path_factory):
    td, dd, sps_path = pair
    path = tmp_path_factory.mktemp("db") / "runs.duckdb"
    sts_path = path.parent / "sts.json"
    from acceptscope.domain import sts as sts_mod

    sts_mod.write_sts(sts_mod.StsTable([1.0, 1.5, 2.0, 3.0]), sts_path)
    summaries = {}
    for arm in ("compact", "cap-accept", "static"):
        cfg = EngineConfig(arm=arm, target=str(td), drafter=str(dd), workload="mixed", num_requests=12,
                           max_new_tokens=14, max_running_requests=5, sps=str(sps_path), db=str(path),
                           run_id=f"t-{arm}", threads=1, audit_group="g1",
                           sts=str(sts_path) if arm == "compact" else None)
        summaries[arm] = run_engine(cfg)
    return path, summaries


def test_runs_rows_and_summary(db, pair):
    path, summaries = db
    st = Store(path)
    runs = st.runs().set_index("run_id")
    assert set(runs.index) == {"t-compact", "t-cap-accept", "t-static"}
    r = runs.loc["t-compact"]
    assert r.engine == "reference" and r.source == "live" and r.gamma == GAMMA and r.audit_group == "g1"
    assert r.sps_hash == sps_mod.table_hash(pair[2]) and r.sts_hash == sps_mod.table_hash(path.parent / "sts.json")
    assert pd.isna(runs.loc["t-static"].sts_hash)
    assert json.loads(r.config_json)["arm"] == "compact"
    s = summaries["compact"]
    assert s.requests == 12 and s.completion_tokens > 0 and s.tokens_per_s > 0
    assert set(s.by_workload) == {"math", "code", "chat", "poetry"}
    assert s.executed_verify_tokens == s.scheduled_verify_tokens
    c = summaries["cap-accept"]
    assert c.executed_verify_tokens >= c.scheduled_verify_tokens


def test_greedy_outputs_identical_across_arms(db):
    st = Store(db[0])
    df = st.query_df("SELECT run_id, rid, output_tokens FROM requests")
    by = {k: {r.rid: list(r.output_tokens) for r in g.itertuples()} for k, g in df.groupby("run_id")}
    assert by["t-compact"] == by["t-cap-accept"] == by["t-static"]


def test_request_steps_semantics(db):
    st = Store(db[0])
    rs = st.read_table("request_steps")
    assert len(rs) > 0
    for r in rs.itertuples():
        assert r.window == r.verify_len - 1 and r.acc_len == r.correct_drafts + 1
        assert 0 <= r.correct_drafts <= r.window <= GAMMA
        for col in (r.draft_tokens, r.confidence, r.survival, r.confidence_logit, r.draft_logprob, r.target_logprob):
            assert len(col) == GAMMA
        assert np.allclose(np.cumprod(r.confidence), r.survival, atol=1e-5)
        temps = [1.0, 1.5, 2.0, 3.0] if r.run_id == "t-compact" else [1.0] * GAMMA  # STS: c = sigmoid(z / T)
        assert np.allclose(r.confidence, 1 / (1 + np.exp(-np.asarray(r.confidence_logit) / temps)), atol=1e-5)
        tl = [x for x in r.target_logprob]
        if r.run_id == "t-compact":
            assert r.ceiling is None or np.isnan(r.ceiling)
            assert r.cap_trim in (0, 1)
            scored = min(r.window + 1, GAMMA)
            assert all(x is not None and not np.isnan(x) for x in tl[:scored])
            assert all(x is None or np.isnan(x) for x in tl[scored:])
        else:
            assert r.ceiling == r.correct_drafts + r.cap_trim
            assert all(x is not None and not np.isnan(x) for x in tl)
        if r.run_id == "t-static":
            assert r.window == GAMMA and r.cap_trim == 0
        committed = list(r.committed_tokens)
        assert 1 <= len(committed) <= r.acc_len
        assert committed[: r.correct_drafts] == list(r.draft_tokens)[: min(r.correct_drafts, len(committed))]


def test_steps_and_requests_consistent(db):
    st = Store(db[0])
    steps = st.read_table("steps")
    rs = st.read_table("request_steps")
    req = st.read_table("requests")
    for run_id, g in steps.groupby("run_id"):
        assert g.forward_ct.is_unique
        sub = rs[rs.run_id == run_id]
        per_step = sub.groupby("forward_ct").verify_len.sum()
        gg = g.set_index("forward_ct")
        assert (gg.bs == sub.groupby("forward_ct").size()).all()
        if run_id == "t-static":
            assert gg.budget.isna().all() and gg.lag_steps.isna().all()
            assert (gg.num_verify_tokens == gg.bs * (GAMMA + 1)).all()
        else:
            assert (gg.num_verify_tokens == per_step).all()
            warm = gg.budget.notna()
            assert warm.sum() > 0 and (gg.lag_steps == 2).all()
            assert (gg[warm].predicted_step_ms > 0).all() and (gg[warm].predicted_theta > 0).all()
            # SGLang invariant: sum(verify_len - 1) <= budget
            assert ((per_step - gg.bs)[warm] <= gg.budget[warm]).all()
        if run_id == "t-compact":
            assert (gg.executed_verify_tokens == per_step).all()
        else:
            assert (gg.executed_verify_tokens == gg.bs * (GAMMA + 1)).all()
        assert (g.draft_gpu_ms > 0).all() and (g.target_verify_gpu_ms > 0).all()
    for r in req.itertuples():
        sub = rs[(rs.run_id == r.run_id) & (rs.rid == r.rid)].sort_values("step_index")
        assert list(sub.step_index) == list(range(len(sub)))
        assert r.completion_tokens == len(r.output_tokens) == 1 + sum(len(c) for c in sub.committed_tokens)
        assert sub.finished.iloc[-1] and not sub.finished.iloc[:-1].any()
        assert r.spec_verify_ct == len(sub)
        assert r.spec_accept_length == pytest.approx(r.completion_tokens / r.spec_verify_ct)
        assert r.spec_num_proposed_drafts == len(sub) * GAMMA
        assert r.spec_num_correct_drafts == sub.correct_drafts.sum()
        assert sum(r.spec_correct_drafts_histogram) == len(sub)
        if r.run_id == "t-cap-accept":
            assert r.spec_block_accept_length == pytest.approx((sub.acc_len + sub.cap_trim).sum() / len(sub))
        else:
            assert r.spec_block_accept_length is None or np.isnan(r.spec_block_accept_length)


def test_no_per_position_leaves_lists_null_and_cli_runs(pair, tmp_path):
    td, dd, sps_path = pair
    path = tmp_path / "cli.duckdb"
    from acceptscope.cli import app

    res = CliRunner().invoke(app, [
        "run", "--engine", "reference", "--arm", "cap-accept", "--workload", "math,chat", "--db", str(path),
        "--requests", "4", "--max-new-tokens", "6", "--target", str(td), "--drafter", str(dd), "--sps", str(sps_path),
        "--no-per-position", "--run-id", "np", "--threads", "1", "--json",
    ])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.stdout[res.stdout.index("{"):])
    assert summary["run_id"] == "np" and summary["requests"] == 4
    rs = Store(path).read_table("request_steps", "np")
    assert len(rs) > 0
    for col in ("draft_tokens", "confidence", "survival", "confidence_logit", "draft_logprob", "target_logprob",
                "committed_tokens"):
        assert rs[col].isna().all(), col
    assert rs.correct_drafts.notna().all() and rs.ceiling.notna().all()
    bad = CliRunner().invoke(app, ["run", "--arm", "nope", "--db", str(path), "--target", str(td), "--drafter", str(dd)])
    assert bad.exit_code == 2


def test_profile_cli_writes_both_sglang_formats(pair, tmp_path):
    td, dd, _ = pair
    from acceptscope.cli import app

    out = tmp_path / "sps.json"
    res = CliRunner().invoke(app, ["profile", "--engine", "reference", "--out", str(out), "--target", str(td),
                                   "--drafter", str(dd), "--batch-sizes", "1,2,4", "--fracs", "0,0.5,1",
                                   "--steps", "2", "--context-len", "8", "--threads", "1", "--json"])
    assert res.exit_code == 0, res.output
    add = sps_mod.load_sps(out)
    one = sps_mod.load_sps(tmp_path / "sps.1d.json")
    assert isinstance(add, sps_mod.SpsTableAdditive) and add.bs_probes == [1, 2, 4]
    assert isinstance(one, sps_mod.SpsTable1D) and one.sample_batch_tokens == [5, 10, 20]
    assert "bias_seconds" not in (tmp_path / "sps.1d.json").read_text()


def test_shipped_default_sps_table_loads():
    from acceptscope.engine import DEFAULT_SPS

    if not DEFAULT_SPS.exists():
        pytest.skip("no shipped SPS table yet")
    t = sps_mod.load_sps(DEFAULT_SPS)
    assert t.step_seconds(8, 8) > 0
    assert DEFAULT_SPS.stat().st_size < 4096


@pytest.mark.skipif(not (REPO_ROOT / "fixtures/models/target/config.json").exists()
                    or not (REPO_ROOT / "fixtures/models/drafter/config.json").exists(),
                    reason="fixture model pair not built")
def test_fixture_pair_greedy_matches_target_argmax():
    from acceptscope.engine import load_models
    from acceptscope.engine.runner import Engine, RequestSpec
    from acceptscope.domain.chat import format_chat
    from acceptscope.engine.tokenizer import load_tokenizer
    from acceptscope.domain.workloads import load_prompts
    from tests._engine_tiny import hf_greedy

    torch.set_num_threads(1)
    tpath, _, model, dr = load_models("fixtures/models/target", "fixtures/models/drafter")
    tok = load_tokenizer(tpath)
    prompts = load_prompts("mixed", 4)
    ids = [tok.encode(format_chat([{"role": "user", "content": p.text}], add_generation_prompt=True),
                      add_special_tokens=False)[-96:] for p in prompts]
    eos = model.config.eos_token_id
    specs = [RequestSpec(rid=f"f{i}", prompt_ids=x, max_new_tokens=24) for i, x in enumerate(ids)]
    ref = [hf_greedy(model, x, 24, eos=eos) for x in ids]
    for mode in ("compact", "cap-accept"):
        eng = Engine(model, dr, mode=mode, max_running_requests=4, max_seq_len=160, eos_token_id=eos,
                     sps=sps_mod.load_sps(REPO_ROOT / "acceptscope/engine/data/sps_reference.json")
                     if (REPO_ROOT / "acceptscope/engine/data/sps_reference.json").exists() else None)
        res = {r.rid: r.output_tokens for r in eng.run(specs)}
        assert [res[f"f{i}"] for i in range(len(ids))] == ref
        assert sum(r.correct_drafts for r in eng.results) > 0


def test_request_keys_serve_a_paired_subset(pair, tmp_path):
    td, dd, sps_path = pair
    path = tmp_path / "sub.duckdb"
    keys = [("math", 1), ("poetry", 0)]
    s = run_engine(EngineConfig(arm="cap-accept", target=str(td), drafter=str(dd), num_requests=12, max_new_tokens=6,
                                sps=str(sps_path), db=str(path), run_id="sub", threads=1, request_keys=keys))
    assert s.requests == 2
    got = Store(path).query_df("SELECT workload, prompt_index, rid FROM requests ORDER BY rid")
    assert sorted(zip(got.workload, got.prompt_index)) == sorted(keys)
    assert sorted(got.rid) == ["math-1", "poetry-0"]


def test_runs_record_the_sps_and_sts_table_rows_under_their_hash(db, pair, monkeypatch):
    from acceptscope.ingest.sps import parse_sps_table
    from acceptscope.ingest.sts_table import parse_sts_table

    path, _ = db
    st = Store(path)
    runs = st.runs().set_index("run_id")
    sts_path = path.parent / "sts.json"
    sps_rows = st.query_df("SELECT * FROM sps_tables")
    sts_rows = st.query_df("SELECT * FROM sts_tables")
    # one table each, keyed by exactly the hash the runs rows carry (three arms share the SPS table)
    assert set(sps_rows.table_hash) == set(runs.sps_hash) == {sps_mod.table_hash(pair[2])}
    assert set(sts_rows.table_hash) == {runs.loc["t-compact"].sts_hash}
    # the rows are what the ingest parser makes of the same file
    want_sps = parse_sps_table(pair[2].read_bytes(), source=str(pair[2])).tables["sps_tables"]
    got = sorted(zip(sps_rows.component, sps_rows.probe, sps_rows.value))
    assert got == sorted((r["component"], r["probe"], r["value"]) for r in want_sps)
    assert (sps_rows.kind == "additive").all()
    want_sts = parse_sts_table(sts_path.read_bytes(), source=str(sts_path)).tables["sts_tables"]
    assert sorted(zip(sts_rows.position, sts_rows.temperature)) == [(r["position"], r["temperature"]) for r in want_sts]
    assert st.query_df("SELECT count(*) AS n FROM rejects").n[0] == 0
    # the estimators read the run's tables from these rows, not from the file
    from acceptscope import estimators

    monkeypatch.setattr(estimators.run_data, "_sps_from_config", lambda *a: pytest.fail("fell back to the SPS file"))
    data = estimators.load_run(st, "t-compact")
    assert data["sps_table"] is not None
    assert list(data["sts_temperatures"]) == pytest.approx([1.0, 1.5, 2.0, 3.0])


def test_window_replay_run_gives_a_sampled_subset_audit_parity(pair, tmp_path):
    td, dd, sps_path = pair
    path = tmp_path / "replay.duckdb"
    common = dict(target=str(td), drafter=str(dd), workload="mixed", num_requests=8, max_new_tokens=12,
                  max_running_requests=8, sps=str(sps_path), db=str(path), threads=1, temperature=1.0, seed=3)
    run_engine(EngineConfig(arm="compact", run_id="p", **common))
    keys = [("math", 0), ("chat", 1)]
    run_engine(EngineConfig(arm="cap-accept", run_id="a", request_keys=keys, window_replay_run="p", **common))
    st = Store(path)
    out = {(r.run_id, r.rid): list(r.output_tokens)
           for r in st.query_df("SELECT run_id, rid, output_tokens FROM requests").itertuples()}
    for w, i in keys:
        assert out[("a", f"{w}-{i}")] == out[("p", f"{w}-{i}")]
    win = st.query_df('SELECT run_id, rid, step_index, "window" AS w FROM request_steps WHERE rid IN (?, ?) '
                      "ORDER BY run_id, rid, step_index", ["math-0", "chat-1"])
    assert list(win[win.run_id == "a"].w) == list(win[win.run_id == "p"].w)
    with pytest.raises(ValueError, match="no request_steps rows"):
        run_engine(EngineConfig(arm="cap-accept", run_id="b", window_replay_run="nope", **common))
