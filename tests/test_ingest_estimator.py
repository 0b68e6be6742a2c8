"""Block-accept estimator JSONL ingest (fixture written by SGLang's own recorder + generated files)."""

from __future__ import annotations

import json
import math
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acceptscope.ingest.estimator_jsonl import EstimatorIngestor, file_gamma, parse_estimator_jsonl

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang" / "capacc.estimator.jsonl"


def test_sglang_fixture_roundtrips_every_line():
    data = FIX.read_bytes()
    b = parse_estimator_jsonl(data, source=str(FIX), run_id="capacc", gamma=4)
    assert not b.rejects
    lines = [json.loads(x) for x in data.splitlines() if x.strip()]
    rows = {(r["rid"], r["fct"]): r for r in b.rows("estimator_rows")}
    gathers = {(r["rid"], r["block_fct"], r["offset"]): r for r in b.rows("estimator_gather")}
    eos = {(r["rid"], r["block_fct"]) for r in b.rows("estimator_eos")}
    n_pg = n_eos = 0
    for i, o in enumerate(lines, start=1):
        if "eos_end" in o:
            n_eos += len(o["eos_end"])
            assert all((o["rid"], f) in eos for f in o["eos_end"])
            continue
        r = rows[(o["rid"], o["fct"])]
        assert (r["w"], r["cl"], r["ct"], r["trimmed_tokens"], r["q_lp"], r["source_line"]) == (
            o["w"], o["cl"], o["ct"], o.get("trimmed_tokens"), o.get("q_lp"), i)
        for e in o.get("pg", []):
            n_pg += 1
            g = gathers[(o["rid"], e[0], e[1])]
            assert [g["block_fct"], g["offset"], g["p_lp"], g["trimmed_token"], g["realized_token"]] == e
            assert g["row_fct"] == o["fct"]
    assert len(gathers) == n_pg and len(eos) == n_eos and n_eos > 0
    assert file_gamma(data) == 4


def test_gamma_mismatch_and_bad_entries_reject_smallest_unit():
    lines = [
        {"rid": "a", "fct": 1, "w": 2, "cl": 2, "ct": 0, "trimmed_tokens": [5, 6], "q_lp": [-0.1, -0.2],
         "pg": [[1, 3, -0.5, 5, 5]]},
        {"rid": "a", "fct": 2, "w": 1, "cl": 1, "ct": 0, "trimmed_tokens": [7, 8], "q_lp": [-1, -1]},
        {"rid": "b", "fct": 2, "w": 3, "cl": 4, "ct": 0, "pg": [[1, 4, float("nan"), 6, 6], [2, 1, -1.0, 3, 3]]},
        {"rid": "a", "fct": 3, "w": 0, "cl": 0, "ct": 1, "pg": [[1, 4, -math.inf, 6, 2]]},
        {"rid": "a", "fct": 3, "w": 0, "cl": 0, "ct": 1},
        {"rid": "a", "eos_end": [1, 1]},
    ]
    text = "\n".join(json.dumps(x) for x in lines) + "\n" + '{"rid": "c", "fct": 9, "w"'  # truncated tail
    b = parse_estimator_jsonl(text.encode(), source="e.jsonl", run_id="r", gamma=4)
    got = sorted((r["line"], r["field"]) for r in b.rejects)
    assert got == [(2, "trimmed_tokens"), (3, "cl"), (3, "pg[0][2]"), (5, "fct"), (6, "eos_end[1]"), (7, "$")]
    reasons = {(r["line"], r["field"]): r["reason"] for r in b.rejects}
    assert "gamma mismatch" in reasons[(2, "trimmed_tokens")] and reasons[(3, "pg[0][2]")] == "p_lp: NaN"
    assert {(r["rid"], r["fct"]) for r in b.rows("estimator_rows")} == {("a", 1), ("a", 3)}
    pg = {(r["rid"], r["block_fct"], r["offset"]): r["p_lp"] for r in b.rows("estimator_gather")}
    assert pg == {("a", 1, 3): -0.5, ("b", 2, 1): -1.0, ("a", 1, 4): -math.inf}  # -inf p_lp is legal
    assert b.n("estimator_eos") == 1


def test_incremental_feed_matches_whole_file():
    data = FIX.read_bytes().splitlines()
    whole = parse_estimator_jsonl(b"\n".join(data), source="f", run_id="r")
    inc = EstimatorIngestor("r", "f")
    parts = [inc.feed_lines(data[i: i + 37]) for i in range(0, len(data), 37)]
    merged = parts[0].merge(*parts[1:])
    for t in ("estimator_rows", "estimator_gather", "estimator_eos"):
        assert merged.rows(t) == whole.rows(t)
    again = inc.feed_lines(data[:5])  # the same records again: duplicates rejected, not re-added
    assert again.n("estimator_rows") == 0 and again.n("rejects") >= 1


@st.composite
def estimator_files(draw):
    gamma = draw(st.integers(1, 8))
    lines = []
    for i in range(draw(st.integers(1, 12))):
        w = draw(st.integers(0, gamma))
        opened = w < gamma and draw(st.booleans())
        cl = w if opened else draw(st.integers(0, w))
        o = {"rid": f"r{i % 3}", "fct": i, "w": w, "cl": cl, "ct": draw(st.integers(0, gamma - cl))}
        if opened:
            k = gamma - w
            o["trimmed_tokens"] = draw(st.lists(st.integers(0, 10**6), min_size=k, max_size=k))
            o["q_lp"] = draw(st.lists(st.floats(-50, 0), min_size=k, max_size=k))
            o["pg"] = [[i, w + 1, draw(st.floats(-50, 0)), o["trimmed_tokens"][0], draw(st.integers(0, 9))]]
        lines.append(o)
    return gamma, lines


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(estimator_files(), st.data())
def test_property_roundtrip_and_corruption(gl, data):
    gamma, lines = gl
    text = "\n".join(json.dumps(x) for x in lines).encode()
    b = parse_estimator_jsonl(text, source="p", run_id="r", gamma=gamma)
    assert not b.rejects and b.n("estimator_rows") == len(lines)
    j = data.draw(st.integers(0, len(lines) - 1))
    field = data.draw(st.sampled_from(["w", "cl", "ct"]))
    lines[j][field] = data.draw(st.sampled_from([-1, "x", None, 1.5]))
    b = parse_estimator_jsonl("\n".join(json.dumps(x) for x in lines).encode(), source="p", run_id="r", gamma=gamma)
    assert [(r["line"], r["field"]) for r in b.rejects] == [(j + 1, field)]
    assert b.n("estimator_rows") == len(lines) - 1
    assert b.n("estimator_gather") == sum(len(x.get("pg", [])) for x in lines)  # its pg entries are kept
