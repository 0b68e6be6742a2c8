"""Audit-size advice against the widths later audits achieved: the paired grid's four large traffics.

Why: the advice (estimators/audit_size.py) predicts the audit fraction for a target width; the grid audits the
same traffic at 5-50%, so the prediction can be checked (docs/validation.md).

Usage: python bench/audit_advice_check.py [GRID_SCORE_CACHE_DIR]   (the runs under /tmp/acceptscope-grid/runs)
"""
import json, glob, os, sys
from acceptscope.store import Store
from acceptscope.estimators import run_all, to_jsonable
names = {"629888": "mixed T0.7 b64, 512 req", "74bb2d": "poetry T0.5 b32, 512 req", "866453": "gsm8k T0.9 b64, 512 req", "de192f": "mixed T0.8 b128, 2048 req"}
S = sys.argv[1] if len(sys.argv) > 1 else "/tmp/acceptscope-grid/scores/checkout-5f7433b0a92f"  # a grid score cache
print("| traffic | advice from | ±0.05 drafts | ±0.10 drafts | width achieved at 5 / 10 / 20 / 30 / 50% audit |")
print("|---|---|---|---|---|")
for d in sorted(glob.glob("/tmp/acceptscope-grid/runs/*")):
    h = os.path.basename(d)[:6]
    if h not in names: continue
    ws = []
    for f in ("0.05", "0.1", "0.2", "0.3", "0.5"):
        a = json.load(open(glob.glob(f"{S}/{h}*")[0] + f"/audit-{f}.json"))["estimate"]["tail"]["aggregate"][0]
        ws.append(f"{a['hi'] - a['lo']:.3f}")
    for src in ("compact", "audit-0.1"):
        r = to_jsonable(run_all(Store(f"{d}/{src}.duckdb", read_only=True), "c", n_boot=200))
        adv = {x["half_width"]: x for x in r["tail"]["summary"]["audit_advice"]}
        def cell(x):
            if not x["reachable"]: return "not by auditing"
            rng = x.get("fraction_range")
            return f"{x['fraction']:.0%}" + (f" ({rng[0]:.0%}-{rng[1]:.0%})" if rng else "")
        print(f"| {names[h]} | {'compact alone' if src == 'compact' else '10% audit'} | {cell(adv[0.05])} | {cell(adv[0.1])} | {' / '.join(ws)} |", flush=True)
