"""Estimator speed and STS quality, side by side with SGLang 0.5.23's own tools, in one run.

1. Tail estimator throughput over >= 1M request-steps (synthetic, engine schema, Arrow input
   sorted as the store returns it), against SGLang's ``BlockAcceptEstimateRecorder`` fed the
   verify steps of the same stream on CPU (in ``.venv-sglang`` via a subprocess, one torch
   thread). Time basis: request-steps per second of the same stream (every request-step gets a
   predictive ceiling from us; SGLang's recorder consumes every row of a verify step), plus
   censored blocks/s (ours: censored request-steps estimated; SGLang: blocks it opened). The
   ratio is ours / SGLang's per request-step **on the same rows** (the verify steps SGLang's
   recorder consumed, estimated by ours as one run), by CPU seconds (the host is shared, so wall
   seconds are shown too but are noisier). Ours over the tiled >= 1M rows is printed beside it
   as a throughput figure only: comparing it with SGLang's rate over ~8k rows overstated the
   ratio 2-3x.
2. STS: fit time and held-out ECE (15 equal-width bins, realized label) of SGLang's
   ``fit_sts_temperatures`` (subprocess) vs our faithful grid reimplementation and the smooth
   fits, all trained on the same split.

Why more than one vocabulary (``--vocab 32,2048``): SGLang's recorder consumes full-vocabulary
target and draft logits for every verify row (softmaxes, log-probs, gathers over V), so its cost
per request-step grows with V; ours reads token ids and per-position scalars only, so its cost
does not. V=32 is the most favourable case for SGLang; 2048 is the vocabulary of acceptscope's own
reference engine (fixtures/models/*/config.json). A real Qwen3 vocabulary (151,936, 74x 2048) is
not run here (its logits for 300 steps would not fit this host's memory); since SGLang's per-row
work is O(V), its rate there would be lower than at 2048 and the ratio higher, but no number is
claimed for it. Each vocabulary is its own simulated world (same seed), so the streams differ a
little between vocabularies; within one vocabulary ours and SGLang's see the same stream.

Usage::

    .venv/bin/python bench/estimators.py [--rows 1000000] [--vocab 32,2048] [--sglang-steps 300] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pyarrow as pa

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
SGLANG_PY = ROOT / ".venv-sglang" / "bin" / "python"

_SGLANG_TAIL = r"""
import json, sys, time, types
import numpy as np, torch
from sglang.srt.speculative.dspark_components.dspark_block_accept_estimator import BlockAcceptEstimateRecorder
d = np.load(sys.argv[1])
out = sys.argv[2]
G = int(d["gamma"]); V = d["corrected"].shape[-1]
ptr = d["ptr"]; steps = []
for i in range(len(ptr) - 1):
    a, b = ptr[i], ptr[i + 1]; bs = b - a
    temps = torch.tensor(d["temp"][a:b], dtype=torch.float32)
    greedy = temps <= 0
    t1 = torch.where(greedy, torch.ones_like(temps), temps)
    steps.append(dict(forward_ct=int(d["fct"][i]), rids=[f"r{x}" for x in d["rid"][a:b]],
        draft_tokens=torch.tensor(d["draft"][a:b]), corrected_logits=torch.tensor(d["corrected"][a:b]),
        draft_temperatures=t1, greedy_mask=greedy, target_logits=torch.tensor(d["target"][a:b]).reshape(bs * (G + 1), V),
        target_temperatures=t1, truncated_sampling_mask=None, logits_adjustments_are_noop=True,
        correct_len=torch.tensor(d["cl"][a:b]), cap_trim_lens=torch.tensor(d["ct"][a:b]), bonus=torch.tensor(d["bonus"][a:b]),
        prefix_lens=torch.tensor(d["prefix"][a:b]), layout=types.SimpleNamespace(verify_lens=torch.tensor(d["vlen"][a:b]))))
