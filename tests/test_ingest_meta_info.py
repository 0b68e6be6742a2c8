"""Per-request spec_* ingest from saved native /generate and OpenAI-compatible responses."""

from __future__ import annotations

import json
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acceptscope.ingest.meta_info import SPEC_KEYS, parse_responses

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"


def test_native_generate_batch_roundtrip():
    data = (FIX / "capacc.generate.json").read_bytes()
    items = json.loads(data)
    b = parse_responses(data, source="g", run_id="capacc", workload="w")
    assert not b.rejects
    rows = {r["rid"]: r for r in b.rows("requests")}
    assert len(rows) == len(items)
    for it in items:
        mi = it["meta_info"]
        r = rows[mi["id"]]
        for k in SPEC_KEYS:
            assert r[k] == mi[k], k
        assert (r["completion_tokens"], r["prompt_tokens"], r["finish_reason"], r["latency_s"], r["output_tokens"],
                r["workload"]) == (mi["completion_tokens"], mi["prompt_tokens"], mi["finish_reason"]["type"],
                                   mi["e2e_latency"], it["output_ids"], "w")


def test_openai_sglext_roundtrip_and_zero_defaults():
    data = (FIX / "capacc.openai.jsonl").read_bytes()
    b = parse_responses(data, source="o", run_id="capacc")
    assert not b.rejects
    for line, row in zip(data.splitlines(), b.rows("requests")):
        o = json.loads(line)
        d = o["sglext"]["spec_tokens_details"]
        assert row["rid"] == o["id"] and row["completion_tokens"] == o["usage"]["completion_tokens"]
        for k in SPEC_KEYS:
            assert row[k] == d[k], k
    # n > 1: a list of details; 0 cap/block lengths mean "not reported" (NULL)
    resp = {"id": "x", "choices": [{"finish_reason": "stop"}, {"finish_reason": "length"}],
            "sglext": {"spec_tokens_details": [
                {"spec_verify_ct": 3, "spec_accept_rate": 0.5, "spec_accept_length": 2.0, "spec_cap_length": 0.0,
                 "spec_block_accept_length": 0.0, "spec_num_correct_drafts": 6, "spec_num_proposed_drafts": 12,
                 "spec_correct_drafts_histogram": [0, 1, 2], "spec_cap_lens_histogram": []},
                {"spec_verify_ct": 0}]}}
    rows = parse_responses(json.dumps(resp).encode(), source="o", run_id="r").rows("requests")
    assert [r["rid"] for r in rows] == ["x:0", "x:1"]
    assert rows[0]["spec_cap_length"] is None and rows[0]["spec_cap_lens_histogram"] is None
    assert rows[0]["finish_reason"] == "stop" and rows[1]["spec_verify_ct"] is None


def test_rejects_name_field_and_keep_siblings():
    items = json.loads((FIX / "capacc.generate.json").read_bytes())
    items[1]["meta_info"]["spec_accept_rate"] = 1.7
    items[2]["meta_info"]["spec_num_correct_drafts"] = items[2]["meta_info"]["spec_num_proposed_drafts"] + 1
    items[3]["meta_info"]["spec_cap_lens_histogram"][0] = -1
    items[4] = {"nothing": 1}
    items.append(dict(items[0]))  # duplicate rid
    b = parse_responses(json.dumps(items).encode(), source="g.json", run_id="r")
    got = sorted(r["field"] for r in b.rejects)
    assert got == ["[1].meta_info.spec_accept_rate", "[2].meta_info.spec_num_correct_drafts",
                   "[3].meta_info.spec_cap_lens_histogram[0]", "[4]", "[8].meta_info.id"]
    assert b.n("requests") == len(items) - 5
    b = parse_responses(b'{"meta_info": {"id": "a", "spec_verify_ct": 2', source="t.json", run_id="r")
    assert b.rejects[0]["field"] == "$" and "truncated" in b.rejects[0]["reason"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.tuples(st.integers(1, 500), st.integers(0, 4), st.integers(1, 8)), min_size=1, max_size=6),
       st.data())
def test_property_native(reqs, data):
    items = []
    for i, (vct, g_minus, gamma) in enumerate(reqs):
        correct = data.draw(st.integers(0, vct * gamma))
        items.append({"meta_info": {"id": f"r{i}", "spec_verify_ct": vct, "spec_num_correct_drafts": correct,
                                    "spec_num_proposed_drafts": vct * gamma,
                                    "spec_accept_rate": correct / (vct * gamma), "spec_accept_length": 1.5}})
    b = parse_responses("\n".join(json.dumps(x) for x in items).encode(), source="p", run_id="r")
    assert not b.rejects and b.n("requests") == len(items)
    j = data.draw(st.integers(0, len(items) - 1))
    items[j]["meta_info"]["spec_verify_ct"] = -5
    b = parse_responses("\n".join(json.dumps(x) for x in items).encode(), source="p", run_id="r")
    assert [(r["line"], r["field"]) for r in b.rejects] == [(j + 1, "meta_info.spec_verify_ct")]
    assert b.n("requests") == len(items) - 1
