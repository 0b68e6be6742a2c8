"""Validation harness: hide the ceiling of truth-bearing traffic, estimate as if compact, compare.

Why: the tail estimator's intervals are only worth something if they cover. A cap-accept
run (or synthetic truth) records the uncapped ceiling of every request-step; this module
hides it, plus everything a compact run would not have (``cap_trim`` beyond the bonus
row, target log-probs beyond the ``window + 1`` verified rows; for the confidence-only
mode all log-probs), fits the hazards on one split of requests and estimates on the
other (cross-fitting), and reports per mode (greedy / sampled-with-logprobs /
confidence-only): bias, MAE, coverage at nominal 80/90/95% (over all censored blocks and
over the *unresolved* ones, whose ceiling the data do not determine), interval width;
aggregate 95% intervals per group (run, workload, batch band) against the true group mean,
with the count of covering groups and its binomial reading; and SGLang's bracket on the same
blocks where it exists (pooled and per run).

Randomized intervals (the default; see :class:`~estimators.tail.TailEstimator`) are reported
twice: ``cov*`` is the coverage of the drawn intervals, ``ecov*`` its expectation over the
interval's own randomization given the truths (the same coverage probability, without the
Monte Carlo noise of one draw per block: on a few hundred blocks that noise alone is about
one percentage point of standard error).

Folds are by prompt (``rid``): runs of one workload mix share prompts across seeds and arms.

**The model's misfit, measured out of sample** (:func:`misfit_terms`). Blocks of one request share a prompt
the hazards do not see, and blocks of one run share a configuration the keyed model fits only on average,
so per-block imputation noise alone under-states a group's uncertainty (pooled over the score split's 44
runs, 51 of 61 aggregate groups covered). The cross-fitted residuals (truth minus the out-of-fold predicted
mean) measure both: ``phi``, the request-level over-dispersion (summed residual squared over summed
predictive variance, per request), scales the imputation noise; ``tau``, a run-level random effect per
censored block (method of moments over (run, fold) cells, net of ``phi``), is drawn per run into the
aggregate's replicates. For run ``R`` both come from the *other* runs' residuals (leave one run out), so a
run's own truth never widens its own interval. Per-block intervals are unchanged.

Example::

    >>> from acceptscope.estimators.synthetic import simulate
    >>> from acceptscope.estimators.validation import validate
    >>> sim = simulate(n_requests=120, seed=5)
    >>> v = validate(sim.tables["request_steps"], steps=sim.tables["steps"], folds=2, n_boot=50, hazard_boot=3)
    >>> g = v.per_mode.set_index("mode").loc["greedy"]
    >>> bool(g.resolved_exact == g.n_resolved)
    True
"""

from __future__ import annotations

import argparse
import json
import tempfile
from statistics import NormalDist
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from acceptscope.ingest import ingest_paths
from acceptscope.store import Store
from acceptscope.estimators.bands import batch_band
from acceptscope.estimators.bracket import bracket_from_frame, bracket_from_jsonl
from acceptscope.estimators.frame import BlockFrame, padded
from acceptscope.estimators.hazard import KEYS, HazardModel
from acceptscope.estimators.synthetic import simulate
from acceptscope.estimators.tail import TailEstimator, TailResult, quantile_intervals

def hide(rs: pd.DataFrame, logprobs: bool = True) -> pd.DataFrame:
    """What a compact run would have recorded for the same draws (see module docstring)."""
    out = rs.copy()
    w = out["window"].to_numpy()
    cl = out["correct_drafts"].to_numpy()
    if "ceiling" in out and out["ceiling"].notna().all():
        K = out["ceiling"].to_numpy()
        out["cap_trim"] = np.minimum(K, w + 1) - cl
    out["ceiling"] = pd.array([pd.NA] * len(out), dtype="Int32")
    if logprobs and "target_logprob" in out:
        G = int(max(len(x) for x in out["draft_tokens"]))
        tl = padded(out["target_logprob"], G)
        tl[np.arange(G)[None, :] > w[:, None]] = np.nan
        out["target_logprob"] = list(tl.astype(np.float32))
    if not logprobs:
        for c in ("draft_logprob", "target_logprob", "confidence_logit"):
            if c in out:
                out[c] = None
    return out


