"""/server_info info-dump ingest: round trip, dedupe, rank fingerprinting, gaps, rejects."""

from __future__ import annotations

import copy
import json
import math

import msgspec
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.rejects import format_reject
from acceptscope.ingest.server_info import ServerInfoIngestor, run_row_from_server_info
from acceptscope.ingest.synth import make_payload, make_records, make_server_info, omit_defaults
from tests._close import assert_close

SENTINELS = ("bs", "num_running_reqs", "num_verify_tokens", "verify_tokens_local", "verify_tokens_dp_synced",
             "verify_tokens_graph_key")
OPTIONALS = ("budget", "lag_steps", "predicted_step_ms", "predicted_theta", "step_cpu_ms", "step_gpu_ms",
             "draft_gpu_ms", "target_verify_gpu_ms")


def f32(xs):
    return None if xs is None else [float(np.float32(x)) for x in xs]


def check_roundtrip(payload: dict, batch, run_id: str = "r") -> None:
    """Every field of every record/ReqDetail of ``payload`` is in the batch exactly (defaults filled)."""
    steps = {(r["rank"], r["forward_ct"]): r for r in batch.rows("steps")}
    rs = {(r["rank"], r["forward_ct"], r["rid"]): r for r in batch.rows("request_steps")}
    n_req = 0
    for rank, state in enumerate(payload["internal_states"]):
        dump = state["dspark_info_record"]
        gamma, mode = dump["gamma"], dump["mode"]
        for rec in dump["records"]:
            s = steps[(rank, rec["forward_ct"])]
            assert s["run_id"] == run_id and s["epoch"] == 0
            for f in SENTINELS:
                v = rec.get(f, -1)
                assert s[f] == (None if v == -1 else v), f
            for f in OPTIONALS:
                assert s[f] == rec.get(f), f
            assert s["mode"] == (rec.get("mode") or None)
            for q in rec.get("reqs") or []:
                n_req += 1
                rid = q.get("rid") or f"pool:{q['req_pool_index']}"
                r = rs[(rank, rec["forward_ct"], rid)]
                for f in ("req_pool_index", "prefix_len", "verify_len", "acc_len", "correct_drafts", "cap_trim",
                          "bonus_token", "draft_tokens"):
                    assert r[f] == q[f], f
                assert r["window"] == q["verify_len"] - 1
                assert_close(r["confidence"], f32(q.get("confidence")), rtol=1e-6)
                assert_close(r["survival"], f32(q.get("survival")), rtol=1e-6)
                assert r["committed_tokens"] == q["draft_tokens"][: q["correct_drafts"]] + [q["bonus_token"]]
                want = {"cap-accept": q["correct_drafts"] + q["cap_trim"], "static": q["correct_drafts"],
                        "compact": None}[mode]
                assert r["ceiling"] == want
                assert len(r["draft_tokens"]) == gamma
    assert batch.n("request_steps") == n_req


@pytest.mark.parametrize("mode", ["cap-accept", "compact", "static"])
@pytest.mark.parametrize("fast", [True, False])
def test_roundtrip_every_field(mode, fast):
    p = make_server_info(ranks=2, n_steps=25, bs=5, mode=mode, seed=3)
    ing = ServerInfoIngestor("r", source="t.json")
    ing.use_fast = fast
    b = ing.feed(p)
    assert not b.rejects, [format_reject(r) for r in b.rejects]
    check_roundtrip(p, b)
    run = b.rows("runs")[0]
    assert (run["arm"], run["engine"], run["gamma"], run["target_model"]) == (mode, "sglang", 7, "synthetic/target")


def test_fast_and_exact_paths_agree_and_bytes_equal_dict():
    p = make_server_info(ranks=2, n_steps=30, bs=6, mode="compact", seed=9, with_rids=False)
    outs = []
    for fast, as_bytes in ((True, True), (False, True), (True, False), (False, False)):
        ing = ServerInfoIngestor("r", source="t")
        ing.use_fast = fast
        outs.append(ing.feed_bytes(msgspec.json.encode(p)) if as_bytes else ing.feed(copy.deepcopy(p)))
    for t in ("steps", "request_steps"):
        for o in outs[1:]:
            assert_close(o.arrow(t), outs[0].arrow(t), where=str(t))


