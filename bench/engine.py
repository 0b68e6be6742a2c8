"""Reference-engine speed: telemetry overhead (full capture vs off) and tokens/s on CPU, side by side in one run.

Usage:  .venv/bin/python bench/engine.py [--requests 64 --max-new-tokens 32 --repeats 5 --threads 1 --json]

The same greedy workload (identical tokens, hence identical steps) is served repeatedly with
the variants interleaved (each repeat runs all three in a shuffled order), so machine drift
hits all variants alike:

* ``off``: no telemetry sink at all;
* ``full``: every steps / request_steps / requests row with per-position lists, streamed into
  a DuckDB file through the store's writer;
* ``lists-off``: the same with ``--no-per-position`` (list columns NULL).

Reported: mean decode-step time per variant, the overhead ratio ``full / off`` (median over
repeats of the adjacent-pair ratio; target <= 1.05),
the same ratio of *process CPU time* per step (all threads: engine, writer, DuckDB; robust to
other processes sharing the cores, which make wall-clock A/B noisy on a 2-core box), the
instrumented in-step telemetry time as a share of step time, and tokens/s per verify mode.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--target", default="fixtures/models/target")
    ap.add_argument("--drafter", default="fixtures/models/drafter")
    ap.add_argument("--requests", type=int, default=64)
    ap.add_argument("--max-new-tokens", type=int, default=32)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args(argv)

    import torch

    torch.set_num_threads(a.threads)
    from acceptscope.engine import DEFAULT_SPS, load_models
    from acceptscope.engine.runner import Engine, RequestSpec
    from acceptscope.domain.sps import load_sps
    from acceptscope.engine.telemetry import TelemetrySink
    from acceptscope.domain.chat import format_chat
    from acceptscope.engine.tokenizer import load_tokenizer
    from acceptscope.domain.workloads import load_prompts
    from acceptscope.store import Store

    tpath, _, model, drafter = load_models(a.target, a.drafter)
    tok = load_tokenizer(tpath)
    eos = model.config.eos_token_id
    sps = load_sps(DEFAULT_SPS) if DEFAULT_SPS.exists() else None
    specs = []
    for p in load_prompts("mixed", a.requests):
        ids = tok.encode(format_chat([{"role": "user", "content": p.text}], add_generation_prompt=True),
                         add_special_tokens=False)[-192:]
        specs.append(RequestSpec(rid=f"{p.workload}-{p.prompt_index}", prompt_ids=ids,
                                 max_new_tokens=a.max_new_tokens, workload=p.workload, prompt_index=p.prompt_index))
    max_len = max(len(s.prompt_ids) for s in specs) + a.max_new_tokens + drafter.config.gamma + 2
    tmp = Path(tempfile.mkdtemp(prefix="bench_engine_"))

    def serve(mode: str, variant: str, rep: int) -> dict:
        sink = None
        if variant != "off":
            sink = TelemetrySink(Store(tmp / f"{mode}-{variant}-{rep}.duckdb"))  # fresh file per run
        eng = Engine(model, drafter, mode=mode, max_running_requests=a.batch, max_seq_len=max_len, eos_token_id=eos,
                     sps=sps, per_position=(variant == "full"), sink=sink, run_id=f"{mode}-{variant}-{rep}")
        t0 = time.perf_counter()
        c0 = time.process_time()
        res = eng.run(specs)
        if sink is not None:
            sink.close()  # includes waiting for the last commit
        wall = time.perf_counter() - t0
        cpu = time.process_time() - c0  # all threads of this process: engine, writer, DuckDB
        toks = sum(len(r.output_tokens) for r in res)
        return {"mode": mode, "variant": variant, "rep": rep, "wall_s": wall, "tokens": toks, "steps": eng.decode_steps,
                "step_ms": 1e3 * eng.decode_s / eng.decode_steps, "telemetry_ms": 1e3 * eng.telemetry_s / eng.decode_steps,
                "cpu_ms_per_step": 1e3 * cpu / eng.decode_steps,
                "tokens_per_s": toks / wall}

    import random

    rows = []
    order_rng = random.Random(0)
    serve("cap-accept", "off", -1)  # warm-up (allocator, lazy inits)
    for rep in range(a.repeats):
        variants = ["off", "full", "lists-off"]
        order_rng.shuffle(variants)  # no variant always runs first/last in a repeat
        for variant in variants:
            rows.append(serve("cap-accept", variant, rep))
            print(f"  cap-accept {variant:9s} rep {rep}: {rows[-1]['step_ms']:.1f} ms/step", file=sys.stderr)
    for mode in ("compact", "static"):
        for rep in range(a.repeats):
            rows.append(serve(mode, "full", rep))

    def agg(mode: str, variant: str, key: str) -> float:
        return statistics.mean(r[key] for r in rows if r["mode"] == mode and r["variant"] == variant)

    off = agg("cap-accept", "off", "step_ms")
    full = agg("cap-accept", "full", "step_ms")
    lists_off = agg("cap-accept", "lists-off", "step_ms")
    def paired(variant: str, key: str = "step_ms") -> float:
        """Median over repeats of the per-repeat ratio variant/off (adjacent runs share machine drift)."""
        ratios = []
        for rep in range(a.repeats):
            o = [r[key] for r in rows if r["variant"] == "off" and r["rep"] == rep and r["mode"] == "cap-accept"]
            v = [r[key] for r in rows if r["variant"] == variant and r["rep"] == rep and r["mode"] == "cap-accept"]
            ratios.append(v[0] / o[0])
        return statistics.median(ratios)

    def min_of(variant: str) -> float:
        return min(r["step_ms"] for r in rows if r["mode"] == "cap-accept" and r["variant"] == variant)

    summary = {
        "threads": a.threads, "requests": a.requests, "max_new_tokens": a.max_new_tokens, "batch": a.batch,
        "step_ms": {"off": off, "full": full, "lists-off": lists_off},
        "overhead_ratio_full_vs_off": paired("full"),
        "overhead_ratio_lists_off_vs_off": paired("lists-off"),
        # least-disturbed runs (timeit's rule): robust to other processes' bursts on shared cores
        "overhead_ratio_min_full_vs_off": min_of("full") / min_of("off"),
        "overhead_ratio_min_lists_off_vs_off": min_of("lists-off") / min_of("off"),
        "cpu_ratio_full_vs_off": paired("full", "cpu_ms_per_step"),
        "cpu_ratio_lists_off_vs_off": paired("lists-off", "cpu_ms_per_step"),
        "in_step_telemetry_share_full": agg("cap-accept", "full", "telemetry_ms") / full,
        "tokens_per_s": {m: agg(m, "full", "tokens_per_s") for m in ("cap-accept", "compact", "static")},
        "tokens_per_s_no_telemetry": agg("cap-accept", "off", "tokens_per_s"),
        "runs": rows,
    }
    if a.json:
        print(json.dumps(summary, indent=2))
    else:
        print(f"mean decode step (cap-accept): off {off:.1f} ms | full {full:.1f} ms | lists-off {lists_off:.1f} ms")
        print(f"telemetry overhead full/off = {summary['overhead_ratio_full_vs_off']:.3f}  "
              f"(lists-off/off = {summary['overhead_ratio_lists_off_vs_off']:.3f}; median of paired repeats); "
              f"min-run ratio full/off = {summary['overhead_ratio_min_full_vs_off']:.3f}; "
              f"process CPU per step full/off = {summary['cpu_ratio_full_vs_off']:.3f}; "
              f"in-step telemetry share {100 * summary['in_step_telemetry_share_full']:.1f}%")
        print("tokens/s with full telemetry: " + ", ".join(f"{m} {v:.1f}" for m, v in summary["tokens_per_s"].items())
              + f"; cap-accept without telemetry {summary['tokens_per_s_no_telemetry']:.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
