"""One run's results, assembled in one place, whatever executor fed its accumulator.

The executors differ only in how chunks of whole requests reach a
:class:`~estimators.accumulator.RunAccumulator`:

* in memory (:func:`estimators.run_all`): the run is one chunk, so every result is exact (the planner
  audit recomputes every decode step, the tail keeps its per-block predictions);
* streamed (:func:`estimators.stream.run_all_stream`): one ordered DuckDB scan cut into chunks;
* Spark (:func:`estimators.spark.run_lake`): partitions' chunks on the executors, merged on the driver.

Each then calls :func:`open_run` (the run's side tables, the STS table in force, the accumulator) and
:func:`assemble` (the results dict: ``run``, ``tail``, ``bracket``, ``utilization``, ``calibration``,
``cost``, ``planner`` and every registered estimator of :mod:`estimators.registry`). A skip reason is
written here once.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import pandas as pd

from acceptscope import schema
from acceptscope.estimators.accumulator import RunAccumulator, aggregate_specs
from acceptscope.estimators.audit_size import advice_for
from acceptscope.estimators.calibration import calibration_data
from acceptscope.estimators.chunks import read_sample
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.health import interval_health
from acceptscope.estimators.registry import Skip
from acceptscope.estimators.run_data import (RUN_KEYS, ResultTable, fit_calibration, fit_cost, hazard_runs, load_run,
                                             sglang_bracket, sts_in_force)
from acceptscope.estimators.tail import TailEstimator

# what the cost fit, the batch-size bands and the planner audit read of ``steps``
STEP_COLUMNS = ("rank", "epoch", "forward_ct", "bs", "budget", "lag_steps", "num_verify_tokens", "executed_verify_tokens",
                "predicted_step_ms", "predicted_theta", "step_cpu_ms", "step_gpu_ms")
COST_STEPS = 1 << 17  # decode steps a big run's cost fit reads (a stable hash-sample of them beyond)
PLANNER_ROWS = 1 << 17  # request-steps of the first decode steps a big run's planner audit recomputes
EXACT_NOTE = "this run: ceiling recorded on every request-step (the verify ran the whole block): no tail is estimated"
NO_PLANNER = "no SPS table recorded and no step timings to fit one"


# ----------------------------------------------------------------------------------------------
# the run's side tables
# ----------------------------------------------------------------------------------------------
def read_steps(store, run_id: str, columns=STEP_COLUMNS, max_steps: int | None = None) -> pd.DataFrame:
    """The run's ``steps`` in key order, only the columns the cost fit, the batch sizes and the planner
    audit read, without ``run_id`` (:func:`with_run` adds it back): a ``steps`` row is ~1/batch of the
    request-steps, so whatever is kept per step is the streamed path's growth in memory with the run's
    rows. ``max_steps``: beyond that many steps, a stable hash-sample of about that many
    (multiplicative hash of the step key, computed in DuckDB)."""
    have = set(schema.table("steps").names)
    cols = [c for c in columns if c in have]
    n = count_steps(store, run_id) if max_steps else 0
    if max_steps and n > max_steps:
        keep = int((max_steps / n) * (1 << 32))
        d = store.query_df(f"SELECT {', '.join(cols)} FROM steps WHERE run_id = ? AND ((forward_ct * 2654435761 + "
                           "epoch * 40503 + rank * 97) % 4294967296) < ?", [run_id, keep])
        d.attrs["sampled_from"] = n
    else:
        d = store.read_table("steps", run_id, columns=cols)
    return d if len(d) < 2 else d.sort_values(["rank", "epoch", "forward_ct"], kind="stable", ignore_index=True)


def count_steps(store, run_id: str) -> int:
    return int(store.query_df("SELECT count(*) AS n FROM steps WHERE run_id = ?", [run_id]).n.iloc[0])


def with_run(steps: pd.DataFrame, run_id: str) -> pd.DataFrame:
    return steps if "run_id" in steps else steps.assign(run_id=run_id)


def run_meta(store, run_ids) -> pd.DataFrame:
    """The runs' rows with their request-step and recorded-ceiling counts (runs with request-steps only)."""
    q = ("SELECT r.*, c.n_rows, c.n_truth FROM runs r JOIN (SELECT run_id, count(*) AS n_rows, count(ceiling) AS n_truth "
         "FROM request_steps WHERE run_id IN (SELECT UNNEST(?)) GROUP BY run_id) c USING (run_id)")
    return store.query_df(q, [list(run_ids)])


