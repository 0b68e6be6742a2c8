"""Utilization: realized accept length against the ceiling (observed, or inferred for compact)."""

from __future__ import annotations

import streamlit as st

from acceptscope import glossary
from acceptscope.figures import tables as F
from acceptscope.app.panels._ctx import plain

TITLE = "Utilization"


def render(ctx) -> None:
    st.header(TITLE)
    util = ctx.by_workload(ctx.q("utilization_by_workload", ctx.run_ids))
    if util.empty:
        st.info("No blocks in the selection.")
        return
    st.plotly_chart(F.fig_utilization(util), key="util_fig")
    arms = {ctx.arm_of(r): r for r in ctx.run_ids}
    if "compact" in arms and "cap-accept" in arms:
        if note := ctx.whole_run_note("The full-traffic inference figures below"):
            st.caption(note)
        inf = ctx.q("sampling_inference", arms["compact"], arms["cap-accept"])
        if isinstance(inf, str):
            st.info(f"No full-traffic inference: {plain(inf)}")
        else:
            f, L = glossary.audited_figures(inf), glossary.FIGURES
            u, c = f["audited_utilization"], f["audited_ceiling_tokens"]
            iv = glossary.INTERVALS["sampling"].label
            a, b, d = st.columns(3)
            a.metric(f"compact {L['audited_utilization'].label}", glossary.fmt("audited_utilization", u.estimate),
                     help=f"{iv}: {glossary.show('audited_utilization', u)}")
            b.metric(L["audited_ceiling_tokens"].label, glossary.fmt("audited_ceiling_tokens", c.estimate),
                     help=f"{iv}: {glossary.show('audited_ceiling_tokens', c)}")
            d.metric("audited requests", f"{inf['n_audited']} / {inf['n_requests']}")
            st.caption(f"{L['audited_utilization'].label} {glossary.show('audited_utilization', u)}; "
                       f"{L['audited_ceiling_tokens'].label} {glossary.show('audited_ceiling_tokens', c)} ({iv}, "
                       f"{inf['method']} estimator); confidence-only ceiling (no audit) "
                       f"{inf['confidence_only_ceiling']:.2f}")
    elif "compact" in arms:
        _production_only(ctx, arms["compact"])


def _production_only(ctx, run: str) -> None:
    """A compact run with no audit arm: utilization against the tail estimator's ceiling."""
    if not st.session_state.get("est_on", not st.session_state.get("live", False)):
        st.info("No audit arm selected: utilization against the estimated ceiling needs the estimators "
                "(turn on 'compute estimators' below).")
        return
    with st.spinner("estimating the trimmed tail ..."):
        views, why, figs = ctx.q("estimates", run)
    tail = views.get("tail", {}).get("summary") or {}
    u = figs.get("utilization")
    if why or u is None or u.estimate is None:
        st.info(f"No estimated utilization for {plain(run)}: {plain(why or views.get('utilization', {}).get('error'))}")
        return
    L, iv = glossary.FIGURES, glossary.INTERVALS["model"].label
    a, b = st.columns(2)
    a.metric(f"compact {L['utilization'].label}", glossary.fmt("utilization", u.estimate),
             help=f"{iv}: {glossary.show('utilization', u)}")
    b.metric("trimmed blocks model-based", f"{tail.get('summary.n_unresolved', '?')} / "
                                           f"{tail.get('summary.n_censored', '?')}")
    st.caption(f"{L['utilization'].label} {glossary.show('utilization', u)} ({iv}). "
               + str(tail.get("summary.statement", "")))
