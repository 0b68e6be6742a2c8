"""vLLM's per-request spec-decode metrics (``--per-request-spec-decode-metrics summary|detailed``) into the store.

The response bodies are written from the documented format (``docs/features/speculative_decoding/
acceptance_metrics.md`` @ 02cf515f, and the per-choice shape @ cd199986), from a simulated DSpark run's blocks:
per request, ``per_step_accepted`` = the blocks' accepted drafts and ``per_step_drafted`` = their windows, in
step order. vLLM's own recorder imports the engine (torch, CUDA), so it is not run here.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from acceptscope.estimators.synthetic import compact_view, simulate
from acceptscope.ingest.engines import detect_engine, ingest_engine_files, parse_engine_file
from acceptscope.ingest.engines.identify import compare, engine_figures
from acceptscope.store import Store


def spec_record(g, K: int, detailed: bool = True) -> dict:
    """``metrics.speculative_decoding`` of one request's blocks (steps in order)."""
    g = g.sort_values("step_index")
    a, d = g["correct_drafts"].astype(int).tolist(), g["window"].astype(int).tolist()
    s, acc, dr = len(a), sum(a), sum(d)
    by_len: dict = {}
    for x, y in zip(a, d):
        by_len.setdefault(str(y), [0] * (y + 1))[x] += 1
    r = {"mean_acceptance_length": 1 + acc / s, "draft_acceptance_rate": acc / dr if dr else 0.0,
         "acceptance_histogram": [a.count(j) for j in range(K + 1)], "acceptance_histogram_by_draft_length": by_len,
         "num_spec_steps": s, "num_accepted_draft_tokens": acc, "num_draft_tokens": dr, "num_spec_tokens": K}
    if detailed:
        r.update(per_step_accepted=a, per_step_drafted=d)
    return r


def responses(rs, K: int, detailed: bool = True) -> list[dict]:
    out = []
    for rid, g in rs.groupby("rid", sort=True):
        out.append({"id": f"cmpl-{rid}", "object": "text_completion", "model": "Qwen/Qwen3-8B",
                    "choices": [{"index": 0, "text": "...", "finish_reason": "length"}],
                    "usage": {"prompt_tokens": 12, "completion_tokens": int((g["correct_drafts"] + 1).sum()),
                              "total_tokens": 0},
                    "metrics": {"speculative_decoding": spec_record(g, K, detailed)}})
    return out


def _blocks(compact: bool, seed: int = 2):
    t = simulate(n_requests=25, seed=seed).tables
    K = int(t["runs"]["gamma"].iloc[0])
    rs = t["request_steps"]
    return (compact_view(rs) if compact else rs.assign(window=K, correct_drafts=rs["ceiling"])), K, t


@pytest.mark.parametrize("compact", [False, True])
def test_per_request_records_exact(tmp_path, compact):
    rs, K, _ = _blocks(compact)
    lines = responses(rs, K)
    f = tmp_path / "vllm_responses.jsonl"
    f.write_text("\n".join(json.dumps(x) for x in lines) + "\n")
    assert detect_engine(f) == "vllm_request_metrics"
    b = parse_engine_file(f, "vllm_request_metrics", "v")
    assert not b.rejects and b.runs[0]["engine"] == "vllm" and b.runs[0]["gamma"] == K
    assert b.runs[0]["arm"] == ("compact" if compact else "static")
    want = {x["id"]: x["metrics"]["speculative_decoding"] for x in lines}
    for r in b.requests:
        m = want[r["rid"]]
        assert (r["spec_verify_ct"], r["spec_num_correct_drafts"], r["spec_num_proposed_drafts"]) == (
            m["num_spec_steps"], m["num_accepted_draft_tokens"], m["num_draft_tokens"])
        assert r["spec_correct_drafts_histogram"] == m["acceptance_histogram"]
    steps = {}
    for c in b.request_counts:
        steps.setdefault((c["rid"], c["metric"]), {})[(c["position"], c["bin"])] = c["value"]
    for rid, m in want.items():
        assert [steps[(rid, "step_accepted")][(i, -1)] for i in range(m["num_spec_steps"])] == m["per_step_accepted"]
        assert [steps[(rid, "step_drafted")][(i, -1)] for i in range(m["num_spec_steps"])] == m["per_step_drafted"]
        by_len = {(int(k), j): n for k, row in m["acceptance_histogram_by_draft_length"].items() for j, n in enumerate(row) if n}
        assert {(k, j): v for (j, k), v in steps[(rid, "accepted_hist_by_len")].items()} == by_len
    st = Store(tmp_path / "s.duckdb")
    ingest_engine_files(st, [f], run_id="v")
    fig = engine_figures(st, "v")
    f_ = fig["figures"]
    c, w = rs["correct_drafts"].to_numpy(), rs["window"].to_numpy()
    assert f_["drafts"] == len(rs) and f_["accepted"] == c.sum() and f_["draft_tokens"] == w.sum()
    assert f_["accepted_histogram"] == np.bincount(c, minlength=K + 1).tolist()
    assert f_["per_position_acceptance"] == pytest.approx([(c > k).mean() for k in range(K)], abs=1e-12)
    given = [(c > k).sum() / (w > k).sum() if (w > k).any() else None for k in range(K)]
    assert f_["per_position_given_verified"] == pytest.approx(given, abs=1e-12)  # exact with the per-step arrays
    per_req = rs.groupby("rid").correct_drafts.mean() + 1
    assert f_["per_request_acceptance_length"] == pytest.approx({f"cmpl-{k}": v for k, v in per_req.items()}, abs=1e-12)
    assert "counterfactual tail" in fig["not_identified"][0] and "02cf515f" in fig["format_source"]
    assert any("given verified" in s for s in fig["identifies"])


