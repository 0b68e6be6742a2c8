"""Issue 33 on one GPU: both DSpark arms on real SGLang 0.5.23 servers, STS fitted and loaded back.

NOT RUN YET: no device image so far can start SGLang 0.5.23 (docs/h200-live.md says why). It is the
script a device call runs once ``import sglang, sgl_kernel`` works there. ``--dry-run`` (no GPU, no
sglang) prints every server command line; that part is checked on CPU.

Steps, all into one DuckDB file (``OUT/live.duckdb``):

1. export the fixture drafter to SGLang's layout (``acceptscope.engine.sglang_export``);
2. compact then cap-accept, one after the other on one GPU (``run_sglang_audit``), the same prompts and
   seeds, no STS table; the arms get ``--attention-backend triton --sampling-backend pytorch`` so that
   neither FA3 (``sgl_kernel.flash_ops``, 342 MB) nor FlashInfer has to travel;
3. ``acceptscope calibrate`` on the cap-accept run (realized labels) -> ``OUT/sts.json``;
4. cap-accept again with ``--speculative-dspark-confidence-sts-path OUT/sts.json`` on held-out prompts
   (the next ``n`` of the workload), so its confidences are post-STS and its ceilings are the labels:
   the live held-out ECE after STS; SGLang's own ECE log (``SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS``)
   is on in both cap-accept runs.

Then, on the CPU machine: ``acceptscope estimate`` / ``report`` on the returned database.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from acceptscope.engine.sglang_export import export_drafter
from acceptscope.live import launcher
from acceptscope.live.driver import DriveConfig, load_prompts
from acceptscope.live.session import run_sglang_audit

ROOT = Path(__file__).resolve().parent.parent.parent
# what the device lacks: FA3 lives in sgl_kernel.flash_ops (not carried), FlashInfer is not carried
BACKEND_ARGS = ("--attention-backend", "triton", "--sampling-backend", "pytorch")


def _specs(target: str, drafter: str, out: Path, args: argparse.Namespace, sts: str | None = None):
    compact, cap = launcher.audit_arms(target, drafter, args.gamma, out_dir=out / "logs", base_port=args.port,
                                       sts_table_path=sts)
    for s in (compact, cap):
        s.max_running_requests = args.batch
        s.extra_args = BACKEND_ARGS + ("--mem-fraction-static", str(args.mem_fraction))
        if s.arm == "cap-accept":  # SGLang's own per-position ECE log (ignored under compact)
            s.extra_env = {**s.extra_env, "SGLANG_DSPARK_DEBUG_CONFIDENCE_METRICS": "1"}
    return compact, cap


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", required=True, help="output folder (database, STS table, logs)")
    ap.add_argument("--target", default=str(ROOT / "fixtures" / "models" / "target"))
    ap.add_argument("--drafter", default=str(ROOT / "fixtures" / "models" / "drafter"))
    ap.add_argument("--workload", default="math,chat,poetry")
    ap.add_argument("-n", "--requests", type=int, default=96)
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", default="16")
    ap.add_argument("--batch", type=int, default=48)
    ap.add_argument("--gamma", type=int, default=7)
    ap.add_argument("--port", type=int, default=30000)
    ap.add_argument("--mem-fraction", type=float, default=0.3)
    ap.add_argument("--ready-timeout", type=float, default=300.0)
    ap.add_argument("--dry-run", action="store_true", help="print the server command lines and stop")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    drafter = out / "drafter"
    summary: dict = {"export": export_drafter(a.drafter, drafter, target_dir=a.target)}
    compact, cap = _specs(a.target, str(drafter), out, a)
    if a.dry_run:
        for s in (compact, cap):
            print(json.dumps({"arm": s.arm, "argv": s.argv(), "env": s.env()}))
        return 0
    conc = tuple(int(c) for c in a.concurrency.split(","))
    drive = DriveConfig(base_url="http://127.0.0.1", run_id="", concurrency=conc, max_new_tokens=a.max_new_tokens,
                        temperature=0.0, seed=0, max_seconds=240.0)
    db = out / "live.duckdb"
    prompts = load_prompts(a.workload, a.requests)
    t0 = time.monotonic()
    res = run_sglang_audit(db, prompts, specs=[compact, cap], drive=drive, log_dir=out / "logs",
                           ready_timeout_s=a.ready_timeout, audit_group="h200-live")
    summary["audit"] = res.as_dict()
    summary["audit_s"] = round(time.monotonic() - t0, 1)
    cal = subprocess.run([sys.executable, "-m", "acceptscope.cli", "calibrate", "--db", str(db), "--run",
                          res.run_ids["cap-accept"], "--out", str(out / "sts.json"), "--json"],
                         capture_output=True, text=True)
    summary["calibrate"] = {"rc": cal.returncode, "stdout_tail": cal.stdout[-4000:], "stderr_tail": cal.stderr[-2000:]}
    if (out / "sts.json").is_file():
        _, cap_sts = _specs(a.target, str(drafter), out, a, sts=str(out / "sts.json"))
        held_out = load_prompts(a.workload, a.requests, offset=a.requests)
        t1 = time.monotonic()
        res2 = run_sglang_audit(db, held_out, specs=[cap_sts], drive=drive, log_dir=out / "logs-sts",
                                ready_timeout_s=a.ready_timeout, audit_group="h200-live-sts")
        summary["sts_run"] = res2.as_dict()
        summary["sts_run_s"] = round(time.monotonic() - t1, 1)
    (out / "summary.json").write_text(json.dumps(summary, indent=1, default=str) + "\n")
    print(json.dumps({k: summary[k] for k in summary if k != "export"}, default=str)[:6000])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
