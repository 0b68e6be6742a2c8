"""acceptscope estimators: the counterfactual tail, validation, STS calibration, utilization,
cost model and planner audit, over the telemetry store's tables.

:func:`run_all` is the facade the CLI, the report and the dashboard use: one call per run,
a dict of results, each with ``to_json()`` and ``figure()``. Steps that cannot run on a
run (no timing, no truth, no SPS table) are reported under ``skipped`` with the reason.

Example::

    >>> import tempfile, os
    >>> from acceptscope.store import Store
    >>> from estimators.synthetic import simulate
    >>> from estimators import run_all
    >>> sim = simulate(n_requests=40, seed=1)
    >>> st = Store(os.path.join(tempfile.mkdtemp(), "t.duckdb"))
    >>> _ = st.append({k: v for k, v in sim.tables.items()})
    >>> res = run_all(st, "syn-cap", n_boot=20)
    >>> sorted(k for k in res if k != "skipped")[:3]
    ['bracket', 'calibration', 'cost']
"""

from __future__ import annotations

import json
from typing import Any

import numpy as np
import pandas as pd

__all__ = ["run_all", "load_run", "to_jsonable"]

STREAM_ROWS = 1 << 20  # run_all streams runs bigger than this (estimators.stream)


def load_run(store, run_id: str, skip: tuple = ()) -> dict[str, Any]:
    """The tables of one run (plus the run row and its SPS/STS tables when recorded); tables in
    ``skip`` are left out (the streaming pass reads ``request_steps`` itself)."""
    runs = store.query_df("SELECT * FROM runs WHERE run_id = ?", [run_id])
    if runs.empty:
        raise KeyError(f"run {run_id!r} not in {store.path}")
    out = {"run": runs.iloc[0].to_dict()}
    for t in ("request_steps", "steps", "estimator_rows", "estimator_gather", "estimator_eos", "sts_samples"):
        if t not in skip:
            out[t] = store.read_table(t, run_id)
    sps_hash = out["run"].get("sps_hash")
    out["sps_table"] = None
    if sps_hash:
        from estimators.cost import SpsTable

        d = store.query_df("SELECT * FROM sps_tables WHERE table_hash = ?", [sps_hash])
        if len(d):
            out["sps_table"] = SpsTable.from_long(d)
        else:
            # adapter: the reference engine records the hash and the path in config_json but not
            # the table rows; use the file when its sha256 matches the recorded hash
            out["sps_table"] = _sps_from_config(out["run"].get("config_json"), sps_hash)
    sts_hash = out["run"].get("sts_hash")
    out["sts_temperatures"] = None
    if sts_hash:
        d = store.query_df("SELECT position, temperature FROM sts_tables WHERE table_hash = ? ORDER BY position", [sts_hash])
        if len(d):
            out["sts_temperatures"] = d.temperature.to_numpy()
    return out


def _sps_from_config(config_json, sps_hash):
    import hashlib
    from pathlib import Path

    from estimators.cost import SpsTable

    try:
        path = Path(json.loads(config_json or "{}").get("sps_path") or "")
    except (ValueError, TypeError):
        return None
    if not path.is_file():
        return None
    raw = path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != sps_hash:
        return None
    return SpsTable.from_json(raw.decode("utf-8"))


def _truth_runs(store, gamma: int, exclude: str, audit_group=None) -> list[str]:
    q = ("SELECT r.run_id, r.audit_group FROM runs r WHERE r.gamma = ? AND r.run_id <> ? AND r.arm IN ('cap-accept','static') "
         "AND EXISTS (SELECT 1 FROM request_steps s WHERE s.run_id = r.run_id AND s.ceiling IS NOT NULL)")
    d = store.query_df(q, [int(gamma), exclude])
    if audit_group is not None and (d.audit_group == audit_group).any():
        d = d[d.audit_group == audit_group]
    return d.run_id.tolist()


