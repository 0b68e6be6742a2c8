"""acceptscope Streamlit dashboard.

Launch with ``acceptscope dashboard --db FILE`` (which runs
``streamlit run app/dashboard.py -- --db FILE``), or set ``ACCEPTSCOPE_DB``.

Reading a file that a run is writing: every query opens a short read-only
connection (``acceptscope.reader.Reader``), so the writer gets the lock between flushes.
Query results are cached with ``st.cache_data`` keyed on a data-version probe
(row counts of the growing tables); with live refresh on, the body is a
``st.fragment(run_every=...)`` that re-probes and re-renders only when the
probe changed.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

_ROOT = Path(__file__).resolve().parents[1]
if str(_ROOT) not in sys.path:  # `streamlit run app/dashboard.py` puts app/ first on sys.path, not the repo
    sys.path.insert(0, str(_ROOT))

import streamlit as st  # noqa: E402

from acceptscope import audit_sampling  # noqa: E402
from acceptscope.estimate_views import figures as estimate_figures, run_estimates  # noqa: E402
from acceptscope.figures import tables as figures  # noqa: E402
from acceptscope.reader import Reader, select_runs  # noqa: E402
from acceptscope.app.panels import (calibration, cost, drilldown, engines, estimates, overview, regime,  # noqa: E402
                                     utilization, windows)
from acceptscope.app.panels._ctx import Ctx, plain  # noqa: E402

PANELS = (overview, regime, calibration, windows, utilization, estimates, cost, engines, drilldown)


def db_path() -> str:
    """--db after `--` on the streamlit command line, else $ACCEPTSCOPE_DB, else ./acceptscope.duckdb."""
    p = argparse.ArgumentParser(add_help=False)
    p.add_argument("--db")
    args, _ = p.parse_known_args(sys.argv[1:])
    return args.db or os.environ.get("ACCEPTSCOPE_DB") or "acceptscope.duckdb"


@st.cache_data(max_entries=256, show_spinner=False)
def load(db: str, version: tuple, method: str, *args):
    """Cached read; ``version`` is part of the key so new data invalidates it."""
    reader = Reader(db)
    if method == "reliability_bins":
        return figures.reliability_bins(reader, list(args[0]), workloads=list(args[1]) if len(args) > 1 else None)
    if method == "sampling_inference":
        try:
            return audit_sampling.infer_runs(reader, *args).to_dict()
        except ValueError as e:
            return str(e)
    if method == "estimates":  # (views, why not, the glossary's figures of the run)
        views, why = run_estimates(db, args[0])
        return {k: {"figures": v.figures, "summary": v.summary, "tables": v.tables, "error": v.error,
                    "skipped": v.skipped} for k, v in views.items()}, why, estimate_figures(views)
    fn = getattr(reader, method)
    return fn(*[list(a) if isinstance(a, tuple) else a for a in args])


def default_selection(reader: Reader, runs) -> list[str]:
    return select_runs(reader) if len(runs) else []


def main() -> None:
    st.set_page_config(page_title="acceptscope", layout="wide")
    db = db_path()
    st.title("acceptscope")
    if not Path(db).exists():
        st.error(f"{plain(db)}: no such database file. Start with `acceptscope dashboard --db FILE`.")
        return
    reader = Reader(db)
    version = reader.data_version()
    try:
        runs = load(db, version, "runs")
    except Exception as e:  # e.g. a DuckDB file that is not acceptscope telemetry
        st.error(f"{plain(db)}: cannot read runs ({type(e).__name__}: {plain(e)})")
        return
    with st.sidebar:
        st.caption(f"database: {plain(db)}")
        if runs.empty:
            st.info("No runs yet.")
        labels = {r.run_id: f"{r.role} ({r.arm}) · {r.run_id}" for r in runs.itertuples(index=False)}
        picked = st.multiselect("runs", list(labels), default=default_selection(reader, runs),
                                format_func=labels.get, key="runs")
        wl = load(db, version, "window_distribution", tuple(picked)) if picked else None
        workloads = sorted(wl["workload"].unique()) if wl is not None and len(wl) else []
        wsel = st.multiselect("workloads", workloads, default=[], key="workloads",
                              help="empty: all workloads")
        live = st.toggle("live refresh", value=False, key="live", help="re-probe the file and redraw on change")
        every = st.slider("refresh every (s)", 1, 30, 3, key="every", disabled=not live)
    if not picked:
        st.info("Pick one or more runs in the sidebar.")
        return

    @st.fragment(run_every=every if live else None)
    def body() -> None:
        v = Reader(db).data_version()
        all_runs = load(db, v, "runs")
        if set(all_runs["run_id"]) != set(runs["run_id"]):
            st.rerun(scope="app")  # new runs appeared: refresh the picker too
        st.caption(f"{sum(max(x, 0) for x in v):,} rows · read {time.strftime('%H:%M:%S')}"
                   + (" · live" if live else "") + (f" · workloads: {plain(', '.join(wsel))}" if wsel else ""))
        ctx = Ctx(db=db, version=v, run_ids=tuple(picked), runs=all_runs, load=load, workloads=tuple(wsel))
        for panel in PANELS:
            try:
                panel.render(ctx)
            except Exception as e:  # one broken panel must not take the page down
                st.error(f"{panel.TITLE} panel failed: {type(e).__name__}: {plain(e)}")
                st.exception(e)

    body()


main()
