"""The self-contained HTML audit report.

Why this module exists: an audit ends in one file someone can open anywhere,
offline: the written verdict first (what is healthy, what is wrong), then the
evidence. The file embeds plotly.js once (no CDN, no server) and every figure
as a plotly div, so it works from an e-mail attachment or an air-gapped host.

Figures come from the estimators when they can run (``app.estimates``) and
otherwise from the raw tables (``app.figures``); each section says which.
The verdict is rule-based (thresholds in :class:`Thresholds`).
"""

from __future__ import annotations

import datetime as dt
import html
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from acceptscope import schema

# section ids, in page order (tests check that each is present)
SECTIONS = ("summary", "runs", "regime", "curve", "parity", "calibration", "survival", "windows", "utilization",
            "tail", "cost", "data-quality")
SECTION_TITLES = {
    "summary": "Summary",
    "runs": "Runs",
    "regime": "The seeds' regime: windows per workload, next to the SGLang blog",
    "curve": "Compact vs static throughput over batch size (virtual clock)",
    "parity": "Audit parity",
    "calibration": "Calibration (reliability per position, before and after STS)",
    "survival": "Survival vs empirical acceptance",
    "windows": "Window distributions per workload",
    "utilization": "Utilization against the ceiling",
    "tail": "Counterfactual-tail estimates against cap-accept truth",
    "cost": "Cost-model fit",
    "data-quality": "Data quality",
}
AUDIT_ARMS = ("cap-accept", "static")
RUNS_TABLE = schema.RUNS.name


@dataclass
class Thresholds:
    ece: float = 0.05  # after-STS ECE above this at a position is flagged
    utilization: float = 0.80  # compact utilization below this is flagged
    cost_mape: float = 0.20  # mean abs. % error of predicted step time above this is flagged
    min_bin_n: int = 30  # positions with fewer labelled samples are reported but not judged


@dataclass
class Finding:
    level: str  # ok | warn | bad | info
    area: str
    text: str  # plain text (run ids, workload names: data, never markup); escaped where it becomes HTML


@dataclass
class ReportResult:
    path: Path | None
    run_ids: list[str]
    findings: list[Finding]
    sections: list[str]
    figures: int
    estimators: str  # "used" or the reason they were not
    parity: dict | None = None
    sampling: dict | None = None
    headline: dict = field(default_factory=dict)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["path"] = str(self.path) if self.path else None
        return d


# ---------------------------------------------------------------------------
# run selection
# ---------------------------------------------------------------------------
def select_runs(reader: Any, run_ids: Sequence[str] | None = None, audit_group: str | None = None) -> list[str]:
    """Explicit runs, else one audit group's runs, else the newest audit group, else every run."""
    import duckdb

    try:
        runs = reader.runs()
    except duckdb.CatalogException:
        raise ValueError(f"{reader.path}: not an acceptscope telemetry database (it has no runs table)") from None
    if runs.empty:
        return []
    if run_ids:
        unknown = sorted(set(run_ids) - set(runs["run_id"]))
        if unknown:
            raise KeyError(f"unknown run id(s): {', '.join(unknown)}; known: {', '.join(runs['run_id'])}")
        return list(run_ids)
    if audit_group:
        sel = runs[runs["audit_group"] == audit_group]
        if sel.empty:
            raise KeyError(f"no runs with audit_group {audit_group!r}")
        return list(sel["run_id"])
    grouped = runs.dropna(subset=["audit_group"])
    # an audit's STS calibration split and throughput-curve runs sit in sub-groups "<group>/..."; the newest
    # audit is the newest top-level group
    top = grouped[~grouped["audit_group"].str.contains("/", regex=False)]
    grouped = top if len(top) else grouped
    if len(grouped):  # runs() is newest first
        return list(runs[runs["audit_group"] == grouped["audit_group"].iloc[0]]["run_id"])
    return list(runs["run_id"])


def _arm_run(summary: pd.DataFrame, arm: str) -> str | None:
    s = summary[summary["arm"] == arm]
    return None if s.empty else str(s["run_id"].iloc[0])


# ---------------------------------------------------------------------------
# HTML helpers
# ---------------------------------------------------------------------------
def _fmt(v: Any, digits: int = 3) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "–"
    if isinstance(v, (float, np.floating)):
        return f"{v:.{digits}f}"
    return html.escape(str(v))


def _table(df: pd.DataFrame, cols: Sequence[str] | None = None, digits: int = 3) -> str:
    if df is None or df.empty:
        return "<p class='muted'>(no rows)</p>"
    d = df[list(cols)] if cols else df
    head = "".join(f"<th>{html.escape(str(c))}</th>" for c in d.columns)
    body = "".join("<tr>" + "".join(f"<td>{_fmt(v, digits)}</td>" for v in row) + "</tr>"
                   for row in d.itertuples(index=False))
    return f"<div class='scroll'><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div>"


