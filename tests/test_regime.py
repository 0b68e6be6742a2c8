"""The seeds' regime: GPU cost profiles (measurement code on CPU, shipped tables), the virtual clock,
the calibration split, the audit's defaults, and the report/dashboard sections that show them."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

from acceptscope.domain.locations import PROFILE_DIR, resolve_cost_profile
from acceptscope.engine import EngineConfig, run_engine
from acceptscope.engine import gpu_profile as gp
from acceptscope.engine import profiler
from acceptscope.domain import sps as sps_mod
from acceptscope.domain.workloads import disjoint_prompts, load_prompts
from acceptscope.ingest.sps import parse_sps_table
from acceptscope.reader import Reader
from tests._close import assert_json_close
from tests._engine_tiny import save_tiny_pair

SHIPPED = ("h200-qwen3-1.7b", "h200-qwen3-8b", "h200-qwen3-32b")
_spec = importlib.util.spec_from_file_location("bench_regime", Path(__file__).resolve().parents[1] / "bench" / "regime.py")
bench_regime = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(bench_regime)


def test_ragged_windows_front_pack_like_sglang():
    assert gp.ragged_windows(4, 6, 7) == [2, 2, 1, 1]
    assert gp.ragged_windows(3, 0, 7) == [0, 0, 0]
    assert gp.ragged_windows(2, 14, 7) == [7, 7]
    with pytest.raises(ValueError):
        gp.ragged_windows(2, 15, 7)


def test_folded_grouped_attention_equals_per_token_reference():
    """The timed layer's packed -> padded -> folded-GQA attention computes real attention (no mask)."""
    torch.manual_seed(0)
    s = gp.get_shape("tiny")
    bs, G1, ctx = 3, 8, 5
    d = gp.Decoder(s, 1, bs, ctx, G1 - 1, torch.device("cpu"), torch.float32)
    win = [2, 0, 7]
    pad = torch.tensor([b * G1 + j for b, w in enumerate(win) for j in range(w + 1)])
    T = len(pad)
    x = torch.randn(T, s.hidden)
    ly = d.layers[0]
    j = pad % G1
    cos, sin = d.cos_t[j].unsqueeze(1), d.sin_t[j].unsqueeze(1)
    qf, kvp = gp._pre(x, ly.n1, ly.wqkv, ly.qn, ly.kn, cos, sin, pad, bs, G1, s.heads, s.kv_heads, s.head_dim)
    kvc = d.kvc[0]
    kvc[:, :bs, :, ctx:] = kvp
    of = F.scaled_dot_product_attention(qf, kvc[0, :bs], kvc[1, :bs])
    grp = s.heads // s.kv_heads
    o = of.reshape(bs, s.kv_heads, G1, grp, s.head_dim).permute(0, 2, 1, 3, 4).reshape(bs * G1, -1).index_select(0, pad)
    q = gp._rms(x, ly.n1) @ ly.wqkv
    q = gp._rope(gp._rms(q[:, : s.heads * s.head_dim].reshape(T, s.heads, s.head_dim), ly.qn), cos, sin)
    for t in range(T):
        b = int(pad[t]) // G1
        K, V = kvc[0, b].repeat_interleave(grp, 0), kvc[1, b].repeat_interleave(grp, 0)
        ref = torch.softmax(q[t].unsqueeze(1) @ K.transpose(1, 2) / s.head_dim ** 0.5, -1) @ V
        torch.testing.assert_close(o[t], ref.squeeze(1).reshape(-1), rtol=1e-4, atol=1e-5)
    # the new block's K/V landed behind the context of its own request
    torch.testing.assert_close(kvc[0, 1, :, ctx], kvp[0, 1, :, 0])


