"""Calibration: reliability per position before/after STS, ECE table, survival vs empirical acceptance."""

from __future__ import annotations

import streamlit as st

from acceptscope.figures import tables as F

TITLE = "Calibration"


def render(ctx) -> None:
    st.header(TITLE)
    # cap-accept first: its labels come from the traffic production serves
    labelled = sorted((r for r in ctx.run_ids if ctx.arm_of(r) in ("cap-accept", "static")),
                      key=lambda r: ctx.arm_of(r) != "cap-accept")
    if not labelled:
        st.info("Reliability needs an observed ceiling: select a cap-accept or static run.")
    else:
        run = st.selectbox("run for reliability", labelled, key="calib_run",
                           format_func=lambda r: f"{ctx.arm_of(r)} · {r}")
        bins = ctx.q("reliability_bins", (run,), ctx.workloads)
        if bins.empty:
            st.info("No labelled blocks in this run yet.")
        else:
            st.plotly_chart(F.fig_reliability(bins, run), key="calib_fig")
            ece = F.ece_table(bins)
            wide = ece.pivot_table(index="position", columns="variant", values="ece").reset_index()
            wide["n"] = wide["position"].map(ece[ece["variant"] == "after"].set_index("position")["n"])
            st.subheader("ECE per position")
            st.dataframe(wide, hide_index=True)
    pos = ctx.q("position_acceptance", ctx.run_ids, ctx.workloads)
    if len(pos):
        st.subheader("Survival vs empirical acceptance")
        st.plotly_chart(F.fig_survival(pos), key="survival_fig")
