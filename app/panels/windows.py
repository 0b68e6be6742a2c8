"""Windows: what the scheduler chose to verify, per workload and arm."""

from __future__ import annotations

import streamlit as st

from acceptscope.figures import tables as F

TITLE = "Windows"


def render(ctx) -> None:
    st.header(TITLE)
    win = ctx.by_workload(ctx.q("window_distribution", ctx.run_ids))
    if win.empty:
        st.info("No blocks in the selection.")
        return
    st.plotly_chart(F.fig_windows(win), key="windows_fig")