def _cov(t, lo, hi):
    return float(np.mean((t >= lo) & (t <= hi))) if len(t) else float("nan")


def expected_cover(pmf: np.ndarray, truth: np.ndarray, levels, rule: str = "randomized") -> dict:
    """Per block, the probability that its ``rule`` interval covers ``truth``, over the interval's
    randomization (``randomized``: the upper end is ``above`` with probability ``pi``, else
    ``below``); deterministic rules give the 0/1 cover."""
    t = np.asarray(truth, float)
    out = {}
    if rule != "randomized":
        for L, (lo, hi, _) in quantile_intervals(pmf, levels, rule).items():
            out[L] = ((t >= lo) & (t <= hi)).astype(float)
        return out
    n = len(pmf)
    up = quantile_intervals(pmf, levels, rule, np.zeros(n))
    dn = quantile_intervals(pmf, levels, rule, np.ones(n))
    for L in levels:
        lo, a, ma = up[L]
        _, b, mb = dn[L]
        pi = np.where(ma > mb + 1e-12, np.clip((L - mb) / np.maximum(ma - mb, 1e-12), 0, 1), 1.0)
        out[L] = pi * ((t >= lo) & (t <= a)) + (1 - pi) * ((t >= lo) & (t <= b))
    return out


def _binom_lower_p(k: int, n: int, p: float = 0.95) -> float:
    """P(X <= k) for X ~ Binomial(n, p): how surprising so few covering groups would be."""
    from scipy.stats import binom

    return float(binom.cdf(k, n, p))


def binom_reading(k: int, n: int, p: float = 0.95) -> str:
    """'k/n covered; P(X <= k | n, p) = ...' (lower tail: how surprising so few covers would be)."""
    if n == 0:
        return "no groups"
    pv = _binom_lower_p(k, n, p)
    verdict = "consistent with" if pv >= 0.05 else "below"
    return f"{k}/{n} groups covered (nominal {p:.0%}); P(X <= {k} | n={n}, p={p}) = {pv:.3f}: {verdict} nominal"


def _mode_rows(cens: pd.DataFrame, levels) -> list[dict]:
    sel = {
        "greedy": cens[(cens.variant == "auto") & (cens["mode"] == "greedy")],
        "logprob": cens[(cens.variant == "auto") & (cens["mode"] == "logprob")],
        "confidence": cens[(cens.variant == "confidence") & (cens["mode"] == "confidence")],
    }
    rows = []
    for m, g in sel.items():
        if not len(g):
            continue
        u = g[~g.resolved]
        r = dict(mode=m, n_blocks=len(g), n_resolved=int(g.resolved.sum()), n_unresolved=len(u),
                 resolved_exact=int((g.resolved & (g["mean"] == g.truth)).sum()),
                 bias=float((g["mean"] - g.truth).mean()), mae=float((g["mean"] - g.truth).abs().mean()),
                 bias_unresolved=float((u["mean"] - u.truth).mean()) if len(u) else float("nan"),
                 mae_unresolved=float((u["mean"] - u.truth).abs().mean()) if len(u) else float("nan"))
        for L in levels:
            t = int(round(L * 100))
            r[f"cov{t}"] = _cov(g.truth, g[f"lo{t}"], g[f"hi{t}"])
            r[f"cov{t}_unresolved"] = _cov(u.truth, u[f"lo{t}"], u[f"hi{t}"])
            r[f"ecov{t}_unresolved"] = float(u[f"ecov{t}"].mean()) if len(u) else float("nan")
            r[f"mass{t}_unresolved"] = float(u[f"mass{t}"].mean()) if len(u) else float("nan")
            r[f"width{t}"] = float((g[f"hi{t}"] - g[f"lo{t}"]).mean())
        rows.append(r)
    return rows