def test_profile_shape_on_cpu_yields_cells_replays_and_a_fit():
    r = gp.profile_shape(gp.get_shape("tiny"), batch_sizes=[1, 4], fracs=[0, 0.5, 1], gamma=3, context_len=8,
                         draft_layers=1, reps=2, device="cpu", window_sets=[{"bs": 4, "windows": [3, 0, 1, 2]}],
                         log=lambda m: None)
    cells = r["cells"]
    assert [(c["bs"], c["batch_tokens"]) for c in cells] == [(1, 1), (1, 2), (1, 4), (4, 4), (4, 10), (4, 16)]
    assert all(c["step_ms"] > 0 and c["verify_ms"] > 0 for c in cells)
    assert r["replays"][0]["batch_tokens"] == 4 + 6
    b = gp.bound_ratio(r, 4.8e12)
    s = gp.get_shape("tiny")
    assert b["weight_bytes"] == 2 * (s.layers * s.layer_params() + s.vocab * s.hidden + s.hidden)
    assert b["ratio_min"] == pytest.approx(min(b["batch1_verify_ms"].values()) / b["bound_ms"])
    doc = {"provenance": gp.provenance(torch.device("cpu")), "results": [r]}
    assert doc["provenance"]["torch"] == torch.__version__


def test_shape_weight_bytes_match_the_published_8b():
    s = gp.get_shape("qwen3-8b")
    # 36 layers of Qwen3-8B plus its untied LM head: ~7.57 B streamed parameters -> ~3.15 ms at 4.8 TB/s
    assert 7.5e9 < s.streamed_weight_bytes() / 2 < 7.65e9
    assert s.kv_bytes_per_token() == 2 * 36 * 2 * 8 * 128


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load_in_both_formats_with_provenance(name):
    add = resolve_cost_profile(name)
    t = sps_mod.load_sps(add)
    assert isinstance(t, sps_mod.SpsTableAdditive)
    one_d = add.with_name(f"{name}.1d.json")
    assert "bias_seconds" not in one_d.read_text() and isinstance(sps_mod.load_sps(one_d), sps_mod.SpsTable1D)
    for p in (add, one_d):  # the SGLang-strict ingest parser accepts them (no rejects)
        b = parse_sps_table(p.read_bytes(), source=str(p), run_id="x")
        assert not len(b.tables.get("rejects", [])) and len(b.tables["sps_tables"])
    man = json.loads(add.with_name(add.name + ".manifest.json").read_text())
    prov = man["provenance"]
    for k in ("gpu", "driver", "torch", "cuda", "date_utc", "copy_bandwidth_bytes_per_s"):
        assert prov.get(k), k
    assert man["shape"]["name"] == name.removeprefix("h200-") and man["context_len"] >= 512
    # the fitted table reproduces the measured cells it was fitted on
    cells = profiler.cells_from_measurements(man)
    assert profiler.fit_report(t, cells)["median_rel_err"] < 0.02
    # step time grows with verify tokens at a large batch: the regime where trimming pays
    assert t.step_seconds(64, 64 * 7) > 1.3 * t.step_seconds(64, 0)


def test_write_measured_profile_round_trips(tmp_path):
    man = json.loads((PROFILE_DIR / "h200-qwen3-8b.json.manifest.json").read_text())
    doc = {"provenance": man["provenance"], "results": [{k: man[k] for k in
                                                           ("shape", "target_layers", "draft_layers", "gamma",
                                                            "context_len", "cells", "bound")}]}
    out = tmp_path / "p.json"
    m2 = profiler.write_measured_profile(doc, out, shape="qwen3-8b")
    # the fit is lstsq: its last bits follow the machine's BLAS, so the committed table is matched to a tolerance
    assert_json_close(out.read_text(), (PROFILE_DIR / "h200-qwen3-8b.json").read_text(), rtol=1e-9)
    assert_json_close((tmp_path / "p.1d.json").read_text(), (PROFILE_DIR / "h200-qwen3-8b.1d.json").read_text(),
                      rtol=1e-9)
    assert m2["tables"]["diagonal"]["path"] == "p.1d.json" and (tmp_path / "p.json.manifest.json").is_file()
    with pytest.raises(ValueError, match="name exactly one"):
        profiler.write_measured_profile(doc, out, shape="qwen3-32b")