class _Page:
    def __init__(self) -> None:
        self.parts: dict[str, list[str]] = {s: [] for s in SECTIONS}
        self.n_fig = 0

    def add(self, section: str, text: str) -> None:
        self.parts[section].append(text)

    def note(self, section: str, text: str) -> None:
        """A paragraph of plain text (escaped here: notes quote run ids, workloads and error messages)."""
        self.add(section, f"<p class='note'>{html.escape(text)}</p>")

    def fig(self, section: str, fig: Any, caption: str = "") -> None:
        self.n_fig += 1
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{section}-{self.n_fig}",
                          config={"displaylogo": False, "responsive": True})
        cap = f"<figcaption>{html.escape(caption)}</figcaption>" if caption else ""
        self.add(section, f"<figure class='plot' data-section='{section}'>{div}{cap}</figure>")


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------
def build_report(
    db: str | Path,
    *,
    run_ids: Sequence[str] | None = None,
    audit_group: str | None = None,
    parity: Any = None,
    sampling: Any = None,
    thresholds: Thresholds | None = None,
    use_estimators: bool = True,
    n_boot: int = 200,
    title: str | None = None,
) -> tuple[str, ReportResult]:
    """Render the report for a selection of runs; returns (html text, result)."""
    from acceptscope import audit_sampling
    from acceptscope.parity import ParityReport, check_parity
    from app import estimates as est
    from app import figures as F
    from app.data import Reader

    th = thresholds or Thresholds()
    reader = Reader(db)
    ids = select_runs(reader, run_ids, audit_group)
    if not ids:
        raise LookupError(f"{db}: the database holds no runs")
    page = _Page()
    findings: list[Finding] = []
    summary = reader.run_summary(ids)
    runs = F.runs_in(reader, ids)
    from acceptscope.store import incomplete_runs

    incomplete = incomplete_runs(reader.runs(), ids)
    for rid in incomplete:
        findings.append(Finding("warn", "runs", f"run {rid} is incomplete: it has no completion mark (still being "
                                "written, or the command writing it was killed); its figures cover only the rows "
                                "written so far"))
    compact = _arm_run(summary, "compact")
    audit = _arm_run(summary, "cap-accept")
    static = _arm_run(summary, "static")
    truth_run = audit or static
    headline: dict[str, Any] = {"complete": {rid: rid not in incomplete for rid in ids}}

    # -- estimators ----------------------------------------------------------
    # production-side estimates (tail, utilization, cost, planner) on compact; calibration with realized
    # labels on the run that recorded the ceiling; validation hides that run's ceiling and compares.
    views: dict[str, dict[str, Any]] = {}
    est_status = "disabled"
    arm_of = dict(zip(runs["run_id"], runs["arm"]))
    if use_estimators:
        ok, why = est.available()
        est_status = "used" if ok else why
        targets = [r for r in (compact, truth_run) if r] or ids[:1]
        for rid in targets if ok else []:
            v, err = est.run_estimates(db, rid, n_boot=n_boot)
            views[rid] = v
            if err:
                est_status = f"failed on {arm_of.get(rid, rid)}: {err}"
                findings.append(Finding("warn", "estimators", f"estimators failed on {rid}: {err}"))
            for name, ev in v.items():
                if ev.error:
                    findings.append(Finding("warn", "estimators", f"{name} on {rid}: {ev.error}"))
        if ok and truth_run:
            views.setdefault(truth_run, {})["validation"] = est.run_validation(db, truth_run, n_boot=n_boot)

    def est_figs(name: str, section: str, prefer: Sequence[str | None]) -> bool:
        """Put estimator ``name``'s figures, headline numbers and tables for the first preferred run."""
        for rid in dict.fromkeys([r for r in prefer if r] + ids):
            ev = views.get(rid, {}).get(name)
            if ev is None:
                continue
            where = f"estimators.{name} on {rid} ({arm_of.get(rid, '')})"
            if ev.skipped:
                page.note(section, f"{where}: skipped ({ev.skipped})")
                continue
            if ev.error:
                page.note(section, f"{where}: failed ({ev.error})")
                continue
            for f in ev.figures:
                page.fig(section, f, where)
            w = html.escape(where)
            if ev.summary:
                page.add(section, f"<details><summary>{w}: numbers</summary>{_kv_table(ev.summary)}</details>")
            for tname, t in list(ev.tables.items())[:3]:
                page.add(section, f"<details><summary>{w}: {html.escape(tname)}</summary>{_table(t)}</details>")
            return bool(ev.figures or ev.summary)
        return False

    # -- runs ----------------------------------------------------------------
    page.add("runs", _table(summary, ["run_id", "arm", "engine", "gamma", "requests_seen", "blocks", "mean_window",
                                      "mean_acc_len", "ceiling_accept_len", "utilization", "in_window_accept_rate",
                                      "mean_cap_trim", "tokens_per_s"]))
    page.add("runs", "<p class='note'>accept length counts the bonus token; <b>ceiling</b> = mean(uncapped correct "
                     "drafts + 1), observed only in cap-accept and static; utilization = Σ accept length / Σ ceiling.</p>")
    for row in summary.itertuples(index=False):
        if row.arm == "compact" and (row.blocks or 0) > 0 and row.mean_window is not None \
                and row.mean_window >= row.gamma - 1e-9:
            findings.append(Finding("bad", "scheduler", f"compact verified every draft in {row.run_id} "
                                    f"(window = gamma = {row.gamma} on every block): no trimming, zero scheduling "
                                    "gain. SGLang degenerates to verify-all when no SPS cost table is loaded."))
        if row.arm == "cap-accept" and (row.mean_cap_trim or 0) == 0 and (row.blocks or 0) > 0:
            findings.append(Finding("warn", "scheduler", f"no trimming in {row.run_id}: cap_trim is 0 on every "
                                    "block, so the scheduler verified whole blocks (no cost table?)"))

    # -- the seeds' regime and the throughput curve -------------------------------
    _regime_sections(page, reader, runs, compact, audit, findings, headline)

    # -- parity --------------------------------------------------------------
    par: ParityReport | None = parity
    if par is None and compact and audit:
        par = check_parity(reader, compact, audit)
    if par is not None:
        c = par.counts()
        if par.unverifiable:
            findings.append(Finding("warn", "parity", f"{par.unverifiable} of {par.pairs} request pairs have no "
                                    "output tokens recorded: their parity cannot be checked"))
        if par.ok and par.unverifiable == par.pairs:
            page.note("parity", "no output tokens recorded in these runs: parity not checkable.")
        elif par.ok:
            findings.append(Finding("ok", "parity", f"audit parity holds: all {par.identical} paired requests "
                                    "committed identical tokens in both arms"))
            page.note("parity", f"{par.pairs} request pairs ({par.run_a} vs {par.run_b}), "
                                "paired by (workload, prompt_index, seed): all identical."
                      + (f" Sampled audit: the audit arm replayed {par.pairs} of {par.requests_a} requests."
                         if par.sampled else ""))
        else:
            kinds = ", ".join(f"{n} {k}" for k, n in c.items() if n)
            findings.append(Finding("bad", "parity", f"audit parity broken: {len(par.findings)} of {par.pairs} "
                                    f"requests diverge ({kinds}); the audit arm's ceiling may not describe production"))
            page.note("parity", f"{par.identical} of {par.pairs} pairs identical; findings ({kinds}):")
            page.add("parity", _table(par.table(), ["kind", "workload", "prompt_index", "seed", "position",
                                                    "token_a", "token_b", "block_a", "block_b"]))
        headline["parity"] = {"ok": par.ok, "pairs": par.pairs, **c}
    else:
        page.note("parity", "no compact + cap-accept pair in this selection: parity not checked.")

    # -- calibration ---------------------------------------------------------
    calib_run = audit or static or ids[0]
    if not est_figs("calibration", "calibration", [calib_run]):
        bins = F.reliability_bins(reader, [calib_run])
        if bins.empty:
            page.note("calibration", "no blocks with an observed ceiling: reliability needs cap-accept or static.")
        else:
            page.note("calibration", "computed from raw tables (estimators.calibration unavailable: "
                      f"{est_status}): plug-in reliability, 15 equal-width bins, Wilson 95% bands.")
            page.fig("calibration", F.fig_reliability(bins, calib_run), f"reliability, {calib_run}")
    bins = F.reliability_bins(reader, [calib_run])
    ece = F.ece_table(bins)
    sts_hash = reader.df(f'SELECT sts_hash FROM "{RUNS_TABLE}" WHERE run_id = ?', [calib_run])["sts_hash"]
    if len(sts_hash) and sts_hash.isna().all():
        page.note("calibration", f"{calib_run} ran without an STS table: the recorded confidence "
                  "is the raw head output, so 'before' and 'after' STS coincide in the ECE table below.")
    if len(ece):
        wide = ece.pivot_table(index="position", columns="variant", values="ece").reset_index()
        n = ece[ece["variant"] == "after"].set_index("position")["n"]
        wide["n"] = wide["position"].map(n)
        wide.columns = [f"ece_{c}_sts" if c in ("before", "after") else c for c in wide.columns]
        page.add("calibration", "<h3>ECE table (plug-in, 15 equal-width bins)</h3>" + _table(wide))
        after = ece[(ece["variant"] == "after") & (ece["n"] >= th.min_bin_n)]
        bad = after[after["ece"] > th.ece]
        if len(bad):
            worst = bad.sort_values("ece").iloc[-1]
            findings.append(Finding("warn", "calibration", f"ECE after STS above {th.ece:.2f} at position(s) "
                                    f"{', '.join(str(int(k)) for k in bad['position'])} (worst {worst.ece:.3f} at "
                                    f"k={int(worst.position)}, n={int(worst.n)})"))
        elif len(after):
            findings.append(Finding("ok", "calibration", f"ECE after STS ≤ {th.ece:.2f} at every position with "
                                    f"≥{th.min_bin_n} labelled samples (max {after['ece'].max():.3f})"))
        headline["ece_after_max"] = float(after["ece"].max()) if len(after) else None

    # -- survival ------------------------------------------------------------
    pos = reader.position_acceptance(ids)
    if len(pos):
        page.fig("survival", F.fig_survival(pos), "dotted: mean predicted survival Π c_j; solid: empirical "
                 "P(ceiling ≥ k) with Wilson 95% intervals (arms with an observed ceiling)")
    else:
        page.note("survival", "no blocks recorded.")

    # -- windows -------------------------------------------------------------
    win = reader.window_distribution(ids)
    if len(win):
        page.fig("windows", F.fig_windows(win), "share of blocks per verified window")

    # -- utilization ---------------------------------------------------------
    util = reader.utilization_by_workload(ids)
    if len(util):
        page.fig("utilization", F.fig_utilization(util), "bars: realized accept length; ticks: observed ceiling")
    est_figs("utilization", "utilization", [compact])
    samp = sampling
    if samp is None and compact and audit:
        try:
            samp = audit_sampling.infer_runs(reader, compact, audit)
        except ValueError as e:
            page.note("utilization", f"no full-traffic inference: {e}")
    if samp is not None:
        page.add("utilization", _sampling_html(samp))
        u = samp.utilization
        headline["utilization"] = asdict(u)
        headline["ceiling"] = asdict(samp.ceiling)
        msg = (f"compact utilization {u.estimate:.1%} of the ceiling [{u.lo:.1%}, {u.hi:.1%}] "
               f"(ceiling {samp.ceiling.estimate:.2f} tokens/block, realized {samp.realized_accept_len:.2f}; "
               f"{samp.n_audited}/{samp.n_requests} requests audited)")
        findings.append(Finding("ok" if u.estimate >= th.utilization else "warn", "utilization", msg))
        if samp.n_audited < samp.n_requests and samp.n_with_tail == 0:
            findings.append(Finding("warn", "utilization", f"none of the {samp.n_audited} audited requests showed a "
                                    "trimmed tail, so the interval cannot bound tails elsewhere: audit a larger "
                                    "fraction"))

    if samp is None and compact:
        _production_only(views.get(compact, {}), page, findings, headline, th)

    # -- counterfactual tail -------------------------------------------------
    shown = est_figs("tail", "tail", [compact])
    shown = est_figs("validation", "tail", [truth_run]) or shown
    val = views.get(truth_run or "", {}).get("validation")
    if val is not None and not val.error:
        cover = val.summary.get("targets.aggregate95_cover_rate")
        if cover is not None:
            headline["tail_aggregate95_cover_rate"] = cover
            findings.append(Finding("ok" if cover >= 0.9 else "warn", "tail",
                                    f"counterfactual-tail 95% intervals cover the hidden cap-accept truth in "
                                    f"{cover:.0%} of groups (validation on {truth_run})"))
    if compact and truth_run:
        pr = audit_sampling.per_request(reader, compact, truth_run)
        tail_tbl = _tail_by_workload(pr)
        if len(tail_tbl):
            page.fig("tail", _fig_tail(tail_tbl), "compact's confidence-only estimate (Σ survival + 1 per block) "
                     "against the cap-accept truth, both with request-bootstrap 95% intervals")
            page.add("tail", _table(tail_tbl))
            worst = tail_tbl.iloc[(tail_tbl["conf_only"] - tail_tbl["truth"]).abs().argmax()]
            rel = (worst.conf_only - worst.truth) / worst.truth
            if not shown:
                page.note("tail", "computed from raw tables (estimators.tail unavailable: "
                          f"{est_status}).")
            findings.append(Finding("warn" if abs(rel) > 0.1 else "ok", "tail",
                                    "the confidence head's own ceiling forecast (Σ survival + 1 per block) is off "
                                    f"by {rel:+.0%} on {worst.workload} "
                                    f"({worst.conf_only:.2f} vs truth {worst.truth:.2f})"))
    elif not shown:
        page.note("tail", "needs a compact run and a cap-accept (or static) run of the same workload.")

    # -- cost ----------------------------------------------------------------
    est_figs("cost", "cost", [compact])
    est_figs("planner", "cost", [compact])
    steps = reader.step_costs(ids)
    if len(steps):
        mape = _mape(steps)
        cost_ev = views.get(compact or "", {}).get("cost")
        if cost_ev is not None and not cost_ev.error and not cost_ev.skipped:
            rel = cost_ev.summary.get("held_out.mean_rel_err", cost_ev.summary.get("in_sample.mean_rel_err"))
            if rel is not None:
                headline["cost_fit_rel_err"] = rel
                findings.append(Finding("warn" if rel > th.cost_mape else "ok", "cost",
                                        f"fitted step-time cost model: {rel:.0%} mean relative error on held-out "
                                        f"steps (estimators.cost)"))
        if mape is not None:
            page.fig("cost", F.fig_step_costs(steps, runs), "per step; measured = device time where recorded, "
                     "else host inter-step time")
        page.fig("cost", F.fig_throughput(steps, runs), "verify tokens the target ran per decode step")
        virtual = "modeled_step_ms" in steps and steps["modeled_step_ms"].notna().any()
        if mape is not None and virtual:
            headline["cost_mape"] = mape
            findings.append(Finding("info", "cost", f"virtual clock: the planner's predicted step time (the "
                                    f"profile's table, measured at its own context length) differs from the modeled "
                                    f"step time (the table + the requests' own contexts) by {mape:.1%} mean absolute "
                                    "on compact steps; the clock itself is checked against the GPU in the curve "
                                    "section's cost-profile table"))
        elif mape is not None:
            headline["cost_mape"] = mape
            findings.append(Finding("warn" if mape > th.cost_mape else "ok", "cost",
                                    f"step-time model error {mape:.0%} mean absolute (threshold {th.cost_mape:.0%})"))
        else:
            page.note("cost", "no step carries both a predicted and a measured step time (no cost table in use?): "
                              "the step-time model cannot be checked.")

    # -- data quality --------------------------------------------------------
    dq = reader.data_quality(ids)
    page.add("data-quality", _table(dq))
    if len(dq) and (dq["rejects"].sum() or dq["gaps"].sum()):
        findings.append(Finding("warn", "data", f"{int(dq['rejects'].sum())} rejected records and "
                                f"{int(dq['gaps'].sum())} stream gaps in the selected runs"))

    # -- summary -------------------------------------------------------------
    order = {"bad": 0, "warn": 1, "ok": 2, "info": 3}
    findings.sort(key=lambda f: order.get(f.level, 9))
    page.add("summary", _summary_html(findings))
    groups = runs["audit_group"].dropna().unique()
    one_group = len(groups) == 1 and runs["audit_group"].notna().all()
    default_title = f"acceptscope report: audit group {groups[0]}" if one_group else \
        f"acceptscope report: {', '.join(ids)}"
    text = _render(page, title or default_title, ids)
    res = ReportResult(None, ids, findings, [s for s in SECTIONS if page.parts[s]], page.n_fig, est_status,
                       par.to_dict() if par is not None else None,
                       samp.to_dict() if samp is not None else None, headline)
    return text, res


