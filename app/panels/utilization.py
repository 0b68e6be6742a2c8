"""Utilization: realized accept length against the ceiling (observed, or inferred for compact)."""

from __future__ import annotations

import streamlit as st

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
            u, c = inf["utilization"], inf["ceiling"]
            a, b, d = st.columns(3)
            a.metric("compact utilization (estimated)", f"{u['estimate']:.1%}",
                     help=f"95% bootstrap interval [{u['lo']:.1%}, {u['hi']:.1%}]")
            b.metric("full-traffic ceiling", f"{c['estimate']:.2f}", help=f"[{c['lo']:.2f}, {c['hi']:.2f}]")
            d.metric("audited requests", f"{inf['n_audited']} / {inf['n_requests']}")
            st.caption(f"utilization 95% interval [{u['lo']:.1%}, {u['hi']:.1%}]; ceiling [{c['lo']:.2f}, "
                       f"{c['hi']:.2f}] ({inf['method']} estimator); confidence-only ceiling (no audit) "
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
        views, why = ctx.q("estimates", run)
    by_group = (views.get("utilization", {}).get("tables") or {}).get("by_group")
    tail = views.get("tail", {}).get("summary") or {}
    if why or by_group is None or by_group.empty:
        st.info(f"No estimated utilization for {run}: {why or views.get('utilization', {}).get('error')}")
        return
    r = by_group[by_group["by"] == "run"].iloc[0]
    a, b = st.columns(2)
    a.metric("compact utilization (estimated ceiling)", f"{r['utilization']:.1%}",
             help=f"95% interval [{r['util_lo']:.1%}, {r['util_hi']:.1%}]")
    b.metric("trimmed blocks model-based", f"{tail.get('summary.n_unresolved', '?')} / "
                                           f"{tail.get('summary.n_censored', '?')}")
    st.caption(f"utilization 95% interval [{r['util_lo']:.1%}, {r['util_hi']:.1%}]. "
               + str(tail.get("summary.statement", "")))
