"""STS shards / STS calibration / SPS tables / SPS profiler outputs ingest."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acceptscope.ingest.sps import parse_sps_table, sps_kind
from acceptscope.ingest.sps_profile import parse_profile_manifest, parse_profile_records, parse_profile_rounds
from acceptscope.ingest.sts_shards import ingest_shard, ingest_sts_shard, parse_sts_shard
from acceptscope.ingest.sts_table import parse_sts_table
from tests._close import assert_close

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"


def test_sglang_sts_shards_roundtrip():
    total = 0
    for k in (0, 1):
        path = FIX / f"capacc.sts.{k}.pt"
        obj = torch.load(path, weights_only=True)
        b = ingest_sts_shard(path, run_id="capacc", gamma=4)
        assert not b.rejects
        rows = b.rows("sts_samples")
        assert [r["row_index"] for r in rows] == list(range(obj["logits"].shape[0]))
        assert all(r["shard"] == k and r["label_kind"] == "greedy-argmax" for r in rows)
        assert_close(np.array([r["logits"] for r in rows], dtype=np.float32), obj["logits"].numpy())
        assert_close(np.array([r["prefix_mask"] for r in rows], dtype=np.float32),
                                      obj["prefix_mask"].numpy())
        total += len(rows)
    assert total > 0


def test_sts_shard_bad_rows_and_shapes(tmp_path):
    logits = torch.randn(5, 3)
    mask = torch.tensor([[1, 1, 0], [1, 0, 1], [0, 0, 0], [1, 1, 1], [0.5, 0, 0]], dtype=torch.float32)
    logits[2, 1] = float("nan")
    b = parse_sts_shard({"logits": logits, "prefix_mask": mask}, source="s.3.pt", run_id="r", shard=3)
    assert sorted((r["line"], r["field"], r["reason"]) for r in b.rejects) == [
        (2, "prefix_mask[1]", "not a prefix (1s must precede 0s)"), (3, "logits[2][1]", "NaN"),
        (5, "prefix_mask[4][0]", "0.5 is not 0/1")]
    assert [r["row_index"] for r in b.rows("sts_samples")] == [0, 3]
    b = parse_sts_shard({"logits": logits, "prefix_mask": mask[:, :2]}, source="x", run_id="r", shard=0)
    assert b.rejects[0]["field"] == "prefix_mask" and not b.n("sts_samples")
    b = parse_sts_shard({"logits": torch.zeros(2, 5), "prefix_mask": torch.zeros(2, 5)}, source="x", run_id="r",
                        shard=0, gamma=4)
    assert "gamma mismatch" in b.rejects[0]["reason"]
    p = tmp_path / "half.0.pt"
    p.write_bytes(b"\x80\x02garbage")
    assert "torch.load" in ingest_sts_shard(p, run_id="r").rejects[0]["reason"]
    with pytest.raises(Exception):
        ingest_shard(p, run_id="r")  # the live tailer's entry point raises so it can retry


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 20), st.integers(1, 8), st.data())
def test_property_sts_shard(n, g, data):
    rng = np.random.default_rng(data.draw(st.integers(0, 1000)))
    logits = torch.tensor(rng.normal(size=(n, g)).astype(np.float32))
    counts = torch.tensor(rng.integers(0, g + 1, size=n))
    mask = (torch.arange(g).view(1, -1) < counts.view(-1, 1)).float()
    b = parse_sts_shard({"logits": logits, "prefix_mask": mask}, source="p", run_id="r", shard=0)
    assert not b.rejects and b.n("sts_samples") == n
    i, k = data.draw(st.integers(0, n - 1)), data.draw(st.integers(0, g - 1))
    logits[i, k] = float("inf")
    b = parse_sts_shard({"logits": logits, "prefix_mask": mask}, source="p", run_id="r", shard=0)
    assert [(r["field"], r["reason"]) for r in b.rejects] == [(f"logits[{i}][{k}]", "inf")]
    assert b.n("sts_samples") == n - 1


def test_sglang_sts_calibration_roundtrip():
    text = (FIX / "capacc.sts_calibration.json").read_bytes()
    obj = json.loads(text)
    b = parse_sts_table(text, source="cal.json", gamma=4)
    assert not b.rejects
    rows = sorted(b.rows("sts_tables"), key=lambda r: r["position"])
    assert [r["temperature"] for r in rows] == obj["temperatures"]
    assert [r["ece_before"] for r in rows] == obj["ece_before"]
    assert [r["ece_after"] for r in rows] == obj["ece_after"]
    assert {r["num_samples"] for r in rows} == {obj["num_samples"]}


@pytest.mark.parametrize("body, field", [
    ({"temperatures": []}, "temperatures"),
    ({"temperatures": [1.0, 0.0]}, "temperatures[1]"),
    ({"temperatures": [1.0, "x"]}, "temperatures[1]"),
])
def test_sts_calibration_unloadable_is_rejected_whole(body, field):
    b = parse_sts_table(json.dumps(body).encode(), source="c")
    assert [r["field"] for r in b.rejects] == [field] and not b.n("sts_tables")


def test_sts_calibration_bad_ece_keeps_temperatures():
    b = parse_sts_table(json.dumps({"temperatures": [1.0, 2.0], "ece_before": [0.1, float("nan")],
                                    "ece_after": [0.1]}).encode(), source="c")
    assert sorted(r["field"] for r in b.rejects) == ["ece_after", "ece_before[1]"]
    assert [r["temperature"] for r in b.rows("sts_tables")] == pytest.approx([1.0, 2.0])
    assert b.rows("sts_tables")[0]["ece_before"] is None
    b = parse_sts_table(b'{"temperatures": [1.0, 2.0]}', source="c", gamma=3)
    assert "gamma mismatch" in b.rejects[0]["reason"]


def test_sglang_sps_tables_both_formats():
    diag = (FIX / "spsprof.json").read_bytes()
    add = (FIX / "spsadd.sps_table.json").read_bytes()
    assert sps_kind(diag) == "diagonal" and sps_kind(add) == "additive"
    d, a = json.loads(diag), json.loads(add)
    rows = parse_sps_table(diag, source="d").rows("sps_tables")
    got = {(r["component"], r["probe"]): r["value"] for r in rows}
    assert got == {**{("steps_per_sec", p): v for p, v in zip(d["sample_batch_tokens"], d["sample_steps_per_sec"])},
                   ("max_batch_tokens", -1): d["max_batch_tokens"]}
    rows = parse_sps_table(add, source="a").rows("sps_tables")
    got = {(r["component"], r["probe"]): r["value"] for r in rows}
    want = {("bias_seconds", -1): a["bias_seconds"]}
    want.update({("alpha_seconds", p): v for p, v in zip(a["bs_probes"], a["alpha_seconds"])})
    want.update({("theta_seconds", p): v for p, v in zip(a["m_probes"], a["theta_seconds"])})
    assert got == want and {r["kind"] for r in rows} == {"additive"}


@pytest.mark.parametrize("body, field", [
    ({"sample_batch_tokens": [4, 2], "sample_steps_per_sec": [1.0, 2.0], "max_batch_tokens": 8},
     "sample_batch_tokens[1]"),
    ({"sample_batch_tokens": [4.0], "sample_steps_per_sec": [1.0], "max_batch_tokens": 8}, "sample_batch_tokens[0]"),
    ({"sample_batch_tokens": [4, 8], "sample_steps_per_sec": [1.0], "max_batch_tokens": 8}, "sample_steps_per_sec"),
    ({"sample_batch_tokens": [4, 8], "sample_steps_per_sec": [1.0, 2.0], "max_batch_tokens": 6}, "max_batch_tokens"),
    ({"bias_seconds": 0.0, "bs_probes": [1], "alpha_seconds": [0.0], "m_probes": [1], "theta_seconds": [0.0]},
     "bias_seconds"),
    # a 1-D table carrying the additive marker in metadata is read as additive, as SGLang would
    ({"sample_batch_tokens": [4], "sample_steps_per_sec": [1.0], "max_batch_tokens": 8,
      "meta": {"bias_seconds": 1}}, "bias_seconds"),
])
def test_sps_table_rejects(body, field):
    b = parse_sps_table(json.dumps(body).encode(), source="t")
    assert [r["field"] for r in b.rejects] == [field] and not b.n("sps_tables")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.integers(1, 10**5), min_size=1, max_size=12, unique=True), st.data())
def test_property_sps_diagonal(probes, data):
    probes = sorted(probes)
    sps = data.draw(st.lists(st.floats(0.01, 1e4), min_size=len(probes), max_size=len(probes)))
    body = {"sample_batch_tokens": probes, "sample_steps_per_sec": sps, "max_batch_tokens": probes[-1]}
    rows = parse_sps_table(json.dumps(body).encode(), source="t").rows("sps_tables")
    assert sorted((r["probe"], r["value"]) for r in rows if r["component"] == "steps_per_sec") == list(
        zip(probes, sps))


def test_sglang_profiler_outputs():
    rec = (FIX / "spsprof.records.jsonl").read_bytes()
    rnd = (FIX / "spsprof.rounds.jsonl").read_bytes()
    man = (FIX / "spsprof.json.manifest.json").read_bytes()
    b = parse_profile_records(rec, source="r", run_id="p")
    lines = [json.loads(x) for x in rec.splitlines()]
    assert not b.rejects and b.n("sps_profile_records") == len(lines)
    for r, o in zip(b.rows("sps_profile_records"), lines):
        assert (r["repeat"], r["batch_size"], r["batch_size_per_rank"], r["dp_rank"], r["forward_ct"],
                r["num_running_reqs"], r["num_verify_tokens"], r["step_time_s"], r["frac"]) == (
            o["repeat"], o["batch_size"], o["batch_size_per_rank"], o["dp_rank"], o["forward_ct"],
            o["num_running_reqs"], o["num_verify_tokens"], o["step_time"], None)
    b = parse_profile_rounds(rnd, source="r", run_id="p")
    lines = [json.loads(x) for x in rnd.splitlines()]
    assert not b.rejects
    for r, o in zip(b.rows("sps_profile_rounds"), lines):
        assert r["frac"] == pytest.approx(-1.0 if o["frac"] is None else o["frac"])
        assert_close((r["steps_per_sec"], r["per_rank_median_step_time"], json.loads(r["load_info_json"])),
                     (o["steps_per_sec"], o["per_rank_median_step_time"], o["load_info"]))
    b = parse_profile_manifest(man, source="m", run_id="p")
    (m,) = b.rows("sps_profile_manifests")
    assert_close(json.loads(m["body_json"]), json.loads(man))
    assert m["verify_num_draft_tokens"] == 5
    bad = rec.replace(b'"step_time": ', b'"step_time": -', 1)
    b = parse_profile_records(bad, source="r", run_id="p")
    assert [(r["line"], r["field"]) for r in b.rejects] == [(1, "step_time")]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.floats(1e-3, 1e3), min_size=1, max_size=10), st.data())
def test_property_sts_calibration(temps, data):
    g = len(temps)
    ece = data.draw(st.lists(st.floats(0, 1), min_size=g, max_size=g))
    body = {"temperatures": temps, "dataset": "x", "num_samples": 5, "ece_before": ece, "ece_after": ece}
    rows = parse_sts_table(json.dumps(body).encode(), source="c", gamma=g).rows("sts_tables")
    assert [r["temperature"] for r in sorted(rows, key=lambda r: r["position"])] == temps
    k = data.draw(st.integers(0, g - 1))
    body["ece_after"] = list(ece)
    body["ece_after"][k] = data.draw(st.sampled_from([-0.5, 2.0, "x"]))
    b = parse_sts_table(json.dumps(body).encode(), source="c", gamma=g)
    assert [r["field"] for r in b.rejects] == [f"ece_after[{k}]"] and b.n("sts_tables") == g


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(1, 64), st.floats(1e-4, 1.0)), min_size=1, max_size=15),
       st.data())
def test_property_profile_records(cells, data):
    lines = [{"repeat": rep, "batch_size": bs * 2, "batch_size_per_rank": bs, "dp_rank": i % 2, "forward_ct": i,
              "num_running_reqs": bs, "num_verify_tokens": bs * 5, "step_time": t}
             for i, (rep, bs, t) in enumerate(cells)]
    text = "\n".join(json.dumps(x) for x in lines).encode()
    b = parse_profile_records(text, source="r", run_id="p")
    assert not b.rejects and [r["step_time_s"] for r in b.rows("sps_profile_records")] == [c[2] for c in cells]
    j = data.draw(st.integers(0, len(lines) - 1))
    f = data.draw(st.sampled_from(["dp_rank", "forward_ct", "num_verify_tokens", "step_time"]))
    lines[j][f] = data.draw(st.sampled_from([-1, "7", None]))
    b = parse_profile_records("\n".join(json.dumps(x) for x in lines).encode(), source="r", run_id="p")
    assert [(r["line"], r["field"]) for r in b.rejects] == [(j + 1, f)]
    assert b.n("sps_profile_records") == len(lines) - 1


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.floats(1e-4, 1.0), st.lists(st.integers(1, 512), min_size=1, max_size=6, unique=True),
       st.lists(st.integers(1, 4096), min_size=1, max_size=6, unique=True), st.data())
def test_property_sps_additive(bias, bs_probes, m_probes, data):
    bs_probes, m_probes = sorted(bs_probes), sorted(m_probes)
    alpha = data.draw(st.lists(st.floats(-1, 1), min_size=len(bs_probes), max_size=len(bs_probes)))
    theta = data.draw(st.lists(st.floats(-1, 1), min_size=len(m_probes), max_size=len(m_probes)))
    body = {"bias_seconds": bias, "bs_probes": bs_probes, "alpha_seconds": alpha, "m_probes": m_probes,
            "theta_seconds": theta}
    rows = parse_sps_table(json.dumps(body).encode(), source="t").rows("sps_tables")
    got = {(r["component"], r["probe"]): r["value"] for r in rows}
    assert got == {("bias_seconds", -1): bias, **{("alpha_seconds", p): v for p, v in zip(bs_probes, alpha)},
                   **{("theta_seconds", p): v for p, v in zip(m_probes, theta)}}
    body["m_probes"] = list(reversed(m_probes)) if len(m_probes) > 1 else [1.5]
    b = parse_sps_table(json.dumps(body).encode(), source="t")
    assert b.rejects[0]["field"].startswith("m_probes[") and not b.n("sps_tables")