@dataclass(frozen=True)
class HazardPlan:
    """What a run's tail hazards are fitted on (``fit``) and which truth-bearing runs measure the shift past
    the positions the walk can follow (``calibrate``: an audit arm or a run named by ``--hazards-from``;
    empty: the prior of :mod:`estimators.margin` alone), and the note that says so."""

    fit: tuple
    calibrate: tuple
    note: str


def hazard_plan(store, run_id: str, gamma: int, exact: bool, audit_group=None,
                hazards_from: str | None = None, memo: dict | None = None) -> HazardPlan:
    """The run itself when its ceiling is recorded (nothing is estimated). Else the hazards are the run's
    own (its observed outcomes), and the cap-accept runs among :func:`estimators.run_data.hazard_runs`'
    choice of truth-bearing runs (its audit arm, or a named run) measure the shift past the walk
    (:meth:`estimators.tail.TailEstimator.calibrate_prior`); a choice of static runs only (they never trim,
    so they show no shift) trains the hazards on their truth, as before audits measured the shift.
    ``memo``: the runs' served temperatures read so far (:func:`estimators.run_data.served_temperature_sets`)."""
    if exact:
        return HazardPlan((run_id,), (), EXACT_NOTE)
    others, note = hazard_runs(store, run_id, gamma, audit_group, hazards_from, memo)
    if not others:
        return HazardPlan((run_id,), (), note)
    runs = store.runs()  # the runs table (a DuckDB store or a Spark lake alike)
    cap_accept = set(runs.run_id[runs.arm == "cap-accept"])
    replays = tuple(r for r in others if r in cap_accept)
    if not replays:  # static arms never trim, so they show no shift past a window: their truth trains the hazards
        return HazardPlan(tuple(others), (), note)
    return HazardPlan((run_id,), replays,
                      note.replace("hazards fitted on", "hazards fitted on this run's own observed outcomes; the "
                                   "shift past the positions the walk could follow measured on", 1))


def fit_estimator(store, runs: tuple, gamma: int, fit_rows: int, seed: int, duckdb_memory=None):
    """A TailEstimator fitted on a stable hash-sample of whole requests of ``runs``, and its notes.

    Runs whose every request-step has its ceiling recorded and none trimmed (static arms) hold no
    position past a window, so the fit fails on any sample of them: it is tried on one request, for the
    hazard model's own error, instead of reading and walking ``fit_rows`` request-steps (a store's ten
    static arms and the compact arms trained on them: ~1.5 of the fleet's CPU-s)."""
    n_total, n_open = training_counts(store, runs, gamma)
    if n_total and not n_open:  # raises the fit's ValueError (should it fit, the sample is fitted below)
        TailEstimator().fit(BlockFrame.from_request_steps(read_sample(store, runs, 1, seed=seed, duckdb_memory=duckdb_memory,
                                                                      ordered=False), gamma=gamma))
    tbl = read_sample(store, runs, fit_rows, seed=seed, duckdb_memory=duckdb_memory, total=n_total, ordered=False)
    n_fit = tbl.num_rows
    est = TailEstimator().fit(BlockFrame.from_request_steps(tbl, gamma=gamma))
    del tbl
    return est, ([f"hazards fitted on a stable hash-sample of {n_fit} of {n_total} request-steps (whole requests)"]
                 if n_fit < n_total else [])


def training_counts(store, runs: tuple, gamma: int) -> tuple[int, int]:
    """The request-steps of ``runs``, and how many of them lack a recorded ceiling or were trimmed (window
    short of ``gamma``): none, and nothing lies past a window to fit hazards on (:func:`fit_estimator`)."""
    got = store.query_df('SELECT count(*) AS n, count(*) FILTER (WHERE coalesce(ceiling, -1) < 0 OR coalesce("window", 0) '
                         "< ?) AS open FROM request_steps WHERE run_id IN (SELECT UNNEST(?))", [int(gamma), list(runs)])
    return int(got.n.iloc[0]), int(got.open.iloc[0])


