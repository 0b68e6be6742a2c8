"""SGLang 0.5.23's REAL recorders write, acceptscope ingests, every field must round-trip exactly.

Drives (on CPU, seeded toy traffic from fixtures/sglang/drive.py): DsparkInfoDumper
(serialised as /server_info does), BlockAcceptEstimateRecorder (JSONL),
StsDataRecorder (.pt shards), the STS fitter and DSparkStsCalibration, SpsCostTable /
SpsAdditiveCostTable (+ load_sps_table_from_path / load_sts_calibration_from_path on
files rebuilt from our rows), the SPS profiler's round/manifest/fit functions, and
the OpenAI ``SglExt`` spec-details serialisation.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

pytest.importorskip("sglang")
pytestmark = pytest.mark.sglang

from acceptscope.ingest import ingest_paths  # noqa: E402
from acceptscope.ingest.estimator_jsonl import parse_estimator_jsonl  # noqa: E402
from acceptscope.ingest.meta_info import SPEC_KEYS, parse_responses  # noqa: E402
from acceptscope.ingest.server_info import ServerInfoIngestor  # noqa: E402
from acceptscope.ingest.sps import parse_sps_table  # noqa: E402
from acceptscope.ingest.sps_profile import (  # noqa: E402
    parse_profile_manifest,
    parse_profile_records,
    parse_profile_rounds,
)
from acceptscope.ingest.sts_shards import ingest_sts_shard  # noqa: E402
from acceptscope.ingest.sts_table import parse_sts_table  # noqa: E402
from tests._close import assert_close

GAMMA = 5
SENTINELS = ("bs", "num_running_reqs", "num_verify_tokens", "verify_tokens_local", "verify_tokens_dp_synced",
             "verify_tokens_graph_key")
OPTIONALS = ("mode", "budget", "lag_steps", "predicted_step_ms", "predicted_theta", "step_cpu_ms", "step_gpu_ms",
             "draft_gpu_ms", "target_verify_gpu_ms")


def f32(xs):
    return None if xs is None else [float(np.float32(x)) for x in xs]


def assert_dump_roundtrip(dumpers, batch, mode):
    """Compare SGLang's in-memory DecodeStepRecord/ReqDetail structs with the ingested rows."""
    steps = {(r["rank"], r["forward_ct"]): r for r in batch.rows("steps")}
    rs = {(r["rank"], r["forward_ct"], r["rid"]): r for r in batch.rows("request_steps")}
    n = 0
    for rank, d in enumerate(dumpers):
        for rec in d._records:  # SGLang's own deque of DecodeStepRecord
            s = steps[(rank, rec.forward_ct)]
            for f in SENTINELS:
                v = getattr(rec, f)
                assert s[f] == (None if v == -1 else v), f
            for f in OPTIONALS:
                assert s[f] == (getattr(rec, f) or None if f == "mode" else getattr(rec, f)), f
            for q in rec.reqs or []:
                n += 1
                r = rs[(rank, rec.forward_ct, q.rid)]
                for f in ("req_pool_index", "prefix_len", "verify_len", "acc_len", "correct_drafts", "cap_trim",
                          "bonus_token", "draft_tokens"):
                    assert r[f] == getattr(q, f), f
                assert_close(r["confidence"], f32(q.confidence), rtol=1e-6)
                assert_close(r["survival"], f32(q.survival), rtol=1e-6)
                assert r["window"] == q.verify_len - 1
                assert r["committed_tokens"] == q.draft_tokens[: q.correct_drafts] + [q.bonus_token]
                assert r["ceiling"] == {"cap-accept": q.correct_drafts + q.cap_trim, "static": q.correct_drafts,
                                        "compact": None}[mode]
    assert batch.n("request_steps") == n and n > 0


@pytest.mark.parametrize("mode", ["cap-accept", "compact", "static"])
def test_info_dump_roundtrip_with_polls_and_arrival_order(cpu, mode):
    add = cpu.additive_table()
    dumpers, polls = [], []
    for r in range(2):
        d, p = cpu.run_rank(gamma=GAMMA, bs=5, mode=mode, n_steps=30, seed=100 + r, rank=r, sps_table=add,
                            poll_every=10)
        dumpers.append(d)
        polls.append(p)
    ing_b = ServerInfoIngestor("run", source="poll")
    ing_d = ServerInfoIngestor("run", source="poll")
    ing_d.use_fast = False
    batches_b, batches_d = [], []
    for i in range(3):
        order = [0, 1] if i != 1 else [1, 0]  # arrival order flips on the second poll
        text = cpu.server_info_json([polls[k][i] for k in order], gamma=GAMMA, startup_time=5.0)
        batches_b.append(ing_b.feed_bytes(text.encode(), line=i + 1))
        batches_d.append(ing_d.feed(json.loads(text), line=i + 1))
    b = batches_b[0].merge(*batches_b[1:])
    d = batches_d[0].merge(*batches_d[1:])
    assert not b.rejects and not d.rejects and not b.gaps
    assert_close(b.arrow("request_steps"), d.arrow("request_steps"))
    assert_dump_roundtrip(dumpers, b, mode)
    run = b.rows("runs")[0]
    assert (run["arm"], run["gamma"], run["engine"]) == (mode, GAMMA, "sglang")