def _production_only(views: dict, page: "_Page", findings: list, headline: dict, th: "Thresholds") -> None:
    """A compact run with no audit arm: utilization against the ceiling the tail estimator inferred
    from the run's own telemetry, and a plain statement of what is observed and what is estimated."""
    uv, tv = views.get("utilization"), views.get("tail")
    if uv is None or tv is None or uv.raw is None or tv.raw is None:
        return
    r = uv.raw.by_group[uv.raw.by_group.by == "run"].iloc[0]
    s = tv.raw.summary()
    lo, hi = r.get("util_lo", r.utilization), r.get("util_hi", r.utilization)
    headline["utilization"] = {"estimate": float(r.utilization), "lo": float(lo), "hi": float(hi),
                               "basis": "estimated ceiling (no audit arm)"}
    findings.append(Finding("ok" if r.utilization >= th.utilization else "warn", "utilization", html.escape(
        f"compact utilization {r.utilization:.1%} of the estimated ceiling [{lo:.1%}, {hi:.1%}], no audit arm: "
        f"{s['n_unresolved']} of {s['n_censored']} trimmed blocks are model-based")))
    for section in ("utilization", "tail"):
        page.note(section, html.escape(s["statement"]))


def write_report(db: str | Path, out: str | Path, **kw: Any) -> ReportResult:
    """Render and write the report; returns the result with ``path`` set."""
    text, res = build_report(db, **kw)
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(text, encoding="utf-8")
    res.path = out
    return res


