"""The :func:`run_all` facade (re-exported as ``estimators.run_all``): every estimator that applies to a
run, in memory or streamed (:mod:`estimators.stream`) when the run is big; see ``estimators/__init__.py``."""

from __future__ import annotations

from typing import Any

import pandas as pd

from acceptscope.estimators.bracket import trim_counters
from acceptscope.estimators.calibration import calibration_data
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.planner import audit
from acceptscope.estimators.run_data import (RUN_KEYS, _Table, fit_calibration, fit_cost, hazard_runs, load_run, read_training,
                                 sglang_bracket, sts_in_force)
from acceptscope.estimators.stream import run_all_stream
from acceptscope.estimators.tail import TailEstimator
from acceptscope.estimators.utilization import utilization
from acceptscope.estimators.validation import batch_band

# run_all streams runs bigger than this (estimators.stream). Why 256k: estimated in memory a run costs
# ~3.7 GB per million request-steps (1M: 3.7 GB, 64 CPU-s) where the streamed pass holds ~1.5 GB at
# any size (1M: 1.6 GB, 32 CPU-s); below this the two agree and the in-memory audit is exact
STREAM_ROWS = 1 << 18


class LocalTail:
    """Where :func:`run_all` fits and applies the tail estimator: in this process (the default).
    ``estimators.spark.SparkTail`` has the same two methods and runs them over a Parquet lake."""

    def fit(self, store, run_ids: list[str], frame, gamma: int):
        """Hazards from ``frame`` (the run being estimated) or, when None, from ``run_ids``' request-steps."""
        if frame is not None:
            return TailEstimator().fit(frame)
        return TailEstimator().fit(read_training(store, run_ids), gamma=gamma)

    def estimate(self, est, run_id: str, frame, gather, hazard_boot: int, seed: int):
        return est.estimate(frame, gather=gather, hazard_boot=hazard_boot, seed=seed)


def run_all(store, run_id: str, n_boot: int = 200, hazard_boot: int = 20, seed: int = 0,
            use_sglang_pg: bool = False, hazards_from: str | None = None, tail_engine=None) -> dict[str, Any]:
    """Every estimator that applies to ``run_id``; see the module docstring.

    Tail hazards of a run without a recorded ceiling come from its own observed outcomes, from
    the truth-bearing arm of its own audit (``audit_group``), or from ``hazards_from`` when the
    user names a run; a named run must pass :func:`hazard_compatibility` (ValueError).
    ``tail_engine``: where the tail estimator runs (default :class:`LocalTail`)."""
    n_rows = int(store.query_df("SELECT count(*) AS n FROM request_steps WHERE run_id = ?", [run_id]).n.iloc[0])
    if n_rows > STREAM_ROWS and not use_sglang_pg and tail_engine is None:
        # bounded memory: one ordered pass in chunks of whole requests (the tail result holds per-request sums)
        r = run_all_stream(store, [run_id], n_boot=n_boot, hazard_boot=hazard_boot, seed=seed,
                           hazards_from=hazards_from)[run_id]
        if isinstance(r, Exception):
            raise r
        return r
    data = load_run(store, run_id)
    rs, steps = data["request_steps"], data["steps"]
    if rs.empty:
        raise ValueError(f"run {run_id!r} has no request_steps")
    gamma = int(data["run"]["gamma"])
    frame = BlockFrame.from_request_steps(rs, gamma=gamma)
    res: dict[str, Any] = {"skipped": {}}
    res["run"] = _Table(pd.DataFrame(), {k: data["run"].get(k) for k in RUN_KEYS})
    engine = tail_engine or LocalTail()
    # tail
    if frame.has_truth.all():
        est = engine.fit(store, [run_id], frame, gamma)
        train_note = "this run: ceiling recorded on every request-step (the verify ran the whole block): no tail is estimated"
    else:
        others, train_note = hazard_runs(store, run_id, gamma, data["run"].get("audit_group"), hazards_from)
        est = engine.fit(store, others, None, gamma) if others else engine.fit(store, [run_id], frame, gamma)
    # SGLang's pg p/q can extend the walk (``use_sglang_pg``); off by default: not validated yet
    gather = ({"gather": data["estimator_gather"], "rows": data["estimator_rows"]}
              if use_sglang_pg and len(data["estimator_gather"]) else None)
    tail = engine.estimate(est, run_id, frame, gather, 0 if frame.has_truth.all() else hazard_boot, seed)
    tail.notes.append(train_note)
    if len(steps):
        key = ["run_id", "rank", "epoch", "forward_ct"]
        bs = tail.blocks[key].merge(steps[key + ["bs"]].drop_duplicates(key), on=key, how="left")["bs"].to_numpy()
        tail.blocks["bs"] = bs
        tail.blocks["band"] = batch_band(bs)
    res["tail"] = tail
    tc = trim_counters(frame, None if frame.has_truth.all() else tail.blocks["mean"].to_numpy())
    res["bracket"] = sglang_bracket(data, tc, gamma)
    res["utilization"] = utilization(frame, tail=None if frame.has_truth.all() else tail, steps=steps,
                                     n_boot=n_boot, seed=seed)
    # calibration
    def make_data():
        in_force = sts_in_force(data)
        if frame.has_truth.all():
            return calibration_data(frame, "realized", temperatures=in_force), in_force
        return calibration_data(None, "greedy", sts_samples=data["sts_samples"], gamma=gamma), in_force

    fit_calibration(res, make_data, n_boot, seed)
    # cost
    table = fit_cost(res, steps, data["sps_table"], seed)
    if table is not None and len(steps):
        res["planner"] = audit(frame, steps, table,
                               ceiling_estimate=None if frame.has_truth.all() else tail.blocks["mean"].to_numpy())
        res["planner"].notes.append("SPS table: " + ("the run's recorded table" if data["sps_table"] else "fitted from this run's timings"))
    else:
        res["skipped"]["planner"] = "no SPS table recorded and no step timings to fit one"
    return res


def run_all_runs(store, run_ids=None, n_boot: int = 200, hazard_boot: int = 20, seed: int = 0,
                 progress=None) -> dict[str, Any]:
    """:func:`run_all` for many runs without a query per run: one ordered scan of ``request_steps`` for
    every run up to :data:`STREAM_ROWS` request-steps (each run one chunk, so the results equal
    ``run_all``'s in-memory ones) and one streamed pass for the bigger runs (as ``run_all`` streams
    them). Why: a store of thousands of small runs cost ~0.84 s a run estimated one at a time.
    Returns ``{run_id: results}``; a run that cannot be estimated maps to its exception."""
    ids = store.runs().run_id.tolist() if run_ids is None else list(run_ids)
    n = store.query_df("SELECT run_id, count(*) AS n FROM request_steps WHERE run_id IN (SELECT UNNEST(?)) "
                       "GROUP BY run_id", [ids]).set_index("run_id")["n"]
    big = [r for r in ids if n.get(r, 0) > STREAM_ROWS]
    small = [r for r in ids if r not in set(big)]
    out = {}
    kw = dict(n_boot=n_boot, hazard_boot=hazard_boot, seed=seed, progress=progress)
    if small:
        out.update(run_all_stream(store, small, chunk_rows=STREAM_ROWS, whole_runs=True, **kw))
    if big:
        out.update(run_all_stream(store, big, **kw))
    return {r: out[r] for r in ids}
