"""One glossary: every figure a surface shows, its definition, unit, short label and the ONE function that
computes it.

Why this module exists (issue 31): the same quantity read differently from one surface to the next ("accept
len 4.19" per verify step in the audit CLI, 4.41 per block in the report; the ceiling 3.762 in drafts in
``estimate`` and 4.762 tokens per block in the report; a utilization interval of request sampling beside one of
hazard refits under the same words). Every surface (the audit CLI, ``estimate``, ``report --json`` and HTML,
the dashboard, the notebook) reads its figures through :func:`run_figures` / :func:`audited_figures` /
:func:`accept_length_per_step` and its words through :data:`FIGURES`; ``tests/test_surfaces_agree.py`` holds
them equal on one database. Figures that differ on purpose (per verify step vs per block, drafts vs tokens,
estimated vs audited ceiling) have different labels.

Sources: a run's estimator results (:func:`acceptscope.estimators.run_all` / ``run_all_runs``, as
``to_jsonable`` writes them: what ``estimate --json`` prints and the exporter serves), a
:class:`acceptscope.audit_sampling.SamplingInference` (or its ``to_dict``) for the audited figures, or the store
for the per-verify-step accept length. Pure Python on purpose: every layer may import it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Callable


@dataclass(frozen=True)
class Interval:
    """What an interval covers; ``label`` is how a surface names it."""

    key: str
    label: str
    definition: str


INTERVALS = {i.key: i for i in (
    Interval("model", "95% model interval",
             "95% request-clustered bootstrap of the tail estimator's mean ceiling, each replicate with its own "
             "hazard refit, widened by the unobserved-position band (the positions the walk cannot follow under "
             "the prior's shifts), then clipped to the model-free bounds"),
    Interval("bounds", "model-free bounds",
             "what the telemetry proves whatever the model: every unresolved trimmed position rejected (lo) or "
             "accepted (hi)"),
    Interval("sampling", "95% audit-sampling interval",
             "95% bootstrap over the audited requests (the audit arm's sample of the traffic); a point when every "
             "request is audited"),
)}


@dataclass(frozen=True)
class Value:
    """One figure of one run: the estimate and, where it has one, its interval."""

    estimate: float | None
    lo: float | None = None
    hi: float | None = None

    def as_dict(self) -> dict:
        return {"estimate": self.estimate, "lo": self.lo, "hi": self.hi}


@dataclass(frozen=True)
class Figure:
    key: str
    label: str  # the short label every surface prints (unit included where it could be misread)
    unit: str
    definition: str
    source: str  # results | audit | store
    fmt: str  # how a surface prints it ("pct": a percentage)
    interval: str | None = None  # an INTERVALS key
    bounds: str | None = None  # the key of the figure holding its model-free bounds


def _f(v: Any) -> float | None:
    """A number, or None for what is missing (None, NaN, pandas' NA)."""
    try:
        v = float(v)
    except (TypeError, ValueError):
        return None
    return None if math.isnan(v) else v


# ----------------------------------------------------------------------------------------------
# the functions: estimator results (to_jsonable form)
# ----------------------------------------------------------------------------------------------
def _run_row(res: dict) -> dict | None:
    rows = [g for g in (res.get("utilization") or {}).get("by_group") or [] if g.get("by") == "run"]
    return rows[0] if rows else None


def _tail_all(res: dict) -> dict | None:
    rows = [a for a in (res.get("tail") or {}).get("aggregate") or [] if a.get("group") == "all"]
    return rows[0] if rows else None


def realized_accept_length(res: dict) -> Value:
    r = _run_row(res)
    return Value(None if r is None or not r.get("n") else r["committed"] / r["n"])


def window(res: dict) -> Value:
    r = _run_row(res)
    return Value(None if r is None else _f(r.get("mean_window")))


def trimmed(res: dict) -> Value:
    t = (res.get("bracket") or {}).get("trim") or {}
    n = t.get("request_steps")
    return Value(t["trimmed_request_steps"] / n if n else None)


def ceiling_drafts(res: dict) -> Value:
    """The ceiling utilization is against (its ceiling tokens per block - 1): the recorded one where the run
    recorded it on every request-step (a point: the tail estimator's forecast of it is validation, not the
    figure), else the tail estimator's, with its model interval."""
    r, a = _run_row(res), _tail_all(res)
    if r is None or not r.get("n"):
        return Value(None)
    point = r["ceiling_tokens"] / r["n"] - 1.0
    if r.get("exact") or a is None:
        return Value(point, point, point) if r.get("exact") else Value(point)
    return Value(point, _f(a.get("lo")), _f(a.get("hi")))


def ceiling_tokens(res: dict) -> Value:
    d = ceiling_drafts(res)
    return Value(*(None if v is None else v + 1.0 for v in (d.estimate, d.lo, d.hi)))


def ceiling_bounds(res: dict) -> Value:
    r = _run_row(res)
    if r is None:
        return Value(None)
    lo, hi = _f(r.get("ceiling_bound_lo")), _f(r.get("ceiling_bound_hi"))
    return Value(None, lo, hi)


def utilization(res: dict) -> Value:
    r = _run_row(res)
    if r is None:
        return Value(None)
    return Value(_f(r.get("utilization")), _f(r.get("util_lo")), _f(r.get("util_hi")))


def utilization_bounds(res: dict) -> Value:
    r = _run_row(res)
    return Value(None) if r is None else Value(None, _f(r.get("util_bound_lo")), _f(r.get("util_bound_hi")))


# ----------------------------------------------------------------------------------------------
# an audited sample (audit_sampling.infer_runs: the audit arm's truth carried to the whole traffic)
# ----------------------------------------------------------------------------------------------
def _samp(s: Any, name: str) -> Value:
    d = s if isinstance(s, dict) else s.to_dict()
    i = d.get(name)
    return Value(None) if i is None else Value(_f(i["estimate"]), _f(i["lo"]), _f(i["hi"]))


def audited_ceiling_tokens(sampling: Any) -> Value:
    return _samp(sampling, "ceiling")


def audited_utilization(sampling: Any) -> Value:
    return _samp(sampling, "utilization")


# ----------------------------------------------------------------------------------------------
# the store
# ----------------------------------------------------------------------------------------------
def accept_length_per_step(store: Any, run_id: str) -> Value:
    """Σ completion tokens / Σ verify steps over the run's requests (``store``: anything with
    ``query_df(sql, params)``: a Store or a Reader's ``df``)."""
    q = getattr(store, "query_df", None) or store.df
    d = q("SELECT sum(completion_tokens) AS toks, sum(spec_verify_ct) AS v FROM requests WHERE run_id = ?", [run_id])
    toks, v = (None if d.empty else d.iloc[0][c] for c in ("toks", "v"))
    return Value(float(toks) / float(v) if v is not None and toks is not None and float(v) > 0 else None)


FIGURES: dict[str, Figure] = {f.key: f for f in (
    Figure("accept_length_per_step", "tokens/verify step", "completion tokens per verify step",
           "completion tokens / verify steps, pooled over requests: SGLang's spec_accept_length (the prefill "
           "token counted, each request's last block cut at its stop); not the per-block accept length",
           "store", ".2f"),
    Figure("realized_accept_length", "accept length (tokens/block)", "committed tokens per block",
           "committed tokens per verified block: accepted drafts + 1 bonus token", "results", ".3f"),
    Figure("window", "window (drafts/block)", "verified drafts per block",
           "drafts the planner sent to verify per block (gamma when untrimmed)", "results", ".2f"),
    Figure("trimmed", "trimmed blocks", "share of request-steps",
           "share of blocks (request-steps) whose window the planner trimmed below gamma", "results", "pct"),
    Figure("ceiling_drafts", "ceiling (drafts)", "uncapped correct drafts per block",
           "mean uncapped correct drafts per block: what a full-gamma verify would have accepted (recorded in "
           "cap-accept and static runs, estimated by the tail estimator where trimmed)", "results", ".3f",
           interval="model", bounds="ceiling_bounds"),
    Figure("ceiling_tokens", "ceiling (tokens/block)", "tokens per block",
           "ceiling (drafts) + 1 bonus token: the accept length a full-gamma verify would have given",
           "results", ".3f", interval="model"),
    Figure("ceiling_bounds", "ceiling model-free bounds (drafts)", "uncapped correct drafts per block",
           "the ceiling (drafts) between what the telemetry proves alone", "results", ".3f", interval="bounds"),
    Figure("utilization", "utilization (estimated ceiling)", "share of the ceiling",
           "committed tokens / ceiling tokens, the ceiling from the tail estimator (recorded where the run "
           "verified whole blocks)", "results", "pct", interval="model", bounds="utilization_bounds"),
    Figure("utilization_bounds", "utilization model-free bounds", "share of the ceiling",
           "utilization between what the telemetry proves alone", "results", "pct", interval="bounds"),
    Figure("audited_ceiling_tokens", "ceiling, audited (tokens/block)", "tokens per block",
           "the audit arm's recorded ceiling + 1 carried to the production arm's whole traffic "
           "(audit_sampling.infer_runs)", "audit", ".3f", interval="sampling"),
    Figure("audited_utilization", "utilization (audited ceiling)", "share of the ceiling",
           "the production arm's committed tokens / the audited ceiling tokens over its whole traffic "
           "(audit_sampling.infer_runs)", "audit", "pct", interval="sampling"),
)}

FUNCTIONS: dict[str, Callable[[Any], Value]] = {
    "realized_accept_length": realized_accept_length, "window": window, "trimmed": trimmed,
    "ceiling_drafts": ceiling_drafts, "ceiling_tokens": ceiling_tokens, "ceiling_bounds": ceiling_bounds,
    "utilization": utilization, "utilization_bounds": utilization_bounds,
    "audited_ceiling_tokens": audited_ceiling_tokens, "audited_utilization": audited_utilization,
}
PIPELINE_KEYS = ("run", "tail", "bracket", "utilization")  # the results the figures read (estimators.pipeline.assemble)
RESULT_FIGURES = tuple(k for k, f in FIGURES.items() if f.source == "results")
AUDIT_FIGURES = tuple(k for k, f in FIGURES.items() if f.source == "audit")


def run_figures(res: dict) -> dict[str, Value]:
    """Every results-sourced figure of one run, from its ``to_jsonable`` results (a run whose estimate
    failed, ``{"error": ...}``, has none)."""
    if not isinstance(res, dict) or "error" in res:
        return {}
    return {k: FUNCTIONS[k](res) for k in RESULT_FIGURES}


def audited_figures(sampling: Any) -> dict[str, Value]:
    return {} if sampling is None else {k: FUNCTIONS[k](sampling) for k in AUDIT_FIGURES}


def fmt(key: str, v: float | None) -> str:
    """One number of figure ``key`` as every surface prints it (an en dash when missing)."""
    v = _f(v)
    if v is None:
        return "–"
    f = FIGURES[key].fmt
    return f"{v:.1%}" if f == "pct" else format(v, f)


def show(key: str, v: Value, interval: bool = True) -> str:
    """``estimate [lo, hi]`` (bounds alone: ``[lo, hi]``) in the figure's format."""
    if v.estimate is None and v.lo is None:
        return "–"
    iv = f"[{fmt(key, v.lo)}, {fmt(key, v.hi)}]" if interval and v.lo is not None and v.hi is not None else ""
    if v.estimate is None:
        return iv
    return f"{fmt(key, v.estimate)} {iv}".rstrip()


def to_json(figs: dict[str, Value]) -> dict:
    """Figures as ``report --json`` / the audit's JSON carry them: key -> {estimate, lo, hi, label, unit,
    interval}."""
    return {k: {**v.as_dict(), "label": FIGURES[k].label, "unit": FIGURES[k].unit,
                "interval": INTERVALS[FIGURES[k].interval].label if FIGURES[k].interval else None}
            for k, v in figs.items()}


def table_rows(figs_by_column: dict[str, dict[str, Value]]) -> list[dict]:
    """One row per figure any column has (glossary order): label, unit, interval, then each column's value as
    :func:`show` prints it: the figures table of the report and the dashboard."""
    rows = []
    for key, g in FIGURES.items():
        if any(key in f for f in figs_by_column.values()):
            rows.append({"figure": g.label, **{col: show(key, f[key]) if key in f else "–"
                                               for col, f in figs_by_column.items()},
                         "unit": g.unit, "interval": INTERVALS[g.interval].label if g.interval else ""})
    return rows
