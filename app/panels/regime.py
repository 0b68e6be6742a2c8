"""The seeds' regime: windows per workload next to the SGLang blog, and compact vs static over batch size."""

from __future__ import annotations

import streamlit as st

from acceptscope.figures import regime as R
from acceptscope.app.panels._ctx import plain

TITLE = "Regime vs blog"


def render(ctx) -> None:
    st.header(TITLE)
    src = [r for r in ctx.run_ids if ctx.role_of(r) == "audit"] or \
          [r for r in ctx.run_ids if ctx.role_of(r) == "production"]
    if not src:
        st.info("Select a cap-accept or compact run.")
        return
    reg = ctx.by_workload(ctx.q("regime_by_workload", (src[0],)))
    if reg.empty:
        st.info("No blocks in the selection.")
        return
    cmp = R.blog_comparison(reg)
    st.caption(f"{plain(ctx.arm_of(src[0]))} run {plain(src[0])}: windows, utilization against its ceiling and window shares per workload; grey / "
               f"blog columns: the SGLang DSpark blog ({R.BLOG_URL}).")
    st.dataframe(cmp, hide_index=True)
    st.plotly_chart(R.fig_regime(cmp, arm=ctx.arm_of(src[0])), key="regime_fig")
    groups = ctx.runs.set_index("run_id").loc[list(ctx.run_ids), "audit_group"].dropna().unique()
    for g in groups:
        curve = ctx.q("throughput_curve", f"{g}/curve")
        if len(curve):
            st.subheader("Compact vs static over batch size (virtual clock)")
            if note := ctx.whole_run_note("The curve runs"):
                st.caption(note)
            st.plotly_chart(R.fig_throughput_curve(curve), key=f"curve_fig_{g}")
            st.dataframe(R.curve_ratios(curve), hide_index=True)
            break
    else:
        st.caption("No compact-vs-static curve runs for the selected audit group.")