def test_vclock_check_relative_errors():
    t = sps_mod.SpsTableAdditive(0.010, [1, 64], [0.0, 0.004], [1, 512], [0.0, 0.010])
    pred = t.step_seconds(64, 100) * 1e3
    r = profiler.vclock_check([{"bs": 64, "batch_tokens": 164, "step_ms": pred * 1.1}], t)
    assert r["median_rel_err"] == pytest.approx(1 - 1 / 1.1)
    assert r["mean_bias_rel"] < 0


def test_calibration_split_is_disjoint():
    audit = load_prompts("mixed", 16)
    cal = load_prompts("mixed", 8, offset=16)
    assert not {(p.workload, p.prompt_index) for p in audit} & {(p.workload, p.prompt_index) for p in cal}
    assert {p.prompt_index for p in cal if p.workload == "math"} == {16, 17}
    assert [p.text for p in load_prompts("math", 6)][4:] == [p.text for p in load_prompts("math", 2, offset=4)]


def test_calibration_split_is_text_disjoint():
    """The generators repeat texts (chat has under 300 distinct prompts): the split skips audited texts."""
    audit = {p.text for p in load_prompts("chat,poetry", 60)}
    naive = load_prompts("chat,poetry", 40, offset=60)
    assert any(p.text in audit for p in naive)  # what index-disjointness alone lets through
    cal, pool = disjoint_prompts("chat,poetry", 40, 60)
    assert len(cal) == 40 and not {p.text for p in cal} & audit and len({p.text for p in cal}) == 40
    assert sum(p.workload == "chat" for p in cal) == 20 and min(p.prompt_index for p in cal) >= 60
    served = {(p.workload, p.prompt_index): p.text for p in load_prompts("chat,poetry", pool, offset=60)}
    assert all(served[(p.workload, p.prompt_index)] == p.text for p in cal)


def test_engine_virtual_clock_charges_the_profile_for_executed_tokens(tmp_path):
    td, dd = save_tiny_pair(tmp_path, gamma=4)
    db = tmp_path / "v.duckdb"
    table = sps_mod.load_sps(resolve_cost_profile("h200-qwen3-8b"))
    out = {}
    for arm in ("compact", "cap-accept"):
        s = run_engine(EngineConfig(arm=arm, target=str(td), drafter=str(dd), workload="math,chat", num_requests=6,
                                    max_new_tokens=12, max_running_requests=3, cost_profile="h200-qwen3-8b",
                                    db=str(db), run_id=f"v-{arm}", threads=1))
        assert s.clock == "modeled" and s.modeled_s > 0
        steps = Reader(db).df("SELECT s.forward_ct, s.bs, s.executed_verify_tokens AS x, s.modeled_step_ms, s.budget, "
                              "sum(r.prefix_len) AS ctx FROM steps s JOIN request_steps r USING (run_id, forward_ct) "
                              "WHERE run_id = ? GROUP BY ALL ORDER BY s.forward_ct", [f"v-{arm}"])
        # the table's time for the executed tokens + the requests' own contexts (prefix_len) relative to the
        # profiled one, at the manifest's measured per-batch context cost (interpolated in log2 bs)
        ct = json.loads((PROFILE_DIR / "h200-qwen3-8b.json.manifest.json").read_text())["context_term"]
        kv = lambda bs: float(np.interp(np.log2(bs), np.log2(ct["bs"]), ct["ms_per_context_token"]))  # noqa: E731
        exp = [table.step_seconds(int(r.bs), int(r.x) - int(r.bs)) * 1e3
               + kv(int(r.bs)) * (int(r.ctx) - int(r.bs) * ct["ref_context"]) for r in steps.itertuples()]
        assert all(e < table.step_seconds(int(r.bs), int(r.x) - int(r.bs)) * 1e3
                   for e, r in zip(exp, steps.itertuples()))  # the tiny engine's contexts are short of 1024
        assert steps["modeled_step_ms"].tolist() == pytest.approx(exp)
        assert s.modeled_s == pytest.approx(sum(exp) / 1e3)
        out[arm] = steps
    # cap-accept runs every row: its clock charges the full width
    assert (out["cap-accept"]["x"] == out["cap-accept"]["bs"] * 5).all()
    cfg = json.loads(Reader(db).df("SELECT config_json FROM runs WHERE run_id = 'v-compact'")["config_json"][0])
    assert cfg["clock"] == "modeled" and cfg["sps_path"].endswith("h200-qwen3-8b.json")
    assert cfg["clock_ref_context"] == 1024 and cfg["clock_context_term"] == "context sweep"