torch.set_num_threads(1)
best = best_cpu = None
for rep in range(int(sys.argv[3])):  # best of N passes, a fresh recorder each
    rec = BlockAcceptEstimateRecorder(path=out, gamma=G, device="cpu")
    t0, c0 = time.perf_counter(), time.process_time()
    for s in steps:
        rec.observe_verify_step(**s)
    rec.flush()
    t, c = time.perf_counter() - t0, time.process_time() - c0
    best = t if best is None else min(best, t)
    best_cpu = c if best_cpu is None else min(best_cpu, c)
rec.drain_pending_online()
snap = rec.online_estimate()
print(json.dumps({"seconds": best, "cpu_seconds": best_cpu, "rows": int(ptr[-1]), "steps": len(steps), "online_lo": snap.cumulative_lo,
                  "online_hi": snap.cumulative_hi, "online_blocks": snap.cumulative_blocks}))
"""

_SGLANG_STS = r"""
import json, sys, time
import numpy as np, torch
from sglang.benchmark.dspark_sts_fit import fit_sts_temperatures, default_temperature_grid
z = torch.tensor(np.load(sys.argv[1])); y = torch.tensor(np.load(sys.argv[2]))
t0 = time.perf_counter()
r = fit_sts_temperatures(logits=z, prefix_mask=y, grid=default_temperature_grid(), num_bins=15)
r["seconds"] = time.perf_counter() - t0
print(json.dumps(r))
"""


def _tile(rs_tbl: pa.Table, copies: int) -> pa.Table:
    """Replicate a run with distinct request ids, sorted by (rid, step) as the store returns it."""
    parts = []
    for c in range(copies):
        rid = pa.compute.binary_join_element_wise(rs_tbl.column("rid").cast(pa.string()), pa.scalar(f"c{c}"), "_")
        parts.append(rs_tbl.set_column(rs_tbl.schema.get_field_index("rid"), "rid", rid))
    t = pa.concat_tables(parts)
    return t.sort_by([("rid", "ascending"), ("step_index", "ascending")])


def _timed(f, repeats: int):
    """Best-of-``repeats`` wall and CPU seconds of ``f()`` (the host is shared: take the
    least-disturbed pass), and its last result."""
    wall = cpu = np.inf
    for _ in range(repeats):
        t0, c0 = time.perf_counter(), time.process_time()
        res = f()
        wall, cpu = min(wall, time.perf_counter() - t0), min(cpu, time.process_time() - c0)
    return wall, cpu, res


def bench_tail(rows: int, sglang_steps: int, seed: int = 0, repeats: int = 3, vocab: int = 32,
               base_requests: int = 400, sglang: bool = True) -> dict:
    from acceptscope.estimators.synthetic import compact_view, simulate
    from acceptscope.estimators.tail import TailEstimator

    base = simulate(n_requests=base_requests, seed=seed, keep_step_tensors=True, vocab=vocab)
    train = simulate(n_requests=base_requests, seed=seed + 1, vocab=vocab)
    est = TailEstimator().fit(train.tables["request_steps"])
    comp = compact_view(base.tables["request_steps"])
    tbl = pa.Table.from_pandas(comp, preserve_index=False)
    copies = int(np.ceil(rows / tbl.num_rows))
    big = _tile(tbl, copies)
    out = {"rows": big.num_rows, "base_rows": tbl.num_rows, "vocab": vocab}
    # Arrow in (as the store returns it), frame build included
    best, best_cpu, res = _timed(lambda: est.estimate(big, gamma=base.gamma), repeats)
    ncens = int(res.blocks.censored.sum())
    out.update(seconds=best, cpu_seconds=best_cpu, censored_blocks=ncens, repeats=repeats,
               ours_rows_per_s=big.num_rows / best, ours_blocks_per_s=ncens / best,
               ours_rows_per_cpu_s=big.num_rows / best_cpu, ours_blocks_per_cpu_s=ncens / best_cpu)
    del big, res  # SGLang's logits below are large at big vocabularies
    if not sglang:  # ours only, on the same prefix rows SGLang's recorder would consume
        fcts = {s["forward_ct"] for s in base.meta["step_tensors"][:sglang_steps]}
        sub_tbl = pa.Table.from_pandas(comp[comp.forward_ct.isin(fcts)], preserve_index=False)
        t4, c4, _ = _timed(lambda: est.estimate(sub_tbl, gamma=base.gamma), repeats)
        out.update(sglang_error="skipped (--no-sglang)", ours_same_stream_rows=sub_tbl.num_rows,
                   ours_same_stream_rows_per_cpu_s=sub_tbl.num_rows / c4)
        return out
    # SGLang's recorder on the first `sglang_steps` verify steps of the same base stream
    if SGLANG_PY.exists():
        st = base.meta["step_tensors"][:sglang_steps]
        cat = lambda k: np.concatenate([s[k] for s in st])
        with tempfile.TemporaryDirectory() as td:
            npz = Path(td) / "steps.npz"
            np.savez(npz, gamma=base.gamma, ptr=np.concatenate([[0], np.cumsum([len(s["rids"]) for s in st])]),
                     fct=np.array([s["forward_ct"] for s in st]), rid=cat("rids"), draft=cat("draft_tokens"),
                     corrected=cat("corrected_logits"), target=cat("target_logits"), temp=cat("temperature"),
                     cl=cat("correct_len"), ct=cat("cap_trim"), bonus=cat("bonus"), prefix=cat("prefix_lens"),
                     vlen=cat("verify_lens"))
            jl = Path(td) / "est.jsonl"
            r = subprocess.run([str(SGLANG_PY), "-c", _SGLANG_TAIL, str(npz), str(jl), str(repeats)], capture_output=True, text=True,
                               timeout=3000)
            if r.returncode != 0:
                out["sglang_error"] = r.stderr[-1500:]
            else:
                sg = json.loads(r.stdout.strip().splitlines()[-1])
                lines = jl.read_text().splitlines()
                opened = sum(1 for x in lines if '"q_lp"' in x)
                # our estimator on exactly that stream prefix (same rows), for a like-for-like check
                fcts = {s["forward_ct"] for s in st}
                sub = comp[comp.forward_ct.isin(fcts)]
                sub_tbl = pa.Table.from_pandas(sub, preserve_index=False)
                t4, c4, r2 = _timed(lambda: est.estimate(sub_tbl, gamma=base.gamma), repeats)
                out.update(sglang_seconds=sg["seconds"], sglang_cpu_seconds=sg["cpu_seconds"], sglang_rows=sg["rows"],
                           sglang_steps=sg["steps"], sglang_rows_per_s=sg["rows"] / sg["seconds"],
                           sglang_rows_per_cpu_s=sg["rows"] / sg["cpu_seconds"], sglang_blocks_opened=opened,
                           sglang_blocks_per_s=opened / sg["seconds"], sglang_blocks_per_cpu_s=opened / sg["cpu_seconds"],
                           ours_same_stream_rows_per_s=len(sub) / t4, ours_same_stream_rows_per_cpu_s=len(sub) / c4,
                           ours_same_stream_censored=int(r2.blocks.censored.sum()))
                # the ratio compares the SAME rows (the prefix SGLang's recorder consumed); the tiled
                # big-stream rate is a different workload (fixed costs amortised) and only shown beside it
                out["ratio_rows_per_s"] = out["ours_same_stream_rows_per_s"] / out["sglang_rows_per_s"]
                out["ratio_rows_per_cpu_s"] = out["ours_same_stream_rows_per_cpu_s"] / out["sglang_rows_per_cpu_s"]
                out["ratio_big_stream_vs_sglang_rows_per_cpu_s"] = out["ours_rows_per_cpu_s"] / out["sglang_rows_per_cpu_s"]
                # cross-check: our recomputation of SGLang's bracket from its own JSONL
                import pandas as pd

                from acceptscope.estimators.bracket import bracket_from_jsonl

                recs = [json.loads(x) for x in lines]
                rows_ = pd.DataFrame([dict(run_id="r", rid=x["rid"], fct=x["fct"], w=x["w"], cl=x["cl"], ct=x["ct"],
                                           trimmed_tokens=x.get("trimmed_tokens"), q_lp=x.get("q_lp")) for x in recs if "fct" in x])
                pg = pd.DataFrame([dict(run_id="r", rid=x["rid"], block_fct=e[0], offset=e[1], p_lp=e[2], trimmed_token=e[3],
                                        realized_token=e[4]) for x in recs if "pg" in x for e in x["pg"]])
                br = bracket_from_jsonl(rows_, pg, gamma=base.gamma)
                out["sglang_jsonl_blocks"] = int((br.category != "exact_in_window").sum())
                out["sglang_jsonl_mean_lo"], out["sglang_jsonl_mean_hi"] = float(br.lo.mean()), float(br.hi.mean())
                # SGLang's own online aggregate over the same blocks (pending ones drained "at end")
                out["sglang_online_lo"], out["sglang_online_hi"] = sg["online_lo"], sg["online_hi"]
                out["sglang_online_blocks"], out["sglang_jsonl_rows"] = sg["online_blocks"], len(br)
    else:
        out["sglang_error"] = f"{SGLANG_PY} not found"
    return out


def bench_sts(seed: int = 0) -> dict:
    from acceptscope.estimators.calibration import StsCalibrator, calibration_data, survival
    from acceptscope.estimators.calibration_metrics import ece
    from acceptscope.estimators.synthetic import simulate

    d = calibration_data(simulate(n_requests=2000, seed=seed + 7).tables["request_steps"])
    tr, te = d.split(seed=seed)
    out = {"n_train": len(tr.z), "n_test": len(te.z), "label": d.label}

    def held(T):
        S = survival(te.z, T)
        e = [ece(S[:, k], te.y[:, k]) for k in range(S.shape[1])]
        return float(np.mean(e)), e

    fits = {}
    for m in ("sequential-ece", "smooth-nll", "smooth-brier"):
        t0 = time.perf_counter()
        c = StsCalibrator(m).fit(tr.z, tr.y)
        fits[f"ours:{m}"] = dict(seconds=time.perf_counter() - t0, temperatures=c.temperatures_)
    if SGLANG_PY.exists():
        with tempfile.TemporaryDirectory() as td:
            np.save(Path(td) / "z.npy", tr.z.astype(np.float32))
            np.save(Path(td) / "y.npy", tr.y.astype(np.float32))
            r = subprocess.run([str(SGLANG_PY), "-c", _SGLANG_STS, str(Path(td) / "z.npy"), str(Path(td) / "y.npy")],
                               capture_output=True, text=True, timeout=3000)
            if r.returncode == 0:
                sg = json.loads(r.stdout.strip().splitlines()[-1])
                fits["sglang:dspark_sts_fit"] = dict(seconds=sg["seconds"], temperatures=sg["temperatures"])
            else:
                out["sglang_error"] = r.stderr[-1500:]
    else:
        out["sglang_error"] = f"{SGLANG_PY} not found: SGLang's grid is represented by our reimplementation only"
    fits["identity"] = dict(seconds=0.0, temperatures=[1.0] * tr.z.shape[1])
    for k, v in fits.items():
        v["held_out_ece_mean"], v["held_out_ece"] = held(v["temperatures"])
    out["fits"] = fits
    return out


def _print_tail(t: dict) -> None:
    print(f"tail, vocab {t['vocab']}: {t['rows']} request-steps ({t['base_rows']}-row stream tiled), "
          f"{t['censored_blocks']} censored blocks, point estimates + per-block 80/90/95% intervals")
    print(f"  ours (1 thread)       : {t['ours_rows_per_cpu_s']:>10,.0f} request-steps/CPU-s  "
          f"{t['ours_blocks_per_cpu_s']:>9,.0f} censored blocks/CPU-s  ({t['cpu_seconds']:.2f} CPU-s; "
          f"wall {t['seconds']:.2f}s = {t['ours_rows_per_s']:,.0f} rows/s)")
    if "sglang_rows_per_s" not in t:
        if "ours_same_stream_rows" in t:
            print(f"  ours on the {t['ours_same_stream_rows']}-row prefix SGLang's recorder would consume: "
                  f"{t['ours_same_stream_rows_per_cpu_s']:,.0f} request-steps/CPU-s")
        print("  SGLang:", t.get("sglang_error", "")[:300])
        return
    print(f"  SGLang recorder (CPU) : {t['sglang_rows_per_cpu_s']:>10,.0f} request-steps/CPU-s  "
          f"{t['sglang_blocks_per_cpu_s']:>9,.0f} opened blocks/CPU-s    ({t['sglang_cpu_seconds']:.2f} CPU-s for "
          f"{t['sglang_rows']} rows / {t['sglang_steps']} steps; wall {t['sglang_rows_per_s']:,.0f} rows/s)")
    print(f"  ours on that same {t['sglang_rows']}-row prefix: {t['ours_same_stream_rows_per_cpu_s']:,.0f} request-steps/CPU-s")
    print(f"  ratio ours/SGLang on the same {t['sglang_rows']} rows: {t['ratio_rows_per_cpu_s']:.1f}x by CPU time "
          f"({t['ratio_rows_per_s']:.1f}x by wall time); ours over {t['rows']} rows vs SGLang's {t['sglang_rows']} "
          f"(different rows, not a ratio claim): {t['ratio_big_stream_vs_sglang_rows_per_cpu_s']:.0f}x")
    print(f"  issue 15 targets: same rows >= 100x SGLang's recorder at V=2048: "
          f"{'met' if t['ratio_rows_per_cpu_s'] >= 100 else 'NOT met'} ({t['ratio_rows_per_cpu_s']:.1f}x at V={t['vocab']}); "
          f">= 1M request-steps/CPU-s over the tiled rows: {'met' if t['ours_rows_per_cpu_s'] >= 1e6 else 'NOT met'}")
    print(f"  bracket from SGLang's JSONL (ours): mean [{t['sglang_jsonl_mean_lo']:.4f}, {t['sglang_jsonl_mean_hi']:.4f}] "
          f"over {t['sglang_jsonl_rows']} rows; SGLang's online aggregate: [{t['sglang_online_lo']:.4f}, "
          f"{t['sglang_online_hi']:.4f}] over {t['sglang_online_blocks']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rows", type=int, default=1_000_000)
    ap.add_argument("--sglang-steps", type=int, default=300)
    ap.add_argument("--vocab", default="32,2048",
                    help="comma-separated synthetic vocabularies (SGLang's recorder cost grows with V; ours does not)")
    ap.add_argument("--base-requests", type=int, default=400,
                    help="requests in the simulated base stream (tiled to --rows; its logits are kept for SGLang)")
    ap.add_argument("--repeats", type=int, default=3, help="best of N timed passes, ours and SGLang's alike")
    ap.add_argument("--skip-sts", action="store_true")
    ap.add_argument("--no-sglang", action="store_true",
                    help="ours only (the tiled rows and the same prefix rows): e.g. two trees side by side")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    res = {"tail": [bench_tail(a.rows, a.sglang_steps, repeats=a.repeats, vocab=int(v), base_requests=a.base_requests,
                               sglang=not a.no_sglang)
                    for v in a.vocab.split(",")]}
    for t in res["tail"]:
        _print_tail(t)
    if not a.skip_sts:
        res["sts"] = bench_sts()
        s = res["sts"]
        print(f"STS (label {s['label']}, train {s['n_train']}, held-out {s['n_test']}):")
        for k, v in s["fits"].items():
            print(f"  {k:24s} fit {v['seconds']:.3f}s  held-out ECE(15w) mean over positions {v['held_out_ece_mean']:.4f}")
    if a.json:
        a.json.write_text(json.dumps(res, indent=2, default=float))


if __name__ == "__main__":
    main()