# ---------------------------------------------------------------------------
# pieces
# ---------------------------------------------------------------------------
def _run_config(reader: Any, run_id: str) -> dict:
    import json

    c = reader.df(f'SELECT config_json FROM "{RUNS_TABLE}" WHERE run_id = ?', [run_id])["config_json"]
    try:
        return json.loads(c.iloc[0]) if len(c) and isinstance(c.iloc[0], str) else {}
    except ValueError:
        return {}


def _profile_html(sps_path: str) -> str:
    """Provenance, bound ratio and virtual-clock check of a measured GPU cost profile (if it has a manifest)."""
    import json

    p = Path(sps_path)
    man_p = Path(str(p) + ".manifest.json")
    if not man_p.is_file():
        return f"<p class='note'>cost table {html.escape(p.name)}: no GPU manifest next to it.</p>"
    man = json.loads(man_p.read_text(encoding="utf-8"))
    prov, bound, shape = man.get("provenance", {}), man.get("bound", {}), man.get("shape", {})
    rows = {
        "profile": p.name, "GPU": prov.get("gpu"), "driver": prov.get("driver"),
        "torch / CUDA": f"{prov.get('torch')} / {prov.get('cuda')}", "measured": prov.get("date_utc"),
        "shape": f"{shape.get('name')} ({man.get('target_layers')} of {shape.get('layers')} layers, hidden "
                 f"{shape.get('hidden')}), drafter {man.get('draft_layers')} layers",
        "context / gamma": f"{man.get('context_len')} tokens / {man.get('gamma')}",
        "HBM copy bandwidth (measured)": f"{(prov.get('copy_bandwidth_bytes_per_s') or 0) / 1e12:.2f} TB/s",
        "batch-1 verify": f"{min((bound.get('batch1_verify_ms') or {'-': float('nan')}).values()):.2f} ms",
        "bandwidth bound (weights / measured BW)": f"{bound.get('bound_ms', float('nan')):.2f} ms "
                                                   f"(ratio {bound.get('ratio_min', float('nan')):.2f})",
        "bandwidth bound (weights / datasheet BW)": f"{bound.get('datasheet_bound_ms', float('nan')):.2f} ms "
                                                    f"(ratio {bound.get('ratio_vs_datasheet', float('nan')):.2f})",
        "additive fit on its cells": "median {:.1%}, max {:.1%} relative error".format(
            man["tables"]["additive"]["fit"]["median_rel_err"], man["tables"]["additive"]["fit"]["max_rel_err"]),
    }
    out = "<h3>Cost profile</h3>" + _kv_table(rows)
    vc = p.with_name(p.name.removesuffix(".json") + ".vclock.json")
    if vc.is_file():
        doc = json.loads(vc.read_text(encoding="utf-8"))
        for name, r in doc.get("checks", {}).items():
            c = r.get("clock") or r  # the clock = table + context term; older files hold the table alone
            out += (f"<p class='note'>virtual clock vs measured {html.escape(str(doc.get('gpu')))} step time on "
                    f"{r['steps']} {html.escape(name)} steps (their windows and per-request contexts): median "
                    f"error {c['median_rel_err']:.1%}, p90 {c['p90_rel_err']:.1%}, bias {c['mean_bias_rel']:+.1%}"
                    + (f"; the table alone (profiled at {man.get('context_len')}-token contexts): median "
                       f"{r['median_rel_err']:.1%}, p90 {r['p90_rel_err']:.1%}" if "clock" in r else "") + ".</p>")
    return out


