"""Arm comparison: headline numbers of the selected runs side by side."""

from __future__ import annotations

import streamlit as st

from acceptscope.app.panels._ctx import plain

TITLE = "Arm comparison"

COLS = ["run_id", "arm", "engine", "gamma", "audit_group", "requests_seen", "blocks", "mean_window", "mean_acc_len",
        "ceiling_accept_len", "utilization", "in_window_accept_rate", "mean_cap_trim", "steps", "wall_s",
        "tokens_per_s"]


def render(ctx) -> None:
    st.header(TITLE)
    s = ctx.q("run_summary", ctx.run_ids, ctx.workloads)
    if s.empty:
        st.info("The selected runs have no blocks yet.")
        return
    cols = st.columns(min(4, len(s)))
    for col, row in zip(cols, s.itertuples(index=False)):
        util = "n/a" if row.utilization != row.utilization or row.utilization is None else f"{row.utilization:.1%}"
        col.metric(f"{row.arm} accept length", f"{(row.mean_acc_len or 0):.2f}",
                   help=f"{plain(row.run_id)}: mean committed tokens per block (bonus included)")
        col.caption(f"window {(row.mean_window or 0):.2f} · {row.arm} utilization {util} (own observed ceiling) · "
                    f"{row.blocks or 0} blocks")
    st.dataframe(s[[c for c in COLS if c in s.columns]], hide_index=True)
    for row in s.itertuples(index=False):
        if row.arm == "compact" and (row.blocks or 0) > 0 and row.mean_window is not None \
                and row.mean_window >= row.gamma - 1e-9:
            st.error(f"{plain(row.run_id)}: compact verified every draft (window = gamma = {row.gamma} on every block): "
                     "no trimming, zero scheduling gain (SGLang degenerates to verify-all without an SPS table).")
    st.caption("ceiling = mean(uncapped correct drafts + 1), observed in cap-accept and static only; "
               "utilization = Σ accept length / Σ ceiling, each arm against its own ceiling (compact's is "
               "estimated in the Utilization panel)." + (" Steps, wall time and tokens/s stay whole-run."
                                                        if ctx.workloads else ""))
    dq = ctx.q("data_quality", ctx.run_ids)
    if len(dq) and (dq["rejects"].sum() or dq["gaps"].sum()):
        st.warning(f"{int(dq['rejects'].sum())} rejected records, {int(dq['gaps'].sum())} stream gaps in the selection")
