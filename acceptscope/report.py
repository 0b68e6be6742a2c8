"""The self-contained HTML audit report.

Why this module exists: an audit ends in one file someone can open anywhere,
offline: the written verdict first (what is healthy, what is wrong), then the
evidence. The file embeds plotly.js once (no CDN, no server) and every figure
as a plotly div, so it works from an e-mail attachment or an air-gapped host.

Figures come from the estimators when they can run (:mod:`acceptscope.estimate_views`) and
otherwise from the raw tables (:mod:`acceptscope.figures.tables`); each section says which.
The verdict is rule-based (thresholds in :class:`Thresholds`). The page comes from Jinja2 templates
(``acceptscope/templates``) with autoescape on: code hands the templates plain data, so a run id or
workload name never becomes markup; tables are ``DataFrame.to_html`` (escaped).
"""

from __future__ import annotations

import datetime as dt
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import duckdb
import jinja2
import numpy as np
import pandas as pd
from markupsafe import Markup
from plotly.offline import get_plotlyjs

from acceptscope import audit_sampling, glossary, schema, summaries
from acceptscope import estimate_views as est
from acceptscope.figures import regime as R
from acceptscope.figures import tables as F
from acceptscope.figures.estimates import tail_truth_figure
from acceptscope.outputs import atomic_write, plain_links
from acceptscope.parity import PAIR_KEY, ParityReport, check_parity
from acceptscope.reader import Reader, select_runs
from acceptscope.store import incomplete_runs
from acceptscope.estimators.bootstrap import cluster_weights, request_keys
from acceptscope.estimators.audit_size import advice_sentences
from acceptscope.estimators.registry import registered

# section ids, in page order (tests check that each is present)
SECTIONS = ("summary", "runs", "regime", "curve", "parity", "calibration", "survival", "windows", "utilization",
            "tail", "cost", "registered", "data-quality")