def _regime_sections(page: "_Page", reader: Any, runs: pd.DataFrame, compact: str | None, audit: str | None,
                     findings: list, headline: dict) -> None:
    """Per-workload windows / utilization next to the SGLang blog's, and the compact-vs-static curve."""
    from app import regime as R

    src = audit or compact
    if src is None:
        page.note("regime", "needs a compact or cap-accept run.")
    else:
        cmp = R.blog_comparison(reader.regime_by_workload([src]))
        if compact and audit:
            cw = reader.regime_by_workload([compact]).set_index("workload")["mean_window"]
            cmp.insert(4, "compact_mean_window", cmp["workload"].map(cw))
        page.add("regime", _table(cmp))
        # page.fig escapes its caption: plain text only (the run id and the URL are escaped there)
        page.fig("regime", R.fig_regime(cmp), f"windows and utilization per workload ({src}); grey: "
                 f"SGLang DSpark blog, {R.BLOG_URL} (gsm8k, arena-hard, poetry)")
        cfg = _run_config(reader, src)
        page.note("regime", f"served with cost profile {html.escape(str(cfg.get('cost_profile') or cfg.get('sps_path')))}"
                  f" on the {html.escape(str(cfg.get('clock', 'wall')))} clock, batch "
                  f"{html.escape(str(cfg.get('max_running_requests')))}, temperature "
                  f"{html.escape(str(cfg.get('temperature')))}, STS {html.escape(str(cfg.get('sts') or 'none'))}. "
                  "Windows are the cap-accept arm's (parity makes them compact's); utilization = Σ accept length / "
                  "Σ (ceiling + 1); shares count blocks. The blog's block holds six drafts, ours seven.")
        headline["regime"] = cmp.to_dict("records")
        tr = (cmp["share_trimmed"] * cmp["blocks"]).sum() / max(cmp["blocks"].sum(), 1)
        headline["share_trimmed"] = float(tr)
        findings.append(Finding("info", "regime", "mean window per workload " + ", ".join(
            f"{html.escape(str(r.workload))} {r.mean_window:.2f}" for r in cmp.itertuples()) +
            f"; {tr:.0%} of blocks trimmed"))
        if cfg.get("sps_path"):
            page.add("curve", _profile_html(str(cfg["sps_path"])))
    groups = runs["audit_group"].dropna().unique()
    curve = pd.DataFrame()
    import duckdb

    for g in groups:
        try:
            c = reader.throughput_curve(f"{g}/curve")
        except duckdb.BinderException:  # a file from before the virtual clock
            c = pd.DataFrame()
        if len(c):
            curve = c
            break
    if curve.empty:
        page.note("curve", "no curve runs for this audit (needs a cost profile; acceptscope audit runs them unless "
                           "--curve-batches '').")
        return
    page.fig("curve", R.fig_throughput_curve(curve), "decode tokens per modeled second (the cost profile's step "
             "times for the tokens each step verified and its requests' contexts); each point is one engine run "
             "at that batch")
    ratios = R.curve_ratios(curve)
    page.add("curve", _table(ratios))
    headline["curve"] = ratios.to_dict("records")
    for wl, g in ratios.groupby("workload"):
        lo, hi = g.sort_values("batch").iloc[0], g.sort_values("batch").iloc[-1]
        findings.append(Finding("info", "curve", f"{html.escape(str(wl))}: compact/static {lo.ratio:.2f}x at batch "
                                f"{int(lo.batch)}, {hi.ratio:.2f}x at batch {int(hi.batch)} (virtual clock)"))