@dataclass
class ValidationResult:
    per_mode: pd.DataFrame
    aggregate: pd.DataFrame
    bracket: pd.DataFrame
    blocks: pd.DataFrame
    notes: list[str] = field(default_factory=list)
    per_run: pd.DataFrame = field(default_factory=pd.DataFrame)

    def aggregate_reading(self, variant: str = "auto") -> str:
        a = self.aggregate
        if "variant" in a:
            a = a[a.variant == variant]
        return binom_reading(int(a.covers.sum()), len(a), 0.95)

    def targets(self) -> dict:
        """The acceptance targets, evaluated."""
        pm = self.per_mode.set_index("mode")
        out = {}
        if "greedy" in pm.index:
            g = pm.loc["greedy"]
            out["greedy_exact_on_resolved"] = bool(g.resolved_exact == g.n_resolved)
        for m in ("logprob", "confidence"):
            if m in pm.index:
                c = pm.loc[m, "cov90_unresolved"]
                out[f"{m}_cov90_unresolved_in_88_92"] = bool(0.88 <= c <= 0.92)
                if "ecov90_unresolved" in pm:
                    e = pm.loc[m, "ecov90_unresolved"]
                    out[f"{m}_ecov90_unresolved_in_88_92"] = bool(0.88 <= e <= 0.92)
        agg = self.aggregate
        if len(agg):
            a = agg[agg.variant == "auto"] if "variant" in agg else agg
            out["aggregate95_cover_rate"] = float(a.covers.mean())
            out["aggregate95_covered"] = f"{int(a.covers.sum())}/{len(a)}"
            out["aggregate95_binom_p"] = _binom_lower_p(int(a.covers.sum()), len(a), 0.95)
        if len(self.bracket):
            b = self.bracket
            out["aggregate_narrower_than_sglang_bracket"] = bool((b.our_width < b.sglang_width).all())
        return out

    def to_json(self) -> dict:
        return dict(per_mode=self.per_mode.to_dict("records"), aggregate=self.aggregate.to_dict("records"),
                    bracket=self.bracket.to_dict("records"), per_run=self.per_run.to_dict("records"),
                    targets=self.targets(), notes=self.notes)

    def report(self) -> str:
        """The must-show tables as text (pooled per mode, per run, aggregate groups, bracket)."""
        cols = ["n_blocks", "n_unresolved", "resolved_exact", "bias", "mae", "bias_unresolved", "mae_unresolved",
                "cov80_unresolved", "cov90_unresolved", "cov95_unresolved", "ecov80_unresolved",
                "ecov90_unresolved", "ecov95_unresolved", "cov90", "width90"]
        out = []
        with pd.option_context("display.width", 250, "display.max_columns", 60, "display.float_format", "{:.4f}".format):
            pm = self.per_mode.set_index("mode")
            out.append("== per mode (pooled; censored blocks; *_unresolved: ceiling not determined by the data)")
            out.append(pm[[c for c in cols if c in pm]].T.to_string())
            if len(self.per_run):
                out.append("== per run")
                out.append(self.per_run.to_string(index=False))
            a = self.aggregate
            out.append("== aggregate 95% intervals (mean ceiling, drafts) vs the true group mean")
            out.append(a[[c for c in ("variant", "by", "group", "n", "n_censored", "mean_ceiling", "lo", "hi", "truth",
                                      "width", "covers") if c in a]].to_string(index=False))
            for v in (a.variant.unique() if "variant" in a else ["auto"]):
                out.append(f"aggregate [{v}]: " + self.aggregate_reading(v))
            if len(self.bracket):
                out.append("== SGLang bracket vs ours (accept-length units; sampled rows)")
                out.append(self.bracket.to_string(index=False))
        return "\n".join(out)


