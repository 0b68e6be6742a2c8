"""One run's tables and the steps every estimation path shares (in-memory :func:`estimators.run.run_all`,
the streamed :mod:`estimators.stream`, the Spark lake :mod:`estimators.spark`): load a run, the STS table in
force, which runs the tail hazards come from, the bracket, calibration and cost steps, JSON output.

Why a module of its own: the three paths import these at module top without an import cycle through
``estimators/__init__.py``."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from acceptscope import schema
from acceptscope.runs_table import read_runs
from acceptscope.store import Store
from acceptscope.domain.sps import parse_sps
from acceptscope.domain.temperature import as_served
from acceptscope.domain.served_tables import named_tables
from acceptscope.estimators.bracket import bracket_from_jsonl
from acceptscope.estimators.calibration import compare
from acceptscope.estimators.cost import CostModel, table_from_long
from acceptscope.estimators.hazard import temperature_key

RUN_KEYS = ("arm", "engine", "gamma", "temperature", "sts_hash", "sps_hash")  # the run row in run_all's results


def load_run(store, run_id: str, skip: tuple = ()) -> dict[str, Any]:
    """The tables of one run (plus the run row and its SPS/STS tables when recorded); tables in
    ``skip`` are left out (the streaming pass reads ``request_steps`` itself)."""
    runs = read_runs(store.query_df, [run_id])
    if runs.empty:
        raise KeyError(f"run {run_id!r} not in {store.path}")
    out = {"run": runs.iloc[0].to_dict()}
    if "request_steps" not in skip:  # (BlockFrame sorts request_steps itself)
        out["request_steps"] = read_request_steps(store, run_id)
    for t in ("steps", "estimator_rows", "estimator_gather", "estimator_eos", "sts_samples"):
        if t not in skip:
            out[t] = _key_order(store.read_table(t, run_id), t)
    sps_hash = out["run"].get("sps_hash")
    out["sps_table"] = None
    if sps_hash:
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


def read_request_steps(store, run_id: str, columns=None) -> pd.DataFrame:
    """``request_steps`` of one run as ``store.read_table`` returns them (stored row order, the record
    model's types), temperatures as stored: filled where the data is written
    (:mod:`acceptscope.domain.temperature`). A lake (``estimators.spark.LakeStore``) reads its own."""
    if not isinstance(store, Store):
        return store.read_request_steps(run_id, columns)
    return store.read_table("request_steps", run_id, columns=list(columns or schema.REQUEST_STEPS.names))


def served_temperatures(store, run_id: str) -> np.ndarray:
    """The distinct stored temperatures of a run's request-steps (NaN: unknown), computed where the rows
    are (a 100M-row run's rows are never read out)."""
    return served_temperature_sets(store, [run_id])[run_id]


def served_temperature_sets(store, run_ids, memo: dict | None = None) -> dict[str, np.ndarray]:
    """:func:`served_temperatures` of several runs in one query (``memo``: runs already read, filled with
    the rest; one estimate's hazard checks compare each run with every truth arm of its audit: 202
    queries over a store of 23 runs, one per run with it)."""
    memo = {} if memo is None else memo
    want = [r for r in dict.fromkeys(run_ids) if ("served", r) not in memo]
    if want:
        if isinstance(store, Store):
            got = store.query_arrow("SELECT DISTINCT run_id, temperature FROM request_steps WHERE run_id IN "
                                    "(SELECT UNNEST(?))", [want]).to_pydict()
            pairs = zip(got["run_id"], got["temperature"])
        else:  # a lake (``estimators.spark.LakeStore``)
            pairs = [(r[0], r[1]) for r in store.request_steps(want, ["run_id", "temperature"]).distinct().collect()]
        temps: dict = {r: [] for r in want}
        for r, t in pairs:
            temps[r].append(np.nan if t is None else float(t))
        for r in want:
            memo["served", r] = np.array(temps[r], float)
    return {r: memo["served", r] for r in run_ids}


def hazard_compatibility(store, run_id: str, other: str, memo: dict | None = None) -> list[str]:
    """Why ``other``'s observed tails cannot stand in for ``run_id``'s (empty: compatible).

    Hazards transfer only between runs whose drafts were scheduled alike: the same gamma,
    the same STS table in force (it changes what a confidence value means), and training data
    at every sampling temperature of ``run_id``: the hazard is keyed by temperature (acceptance at
    a given confidence differs with it), so the mixes may differ, but a temperature ``other``
    never served would be predicted from other temperatures' hazards (T = 0.7 from T = 1 biased
    aggregates by ~0.06 drafts on the reference engine). ``memo``: see :func:`served_temperature_sets`."""
    return _incompatible(store, run_id, [other], memo)[other]


def _incompatible(store, run_id: str, others: list[str], memo: dict | None = None) -> dict[str, list[str]]:
    """:func:`hazard_compatibility` of ``run_id`` with each of ``others``: one read of their run rows and
    one of their served temperatures."""
    runs = read_runs(store.query_df, [run_id, *others], ["run_id", "gamma", "sts_hash", "temperature"]
                     ).set_index("run_id")
    served = served_temperature_sets(store, [r for r in (run_id, *others) if r in runs.index], memo)
    temps = {r: None if np.isnan(t).all() else set(temperature_key(as_served(t)).tolist())  # as the frame reads them
             for r, t in served.items()}
    a = runs.loc[run_id]
    fmt = lambda v: ", ".join(f"{x:g}" for x in sorted(v))  # noqa: E731
    out = {}
    for other in others:
        if other not in runs.index:
            out[other] = [f"run {other!r} is not in {store.path}"]
            continue
        b = runs.loc[other]
        why = []
        if int(a.gamma) != int(b.gamma):
            why.append(f"gamma {int(b.gamma)} != {int(a.gamma)}")
        sa, sb = (None if pd.isna(x) else x for x in (a.sts_hash, b.sts_hash))
        if sa != sb:
            why.append(f"STS table in force differs ({(sb or 'none')[:12]} vs {(sa or 'none')[:12]})")
        if (temps[run_id] is None) != (temps[other] is None):
            why.append("temperature known for one run only (ingest --temperature or request records)")
        elif temps[run_id] is not None and temps[run_id] - temps[other]:
            why.append(f"temperature {fmt(temps[run_id] - temps[other])} of {run_id} has no training data in {other} "
                       f"(it served {fmt(temps[other])})")
        out[other] = why
    return out


def hazard_runs(store, run_id: str, gamma: int, audit_group=None, hazards_from: str | None = None,
                memo: dict | None = None):
    """Which runs the tail hazards of ``run_id`` (no recorded ceiling) are fitted on, and why.

    ``hazards_from`` (named by the user; ValueError unless :func:`hazard_compatibility` passes),
    else the compatible truth-bearing arms of the same audit, else none: the run's own observed
    outcomes. Never an unrelated run that merely shares gamma (other STS tables and temperature
    mixes biased unresolved blocks by +0.15 drafts). ``memo``: see :func:`served_temperature_sets`."""
    if hazards_from is not None:
        problems = hazard_compatibility(store, run_id, hazards_from, memo)
        if problems:
            raise ValueError(f"--hazards-from {hazards_from}: not compatible with {run_id}: " + "; ".join(problems))
        return [hazards_from], (f"hazards fitted on run {hazards_from} (named by --hazards-from; compatible: gamma, "
                                "STS table, temperatures)")
    truth = _audit_truth_runs(store, gamma, run_id, audit_group)
    why = _incompatible(store, run_id, truth, memo) if truth else {}
    others = [o for o in truth if not why[o]]
    if others:
        return others, f"hazards fitted on the truth-bearing arm of this audit: {', '.join(others)}"
    return [], ("hazards fitted on this run's own observed outcomes (in-window accepts and rejections, the exactly "
                "observed first trimmed position, greedy walks); deeper trimmed positions are extrapolated in "
                "confidence")


def read_training(store, runs: list[str]) -> pd.DataFrame:
    """``request_steps`` of truth-bearing runs, read as :func:`load_run` reads them."""
    return pd.concat([read_request_steps(store, r) for r in runs], ignore_index=True)


def _key_order(df: pd.DataFrame, table: str) -> pd.DataFrame:
    """Rows in primary-key order: the held-out splits (cost, calibration) draw per row, so results
    must not depend on the order rows were stored in (ingest order, or a lake's partitions)."""
    key = [k for k in schema.table(table).key if k in df.columns]
    if len(df) < 2 or not key:
        return df
    return df.sort_values(key, kind="stable", ignore_index=True)


def _sps_from_config(config_json, sps_hash):
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


def sglang_bracket(data: dict, trim: dict, gamma: int) -> "ResultTable":
    """SGLang's [lo, hi] block-accept bracket from the run's estimator JSONL, next to the trim counters."""
    if not len(data["estimator_rows"]):
        return ResultTable(pd.DataFrame(), dict(trim=trim, note="no SGLang estimator JSONL for this run"))
    br = bracket_from_jsonl(data["estimator_rows"], data["estimator_gather"], data["estimator_eos"], gamma=gamma)
    return ResultTable(br, dict(trim=trim, mean_lo=float(br.lo.mean()), mean_hi=float(br.hi.mean()),
                           categories=br.category.value_counts().to_dict()))


def fit_calibration(res: dict, make_data, n_boot: int, seed: int) -> None:
    """The held-out STS comparison of a run into ``res["calibration"]`` (or its skip reason), the same
    step for the in-memory, streamed and Spark paths. ``make_data()`` returns the run's
    :class:`~estimators.calibration.CalData` and the STS temperatures in force (compared as ``in-force``),
    or raises ValueError with the reason calibration is skipped."""
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
    cost = None
    try:
        cost = CostModel(seed=seed).fit(steps, baseline=sps_table)
        res["cost"] = cost.result_
    except (ValueError, KeyError) as e:
        res["skipped"]["cost"] = str(e)
    return sps_table or (cost.table_ if cost is not None else None)


class ResultTable:
    """A small result wrapper for tabular outputs (bracket) with the common interface."""

    def __init__(self, df: pd.DataFrame, summary: dict):
        self.df, self.summary = df, summary

    def to_json(self) -> dict:
        return self.summary


def to_jsonable(results: dict[str, Any]) -> dict:
    """JSON-ready dict of :func:`run_all` results: strict JSON (NaN and infinities become null)."""
    out = {k: v if k == "skipped" else v.to_json() for k, v in results.items()}
    return json.loads(json.dumps(_finite(out), default=_default, allow_nan=False))


def _finite(o):
    """``o`` with every non-finite float (Python or numpy) replaced by None, containers walked."""
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_finite(v) for v in o]
    if isinstance(o, np.ndarray):
        return _finite(o.tolist())
    if isinstance(o, (float, np.floating)):
        return float(o) if np.isfinite(o) else None
    if o is pd.NA or o is pd.NaT:
        return None
    return o


def _default(o):
    if isinstance(o, (np.integer,)):
        return int(o)
    if isinstance(o, (np.bool_,)):
        return bool(o)
    return str(o)
