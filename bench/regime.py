"""The seeds' regime targets of issue 13, read from an audit database (no timing; ratios side by side).

    python bench/regime.py --db audit.duckdb                       # newest audit group
    python bench/regime.py --db audit.duckdb --windows out.json    # also export its compact step windows
    python bench/regime.py --db audit.duckdb --diagnose            # why a workload's utilization is low

Prints, next to the SGLang blog's figures: the compact arm's mean window per workload, the share of blocks
trimmed, utilization against the ceiling per workload, ECE after STS per position (cap-accept arm, with
the run's STS table), and compact / static throughput per batch on the virtual clock. ``--windows`` writes
the compact arm's per-step windows in the format ``acceptscope.engine.gpu_profile --windows`` replays on a
GPU (the virtual-clock check). ``--diagnose`` separates the causes of a low utilization per workload
(issue 13): the calibrated survival's per-workload bias against P(ceiling >= k), its discrimination (AUC of
survival for "ceiling >= k", mean over k), and the utilization a single survival threshold at the run's mean
window would give (the head's ranking alone, without the planner's per-step budget from lagged survival), and
the utilization of re-planning each recorded step from its current survival (is it the lag?).
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from acceptscope.domain import sps as sps_mod  # noqa: E402
from acceptscope.domain.scheduler import allocate, compute_budget  # noqa: E402
from acceptscope.figures import regime as R  # noqa: E402
from acceptscope.figures import tables as F  # noqa: E402
from acceptscope.reader import Reader, select_runs  # noqa: E402


def auc(score: np.ndarray, label: np.ndarray) -> float:
    """Rank AUC (ties averaged); NaN when one class is absent."""
    label = np.asarray(label, bool)
    npos, nneg = int(label.sum()), int((~label).sum())
    if not npos or not nneg:
        return float("nan")
    ranks = pd.Series(np.asarray(score, np.float64)).rank().to_numpy()
    return float((ranks[label].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def _mean_finite(xs: list[float]) -> float:
    ok = [x for x in xs if np.isfinite(x)]
    return float(np.mean(ok)) if ok else float("nan")


def diagnose(r: Reader, run_id: str) -> pd.DataFrame:
    """Per workload of a cap-accept run: served vs one-threshold utilization, survival bias and AUC, and
    (with the run's SPS table) the utilization of re-planning each recorded step from its current survival
    instead of the lagged one (``util_nolag``; the recorded steps, not a re-run, so an estimate)."""
    df = r.df('SELECT q.workload, s.forward_ct, s."window" AS w, s.ceiling AS c, s.survival AS s, st.budget '
              "FROM request_steps s JOIN requests q ON q.run_id = s.run_id AND q.rid = s.rid "
              "JOIN steps st ON st.run_id = s.run_id AND st.forward_ct = s.forward_ct "
              "WHERE s.run_id = ? AND s.ceiling IS NOT NULL AND s.survival IS NOT NULL "
              "ORDER BY s.forward_ct, s.req_pool_index", [run_id])
    if df.empty:
        raise SystemExit(f"{run_id}: no cap-accept steps with a ceiling and survival to diagnose")
    S = np.stack(df["s"].to_numpy()).astype(np.float64)
    c, w, wl = df["c"].to_numpy(), df["w"].to_numpy(), df["workload"].to_numpy()
    cfg = r.df("SELECT config_json FROM runs WHERE run_id = ?", [run_id])["config_json"]
    sps_path = json.loads(cfg.iloc[0] or "{}").get("sps_path") if len(cfg) else None
    w0 = None
    if sps_path and Path(sps_path).is_file():
        table, w0 = sps_mod.load_sps(sps_path), w.copy()
        for (_, budget), g in df.groupby(["forward_ct", df["budget"].isna()], sort=False):
            idx = g.index.to_numpy()
            if not budget:  # the planner ran at this step: plan it again from the current survival
                w0[idx] = allocate(S[idx], compute_budget(S[idx], table).budget)
    # one threshold over every (block, position) keeping as many drafts as the run verified
    kept = int(w.sum())
    thr = np.sort(S.reshape(-1))[::-1][kept - 1] if kept > 0 else np.inf
    w1 = (S >= thr).sum(axis=1)
    rows = []
    for name in dict.fromkeys(wl):
        m = wl == name
        reached = c[m][:, None] > np.arange(S.shape[1])[None, :]  # ceiling >= k+1: draft k accepted in full verify
        bias = S[m].mean(axis=0) - reached.mean(axis=0)
        rows.append({"workload": name, "blocks": int(m.sum()), "window": w[m].mean(), "ceiling": c[m].mean(),
                     "util_served": (np.minimum(w[m], c[m]) + 1).sum() / (c[m] + 1).sum(),
                     "window_1thr": w1[m].mean(),
                     "util_1thr": (np.minimum(w1[m], c[m]) + 1).sum() / (c[m] + 1).sum(),
                     "util_nolag": (np.nan if w0 is None
                                    else (np.minimum(w0[m], c[m]) + 1).sum() / (c[m] + 1).sum()),
                     "survival_bias_max": bias[np.argmax(np.abs(bias))],
                     "survival_auc": _mean_finite([auc(S[m][:, k], reached[:, k]) for k in range(S.shape[1])])})
    return pd.DataFrame(rows)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--audit-group", default=None)
    ap.add_argument("--windows", default=None,
                    help="write the compact arm's step windows and per-request contexts (JSON) here")
    ap.add_argument("--with-curve", action="store_true", help="--windows: also the compact curve runs' steps")
    ap.add_argument("--diagnose", action="store_true",
                    help="per workload: survival bias and AUC, and one-threshold utilization (cap-accept arm)")
    a = ap.parse_args()
    r = Reader(a.db)
    ids = select_runs(r, audit_group=a.audit_group)
    runs = r.runs().set_index("run_id").loc[ids]
    arm = {v: k for k, v in runs["arm"].items()}
    group = runs["audit_group"].iloc[0]
    cmp = R.blog_comparison(r.regime_by_workload([arm["cap-accept"]]))
    print(f"audit group {group}")
    print(cmp.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    tot = (cmp["share_trimmed"] * cmp["blocks"]).sum() / cmp["blocks"].sum()
    print(f"blocks trimmed: {tot:.1%}")
    ece = F.ece_table(F.reliability_bins(r, [arm["cap-accept"]]))
    after = ece[ece["variant"] == "after"][["position", "n", "ece"]]
    print("ECE after STS per position (cap-accept):", ", ".join(f"k={int(x.position)} {x.ece:.3f} (n={int(x.n)})"
                                                               for x in after.itertuples()))
    curve = R.curve_ratios(r.throughput_curve(f"{group}/curve"))
    if len(curve):
        print(curve.to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if a.diagnose:
        print(diagnose(r, arm["cap-accept"]).to_string(index=False, float_format=lambda x: f"{x:.3f}"))
    if a.windows:
        rids = [arm["compact"]] + ([x for x in r.runs()["run_id"] if x.startswith(f"{group}-curve-")
                                    and x.endswith("-compact")] if a.with_curve else [])
        sets = []
        for rid in rids:
            # per step, in slot order (SGLang front-packs by slot): each request's window and its context
            # (prefix_len = the tokens already in its K/V cache before this step)
            df = r.df('SELECT forward_ct, "window" AS w, prefix_len AS c FROM request_steps WHERE run_id = ? '
                      "ORDER BY forward_ct, req_pool_index", [rid])
            sets += [{"run_id": rid, "forward_ct": int(fc), "bs": len(g), "windows": [int(x) for x in g.w],
                      "contexts": [int(x) for x in g.c]} for fc, g in df.groupby("forward_ct", sort=True)]
        Path(a.windows).write_text(json.dumps(sets))
        print(f"wrote {len(sets)} step window sets (windows and contexts) of {len(rids)} runs to {a.windows}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