def test_varlen_layout_packs_each_request_behind_its_own_context():
    lay = gp.varlen_layout([2, 1, 3], [4, 0, 2])
    assert lay["cu_q"] == [0, 2, 3, 6] and lay["cu_k"] == [0, 6, 7, 12]
    assert lay["pos"] == [4, 5, 0, 2, 3, 4] and lay["kidx"] == [4, 5, 6, 9, 10, 11]
    with pytest.raises(ValueError, match="bad request layout"):
        gp.varlen_layout([0], [3])


def test_varlen_stack_reads_only_each_requests_own_segment():
    """Changing another request's context rows leaves a request's attention output unchanged."""
    torch.manual_seed(0)
    s = gp.get_shape("tiny")
    lay = gp.varlen_layout([2, 3], [4, 2])
    st = gp.VarlenStack(gp.Decoder(s, 1, 1, 1, 3, torch.device("cpu"), torch.float32), 32, 8)
    q = torch.randn(5, s.heads, s.head_dim)
    a = gp._attn_varlen_ref(q, st.kc[0], st.vc[0], lay["cu_q"], lay["cu_k"], st.scale)
    st.kc[0][6:9] += 5.0  # request 1's context
    b = gp._attn_varlen_ref(q, st.kc[0], st.vc[0], lay["cu_q"], lay["cu_k"], st.scale)
    torch.testing.assert_close(a[:2], b[:2])
    assert not torch.allclose(a[2:], b[2:])
    # request 0 against a hand-written softmax over its 6 keys (4 context + 2 block rows)
    grp = s.heads // s.kv_heads
    K, V = st.kc[0][0:6].repeat_interleave(grp, 1), st.vc[0][0:6].repeat_interleave(grp, 1)
    ref = torch.softmax(torch.einsum("thd,khd->htk", q[:2], K) * st.scale, -1)
    torch.testing.assert_close(a[:2], torch.einsum("htk,khd->thd", ref, V), rtol=1e-4, atol=1e-5)


def test_ragged_replay_times_recorded_contexts_and_the_reference_context_on_cpu():
    gp._VFNS["attn"] = "reference"
    sets = [{"windows": [3, 0], "contexts": [5, 12], "run_id": "r"}, {"windows": [7], "contexts": [20]}]
    out = gp.replay_ragged(gp.get_shape("tiny"), sets, gamma=7, draft_layers=1, ref_context=16, reps=1,
                           device="cpu", log=lambda m: None)
    r = out["replays"]
    assert [x["batch_tokens"] for x in r] == [5, 8] and [x["context_sum"] for x in r] == [17, 20]
    assert r[0]["run_id"] == "r" and all(x["step_ms"] > 0 and x["step_ms_ref_ctx"] > 0 for x in r)
    with pytest.raises(ValueError, match="contexts"):
        gp.replay_ragged(gp.get_shape("tiny"), [{"windows": [1], "contexts": []}], device="cpu")


