"""Validate the SGLang production path end to end on server directories with known truth.

``fixtures/sglang/scenarios.py`` (in ``.venv-sglang``) writes directories exactly as SGLang
0.5.23's recorders and a user's poller leave them, plus the simulator's truth (the uncapped
accepted-draft count of every request-step, which no compact server records). This module
ingests each directory the way a user would (``acceptscope ingest DIR``), runs the
estimators the way ``acceptscope estimate`` / ``calibrate`` do, and scores them:

* ``compact``: a production arm alone. Tail hazards from its own observed outcomes; per-block
  coverage of the unresolved blocks, the aggregate (mean ceiling) and utilization intervals
  against the truth.
* ``cap-accept``: the audit arm of the same trajectories. Its ceiling hidden and estimated
  with hazards cross-fitted by request (:func:`estimators.validation.validate`).
* ``greedy``: greedy traffic ingested with ``--temperature 0``: trimmed blocks resolve exactly.
* ``sts``: a run served with an STS table: held-out ECE of identity, the table in force, and
  the next table (the calibrate command's fit, composed with the one in force).

Run::

    .venv-sglang/bin/python fixtures/sglang/scenarios.py /tmp/scen
    python -m acceptscope.estimators.scenario_validation /tmp/scen
"""

from __future__ import annotations

import argparse
import json
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

from acceptscope.ingest import ingest_paths
from acceptscope.store import Store
from acceptscope.estimators import load_run, run_all, sts_in_force
from acceptscope.estimators.calibration import calibration_data, compare
from acceptscope.estimators.validation import validate

LEVELS = (0.8, 0.9, 0.95)


def ingest_scenarios(root: Path, db: Path) -> dict[str, str]:
    """Each scenario directory into ``db`` as a user would; returns scenario -> run id."""
    store = Store(db)
    runs = {}
    for d in sorted(p for p in Path(root).iterdir() if p.is_dir() and p.name != "truth"):
        s = ingest_paths([d], store, progress=False, temperature=0.0 if d.name == "greedy" else None)
        if len(s["runs"]) != 1:
            raise ValueError(f"{d}: expected one server run, got {s['runs']}")
        runs[d.name] = s["runs"][0]
    return runs


def read_truth(root: Path, scenario: str) -> pd.DataFrame:
    return pd.read_json(Path(root) / "truth" / f"{scenario}.jsonl", lines=True)


def block_coverage(blocks: pd.DataFrame, levels=LEVELS) -> dict:
    """n, bias, MAE and interval coverage of censored blocks (``truth`` column), all and unresolved."""
    c = blocks[blocks.censored]
    u = c[~c.resolved.astype(bool)]
    out = dict(n_censored=len(c), n_resolved=int(c.resolved.sum()),
               resolved_exact=int((c.resolved.astype(bool) & (c["mean"] == c.truth)).sum()), n_unresolved=len(u),
               bias_unresolved=float((u["mean"] - u.truth).mean()) if len(u) else float("nan"),
               mae_unresolved=float((u["mean"] - u.truth).abs().mean()) if len(u) else float("nan"))
    for L in levels:
        t = int(round(L * 100))
        out[f"cov{t}_unresolved"] = float(((u.truth >= u[f"lo{t}"]) & (u.truth <= u[f"hi{t}"])).mean()) \
            if len(u) else float("nan")
    return out


def _with_truth(blocks: pd.DataFrame, truth: pd.DataFrame) -> pd.DataFrame:
    t = truth[["rid", "forward_ct", "ceiling"]].rename(columns={"ceiling": "truth"})
    b = blocks.drop(columns=[c for c in ("truth",) if c in blocks]).merge(t, on=["rid", "forward_ct"], how="left")
    if b.truth.isna().any():
        raise ValueError(f"{int(b.truth.isna().sum())} request-steps have no truth row")
    return b


def compact_only(store, run_id: str, truth: pd.DataFrame, n_boot: int = 200, seed: int = 0) -> dict:
    """The production arm alone: own hazards, per-block and aggregate coverage, utilization vs truth."""
    res = run_all(store, run_id, n_boot=n_boot, seed=seed)
    b = _with_truth(res["tail"].blocks, truth)
    out = {"run_id": run_id, **block_coverage(b)}
    agg = res["tail"].aggregate(level=0.95, n_boot=n_boot, seed=seed).iloc[0]
    tm = float(b.truth.mean())
    out.update(agg_est=float(agg.mean_ceiling), agg_lo=float(agg.lo), agg_hi=float(agg.hi), agg_truth=tm,
               agg_covers=bool(agg.lo <= tm <= agg.hi))
    u = res["utilization"].by_group
    u = u[u.by == "run"].iloc[0]
    tu = float(b.acc_len.sum() / (b.truth + 1).sum())
    out.update(util_est=float(u.utilization), util_lo=float(u.util_lo), util_hi=float(u.util_hi), util_truth=tu,
               util_covers=bool(u.util_lo <= tu <= u.util_hi), hazards=res["tail"].notes[-1])
    return out