def run_all(store, run_id: str, n_boot: int = 200, hazard_boot: int = 20, seed: int = 0,
            use_sglang_pg: bool = False) -> dict[str, Any]:
    """Every estimator that applies to ``run_id``; see the module docstring. A run of more than
    :data:`STREAM_ROWS` request-steps goes through :func:`estimators.stream.run_all_stream`
    (bounded memory; the tail result then holds per-request sums, not per-block rows)."""
    n_rows = int(store.query_df("SELECT count(*) AS n FROM request_steps WHERE run_id = ?", [run_id]).n.iloc[0])
    if n_rows > STREAM_ROWS and not use_sglang_pg:
        from estimators.stream import run_all_stream

        r = run_all_stream(store, [run_id], n_boot=n_boot, hazard_boot=hazard_boot, seed=seed)[run_id]
        if isinstance(r, Exception):
            raise r
        return r
    from estimators.bracket import bracket_from_jsonl, trim_counters
    from estimators.calibration import calibration_data, compare
    from estimators.cost import CostModel
    from estimators.frame import BlockFrame
    from estimators.planner import audit
    from estimators.tail import TailEstimator
    from estimators.utilization import utilization

    data = load_run(store, run_id)
    rs, steps = data["request_steps"], data["steps"]
    if rs.empty:
        raise ValueError(f"run {run_id!r} has no request_steps")
    gamma = int(data["run"]["gamma"])
    frame = BlockFrame.from_request_steps(rs, gamma=gamma)
    res: dict[str, Any] = {"skipped": {}}
    # tail
    if frame.has_truth.all():
        est = TailEstimator().fit(frame)
        train_note = "this run (ceiling recorded: estimates are exact)"
    else:
        others = _truth_runs(store, gamma, run_id, data["run"].get("audit_group"))
        if others:
            train = store.read_table("request_steps", others)
            est = TailEstimator().fit(train, gamma=gamma)
            train_note = f"hazards fitted on truth runs {others}"
        else:
            est = TailEstimator().fit(frame)
            train_note = "no truth-bearing run with this gamma: hazards fitted on this run's observed outcomes"
    # SGLang's pg p/q can extend the walk (``use_sglang_pg``); off by default: not validated yet
    gather = ({"gather": data["estimator_gather"], "rows": data["estimator_rows"]}
              if use_sglang_pg and len(data["estimator_gather"]) else None)
    tail = est.estimate(frame, gather=gather, hazard_boot=0 if frame.has_truth.all() else hazard_boot, seed=seed)
    tail.notes.append(train_note)
    if len(steps):
        from estimators.validation import batch_band

        key = ["run_id", "rank", "epoch", "forward_ct"]
        bs = tail.blocks[key].merge(steps[key + ["bs"]].drop_duplicates(key), on=key, how="left")["bs"].to_numpy()
        tail.blocks["bs"] = bs
        tail.blocks["band"] = batch_band(bs)
    res["tail"] = tail
    tc = trim_counters(frame, None if frame.has_truth.all() else tail.blocks["mean"].to_numpy())
    if len(data["estimator_rows"]):
        br = bracket_from_jsonl(data["estimator_rows"], data["estimator_gather"], data["estimator_eos"], gamma=gamma)
        res["bracket"] = _Table(br, dict(trim=tc, mean_lo=float(br.lo.mean()), mean_hi=float(br.hi.mean()),
                                         categories=br.category.value_counts().to_dict()))
    else:
        res["bracket"] = _Table(pd.DataFrame(), dict(trim=tc, note="no SGLang estimator JSONL for this run"))
    res["utilization"] = utilization(frame, tail=None if frame.has_truth.all() else tail, steps=steps,
                                     n_boot=n_boot, seed=seed)
    # calibration
    try:
        if frame.has_truth.all():
            d = calibration_data(frame, "realized", temperatures=data["sts_temperatures"])
        else:
            d = calibration_data(None, "greedy", sts_samples=data["sts_samples"], gamma=gamma)
        tr, te = d.split(seed=seed)
        res["calibration"] = compare(tr, te, n_boot=n_boot, seed=seed)
    except ValueError as e:
        res["skipped"]["calibration"] = str(e)
    # cost
    cost = None
    try:
        cost = CostModel(seed=seed).fit(steps, baseline=data["sps_table"])
        res["cost"] = cost.result_
    except (ValueError, KeyError) as e:
        res["skipped"]["cost"] = str(e)
    table = data["sps_table"] or (cost.table_ if cost is not None else None)
    if table is not None and len(steps):
        res["planner"] = audit(frame, steps, table,
                               ceiling_estimate=None if frame.has_truth.all() else tail.blocks["mean"].to_numpy())
        res["planner"].notes.append("SPS table: " + ("the run's recorded table" if data["sps_table"] else "fitted from this run's timings"))
    else:
        res["skipped"]["planner"] = "no SPS table recorded and no step timings to fit one"
    return res


class _Table:
    """A small result wrapper for tabular outputs (bracket) with the common interface."""

    def __init__(self, df: pd.DataFrame, summary: dict):
        self.df, self.summary = df, summary

    def to_json(self) -> dict:
        return self.summary

    def figure(self):
        from estimators.figures import interval_figure

        if self.df.empty:
            return None
        g = self.df.groupby("category").agg(lo=("lo", "mean"), hi=("hi", "mean"), mid=("mid", "mean")).reset_index()
        return interval_figure(g, x="category", est="mid", lo="lo", hi="hi",
                               title="SGLang block-accept bracket by category (accept length)")


def to_jsonable(results: dict[str, Any]) -> dict:
    """JSON-ready dict of :func:`run_all` results (NaN -> null)."""
    out = {}
    for k, v in results.items():
        out[k] = v if k == "skipped" else v.to_json()
    return json.loads(json.dumps(out, default=_default).replace("NaN", "null"))


def _default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.floating,)):
        return float(o)
    if isinstance(o, np.ndarray):
        return o.tolist()
    if isinstance(o, (np.bool_,)):
        return bool(o)
    return str(o)