def fit_hazards(store, meta_row, fit_rows: int, seed: int, cache: dict, hazards_from: str | None = None,
                duckdb_memory: str | None = None, hazard_boot: int = 0):
    """The run's fitted TailEstimator (on a stable hash-sample of whole requests of its training runs,
    at most ``fit_rows`` request-steps; the shift past the walk measured on its audit, :class:`HazardPlan`),
    :meth:`~estimators.tail.TailEstimator.frozen` with its ``hazard_boot`` refits, and the notes on what it
    was fitted on. ``cache``: fits shared by runs with the same plan (and the runs' served temperatures
    their plans compared)."""
    rid, gamma = meta_row.run_id, int(meta_row.gamma)
    plan = hazard_plan(store, rid, gamma, bool(meta_row.n_truth == meta_row.n_rows), meta_row.get("audit_group"),
                       hazards_from, memo=cache)
    boot = 0 if meta_row.n_truth == meta_row.n_rows else hazard_boot
    key = (plan.fit, plan.calibrate, boot)
    if key not in cache:
        notes, note = [], plan.note
        try:
            est, notes = fit_estimator(store, plan.fit, gamma, fit_rows, seed, duckdb_memory)
            if plan.calibrate:  # the run alone, as production estimates it: what interval health scores
                cache[("alone", rid)] = (plan.calibrate[0], gamma, est.frozen(boot, seed), list(notes))
                audit = read_sample(store, plan.calibrate, fit_rows, seed=seed, duckdb_memory=duckdb_memory,
                                    ordered=False)
                est.calibrate_prior(BlockFrame.from_request_steps(audit, gamma=gamma), seed)
                note += est.calibration_note()
                del audit
        except ValueError as e:  # nothing past any window to learn from (e.g. static runs never trim)
            if plan.calibrate:  # the audit's truth still shows every position: hazards fitted on it
                cache[("alone", rid)] = e  # and the run alone cannot be estimated: interval health says why
                est, notes = fit_estimator(store, plan.calibrate, gamma, fit_rows, seed, duckdb_memory)
                note = f"{e} in this run's own outcomes: hazards fitted on {', '.join(plan.calibrate)} (its audit)"
            else:
                est = TailEstimator.confidence_only(gamma, str(e))
                notes = [f"{e}: the hazards are the confidences themselves"]
        cache[key] = (est.frozen(boot, seed), [note] + notes)
    return cache[key]


def add_interval_health(store, results: dict, run_id: str, cache: dict, hazard_boot: int, seed: int) -> None:
    """``results['interval_health']`` (:mod:`estimators.health`) for a run whose audit arm replayed part of
    its traffic: its own intervals, as production computes them, scored against the audit's truth; a
    reason in ``results['skipped']`` when the check cannot run. Nothing for other runs. ``cache``:
    :func:`fit_hazards`' cache, which holds such a run's audit arm and its hazards alone (fitted before the
    audit measured the shift), so the check neither plans nor fits again."""
    entry = cache.get(("alone", run_id))
    if entry is None:
        return
    if isinstance(entry, ValueError):
        results["skipped"]["interval_health"] = str(entry)
        return
    audit, gamma, est, notes = entry
    try:
        results["interval_health"] = interval_health(store, run_id, audit, gamma, est, notes,
                                                     hazard_boot=hazard_boot, seed=seed)
    except ValueError as e:
        results["skipped"]["interval_health"] = str(e)


@dataclass
class RunSide:
    """What :func:`assemble` needs besides the accumulator: the run's tables (``load_run`` without its
    request-steps), the notes on the hazards' training, the skip reasons known before the pass."""

    data: dict
    notes: list[str]
    skipped: dict = field(default_factory=dict)
    temperatures: Any = None  # the STS table in force (None: identity)


