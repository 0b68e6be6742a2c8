"""Other engines' telemetry (vLLM's spec-decode counters, TensorRT-LLM's accept stats) into the store.

The producers are driven by the same block outcomes (a simulated DSpark run's request-steps): vLLM's
counters by ``prometheus_client`` counters named and labelled as ``SpecDecodingProm`` names them and
incremented as ``SpecDecodingStats.observe_draft`` does, exposed by ``prometheus_client``'s own
``generate_latest``; TensorRT-LLM's snapshot as ``DFlashAcceptStatsRecorder.on_accept`` accumulates it.
Ingest must give back exactly the counts written; bad records are rejected alone.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
import requests
from prometheus_client import CollectorRegistry, Counter, generate_latest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.estimators.synthetic import compact_view, simulate
from acceptscope.ingest.engines import (detect_engine, has_engine_counts, ingest_engine_files, parse_engine_file,
                                        write_engine_batch)
from acceptscope.ingest.engines.identify import compare, engine_figures
from acceptscope.live.exporter import MetricsExporter
from acceptscope.live.prometheus_scrape import parse_metrics
from acceptscope.store import Store


def _rows(compact: bool = False, seed: int = 1):
    t = simulate(n_requests=30, seed=seed).tables
    gamma = int(t["runs"]["gamma"].iloc[0])
    if compact:  # the planner's windows
        return compact_view(t["request_steps"]), gamma
    rs = t["request_steps"]  # a full verify of every block (vLLM's fixed k): its outcome is the ceiling
    return rs.assign(window=gamma, correct_drafts=rs["ceiling"]), gamma


def vllm_dump(rs, gamma: int, model: str = "Qwen/Qwen3-8B") -> tuple[bytes, dict]:
    """The exposition vLLM would serve for these blocks (two DP engines: even and odd ranks of rows)."""
    reg = CollectorRegistry()
    labels = ["model_name", "engine"]
    drafts = Counter("vllm:spec_decode_num_drafts", "Number of spec decoding drafts.", labels, registry=reg)
    toks = Counter("vllm:spec_decode_num_draft_tokens", "Number of draft tokens.", labels, registry=reg)
    acc = Counter("vllm:spec_decode_num_accepted_tokens", "Number of accepted tokens.", labels, registry=reg)
    per = Counter("vllm:spec_decode_num_accepted_tokens_per_pos", "Accepted tokens per draft position.",
                  labels + ["position"], registry=reg)
    want: dict = {}
    for i, (w, c) in enumerate(zip(rs["window"].to_numpy(), rs["correct_drafts"].to_numpy())):
        e = str(i % 2)
        drafts.labels(model, e).inc(1)
        toks.labels(model, e).inc(int(w))
        acc.labels(model, e).inc(int(c))
        for k, v in (("num_drafts", 1), ("num_draft_tokens", int(w)), ("num_accepted_tokens", int(c))):
            want[(int(e), k, -1)] = want.get((int(e), k, -1), 0) + v
        for p in range(gamma):  # every position exists from the start, as SpecDecodingProm creates them
            per.labels(model, e, str(p)).inc(1 if p < c else 0)
            want[(int(e), "accepted_per_pos", p)] = want.get((int(e), "accepted_per_pos", p), 0) + (1 if p < c else 0)
    return generate_latest(reg), want


def trtllm_snapshot(rs, gamma: int, rank: int = 0, nbins: int = 20) -> dict:
    """``DFlashAcceptStatsRecorder.snapshot()`` of these blocks (on_accept with n = accepted + 1, and the
    block's confidences as the draft-time provider rows)."""
    hist = [0] * (gamma + 1)
    per: dict = {}
    att = [[0] * nbins for _ in range(gamma)]
    acc = [[0] * nbins for _ in range(gamma)]
    for rid, c, conf in zip(rs["rid"], rs["correct_drafts"].to_numpy(), rs["confidence"]):
        a = min(max(int(c), 0), gamma)
        hist[a] += 1
        e = per.setdefault(str(rid), {"steps": 0, "accepted_draft": 0})
        e["steps"] += 1
        e["accepted_draft"] += a
        for k, x in enumerate(list(conf)[:gamma]):
            b = min(max(int(float(x) * nbins), 0), nbins - 1)
            att[k][b] += 1
            acc[k][b] += a > k
    return {"rank": rank, "max_draft_len": gamma, "num_steps": int(sum(hist)), "accepted_draft_hist": hist,
            "per_request": per, "confidence_calibration": {"num_bins": nbins, "attempts": att, "accepted": acc}}


def _cells(batch) -> dict:
    return {(r["rank"], r["metric"], r["position"]): r["value"] for r in batch.counts}


@pytest.mark.parametrize("compact", [False, True])
def test_vllm_counters_exact(tmp_path, compact):
    rs, gamma = _rows(compact)
    text, want = vllm_dump(rs, gamma)
    f = tmp_path / "vllm.prom"
    f.write_bytes(text)
    assert detect_engine(f) == "vllm_metrics"
    b = parse_engine_file(f, "vllm_metrics", "v1")
    assert not b.rejects and _cells(b) == want
    assert b.runs[0]["gamma"] == gamma and b.runs[0]["engine"] == "vllm" and b.runs[0]["target_model"] == "Qwen/Qwen3-8B"
    assert b.runs[0]["arm"] == ("compact" if compact else "static")
    st = Store(tmp_path / "s.duckdb")
    write_engine_batch(st, b)
    fig = engine_figures(st, "v1")
    c, w = rs["correct_drafts"].to_numpy(), rs["window"].to_numpy()
    f_ = fig["figures"]
    assert f_["drafts"] == len(rs) and f_["accepted"] == c.sum() and f_["draft_tokens"] == w.sum()
    assert f_["mean_acceptance_length"] == pytest.approx(1 + c.mean(), abs=1e-12)
    assert f_["accepted_histogram"] == np.bincount(c, minlength=gamma + 1).tolist()
    assert f_["per_position_acceptance"] == pytest.approx([(c > k).mean() for k in range(gamma)], abs=1e-12)
    assert "counterfactual" in " ".join(fig["not_identified"]) and "vllm" in fig["format_source"]
    assert bool(fig["notes"]) == compact  # varied windows: conditional acceptance is not identified


def test_vllm_bad_samples_rejected_alone(tmp_path):
    rs, gamma = _rows()
    text, want = vllm_dump(rs, gamma)
    bad = [
        'vllm:spec_decode_num_drafts_total{engine="7",model_name="Qwen/Qwen3-8B"} NaN',
        'vllm:spec_decode_num_drafts_total{engine="8",model_name="Qwen/Qwen3-8B"} -3.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="7",model_name="Qwen/Qwen3-8B",position="x"} 1.0',
        'vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="7",model_name="Qwen/Qwen3-8B",position="0"} 1.5',
        'vllm:spec_decode_num_draft_tokens_total{engine="0",model_name="Qwen/Qwen3-8B" 3',
        'vllm:spec_decode_num_drafts_total{engine="0",model_name="Qwen/Qwen3-8B"} 99.0',  # a repeat: first kept
        'vllm:spec_decode_num_drafts_total{engine="e1",model_name="Qwen/Qwen3-8B"} 1.0',
    ]
    lines = text.decode().splitlines()
    f = tmp_path / "bad.prom"
    f.write_text("\n".join(lines + bad) + "\n")
    b = parse_engine_file(f, "vllm_metrics", "v")
    assert _cells(b) == want  # every valid sample kept, exactly
    assert sorted(r["line"] for r in b.rejects) == list(range(len(lines) + 1, len(lines) + len(bad) + 1))
    assert all(r["source"] == str(f) and r["field"].startswith("vllm:spec_decode_") for r in b.rejects)


def test_trtllm_accept_stats_exact_and_stored(tmp_path):
    rs, gamma = _rows(seed=4)
    rids = sorted(rs["rid"].unique())
    snaps = [trtllm_snapshot(rs[rs["rid"].isin(rids[r::2])], gamma, rank=r) for r in (0, 1)]  # attention-DP: disjoint requests
    d = tmp_path / "stats"
    d.mkdir()
    for s in snaps:
        (d / f"dflash_accept_stats_rank{s['rank']}.json").write_text(json.dumps(s))
    files = sorted(d.iterdir())
    assert [detect_engine(p) for p in files] == ["trtllm_accept_stats"] * 2
    st = Store(tmp_path / "s.duckdb")
    b = ingest_engine_files(st, files, run_id="trt")
    assert not b.rejects
    for s in snaps:
        got = {(m, p): v for (r, m, p), v in _cells(b).items() if r == s["rank"]}
        assert [got[("accepted_draft_hist", a)] for a in range(gamma + 1)] == s["accepted_draft_hist"]
        assert got[("num_steps", -1)] == s["num_steps"]
    calib = {(r["rank"], r["metric"], r["position"], r["bin"]): r["value"] for r in b.counts if r["metric"].startswith("calib_")}
    for s in snaps:
        cc = s["confidence_calibration"]
        for k in range(gamma):
            for j in range(cc["num_bins"]):
                assert calib.get((s["rank"], "calib_attempts", k, j), 0) == cc["attempts"][k][j]
                assert calib.get((s["rank"], "calib_accepted", k, j), 0) == cc["accepted"][k][j]
    req = st.query_df("SELECT rid, spec_verify_ct, spec_num_correct_drafts FROM requests WHERE run_id = 'trt'")
    per = {**snaps[0]["per_request"], **snaps[1]["per_request"]}
    assert len(req) == len(per) and all(
        per[r.rid] == {"steps": r.spec_verify_ct, "accepted_draft": r.spec_num_correct_drafts} for r in req.itertuples())
    fig = engine_figures(st, "trt")["figures"]
    c = rs["correct_drafts"].to_numpy()
    assert fig["accepted_histogram"] == np.bincount(c, minlength=gamma + 1).tolist()
    assert fig["mean_acceptance_length"] == pytest.approx(1 + c.mean(), abs=1e-12)
    assert len(fig["binned_ece"]) == gamma and all(0 <= e <= 1 for e in fig["binned_ece"] if e is not None)
    # re-ingest stores nothing twice; a read-only open of the store still works (engine_counts is optional)
    ingest_engine_files(st, files, run_id="trt")
    ro = Store(tmp_path / "s.duckdb", read_only=True)
    n = ro.query_df("SELECT count(*) n FROM engine_counts").n.iat[0]
    assert n == len(b.counts)
    with ro.connect(read_only=True) as con:
        assert has_engine_counts(con)


def test_trtllm_bad_records_rejected_alone(tmp_path):
    rs, gamma = _rows(seed=5)
    s = trtllm_snapshot(rs, gamma)
    good = dict(s["per_request"])
    s["per_request"]["bad-a"] = {"steps": "x", "accepted_draft": 1}
    s["per_request"]["bad-b"] = {"steps": 1, "accepted_draft": gamma + 1}
    s["confidence_calibration"]["accepted"][2][3] = s["confidence_calibration"]["attempts"][2][3] + 1
    s["accepted_draft_hist"][1] = float("nan")
    f = tmp_path / "dflash_accept_stats_rank0.json"
    f.write_text(json.dumps(s))
    b = parse_engine_file(f, "trtllm_accept_stats", "t")
    fields = sorted(r["field"] for r in b.rejects)
    assert fields == ["accepted_draft_hist[1]", "confidence_calibration.attempts[2]", "per_request.bad-a.steps",
                      "per_request.bad-b.accepted_draft"]
    assert {r["rid"] for r in b.requests} == set(good)  # every good request kept
    assert not [r for r in b.counts if r["metric"] == "accepted_draft_hist"]
    kept = {r["position"] for r in b.counts if r["metric"] == "calib_attempts"}
    assert 2 not in kept and kept  # the bad position alone
    whole = tmp_path / "dflash_accept_stats_rank9.json"
    whole.write_text(json.dumps({"rank": 0, "max_draft_len": "seven"}))
    b2 = parse_engine_file(whole, "trtllm_accept_stats", "t")
    assert [r["field"] for r in b2.rejects] == ["max_draft_len"] and not b2.runs


def test_later_dump_of_one_server_replaces_the_earlier(tmp_path):
    """Counters are cumulative: a later dump of the same server into the same run is not added to the earlier."""
    rs, gamma = _rows()
    early, _ = vllm_dump(rs.iloc[: len(rs) // 2], gamma)
    late, want = vllm_dump(rs, gamma)
    (tmp_path / "a.prom").write_bytes(early)
    (tmp_path / "b.prom").write_bytes(late)
    st = Store(tmp_path / "s.duckdb")
    ingest_engine_files(st, [tmp_path / "a.prom", tmp_path / "b.prom"], run_id="v")
    f = engine_figures(st, "v")["figures"]
    assert f["drafts"] == len(rs) and f["accepted"] == rs["correct_drafts"].sum()


def test_exporter_serves_engine_runs(tmp_path):
    """A vLLM run in the store is served under the same counter names, from its counts (no estimator)."""
    rs, gamma = _rows()
    text, want = vllm_dump(rs, gamma)
    (tmp_path / "v.prom").write_bytes(text)
    st = Store(tmp_path / "s.duckdb")
    st.append(simulate(n_requests=12, seed=3, run_id="syn-native").tables)
    ingest_engine_files(st, [tmp_path / "v.prom"], run_id="vllm-run")
    with MetricsExporter(str(tmp_path / "s.duckdb"), 0, refresh_s=0.1, n_boot=20) as ex:
        assert ex.source.wait_ready(300), ex.source.last_error
        m = {(s.name, s.labels): s.value for s in parse_metrics(requests.get(ex.url, timeout=10).text, prefix="acceptscope_")}
    get = lambda n, **lab: [v for (k, l), v in m.items() if k == n and all(dict(l).get(a) == b for a, b in lab.items())]  # noqa: E731
    c = rs["correct_drafts"].to_numpy()
    assert get("acceptscope_spec_decode_num_drafts_total", run_id="vllm-run") == [len(rs)]
    assert get("acceptscope_spec_decode_num_accepted_tokens_total", run_id="vllm-run") == [c.sum()]
    for k in range(gamma):
        assert get("acceptscope_spec_decode_num_accepted_tokens_per_pos_total", run_id="vllm-run", position=str(k)) == [(c > k).sum()]
        assert get("acceptscope_spec_decode_num_verified_per_pos_total", run_id="vllm-run", position=str(k)) == [len(rs)]
    assert get("acceptscope_realized_accept_length", run_id="vllm-run") == [pytest.approx(1 + c.mean(), abs=1e-12)]
    assert get("acceptscope_estimate_error", run_id="vllm-run") == pytest.approx([0.0])
    assert get("acceptscope_run_info", run_id="vllm-run", engine="vllm", gen_ai_provider_name="vllm") == pytest.approx([1.0])
    assert get("acceptscope_spec_decode_num_drafts_total", run_id="syn-native")  # the native run still estimated
    assert get("acceptscope_exporter_errors_total") == pytest.approx([0.0])


def aiperf_lines(rs) -> tuple[list[dict], dict]:
    """AIPerf's MetricRecordInfo lines for these blocks' requests (plus a warmup record and a failed one)."""
    lines, want = [], {}
    for i, (rid, g) in enumerate(rs.groupby("rid", sort=True)):
        s, a, p = len(g), int(g["correct_drafts"].sum()), int(g["window"].sum())
        want[f"req-{rid}"] = (s, a, p)
        lines.append({"metadata": {"session_num": i, "x_request_id": f"req-{rid}", "turn_index": 0,
                                   "request_start_ns": 10**18, "request_end_ns": 10**18 + 2 * 10**9,
                                   "worker_id": "w0", "record_processor_id": "rp0", "benchmark_phase": "profiling"},
                      "metrics": {"request_latency": {"value": 2000.0, "unit": "ms"},
                                  "spec_decode_steps": {"value": s, "unit": "count"},
                                  "spec_decode_accepted_draft_tokens": {"value": a, "unit": "tokens"},
                                  "spec_decode_draft_tokens": {"value": p, "unit": "tokens"},
                                  "spec_decode_acceptance_length": {"value": 1 + a / s, "unit": "ratio"}}})
    warm = json.loads(json.dumps(lines[0]))
    warm["metadata"].update(benchmark_phase="warmup", x_request_id="warm")
    failed = {"metadata": {**lines[0]["metadata"], "x_request_id": "failed"}, "metrics": {},
              "error": {"code": 500, "type": "Internal Server Error", "message": "boom"}}
    return lines + [warm, failed], want


def test_aiperf_profile_export_exact_and_bad_lines_alone(tmp_path):
    rs, gamma = _rows(seed=7)
    lines, want = aiperf_lines(rs)
    bad = [{"metadata": {**lines[0]["metadata"], "x_request_id": "neg"},
            "metrics": {**lines[0]["metrics"], "spec_decode_steps": {"value": -1, "unit": "count"}}},
           {"metadata": {**lines[0]["metadata"], "x_request_id": "over"},
            "metrics": {**lines[0]["metrics"], "spec_decode_accepted_draft_tokens": {"value": 10**6, "unit": "tokens"}}}]
    f = tmp_path / "profile_export.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines + bad) + "\n{not json\n")
    assert detect_engine(f) == "aiperf_profile_export"
    st = Store(tmp_path / "s.duckdb")
    b = ingest_engine_files(st, [f], run_id="ai")
    n = len(lines)
    assert sorted((r["line"], r["field"]) for r in b.rejects) == [
        (n + 1, "metrics.spec_decode_steps.value"), (n + 2, "metrics.spec_decode_accepted_draft_tokens.value"),
        (n + 3, "$")]
    got = st.query_df("SELECT rid, spec_verify_ct, spec_num_correct_drafts, spec_num_proposed_drafts FROM requests")
    assert {r.rid: (r.spec_verify_ct, r.spec_num_correct_drafts, r.spec_num_proposed_drafts)
            for r in got.itertuples()} == want  # warmup and failed records are not requests of the run
    fig = engine_figures(st, "ai")
    c = rs["correct_drafts"].to_numpy()
    assert fig["figures"]["mean_acceptance_length"] == pytest.approx(1 + c.mean(), abs=1e-12)
    assert fig["figures"]["draft_acceptance_rate"] == pytest.approx(c.sum() / rs["window"].sum(), abs=1e-12)
    assert fig["figures"]["per_position_acceptance"] is None and "per-position" in fig["not_identified"][0]
    assert json.loads(st.query_df("SELECT config_json FROM runs").config_json.iat[0])["not_stored"] == {
        "warmup": 1, "error": 1, "no_spec_decode": 0}


def test_same_blocks_through_every_format_compare_equal(tmp_path):
    """One run's blocks, stored natively and written as vLLM counters, TensorRT-LLM stats and AIPerf records:
    the figures the engines share agree, and what one cannot identify is None."""
    rs, gamma = _rows(seed=9)
    st = Store(tmp_path / "s.duckdb")
    t = simulate(n_requests=30, seed=9).tables
    st.append({**t, "request_steps": rs})  # the native run (window = gamma)
    native = str(t["runs"]["run_id"].iloc[0])
    text, _ = vllm_dump(rs, gamma)
    (tmp_path / "v.prom").write_bytes(text)
    (tmp_path / "dflash_accept_stats_rank0.json").write_text(json.dumps(trtllm_snapshot(rs, gamma)))
    lines, _ = aiperf_lines(rs)
    (tmp_path / "profile_export.jsonl").write_text("\n".join(json.dumps(x) for x in lines))
    for name, rid in (("v.prom", "vllm"), ("dflash_accept_stats_rank0.json", "trt"), ("profile_export.jsonl", "ai")):
        ingest_engine_files(st, [tmp_path / name], run_id=rid)
    df = compare(st, [native, "vllm", "trt", "ai"]).set_index("run_id")
    for col in ("mean_acceptance_length", "draft_acceptance_rate", "fixed_gamma_rate"):
        assert df[col].to_numpy(float) == pytest.approx([df.loc[native, col]] * 4, abs=1e-12), col
    for rid in ("vllm", "trt"):
        assert df.loc[rid, "per_position_acceptance"] == pytest.approx(df.loc[native, "per_position_acceptance"], abs=1e-12)
        assert df.loc[rid, "accepted_histogram"] == df.loc[native, "accepted_histogram"]
    assert df.loc["vllm", "per_position_given_verified"] == pytest.approx(df.loc[native, "per_position_given_verified"])
    assert df.loc["trt", "per_position_given_verified"] is None  # the verify width is not recorded
    assert df.loc["ai", "per_position_acceptance"] is None and df.loc["ai", "accepted_histogram"] is None


def test_acceptscope_ingest_routes_engine_files(tmp_path):
    """`acceptscope ingest` detects the three formats (one registry of kinds) and stores them: the counts in
    engine_counts, the rest through the ingest writer; TensorRT-LLM's rank files make one run per directory."""
    rs, gamma = _rows(seed=11)
    (tmp_path / "vllm.prom").write_bytes(vllm_dump(rs, gamma)[0])
    stats = tmp_path / "trt-run"
    stats.mkdir()
    rids = sorted(rs["rid"].unique())
    for r in (0, 1):
        (stats / f"dflash_accept_stats_rank{r}.json").write_text(
            json.dumps(trtllm_snapshot(rs[rs["rid"].isin(rids[r::2])], gamma, rank=r)))
    (tmp_path / "profile_export.jsonl").write_text("\n".join(json.dumps(x) for x in aiperf_lines(rs)[0]))
    (tmp_path / "notes.txt").write_text("not a metrics dump\n")
    db = tmp_path / "s.duckdb"
    r = CliRunner().invoke(app, ["ingest", "--db", str(db), str(tmp_path / "vllm.prom"), str(stats),
                                 str(tmp_path / "profile_export.jsonl"), str(tmp_path / "notes.txt")])
    assert r.exit_code == 0, r.output[-2000:]
    st = Store(db, read_only=True)
    runs = st.query_df("SELECT run_id, engine FROM runs ORDER BY run_id")
    assert dict(runs.itertuples(index=False)) == {"profile_export": "aiperf", "trt-run": "tensorrt-llm", "vllm": "vllm"}
    c = rs["correct_drafts"].to_numpy()
    for rid in ("vllm", "trt-run", "profile_export"):
        f = engine_figures(st, rid)["figures"]
        assert f["drafts"] == len(rs) and f["accepted"] == c.sum(), rid