def test_summary_level_and_per_choice_shape(tmp_path):
    """``summary`` (no arrays) and the earlier per-choice shape with a sparse histogram: the totals and the
    histogram are read; acceptance given verified is identified only when every step drafted all k."""
    rs, K, _ = _blocks(compact=True, seed=4)
    old = []
    for x in responses(rs, K, detailed=False):
        m = x.pop("metrics")["speculative_decoding"]
        m.pop("acceptance_histogram_by_draft_length")
        m["acceptance_histogram"] = {str(j): n for j, n in enumerate(m["acceptance_histogram"]) if n}
        x["choices"][0]["speculative_decoding_stats"] = m
        old.append(x)
    f = tmp_path / "old.json"
    f.write_text(json.dumps(old))  # one JSON document holding the bodies
    assert detect_engine(f) == "vllm_request_metrics"
    st = Store(tmp_path / "s.duckdb")
    b = ingest_engine_files(st, [f], run_id="o")
    assert not b.rejects and len(b.requests) == rs.rid.nunique() and not b.request_counts
    fig = engine_figures(st, "o")
    c = rs["correct_drafts"].to_numpy()
    assert fig["figures"]["accepted_histogram"] == np.bincount(c, minlength=K + 1).tolist()
    assert "per_position_given_verified" not in fig["figures"] and fig["notes"]


def test_bad_records_rejected_alone(tmp_path):
    rs, K, _ = _blocks(compact=True, seed=6)
    lines = responses(rs, K)
    good = {x["id"] for i, x in enumerate(lines) if i not in (0, 1, 2, 4)}
    sd = lambda i: lines[i]["metrics"]["speculative_decoding"]  # noqa: E731
    sd(0)["acceptance_histogram"][0] += 1  # the histogram no longer sums to the steps
    sd(1)["per_step_drafted"] = sd(1)["per_step_drafted"][:-1]
    sd(2)["mean_acceptance_length"] += 0.5
    sd(4)["num_spec_tokens"] = K + 1  # another k than the run's (set by line 4, the first valid record)
    streamed = {"id": "chunk", "object": "text_completion", "choices": [{"index": 0, "text": "a"}]}  # not the last chunk
    nulled = {"id": "n2", "choices": [], "metrics": {"speculative_decoding": None}}  # n > 1: null, not a reject
    dup = json.loads(json.dumps(lines[5]))
    body = [json.dumps(x) for x in lines] + [json.dumps(streamed), json.dumps(nulled), "[1, 2", json.dumps(dup)]
    f = tmp_path / "resp.jsonl"
    f.write_text("\n".join(body) + "\n")
    b = parse_engine_file(f, "vllm_request_metrics", "v")
    n = len(lines)
    assert [(r["line"], r["field"]) for r in b.rejects] == [
        (1, "metrics.speculative_decoding.acceptance_histogram"), (2, "metrics.speculative_decoding.per_step_drafted"),
        (3, "metrics.speculative_decoding.mean_acceptance_length"), (5, "metrics.speculative_decoding.num_spec_tokens"),
        (n + 3, "$"), (n + 4, "id")]
    assert {r["rid"] for r in b.requests} == good  # every valid record kept
    assert {c["rid"] for c in b.request_counts} == good
    assert json.loads(b.runs[0]["config_json"])["not_stored"] == {"null": 1, "no_spec_decode": 1}