def test_vclock_check_separates_the_context_term():
    t = sps_mod.SpsTableAdditive(0.010, [1, 64], [0.0, 0.004], [1, 512], [0.0, 0.010])
    clock = profiler.StepClock(t, ref_context=1024, kv_bs=(1, 256), kv_ms=(1e-4, 1e-4))
    base = t.step_seconds(64, 100) * 1e3
    meas = base - 1e-4 * 64 * (1024 - 50)  # exactly the clock's context-aware time
    r = profiler.vclock_check([{"bs": 64, "batch_tokens": 164, "context_sum": 64 * 50, "step_ms": meas,
                                "step_ms_ref_ctx": base}], t, clock)
    assert r["clock"]["median_rel_err"] == pytest.approx(0, abs=1e-12)
    assert r["ref_ctx"]["median_rel_err"] == pytest.approx(0, abs=1e-12)
    assert r["mean_bias_rel"] > 0  # the table alone over-predicts short contexts


def test_context_term_is_fitted_per_batch_from_the_sweep():
    rows = [{"bs": bs, "context_sum": bs * c, "step_ms": 10.0 + k * bs * (c - 1024), "step_ms_ref_ctx": 10.0}
            for bs, k in ((1, 1e-3), (64, 7e-5)) for c in (64, 256)]
    ct = profiler.fit_context_term(rows, 1024)
    assert ct["bs"] == [1, 64] and ct["ms_per_context_token"] == pytest.approx([1e-3, 7e-5])
    clock = profiler.StepClock(sps_mod.SpsTableAdditive(0.010, [1, 64], [0.0, 0.004], [1, 512], [0.0, 0.010]),
                               1024, tuple(ct["bs"]), tuple(ct["ms_per_context_token"]))
    assert clock.kv_ms_per_token(8) == pytest.approx(1e-3 + (7e-5 - 1e-3) * 0.5)  # halfway in log2 bs
    assert clock.kv_ms_per_token(512) == pytest.approx(7e-5)  # clamped
    with pytest.raises(ValueError, match="no step"):
        profiler.fit_context_term([{"bs": 1, "context_sum": 1024, "step_ms": 1, "step_ms_ref_ctx": 1}], 1024)


def test_unknown_cost_profile_names_the_shipped_ones():
    with pytest.raises(FileNotFoundError, match="h200-qwen3-8b"):
        resolve_cost_profile("h100-nope")


def test_audit_defaults_put_the_regime_in_force():
    from acceptscope.audit import AUDIT_DEFAULTS, effective_options

    o = effective_options({})
    assert o == {"cost_profile": AUDIT_DEFAULTS["cost_profile"], "max_running_requests": 64, "sts": "calibrate"}
    assert "cost_profile" not in effective_options({"sps": "default"})
    assert "cost_profile" not in effective_options({"cost_profile": "none"})
    assert "sts" not in effective_options({"sts": "none"})
    assert effective_options({"max_running_requests": 8})["max_running_requests"] == 8


def test_a_file_from_before_the_virtual_clock_still_reads_and_is_upgraded_on_write(tmp_path):
    import duckdb

    from acceptscope.store import Store

    p = tmp_path / "old.duckdb"
    Store(p)
    con = duckdb.connect(str(p))
    con.execute("ALTER TABLE steps DROP COLUMN modeled_step_ms")
    con.close()
    assert "modeled_step_ms" not in Reader(p).step_costs(["x"]).columns  # read-only: no migration, no error
    Store(p)  # a writer adds the nullable columns added since
    assert "modeled_step_ms" in Reader(p).step_costs(["x"]).columns