def test_defaults_filled_when_omitted():
    rec = {"forward_ct": 5}  # core component off: everything defaulted, so absent
    p = {"internal_states": [{"dspark_info_record": make_payload(gamma=3, mode="compact", components=(),
                                                                  records=[rec])}]}
    b = ServerInfoIngestor("r").feed(p)
    (s,) = b.rows("steps")
    assert s["forward_ct"] == 5 and s["mode"] is None
    assert all(s[f] is None for f in SENTINELS + OPTIONALS)
    assert b.n("request_steps") == 0


def test_pool_rid_and_step_index():
    recs = make_records(n_steps=6, gamma=3, bs=2, seed=1, with_rids=False)
    p = {"internal_states": [{"dspark_info_record": make_payload(gamma=3, records=recs)}]}
    b = ServerInfoIngestor("r").feed(p)
    rows = b.rows("request_steps")
    assert all(r["rid"].startswith("pool:") for r in rows)
    by = {}
    for r in sorted(rows, key=lambda r: r["forward_ct"]):
        by.setdefault(r["rid"], []).append(r["step_index"])
    for idx in by.values():
        assert idx[0] == 0


def test_dedupe_across_polls_and_rank_fingerprint_with_swapped_order():
    p = make_server_info(ranks=2, n_steps=40, bs=4, seed=2)
    first = copy.deepcopy(p)
    for s in first["internal_states"]:
        s["dspark_info_record"]["records"] = s["dspark_info_record"]["records"][:20]
    swapped = copy.deepcopy(p)
    swapped["internal_states"].reverse()  # arrival order differs between polls
    ing = ServerInfoIngestor("r")
    b1 = ing.feed(first)
    b2 = ing.feed(swapped)
    b3 = ing.feed(swapped)
    assert b1.n("steps") == 40 and b2.n("steps") == 40 and b3.n("steps") == 0
    assert b2.duplicates["steps"] == 40 and b3.duplicates["steps"] == 80
    assert not b2.gaps
    allrows = b1.rows("request_steps") + b2.rows("request_steps")
    ranks_of = {}
    for r in allrows:
        ranks_of.setdefault(r["rid"].split("-")[0], set()).add(r["rank"])
    assert ranks_of == {"d0": {0}, "d1": {1}}
    keys = [(r["rank"], r["forward_ct"], r["rid"]) for r in allrows]
    assert len(keys) == len(set(keys))
    check_roundtrip(p, b1.merge(b2))


def test_clear_loss_overflow_and_restart_gaps():
    recs = make_records(n_steps=30, gamma=7, bs=3, seed=4)
    mk = lambda rs, t=1.0: {"startup_time": t, "internal_states": [{"dspark_info_record": make_payload(records=rs)}]}  # noqa: E731
    ing = ServerInfoIngestor("r", ring_capacity=10)
    ing.feed(mk(recs[:10]))
    b = ing.feed(mk(recs[15:25]))  # ring full (10) and watermark record gone -> overflow
    (g,) = b.gaps
    assert g["kind"] == "overflow" and g["from_forward_ct"] == recs[9]["forward_ct"]
    assert g["to_forward_ct"] == recs[15]["forward_ct"]
    b = ing.feed(mk(recs[27:29]))  # fewer than capacity: cleared between polls
    (g,) = b.gaps
    assert g["kind"] == "clear-loss" and g["from_forward_ct"] == recs[24]["forward_ct"]
    b = ing.feed(mk(recs[:5], t=2.0))  # new startup_time: restart
    (g,) = b.gaps
    assert g["kind"] == "restart" and g["epoch"] == 1
    assert {r["epoch"] for r in b.rows("steps")} == {1} and b.n("steps") == 5
    # forward_ct going backwards without a startup_time is a restart too
    ing2 = ServerInfoIngestor("r")
    ing2.feed({"internal_states": [{"dspark_info_record": make_payload(records=recs[10:20])}]})
    b = ing2.feed({"internal_states": [{"dspark_info_record": make_payload(records=recs[:3])}]})
    assert [g["kind"] for g in b.gaps] == ["restart"] and b.n("steps") == 3


def _one_state(records, gamma=7, mode="cap-accept", components=("core", "reqs", "step_cpu_time")):
    return {"internal_states": [{"dspark_info_record": make_payload(gamma=gamma, mode=mode, records=records,
                                                                     components=components)}]}