def _kv_table(d: dict) -> str:
    def cell(v: Any) -> str:
        return _fmt(v) if not isinstance(v, (list, dict)) else html.escape(str(v)[:200])

    rows = "".join(f"<tr><th>{html.escape(str(k))}</th><td>{cell(v)}</td></tr>" for k, v in d.items())
    return f"<table class='kv'>{rows}</table>"


def _sampling_html(s: Any) -> str:
    def iv(i: Any, pct: bool = False) -> str:
        if i is None:
            return "–"
        f = (lambda v: f"{v:.1%}") if pct else (lambda v: f"{v:.3f}")
        return f"{f(i.estimate)} [{f(i.lo)}, {f(i.hi)}]"

    rows = [
        ("requests (compact) / audited", f"{s.n_requests} / {s.n_audited} ({s.fraction:.0%})"),
        ("realized accept length (compact, all traffic)", f"{s.realized_accept_len:.3f}"),
        ("audited requests with a trimmed tail", f"{s.n_with_tail}"),
        ("ceiling, confidence-only (Σ survival + 1, no audit)", f"{s.confidence_only_ceiling:.3f}"),
        (f"<b>ceiling ({s.method} estimator: reported)</b>", iv(s.ceiling)),
        (f"<b>utilization ({s.method} estimator: reported)</b>", iv(s.utilization, True)),
        ("ceiling, regression estimator (confidence-implied tail as auxiliary)", iv(s.ceiling_regression)),
        ("ceiling, ratio estimator (confidence-implied tail as auxiliary)", iv(s.ceiling_ratio)),
        ("ceiling, difference estimator (realized accept length as auxiliary)", iv(s.ceiling_difference)),
        ("ceiling, audited sample only", iv(s.ceiling_direct)),
    ]
    body = "".join(f"<tr><th>{a}</th><td>{b}</td></tr>" for a, b in rows)
    return (f"<h3>Full-traffic ceiling and utilization ({s.level:.0%} request-bootstrap intervals, "
            f"{s.n_boot} resamples)</h3><table class='kv'>{body}</table>")


