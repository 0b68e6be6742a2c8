"""Validation harness: hide the ceiling of truth-bearing traffic, estimate as if compact, compare.

Why: the tail estimator's intervals are only worth something if they cover. A cap-accept
run (or synthetic truth) records the uncapped ceiling of every request-step; this module
hides it, plus everything a compact run would not have (``cap_trim`` beyond the bonus
row, target log-probs beyond the ``window + 1`` verified rows; for the confidence-only
mode all log-probs), fits the hazards on one split of requests and estimates on the
other (cross-fitting), and reports per mode (greedy / sampled-with-logprobs /
confidence-only): bias, MAE, coverage at nominal 80/90/95% (over all censored blocks and
over the *unresolved* ones, whose ceiling the data do not determine), interval width;
aggregate 95% intervals per group against the true group mean; and SGLang's bracket on
the same blocks where it exists.

Example::

    >>> from estimators.synthetic import simulate
    >>> from estimators.validation import validate
    >>> sim = simulate(n_requests=120, seed=5)
    >>> v = validate(sim.tables["request_steps"], steps=sim.tables["steps"], n_boot=50, hazard_boot=5)
    >>> g = v.per_mode.set_index("mode").loc["greedy"]
    >>> bool(g.resolved_exact == g.n_resolved)
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from estimators.bracket import bracket_from_frame, bracket_from_jsonl
from estimators.frame import BlockFrame
from estimators.hazard import HazardModel
from estimators.tail import TailEstimator

BANDS = (0, 8, 16, 32, 64, 128, 1 << 30)


def batch_band(bs) -> np.ndarray:
    """Batch-size band label ('1-8', '9-16', ...)."""
    bs = np.asarray(bs, float)
    edges = np.array(BANDS)
    i = np.clip(np.searchsorted(edges, bs, side="left") - 1, 0, len(edges) - 2)
    lab = np.array([f"{edges[j] + 1}-{edges[j + 1]}" if edges[j + 1] < (1 << 30) else f">{edges[j]}"
                    for j in range(len(edges) - 1)], dtype=object)
    out = lab[i]
    return np.where(np.isnan(bs), "unknown", out)


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
        from estimators.frame import padded

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


@dataclass
class ValidationResult:
    per_mode: pd.DataFrame
    aggregate: pd.DataFrame
    bracket: pd.DataFrame
    blocks: pd.DataFrame
    notes: list[str] = field(default_factory=list)

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
        agg = self.aggregate
        if len(agg):
            out["aggregate95_cover_rate"] = float(agg.covers.mean())
        if len(self.bracket):
            b = self.bracket
            out["aggregate_narrower_than_sglang_bracket"] = bool((b.our_width < b.sglang_width).all())
        return out

    def to_json(self) -> dict:
        return dict(per_mode=self.per_mode.to_dict("records"), aggregate=self.aggregate.to_dict("records"),
                    bracket=self.bracket.to_dict("records"), targets=self.targets(), notes=self.notes)

    def figure(self):
        from estimators.figures import coverage_figure

        return coverage_figure(self.per_mode)


def validate(truth: pd.DataFrame, *, steps: pd.DataFrame | None = None, folds: int = 2,
             hazard_method: str = "binned", levels=(0.8, 0.9, 0.95), n_boot: int = 200,
             jsonl: dict | None = None, by=("workload", "band"), seed: int = 0,
             interval: str = "randomized", hazard_boot: int = 30, use_sglang_pg: bool = False) -> ValidationResult:
    """Cross-fitted validation on a truth-bearing ``request_steps`` frame (see module docstring).

    ``jsonl``: optional ``{"rows", "gather", "eos"}`` SGLang estimator tables of the same run (for
    the bracket comparison; ``use_sglang_pg=True`` also feeds their p/q into the walk, which is
    not validated yet: see the module notes).
    """
    if "ceiling" not in truth or truth["ceiling"].isna().any():
        raise ValueError("validate needs request_steps with the ceiling on every row (a cap-accept or static run)")
    rng = np.random.default_rng(seed)
    truth = truth.reset_index(drop=True)
    reqs = (truth["run_id"].astype(str) + "\x00" + truth["rid"].astype(str)).to_numpy()
    ureq = np.unique(reqs)
    fold_of = dict(zip(ureq, rng.integers(0, folds, len(ureq))))
    fold = np.array([fold_of[r] for r in reqs])
    outs = []
    boots = []
    notes = []
    for f in range(folds):
        train = truth[fold != f]
        test = truth[fold == f]
        if len(test) == 0 or len(train) == 0:
            continue
        g = None
        if use_sglang_pg and jsonl is not None and len(jsonl.get("rows", [])) and "q_lp" in jsonl["rows"]:
            g = {"gather": jsonl.get("gather"), "rows": jsonl["rows"]}  # SGLang's p/q for the walk
        for mode, lp in (("auto", True), ("confidence", False)):
            est = TailEstimator(hazard=HazardModel(method=hazard_method), mode=mode, levels=levels, interval=interval)
            est.fit(train, gather=g if lp else None)
            res = est.estimate(hide(test, logprobs=lp), gamma=est.gamma_, seed=seed, gather=g if lp else None,
                               hazard_boot=hazard_boot if mode == "auto" else 0)
            b = res.blocks
            if res._boot is not None:
                boots.append(res._boot)
            tb = BlockFrame.from_request_steps(test, gamma=est.gamma_)
            b["truth"] = tb.ceiling.astype(float)
            b["fold"] = f
            b["variant"] = mode
            outs.append(b)
    blocks = pd.concat(outs, ignore_index=True)
    if steps is not None and len(steps):
        key = ["run_id", "rank", "epoch", "forward_ct"]
        blocks = blocks.merge(steps[key + ["bs"]], on=key, how="left")
        blocks["band"] = batch_band(blocks["bs"])
    else:
        blocks["band"] = "unknown"
    rows = []
    cens = blocks[blocks.censored]
    sel = {
        "greedy": cens[(cens.variant == "auto") & (cens["mode"] == "greedy")],
        "logprob": cens[(cens.variant == "auto") & (cens["mode"] == "logprob")],
        "confidence": cens[(cens.variant == "confidence") & (cens["mode"] == "confidence")],
    }
    for m, g in sel.items():
        if not len(g):
            continue
        u = g[~g.resolved]
        r = dict(mode=m, n_blocks=len(g), n_resolved=int(g.resolved.sum()),
                 resolved_exact=int((g.resolved & (g["mean"] == g.truth)).sum()),
                 bias=float((g["mean"] - g.truth).mean()), mae=float((g["mean"] - g.truth).abs().mean()),
                 bias_unresolved=float((u["mean"] - u.truth).mean()) if len(u) else float("nan"),
                 mae_unresolved=float((u["mean"] - u.truth).abs().mean()) if len(u) else float("nan"))
        for L in levels:
            t = int(round(L * 100))
            r[f"cov{t}"] = _cov(g.truth, g[f"lo{t}"], g[f"hi{t}"])
            r[f"cov{t}_unresolved"] = _cov(u.truth, u[f"lo{t}"], u[f"hi{t}"])
            r[f"mass{t}_unresolved"] = float(u[f"mass{t}"].mean()) if len(u) else float("nan")
            r[f"width{t}"] = float((g[f"hi{t}"] - g[f"lo{t}"]).mean())
        rows.append(r)
    per_mode = pd.DataFrame(rows)
    # aggregate 95% intervals per group (auto variant), against the true group mean
    auto = blocks[blocks.variant == "auto"].reset_index(drop=True)
    aggs = []
    from estimators.tail import TailResult

    tr = TailResult(blocks=auto.reset_index(drop=True), pmf=np.zeros((0, 1)), gamma=0, levels=levels, hazard_info={})
    if boots:
        nb = min(x["means"].shape[0] for x in boots)
        tr._boot = dict(means=np.concatenate([x["means"][:nb] for x in boots], 1),
                        vars=np.concatenate([x["vars"][:nb] for x in boots], 1))
    groups = [None] + [[c] for c in by if c in auto and auto[c].notna().any()]
    for grp in groups:
        a = tr.aggregate(by=grp, level=0.95, n_boot=n_boot, target="run", seed=seed)
        a["by"] = "run" if grp is None else grp[0]
        a["truth"] = (auto.groupby(auto[grp[0]].astype(str) if grp else np.zeros(len(auto)))["truth"].mean()
                      .reindex(a[grp[0]] if grp else [0]).to_numpy())
        aggs.append(a)
    agg = pd.concat(aggs, ignore_index=True)
    agg["covers"] = (agg.truth >= agg.lo) & (agg.truth <= agg.hi)
    agg["width"] = agg.hi - agg.lo
    # SGLang bracket on the same (sampled) rows: JSONL if given, else recomputed from our telemetry
    if jsonl is not None and len(jsonl.get("rows", [])):
        br = bracket_from_jsonl(jsonl["rows"], jsonl.get("gather"), jsonl.get("eos"))
        src = "estimator JSONL"
    else:
        br = bracket_from_frame(BlockFrame.from_request_steps(hide(truth)))
        src = "recomputed from telemetry (SGLang recipe)"
    brows = []
    samp = auto[auto.temperature > 0].rename(columns={"forward_ct": "fct"})
    m = samp.merge(br, on=["run_id", "rid", "fct"], how="inner")
    if len(m):
        t_al = m.truth + 1  # accept-length units
        opened = m.category != "exact_in_window"
        sub = TailResult(blocks=m.rename(columns={"fct": "forward_ct"}).reset_index(drop=True), pmf=np.zeros((0, 1)),
                         gamma=0, levels=levels, hazard_info={})
        if tr._boot is not None:
            pos = samp.index.to_numpy()[samp.reset_index(drop=True).reset_index().merge(
                br, left_on=["run_id", "rid", "fct"], right_on=["run_id", "rid", "fct"])["index"].to_numpy()]
            sub._boot = dict(means=tr._boot["means"][:, pos], vars=tr._boot["vars"][:, pos])
        a = sub.aggregate(level=0.95, n_boot=n_boot, target="run", seed=seed).iloc[0]
        brows.append(dict(source=src, n_rows=len(m), n_opened=int(opened.sum()),
                          block_cover_rate_sglang=_cov(t_al[opened], m.lo[opened] - 1e-9, m.hi[opened] + 1e-9),
                          block_cover_rate_ours90=_cov(m.truth[opened], m.lo90[opened], m.hi90[opened]),
                          truth_mean_accept_length=float(t_al.mean()),
                          sglang_lo=float(m.lo.mean()), sglang_hi=float(m.hi.mean()), sglang_mid=float(m.mid.mean()),
                          sglang_width=float(m.hi.mean() - m.lo.mean()),
                          sglang_covers=bool(m.lo.mean() - 1e-9 <= t_al.mean() <= m.hi.mean() + 1e-9),
                          our_est=float(a.mean_ceiling + 1), our_lo=float(a.lo + 1), our_hi=float(a.hi + 1),
                          our_width=float(a.hi - a.lo), our_covers=bool(a.lo + 1 <= t_al.mean() <= a.hi + 1)))
    notes.append(f"{folds}-fold cross-fitting by request; hazards: {hazard_method}; intervals: {interval}")
    return ValidationResult(per_mode=per_mode, aggregate=agg, bracket=pd.DataFrame(brows), blocks=blocks, notes=notes)


def main(argv=None) -> None:
    """``python -m estimators.validation DB [DB ...] [--run RUN ...] [--synthetic N] [--json out.json]``:
    validate on every truth-bearing run of the given databases (pooled, cross-fitted by request)."""
    import argparse
    import json as _json

    ap = argparse.ArgumentParser(description="Hide the ceiling of truth-bearing runs and validate the tail estimator.")
    ap.add_argument("db", nargs="*", help="DuckDB telemetry files")
    ap.add_argument("--run", action="append", default=None, help="only these run ids (repeatable)")
    ap.add_argument("--synthetic", type=int, default=0, help="validate on N synthetic requests instead")
    ap.add_argument("--n-boot", type=int, default=300)
    ap.add_argument("--hazard-boot", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--use-sglang-pg", action="store_true", help="feed SGLang's pg p/q into the walk (experimental)")
    ap.add_argument("--json", default=None)
    a = ap.parse_args(argv)
    jsonl = None
    if a.synthetic:
        from estimators.synthetic import simulate

        sim = simulate(n_requests=a.synthetic, seed=a.seed + 21)
        rs, steps = sim.tables["request_steps"], sim.tables["steps"]
        jsonl = dict(rows=sim.tables["estimator_rows"], gather=sim.tables["estimator_gather"], eos=sim.tables["estimator_eos"])
    else:
        from acceptscope.store import Store

        rss, sts, js = [], [], {"rows": [], "gather": [], "eos": []}
        for db in a.db:
            st = Store(db)
            for r in st.runs().run_id:
                if a.run and r not in a.run:
                    continue
                x = st.read_table("request_steps", r)
                if x.empty or x["ceiling"].isna().any():
                    continue
                rss.append(x)
                sts.append(st.read_table("steps", r))
                for k, t in (("rows", "estimator_rows"), ("gather", "estimator_gather"), ("eos", "estimator_eos")):
                    js[k].append(st.read_table(t, r))
                print(f"{db}: {r}: {len(x)} request-steps, temperature {x.temperature.iloc[0]}")
        if not rss:
            raise SystemExit("no truth-bearing runs (cap-accept/static with a ceiling on every row)")
        rs, steps = pd.concat(rss, ignore_index=True), pd.concat(sts, ignore_index=True)
        if sum(len(t) for t in js["rows"]):
            jsonl = {k: pd.concat(v, ignore_index=True) for k, v in js.items()}
    v = validate(rs, steps=steps, n_boot=a.n_boot, hazard_boot=a.hazard_boot, jsonl=jsonl, seed=a.seed,
                 use_sglang_pg=a.use_sglang_pg)
    with pd.option_context("display.width", 200, "display.max_columns", 40):
        print(v.per_mode.set_index("mode").T.to_string())
        print(v.aggregate[["by", "group", "n", "n_censored", "mean_ceiling", "lo", "hi", "truth", "covers"]].to_string())
        if len(v.bracket):
            print(v.bracket.T.to_string())
    print(_json.dumps(v.targets()))
    if a.json:
        with open(a.json, "w") as f:
            _json.dump(v.to_json(), f, default=str, indent=1)


if __name__ == "__main__":
    main()