def test_info_dump_clear_between_polls_is_a_gap(cpu):
    d, _ = cpu.run_rank(gamma=GAMMA, bs=3, mode="cap-accept", n_steps=12, seed=1)
    ing = ServerInfoIngestor("run")
    first = cpu.dump_info_record(d)
    ing.feed_bytes(cpu.server_info_json([first], gamma=GAMMA, startup_time=1.0).encode())
    d.clear()  # what POST /set_internal_state dspark_clear_info_records does
    assert cpu.dump_info_record(d)["records"] == []
    # the same seeded server run longer: records after the clear, minus a few lost between GET and clear
    d2, _ = cpu.run_rank(gamma=GAMMA, bs=3, mode="cap-accept", n_steps=30, seed=1)
    later = cpu.dump_info_record(d2)
    later["records"] = [r for r in later["records"] if r["forward_ct"] > first["records"][-1]["forward_ct"] + 3]
    b = ing.feed_bytes(cpu.server_info_json([later], gamma=GAMMA, startup_time=1.0).encode())
    (g,) = b.gaps
    assert g["kind"] == "clear-loss" and g["from_forward_ct"] == first["records"][-1]["forward_ct"]


def test_estimator_jsonl_roundtrip(cpu, tmp_path):
    path = tmp_path / "est.jsonl"
    cpu.run_rank(gamma=GAMMA, bs=6, mode="cap-accept", n_steps=40, seed=7, estimator_path=str(path))
    data = path.read_bytes()
    lines = [json.loads(x) for x in data.splitlines()]
    assert any("eos_end" in o for o in lines) and any("pg" in o for o in lines)
    b = parse_estimator_jsonl(data, source=str(path), run_id="r", gamma=GAMMA)
    assert not b.rejects
    rows = {(r["rid"], r["fct"]): r for r in b.rows("estimator_rows")}
    pg = {(r["rid"], r["block_fct"], r["offset"]): r for r in b.rows("estimator_gather")}
    n_pg = 0
    for o in lines:
        if "eos_end" in o:
            continue
        r = rows[(o["rid"], o["fct"])]
        assert (r["w"], r["cl"], r["ct"], r["trimmed_tokens"], r["q_lp"]) == (
            o["w"], o["cl"], o["ct"], o.get("trimmed_tokens"), o.get("q_lp"))
        for e in o.get("pg", []):
            n_pg += 1
            g = pg[(o["rid"], e[0], e[1])]
            assert [g["block_fct"], g["offset"], g["p_lp"], g["trimmed_token"], g["realized_token"]] == e
    assert len(pg) == n_pg


def test_sts_shards_fit_and_calibration_roundtrip(cpu, tmp_path):
    import torch
    from sglang.benchmark.dspark_sts_fit import fit
    from sglang.srt.speculative.dspark_components.dspark_sts import load_sts_calibration_from_path

    stem = tmp_path / "sts"
    cpu.run_rank(gamma=GAMMA, bs=6, mode="cap-accept", n_steps=40, seed=9, sts_stem=str(stem), sts_flush_every=16)
    shards = sorted(tmp_path.glob("sts.*.pt"))
    assert len(shards) == 2  # the trailing partial buffer is never flushed, as in SGLang
    for k, p in enumerate(shards):
        obj = torch.load(p, weights_only=True)
        rows = ingest_sts_shard(p, run_id="r", gamma=GAMMA).rows("sts_samples")
        assert len(rows) == obj["logits"].shape[0] and all(r["shard"] == k for r in rows)
        assert_close(np.array([r["logits"] for r in rows], np.float32), obj["logits"].numpy())
        assert_close(np.array([r["prefix_mask"] for r in rows], np.float32),
                                      obj["prefix_mask"].numpy())
    out = tmp_path / "cal.json"
    fit(data_glob=str(tmp_path / "sts.*.pt"), out=out, num_bins=15, gamma=GAMMA)
    orig = load_sts_calibration_from_path(str(out))
    rows = sorted(parse_sts_table(out.read_bytes(), source=str(out), gamma=GAMMA).rows("sts_tables"),
                  key=lambda r: r["position"])
    back = tmp_path / "back.json"
    back.write_text(json.dumps({"temperatures": [r["temperature"] for r in rows], "dataset": rows[0]["dataset"],
                                "num_samples": rows[0]["num_samples"],
                                "ece_before": [r["ece_before"] for r in rows],
                                "ece_after": [r["ece_after"] for r in rows]}))
    assert load_sts_calibration_from_path(str(back)) == orig