def audit_arm(store, run_id: str, n_boot: int = 200, seed: int = 0) -> dict:
    """The cap-accept arm with its ceiling hidden: hazards cross-fitted by request (5 folds)."""
    data = load_run(store, run_id)
    v = validate(data["request_steps"], steps=data["steps"], n_boot=n_boot, seed=seed, by=("run_id",))
    rows = []
    for r in v.per_mode.to_dict("records"):
        rows.append({k: r[k] for k in ("mode", "n_blocks", "n_unresolved", "resolved_exact", "bias_unresolved",
                                       "mae_unresolved", "cov80_unresolved", "cov90_unresolved", "cov95_unresolved")})
    a = v.aggregate[(v.aggregate.by == "all")]
    aggs = [dict(variant=x.variant, est=float(x.mean_ceiling), lo=float(x.lo), hi=float(x.hi), truth=float(x.truth),
                 covers=bool(x.covers)) for x in a.itertuples()]
    return {"run_id": run_id, "per_mode": rows, "aggregate": aggs}


def sts_next_table(store, run_id: str, seed: int = 0, n_boot: int = 100) -> dict:
    """Held-out (by request) ECE of identity, the table in force and the next table (smooth-nll fit)."""
    data = load_run(store, run_id)
    in_force = sts_in_force(data)
    d = calibration_data(data["request_steps"], "realized", temperatures=in_force)
    tr, te = d.split(seed=seed)
    res = compare(tr, te, n_boot=n_boot, seed=seed,
                  extra_fits=None if in_force is None else {"in-force": list(in_force)})
    m = res.metrics
    per_pos = m.pivot_table(index="position", columns="method", values="ece").reset_index()
    summ = res.summary().set_index("method")
    return {"run_id": run_id, "in_force": None if in_force is None else [float(x) for x in in_force],
            "next": res.temperatures.get("smooth-nll"), "n_train": res.n_train, "n_test": res.n_test,
            "mean_ece": {k: float(summ.loc[k, "ece"]) for k in summ.index}, "per_position": per_pos}


def run(root: Path, n_boot: int = 200, seed: int = 0, db: Path | None = None) -> dict:
    """Every check of the module docstring; a dict of tables."""
    with tempfile.TemporaryDirectory(prefix="acceptscope-scen-") as tmp:
        dbp = Path(db) if db else Path(tmp) / "scenarios.duckdb"
        runs = ingest_scenarios(root, dbp)
        store = Store(dbp, read_only=True)
        out = {"runs": runs}
        if "compact" in runs:
            out["compact"] = compact_only(store, runs["compact"], read_truth(root, "compact"), n_boot, seed)
        if "cap-accept" in runs:
            out["cap-accept"] = audit_arm(store, runs["cap-accept"], n_boot, seed)
        if "greedy" in runs:
            out["greedy"] = compact_only(store, runs["greedy"], read_truth(root, "greedy"), n_boot, seed)
        if "sts" in runs:
            out["sts"] = sts_next_table(store, runs["sts"], seed)
    return out


def report(res: dict) -> str:
    """The must-show tables as text."""
    fmt = "{:.4f}".format
    lines = []
    rows = []
    for name in ("compact", "greedy"):
        if name in res:
            r = res[name]
            rows.append({"run": name, **{k: v for k, v in r.items() if k not in ("run_id", "hazards")}})
    if rows:
        lines.append("== own-hazard estimation (production arm alone) vs simulator truth; unresolved blocks")
        with pd.option_context("display.width", 250, "display.max_columns", 40, "display.float_format", fmt):
            lines.append(pd.DataFrame(rows).set_index("run").T.to_string())
    if "cap-accept" in res:
        r = res["cap-accept"]
        lines.append(f"== audit arm {r['run_id']}: ceiling hidden, hazards cross-fitted by request")
        with pd.option_context("display.width", 250, "display.max_columns", 40, "display.float_format", fmt):
            lines.append(pd.DataFrame(r["per_mode"]).to_string(index=False))
            lines.append(pd.DataFrame(r["aggregate"]).to_string(index=False))
    if "sts" in res:
        r = res["sts"]
        lines.append(f"== STS on {r['run_id']} (held out by request: train {r['n_train']}, test {r['n_test']}); "
                     "ECE 15 equal-width bins")
        lines.append("mean ECE: " + ", ".join(f"{k} {v:.4f}" for k, v in r["mean_ece"].items()))
        with pd.option_context("display.width", 250, "display.float_format", fmt):
            lines.append(r["per_position"].to_string(index=False))
        lines.append("in force: " + str([round(x, 3) for x in r["in_force"] or []]) + "  next: "
                     + str([round(x, 3) for x in r["next"] or []]))
    return "\n".join(lines)


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("root", type=Path, help="directory written by fixtures/sglang/scenarios.py")
    ap.add_argument("--n-boot", type=int, default=200)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--json", type=Path, default=None, help="also write the results as JSON")
    a = ap.parse_args(argv)
    res = run(a.root, a.n_boot, a.seed)
    print(report(res))
    if a.json:
        res_j = json.loads(json.dumps(res, default=lambda o: o.to_dict("records") if isinstance(o, pd.DataFrame)
                                      else (o.item() if isinstance(o, np.generic) else str(o))))
        a.json.write_text(json.dumps(res_j, indent=1))


if __name__ == "__main__":
    main()
