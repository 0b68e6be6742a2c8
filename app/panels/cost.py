"""Cost: predicted vs measured step time and the verify tokens each step spent."""

from __future__ import annotations

import streamlit as st

from acceptscope.figures import tables as F

TITLE = "Cost"
MAX_POINTS = 20_000  # per run: longer runs are thinned to evenly spaced steps


def render(ctx) -> None:
    st.header(TITLE)
    steps = ctx.q("step_costs", ctx.run_ids, MAX_POINTS)
    if steps.empty:
        st.info("No steps in the selection.")
        return
    if note := ctx.whole_run_note("Steps (each batches requests of several workloads)"):
        st.caption(note)
    if "steps" in steps.columns and (steps["steps"] > 1).any():
        st.caption(f"Runs longer than {MAX_POINTS:,} steps: each point is the mean of up to "
                   f"{int(steps['steps'].max()):,} consecutive steps (from the step bins the store keeps).")
    runs = ctx.runs[ctx.runs["run_id"].isin(ctx.run_ids)]
    a, b = st.columns(2)
    if steps["predicted_step_ms"].notna().any():
        a.plotly_chart(F.fig_step_costs(steps, runs), key="cost_fig")
    else:
        a.info("No step carries a predicted step time (no cost table in use?): the cost model cannot be checked "
               "here; see the Estimators panel for a fitted one.")
    b.plotly_chart(F.fig_throughput(steps, runs), key="tput_fig")
