"""Arm comparison: headline numbers of the selected runs side by side."""

from __future__ import annotations

import pandas as pd
import streamlit as st

from acceptscope import glossary
from acceptscope.app.panels._ctx import plain

TITLE = "Arm comparison"

COLS = ["run_id", "arm", "engine", "gamma", "audit_group", "requests_seen", "blocks", "mean_window", "mean_acc_len",
        "ceiling_accept_len", "utilization", "in_window_accept_rate", "mean_cap_trim", "steps", "wall_s",
        "tokens_per_s"]


def _audited(ctx):
    """The production arm's audited utilization (glossary.audited_figures), when an audit arm is selected."""
    arms = {ctx.arm_of(r): r for r in ctx.run_ids}
    if "compact" not in arms or "cap-accept" not in arms:
        return None
    inf = ctx.q("sampling_inference", arms["compact"], arms["cap-accept"])
    return None if isinstance(inf, str) else glossary.audited_figures(inf)["audited_utilization"]


def render(ctx) -> None:
    st.header(TITLE)
    s = ctx.q("run_summary", ctx.run_ids, ctx.workloads)
    if s.empty:
        st.info("The selected runs have no blocks yet.")
        return
    cols = st.columns(min(4, len(s)))
    L = glossary.FIGURES
    audited = _audited(ctx)
    for col, row in zip(cols, s.itertuples(index=False)):
        arm = plain(row.arm)  # (data: an ingested run's arm is whatever its file said)
        col.metric(f"{arm} {L['realized_accept_length'].label}",
                   glossary.fmt("realized_accept_length", row.mean_acc_len),
                   help=f"{plain(row.run_id)}: {L['realized_accept_length'].definition}")
        if pd.notna(row.utilization):  # the arm recorded its ceiling
            util = f"{arm} {L['utilization'].label} {glossary.fmt('utilization', row.utilization)} (ceiling recorded)"
        elif row.arm == "compact" and audited:  # the same figure, label and number as the Utilization panel
            util = f"{arm} {L['audited_utilization'].label} {glossary.fmt('audited_utilization', audited.estimate)}"
        else:
            util = f"{arm} utilization: ceiling not recorded in this arm (Estimators panel)"
        col.caption(f"{L['window'].label} {glossary.fmt('window', row.mean_window)} · {util} · {_count(row.blocks)} blocks")
    named = {"mean_window": L["window"].label, "mean_acc_len": L["realized_accept_length"].label,
             "ceiling_accept_len": L["ceiling_tokens"].label + " recorded", "utilization": "utilization (ceiling recorded)"}
    st.dataframe(s[[c for c in COLS if c in s.columns]].rename(columns=named), hide_index=True)
    for row in s.itertuples(index=False):
        if row.arm == "compact" and _count(row.blocks) > 0 and row.mean_window is not None \
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


def _count(v) -> int:
    """A count column of the overview (NULL/NA for a run of another engine, which records no blocks) as an int."""
    return 0 if pd.isna(v) else int(v)
