"""Temperature in the logistic hazard: one-hot levels against a continuous term (issue 28), measured.

Why: production requests pick their own temperatures, and the one-hot model makes a sparse level of
each and pools any temperature its training never served. This script measures, on the paired grid's
cached cap-accept truth runs (``bench/paired_grid.py``: ``<runs>/*/truth.duckdb``, run id ``k``), the
held-out fit of each variant of :class:`acceptscope.estimators.hazard.HazardModel`:

* ``levels``: one-hot temperature levels (unseen: pooled); ``continuous``: tau and tau * logit(c);
  ``continuous+pos``: plus a tau term per cell index (temperature x position); ``no-temperature``:
  workload keys only (the reference the temperature term must beat).
* (a) ``loto``: distinct temperatures in 6 interleaved folds; each fold's runs are estimated (ceiling
  hidden) by hazards fitted on the runs at every other temperature.
* (b) ``mixed``: every run pooled as one run with per-request temperatures, cross-fitted by prompt.
* (b') ``synthetic``: a simulated run whose requests pick their own temperature (0.3-1.0 at 2 dp),
  cross-fitted by prompt and by held-out temperature.
* (c) ``single``: single-temperature runs, each cross-fitted by prompt on its own.

Scores on held-out censored blocks: the hazard's per-position log-loss and calibration (expected
calibration error over hazard deciles) at the positions the estimate predicts (walk state not known),
the predictive pmf's log-likelihood of the true ceiling on unresolved blocks, and the per-run bias of
the mean ceiling (RMS over runs). Usage::

    python bench/hazard_temperature.py [--runs /tmp/acceptscope-grid/runs] [--parts loto,mixed,single,synthetic] [--out F.json]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

from acceptscope.outputs import atomic_write
from acceptscope.store import Store
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.hazard import HazardModel
from acceptscope.estimators.synthetic import simulate
from acceptscope.estimators.tail import TailEstimator
from acceptscope.estimators.validation import hide

VARIANTS = {
    "levels": dict(temperature_model="levels"),
    "continuous": dict(temperature_model="continuous"),
    "continuous+pos": dict(temperature_model="continuous", temperature_position=True),
    "no-temperature": dict(keys=("workload",)),
}


def load_runs(root: Path) -> list[tuple[dict, pd.DataFrame]]:
    """Every cached truth run: (its configuration, its request_steps with run id ``k-<seed>``)."""
    out = []
    for d in sorted(root.iterdir()):
        if not (d / "truth.duckdb").exists():
            continue
        meta = json.loads((d / "meta.json").read_text())
        cfg = meta.get("config", meta)
        rs = Store(d / "truth.duckdb", read_only=True).read_table("request_steps", "k")
        if rs.empty or rs["ceiling"].isna().any():
            continue
        out.append((cfg, rs.assign(run_id=f"k-{cfg['seed']}")))
    return out


def _score(est: TailEstimator, test: pd.DataFrame) -> dict:
    """Held-out scores of a fitted estimator on ``test`` (ceiling hidden from the estimate)."""
    G = est.gamma_
    frame = BlockFrame.from_request_steps(test, gamma=G)
    truth = frame.ceiling.astype(np.int64)
    rows = np.flatnonzero(frame.censored)
    wk = est._walk(frame, rows, None)
    H = est.hazard.predict(frame, rows, wk["state"])
    k = np.arange(G)[None, :]
    w = frame.window[rows][:, None]
    pos = (k >= w) & (k <= truth[rows][:, None]) & (wk["state"] != 3)
    y = (k < truth[rows][:, None])[pos].astype(float)
    p = np.clip(H[pos], 1e-6, 1 - 1e-6)
    dec = np.minimum((p * 10).astype(int), 9)
    n_b = np.bincount(dec, minlength=10)
    ece = float(np.abs(np.bincount(dec, p - y, minlength=10)).sum() / max(p.size, 1))
    res = est.estimate(hide(test), gamma=G, hazard_boot=0)
    b = res.blocks
    cens = b["censored"].to_numpy()
    opn = cens & ~b["resolved"].to_numpy()
    pm = res.pmf[np.flatnonzero(opn), truth[opn]]
    err = (b["mean"].to_numpy() - truth)[cens]
    runs = b["run_id"].astype(str).to_numpy()[cens]
    by_run = pd.DataFrame(dict(run=runs, err=err)).groupby("run")["err"].agg(["sum", "size"])
    return dict(n_pos=int(p.size), pos_ll=float(np.sum(y * np.log(p) + (1 - y) * np.log1p(-p))),
                ece_sum=ece * p.size, n_open=int(opn.sum()), block_ll=float(np.log(np.maximum(pm, 1e-12)).sum()),
                bias_sum=float(err.sum()), n_cens=int(cens.sum()), run_err=by_run["sum"].to_dict(),
                run_n=by_run["size"].to_dict(), deciles=n_b.tolist())


def _merge(parts: list[dict]) -> dict:
    n_pos = sum(p["n_pos"] for p in parts)
    n_open = sum(p["n_open"] for p in parts)
    es, ns = {}, {}  # a run's blocks may be scored in several folds: its bias over all of them
    for p in parts:
        for k, v in p["run_err"].items():
            es[k], ns[k] = es.get(k, 0.0) + v, ns.get(k, 0) + p["run_n"][k]
    rb = {k: es[k] / ns[k] for k in es}
    return dict(n_pos=n_pos, pos_ll_per=sum(p["pos_ll"] for p in parts) / max(n_pos, 1),
                ece=sum(p["ece_sum"] for p in parts) / max(n_pos, 1), n_open=n_open,
                block_ll_per=sum(p["block_ll"] for p in parts) / max(n_open, 1),
                bias=sum(p["bias_sum"] for p in parts) / max(sum(p["n_cens"] for p in parts), 1),
                run_bias_rms=float(np.sqrt(np.mean(np.square(list(rb.values()))))) if rb else float("nan"),
                run_bias_mae=float(np.mean(np.abs(list(rb.values())))) if rb else float("nan"), n_runs=len(rb))


def _fit(train: pd.DataFrame, variant: str) -> TailEstimator:
    return TailEstimator(hazard=HazardModel(**VARIANTS[variant])).fit(train)


def _prompt_folds(df: pd.DataFrame, folds: int, seed: int = 0) -> np.ndarray:
    """A fold per row by prompt (rid): runs of one workload mix share prompts."""
    u = np.unique(df["rid"].astype(str))
    f = dict(zip(u[np.random.default_rng(seed).permutation(u.size)], np.arange(u.size) % folds))
    return df["rid"].astype(str).map(f).to_numpy()


def loto(runs, variants, folds: int = 6) -> dict:
    """(a) Hazards fitted on the runs at other temperatures, scored on the held-out temperatures."""
    temps = np.array([round(float(c["temperature"]), 2) for c, _ in runs])
    u = np.unique(temps)
    fold_of = dict(zip(u, np.arange(u.size) % folds))
    out = {v: [] for v in variants}
    for f in range(folds):
        te = [i for i, t in enumerate(temps) if fold_of[t] == f]
        train = pd.concat([runs[i][1] for i in range(len(runs)) if i not in te], ignore_index=True)
        test = pd.concat([runs[i][1] for i in te], ignore_index=True)
        print(f"loto fold {f}: held out T = {sorted(set(temps[te].tolist()))}", file=sys.stderr, flush=True)
        for v in variants:
            out[v].append(_score(_fit(train, v), test))
    return {v: _merge(p) for v, p in out.items()}


def mixed(runs, variants, folds: int = 5) -> dict:
    """(b) Every run pooled as one run with per-request temperatures, cross-fitted by prompt."""
    df = pd.concat([r.assign(rid=r["run_id"] + "/" + r["rid"].astype(str), run_id="mixed") for _, r in runs],
                   ignore_index=True)
    base = pd.concat([r for _, r in runs], ignore_index=True)  # the prompt (not run/prompt) decides the fold
    fold = _prompt_folds(base, folds)
    out = {v: [] for v in variants}
    for f in range(folds):
        for v in variants:
            s = _score(_fit(df[fold != f], v), df[fold == f].assign(run_id=base["run_id"][fold == f].to_numpy()))
            out[v].append(s)
    return {v: _merge(p) for v, p in out.items()}


def single(runs, variants, n: int = 6, folds: int = 5) -> dict:
    """(c) Single-temperature runs, each cross-fitted by prompt on its own (the largest ``n`` runs)."""
    big = sorted(range(len(runs)), key=lambda i: -len(runs[i][1]))[:n]
    out = {v: [] for v in variants}
    for i in big:
        r = runs[i][1]
        fold = _prompt_folds(r, folds)
        for v in variants:
            out[v] += [_score(_fit(r[fold != f], v), r[fold == f]) for f in range(folds)]
    return {v: _merge(p) for v, p in out.items()} | {"runs": [f"{runs[i][0]['workload']} T={runs[i][0]['temperature']}"
                                                             f" n={len(runs[i][1])}" for i in big]}


def synthetic(runs, variants, n: int = 1200, seed: int = 11, folds: int = 5) -> dict:
    """(b') A simulated run (:mod:`estimators.synthetic`) whose requests pick their own temperature,
    uniform on 0.3-1.0 at 2 dp (~70 sparse levels; 20% greedy): cross-fitted by prompt (``by_prompt``:
    every test temperature has training data) and by temperature (``by_temperature``: interleaved folds
    of the distinct temperatures, so each test temperature is unseen: pooled by the levels model)."""
    rng = np.random.default_rng(seed)
    T = np.round(rng.uniform(0.3, 1.0, n), 2)
    rs = simulate(n_requests=n, seed=seed, temperature=T, greedy_frac=0.2).tables["request_steps"]
    u = np.unique(T)
    tf = dict(zip(u, np.arange(u.size) % folds))
    by_t = np.array([tf.get(t, -1) for t in np.round(rs["temperature"].to_numpy(), 2)])  # greedy: -1, never held out
    keep = by_t >= 0
    return dict(by_prompt=_crossfit(rs, _prompt_folds(rs, folds), np.ones(len(rs), bool), variants),
                by_temperature=_crossfit(rs, by_t, keep, variants))


def _crossfit(df: pd.DataFrame, fold: np.ndarray, eligible: np.ndarray, variants) -> dict:
    """Each fold of the ``eligible`` rows scored by hazards fitted on every other row (rows not
    ``eligible``, e.g. greedy ones in the by-temperature folds, are always trained on, never scored)."""
    out = {v: [] for v in variants}
    for f in np.unique(fold[eligible]):
        te = fold == f
        for v in variants:
            out[v].append(_score(_fit(df[~te], v), df[te]))
    return {v: _merge(p) for v, p in out.items()}


def main(argv=None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--runs", default="/tmp/acceptscope-grid/runs")
    ap.add_argument("--parts", default="loto,mixed,single,synthetic")
    ap.add_argument("--variants", default=",".join(VARIANTS))
    ap.add_argument("--out", default=None, help="write the results as JSON here (atomic)")
    a = ap.parse_args(argv)
    variants = [v for v in a.variants.split(",") if v]
    bad = sorted(set(variants) - set(VARIANTS))
    if bad:
        ap.error(f"unknown variant(s) {bad}; known: {sorted(VARIANTS)}")
    t0 = time.time()
    runs = load_runs(Path(a.runs)) if a.parts != "synthetic" else []
    if not runs and a.parts != "synthetic":
        raise SystemExit(f"{a.runs}: no truth runs (<dir>/truth.duckdb with run k)")
    res = dict(n_runs=len(runs), n_request_steps=int(sum(len(r) for _, r in runs)))
    for part in a.parts.split(","):
        res[part] = dict(loto=loto, mixed=mixed, single=single, synthetic=synthetic)[part](runs, variants)
        print(json.dumps({part: res[part]}, indent=1, default=float), flush=True)
    res["wall_s"] = round(time.time() - t0, 1)
    if a.out:
        atomic_write(Path(a.out), json.dumps(res, indent=1, default=float) + "\n")


if __name__ == "__main__":
    main()