def run_side(store, run_id: str, notes: list[str], steps: pd.DataFrame | None = None) -> RunSide:
    """The run's side tables and the STS table in force; ``steps``: the run's steps as the executor
    holds them (else read whole)."""
    data = load_run(store, run_id, skip=("request_steps", "steps"))
    data["steps"] = read_steps(store, run_id) if steps is None else steps
    side = RunSide(data=data, notes=list(notes))
    try:
        side.temperatures = sts_in_force(data)
    except ValueError as e:  # the confidences are post-STS and the table is missing: no calibration
        side.skipped["calibration"] = str(e)
    return side


def step_rows(store, run_id: str) -> pd.DataFrame:
    """Batch size per decode step from the run's request rows (a run without a ``steps`` table)."""
    return store.query_df("SELECT rank, epoch, forward_ct, count(*) AS bs FROM request_steps WHERE run_id = ? "
                          "GROUP BY rank, epoch, forward_ct", [run_id])


def new_accumulator(est, run_id: str, gamma: int, exact: bool, n_rows: int, side: RunSide, store, n_boot: int,
                    hazard_boot: int, seed: int, sample_rows: int, **kw) -> RunAccumulator:
    """The run's accumulator as every executor opens it (``kw``: executor options, e.g. ``gather``)."""
    steps = side.data["steps"]
    return RunAccumulator(run_id, gamma, est, exact, steps, 0 if exact else hazard_boot, seed,
                          min(1.0, sample_rows / max(n_rows, 1)), side.temperatures,
                          None if len(steps) else step_rows(store, run_id), keep_per_request=n_rows <= sample_rows,
                          specs=aggregate_specs(n_boot, seed), keep_stats=n_rows <= sample_rows, **kw)


# ----------------------------------------------------------------------------------------------
# the results
# ----------------------------------------------------------------------------------------------
def assemble(acc: RunAccumulator, side: RunSide, n_boot: int, seed: int, planner: Callable,
             cost_steps: pd.DataFrame | None = None) -> dict[str, Any]:
    """The run's results from its accumulator. ``planner(table, steps)``: the executor's planner audit
    (it needs whole decode steps with every request's history, which only the executor can read);
    ``cost_steps``: the steps the cost fit reads when the executor did not hold them all."""
    data = side.data
    res: dict[str, Any] = {"skipped": {}}
    res["run"] = ResultTable(pd.DataFrame(), {k: data["run"].get(k) for k in RUN_KEYS})
    tail = acc.tail_result(dict(acc.est.hazard.info_), side.notes)
    if acc.last_tail is not None:  # one chunk: the per-block predictions are at hand (validation reads them)
        tail.blocks = acc.last_tail.blocks
    res["tail"] = tail
    if not acc.exact:
        run = tail.aggregate().iloc[0]
        tail.advice = advice_for(tail.counts, (float(run["lo"]), float(run["hi"])), tail.hazard_info.get("unobserved_prior"))
    res["bracket"] = sglang_bracket(data, acc.trim_counters(), acc.G)
    res["utilization"] = acc.utilization_result(tail, n_boot, seed)

    def make_data():
        if "calibration" in side.skipped:
            raise ValueError(side.skipped["calibration"])
        d = acc.realized_calibration() if acc.exact else \
            calibration_data(None, "greedy", sts_samples=data["sts_samples"], gamma=acc.G)
        return d, side.temperatures

    fit_calibration(res, make_data, n_boot, seed)
    steps = data["steps"] if cost_steps is None else cost_steps
    table = fit_cost(res, steps, data["sps_table"], seed)
    if "sampled_from" in steps.attrs and "cost" in res:
        res["cost"].notes.append(f"fitted on a stable hash-sample of {len(steps)} of {steps.attrs['sampled_from']} "
                                 "decode steps (bounded memory)")
    if table is not None and len(steps):
        p = planner(table, steps)
        p.notes.append("SPS table: " + ("the run's recorded table" if data["sps_table"] else "fitted from this run's timings"))
        res["planner"] = p
    else:
        res["skipped"]["planner"] = NO_PLANNER
    for name, e in acc.extra.items():
        try:
            res[name] = e.result()
        except Skip as why:
            res["skipped"][name] = str(why)
    return res