@pytest.mark.parametrize("fast", [True, False])
def test_bad_request_detail_rejects_only_itself(fast):
    recs = make_records(n_steps=4, gamma=7, bs=4, seed=5)
    recs[2]["reqs"][3]["confidence"][2] = float("nan")
    recs[1]["reqs"][0]["correct_drafts"] = recs[1]["reqs"][0]["verify_len"]  # > window
    recs[3]["reqs"][1]["prefix_len"] = "12"  # wrong type
    payload = _one_state(recs)
    text = json.dumps(payload).encode()  # NaN token, as Python's json writes it
    ing = ServerInfoIngestor("r", source="dump.json")
    ing.use_fast = fast
    b = ing.feed_bytes(text, line=1)
    msgs = sorted(format_reject(r) for r in b.rejects)
    assert "dump.json:1: internal_states[0].records[2].reqs[3].confidence[2]: NaN" in msgs
    assert any(m.startswith("dump.json:1: internal_states[0].records[1].reqs[0].correct_drafts:") for m in msgs)
    assert any(m.startswith("dump.json:1: internal_states[0].records[3].reqs[1].prefix_len:") for m in msgs)
    assert len(msgs) == 3
    assert b.n("steps") == 4 and b.n("request_steps") == 16 - 3


@pytest.mark.parametrize(
    "mutate, field, reason",
    [
        (lambda q: q["confidence"].__setitem__(1, 1.5), "confidence[1]", "outside [0, 1]"),
        (lambda q: q["survival"].__setitem__(3, 0.99), "survival[3]", "non-increasing"),
        (lambda q: q["survival"].__setitem__(0, q["survival"][0] * 0.5), "survival[0]", "inconsistent"),
        (lambda q: q.__setitem__("acc_len", q["correct_drafts"] + 2), "acc_len", "!= correct_drafts+1"),
        (lambda q: q.__setitem__("cap_trim", -1), "cap_trim", "negative"),
        (lambda q: q.__setitem__("verify_len", 9), "verify_len", "outside"),
        (lambda q: q.__setitem__("draft_tokens", q["draft_tokens"][:5]), "draft_tokens", "gamma mismatch"
         if False else "!= gamma"),
        (lambda q: q.pop("survival"), "survival", "together"),
    ],
)
def test_request_detail_checks(mutate, field, reason):
    recs = make_records(n_steps=2, gamma=7, bs=3, seed=6)
    mutate(recs[1]["reqs"][2])
    b = ServerInfoIngestor("r", source="s").feed(_one_state(recs))
    (r,) = b.rejects
    assert r["field"] == f"internal_states[0].records[1].reqs[2].{field}" and reason in r["reason"]
    assert b.n("request_steps") == 5
    assert json.loads(r["raw"])["req_pool_index"] == recs[1]["reqs"][2]["req_pool_index"]


def test_payload_and_step_level_rejects():
    recs = make_records(n_steps=3, gamma=7, bs=2, seed=7)
    good = _one_state(recs)
    ing = ServerInfoIngestor("r", source="s")
    ing.feed(good)
    other = _one_state(make_records(n_steps=2, gamma=5, bs=2, seed=1, first_fct=100), gamma=5)
    b = ing.feed(other)  # gamma mismatch with the run
    assert [r["field"] for r in b.rejects] == ["internal_states[0].gamma"] and b.n("steps") == 0
    p = _one_state(make_records(n_steps=2, gamma=7, bs=2, seed=2, first_fct=50))
    p["internal_states"][0]["dspark_info_record"]["components"].append("bogus")
    b = ing.feed(p)  # unknown component: rejected, records kept
    assert [r["field"] for r in b.rejects] == ["internal_states[0].components[3]"] and b.n("steps") == 2
    recs2 = make_records(n_steps=3, gamma=7, bs=2, seed=3, first_fct=80)
    recs2[1]["bs"] = recs2[1]["num_running_reqs"] = 5  # bs != len(reqs): step row rejected, its reqs with it
    recs2[2]["forward_ct"] = recs2[1]["forward_ct"]  # duplicate record
    b = ing.feed(_one_state(recs2))
    fields = sorted(r["field"] for r in b.rejects)
    assert fields == ["internal_states[0].records[1].bs", "internal_states[0].records[1].reqs[0]",
                      "internal_states[0].records[1].reqs[1]", "internal_states[0].records[2].forward_ct"]
    assert b.n("steps") == 1 and b.n("request_steps") == 2  # no request_steps row without its steps row
    b = ServerInfoIngestor("r", source="s").feed({"internal_states": [{"no_dump": 1}]})
    assert b.rejects[0]["field"] == "internal_states[0].dspark_info_record"