def test_sps_tables_roundtrip_through_sglang_loader(cpu, tmp_path):
    from sglang.srt.speculative.dspark_components.dspark_sps import load_sps_table_from_path, profile_sps_table

    diag = profile_sps_table(probes=[(8, 90.5), (16, 80.25), (64, 41.0)], max_batch_tokens=128)
    for table in (diag, cpu.additive_table()):
        src = tmp_path / "t.json"
        src.write_text(table.to_json())
        rows = parse_sps_table(src.read_bytes(), source=str(src)).rows("sps_tables")
        comp = {}
        for r in sorted(rows, key=lambda r: r["probe"]):
            comp.setdefault(r["component"], []).append((r["probe"], r["value"]))
        if rows[0]["kind"] == "diagonal":
            body = {"sample_batch_tokens": [p for p, _ in comp["steps_per_sec"]],
                    "sample_steps_per_sec": [v for _, v in comp["steps_per_sec"]],
                    "max_batch_tokens": int(comp["max_batch_tokens"][0][1])}
        else:
            body = {"bias_seconds": comp["bias_seconds"][0][1],
                    "bs_probes": [p for p, _ in comp["alpha_seconds"]],
                    "alpha_seconds": [v for _, v in comp["alpha_seconds"]],
                    "m_probes": [p for p, _ in comp["theta_seconds"]],
                    "theta_seconds": [v for _, v in comp["theta_seconds"]]}
        back = tmp_path / "back.json"
        back.write_text(json.dumps(body))
        assert load_sps_table_from_path(str(back)) == table


def test_sps_profiler_outputs_roundtrip(cpu, tmp_path):
    paths = cpu.run_sps_profile(tmp_path / "prof.json", gamma=GAMMA, bs_sweep=(1, 3), steps=14)
    rec = paths["records"].read_bytes()
    b = parse_profile_records(rec, source="r", run_id="p")
    assert not b.rejects
    for r, line in zip(b.rows("sps_profile_records"), rec.splitlines()):
        o = json.loads(line)
        assert {k: r[k] for k in ("repeat", "batch_size", "batch_size_per_rank", "dp_rank", "forward_ct",
                                  "num_running_reqs", "num_verify_tokens")} == {k: o[k] for k in (
            "repeat", "batch_size", "batch_size_per_rank", "dp_rank", "forward_ct", "num_running_reqs",
            "num_verify_tokens")}
        assert r["step_time_s"] == pytest.approx(o["step_time"])
    rnd = paths["rounds"].read_bytes()
    rows = parse_profile_rounds(rnd, source="r", run_id="p").rows("sps_profile_rounds")
    for r, line in zip(rows, rnd.splitlines()):
        o = json.loads(line)
        assert (r["batch_tokens"], r["steps_per_sec"], r["num_steady_steps"], r["match_fraction"],
                r["per_rank_median_step_time"]) == (o["batch_tokens"], o["steps_per_sec"], o["num_steady_steps"],
                                                    o["match_fraction"], o["per_rank_median_step_time"])
    m = parse_profile_manifest(paths["manifest"].read_bytes(), source="m", run_id="p").rows("sps_profile_manifests")
    assert_close(json.loads(m[0]["body_json"]), json.loads(paths["manifest"].read_text()))
    assert not parse_sps_table(paths["table"].read_bytes(), source="t").rejects


def test_openai_spec_tokens_details_roundtrip():
    from sglang.srt.entrypoints.openai.protocol import SglExt
    from sglang.srt.entrypoints.openai.utils import spec_tokens_details_from_meta_info

    meta = {"id": "q", "spec_verify_ct": 7, "spec_accept_rate": 0.4, "spec_accept_length": 2.6,
            "spec_num_correct_drafts": 14, "spec_num_proposed_drafts": 35, "spec_cap_length": 3.5,
            "spec_block_accept_length": 3.1, "spec_correct_drafts_histogram": [1, 2, 3, 1],
            "spec_cap_lens_histogram": [0, 1, 2, 4]}
    ext = SglExt(spec_tokens_details=spec_tokens_details_from_meta_info(meta))
    resp = {"id": "chatcmpl-1", "choices": [{"finish_reason": "stop"}], "usage": {"prompt_tokens": 3,
                                                                                  "completion_tokens": 18},
            "sglext": ext.model_dump(mode="json", exclude_none=True)}
    (row,) = parse_responses(json.dumps(resp).encode(), source="o", run_id="r").rows("requests")
    assert {k: row[k] for k in SPEC_KEYS} == {k: meta[k] for k in SPEC_KEYS}


def test_committed_fixtures_are_what_the_recorders_write(tmp_path):
    """make_fixtures.py is deterministic: regenerating reproduces the committed artifacts' rows."""
    import make_fixtures

    make_fixtures.main(tmp_path)
    from acceptscope.store import Store

    fresh = ingest_paths([tmp_path], Store(tmp_path / "a.duckdb"), progress=False)["tables"]
    committed = ingest_paths([make_fixtures.HERE], Store(tmp_path / "b.duckdb"), progress=False)["tables"]
    assert {k: v["written"] for k, v in fresh.items()} == {k: v["written"] for k, v in committed.items()}