def misfit_terms(blocks: pd.DataFrame) -> pd.DataFrame:
    """Per run, the over-dispersion ``phi`` and the run-level effect ``tau`` (drafts per censored block)
    measured on the *other* runs' cross-fitted residuals (see the module docstring). ``blocks``: one
    variant's scored blocks (``run_id``, ``rid``, ``fold``, ``censored``, ``mean``, ``var``, ``truth``)."""
    c = blocks[blocks.censored.to_numpy(bool)]
    res = (c["truth"] - c["mean"]).to_numpy(float)
    var = np.maximum(c["var"].to_numpy(float), 0)
    run = c["run_id"].astype(str).to_numpy()
    req = pd.DataFrame({"run": run, "rid": c["rid"].astype(str).to_numpy(), "s": res, "v": var}) \
        .groupby(["run", "rid"], sort=False).sum()
    req["s2"] = req.s ** 2
    per_req = req.groupby(level="run")[["s2", "v"]].sum()
    cell = pd.DataFrame({"run": run, "fold": c["fold"].to_numpy(), "s": res, "v": var, "n": 1.0}) \
        .groupby(["run", "fold"]).sum()
    cell["s2"], cell["n2"] = cell.s ** 2, cell.n ** 2
    per_cell = cell.groupby(level="run")[["s2", "v", "n2"]].sum()
    runs = blocks["run_id"].astype(str).unique()
    per_req, per_cell = per_req.reindex(runs, fill_value=0.0), per_cell.reindex(runs, fill_value=0.0)
    out = []
    for r in runs:  # leave run r out: its own residuals never size its own interval
        rq, cl = per_req.drop(index=r), per_cell.drop(index=r)
        phi = max(1.0, float(rq.s2.sum() / rq.v.sum())) if rq.v.sum() > 0 else 1.0
        tau2 = max(0.0, float((cl.s2.sum() - phi * cl.v.sum()) / cl.n2.sum())) if cl.n2.sum() > 0 else 0.0
        out.append(dict(run_id=r, phi=phi, tau=float(np.sqrt(tau2))))
    return pd.DataFrame(out)


def _with_misfit(blocks: pd.DataFrame, boot: dict | None, terms: pd.DataFrame, seed: int):
    """``blocks`` with the imputation variance scaled by the run's ``phi``, and the hazard-refit replicates
    with the run's effect added to its censored blocks (one stratified N(0, tau^2) draw per replicate, shuffled
    per run): every group the aggregate forms (run, workload, batch band) then carries the runs it holds."""
    t = terms.set_index("run_id")
    run = blocks["run_id"].astype(str)
    blocks = blocks.assign(var=blocks["var"].to_numpy(float) * run.map(t.phi).fillna(1.0).to_numpy())
    if boot is None:
        return blocks, boot
    R = boot["means"].shape[0]
    z = np.array([NormalDist().inv_cdf((i + 0.5) / R) for i in range(R)])
    rng = np.random.default_rng(seed + 7)
    codes, uniq = pd.factorize(run)
    effects = np.stack([rng.permutation(z) * float(t.tau.get(u, 0.0)) for u in uniq], 1)  # (R, runs)
    cens = blocks["censored"].to_numpy(bool)
    return blocks, dict(boot, means=boot["means"] + effects[:, codes] * cens[None, :])


def _agg_table(blocks: pd.DataFrame, boots: list, groups, levels, n_boot: int, seed: int,
               terms: pd.DataFrame | None = None) -> pd.DataFrame:
    boot = None
    if boots:
        nb = min(x["means"].shape[0] for x in boots)
        boot = dict(means=np.concatenate([x["means"][:nb] for x in boots], 1),
                    vars=np.concatenate([x["vars"][:nb] for x in boots], 1))
    if terms is not None:
        blocks, boot = _with_misfit(blocks, boot, terms, seed)
    tr = TailResult(blocks=blocks.reset_index(drop=True), pmf=np.zeros((0, 1)), gamma=0, levels=levels, hazard_info={})
    tr._boot = boot
    aggs = []
    for grp in groups:
        a = tr.aggregate(by=grp, level=0.95, n_boot=n_boot, target="run", seed=seed)
        a["by"] = "all" if grp is None else grp[0]
        key = blocks[grp[0]].astype(str) if grp else pd.Series(np.zeros(len(blocks)), index=blocks.index)
        a["truth"] = blocks.groupby(key)["truth"].mean().reindex(a[grp[0]] if grp else [0]).to_numpy()
        aggs.append(a)
    agg = pd.concat(aggs, ignore_index=True)
    agg["covers"] = (agg.truth >= agg.lo) & (agg.truth <= agg.hi)
    agg["width"] = agg.hi - agg.lo
    return agg, tr


