"""Engines side by side: runs of SGLang/acceptscope, vLLM, TensorRT-LLM and AIPerf on the figures they share.

Why: users compare acceptance numbers across engines and get different answers because the definitions
differ (bonus token in or out, the denominator of per-position acceptance, tokens submitted vs accepted).
The table is :func:`acceptscope.ingest.engines.identify.compare` (one definition per column, stated above it);
a figure an engine's data does not identify is empty, never filled in. Under compact, TensorRT-LLM's
counters only bound the cost of trimming: the trim-loss chart sets that bound beside acceptscope's interval
on the same defined quantity (accepted drafts lost per scored request-step, bonus excluded).
"""

from __future__ import annotations

import pandas as pd
import plotly.graph_objects as go
import streamlit as st

from acceptscope.app.panels._ctx import plain
from acceptscope.estimators import run_all_runs, to_jsonable
from acceptscope.ingest.engines.identify import COUNTED_ENGINES, DEFINITIONS, NOT_IDENTIFIED, compare
from acceptscope.store import Store

TITLE = "Engines side by side"
SHOWN = ("run_id", "engine", "arm", "gamma", "drafts", "mean_acceptance_length", "draft_acceptance_rate",
         "trim_regret_rate", "first_accepted_rate", "trim_loss_bound_lo", "trim_loss_bound_hi", "trim_loss_estimate",
         "trim_loss_lo", "trim_loss_hi", "trim_loss_source")


@st.cache_data(max_entries=32, show_spinner=False)
def _compare(db: str, version: tuple, run_ids: tuple[str, ...], native: tuple[str, ...]) -> pd.DataFrame:
    """The comparison, with acceptscope's own estimate of each ``native`` run (its trim-loss interval; a run the
    estimators cannot read keeps the engine-neutral figures)."""
    store = Store(db, read_only=True)
    res = run_all_runs(store, list(native)) if native else {}
    est = {r: {"error": str(v)} if isinstance(v, Exception) else to_jsonable(v) for r, v in res.items()}
    return compare(store, list(run_ids), estimates=est)


def trim_loss_figure(df: pd.DataFrame) -> go.Figure:
    """Per run: the model-free bound of the trim loss (a bar from lo to hi) and acceptscope's estimate with its
    interval where it has one."""
    fig = go.Figure()
    x = [f"{e} · {r}" for e, r in zip(df["engine"], df["run_id"])]
    lo, hi = df["trim_loss_bound_lo"].astype(float), df["trim_loss_bound_hi"].astype(float)
    fig.add_trace(go.Bar(x=x, y=hi - lo, base=lo, name="model-free bound (TensorRT-LLM's counters)", opacity=0.35))
    est = df["trim_loss_estimate"].astype(float)
    fig.add_trace(go.Scatter(x=x, y=est, mode="markers", name="acceptscope estimate [95%]", marker=dict(size=10),
                             error_y=dict(type="data", symmetric=False, array=(df["trim_loss_hi"].astype(float) - est),
                                          arrayminus=(est - df["trim_loss_lo"].astype(float)))))
    fig.update_layout(title="Trim loss: accepted drafts lost per scored request-step (bonus excluded)", height=380,
                      template="plotly_white", yaxis_title="drafts per request-step", legend=dict(orientation="h", y=-0.25))
    return fig


def render(ctx) -> None:
    engines = ctx.runs.set_index("run_id").reindex(list(ctx.run_ids))["engine"].astype(str)
    counted = sorted(set(engines) & set(COUNTED_ENGINES))
    if not counted:
        return  # nothing to set side by side: every selected run is read by the estimators themselves
    st.header(TITLE)
    st.caption(plain("Definitions: " + DEFINITIONS))
    native = tuple(r for r, e in engines.items() if e not in COUNTED_ENGINES)
    df = _compare(ctx.db, ctx.version, tuple(ctx.run_ids), native)
    st.dataframe(df[[c for c in SHOWN if c in df.columns]], hide_index=True, key="engines_table")
    if df[["trim_loss_bound_lo", "trim_loss_bound_hi"]].notna().all(axis=1).any():
        st.plotly_chart(trim_loss_figure(df.dropna(subset=["trim_loss_bound_lo", "trim_loss_bound_hi"])),
                        key="engines_trim_loss")
    for engine in counted:
        st.caption(plain(f"{engine}: not identified by its data: " + "; ".join(NOT_IDENTIFIED.get(engine, []))))
