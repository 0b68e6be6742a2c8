"""Estimators: the estimators package's own results and figures for one run."""

from __future__ import annotations

import streamlit as st

TITLE = "Estimators"


def render(ctx) -> None:
    st.header(TITLE)
    run = st.selectbox("run", list(ctx.run_ids), key="est_run", format_func=lambda r: f"{ctx.arm_of(r)} · {r}")
    views, why = ctx.q("estimates", run)
    if why:
        st.info(f"Estimators not shown: {why}")
        return
    if not views:
        st.info("The estimators returned nothing for this run.")
        return
    for name, v in views.items():
        st.subheader(name)
        if v["error"]:
            st.warning(f"{name} failed: {v['error']}")
            continue
        for i, fig in enumerate(v["figures"]):
            st.plotly_chart(fig, key=f"est_{name}_{i}")
        if v["summary"]:
            st.json(v["summary"], expanded=False)