def _prompt_folds(truth: pd.DataFrame, folds: int, seed: int) -> tuple[np.ndarray, int]:
    """Fold per row, by prompt (rid), not by (run, rid): runs of one workload mix share prompts across
    seeds and arms, and a prompt seen in training would leak its acceptance profile into the test fold."""
    rng = np.random.default_rng(seed)
    reqs = truth["rid"].astype(str).to_numpy()
    ureq = np.unique(reqs)
    folds = max(2, min(folds, len(ureq)))
    perm = rng.permutation(len(ureq))
    fold_of = dict(zip(ureq[perm], np.arange(len(ureq)) % folds))
    return np.array([fold_of[r] for r in reqs]), folds


def _score_fold(train: pd.DataFrame, test: pd.DataFrame, f: int, mode: str, lp: bool, g: dict | None, *,
                hazard_method: str, levels, interval: str, seed: int, hazard_boot: int, hazard_keys=KEYS):
    """Fit the tail estimator (variant ``mode``) on ``train``, estimate ``test`` with its ceiling hidden
    and score each block against the truth. Returns (blocks, bootstrap replicates, hazard bins)."""
    est = TailEstimator(hazard=HazardModel(method=hazard_method, keys=tuple(hazard_keys)), mode=mode, levels=levels,
                        interval=interval)
    est.fit(train, gather=g if lp else None)
    res = est.estimate(hide(test, logprobs=lp), gamma=est.gamma_, seed=seed, gather=g if lp else None,
                       hazard_boot=hazard_boot)
    b = res.blocks
    b["truth"] = BlockFrame.from_request_steps(test, gamma=est.gamma_).ceiling.astype(float)
    for L, v in expected_cover(res.pmf, b["truth"].to_numpy(), levels, interval).items():
        b[f"ecov{int(round(L * 100))}"] = v
    b["fold"] = f
    b["variant"] = mode
    return b, res._boot, est.hazard.info_.get("n_bins")


def _with_batch_band(blocks: pd.DataFrame, steps: pd.DataFrame | None) -> pd.DataFrame:
    """Each block's batch-size band, from the step it was verified in ("unknown" without steps)."""
    if steps is None or not len(steps):
        blocks["band"] = "unknown"
        return blocks
    key = ["run_id", "rank", "epoch", "forward_ct"]
    blocks = blocks.merge(steps[key + ["bs"]].drop_duplicates(key), on=key, how="left")
    blocks["band"] = batch_band(blocks["bs"])
    return blocks


def _per_run(cens: pd.DataFrame, agg: pd.DataFrame, levels) -> pd.DataFrame:
    """The must-show numbers for every run: per mode, with the run's aggregate interval."""
    prow = []
    for rid_, cb in cens.groupby("run_id"):
        for r in _mode_rows(cb, levels):
            r = {"run_id": rid_, **r}
            var = "confidence" if r["mode"] == "confidence" else "auto"
            ar = agg[(agg.variant == var) & (agg.by == "run_id") & (agg.group == str(rid_))]
            if not len(ar) and agg[(agg.variant == var) & (agg.by == "all")].shape[0] and cens.run_id.nunique() == 1:
                ar = agg[(agg.variant == var) & (agg.by == "all")]
            if len(ar):
                ar = ar.iloc[0]
                r.update(agg_est=ar.mean_ceiling, agg_lo=ar.lo, agg_hi=ar.hi, agg_truth=ar.truth, agg_covers=bool(ar.covers))
            prow.append(r)
    keep = ["run_id", "mode", "n_blocks", "n_unresolved", "resolved_exact", "bias", "mae", "bias_unresolved",
            "mae_unresolved", "cov80_unresolved", "cov90_unresolved", "cov95_unresolved", "ecov90_unresolved",
            "agg_est", "agg_lo", "agg_hi", "agg_truth", "agg_covers"]
    per_run = pd.DataFrame(prow)
    return per_run[[c for c in keep if c in per_run]] if len(per_run) else per_run


