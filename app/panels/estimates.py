"""Estimators: the estimators package's own results and figures for one run.

Estimators take seconds per run, so the panel computes them only while its
toggle is on (off by default during live refresh, when every new flush would
invalidate the cached result).
"""

from __future__ import annotations

import pandas as pd
import streamlit as st

from acceptscope import glossary
from acceptscope.app.panels._ctx import plain
from acceptscope.estimators.audit_size import advice_sentences

TITLE = "Estimators"
_ORDER = {"compact": 0, "cap-accept": 1, "static": 2}


def render(ctx) -> None:
    st.header(TITLE)
    runs = sorted(ctx.run_ids, key=lambda r: _ORDER.get(ctx.arm_of(r), 9))
    a, b = st.columns([3, 1])
    run = a.selectbox("run", runs, key="est_run", format_func=lambda r: f"{ctx.arm_of(r)} · {r}")
    on = b.toggle("compute estimators", value=not st.session_state.get("live", False), key="est_on")
    if not on:
        st.info("Estimators are paused (turn on 'compute estimators').")
        return
    if note := ctx.whole_run_note("The estimators"):
        st.caption(note)
    with st.spinner("running estimators ..."):
        views, why, figs = ctx.q("estimates", run)
    if why:
        st.info(f"Estimators not shown: {plain(why)}")
        return
    if not views:
        st.info("The estimators returned nothing for this run.")
        return
    if figs:
        st.subheader("figures")
        st.dataframe(figures_table(figs), hide_index=True)
        st.caption("definitions: acceptscope.glossary; " + "; ".join(f"{i.label}: {i.definition}"
                                                                      for i in glossary.INTERVALS.values()))
    for name, v in views.items():
        st.subheader(name)
        if v["skipped"]:
            st.caption(f"skipped on this run: {plain(v['skipped'])}")
            continue
        if v["error"]:
            st.warning(f"{name} failed: {plain(v['error'])}")
            continue
        if name == "interval_health" and v["summary"].get("verdict"):  # estimators.health: its own verdict
            st.info(plain(v["summary"]["verdict"]))
        adv = v["tables"].get("summary.audit_advice")  # the tail's audit-size advice, as every surface words it
        for line in advice_sentences(adv.to_dict("records") if adv is not None else []):
            st.caption(plain(f"audit size: {line}"))
        for i, fig in enumerate(v["figures"]):
            st.plotly_chart(fig, key=f"est_{name}_{i}")
        if v["summary"]:
            with st.expander("numbers"):
                st.json(v["summary"], expanded=True)
        for tname, t in list(v["tables"].items())[:3]:
            with st.expander(tname):
                st.dataframe(t, hide_index=True)


def figures_table(figs: dict) -> pd.DataFrame:
    """The run's glossary figures, one row each: label, value as every surface prints it, unit, interval."""
    return pd.DataFrame(glossary.table_rows({"value": figs}))