def test_profile_cli_measures_a_shape_and_writes_both_formats(tmp_path):
    from typer.testing import CliRunner

    from acceptscope.cli import app

    out = tmp_path / "tiny.json"
    r = CliRunner().invoke(app, ["profile", "--device", "cpu", "--shape", "tiny", "--batch-sizes", "1,2,4",
                                 "--fracs", "0,0.5,1", "--context-len", "8", "--steps", "2", "--draft-layers", "1",
                                 "--out", str(out), "--json"])
    assert r.exit_code == 0, r.output
    man = json.loads((tmp_path / "tiny.json.manifest.json").read_text())
    assert man["shape"]["name"] == "tiny" and man["provenance"]["torch"] == torch.__version__
    assert len(man["cells"]) == 9 and (tmp_path / "tiny.cells.json").is_file()
    assert isinstance(sps_mod.load_sps(out), sps_mod.SpsTableAdditive)
    assert isinstance(sps_mod.load_sps(tmp_path / "tiny.1d.json"), sps_mod.SpsTable1D)
    bad = CliRunner().invoke(app, ["profile", "--device", "cpu", "--shape", "qwen9", "--out", str(out)])
    assert bad.exit_code == 2 and "unknown shape" in bad.output


def test_calibration_split_of_an_exhausted_prompt_file_is_empty(tmp_path):
    """A short file cycled past its end offers no new text: the split is empty (the audit then says so)."""
    f = tmp_path / "tiny.jsonl"
    f.write_text("".join(json.dumps({"turns": [f"prompt {i}"]}) + "\n" for i in range(3)), encoding="utf-8")
    cal, _ = disjoint_prompts(str(f), 4, 3)
    assert cal == []
    cal, _ = disjoint_prompts(str(f), 4, 2)
    assert [p.text for p in cal] == ["prompt 2"]


def test_rank_auc_counts_ties_as_half():
    assert bench_regime.auc(np.array([0.1, 0.2, 0.8, 0.9]), np.array([0, 0, 1, 1])) == pytest.approx(1.0)
    assert bench_regime.auc(np.array([0.9, 0.8, 0.2, 0.1]), np.array([0, 0, 1, 1])) == pytest.approx(0.0, abs=1e-12)
    assert bench_regime.auc(np.array([0.5, 0.5, 0.5]), np.array([0, 1, 1])) == pytest.approx(0.5)
    assert np.isnan(bench_regime.auc(np.array([0.1, 0.2]), np.array([1, 1])))


def test_regime_diagnose_separates_served_from_one_threshold_utilization(tmp_path):
    """bench/regime.py --diagnose on a real cap-accept run: served utilization is the store's, and the
    one-threshold counterfactual keeps (at least, on ties) as many drafts as the run verified."""
    td, dd = save_tiny_pair(tmp_path, gamma=4)
    db = tmp_path / "d.duckdb"
    run_engine(EngineConfig(arm="cap-accept", target=str(td), drafter=str(dd), workload="math,chat", num_requests=6,
                            max_new_tokens=12, max_running_requests=6, cost_profile="h200-qwen3-8b", db=str(db),
                            run_id="d-cap", threads=1))
    r = Reader(db)
    d = bench_regime.diagnose(r, "d-cap").set_index("workload")
    rs = r.df('SELECT q.workload, s."window" AS w, s.ceiling AS c FROM request_steps s JOIN requests q '
              "USING (run_id, rid) WHERE run_id = 'd-cap'")
    assert set(d.index) == {"math", "chat"}
    for wl, g in rs.groupby("workload"):
        assert d.loc[wl, "blocks"] == len(g)
        assert d.loc[wl, "util_served"] == pytest.approx((np.minimum(g.w, g.c) + 1).sum() / (g.c + 1).sum())
    assert (d["window_1thr"] * d["blocks"]).sum() >= rs["w"].sum()
    assert d["util_1thr"].between(0, 1).all() and d["survival_bias_max"].abs().le(1).all()
    assert d["util_nolag"].between(0, 1).all()  # the run's cost profile re-plans each step without the lag
    with pytest.raises(SystemExit, match="nope"):
        bench_regime.diagnose(r, "nope")