def _bracket_row(name, mm: pd.DataFrame, src: str, tr, levels, n_boot: int, seed: int) -> dict:
    """SGLang's bracket and our aggregate interval on the same sampled blocks ``mm``, against the truth."""
    t_al = mm.truth + 1  # accept-length units
    opened = mm.category != "exact_in_window"
    sub = TailResult(blocks=mm.rename(columns={"fct": "forward_ct"}).reset_index(drop=True),
                     pmf=np.zeros((0, 1)), gamma=0, levels=levels, hazard_info={})
    if tr._boot is not None:
        pos = mm["_pos"].to_numpy()
        sub._boot = dict(means=tr._boot["means"][:, pos], vars=tr._boot["vars"][:, pos])
    a = sub.aggregate(level=0.95, n_boot=n_boot, target="run", seed=seed).iloc[0]
    return dict(run=name, source=src, n_rows=len(mm), n_opened=int(opened.sum()),
                block_cover_rate_sglang=_cov(t_al[opened], mm.lo[opened] - 1e-9, mm.hi[opened] + 1e-9),
                block_cover_rate_ours90=_cov(mm.truth[opened], mm.lo90[opened], mm.hi90[opened]),
                truth_mean_accept_length=float(t_al.mean()),
                sglang_lo=float(mm.lo.mean()), sglang_hi=float(mm.hi.mean()), sglang_mid=float(mm.mid.mean()),
                sglang_width=float(mm.hi.mean() - mm.lo.mean()),
                sglang_covers=bool(mm.lo.mean() - 1e-9 <= t_al.mean() <= mm.hi.mean() + 1e-9),
                our_est=float(a.mean_ceiling + 1), our_lo=float(a.lo + 1), our_hi=float(a.hi + 1),
                our_width=float(a.hi - a.lo), our_covers=bool(a.lo + 1 <= t_al.mean() <= a.hi + 1))


def _bracket_comparison(blocks: pd.DataFrame, truth: pd.DataFrame, jsonl: dict | None, tr, levels, n_boot: int,
                        seed: int) -> pd.DataFrame:
    """SGLang's bracket on the same (sampled) rows: from the estimator JSONL if given, else recomputed
    from our telemetry; overall and per run."""
    if jsonl is not None and len(jsonl.get("rows", [])):
        br = bracket_from_jsonl(jsonl["rows"], jsonl.get("gather"), jsonl.get("eos"))
        src = "estimator JSONL"
    else:
        br = bracket_from_frame(BlockFrame.from_request_steps(hide(truth)))
        src = "recomputed from telemetry (SGLang recipe)"
    auto = blocks[blocks.variant == "auto"].reset_index(drop=True)
    samp = auto[auto.temperature > 0].rename(columns={"forward_ct": "fct"})
    samp = samp.reset_index().rename(columns={"index": "_pos"})
    m = samp.merge(br, on=["run_id", "rid", "fct"], how="inner")
    if not len(m):
        return pd.DataFrame([])
    parts = [("all", m)] + ([(r, x) for r, x in m.groupby("run_id")] if m.run_id.nunique() > 1 else [])
    return pd.DataFrame([_bracket_row(name, mm, src, tr, levels, n_boot, seed) for name, mm in parts])


