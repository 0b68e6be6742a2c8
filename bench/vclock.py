"""The virtual-clock check on a GPU: recorded ragged steps (windows AND contexts) vs the clock's prediction.

Three steps (the middle one on the GPU machine, torch only):

    python bench/vclock.py sets --recorded main.json [more.json ...] --out sets.json
    python -m acceptscope.engine.gpu_profile --shape qwen3-8b --replay-contexts sets.json --out replay.json
    python bench/vclock.py fit --replays replay.json [more.json ...] --profile fixtures/profiles/h200-qwen3-8b.json

``sets`` takes step windows + per-request contexts exported by ``bench/regime.py --windows`` (recorded runs)
and adds a *context sweep*: synthetic front-packed layouts at bs 1..256 with every context at 64 and at 256
tokens. The GPU times every set twice (its own contexts; every context at the profile's 1024).
``fit`` fits the clock's per-batch context term on the sweep ONLY, writes it into the profile's manifest
(``context_term``), and checks the clock against the recorded steps (never used in any fit): median and
p90 |error| of the table alone and of the table + context term, written to ``<profile stem>.vclock.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from acceptscope.engine import profiler  # noqa: E402
from acceptscope.domain import sps as sps_mod  # noqa: E402
from acceptscope.engine.gpu_profile import ragged_windows  # noqa: E402

SWEEP_BS = (1, 2, 4, 8, 16, 32, 64, 128, 256)
SWEEP_FRACS = (0.25, 0.75)
SWEEP_CTX = (64, 256)


def make_sets(recorded: list[str], gamma: int = 7) -> list[dict]:
    sets = []
    for path in recorded:
        sets += [dict(x, source="recorded") for x in json.loads(Path(path).read_text())]
    for bs in SWEEP_BS:
        for frac in SWEEP_FRACS:
            for c in SWEEP_CTX:
                sets.append({"source": "context-sweep", "bs": bs, "frac": frac, "contexts": [c] * bs,
                             "windows": ragged_windows(bs, int(frac * bs * gamma), gamma)})
    return sets


def fit(replay_paths: list[str], profile: str, out: str | None) -> dict:
    docs = [json.loads(Path(p).read_text()) for p in replay_paths]
    rows, sessions = [], []
    for p, d in zip(replay_paths, docs):
        r = d["results"][0]
        sessions.append({"file": Path(p).name, "provenance": d["provenance"], "attention": r.get("attention"),
                         "ref_context": r["ref_context"]})
        rows += r["replays"]
    ref = {s["ref_context"] for s in sessions}
    if len(ref) != 1:
        raise ValueError(f"replays use different reference contexts {sorted(ref)}")
    sweep = [r for r in rows if r.get("source") == "context-sweep"]
    rec = [r for r in rows if r.get("source") == "recorded"]
    if not sweep or not rec:
        raise ValueError(f"need context-sweep and recorded rows (got {len(sweep)} and {len(rec)})")
    term = profiler.fit_context_term(sweep, ref.pop())
    term["fitted_on"] = "context-sweep rows only (synthetic uniform layouts); recorded steps are held out"
    man_path = Path(profile + ".manifest.json")
    man = json.loads(man_path.read_text())
    man["context_term"] = term
    man_path.write_text(json.dumps(man, indent=1, sort_keys=True), encoding="utf-8")
    table = sps_mod.load_sps(profile)
    clock = profiler.StepClock.from_profile(table, profile)
    check = profiler.vclock_check(rec, table, clock)
    runs = sorted({r.get("run_id", "?") for r in rec})
    doc = {"gpu": sessions[0]["provenance"].get("gpu"), "profile": Path(profile).name,
           "what": ("virtual clock vs the same step measured on the GPU: each recorded step of a CPU run (its "
                    "front-packed verify windows and each request's own context, prefix_len) replayed as one "
                    "CUDA graph of draft + verify of the random-weight 8B-shape model, attention = "
                    "FlashAttention-2 varlen with grouped heads folded (each request reads only its own K/V). "
                    "'table' = the SPS table alone (profiled at a 1024-token context); 'clock' = table + the "
                    "context term fitted on the synthetic context sweep only; 'ref_ctx' = the same windows "
                    "with every context at 1024 (kernel agreement with the profile)"),
           "recorded_runs": runs, "sessions": sessions, "context_term": term,
           "checks": {"recorded": check}}
    out = out or str(Path(profile).with_name(Path(profile).name.removesuffix(".json") + ".vclock.json"))
    Path(out).write_text(json.dumps(doc, indent=1), encoding="utf-8")
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    s = sub.add_parser("sets")
    s.add_argument("--recorded", nargs="+", required=True)
    s.add_argument("--out", required=True)
    f = sub.add_parser("fit")
    f.add_argument("--replays", nargs="+", required=True)
    f.add_argument("--profile", default="fixtures/profiles/h200-qwen3-8b.json")
    f.add_argument("--out", default=None)
    a = ap.parse_args()
    if a.cmd == "sets":
        sets = make_sets(a.recorded)
        Path(a.out).write_text(json.dumps(sets))
        print(f"wrote {len(sets)} step sets to {a.out}")
        return 0
    doc = fit(a.replays, a.profile, a.out)
    c = doc["checks"]["recorded"]
    print(f"recorded steps {c['steps']} of {len(doc['recorded_runs'])} runs")
    for name, e in (("table alone", c), ("table + context term (clock)", c["clock"]),
                    ("table vs same windows at 1024 ctx", c["ref_ctx"])):
        print(f"  {name:36s} median {e['median_rel_err']:.1%}  p90 {e['p90_rel_err']:.1%}  "
              f"max {e['max_rel_err']:.1%}  bias {e['mean_bias_rel']:+.1%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