def test_compare_with_native_and_counters(tmp_path):
    """The same blocks as a native compact run and as vLLM per-request records: every shared figure agrees,
    per-position acceptance given verified included (the counters alone cannot give it under varied windows)."""
    rs, K, t = _blocks(compact=True, seed=9)
    st = Store(tmp_path / "s.duckdb")
    st.append({**t, "request_steps": rs, "runs": t["runs"].assign(arm="compact")})
    native = str(t["runs"]["run_id"].iloc[0])
    (tmp_path / "v.jsonl").write_text("\n".join(json.dumps(x) for x in responses(rs, K)))
    ingest_engine_files(st, [tmp_path / "v.jsonl"], run_id="vreq")
    df = compare(st, [native, "vreq"]).set_index("run_id")
    for col in ("mean_acceptance_length", "draft_acceptance_rate", "fixed_gamma_rate"):
        assert df.loc["vreq", col] == pytest.approx(df.loc[native, col], abs=1e-12), col
    for col in ("per_position_acceptance", "per_position_given_verified"):
        assert df.loc["vreq", col] == pytest.approx(df.loc[native, col], abs=1e-12), col
    assert df.loc["vreq", "accepted_histogram"] == df.loc[native, "accepted_histogram"]
    assert df.loc["vreq", ["trim_loss_source", "trim_loss_bound_hi", "trim_regret_rate"]].isna().all()  # no trim counters
    assert df.loc[native, "trim_loss_bound_hi"] > 0


def test_saved_stream_reads_the_final_usage_chunk(tmp_path):
    """A streamed response saved as server-sent events: the metrics ride the last chunk (with usage)."""
    rs, K, _ = _blocks(compact=True, seed=3)
    body = responses(rs, K)[0]
    chunks = [{"id": body["id"], "object": "text_completion", "choices": [{"index": 0, "text": w}]} for w in "abc"]
    final = {**body, "choices": [{"index": 0, "text": "", "finish_reason": "length"}]}
    f = tmp_path / "stream.jsonl"
    f.write_text("".join(f"data: {json.dumps(c)}\n\n" for c in chunks + [final]) + "data: [DONE]\n\n")
    assert detect_engine(f) == "vllm_request_metrics"
    b = parse_engine_file(f, "vllm_request_metrics", "s")
    m = body["metrics"]["speculative_decoding"]
    assert not b.rejects and [(r["rid"], r["spec_num_correct_drafts"], r["completion_tokens"]) for r in b.requests] == [
        (body["id"], m["num_accepted_draft_tokens"], body["usage"]["completion_tokens"])]
    assert json.loads(b.runs[0]["config_json"])["not_stored"] == {"null": 0, "no_spec_decode": 3}


def test_hostile_lines_rejected_alone(tmp_path):
    """A line nested past the decoder's depth, or holding an integer past int64, is one reject; the rest is kept."""
    rs, K, _ = _blocks(compact=True, seed=5)
    lines = responses(rs, K)
    huge = json.loads(json.dumps(lines[1]))
    huge["metrics"]["speculative_decoding"]["num_draft_tokens"] = 2**70
    f = tmp_path / "r.jsonl"
    f.write_text("\n".join(["[" * 100_000, json.dumps(lines[0]), json.dumps(huge)] + [json.dumps(x) for x in lines[2:]]))
    b = parse_engine_file(f, "vllm_request_metrics", "h")
    assert [(r["line"], r["field"]) for r in b.rejects] == [(1, "$"), (3, "metrics.speculative_decoding.num_draft_tokens")]
    assert "nested too deeply" in b.rejects[0]["reason"]
    assert len(b.requests) == len(lines) - 1
