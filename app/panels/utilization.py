"""Utilization: realized accept length against the ceiling (observed, or inferred for compact)."""

from __future__ import annotations

import streamlit as st

from app.panels._ctx import plain

from app import figures as F

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