SECTION_TITLES = {
    "summary": "Summary",
    "runs": "Runs",
    "regime": "The seeds' regime: windows per workload, next to the SGLang blog",
    "curve": "Compact vs static throughput over batch size (virtual clock)",
    "parity": "Audit parity",
    "calibration": "Calibration (reliability per position, before and after STS)",
    "registered": "Registered estimators (acceptscope.estimators.registry)",
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


def _arm_run(summary: pd.DataFrame, arm: str) -> str | None:
    s = summary[summary["arm"] == arm]
    return None if s.empty else str(s["run_id"].iloc[0])


# ---------------------------------------------------------------------------
# HTML pieces (templates/blocks.html.j2; everything passed in is escaped there)
# ---------------------------------------------------------------------------
_ENV = jinja2.Environment(loader=jinja2.FileSystemLoader(Path(__file__).with_name("templates")),
                          autoescape=True, undefined=jinja2.StrictUndefined, trim_blocks=True, lstrip_blocks=True)
_B = _ENV.get_template("blocks.html.j2").module
ICONS = {"ok": "✔", "warn": "▲", "bad": "✖", "info": "•"}


def _fmt(v: Any, digits: int = 3) -> str:
    """A cell as plain text: floats to ``digits``, missing as an en dash."""
    if v is None or (isinstance(v, (float, np.floating)) and np.isnan(v)):
        return "–"
    if isinstance(v, (float, np.floating)):
        return f"{v:.{digits}f}"
    return str(v)


def _table(df: pd.DataFrame | None, cols: Sequence[str] | None = None, digits: int = 3) -> Markup:
    """A DataFrame as an escaped HTML table (``DataFrame.to_html``), or a muted '(no rows)'."""
    if df is None or df.empty:
        return _B.no_rows()
    d = df[list(cols)] if cols else df
    text = d.to_html(index=False, border=0, na_rep="–", escape=True, classes="data",
                     float_format=lambda v: _fmt(v, digits), formatters={c: _fmt for c in d.columns
                                                                         if d[c].dtype == object})
    return _B.table(Markup(text))


def _kv(d: dict | Sequence[tuple], title: str | None = None) -> Markup:
    """A two-column key/value table; ``d`` a dict, or (key, value[, strong]) rows."""
    rows = d.items() if isinstance(d, dict) else d
    cell = (lambda v: _fmt(v) if not isinstance(v, (list, dict)) else str(v)[:200])
    return _B.kv([(str(r[0]), cell(r[1]), bool(r[2]) if len(r) > 2 else False) for r in rows], title)


class _Page:
    """The report's sections, each a list of HTML blocks (already escaped by the templates)."""

    def __init__(self) -> None:
        self.parts: dict[str, list[Markup]] = {s: [] for s in SECTIONS}
        self.n_fig = 0

    def add(self, section: str, block: Markup) -> None:
        self.parts[section].append(block)

    def note(self, section: str, text: str) -> None:
        """A paragraph of plain text (notes quote run ids, workloads and error messages)."""
        self.add(section, _B.note(text))

    def fig(self, section: str, fig: Any, caption: str = "", link: tuple[str, str] | None = None) -> None:
        self.n_fig += 1
        plain_links(fig)  # (every figure builder does; a figure made elsewhere too)
        div = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"fig-{section}-{self.n_fig}",
                          config={"displaylogo": False, "responsive": True})
        self.add(section, _B.figure(section, Markup(div), caption, link))

    def render(self, title: str, ids: Sequence[str]) -> str:
        sections = [{"id": s, "title": SECTION_TITLES[s], "blocks": self.parts[s]} for s in SECTIONS]
        return _ENV.get_template("report.html.j2").render(
            title=title, run_ids=list(ids), sections=sections, plotlyjs=Markup(get_plotlyjs()),
            generated=dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")) + "\n"


@dataclass
class _Ctx:
    """What every section reads and writes: the selection, its arms, estimator views and the findings."""

    db: str | Path
    reader: Reader
    ids: list[str]
    th: Thresholds
    page: _Page
    summary: pd.DataFrame
    runs: pd.DataFrame
    compact: str | None
    audit: str | None
    static: str | None
    findings: list[Finding] = field(default_factory=list)
    headline: dict = field(default_factory=dict)
    views: dict = field(default_factory=dict)
    figures: dict = field(default_factory=dict)  # run_id -> acceptscope.glossary figures (from the views)
    est_status: str = "disabled"

    @property
    def truth_run(self) -> str | None:
        return self.audit or self.static

    @property
    def arm_of(self) -> dict:
        return dict(zip(self.runs["run_id"], self.runs["arm"]))

    def find(self, level: str, area: str, text: str) -> None:
        self.findings.append(Finding(level, area, text))


# ---------------------------------------------------------------------------
# the report
# ---------------------------------------------------------------------------
def build_report(
    db: str | Path,
    *,
    run_ids: Sequence[str] | None = None,
    audit_group: str | None = None,
    roles: Sequence[str] | None = None,
    parity: Any = None,
    sampling: Any = None,
    thresholds: Thresholds | None = None,
    use_estimators: bool = True,
    n_boot: int = 200,
    title: str | None = None,
) -> tuple[str, ReportResult]:
    """Render the report for a selection of runs; returns (html text, result)."""
    reader = Reader(db)
    ids = select_runs(reader, run_ids, audit_group, roles)
    if not ids:
        raise LookupError(f"{db}: the database holds no runs")
    summary = reader.run_summary(ids)
    c = _Ctx(db, reader, ids, thresholds or Thresholds(), _Page(), summary, F.runs_in(reader, ids),
             _arm_run(summary, "compact"), _arm_run(summary, "cap-accept"), _arm_run(summary, "static"))
    _completeness(c)
    if use_estimators:
        _run_estimators(c, n_boot)
    _runs_section(c)
    _regime_sections(c)
    par = _parity_section(c, parity)
    _calibration_section(c)
    _survival_windows_sections(c)
    samp = _utilization_section(c, sampling)
    _tail_section(c)
    _cost_section(c)
    _registered_section(c)
    _data_quality_section(c)
    order = {"bad": 0, "warn": 1, "ok": 2, "info": 3}
    c.findings.sort(key=lambda f: order.get(f.level, 9))
    c.page.add("summary", _B.findings(c.findings, ICONS))
    _figures_table(c, samp)
    groups = c.runs["audit_group"].dropna().unique()
    one_group = len(groups) == 1 and c.runs["audit_group"].notna().all()
    default_title = f"acceptscope report: audit group {groups[0]}" if one_group else \
        f"acceptscope report: {', '.join(ids)}"
    text = c.page.render(title or default_title, ids)
    res = ReportResult(None, ids, c.findings, [s for s in SECTIONS if c.page.parts[s]], c.page.n_fig, c.est_status,
                       par.to_dict() if par is not None else None,
                       samp.to_dict() if samp is not None else None, c.headline)
    return text, res


def write_report(db: str | Path, out: str | Path, **kw: Any) -> ReportResult:
    """Render and write the report; returns the result with ``path`` set."""
    text, res = build_report(db, **kw)
    out = atomic_write(out, text)  # a kill or a full disk leaves the old report whole
    res.path = out
    return res


# ---------------------------------------------------------------------------
# sections, in page order
# ---------------------------------------------------------------------------
def _completeness(c: _Ctx) -> None:
    incomplete = incomplete_runs(c.reader.runs(), c.ids)
    for rid in incomplete:
        c.find("warn", "runs", f"run {rid} is incomplete: it has no completion mark (still being written, or the "
               "command writing it was killed); its figures cover only the rows written so far")
    c.headline["complete"] = {rid: rid not in incomplete for rid in c.ids}


def _run_estimators(c: _Ctx, n_boot: int) -> None:
    """Production-side estimates (tail, utilization, cost, planner) on compact; calibration with realized
    labels on the run that recorded the ceiling; validation hides that run's ceiling and compares."""
    ok, why = est.available()
    c.est_status = "used" if ok else why
    if not ok:
        return
    for rid in [r for r in (c.compact, c.truth_run) if r] or c.ids[:1]:
        v, err = est.run_estimates(c.db, rid, n_boot=n_boot)
        c.views[rid] = v
        if err:
            c.est_status = f"failed on {c.arm_of.get(rid, rid)}: {err}"
            c.find("warn", "estimators", f"estimators failed on {rid}: {err}")
        for name, ev in v.items():
            if ev.error:
                c.find("warn", "estimators", f"{name} on {rid}: {ev.error}")
        if figs := est.figures(v):
            c.figures[rid] = figs
    if c.truth_run:
        c.views.setdefault(c.truth_run, {})["validation"] = est.run_validation(c.db, c.truth_run, n_boot=n_boot)


def _figures_table(c: _Ctx, samp: Any) -> None:
    """The glossary's figures of the runs the estimators ran on (and the audited ones of the production arm),
    at the top of the page and in ``headline['figures']``: the one place the report states them."""
    figs = {rid: dict(f) for rid, f in c.figures.items()}
    if samp is not None and c.compact:
        figs.setdefault(c.compact, {}).update(glossary.audited_figures(samp))
    if not figs:
        return
    c.headline["figures"] = {rid: glossary.to_json(f) for rid, f in figs.items()}
    rows = glossary.table_rows({f"{c.arm_of.get(r, r)} ({r})": f for r, f in figs.items()})
    c.page.add("summary", _B.heading("Figures (definitions: acceptscope.glossary)"))
    c.page.add("summary", _B.table_id("glossary-figures", _table(pd.DataFrame(rows))))


def _registered_section(c: _Ctx) -> None:
    """Every estimator registered in :mod:`acceptscope.estimators.registry`: its figure, numbers and tables
    (the production arm first), with no report code of its own."""
    for name in registered():
        _est_figs(c, name, "registered", [c.compact, c.truth_run])


def _est_figs(c: _Ctx, name: str, section: str, prefer: Sequence[str | None]) -> bool:
    """Put estimator ``name``'s figures, headline numbers and tables for the first preferred run."""
    for rid in dict.fromkeys([r for r in prefer if r] + c.ids):
        ev = c.views.get(rid, {}).get(name)
        if ev is None:
            continue
        where = f"estimators.{name} on {rid} ({c.arm_of.get(rid, '')})"
        if ev.skipped:
            c.page.note(section, f"{where}: skipped ({ev.skipped})")
            continue
        if ev.error:
            c.page.note(section, f"{where}: failed ({ev.error})")
            continue
        for f in ev.figures:
            c.page.fig(section, f, where)
        if ev.summary:
            c.page.add(section, _B.details(f"{where}: numbers", _kv(ev.summary)))
        for tname, t in list(ev.tables.items())[:3]:
            c.page.add(section, _B.details(f"{where}: {tname}", _table(t)))
        return bool(ev.figures or ev.summary)
    return False


def _runs_section(c: _Ctx) -> None:
    role = c.summary["run_id"].map(schema.with_roles(c.runs).set_index("run_id")["role"])  # schema.ROLES
    t = _runs_figures(c, c.summary.assign(role=role))
    c.page.add("runs", _table(t, ["run_id", "role", "arm", "engine", "gamma", "requests_seen", "blocks"]
                              + [glossary.FIGURES[k].label for k in RUN_FIGURES.values()] + ["in_window_accept_rate", "mean_cap_trim", "tokens_per_s"]))
    c.page.note("runs", "accept length counts the bonus token (per block; SGLang's spec_accept_length counts per "
                "verify step); ceiling = mean(uncapped correct drafts + 1), recorded in cap-accept and static; "
                "utilization = Σ accept length / Σ ceiling tokens. Where the estimators ran, these are their figures "
                "(acceptscope.glossary; the production arm's ceiling is estimated); elsewhere the arm's own "
                "recorded ones.")
    for row in c.summary.itertuples(index=False):
        if row.arm == "compact" and (row.blocks or 0) > 0 and row.mean_window is not None \
                and row.mean_window >= row.gamma - 1e-9:
            c.find("bad", "scheduler", f"compact verified every draft in {row.run_id} (window = gamma = "
                   f"{row.gamma} on every block): no trimming, zero scheduling gain. SGLang degenerates to "
                   "verify-all when no SPS cost table is loaded.")
        if row.arm == "cap-accept" and (row.mean_cap_trim or 0) == 0 and (row.blocks or 0) > 0:
            c.find("warn", "scheduler", f"no trimming in {row.run_id}: cap_trim is 0 on every block, so the "
                   "scheduler verified whole blocks (no cost table?)")


# run-summary column -> the glossary figure it shows
RUN_FIGURES = {"mean_window": "window", "mean_acc_len": "realized_accept_length", "ceiling_accept_len": "ceiling_tokens",
               "utilization": "utilization"}


def _runs_figures(c: _Ctx, t: pd.DataFrame) -> pd.DataFrame:
    """The runs table with the glossary's figures where the estimators ran (the same numbers as the figures
    table), columns named by the glossary's labels."""
    t = t.copy()
    for col, key in RUN_FIGURES.items():
        for rid, figs in c.figures.items():
            if key in figs and figs[key].estimate is not None:
                t.loc[t["run_id"] == rid, col] = figs[key].estimate
    return t.rename(columns={col: glossary.FIGURES[key].label for col, key in RUN_FIGURES.items()})


def _regime_sections(c: _Ctx) -> None:
    """Per-workload windows / utilization next to the SGLang blog's, and the compact-vs-static curve."""
    src = c.audit or c.compact
    cmp = R.blog_comparison(c.reader.regime_by_workload([src])) if src is not None else None
    if src is None:
        c.page.note("regime", "needs a compact or cap-accept run.")
    elif cmp.empty or "workload" not in cmp:  # a run whose steps hold no request: nothing per workload
        c.page.note("regime", f"run {src} holds no request-steps: no windows or utilization per workload.")
    else:
        if c.compact and c.audit:
            cw = c.reader.regime_by_workload([c.compact]).set_index("workload")["mean_window"]
            cmp.insert(4, "compact_mean_window", cmp["workload"].map(cw))
        c.page.add("regime", _table(cmp))
        c.page.fig("regime", R.fig_regime(cmp, arm=c.arm_of.get(src, "")),
                   f"windows and utilization per workload ({c.arm_of.get(src, '')} run {src}); grey:",
                   link=(R.BLOG_URL, "SGLang DSpark blog (gsm8k, arena-hard, poetry)"))
        cfg = _run_config(c.reader, src)
        c.page.note("regime", f"served with cost profile {cfg.get('cost_profile') or cfg.get('sps_path')} on the "
                    f"{cfg.get('clock', 'wall')} clock, batch {cfg.get('max_running_requests')}, temperature "
                    f"{cfg.get('temperature')}, STS {cfg.get('sts') or 'none'}. Windows are the cap-accept arm's "
                    "(parity makes them compact's); utilization = Σ accept length / Σ (ceiling + 1); shares count "
                    "blocks. The blog's block holds six drafts, ours seven.")
        c.headline["regime"] = cmp.to_dict("records")
        tr = (cmp["share_trimmed"] * cmp["blocks"]).sum() / max(cmp["blocks"].sum(), 1)
        c.headline["share_trimmed"] = float(tr)
        c.find("info", "regime", "mean window per workload " + ", ".join(
            f"{r.workload} {r.mean_window:.2f}" for r in cmp.itertuples())
            + f"; {glossary.FIGURES['trimmed'].label} {glossary.fmt('trimmed', float(tr))}")
        if cfg.get("sps_path"):
            c.page.add("curve", _profile_html(str(cfg["sps_path"])))
    curve = pd.DataFrame()
    for g in c.runs["audit_group"].dropna().unique():
        try:
            curve = c.reader.throughput_curve(f"{g}/curve")
        except duckdb.BinderException:  # a file from before the virtual clock
            curve = pd.DataFrame()
        if len(curve):
            break
    if curve.empty:
        c.page.note("curve", "no curve runs for this audit (needs a cost profile; acceptscope audit runs them "
                    "unless --curve-batches '').")
        return
    c.page.fig("curve", R.fig_throughput_curve(curve), "decode tokens per modeled second (the cost profile's step "
               "times for the tokens each step verified and its requests' contexts); each point is one engine "
               "run at that batch")
    ratios = R.curve_ratios(curve)
    c.page.add("curve", _table(ratios))
    c.headline["curve"] = ratios.to_dict("records")
    for wl, g in ratios.groupby("workload"):
        lo, hi = g.sort_values("batch").iloc[0], g.sort_values("batch").iloc[-1]
        c.find("info", "curve", f"{wl}: compact/static {lo.ratio:.2f}x at batch {int(lo.batch)}, {hi.ratio:.2f}x "
               f"at batch {int(hi.batch)} (virtual clock)")


def _parity_section(c: _Ctx, par: ParityReport | None) -> ParityReport | None:
    if par is None and c.compact and c.audit:
        par = _parity_all_identical(c.reader, c.compact, c.audit) or check_parity(c.reader, c.compact, c.audit)
    if par is None:
        c.page.note("parity", "no compact + cap-accept pair in this selection: parity not checked.")
        return None
    counts = par.counts()
    if par.unverifiable:
        c.find("warn", "parity", f"{par.unverifiable} of {par.pairs} request pairs have no output tokens "
               "recorded: their parity cannot be checked")
    if par.ok and par.unverifiable == par.pairs:
        c.page.note("parity", "no output tokens recorded in these runs: parity not checkable.")
    elif par.ok:
        c.find("ok", "parity", f"audit parity holds: all {par.identical} paired requests committed identical "
               "tokens in both arms")
        c.page.note("parity", f"{par.pairs} request pairs ({par.run_a} vs {par.run_b}), paired by (workload, "
                    "prompt_index, seed): all identical."
                    + (f" Sampled audit: the audit arm replayed {par.pairs} of {par.requests_a} requests."
                       if par.sampled else ""))
    else:
        kinds = ", ".join(f"{n} {k}" for k, n in counts.items() if n)
        c.find("bad", "parity", f"audit parity broken: {len(par.findings)} of {par.pairs} requests diverge "
               f"({kinds}); the audit arm's ceiling may not describe production")
        c.page.note("parity", f"{par.identical} of {par.pairs} pairs identical; findings ({kinds}):")
        c.page.add("parity", _table(par.table(), ["kind", "workload", "prompt_index", "seed", "position",
                                                  "token_a", "token_b", "block_a", "block_b"]))
    c.headline["parity"] = {"ok": par.ok, "pairs": par.pairs, **counts}
    return par


def _parity_all_identical(reader: Reader, run_a: str, run_b: str) -> ParityReport | None:
    """``check_parity``'s report when DuckDB finds nothing to report: every request paired (as its merge
    pairs them: on PAIR_KEY; A's unpaired requests allowed when B is the smaller, sampled arm) and every
    pair identical or without output tokens. One aggregate instead of both runs' token lists in pandas
    (they grow with the run); None (anything else, even a NULL key part) leaves the findings to check_parity."""
    req = schema.REQUESTS.name
    cols = ", ".join(PAIR_KEY)
    r = reader.df(f"""
        WITH a AS (SELECT {cols}, output_tokens, true AS here FROM "{req}" WHERE run_id = ?),
             b AS (SELECT {cols}, output_tokens, true AS here FROM "{req}" WHERE run_id = ?)
        SELECT (SELECT count(*) FROM a) AS n_a, (SELECT count(*) FROM b) AS n_b, count(*) AS joined,
               count(*) FILTER (WHERE b.here IS NULL) AS a_only, count(*) FILTER (WHERE a.here IS NULL) AS b_only,
               count(*) FILTER (WHERE a.here AND b.here AND (a.output_tokens IS NULL OR b.output_tokens IS NULL))
                   AS unverifiable,
               count(*) FILTER (WHERE a.output_tokens = b.output_tokens) AS identical
        FROM a FULL OUTER JOIN b ON {" AND ".join(f"a.{k} = b.{k}" for k in PAIR_KEY)}""", [run_a, run_b]).iloc[0]
    n_a, n_b = int(r.n_a), int(r.n_b)
    sampled = 0 < n_b < n_a
    pairs = int(r.joined - r.a_only - r.b_only)
    if r.b_only or (r.a_only and not sampled) or r.identical + r.unverifiable != pairs:
        return None
    return ParityReport(run_a, run_b, pairs, int(r.identical), [], sampled=sampled, requests_a=n_a,
                        unverifiable=int(r.unverifiable))


def _calibration_section(c: _Ctx) -> None:
    calib_run = c.audit or c.static or c.ids[0]
    bins = F.reliability_bins(c.reader, [calib_run])
    if not _est_figs(c, "calibration", "calibration", [calib_run]):
        if bins.empty:
            c.page.note("calibration", "no blocks with an observed ceiling: reliability needs cap-accept or static.")
        else:
            c.page.note("calibration", f"computed from raw tables (estimators.calibration unavailable: "
                        f"{c.est_status}): plug-in reliability, 15 equal-width bins, Wilson 95% bands.")
            c.page.fig("calibration", F.fig_reliability(bins, calib_run), f"reliability, {calib_run}")
    ece = F.ece_table(bins)
    sts_hash = c.reader.df(f'SELECT sts_hash FROM "{RUNS_TABLE}" WHERE run_id = ?', [calib_run])["sts_hash"]
    if len(sts_hash) and sts_hash.isna().all():
        c.page.note("calibration", f"{calib_run} ran without an STS table: the recorded confidence is the raw head "
                    "output, so 'before' and 'after' STS coincide in the ECE table below.")
    if ece.empty:
        return
    wide = ece.pivot_table(index="position", columns="variant", values="ece").reset_index()
    wide["n"] = wide["position"].map(ece[ece["variant"] == "after"].set_index("position")["n"])
    wide.columns = [f"ece_{col}_sts" if col in ("before", "after") else col for col in wide.columns]
    c.page.add("calibration", _B.heading("ECE table (plug-in, 15 equal-width bins)"))
    c.page.add("calibration", _table(wide))
    th = c.th
    after = ece[(ece["variant"] == "after") & (ece["n"] >= th.min_bin_n)]
    bad = after[after["ece"] > th.ece]
    if len(bad):
        worst = bad.sort_values("ece").iloc[-1]
        c.find("warn", "calibration", f"ECE after STS above {th.ece:.2f} at position(s) "
               f"{', '.join(str(int(k)) for k in bad['position'])} (worst {worst.ece:.3f} at k={int(worst.position)}, "
               f"n={int(worst.n)})")
    elif len(after):
        c.find("ok", "calibration", f"ECE after STS ≤ {th.ece:.2f} at every position with ≥{th.min_bin_n} "
               f"labelled samples (max {after['ece'].max():.3f})")
    c.headline["ece_after_max"] = float(after["ece"].max()) if len(after) else None


def _survival_windows_sections(c: _Ctx) -> None:
    pos = c.reader.position_acceptance(c.ids)
    if len(pos):
        c.page.fig("survival", F.fig_survival(pos), "dotted: mean predicted survival Π c_j; solid: empirical "
                   "P(ceiling ≥ k) with Wilson 95% intervals (arms with an observed ceiling)")
    else:
        c.page.note("survival", "no blocks recorded.")
    win = c.reader.window_distribution(c.ids)
    if len(win):
        c.page.fig("windows", F.fig_windows(win), "share of blocks per verified window")


def _utilization_section(c: _Ctx, samp: Any) -> Any:
    util = c.reader.utilization_by_workload(c.ids)
    if len(util):
        c.page.fig("utilization", F.fig_utilization(util), "bars: realized accept length per arm; ticks: that "
                   "arm's observed ceiling (cap-accept and static only)")
    _est_figs(c, "utilization", "utilization", [c.compact])
    if samp is None and c.compact and c.audit:
        try:
            samp = audit_sampling.infer_runs(c.reader, c.compact, c.audit)
        except ValueError as e:
            c.page.note("utilization", f"no full-traffic inference: {e}")
    if samp is not None:
        c.page.add("utilization", _sampling_html(samp))
        a = glossary.audited_figures(samp)
        u, ce = a["audited_utilization"], a["audited_ceiling_tokens"]
        c.headline["utilization"] = {**u.as_dict(), "arm": "compact", "figure": "audited_utilization"}
        c.headline["ceiling"] = {**ce.as_dict(), "figure": "audited_ceiling_tokens"}
        L = glossary.FIGURES
        c.find("ok" if u.estimate >= c.th.utilization else "warn", "utilization",
               f"compact {L['audited_utilization'].label} {glossary.show('audited_utilization', u)} "
               f"({L['audited_ceiling_tokens'].label} {glossary.show('audited_ceiling_tokens', ce)}; "
               f"{samp.n_audited}/{samp.n_requests} requests audited; "
               f"{glossary.INTERVALS['sampling'].label})")
        if samp.n_audited < samp.n_requests and samp.n_with_tail == 0:
            c.find("warn", "utilization", f"none of the {samp.n_audited} audited requests showed a trimmed tail, "
                   "so the interval cannot bound tails elsewhere: audit a larger fraction")
    if samp is None and c.compact:
        _production_only(c)
    return samp


def _production_only(c: _Ctx) -> None:
    """A compact run with no audit arm: utilization against the ceiling the tail estimator inferred
    from the run's own telemetry, and a plain statement of what is observed and what is estimated."""
    tv, figs = c.views.get(c.compact, {}).get("tail"), c.figures.get(c.compact, {})
    u = figs.get("utilization")
    if tv is None or tv.raw is None or u is None or u.estimate is None:
        return
    s = tv.raw.summary()
    c.headline["utilization"] = {**u.as_dict(), "basis": "estimated ceiling (no audit arm)", "arm": "compact",
                                 "figure": "utilization"}
    c.find("ok" if u.estimate >= c.th.utilization else "warn", "utilization",
           f"compact {glossary.FIGURES['utilization'].label} {glossary.show('utilization', u)} "
           f"({glossary.INTERVALS['model'].label}), no audit arm: "
           f"{s['n_unresolved']} of {s['n_censored']} trimmed blocks are model-based")
    for section in ("utilization", "tail"):
        c.page.note(section, s["statement"])


def _tail_section(c: _Ctx) -> None:
    shown = _est_figs(c, "tail", "tail", [c.compact])
    shown = _est_figs(c, "validation", "tail", [c.truth_run]) or shown
    _est_figs(c, "interval_health", "tail", [c.compact])
    views = c.views.get(c.compact or "", {})
    if (hv := views.get("interval_health")) is not None and hv.raw is not None:  # estimators.health
        c.find("ok" if hv.raw.table["covered"].all() else "warn", "tail", hv.raw.verdict())
    for line in advice_sentences(getattr(getattr(views.get("tail"), "raw", None), "advice", [])):
        c.find("info", "tail", f"audit size for the compact run's mean ceiling, {line}")
    val = c.views.get(c.truth_run or "", {}).get("validation")
    if val is not None and not val.error:
        cover = val.summary.get("targets.aggregate95_cover_rate")
        if cover is not None:
            c.headline["tail_aggregate95_cover_rate"] = cover
            c.find("ok" if cover >= 0.9 else "warn", "tail", f"counterfactual-tail 95% intervals cover the hidden "
                   f"cap-accept truth in {cover:.0%} of groups (validation on {c.truth_run})")
    if not (c.compact and c.truth_run):
        if not shown:
            c.page.note("tail", "needs a compact run and a cap-accept (or static) run of the same workload.")
        return
    tail_tbl = _tail_table(c.reader, c.compact, c.truth_run)
    if tail_tbl.empty:
        return
    c.page.fig("tail", tail_truth_figure(tail_tbl), "compact's confidence-only estimate (Σ survival + 1 per block) "
               "against the cap-accept truth, both with request-bootstrap 95% intervals")
    c.page.add("tail", _table(tail_tbl))
    worst = tail_tbl.iloc[(tail_tbl["conf_only"] - tail_tbl["truth"]).abs().argmax()]
    rel = (worst.conf_only - worst.truth) / worst.truth
    if not shown:
        c.page.note("tail", f"computed from raw tables (estimators.tail unavailable: {c.est_status}).")
    missed = tail_tbl.loc[~tail_tbl["truth_in_interval"].astype(bool), "workload"].astype(str).tolist()
    # the verdict reads the table it summarizes: a truth outside its interval is never "ok"
    c.find("warn" if abs(rel) > 0.1 or missed else "ok", "tail", "the confidence head's own ceiling forecast "
           f"(Σ survival + 1 per block) is off by {rel:+.0%} on {worst.workload} ({worst.conf_only:.2f} vs truth "
           f"{worst.truth:.2f} tokens/block)" + (f"; the truth lies outside its 95% interval on {', '.join(missed)}"
                                                 if missed else "; the truth lies inside its 95% interval on every "
                                                 "workload"))
    c.headline["tail_truth_outside"] = missed


def _cost_section(c: _Ctx) -> None:
    """The cost fit and the planner's step-time model, each judged against the clock that timed the run:
    on the virtual clock the step time is the modeled one (the profile's table + the requests' contexts), so
    an error against CPU wall times says nothing about it."""
    _est_figs(c, "cost", "cost", [c.compact])
    _est_figs(c, "planner", "cost", [c.compact])
    steps = c.reader.step_costs(c.ids, STEP_POINTS, means=False)  # real steps: the error is per step
    virtual = len(steps) > 0 and "modeled_step_ms" in steps and steps["modeled_step_ms"].notna().any()
    cost_ev = c.views.get(c.compact or "", {}).get("cost")
    if cost_ev is not None and not cost_ev.error and not cost_ev.skipped:
        rel = cost_ev.summary.get("held_out.mean_rel_err", cost_ev.summary.get("in_sample.mean_rel_err"))
        if rel is not None:
            c.headline["cost_fit_rel_err"] = rel
            if virtual:
                c.find("info", "cost", f"fitted step-time cost model (estimators.cost): {rel:.0%} mean relative "
                       "error on held-out steps against their CPU wall times; the run was timed on the virtual "
                       "clock, so this does not judge the clock or the planner's table")
            else:
                c.find("warn" if rel > c.th.cost_mape else "ok", "cost", f"fitted step-time cost model: {rel:.0%} "
                       "mean relative error on held-out steps (estimators.cost)")
    if steps.empty:
        return
    mape = _mape(steps)
    if mape is not None:
        if virtual:  # the figure compares with the clock that timed the run, as the verdict does
            c.page.fig("cost", F.fig_step_costs(steps.assign(step_gpu_ms=steps["modeled_step_ms"], step_cpu_ms=np.nan), c.runs),
                       "per step; measured = the virtual clock's modeled step time (the clock that timed the run)")
        else:
            c.page.fig("cost", F.fig_step_costs(steps, c.runs), "per step; measured = device time where recorded, "
                       "else host inter-step time")
    c.page.fig("cost", F.fig_throughput(steps, c.runs), "verify tokens the target ran per decode step")
    if mape is None:
        c.page.note("cost", "no step carries both a predicted and a measured step time (no cost table in use?): "
                    "the step-time model cannot be checked.")
        return
    c.headline["cost_mape"] = mape
    c.headline["cost_clock"] = "virtual" if virtual else "wall"
    if virtual:
        c.find("info", "cost", f"virtual clock: the planner's predicted step time (the profile's table, measured "
               f"at its own context length) differs from the modeled step time (the table + the requests' own "
               f"contexts) by {mape:.1%} mean absolute on compact steps; the clock itself is checked against the "
               "GPU in the curve section's cost-profile table")
    else:
        c.find("warn" if mape > c.th.cost_mape else "ok", "cost", f"step-time model error {mape:.0%} mean "
               f"absolute (threshold {c.th.cost_mape:.0%})")


def _data_quality_section(c: _Ctx) -> None:
    dq = c.reader.data_quality(c.ids)
    c.page.add("data-quality", _table(dq))
    if len(dq) and (dq["rejects"].sum() or dq["gaps"].sum()):
        c.find("warn", "data", f"{int(dq['rejects'].sum())} rejected records and {int(dq['gaps'].sum())} stream "
               "gaps in the selected runs")


# ---------------------------------------------------------------------------
# pieces
# ---------------------------------------------------------------------------
def _run_config(reader: Reader, run_id: str) -> dict:
    col = reader.df(f'SELECT config_json FROM "{RUNS_TABLE}" WHERE run_id = ?', [run_id])["config_json"]
    try:
        return json.loads(col.iloc[0]) if len(col) and isinstance(col.iloc[0], str) else {}
    except ValueError:
        return {}


def _profile_html(sps_path: str) -> Markup:
    """Provenance, bound ratio and virtual-clock check of a measured GPU cost profile (if it has a manifest)."""
    rows, notes = R.cost_profile(sps_path)
    if rows is None:
        return _B.note(notes[0])
    out = _kv(rows, title="Cost profile")
    for n in notes:
        out += _B.note(n)
    return out


def _sampling_html(s: Any) -> Markup:
    def iv(i: Any, pct: bool = False) -> str:
        if i is None:
            return "–"
        f = (lambda v: f"{v:.1%}") if pct else (lambda v: f"{v:.3f}")
        return f"{f(i.estimate)} [{f(i.lo)}, {f(i.hi)}]"

    L, a = glossary.FIGURES, glossary.audited_figures(s)
    rows = [
        ("requests (compact) / audited", f"{s.n_requests} / {s.n_audited} ({s.fraction:.0%})"),
        (f"{L['realized_accept_length'].label} (compact, all traffic)", f"{s.realized_accept_len:.3f}"),
        ("audited requests with a trimmed tail", f"{s.n_with_tail}"),
        ("ceiling, confidence-only (Σ survival + 1, no audit)", f"{s.confidence_only_ceiling:.3f}"),
        (f"{L['audited_ceiling_tokens'].label} ({s.method} estimator: reported)",
         glossary.show("audited_ceiling_tokens", a["audited_ceiling_tokens"]), True),
        (f"compact {L['audited_utilization'].label} ({s.method} estimator: reported)",
         glossary.show("audited_utilization", a["audited_utilization"]), True),
        ("ceiling, regression estimator (confidence-implied tail as auxiliary)", iv(s.ceiling_regression)),
        ("ceiling, ratio estimator (confidence-implied tail as auxiliary)", iv(s.ceiling_ratio)),
        ("ceiling, difference estimator (realized accept length as auxiliary)", iv(s.ceiling_difference)),
        ("ceiling, audited sample only", iv(s.ceiling_direct)),
    ]
    return _kv(rows, title=f"Full-traffic ceiling and compact utilization ({s.level:.0%} request-bootstrap "
                           f"intervals, {s.n_boot} resamples)")


STEP_POINTS = 20_000  # steps per run in the cost figures and the step-time error; longer runs are thinned evenly


TAIL_CHUNK_VECTORS = 64  # the tail table reads its per-request rows in chunks of 64 x 2,048 requests


class _TailSums:
    """Per workload: the sums the tail table is made of (Σw, Σwx, Σwy and their n_boot replicates), fed
    chunks of per-request rows. A request's bootstrap weights depend on its key only, so chunks add up:
    the table needs no frame of every request (a 100M-row run has millions)."""

    def __init__(self, n_boot: int = 1000, seed: int = 0) -> None:
        self.n_boot, self.seed = n_boot, seed
        self.acc: dict[Any, list] = {}  # workload -> [requests, Σw, Σwx, Σwy, sw[], swx[], swy[]]

    def add(self, pr: pd.DataFrame) -> None:
        n_boot = self.n_boot
        for wl, g in pr.dropna(subset=["y", "x"]).groupby("workload"):
            w, x, y = (g[c].to_numpy(float) for c in ("w", "x", "y"))
            a = self.acc.setdefault(wl, [0, 0.0, 0.0, 0.0, np.zeros(n_boot), np.zeros(n_boot), np.zeros(n_boot)])
            a[0] += len(g)
            a[1], a[2], a[3] = a[1] + np.sum(w), a[2] + np.sum(w * x), a[3] + np.sum(w * y)
            keys = request_keys(g["workload"], g["prompt_index"].astype(str) + "/" + g["seed"].astype(str))
            step = max(1, (1 << 21) // max(n_boot, 1))  # requests per block: weights of <= 16 MB, never n_boot x n
            for i in range(0, len(g), step):  # a request's weights depend on its key only: blocks add up
                bw = cluster_weights(keys[i:i + step], n_boot, self.seed) * w[i:i + step]
                a[4], a[5], a[6] = a[4] + bw.sum(axis=1), a[5] + bw @ x[i:i + step], a[6] + bw @ y[i:i + step]

    def table(self) -> pd.DataFrame:
        rows = []
        for wl in sorted(self.acc):
            n, s_w, s_wx, s_wy, sw, swx, swy = self.acc[wl]
            truth, conf = float(s_wy / s_w), float(s_wx / s_w)
            drawn = sw > 0  # a replicate that drew no request has no mean (Poisson(1) weights, small n)
            bx, by = swx[drawn] / sw[drawn], swy[drawn] / sw[drawn]
            lo, hi = np.quantile(bx, [0.025, 0.975]) if drawn.any() else (np.nan, np.nan)
            tlo, thi = np.quantile(by, [0.025, 0.975]) if drawn.any() else (np.nan, np.nan)
            rows.append(dict(workload=wl, requests=n, truth=truth, truth_lo=tlo, truth_hi=thi, conf_only=conf,
                             conf_lo=lo, conf_hi=hi, truth_in_interval=bool(lo <= truth <= hi)))
        return pd.DataFrame(rows)


def _tail_by_workload(pr: pd.DataFrame, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """Per workload: cap-accept truth vs the compact confidence-only estimate, with request-clustered
    bootstrap intervals (estimators.bootstrap's keyed Poisson weights, the estimators' own bootstrap;
    a request is keyed by (workload, prompt_index, seed), the same in the compact and audited runs)."""
    sums = _TailSums(n_boot, seed)
    sums.add(pr)
    return sums.table()


def _tail_table(reader: Reader, compact_run: str, truth_run: str, n_boot: int = 1000, seed: int = 0) -> pd.DataFrame:
    """:func:`_tail_by_workload` over ``audit_sampling.per_request``'s rows, read from DuckDB in chunks
    (in its order, so a run of one chunk gets the same table): memory bounded by a chunk, not the run."""
    def read(con: duckdb.DuckDBPyConnection) -> pd.DataFrame:
        sums = _TailSums(n_boot, seed)
        cur = con.execute(summaries.per_request_sql(con, compact_run, truth_run)
                          + " ORDER BY workload, prompt_index, seed", {"c": compact_run, "a": truth_run})
        while len(chunk := cur.fetch_df_chunk(TAIL_CHUNK_VECTORS)):
            sums.add(chunk)
        return sums.table()

    return reader.summary(read)


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