def test_truncated_json_is_one_clear_reject():
    data = msgspec.json.encode(make_server_info(ranks=1, n_steps=3, bs=2))
    b = ServerInfoIngestor("r", source="cut.json").feed_bytes(data[: len(data) // 2], line=1)
    (r,) = b.rejects
    assert r["source"] == "cut.json" and r["line"] == 1 and "truncated" in r["reason"]


def test_run_row_helper():
    p = make_server_info(ranks=1, n_steps=2, bs=2, mode="compact")
    row = run_row_from_server_info("x", p, {"model_path": "override"}, source="live", audit_group="g")
    assert (row["arm"], row["gamma"], row["engine"], row["target_model"], row["audit_group"], row["source"]) == (
        "compact", 7, "sglang", "override", "g", "live")
    assert json.loads(row["config_json"])["verify_num_draft_tokens"] == 8
    with pytest.raises(ValueError):
        run_row_from_server_info("x", {"foo": 1})


# ---------------------------------------------------------------------------
# property-based: generated valid dumps round-trip; one corruption = one reject, siblings kept
# ---------------------------------------------------------------------------
@st.composite
def dumps(draw):
    gamma = draw(st.integers(1, 6))
    mode = draw(st.sampled_from(["cap-accept", "compact", "static"]))
    n = draw(st.integers(1, 5))
    recs = []
    fct = draw(st.integers(0, 1000))
    for _ in range(n):
        bs = draw(st.integers(0, 4))
        reqs = []
        for i in range(bs):
            vlen = gamma + 1 if mode == "static" else draw(st.integers(1, gamma + 1))
            cd = draw(st.integers(0, vlen - 1))
            ct = 0 if mode == "static" else draw(st.integers(0, gamma - cd))
            q = {"req_pool_index": draw(st.integers(0, 500)), "prefix_len": draw(st.integers(0, 10**6)),
                 "verify_len": vlen, "acc_len": cd + 1, "correct_drafts": cd, "cap_trim": ct,
                 "bonus_token": draw(st.integers(0, 2**40)),
                 "draft_tokens": draw(st.lists(st.integers(0, 2**40), min_size=gamma, max_size=gamma)),
                 "rid": f"q{i}"}
            if mode != "static":
                c = np.array(draw(st.lists(st.floats(0, 1, width=32), min_size=gamma, max_size=gamma)),
                             dtype=np.float32)
                q["confidence"] = [round(float(x), 4) for x in c]
                q["survival"] = [round(float(x), 4) for x in np.cumprod(c, dtype=np.float32)]
            reqs.append(q)
        rec = {"forward_ct": fct, "bs": bs, "mode": mode, "num_running_reqs": bs,
               "num_verify_tokens": draw(st.integers(-1, 100)),
               "budget": draw(st.none() | st.integers(0, 50)),
               "step_cpu_ms": draw(st.none() | st.floats(0, 1000, allow_nan=False)), "reqs": reqs}
        recs.append(omit_defaults(rec))
        fct += draw(st.integers(1, 5))
    return {"internal_states": [{"dspark_info_record": make_payload(gamma=gamma, mode=mode, records=recs)}]}


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dumps(), st.booleans())
def test_property_valid_roundtrip(p, fast):
    ing = ServerInfoIngestor("r")
    ing.use_fast = fast
    b = ing.feed_bytes(msgspec.json.encode(p))
    assert not b.rejects, [format_reject(r) for r in b.rejects]
    check_roundtrip(p, b)


CORRUPTIONS = [
    ("prefix_len", lambda q, g: -3),
    ("correct_drafts", lambda q, g: q["verify_len"] + 1),
    ("bonus_token", lambda q, g: "x"),
    ("draft_tokens", lambda q, g: q["draft_tokens"] + [1]),
    ("confidence", lambda q, g: None if "confidence" not in q else [float("nan")] * g),
    ("rid", lambda q, g: 17),
]


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(dumps(), st.data())
def test_property_corruption_rejects_field_and_keeps_siblings(p, data):
    recs = p["internal_states"][0]["dspark_info_record"]["records"]
    cands = [(j, k) for j, r in enumerate(recs) for k in range(len(r.get("reqs") or []))]
    if not cands:
        return
    j, k = data.draw(st.sampled_from(cands))
    field, fn = data.draw(st.sampled_from(CORRUPTIONS))
    q = recs[j]["reqs"][k]
    g = p["internal_states"][0]["dspark_info_record"]["gamma"]
    v = fn(q, g)
    if v is None:
        return
    q[field] = v
    total = len(cands)
    b = ServerInfoIngestor("r", source="p.json").feed_bytes(json.dumps(p).encode(), line=1)
    assert len(b.rejects) == 1, [format_reject(r) for r in b.rejects]
    assert b.rejects[0]["field"].startswith(f"internal_states[0].records[{j}].reqs[{k}].{field}")
    assert b.n("request_steps") == total - 1
    assert b.n("steps") == len(recs)
    for r in b.rows("request_steps"):
        assert not (r["forward_ct"] == recs[j]["forward_ct"] and r["rid"] == (q["rid"] if field != "rid" else None))
    assert all(math.isfinite(x) for r in b.rows("request_steps") for x in (r["confidence"] or []))


def test_duplicate_request_steps_are_tallied():
    p = make_server_info(ranks=1, n_steps=10, bs=3, seed=8)
    for feed in ("feed", "feed_bytes"):
        ing = ServerInfoIngestor("r")
        arg = (lambda x: x) if feed == "feed" else msgspec.json.encode
        getattr(ing, feed)(arg(copy.deepcopy(p)))
        b = getattr(ing, feed)(arg(copy.deepcopy(p)))
        assert b.duplicates == {"steps": 10, "request_steps": 30}


def test_pretty_printed_and_bare_dump_documents():
    p = make_server_info(ranks=2, n_steps=8, bs=3, seed=12)
    ref = ServerInfoIngestor("r").feed_bytes(msgspec.json.encode(p))
    pretty = ServerInfoIngestor("r").feed_bytes(json.dumps(p, indent=2).encode())
    assert_close(pretty.arrow("request_steps"), ref.arrow("request_steps"))
    bare = ServerInfoIngestor("r").feed_bytes(json.dumps(p["internal_states"][0]["dspark_info_record"]).encode())
    assert bare.n("request_steps") == 24 and not bare.rejects


def test_chunked_fast_path_matches_exact_path():
    """The fast path, over whole states or cut into chunks of a few records (each chunk decoded, checked
    and handed over on its own, declining to the exact path per chunk), gives the rows, rejects (field,
    reason, raw item), duplicates and rank watermarks of the exact per-record path, for valid rows,
    semantically bad ones (fast decode succeeds, rejects need the raw item), list-typed bad ones (the
    chunk holding one declines), and an overlapping poll."""
    p = make_server_info(ranks=2, n_steps=12, bs=3, seed=21)
    recs = p["internal_states"][1]["dspark_info_record"]["records"]
    recs[4]["reqs"][1]["correct_drafts"] = recs[4]["reqs"][1]["verify_len"]  # > window
    recs[7]["reqs"][0]["draft_tokens"] = recs[7]["reqs"][0]["draft_tokens"][:3]  # != gamma
    bad_list = copy.deepcopy(p)
    bad_list["internal_states"][0]["dspark_info_record"]["records"][5]["reqs"][2]["draft_tokens"][1] = 1.5
    later = copy.deepcopy(p)
    for st_ in later["internal_states"]:
        st_["dspark_info_record"]["records"] = st_["dspark_info_record"]["records"][6:] + make_records(
            n_steps=4, gamma=7, bs=3, seed=22, first_fct=st_["dspark_info_record"]["records"][-1]["forward_ct"] + 1,
            rid_prefix="late-")

    def run(variant, payloads):
        ing = ServerInfoIngestor("r", source="d.json")
        ing.use_fast = variant != "exact"
        if variant == "chunked":
            ing.chunk_bytes = 1500  # ~2 records a chunk
        parts = []
        ing.sink = parts.append
        out = []
        for i, x in enumerate(payloads):
            b = ing.feed_bytes(msgspec.json.encode(x), line=i + 1)
            b = IngestBatch().merge(*parts, b)
            parts.clear()
            rej = sorted((r["field"], r["reason"], r["raw"]) for r in b.rejects)
            # (row order across ranks differs where one rank takes the exact path: compare sorted)
            steps = b.arrow("steps").sort_by([("rank", "ascending"), ("forward_ct", "ascending")])
            rs = b.arrow("request_steps").sort_by([("rank", "ascending"), ("forward_ct", "ascending"),
                                                   ("rid", "ascending")])
            out.append((steps, rs, rej, dict(b.duplicates)))
        return out, [(r.slot, r.watermark, r.last_fp) for r in ing.ranks]

    from acceptscope.ingest import stream

    sc = stream.scan(stream.BytesSource(msgspec.json.encode(p)), chunk_bytes=1500)
    assert sc is not None and len(sc.arrays[0]) >= 4 and sum(n for _, _, n in sc.arrays[1]) == 12
    for payloads in ([p, later], [bad_list, later]):
        ref, ref_ranks = run("fast", payloads)
        assert len(ref[0][2]) >= 2 and ref[1][3]["request_steps"] == 2 * 6 * 3
        for variant in ("chunked", "exact"):
            got, ranks = run(variant, payloads)
            assert ranks == ref_ranks, variant
            for (s1, r1, j1, d1), (s2, r2, j2, d2) in zip(ref, got):
                assert_close(s1, s2, where=variant)
                assert_close(r1, r2, where=variant)
                assert j1 == j2 and d1 == d2, variant


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 10_000), n=st.integers(1, 40), gamma=st.integers(1, 8),
       corrupt=st.lists(st.tuples(st.sampled_from(["c", "s"]), st.integers(0, 10_000),
                                  st.sampled_from([1.5, -0.1, float("nan"), 0.0, 1.0, 0.999])), max_size=4))