def validate(truth: pd.DataFrame, *, steps: pd.DataFrame | None = None, folds: int = 5,
             hazard_method: str = "logistic", levels=(0.8, 0.9, 0.95), n_boot: int = 200,
             jsonl: dict | None = None, by=("run_id", "workload", "band", "rank"), seed: int = 0,
             interval: str = "randomized", hazard_boot: int = 30, use_sglang_pg: bool = False,
             hazard_keys=KEYS, misfit: bool = True) -> ValidationResult:
    """Cross-fitted validation on a truth-bearing ``request_steps`` frame (see module docstring).

    ``jsonl``: optional ``{"rows", "gather", "eos"}`` SGLang estimator tables of the same run (for
    the bracket comparison; ``use_sglang_pg=True`` also feeds their p/q into the walk, which is
    not validated yet: see the module notes). ``hazard_boot``: hazard refits under request-bootstrap
    weights of the training fold (model uncertainty in the aggregate intervals), for both variants.
    ``hazard_keys``: what the logistic hazard is keyed by beyond cell, walk state and greedy
    (:data:`estimators.hazard.KEYS`; ``()``: the unkeyed model, for before/after comparisons).
    ``misfit``: the aggregate intervals carry the model's misfit measured on the other runs' residuals
    (:func:`misfit_terms`; False: imputation noise and hazard refits alone, the harness before).
    """
    if "ceiling" not in truth or truth["ceiling"].isna().any():
        raise ValueError("validate needs request_steps with the ceiling on every row (a cap-accept or static run)")
    truth = truth.reset_index(drop=True)
    fold, folds = _prompt_folds(truth, folds, seed)
    g = None
    if use_sglang_pg and jsonl is not None and len(jsonl.get("rows", [])) and "q_lp" in jsonl["rows"]:
        g = {"gather": jsonl.get("gather"), "rows": jsonl["rows"]}  # SGLang's p/q for the walk
    outs, boots, hinfo = [], {"auto": [], "confidence": []}, []
    for f in range(folds):
        train, test = truth[fold != f], truth[fold == f]
        if len(test) == 0 or len(train) == 0:
            continue
        for mode, lp in (("auto", True), ("confidence", False)):
            b, boot, bins = _score_fold(train, test, f, mode, lp, g, hazard_method=hazard_method, levels=levels,
                                        interval=interval, seed=seed, hazard_boot=hazard_boot,
                                        hazard_keys=hazard_keys)
            hinfo.append(bins)
            if boot is not None:
                boots[mode].append(boot)
            outs.append(b)
    blocks = _with_batch_band(pd.concat(outs, ignore_index=True), steps)
    cens = blocks[blocks.censored]
    # aggregate 95% intervals per group, per variant, against the true group mean
    aggs, trs, terms = [], {}, {}
    for v in ("auto", "confidence"):
        vb = blocks[blocks.variant == v].reset_index(drop=True)
        groups = [None] + [[c] for c in by if c in vb and vb[c].notna().any() and vb[c].nunique() > 1]
        terms[v] = misfit_terms(vb) if misfit and vb["run_id"].nunique() > 1 else None
        a, trs[v] = _agg_table(vb, boots[v], groups, levels, n_boot, seed, terms[v])
        a["variant"] = v
        aggs.append(a)
    agg = pd.concat(aggs, ignore_index=True)
    bins = sorted(set(x for x in hinfo if x is not None))
    keyed = f" keyed by {', '.join(hazard_keys)}" if hazard_method == "logistic" and hazard_keys else ""
    notes = [f"{folds}-fold cross-fitting by prompt (rid); hazards: {hazard_method}{keyed}"
             + (f" (confidence bins chosen per fit: {bins})" if bins else "")
             + f"; intervals: {interval}; aggregate: {hazard_boot} hazard refits x imputation noise"]
    for v, t in terms.items():
        if t is not None:
            notes.append(f"[{v}] model misfit from the other runs' residuals: over-dispersion phi median "
                         f"{t.phi.median():.2f}, run effect tau median {t.tau.median():.3f} drafts per censored block")
        elif misfit:
            notes.append(f"[{v}] one run: no other run to measure the model's misfit on (imputation noise and refits alone)")
    return ValidationResult(per_mode=pd.DataFrame(_mode_rows(cens, levels)), aggregate=agg,
                            bracket=_bracket_comparison(blocks, truth, jsonl, trs["auto"], levels, n_boot, seed),
                            blocks=blocks, notes=notes, per_run=_per_run(cens, agg, levels))