def _tail_by_workload(pr: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per workload: cap-accept truth vs the compact confidence-only and ratio-corrected estimates."""
    rows = []
    rng = np.random.default_rng(seed)
    for wl, g in pr.dropna(subset=["y", "x"]).groupby("workload"):
        w, x, y = (g[c].to_numpy(float) for c in ("w", "x", "y"))
        truth = float(np.sum(w * y) / np.sum(w))
        conf = float(np.sum(w * x) / np.sum(w))
        idx = rng.integers(0, len(g), size=(n_boot, len(g)))
        bx = np.array([np.sum(w[i] * x[i]) / np.sum(w[i]) for i in idx])
        by = np.array([np.sum(w[i] * y[i]) / np.sum(w[i]) for i in idx])
        lo, hi = np.quantile(bx, [0.025, 0.975])
        tlo, thi = np.quantile(by, [0.025, 0.975])
        rows.append(dict(workload=wl, requests=len(g), truth=truth, truth_lo=tlo, truth_hi=thi, conf_only=conf,
                         conf_lo=lo, conf_hi=hi, truth_in_interval=bool(lo <= truth <= hi)))
    return pd.DataFrame(rows)


def _fig_tail(t: pd.DataFrame) -> Any:
    import plotly.graph_objects as go

    fig = go.Figure()
    fig.add_trace(go.Scatter(x=t["workload"], y=t["truth"], mode="markers", name="cap-accept truth",
                             marker=dict(color="#d62728", size=12, symbol="diamond"),
                             error_y=dict(type="data", array=t["truth_hi"] - t["truth"],
                                          arrayminus=t["truth"] - t["truth_lo"])))
    fig.add_trace(go.Scatter(x=t["workload"], y=t["conf_only"], mode="markers", name="confidence-only estimate",
                             marker=dict(color="#1f77b4", size=10),
                             error_y=dict(type="data", array=t["conf_hi"] - t["conf_only"],
                                          arrayminus=t["conf_only"] - t["conf_lo"])))
    fig.update_layout(title="Ceiling accept length per workload: estimate vs truth", template="plotly_white",
                      height=380, yaxis_title="tokens per block (uncapped, incl. bonus)")
    return fig


def _mape(steps: pd.DataFrame) -> float | None:
    """Mean |predicted - step time| / step time. On the virtual clock the step time is the modeled one, and
    only steps that executed what they scheduled count (cap-accept runs full width whatever it planned)."""
    measured = steps["step_gpu_ms"].where(steps["step_gpu_ms"].notna(), steps["step_cpu_ms"])
    ok = steps["predicted_step_ms"].notna() & measured.notna() & (measured > 0)
    if "modeled_step_ms" in steps and steps["modeled_step_ms"].notna().any():
        measured = steps["modeled_step_ms"]
        ok = (steps["predicted_step_ms"].notna() & measured.notna()
              & (steps["executed_verify_tokens"] == steps["num_verify_tokens"]))
    if not ok.any():
        return None
    return float(np.mean(np.abs(steps.loc[ok, "predicted_step_ms"] - measured[ok]) / measured[ok]))


def _summary_html(findings: list[Finding]) -> str:
    if not findings:
        return "<p>No findings.</p>"
    icon = {"ok": "✔", "warn": "▲", "bad": "✖", "info": "•"}
    bad = sum(f.level == "bad" for f in findings)
    warn = sum(f.level == "warn" for f in findings)
    verdict = ("<p class='verdict bad'>Problems found.</p>" if bad else
               "<p class='verdict warn'>Healthy with warnings.</p>" if warn else
               "<p class='verdict ok'>Healthy.</p>")
    items = "".join(f"<li class='{f.level}'><span class='icon'>{icon.get(f.level, '•')}</span> "
                    f"<b>{html.escape(f.area)}</b>: {html.escape(f.text)}</li>" for f in findings)
    return f"{verdict}<ul class='findings'>{items}</ul>"


_CSS = """
body{font-family:system-ui,-apple-system,Segoe UI,Roboto,sans-serif;margin:0;color:#222;background:#fafafa}
header{background:#1f2937;color:#fff;padding:18px 32px}header h1{margin:0;font-size:22px}
header p{margin:4px 0 0;color:#cbd5e1;font-size:13px}
nav{padding:8px 32px;background:#e5e7eb;font-size:13px}nav a{margin-right:14px;color:#1f2937}
main{padding:8px 32px 40px;max-width:1280px}section{background:#fff;border:1px solid #e5e7eb;border-radius:6px;
padding:8px 20px 16px;margin:18px 0}h2{font-size:18px;border-bottom:1px solid #eee;padding-bottom:6px}
table{border-collapse:collapse;font-size:12.5px;margin:8px 0}th,td{border:1px solid #e5e7eb;padding:3px 8px;
text-align:right}th{background:#f3f4f6}td{white-space:nowrap}table.kv th{text-align:left}
.note,.muted{color:#555;font-size:13px}
ul.findings{list-style:none;padding-left:0}ul.findings li{padding:4px 8px;margin:3px 0;border-radius:4px}
li.ok{background:#ecfdf5}li.warn{background:#fffbeb}li.bad{background:#fef2f2}li.info{background:#f3f4f6}
.scroll{overflow-x:auto}.icon{display:inline-block;width:18px}.verdict{font-weight:600;font-size:16px}.verdict.ok{color:#047857}
.verdict.warn{color:#b45309}.verdict.bad{color:#b91c1c}figure{margin:6px 0}figcaption{font-size:12px;color:#555}
"""


def _render(page: _Page, title: str, ids: Sequence[str]) -> str:
    from plotly.offline import get_plotlyjs

    now = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    nav = "".join(f"<a href='#{s}'>{SECTION_TITLES[s]}</a>" for s in SECTIONS)
    body = "".join(
        f"<section id='{s}'><h2>{SECTION_TITLES[s]}</h2>"
        f"{''.join(page.parts[s]) or '<p class=muted>(nothing to show)</p>'}</section>"
        for s in SECTIONS)
    return (
        "<!DOCTYPE html>\n<html lang='en'><head><meta charset='utf-8'>"
        f"<title>{html.escape(title)}</title><style>{_CSS}</style>"
        f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
        f"<header><h1>{html.escape(title)}</h1><p>generated {now} by acceptscope · runs: "
        f"{html.escape(', '.join(ids))}</p></header><nav>{nav}</nav><main>{body}</main></body></html>\n"
    )
