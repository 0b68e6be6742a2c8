"""Per-request drill-down: one request's blocks (window, confidences, accepted, ceiling)."""

from __future__ import annotations

import streamlit as st

from acceptscope.figures import tables as F

TITLE = "Request drill-down"
PAGE = 1000  # requests per page of the picker: a 200k-request run is read a page at a time


def render(ctx) -> None:
    st.header(TITLE)
    order = {"compact": 0, "cap-accept": 1, "static": 2}
    runs = sorted(ctx.run_ids, key=lambda r: order.get(ctx.arm_of(r), 9))
    run = st.selectbox("run", runs, key="drill_run", format_func=lambda r: f"{ctx.arm_of(r)} · {r}")
    n = ctx.q("request_count", run)
    pages = max(1, -(-n // PAGE))
    page = 1
    if pages > 1:
        page = int(st.number_input(f"page of {PAGE:,} requests (of {n:,})", 1, pages, 1, key="drill_page"))
    reqs = ctx.by_workload(ctx.q("requests", run, PAGE, (page - 1) * PAGE))
    if reqs.empty:
        st.info("This run has no requests yet.")
        return
    labels = {r.rid: f"{r.workload}#{r.prompt_index} · {r.rid}" for r in reqs.itertuples(index=False)}
    rid = st.selectbox("request", list(labels), key="drill_rid", format_func=labels.get)
    st.dataframe(reqs[reqs["rid"] == rid], hide_index=True)
    steps = ctx.q("request_steps", run, rid)
    if steps.empty:
        st.info("No blocks recorded for this request.")
        return
    a, b = st.columns(2)
    a.plotly_chart(F.fig_request(steps, rid), key="drill_fig")
    b.plotly_chart(F.fig_confidence_heatmap(steps, rid), key="drill_heat")
    show = steps.drop(columns=["confidence_logit"]).copy()
    for c in ("confidence", "survival"):
        show[c] = show[c].map(lambda v: None if v is None else [round(float(x), 3) for x in v])
    st.dataframe(show, hide_index=True, key="drill_table")