def load_truth_runs(dbs, runs=None, verbose: bool = True):
    """``(request_steps, steps, jsonl)`` of every truth-bearing run (ceiling on every row) in ``dbs``."""
    rss, sts, js = [], [], {"rows": [], "gather": [], "eos": []}
    for db in dbs:
        st = Store(db, read_only=True)
        for r in st.runs().run_id:
            if runs and r not in runs:
                continue
            x = st.read_table("request_steps", r)
            if x.empty or x["ceiling"].isna().any():
                continue
            rss.append(x)
            sts.append(st.read_table("steps", r))
            for k, t in (("rows", "estimator_rows"), ("gather", "estimator_gather"), ("eos", "estimator_eos")):
                js[k].append(st.read_table(t, r))
            if verbose:
                print(f"{db}: {r}: {len(x)} request-steps, temperature {x.temperature.iloc[0]}")
    if not rss:
        raise SystemExit("no truth-bearing runs (cap-accept/static with a ceiling on every row)")
    rs, steps = pd.concat(rss, ignore_index=True), pd.concat(sts, ignore_index=True)
    jsonl = {k: pd.concat(v, ignore_index=True) for k, v in js.items()} if sum(len(t) for t in js["rows"]) else None
    return rs, steps, jsonl


def main(argv=None) -> None:
    """``python -m acceptscope.estimators.validation DB [DB ...] [--run RUN ...] [--sglang DIR] [--synthetic N] [--json out.json]``:
    validate on every truth-bearing run of the given databases (pooled, cross-fitted by prompt), or
    on SGLang artifacts (``--sglang fixtures/sglang``: ingested into a temporary database first)."""
    ap = argparse.ArgumentParser(description="Hide the ceiling of truth-bearing runs and validate the tail estimator.")
    ap.add_argument("db", nargs="*", help="DuckDB telemetry files")
    ap.add_argument("--run", action="append", default=None, help="only these run ids (repeatable)")
    ap.add_argument("--sglang", default=None, help="a directory of SGLang artifacts (acceptscope ingest) to validate on")
    ap.add_argument("--synthetic", type=int, default=0, help="validate on N synthetic requests instead")
    ap.add_argument("--folds", type=int, default=5)
    ap.add_argument("--hazard-method", default="logistic", help="logistic | binned (HazardModel.method)")
    ap.add_argument("--n-boot", type=int, default=300)
    ap.add_argument("--hazard-boot", type=int, default=30)
    ap.add_argument("--hazard-keys", default=",".join(KEYS),
                    help="logistic hazard keys, comma-separated (temperature,workload; 'none': unkeyed)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-misfit", action="store_true",
                    help="aggregate intervals without the model-misfit terms (the harness before; for comparison)")
    ap.add_argument("--use-sglang-pg", action="store_true", help="feed SGLang's pg p/q into the walk (experimental)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    keys = () if a.hazard_keys.strip() in ("", "none") else tuple(k.strip() for k in a.hazard_keys.split(","))
    bad = [k for k in keys if k not in KEYS]
    if bad:
        ap.error(f"--hazard-keys: unknown key(s) {bad}; choose from {list(KEYS)} or 'none'")
    jsonl = None
    if a.synthetic:
        sim = simulate(n_requests=a.synthetic, seed=a.seed + 21)
        rs, steps = sim.tables["request_steps"], sim.tables["steps"]
        jsonl = dict(rows=sim.tables["estimator_rows"], gather=sim.tables["estimator_gather"], eos=sim.tables["estimator_eos"])
    else:
        dbs = list(a.db)
        with tempfile.TemporaryDirectory(prefix="acceptscope-val-") as tmp:  # the --sglang ingest, dropped after
            if a.sglang:
                db = f"{tmp}/sglang.duckdb"
                ingest_paths([a.sglang], Store(db), progress=False)
                dbs.append(db)
            rs, steps, jsonl = load_truth_runs(dbs, a.run)
    v = validate(rs, steps=steps, n_boot=a.n_boot, hazard_boot=a.hazard_boot, jsonl=jsonl, seed=a.seed,
                 use_sglang_pg=a.use_sglang_pg, folds=a.folds, hazard_method=a.hazard_method, hazard_keys=keys,
                 misfit=not a.no_misfit)
    print(v.report())
    for n in v.notes:
        print("note:", n)
    print(json.dumps(v.targets()))
    if a.json:
        with open(a.json, "w") as f:
            json.dump(v.to_json(), f, default=str, indent=1)


if __name__ == "__main__":
    main()
