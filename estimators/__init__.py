"""acceptscope estimators: the counterfactual tail, validation, STS calibration, utilization,
cost model and planner audit, over the telemetry store's tables.

:func:`run_all` is the facade the CLI, the report and the dashboard use: one call per run,
a dict of results, each with ``to_json()`` (``acceptscope.figures.figure_of`` draws them). Steps that cannot run on a
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

__all__ = ["run_all", "run_all_runs", "load_run", "to_jsonable", "sts_in_force", "hazard_compatibility", "hazard_runs",
           "read_training"]

RUN_KEYS = ("arm", "engine", "gamma", "temperature", "sts_hash", "sps_hash")  # the run row in run_all's results
# run_all streams runs bigger than this (estimators.stream). Why 256k: estimated in memory a run costs
# ~3.7 GB per million request-steps (1M: 3.7 GB, 64 CPU-s) where the streamed pass holds ~1.5 GB at
# any size (1M: 1.6 GB, 32 CPU-s); below this the two agree and the in-memory audit is exact
STREAM_ROWS = 1 << 18


def load_run(store, run_id: str, skip: tuple = ()) -> dict[str, Any]:
    """The tables of one run (plus the run row and its SPS/STS tables when recorded); tables in
    ``skip`` are left out (the streaming pass reads ``request_steps`` itself)."""
    runs = store.query_df("SELECT * FROM runs WHERE run_id = ?", [run_id])
    if runs.empty:
        raise KeyError(f"run {run_id!r} not in {store.path}")
    out = {"run": runs.iloc[0].to_dict()}
    for t in ("request_steps", "steps", "estimator_rows", "estimator_gather", "estimator_eos", "sts_samples"):
        if t in skip:
            continue
        out[t] = store.read_table(t, run_id)
        if t != "request_steps":  # (BlockFrame sorts request_steps itself)
            out[t] = _key_order(out[t], t)
    if "request_steps" in out:
        out["request_steps"] = _with_temperatures(store, run_id, out["request_steps"], out["run"].get("temperature"))
    sps_hash = out["run"].get("sps_hash")
    out["sps_table"] = None
    if sps_hash:
        from estimators.cost import table_from_long

        d = store.query_df("SELECT * FROM sps_tables WHERE table_hash = ?", [sps_hash])
        if len(d):
            out["sps_table"] = table_from_long(d)
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
    from acceptscope.ingest.links import named_tables

    out["sts_named"] = named_tables(out["run"].get("config_json")).get("sts_hash")
    return out


def sts_in_force(data: dict):
    """Temperatures the run's confidences were served with (None: identity, no table loaded).

    Raises ValueError when the server named an STS table that is not in the store: its
    recorded confidences are post-STS, so a fit on them without the table would be a fit of
    the wrong quantity (reference §3.3: ``c_k = sigmoid(z_k / T_k)``)."""
    if data["sts_temperatures"] is None and data.get("sts_named"):
        raise ValueError(f"run {data['run']['run_id']!r} served with the STS table {data['sts_named']}, which is not "
                         "in the store: ingest that file (acceptscope ingest FILE) so it links to the run")
    return data["sts_temperatures"]


def _with_temperatures(store, run_id: str, rs: pd.DataFrame, run_temperature) -> pd.DataFrame:
    """Fill request-steps' missing temperatures: the request's own (``requests``: a traffic
    driver's records), else the run's (``acceptscope ingest --temperature``). SGLang's dumps
    carry none; a greedy request known as such resolves its trimmed tail exactly."""
    if rs.empty or "temperature" not in rs or not rs["temperature"].isna().any():
        return rs
    req = store.query_df("SELECT rid, temperature FROM requests WHERE run_id = ? AND temperature IS NOT NULL",
                         [run_id])
    t = rs["temperature"]
    if len(req):
        t = t.fillna(rs["rid"].map(pd.Series(req["temperature"].to_numpy(), index=req["rid"])))
    if run_temperature is not None and not pd.isna(run_temperature):
        t = t.fillna(float(run_temperature))
    return rs.assign(temperature=t.astype(float))


def hazard_compatibility(store, run_id: str, other: str) -> list[str]:
    """Why ``other``'s observed tails cannot stand in for ``run_id``'s (empty: compatible).

    Hazards transfer only between runs whose drafts were scheduled alike: the same gamma,
    the same STS table in force (it changes what a confidence value means) and the same
    temperature mix (greedy and sampled acceptance differ; shares within 0.1)."""
    runs = store.query_df("SELECT run_id, gamma, sts_hash, temperature FROM runs WHERE run_id IN (?, ?)",
                          [run_id, other]).set_index("run_id")
    if other not in runs.index:
        return [f"run {other!r} is not in {store.path}"]
    a, b = runs.loc[run_id], runs.loc[other]
    out = []
    if int(a.gamma) != int(b.gamma):
        out.append(f"gamma {int(b.gamma)} != {int(a.gamma)}")
    sa, sb = (None if pd.isna(x) else x for x in (a.sts_hash, b.sts_hash))
    if sa != sb:
        out.append(f"STS table in force differs ({(sb or 'none')[:12]} vs {(sa or 'none')[:12]})")
    mix = {}
    for r in (run_id, other):
        d = _with_temperatures(store, r, store.read_table("request_steps", r, columns=["rid", "temperature"]),
                               runs.loc[r, "temperature"])
        t = d["temperature"]
        mix[r] = None if t.isna().all() else (t.fillna(1.0) <= 0).mean()
    if (mix[run_id] is None) != (mix[other] is None):
        out.append("temperature known for one run only (ingest --temperature or request records)")
    elif mix[run_id] is not None and abs(mix[run_id] - mix[other]) > 0.1:
        out.append(f"greedy share {mix[other]:.2f} vs {mix[run_id]:.2f}")
    return out


def hazard_runs(store, run_id: str, gamma: int, audit_group=None, hazards_from: str | None = None):
    """Which runs the tail hazards of ``run_id`` (no recorded ceiling) are fitted on, and why.

    ``hazards_from`` (named by the user; ValueError unless :func:`hazard_compatibility` passes),
    else the compatible truth-bearing arms of the same audit, else none: the run's own observed
    outcomes. Never an unrelated run that merely shares gamma (other STS tables and temperature
    mixes biased unresolved blocks by +0.15 drafts)."""
    if hazards_from is not None:
        problems = hazard_compatibility(store, run_id, hazards_from)
        if problems:
            raise ValueError(f"--hazards-from {hazards_from}: not compatible with {run_id}: " + "; ".join(problems))
        return [hazards_from], (f"hazards fitted on run {hazards_from} (named by --hazards-from; compatible: gamma, "
                                "STS table, temperature mix)")
    others = [o for o in _audit_truth_runs(store, gamma, run_id, audit_group)
              if not hazard_compatibility(store, run_id, o)]
    if others:
        return others, f"hazards fitted on the truth-bearing arm of this audit: {', '.join(others)}"
    return [], ("hazards fitted on this run's own observed outcomes (in-window accepts and rejections, the exactly "
                "observed first trimmed position, greedy walks); deeper trimmed positions are extrapolated in "
                "confidence")


def read_training(store, runs: list[str]) -> pd.DataFrame:
    """``request_steps`` of truth-bearing runs, with their temperatures filled as :func:`load_run` does."""
    temps = store.query_df("SELECT run_id, temperature FROM runs WHERE run_id IN (SELECT UNNEST(?))", [runs])
    t = dict(zip(temps.run_id, temps.temperature))
    return pd.concat([_with_temperatures(store, r, store.read_table("request_steps", r), t.get(r)) for r in runs],
                     ignore_index=True)


def _key_order(df: pd.DataFrame, table: str) -> pd.DataFrame:
    """Rows in primary-key order: the held-out splits (cost, calibration) draw per row, so results
    must not depend on the order rows were stored in (ingest order, or a lake's partitions)."""
    from acceptscope import schema

    key = [k for k in schema.table(table).key if k in df.columns]
    if len(df) < 2 or not key:
        return df
    return df.sort_values(key, kind="stable", ignore_index=True)


def _sps_from_config(config_json, sps_hash):
    import hashlib
    from pathlib import Path

    from acceptscope.engine.sps import parse_sps

    try:
        path = Path(json.loads(config_json or "{}").get("sps_path") or "")
    except (ValueError, TypeError):
        return None
    if not path.is_file():
        return None
    raw = path.read_bytes()
    if hashlib.sha256(raw).hexdigest() != sps_hash:
        return None
    return parse_sps(raw.decode("utf-8"), str(path))


def _audit_truth_runs(store, gamma: int, exclude: str, audit_group) -> list[str]:
    """Truth-bearing arms (cap-accept / static, ceiling recorded) of the same audit, with this gamma."""
    if audit_group is None:
        return []
    q = ("SELECT r.run_id FROM runs r WHERE r.gamma = ? AND r.run_id <> ? AND r.audit_group = ? "
         "AND r.arm IN ('cap-accept','static') "
         "AND EXISTS (SELECT 1 FROM request_steps s WHERE s.run_id = r.run_id AND s.ceiling IS NOT NULL)")
    return store.query_df(q, [int(gamma), exclude, audit_group]).run_id.tolist()


class LocalTail:
    """Where :func:`run_all` fits and applies the tail estimator: in this process (the default).
    ``estimators.spark.SparkTail`` has the same two methods and runs them over a Parquet lake."""

    def fit(self, store, run_ids: list[str], frame, gamma: int):
        """Hazards from ``frame`` (the run being estimated) or, when None, from ``run_ids``' request-steps."""
        from estimators.tail import TailEstimator

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
        from estimators.stream import run_all_stream

        r = run_all_stream(store, [run_id], n_boot=n_boot, hazard_boot=hazard_boot, seed=seed,
                           hazards_from=hazards_from)[run_id]
        if isinstance(r, Exception):
            raise r
        return r
    from estimators.bracket import trim_counters
    from estimators.calibration import calibration_data
    from estimators.frame import BlockFrame
    from estimators.planner import audit
    from estimators.utilization import utilization

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
        from estimators.validation import batch_band

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
    from estimators.stream import run_all_stream

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


def sglang_bracket(data: dict, trim: dict, gamma: int) -> "_Table":
    """SGLang's [lo, hi] block-accept bracket from the run's estimator JSONL, next to the trim counters."""
    from estimators.bracket import bracket_from_jsonl

    if not len(data["estimator_rows"]):
        return _Table(pd.DataFrame(), dict(trim=trim, note="no SGLang estimator JSONL for this run"))
    br = bracket_from_jsonl(data["estimator_rows"], data["estimator_gather"], data["estimator_eos"], gamma=gamma)
    return _Table(br, dict(trim=trim, mean_lo=float(br.lo.mean()), mean_hi=float(br.hi.mean()),
                           categories=br.category.value_counts().to_dict()))


def fit_calibration(res: dict, make_data, n_boot: int, seed: int) -> None:
    """The held-out STS comparison of a run into ``res["calibration"]`` (or its skip reason), the same
    step for the in-memory, streamed and Spark paths. ``make_data()`` returns the run's
    :class:`~estimators.calibration.CalData` and the STS temperatures in force (compared as ``in-force``),
    or raises ValueError with the reason calibration is skipped."""
    from estimators.calibration import compare

    try:
        d, in_force = make_data()
        tr, te = d.split(seed=seed)
        res["calibration"] = compare(tr, te, n_boot=n_boot, seed=seed,
                                     extra_fits=None if in_force is None else {"in-force": list(in_force)})
    except ValueError as e:
        res["skipped"]["calibration"] = str(e)


def fit_cost(res: dict, steps: pd.DataFrame, sps_table, seed: int):
    """The additive SPS cost fit of a run's step times into ``res["cost"]`` (or its skip reason);
    returns the table the planner audit uses: the run's recorded one, else the fitted one."""
    from estimators.cost import CostModel

    cost = None
    try:
        cost = CostModel(seed=seed).fit(steps, baseline=sps_table)
        res["cost"] = cost.result_
    except (ValueError, KeyError) as e:
        res["skipped"]["cost"] = str(e)
    return sps_table or (cost.table_ if cost is not None else None)


class _Table:
    """A small result wrapper for tabular outputs (bracket) with the common interface."""

    def __init__(self, df: pd.DataFrame, summary: dict):
        self.df, self.summary = df, summary

    def to_json(self) -> dict:
        return self.summary


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
