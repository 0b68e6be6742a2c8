"""Interval health: the production arm's own intervals, scored against its audit arm's truth, on your data.

Why: the compact arm's interval is a model's (hazards fitted on what the windows showed, a band for the
positions nothing showed). Whether it holds on *this* traffic is a question the data can answer wherever
a cap-accept audit arm replayed part of it: those requests' ceilings are recorded. So for each compact run
with an audit arm in its group, the estimate also runs the production arm the way production runs it --
alone, its hazards and the prior fitted on its own outcomes, never on the audit -- over the audited
requests, and sets each group's interval (the run and every workload) beside the audit's recorded mean
ceiling of the same blocks. This is the validation grid's paired check (docs/validation.md), on the
user's own data; ``covered`` per group is the verdict.

Example (a small audit of the reference engine: see tests/test_interval_health.py)::

    results = run_all(store, compact_run_id)
    results["interval_health"].table[["group", "estimate", "lo", "hi", "truth", "covered"]]
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa

from acceptscope.estimators.chunks import TAIL_COLUMNS, configure, s_columns, sample_requests
from acceptscope.estimators.frame import BlockFrame
from acceptscope.store import fetch_arrow

HEALTH_ROWS = 1 << 16  # audited request-steps the check estimates (a stable hash-sample of audited requests beyond)
LEVEL = 0.95


@dataclass
class IntervalHealth:
    """Per group (``run`` and each workload): the production arm's own 95% interval over the audited
    requests and the audit arm's recorded mean ceiling of the same blocks (drafts per block)."""

    production: str
    audit: str
    table: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def verdict(self) -> str:
        t = self.table
        k, m = int(t["covered"].sum()), len(t)
        worst = t.loc[t["error"].abs().idxmax()] if m else None
        head = f"the production arm's own intervals covered the audit's truth in {k} of {m} groups"
        if worst is not None and not bool(worst["covered"]):
            head += (f"; worst {worst['group']}: {worst['estimate']:.3f} [{worst['lo']:.3f}, {worst['hi']:.3f}] "
                     f"vs {worst['truth']:.3f}")
        return head

    def to_json(self) -> dict:
        return dict(production=self.production, audit=self.audit, level=LEVEL, verdict=self.verdict(),
                    groups=self.table.to_dict("records"), notes=self.notes)


def _audited(store, production: str, audit: str, max_rows: int, seed: int) -> tuple[pd.DataFrame, str]:
    """The audited requests (a stable hash-sample beyond ``max_rows`` request-steps of the audit arm), as a
    (rid) table registered for the reads below, and a note when sampled."""
    sel = sample_requests(store, (audit,), max_rows, seed)
    if sel is None:
        keys = store.query_df("SELECT DISTINCT rid FROM request_steps WHERE run_id = ?", [audit])
        return keys, ""
    return sel.to_pandas()[["rid"]], f"a stable hash-sample of {len(sel)} audited requests"


def _rows(store, run_id: str, keys: pd.DataFrame, columns) -> pa.Table:
    with store.connect(read_only=True) as con:
        configure(con, None)
        con.register("_acceptscope_audited", keys)
        try:
            # in stored order: a BlockFrame puts the production rows in request order itself, and the
            # audit's truth is only averaged
            return fetch_arrow(con, f"SELECT {s_columns(columns)} FROM request_steps s SEMI JOIN _acceptscope_audited k "
                                    f"ON s.rid = k.rid WHERE s.run_id = ?", [run_id])
        finally:
            con.unregister("_acceptscope_audited")


def interval_health(store, production: str, audit: str, gamma: int, est, fit_notes: list[str], hazard_boot: int = 20,
                    seed: int = 0, max_rows: int = HEALTH_ROWS) -> IntervalHealth:
    """The check (module docstring). ``est``, ``fit_notes``: the production run's hazards alone, frozen with their
    refits as the pipeline fitted them (:func:`estimators.pipeline.add_interval_health`)."""
    keys, sampled = _audited(store, production, audit, max_rows, seed)
    prod = _rows(store, production, keys, TAIL_COLUMNS)
    truth = _rows(store, audit, keys, ("rid", "workload", "ceiling")).to_pandas()
    missing = np.setdiff1d(keys["rid"].astype(str).unique(), np.asarray(prod.column("rid").to_pylist(), dtype=str))
    if prod.num_rows == 0 or truth["ceiling"].isna().all():
        raise ValueError(f"run {audit!r} audits no request of {production!r} with a recorded ceiling")
    res = est.estimate(BlockFrame.from_request_steps(prod, gamma=gamma), hazard_boot=hazard_boot, seed=seed)
    b = res.blocks
    rows = []
    for by in (None, "workload"):
        agg = res.aggregate(by, level=LEVEL)  # the replicates of the estimate's own run interval (400, seed 0)
        for _, a in agg.iterrows():
            group = "run" if by is None else str(a[by])
            sel = np.ones(len(b), bool) if by is None else (b["workload"].astype(str).to_numpy() == group)
            tsel = np.ones(len(truth), bool) if by is None else (truth["workload"].astype(str).to_numpy() == group)
            lo_id, hi_id = float(b.loc[sel, "bound_lo"].mean()), float(b.loc[sel, "bound_hi"].mean())
            lo, hi = float(a["lo"]), float(a["hi"])
            if by is None:  # as the production estimate reads its run: inside what the telemetry proves
                lo, hi = max(lo, lo_id), min(hi, hi_id)
            t = float(truth.loc[tsel, "ceiling"].mean())
            rows.append(dict(group_by="run" if by is None else by, group=group, n_blocks=int(sel.sum()),
                             n_truth_blocks=int(tsel.sum()), estimate=float(a["mean_ceiling"]), lo=lo, hi=hi,
                             truth=t, covered=bool(lo - 1e-12 <= t <= hi + 1e-12), error=float(a["mean_ceiling"]) - t,
                             width=hi - lo, bound_lo=lo_id, bound_hi=hi_id))
    notes = [f"the production arm {production} estimated alone (its own hazards and the unobserved-position prior, "
             f"as in production) over the requests its audit arm {audit} replayed"] + fit_notes
    if sampled:
        notes.append(sampled)
    if missing.size:
        notes.append(f"{missing.size} audited request(s) not in {production}: left out")
    return IntervalHealth(production, audit, pd.DataFrame(rows), notes)
