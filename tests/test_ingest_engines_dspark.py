"""TensorRT-LLM's DSpark ragged-verify counters (``DSparkRaggedStats.summary()``) into the store, and its bound
on the trim loss next to acceptscope's interval on the same blocks.

``fixtures/engines/trtllm_dspark/`` was written by TensorRT-LLM's own ``DSparkRaggedStats``
(``dspark_observability.py`` @ 313662604a, run by ``fixtures/engines/trtllm_dspark_producer.py``: its summary
JSON, its ``log_summary`` line, the counts it keeps unprinted, and the blocks it was fed). The other tests build
snapshots with :func:`dspark_summary`, written from the module's documented format and checked here to equal
what the module wrote for the same blocks. With ``ACCEPTSCOPE_TRTLLM_SRC`` naming a TensorRT-LLM source tree,
the producer is rerun and must write the committed fixture again. The module's code is not in this repository.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.estimators.run import run_all
from acceptscope.estimators.run_data import to_jsonable
from acceptscope.estimators.synthetic import compact_view, simulate
from acceptscope.ingest.engines import detect_engine, ingest_engine_files, parse_engine_file
from acceptscope.ingest.engines.identify import compare, engine_figures
from acceptscope.ingest.engines.trtllm_dspark import rate_preimage
from acceptscope.store import Store
from tests._close import assert_close

FIXTURE = Path(__file__).resolve().parents[1] / "fixtures" / "engines" / "trtllm_dspark"
TRTLLM_SRC = os.environ.get("ACCEPTSCOPE_TRTLLM_SRC")
INTS = ("steps_total", "steps_ragged", "steps_multi_request", "steps_uniform_windows", "steps_no_windows",
        "ceiling_tokens", "window_tokens", "delivered_tokens", "distinct_verify_lens", "requests_scored",
        "requests_trimmed", "cap_trim_tokens", "requests_cap_trimmed", "cap_trim_max", "graph_replays", "graph_eager")


def dspark_summary(rs, K: int, mode: str, bucket_of=None) -> tuple[dict, dict]:
    """``DSparkRaggedStats(mode, max_draft_len=K).summary()`` after these blocks, and the hidden counts
    (``trimmed_hit_ceiling``, ``accepted_tokens``). ``bucket_of(tokens)``: the captured bucket a compact step
    was fitted to (None: no bucket)."""
    c = dict.fromkeys(INTS, 0)
    vl, bh, pb, cth = {}, {}, {}, {}
    hit = accepted = 0
    for _, g in rs.groupby(["rank", "forward_ct"], sort=True):
        n, w = len(g), g["window"].to_numpy()
        c["steps_total"] += 1
        c["steps_multi_request"] += n >= 2
        c["ceiling_tokens"] += n * (1 + K)
        if mode == "static":
            c["steps_no_windows"] += 1
            c["window_tokens"] += n * (1 + K)
            c["delivered_tokens"] += n * (1 + K)
        else:
            for x in w:
                vl[int(x)] = vl.get(int(x), 0) + 1
            c["window_tokens"] += int((1 + w).sum())
            asked = int((1 + w).sum())
            b = bucket_of(asked) if (bucket_of and mode == "compact") else None
            c["delivered_tokens"] += n * (1 + K) if mode == "cap-accept" else (b or asked)
            if b:
                bh[b] = bh.get(b, 0) + 1
            c["steps_ragged" if len(set(w.tolist())) > 1 else "steps_uniform_windows"] += 1
        c["graph_replays"] += 1
        for wi, ci, ei in zip(w, g["correct_drafts"].to_numpy(), g["ceiling"].to_numpy(float)):
            c["requests_scored"] += 1
            accepted += int(ci)
            if wi < K:
                c["requests_trimmed"] += 1
                hit += int(ci) >= int(wi)
            trim = int(ei) - int(ci) if mode == "cap-accept" else 0
            if trim > 0:
                c["cap_trim_tokens"] += trim
                c["requests_cap_trimmed"] += 1
                cth[trim] = cth.get(trim, 0) + 1
                c["cap_trim_max"] = max(c["cap_trim_max"], trim)
    N, T = c["requests_scored"], c["requests_trimmed"]
    s = {"mode": mode, **{k: c[k] for k in INTS[:8]},
         "trim_ratio": round(1.0 - c["delivered_tokens"] / c["ceiling_tokens"], 4) if c["ceiling_tokens"] else 0.0,
         "distinct_verify_lens": len(vl), "verify_len_hist": dict(sorted(vl.items())), "bucket_hist": dict(sorted(bh.items())),
         "padded_bs_hist": pb, "graph_miss_reasons": {}, "graph_miss_keys": {},
         "accept_len": round(accepted / N, 4) if N else 0.0, "requests_scored": N, "requests_trimmed": T,
         "trim_regret_rate": round(hit / T, 4) if T else 0.0, "cap_trim_tokens": c["cap_trim_tokens"],
         "accept_loss_per_request": round(c["cap_trim_tokens"] / N, 4) if N else 0.0,
         "requests_cap_trimmed": c["requests_cap_trimmed"], "cap_trim_max": c["cap_trim_max"],
         "cap_trim_hist": dict(sorted(cth.items())),
         "cap_trim_concentration": round(c["requests_cap_trimmed"] / N, 4) if N else 0.0,
         "graph_replays": c["graph_replays"], "graph_eager": 0, "fallbacks": {},
         "planner": {}}
    return s, {"trimmed_hit_ceiling": hit, "accepted_tokens": accepted}


def _sim(seed: int = 3, n: int = 40):
    t = dict(simulate(n_requests=n, seed=seed, run_id="nat").tables)
    return t, int(t["runs"]["gamma"].iloc[0])


def _cells(batch) -> dict:
    return {(r["source"], r["rank"], r["metric"], r["position"]): r["value"] for r in batch.counts}


@pytest.mark.parametrize("mode", ["compact", "cap-accept", "static"])
def test_snapshot_json_and_log_exact(tmp_path, mode):
    t, K = _sim()
    rs = t["request_steps"]
    if mode == "static":
        rs = rs.assign(window=K, correct_drafts=rs["ceiling"])
    s, hidden = dspark_summary(rs, K, mode)
    jf = tmp_path / "dspark_stats.json"
    jf.write_text(json.dumps({**s, "max_draft_len": K}))
    log = tmp_path / "server.log"
    log.write_text("[TRT-LLM] [MPI_Rank 0] [I] DSpark verify planner: tiers=[1, 3, %d], profiled_cost_table=True, "
                   "ragged_verify_mode=%s\n" % (K, mode) + "x" * 70_000 + "\n"  # the summary comes past the sniffed head
                   f"[TRT-LLM] [MPI_Rank 0] [I] DSpark ragged verify: {s!r}\n")
    assert detect_engine(jf) == detect_engine(log) == "trtllm_dspark_stats"
    for f in (jf, log):
        b = parse_engine_file(f, "trtllm_dspark_stats", "t")
        assert not b.rejects and b.runs[0]["arm"] == mode and b.runs[0]["gamma"] == K
        got = {m[len("dspark_"):]: v for (_, r, m, p), v in _cells(b).items() if p == -1}
        for k in INTS:
            assert got[k] == s[k], k
        for k in ("trim_ratio", "accept_len", "trim_regret_rate", "accept_loss_per_request", "cap_trim_concentration"):
            assert got[k + "_e4"] == round(s[k] * 10_000), k
        vl = {p: v for (_, r, m, p), v in _cells(b).items() if m == "dspark_verify_len_hist"}
        assert vl == s["verify_len_hist"]
        st = Store(tmp_path / f"{f.stem}.duckdb")
        ingest_engine_files(st, [f], run_id="t")
        fig = engine_figures(st, "t")
        ds = fig["figures"]["dspark"]
        # small runs: the hidden counts are identified exactly from the 4-decimal ratios
        assert ds["trimmed_hit_ceiling"] == [hidden["trimmed_hit_ceiling"]] * 2
        assert ds["accepted"] == [hidden["accepted_tokens"]] * 2
        assert fig["figures"]["mean_acceptance_length"] == pytest.approx(1 + rs["correct_drafts"].mean(), abs=1e-12)
        assert ds["submitted_trim_ratio"] == pytest.approx(1 - s["delivered_tokens"] / s["ceiling_tokens"], abs=1e-12)
        if mode == "cap-accept":
            truth = float((rs["ceiling"] - rs["correct_drafts"]).mean())
            assert ds["trim_loss_measured"] == pytest.approx(truth, abs=1e-12) and truth > 0
        assert "trim loss" in " ".join(fig["identifies"]) and dspark_in(fig["format_source"])


def dspark_in(source: str) -> bool:
    return "dspark_observability.py" in source and "313662604a" in source


def test_regret_count_is_an_interval_past_four_decimals():
    """The producer writes round(hit / trimmed, 4): past ~10^4 trimmed request-steps several counts give the
    written value, and the ingest keeps all of them rather than picking one."""
    for T, hit in ((123_457, 45_678), (9_999, 1_234), (3, 1), (0, 0)):
        r = round(hit / T, 4) if T else 0.0
        lo, hi = rate_preimage(r, T, T)
        assert lo <= hit <= hi and all(round(h / T, 4) == r for h in (lo, hi) if T)
        assert (lo == hi) == (T < 10_000)
        if T:
            assert round((lo - 1) / T, 4) != r and round((hi + 1) / T, 4) != r  # the interval is the whole preimage


def test_trt_bound_beside_acceptscope_interval_on_the_same_blocks(tmp_path):
    """A compact run stored natively (estimated by acceptscope) and its DSpark counters (as TensorRT-LLM would
    write them for the same blocks): the bound is the same on both rows, acceptscope's interval sits inside
    it, and the true loss (the simulation's ceiling) inside the bound."""
    t, K = _sim(seed=5, n=60)
    truth_rs = t["request_steps"]
    rs = compact_view(truth_rs)
    st = Store(tmp_path / "s.duckdb")
    st.append({**t, "request_steps": rs, "runs": t["runs"].assign(arm="compact")})
    s, hidden = dspark_summary(truth_rs, K, "compact", bucket_of=lambda n: -(-n // 16) * 16)
    (tmp_path / "dspark.json").write_text(json.dumps({**s, "max_draft_len": K}))
    ingest_engine_files(st, [tmp_path / "dspark.json"], run_id="trt")
    est = {"nat": to_jsonable(run_all(st, "nat", n_boot=60))}
    df = compare(st, ["nat", "trt"], estimates=est).set_index("run_id")
    nat, trt = df.loc["nat"], df.loc["trt"]
    for col in ("trim_regret_rate", "trim_loss_bound_lo", "trim_loss_bound_hi", "trim_loss_trt_floor"):
        assert trt[col] == pytest.approx(nat[col], abs=1e-12), col
    N = len(rs)
    assert trt["trim_regret_rate"] == pytest.approx(hidden["trimmed_hit_ceiling"] / s["requests_trimmed"], abs=1e-12)
    # TensorRT-LLM's trim_ratio counts tokens submitted after bucket rounding; the native row's is the unrounded one
    assert trt["submitted_trim_ratio"] == pytest.approx(1 - s["delivered_tokens"] / s["ceiling_tokens"], abs=1e-12)
    assert nat["submitted_trim_ratio"] == pytest.approx(1 - s["window_tokens"] / s["ceiling_tokens"], abs=1e-12)
    assert trt["submitted_trim_ratio"] < nat["submitted_trim_ratio"]
    truth = float((truth_rs["ceiling"] - truth_rs["correct_drafts"]).sum()) / N
    assert nat["trim_loss_bound_lo"] == 0 <= truth <= nat["trim_loss_bound_hi"]
    lo, pt, hi = nat["trim_loss_lo"], nat["trim_loss_estimate"], nat["trim_loss_hi"]
    assert lo <= pt <= hi and nat["trim_loss_identified_lo"] <= lo and hi <= nat["trim_loss_identified_hi"] + 1e-12
    assert nat["trim_loss_identified_hi"] <= nat["trim_loss_bound_hi"] + 1e-12  # our telemetry proves more
    assert trt["trim_loss_estimate"] is None or np.isnan(trt["trim_loss_estimate"])  # TensorRT-LLM gives no estimate
    # TensorRT-LLM's docstring reads each trimmed request-step that accepted its whole window as >= 1 lost draft;
    # on these blocks some such steps lost nothing (their next draft was rejected), so that floor is not a bound
    w, c, e = (truth_rs[k].to_numpy() for k in ("window", "correct_drafts", "ceiling"))
    hit = (w < K) & (c == w)
    assert (e[hit] == w[hit]).any()
    assert nat["trim_loss_trt_floor"] == pytest.approx(hit.sum() / N, abs=1e-12)
    assert truth < trt["trim_loss_trt_floor"]  # here the claimed floor is above the true loss (0.050 vs 0.112)
    # the share of TensorRT-LLM's regret that is real: first trimmed draft accepted (the simulation's ceiling > window)
    real = float(((w < K) & (e > w)).sum()) / float((w < K).sum())
    assert nat["first_accepted_rate"] <= real <= nat["first_accepted_bound_hi"] <= trt["trim_regret_rate"]
    assert nat["first_accepted_lo"] <= nat["first_accepted_rate"] and nat["trim_regret_ci_lo"] <= nat["trim_regret_rate"] <= nat["trim_regret_ci_hi"]
    assert lo <= truth <= hi  # (seed 5: acceptscope's interval [0.034, 0.069] holds it)


def test_bad_snapshots_rejected_alone(tmp_path):
    t, K = _sim(seed=6)
    rs = t["request_steps"]
    steps = sorted(rs["forward_ct"].unique())
    early, _ = dspark_summary(rs[rs.forward_ct <= steps[len(steps) // 2]], K, "compact")
    late, hidden = dspark_summary(rs, K, "compact")
    bad_split = {**late, "steps_ragged": late["steps_ragged"] + 1}
    bad_regret = {**late, "trim_regret_rate": 0.33337}
    bad_count = {**late, "window_tokens": -4}
    bad_mode = {**late, "mode": "cap-accept"}
    lines = [early, bad_split, bad_regret, bad_count, bad_mode, late]
    f = tmp_path / "dspark_stats_rank1.jsonl"
    f.write_text("\n".join(json.dumps({**x, "max_draft_len": K}) for x in lines) + "\n{oops\n")
    assert detect_engine(f) == "trtllm_dspark_stats"
    b = parse_engine_file(f, "trtllm_dspark_stats", "t")
    assert [(r["line"], r["field"]) for r in b.rejects] == [
        (2, "steps_total"), (3, "trim_regret_rate"), (4, "window_tokens"), (5, "mode"), (7, "$")]
    assert {r["source"] for r in b.rejects} == {str(f)}
    assert {r["rank"] for r in b.counts} == {1}  # the file name's rank
    st = Store(tmp_path / "s.duckdb")
    ingest_engine_files(st, [f], run_id="t")
    ds = engine_figures(st, "t")["figures"]["dspark"]
    assert ds["steps_total"] == late["steps_total"] and ds["trimmed_hit_ceiling"] == [hidden["trimmed_hit_ceiling"]] * 2
    log = tmp_path / "server.log"
    log.write_text(f"[TRT-LLM] [MPI_Rank 0] [I] DSpark ragged verify: {{'mode': 'compact', 'steps_total': 1e400}}\n"
                   f"[TRT-LLM] [MPI_Rank 0] [I] DSpark ragged verify: {late!r}\n")
    b = parse_engine_file(log, "trtllm_dspark_stats", "t")
    assert [r["field"] for r in b.rejects] == ["max_draft_len"] and b.runs and b.runs[0]["gamma"] == max(late["verify_len_hist"])


def test_acceptscope_ingest_routes_dspark_and_accept_stats_into_one_run(tmp_path):
    """A TensorRT-LLM stats directory holding both outputs: one run with the histogram and the trim figures."""
    from tests.test_ingest_engines import trtllm_snapshot

    t, K = _sim(seed=8)
    rs = t["request_steps"]
    d = tmp_path / "trt-run"
    d.mkdir()
    (d / "dflash_accept_stats_rank0.json").write_text(json.dumps(trtllm_snapshot(rs, K)))
    s, hidden = dspark_summary(rs, K, "compact")
    (d / "server.log").write_text(f"[TRT-LLM] [I] DSpark verify planner: tiers=[2, {K}]\n"
                                  f"[TRT-LLM] [I] DSpark ragged verify: {s!r}\n")
    db = tmp_path / "s.duckdb"
    r = CliRunner().invoke(app, ["ingest", "--db", str(db), "--run-id", "trt", str(d)])
    assert r.exit_code == 0, r.output[-2000:]
    fig = engine_figures(Store(db, read_only=True), "trt")
    f = fig["figures"]
    assert f["accepted_histogram"] == np.bincount(rs["correct_drafts"], minlength=K + 1).tolist()
    assert f["dspark"]["trimmed_hit_ceiling"] == [hidden["trimmed_hit_ceiling"]] * 2
    assert "accept_stats.py" in fig["format_source"] and dspark_in(fig["format_source"])


def _fixture_blocks():
    doc = json.loads((FIXTURE / "blocks.json").read_text())
    b = pd.DataFrame(doc["blocks"]).rename(columns={"step": "forward_ct", "accepted": "correct_drafts"})
    return b, int(doc["max_draft_len"])


@pytest.mark.parametrize("mode", ["compact", "cap-accept"])
def test_producer_written_fixture_ingests_exactly(tmp_path, mode):
    """What TensorRT-LLM's own class wrote: every count back exactly, its hidden counts identified, and the
    documented-format writer the other tests use gives the same summary for the same blocks."""
    written = json.loads((FIXTURE / f"{mode}.dspark_stats.json").read_text())
    hidden = json.loads((FIXTURE / f"{mode}.hidden.json").read_text())
    blocks, K = _fixture_blocks()
    mine, mine_hidden = dspark_summary(blocks, K, mode, bucket_of=(lambda n: -(-n // 16) * 16) if mode == "compact" else None)
    assert mine_hidden == hidden
    for k, v in written.items():
        if k in ("max_draft_len", "rank"):
            continue
        want = {str(a): b for a, b in v.items()} if isinstance(v, dict) else v
        got = {str(a): b for a, b in mine[k].items()} if isinstance(mine[k], dict) else mine[k]
        assert_close(got, want, where=k)
    for f in (FIXTURE / f"{mode}.dspark_stats.json", FIXTURE / f"{mode}.server.log"):
        assert detect_engine(f) == "trtllm_dspark_stats"
        st = Store(tmp_path / f"{f.suffix[1:]}.duckdb")
        b = ingest_engine_files(st, [f], run_id="t")
        assert not b.rejects and b.runs[0]["arm"] == mode and b.runs[0]["gamma"] == K
        got = {r["metric"][len("dspark_"):]: r["value"] for r in b.counts if r["position"] == -1}
        for k in INTS:
            assert got[k] == written[k], k
        assert {r["rank"] for r in b.counts} == {0}
        ds = engine_figures(st, "t")["figures"]["dspark"]
        assert ds["trimmed_hit_ceiling"] == [hidden["trimmed_hit_ceiling"]] * 2
        assert ds["accepted"] == [hidden["accepted_tokens"]] * 2
        if mode == "cap-accept":
            loss = float((blocks["ceiling"] - blocks["correct_drafts"]).mean())
            assert ds["trim_loss_measured"] == pytest.approx(loss, abs=1e-12)


@pytest.mark.skipif(not TRTLLM_SRC, reason="ACCEPTSCOPE_TRTLLM_SRC (a TensorRT-LLM source tree) not set")
def test_producer_writes_the_committed_fixture_again(tmp_path):
    from fixtures.engines.trtllm_dspark_producer import main

    main(TRTLLM_SRC, str(tmp_path))
    for f in sorted(FIXTURE.glob("*.json")):
        assert_close(json.loads((tmp_path / f.name).read_text()), json.loads(f.read_text()), where=f.name)
    for f in sorted(FIXTURE.glob("*.log")):
        assert (tmp_path / f.name).read_text().splitlines() == f.read_text().splitlines(), f.name


def test_ranks_pool_their_latest_snapshots(tmp_path):
    """A multi-rank server logs one cumulative snapshot per rank now and then: each rank's latest is read and
    the ranks are summed (an earlier snapshot is not added again)."""
    t, K = _sim(seed=12)
    rs = t["request_steps"]
    rids = sorted(rs["rid"].unique())
    parts = [rs[rs.rid.isin(rids[r::2])].assign(rank=r) for r in (0, 1)]
    half = parts[0][parts[0].forward_ct <= parts[0].forward_ct.median()]
    snaps = [(0, dspark_summary(half, K, "compact")[0])] + [(r, dspark_summary(p, K, "compact")[0]) for r, p in enumerate(parts)]
    hidden = [dspark_summary(p, K, "compact")[1] for p in parts]
    f = tmp_path / "server.log"
    f.write_text("".join(f"[12/05/2026-06:00:0{i}] [TRT-LLM] [MPI_Rank {r}] [I] DSpark ragged verify: {s!r}\n"
                         for i, (r, s) in enumerate(snaps)), encoding="utf-8")
    st = Store(tmp_path / "s.duckdb")
    b = ingest_engine_files(st, [f], run_id="t")
    assert not b.rejects and {r["rank"] for r in b.counts} == {0, 1}
    ds = engine_figures(st, "t")["figures"]["dspark"]
    assert ds["ranks"] == [0, 1] and ds["requests_scored"] == len(rs)
    assert ds["steps_total"] == snaps[1][1]["steps_total"] + snaps[2][1]["steps_total"]
    assert ds["trimmed_hit_ceiling"] == [sum(h["trimmed_hit_ceiling"] for h in hidden)] * 2
    assert ds["accepted"] == [int(rs["correct_drafts"].sum())] * 2
    # no max_draft_len key or planner line: K is only the largest window seen, so no upper bound is claimed
    assert ds["trim_loss_bound_hi"] is None and ds["trim_loss_trt_floor"] is not None


def test_hostile_snapshot_lines_rejected_alone(tmp_path):
    t, K = _sim(seed=13)
    s, _ = dspark_summary(t["request_steps"], K, "compact")
    f = tmp_path / "server.log"
    bad = {**s, "steps_total": 10**30}  # past int64
    f.write_text("DSpark ragged verify: {" + "(" * 100_000 + "\n" + f"DSpark ragged verify: {bad!r}\n"
                 + f"DSpark verify planner: tiers=(2, {K})\nDSpark ragged verify: {s!r}\n")
    b = parse_engine_file(f, "trtllm_dspark_stats", "h")
    assert [(r["line"], r["field"]) for r in b.rejects] == [(1, "$"), (2, "steps_total")]
    assert b.runs and b.runs[0]["gamma"] == K
    assert json.loads(b.runs[0]["config_json"])["gamma"] == "K from planner tiers"