def test_vector_float_rows_match_the_row_rules(seed, n, gamma, corrupt):
    """``_bad_float_rows`` (whole-matrix checks first) flags exactly the rows of the per-row formula."""
    from acceptscope.ingest.server_info_checks import bad_float_rows as _bad_float_rows

    rng = np.random.default_rng(seed)
    c = np.round(rng.uniform(0.2, 1.0, (n, gamma)), 4)
    s = np.round(np.cumprod(c.astype(np.float32), axis=1, dtype=np.float32).astype(np.float64), 4)
    for which, pos, v in corrupt:
        (c if which == "c" else s).flat[pos % (n * gamma)] = v
    with np.errstate(invalid="ignore"):
        want = ~((c >= 0) & (c <= 1)).all(axis=1)
        want |= ~((s >= 0) & (s <= 1)).all(axis=1)
        want |= (np.diff(s, axis=1, prepend=1.0) > 0).any(axis=1)
        want |= (np.abs(s - np.cumprod(c, axis=1)) > 5e-5 * (np.arange(gamma) + 2) + 1e-6).any(axis=1)
    got = _bad_float_rows(c.copy(), s.copy(), gamma)
    assert np.array_equal(np.zeros(n, bool) if got is None else got, want)


@pytest.mark.parametrize("bad", ["range", "type"])
def test_request_reject_quotes_its_text_as_it_came(bad):
    """A bad ReqDetail in a JSON document is rejected alone, named by field, and its reject quotes the
    item's own text (spaced JSON stays spaced) on the fast path's explanation ("range": the chunk decodes,
    a column check flags the row) and on the exact fallback's ("type": the chunk's typed decode fails)."""
    p = make_server_info(ranks=1, n_steps=6, bs=3, gamma=4, mode="cap-accept", seed=5)
    q = p["internal_states"][0]["dspark_info_record"]["records"][2]["reqs"][1]
    q["verify_len"] = 99 if bad == "range" else "x"
    data = json.dumps(p).encode()  # (", " and ": " separators: not what msgspec would re-encode)
    ing = ServerInfoIngestor("r", source="dump.json")
    b = ing.feed_bytes(data, line=1)
    assert b.n("request_steps") == 6 * 3 - 1  # every valid sibling kept
    (rej,) = b.rejects
    assert rej["field"] == "internal_states[0].records[2].reqs[1].verify_len"
    assert rej["raw"] == json.dumps(q)
    assert format_reject(rej).startswith("dump.json:1: internal_states[0].records[2].reqs[1].verify_len: ")
