"""The estimators over a Parquet telemetry lake on Spark (``pip install acceptscope[spark]``).

``acceptscope estimate --lake LAKE --engine spark`` runs :func:`run_lake` per run: the store is a
:class:`LakeStore` (Spark SQL views over the lake exactly as ``acceptscope export`` wrote it:
Hive partitions ``run_id=`` / ``rank=``, partition types pinned from the record model, no copy),
and the per-row work is the streamed path's (``estimators.stream._RunAcc``) on the executors.
The JSON equals ``estimate --db`` on the same runs (tests/test_estimators_spark.py).

What runs where (docs/scale.md section 6 has the measured costs):

* **executors**, over ``request_steps`` hash-partitioned by ``(run_id, rid)`` (every request's
  steps in one partition, sorted, cut into chunks of whole requests), Arrow batches in and out
  (``mapInArrow``), numpy per chunk, no per-row Python:
  the hazard model's training positions (one row per trimmed position with a known outcome, of
  a stable hash-sample of at most ``fit_rows`` request-steps); then, with the fitted model and its
  bootstrap refits broadcast, the tail walk and per-block predictions, reduced per partition to
  per-(group, request) sufficient statistics (``estimators.bootstrap.request_stats``), per-group
  refit shifts, per-group / per-position utilization sums, the window histogram, trim counters
  and the calibration rows (a stable hash-sample of requests, at most ``sample_rows``); and the
  per-position STS statistics (:func:`sts_fit_lake`).
* **driver**: the logistic hazard fit (``HazardModel.fit_long`` on the collected positions: the
  local path's rows in its order, so the fit is bit-identical), the ``hazard_boot`` refits (spread
  over tasks), the merge of the partitions' sums, the keyed Poisson bootstrap of the aggregates
  (``aggregate_stats``: replicate draws seeded by the request key, so no dependence on the
  partitioning), the cost fit over ``steps`` (one row per decode step), the calibration
  comparison, and the planner audit, whose budget recomputation needs whole decode steps with
  each request's history: it reads the run's scalar and confidence columns (up to
  ``estimators.stream.PLANNER_ROWS`` request-steps, the first decode steps beyond).
  Small tables (``runs``, ``steps``, SGLang estimator rows, ``sts_samples``) are read whole.

pyspark is imported here only, lazily.
"""

from __future__ import annotations

import copy
import math
import os
import pickle
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Sequence
from urllib.parse import unquote

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
from pyspark import cloudpickle
from pyspark.sql import SparkSession
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema
from scipy.optimize import minimize_scalar

from acceptscope import schema
from acceptscope.runs_table import read_runs
from acceptscope.store import incomplete_runs
from acceptscope.estimators.accumulator import RunAccumulator
from acceptscope.estimators.calibration import LOG_T_BOUNDS, calibration_data
from acceptscope.estimators.chunks import TAIL_COLUMNS, sample_from_counts, whole_requests
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.pipeline import (PLANNER_ROWS, assemble, hazard_plan, new_accumulator, run_side,
                                             step_rows)
from acceptscope.estimators.planner import audit
from acceptscope.estimators.registry import registered
from acceptscope.estimators.run_data import load_run, sts_in_force, to_jsonable
from acceptscope.estimators.stream import planner_window
from acceptscope.estimators.tail import TailEstimator, strip_training

# request_steps list columns only the tail walk reads: they stay on the executors
WALK_ONLY = ("draft_tokens", "committed_tokens", "draft_logprob", "target_logprob", "survival")
CHUNK_ROWS = 1 << 16  # request-steps per executor pass (whole requests; bounded memory)


def spark_session(master: str = "local[2]", shuffle_partitions: int | None = None, app_name: str = "acceptscope",
                  driver_memory: str = "2g"):
    """A SparkSession for the lake (local mode by default). Workers run this Python."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    # pyspark 4.3 warns on every Arrow conversion that it "does not yet fully support pandas >= 3";
    # the conversions used here are Arrow-only and covered by the equality test
    os.environ.setdefault("PYTHONWARNINGS", "ignore::FutureWarning")
    warnings.filterwarnings("ignore", category=FutureWarning, module=r"pyspark\..*")
    parts = shuffle_partitions or max(2, 2 * _cores(master))
    spark = (SparkSession.builder.master(master).appName(app_name)
             .config("spark.ui.enabled", "false")
             .config("spark.ui.showConsoleProgress", "false")
             .config("spark.driver.memory", driver_memory)
             .config("spark.sql.shuffle.partitions", str(parts))
             .config("spark.default.parallelism", str(parts))
             .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false")
             .config("spark.sql.execution.arrow.pyspark.enabled", "true")
             .config("spark.sql.session.timeZone", "UTC")
             .getOrCreate())
    spark.sparkContext.setLogLevel("ERROR")
    return spark


def _cores(master: str) -> int:
    if master.startswith("local[") and master.endswith("]"):
        n = master[6:-1]
        return os.cpu_count() or 1 if n == "*" else int(n)
    return 1 if master == "local" else 2


def spark_schema(t: schema.Table, columns: Sequence[str] | None = None):
    """The record model's Arrow schema as a Spark StructType (every field nullable: Parquet files
    written by other tools may not carry the not-null flags)."""
    fields = [f.with_nullable(True) for f in t.arrow_schema if columns is None or f.name in columns]
    return from_arrow_schema(pa.schema(fields))


def _to_model(tbl: pa.Table, t: schema.Table) -> pa.Table:
    """Arrow from Spark (``int32`` for IntegerType, timestamps, ...) in the record model's types."""
    names = [n for n in t.names if n in tbl.column_names]
    return tbl.select(names).cast(pa.schema([t.arrow_schema.field(n) for n in names]))


SQL_VIEWS = ("runs", "request_steps", "requests", "sps_tables", "sts_tables")


class LakeStore:
    """The :class:`~acceptscope.store.Store` reads :func:`estimators.run_all` uses, over an exported
    lake with Spark SQL: ``query_df`` (Spark SQL with ``?`` parameters), ``read_table``, ``runs``.

    Each table of the export is a temp view read with the record model's schema, partition columns
    included, so Spark types ``run_id`` as a string and ``rank`` as an int whatever the values look
    like. ``read_table('request_steps')`` returns the driver's columns (no :data:`WALK_ONLY` lists);
    :meth:`frame` is the Spark DataFrame of a table."""

    def __init__(self, spark, lake: str | Path):
        self.spark, self.path = spark, Path(lake)
        if not (self.path / "_acceptscope_export.json").is_file() and not (self.path / "runs").is_dir():
            raise FileNotFoundError(f"{self.path}: not a lake written by `acceptscope export` (no runs/ or _acceptscope_export.json)")
        self._frames = {}
        for name in SQL_VIEWS:  # what run_all's SQL names; other tables are read on demand
            self.frame(name).createOrReplaceTempView(name)

    def frame(self, name: str):
        if name in self._frames:
            return self._frames[name]
        t = schema.table(name)
        root = self.path / t.name
        sch = spark_schema(t)
        if root.is_dir() and any(root.rglob("*.parquet")):
            df = self.spark.read.schema(sch).option("basePath", str(root)).parquet(str(root))
            df = df.select(*t.names)
        else:
            df = self.spark.createDataFrame([], sch)
        self._frames[name] = df
        return df

    def _has_partition(self, name: str, run_id: str) -> bool:
        """Whether the export wrote a ``run_id=`` directory for ``run_id`` in table ``name``."""
        root = self.path / name
        return root.is_dir() and any(d.is_dir() and unquote(d.name[len("run_id="):]) == run_id
                                     for d in root.glob("run_id=*"))

    def query_df(self, sql: str, params: Sequence[Any] | None = None) -> pd.DataFrame:
        """Spark SQL over the lake's views; string columns as objects with None for NULL (as the
        DuckDB store returns them: ``if run["sps_hash"]:`` must be False for a NULL hash)."""
        tbl = self.spark.sql(sql, args=list(params or [])).toArrow()
        df = tbl.to_pandas()
        for c, f in zip(tbl.column_names, tbl.schema):
            if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
                df[c] = pd.Series(tbl.column(c).to_pylist(), dtype=object, index=df.index)
        return df

    def runs(self) -> pd.DataFrame:
        return read_runs(self.query_df)

    def read_arrow(self, name: str, run_id: str | Sequence[str] | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        """One table (rows of ``run_id``), sorted by its key, in the record model's types."""
        t = schema.table(name)
        df = self.frame(name)
        if columns is None:
            columns = [c for c in t.names if not (name == "request_steps" and c in WALK_ONLY)]
        if run_id is not None and "run_id" in t.names:
            ids = [run_id] if isinstance(run_id, str) else list(run_id)
            if not any(self._has_partition(name, i) for i in ids):  # pruned by path: no job
                return pa.schema([t.arrow_schema.field(c) for c in columns]).empty_table()
            df = df.where(F.col("run_id").isin(ids))
        tbl = _to_model(df.select(*columns).toArrow(), t)
        key = [k for k in t.key if k in tbl.column_names]
        return tbl.sort_by([(k, "ascending") for k in key]) if key and tbl.num_rows else tbl

    def read_table(self, name: str, run_id: str | Sequence[str] | None = None,
                   columns: Sequence[str] | None = None) -> pd.DataFrame:
        return self.read_arrow(name, run_id, columns).to_pandas()

    def request_steps(self, run_ids, columns: Sequence[str] | None = None):
        """``request_steps`` of ``run_ids`` (``columns`` only) as a Spark frame, read as stored: the lake is
        exported from a store (:mod:`acceptscope.export`), whose temperatures are filled where the data is
        written (:mod:`acceptscope.domain.temperature`), so a lake needs no fill of its own."""
        rs = self.frame("request_steps").where(F.col("run_id").isin(list(run_ids)))
        return rs if columns is None else rs.select(*[c for c in columns if c in schema.REQUEST_STEPS.names])

    def read_request_steps(self, run_id: str, columns: Sequence[str] | None = None) -> pd.DataFrame:
        """:func:`estimators.run_data.read_request_steps` over the lake."""
        cols = list(columns) if columns is not None else [c for c in schema.REQUEST_STEPS.names if c not in WALK_ONLY]
        return _to_model(self.request_steps([run_id], cols).toArrow(), schema.REQUEST_STEPS).to_pandas()


# ---------------------------------------------------------------------------
# executors: whole requests per pass
# ---------------------------------------------------------------------------
def _frame(tbl: pa.Table, gamma: int):
    return BlockFrame.from_request_steps(_to_model(tbl, schema.REQUEST_STEPS).to_pandas(), gamma=gamma)


def _row_keys(frame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(run_id, rid, position within the request) of every frame row (rows are grouped by request)."""
    first = np.searchsorted(frame.request, frame.request)  # request codes are sorted in the frame
    return (frame.df["run_id"].to_numpy(object), frame.df["rid"].to_numpy(object),
            np.arange(frame.n, dtype=np.int64) - first)


TRAIN_FIELDS = [("run_id", pa.string()), ("rid", pa.string()), ("pos", pa.int64()), ("seq", pa.int64()),
                ("k", pa.int64()), ("x", pa.float64()), ("y", pa.float64()), ("wt", pa.float64()),
                ("greedy", pa.bool_()), ("state", pa.int64()), ("n", pa.int64()), ("truth", pa.bool_()),
                ("cpu_s", pa.float64()), ("temp", pa.float64()), ("workload", pa.string())]


def _train_partition(batches, est, gamma: int, chunk_rows: int):
    """Hazard training positions of a partition's requests (``HazardModel._long`` per chunk), then one
    row per request (``pos = -1``) with its number of request-steps ``n`` and whether it has truth."""
    sch = pa.schema(TRAIN_FIELDS)
    for tbl in whole_requests(batches, chunk_rows):
        t0 = time.process_time()
        frame = _frame(tbl, gamma)
        wk = est._walk(frame, np.arange(frame.n), None)
        L, _ = est.hazard._long(frame, wk["h"], wk["state"])
        run, rid, pos = _row_keys(frame)
        r = L["row"]
        m = r.size
        first = np.flatnonzero(pos == 0)
        q = first.size
        n = np.diff(np.append(first, frame.n))
        truth = np.logical_or.reduceat(frame.has_truth, first) if q else np.zeros(0, bool)
        yield pa.RecordBatch.from_arrays(
            [pa.array(np.concatenate([run[r], run[first]]), pa.string()),
             pa.array(np.concatenate([rid[r], rid[first]]), pa.string()),
             pa.array(np.concatenate([pos[r], np.full(q, -1)])), pa.array(np.arange(m + q, dtype=np.int64)),
             pa.array(np.concatenate([np.asarray(L["k"], np.int64), np.full(q, -1)])),
             pa.array(np.concatenate([L["x"], np.zeros(q)])), pa.array(np.concatenate([L["y"], np.zeros(q)])),
             pa.array(np.concatenate([L["wt"], np.zeros(q)])),
             pa.array(np.concatenate([np.asarray(L["greedy"], bool), np.zeros(q, bool)])),
             pa.array(np.concatenate([np.asarray(L["state"], np.int64), np.zeros(q, np.int64)])),
             pa.array(np.concatenate([np.zeros(m, np.int64), n.astype(np.int64)])),
             pa.array(np.concatenate([np.zeros(m, bool), truth])),
             pa.array(np.concatenate([np.zeros(m + q - 1), [time.process_time() - t0]]) if q else np.zeros(m)),
             pa.array(np.concatenate([L["temp"], np.zeros(q)])),  # the hazard's keys (HazardModel._set_levels)
             pa.array(np.concatenate([L["workload"], np.full(q, "", object)]), pa.string())],
            schema=sch)


def _by_request(df, parts: int):
    return df.repartition(parts, "run_id", "rid").sortWithinPartitions("run_id", "rid", "rank", "epoch", "forward_ct")


def _request_index(run_id, rid) -> tuple[dict, np.ndarray]:
    """Codes of (run_id, rid) in the order ``BlockFrame`` numbers requests (sorted keys)."""
    run = pd.Series(run_id, dtype=object)
    one_run = run.nunique() <= 1
    key = pd.Series(rid, dtype=object) if one_run else run.astype(str) + "\x00" + pd.Series(rid, dtype=object).astype(str)
    codes, uniq = pd.factorize(key, sort=True)
    return {(a, b): c for a, b, c in zip(run_id, rid, codes)}, codes


def _codes_of(index: dict, run, rid) -> np.ndarray:
    """Request codes of rows, from :func:`_request_index`'s map (one lookup per distinct request)."""
    key = pd.MultiIndex.from_arrays([pd.Index(run, dtype=object), pd.Index(rid, dtype=object)])
    inv, u = pd.factorize(key)
    return np.array([index[k] for k in u], np.int64)[inv] if len(u) else np.zeros(0, np.int64)


class SparkTail:
    """:class:`estimators.LocalTail` on Spark: fit and apply the tail estimator over a lake's
    ``request_steps`` (see the module docstring for what is distributed)."""

    def __init__(self, store: LakeStore, chunk_rows: int = CHUNK_ROWS):
        self.store, self.spark, self.chunk_rows = store, store.spark, chunk_rows
        self.parts = int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        # what the last fit / estimate cost: executor CPU seconds (summed over chunks) and what came back
        self.stats: dict[str, float] = {}

    def _rs(self, run_ids, columns: Sequence[str] | None = None):
        return self.store.request_steps(run_ids, columns)

    def fit(self, store, run_ids: list[str], frame, gamma: int, fit_rows: int | None = None, seed: int = 0,
            expect_truth: bool | None = None):
        """Hazard training positions on the executors (one job), the fit (``fit_long``) on the driver.

        ``frame``: the driver's frame of ``run_ids`` when the run fits on itself (it says whether
        there is truth); None when unknown (truth is looked for). ``fit_rows``: fit on the stable
        hash-sample of whole requests the streamed path fits on (``estimators.stream``), at most
        that many request-steps (the logistic fit is not a sum; ``self.fit_note`` says so)."""
        est = TailEstimator()
        hz = est.hazard
        est.gamma_ = gamma
        if hz.method == "confidence":  # no fit: the confidence itself
            hz.gamma_, hz.fitted_, hz.info_ = gamma, True, dict(method="confidence", source="none")
            return est
        if expect_truth is None:
            expect_truth = frame is None or bool(frame.has_truth.any())
        used = "truth" if hz.source == "truth" or (hz.source == "auto" and expect_truth) else "observed"
        self.fit_note = None
        sample = None if fit_rows is None else self._sample(run_ids, fit_rows, seed)
        got = self._train_rows(run_ids, gamma, used, sample)
        is_req = got.column("pos").to_numpy() < 0
        if not is_req.any():
            raise ValueError(f"no request_steps for runs {run_ids} in {self.store.path}")
        has_truth = bool(got.column("truth").to_numpy(zero_copy_only=False)[is_req].any())
        if hz.source == "auto" and used == "truth" and not has_truth:  # training runs without truth after all
            used = "observed"
            got = self._train_rows(run_ids, gamma, used, sample)
            is_req = got.column("pos").to_numpy() < 0
        col = lambda c: got.column(c).to_numpy(zero_copy_only=False)
        run, rid, pos = col("run_id"), col("rid"), col("pos")
        # global frame order: request code (sorted keys), position within the request, then position order
        index, codes = _request_index(run[is_req], rid[is_req])
        by_code = np.empty(len(codes), np.int64)
        by_code[codes] = col("n")[is_req]
        starts = np.concatenate([[0], np.cumsum(by_code)[:-1]])
        p = ~is_req
        req = _codes_of(index, run[p], rid[p])
        row = starts[req] + pos[p]
        order = np.lexsort((col("seq")[p], row))
        L = dict(row=row[order], k=col("k")[p][order], x=col("x")[p][order], y=col("y")[p][order],
                 wt=col("wt")[p][order], greedy=col("greedy")[p][order].astype(bool), state=col("state")[p][order],
                 req=req[order], n_req=int(len(codes)), temp=col("temp")[p][order],
                 workload=col("workload")[p][order].astype(object))
        self.stats.update(fit_executor_cpu_s=float(col("cpu_s").sum()), fit_rows_collected=int(got.num_rows),
                          fit_bytes_collected=int(got.nbytes))
        hz.fit_long(L, used, gamma)
        if used == "observed" and est.margin:  # the beyond-window shift, on the driver from the fit's requests
            rs = self._rs(run_ids, TAIL_COLUMNS)
            if sample is not None:
                rs = rs.join(F.broadcast(self.spark.createDataFrame(sample.to_pandas())), ["run_id", "rid"], "left_semi")
            est.fit_margin(_frame(rs.toArrow(), gamma))
        return est

    def calibrate(self, est, run_ids: list[str], gamma: int, fit_rows: int | None, seed: int) -> None:
        """The shift past the walk measured on the truth-bearing ``run_ids`` (an audit), on the driver from
        the requests the local path reads (:meth:`estimators.tail.TailEstimator.calibrate_prior`)."""
        rs = self._rs(run_ids, TAIL_COLUMNS)
        sample = None if fit_rows is None else self._sample(run_ids, fit_rows, seed)
        if sample is not None:
            rs = rs.join(F.broadcast(self.spark.createDataFrame(sample.to_pandas())), ["run_id", "rid"], "left_semi")
        est.calibrate_prior(_frame(rs.toArrow(), gamma), seed)

    def reduce(self, est, refits, acc: RunAccumulator, steps: pd.DataFrame, rows_per_step) -> RunAccumulator:
        """The run's accumulator (:class:`~estimators.accumulator.RunAccumulator`, as every executor runs
        it) on the executors, one state per partition (per-replicate partial sums, per-group and
        per-position sums, counts, the calibration rows of the sampled requests), merged into ``acc``
        (an empty accumulator of the run) on the driver."""
        remote = _broadcastable(est)
        kw = dict(run_id=acc.run_id, gamma=acc.G, exact=acc.exact, steps=steps,
                  hazard_boot=acc.hazard_boot, seed=acc.seed, cal_fraction=acc.cal_fraction,
                  temperatures=acc.temperatures, step_rows=rows_per_step,
                  keep_per_request=acc.keep_per_request, specs=acc.specs)
        bc = self.spark.sparkContext.broadcast((remote, refits, kw))
        chunk = self.chunk_rows
        classes = _by_value(registered())  # the registered estimators travel with the function

        def fn(batches):
            e, r, k = bc.value
            return _reduce_partition(batches, e, r, k, classes, chunk)

        t0 = time.perf_counter()
        rows = _by_request(self._rs([acc.run_id], TAIL_COLUMNS), self.parts).mapInArrow(fn, "payload binary").toArrow()
        bc.destroy()
        payloads = rows.column("payload").to_pylist()
        states = [pickle.loads(x) for x in payloads]
        if not states:
            raise ValueError(f"run {acc.run_id!r} has no request_steps")
        acc.merge(states)
        self.stats.update(reduce_executor_cpu_s=float(sum(x["cpu_s"] for x in states)), reduce_partitions=len(states),
                          reduce_bytes_collected=int(sum(len(x) for x in payloads)),
                          reduce_wall_s=time.perf_counter() - t0)
        return acc

    def refits(self, est, hazard_boot: int, seed: int) -> list:
        """The hazard model's ``hazard_boot`` request-bootstrap refits, spread over tasks: the training
        layout is broadcast, the weights are drawn on the driver in the order the local path draws
        them (``TailEstimator.refit_weights``), so every refit is the local one."""
        weights = est.refit_weights(hazard_boot, seed)
        bc = self.spark.sparkContext.broadcast(est.hazard)
        t0 = time.perf_counter()

        def one(iw):
            i, w = iw
            t = time.process_time()
            m = strip_training(bc.value.refit(w))
            return i, pickle.dumps(m, protocol=5), time.process_time() - t

        slices = max(1, min(hazard_boot, self.parts))  # a few refits per task: a task costs ~1 s of overhead here
        got = sorted(self.spark.sparkContext.parallelize(list(enumerate(weights)), slices).map(one).collect())
        bc.destroy()
        self.stats.update(refit_tasks=len(got), refit_executor_cpu_s=float(sum(g[2] for g in got)),
                          refit_wall_s=time.perf_counter() - t0)
        return [pickle.loads(g[1]) for g in got]

    def _sample(self, run_ids, max_rows: int, seed: int) -> pa.Table | None:
        """The (run_id, rid) of :func:`estimators.stream._sample_requests`'s stable hash-sample, from
        per-request counts aggregated on the executors (None: every request fits)."""

        d = self._rs(run_ids, ["run_id", "rid"]).groupBy("run_id", "rid").agg(F.count("*").alias("n")).toPandas()
        sel = sample_from_counts(pa.Table.from_pandas(d, preserve_index=False).to_batches(), max_rows, seed)
        if sel is not None:  # the streamed path's note
            kept = int(d.merge(sel.to_pandas(), on=["run_id", "rid"]).n.sum())
            self.fit_note = (f"hazards fitted on a stable hash-sample of {kept} of {int(d.n.sum())} request-steps "
                             f"(whole requests)")
        return sel

    def _train_rows(self, run_ids, gamma: int, used: str, sample: pa.Table | None = None) -> pa.Table:
        remote = TailEstimator()
        remote.hazard.source = used
        bc = self.spark.sparkContext.broadcast(remote)
        chunk = self.chunk_rows

        def fn(batches):
            return _train_partition(batches, bc.value, gamma, chunk)

        rs = self._rs(run_ids, TAIL_COLUMNS)
        if sample is not None:
            rs = rs.join(F.broadcast(self.spark.createDataFrame(sample.to_pandas())), ["run_id", "rid"], "left_semi")
        got = _by_request(rs, self.parts).mapInArrow(fn, _spark_struct(TRAIN_FIELDS)).toArrow()
        bc.destroy()
        return got



def _broadcastable(est):
    """A copy of a fitted TailEstimator whose hazard model has no training layout (for broadcast)."""
    e = copy.copy(est)
    e.hazard = strip_training(est.hazard)
    return e


def _spark_struct(fields):
    return from_arrow_schema(pa.schema(fields))


class _Remote:
    """The fitted estimator on an executor, estimating with the hazard refits made on the driver."""

    def __init__(self, est, refits):
        self.est, self.refits, self.levels, self.hazard = est, refits, est.levels, est.hazard

    def estimate(self, frame, hazard_boot: int = 0, seed: int = 0):
        return self.est.estimate(frame, hazard_boot=hazard_boot if self.refits else 0, seed=seed, refits=self.refits)


def _by_value(classes: dict[str, type]) -> dict[str, type]:
    """Registered estimators defined outside acceptscope (a user's module, a test) are pickled by value
    for the executors, which may not be able to import their module."""
    for cls in classes.values():
        mod = sys.modules.get(cls.__module__)
        if mod is not None and not cls.__module__.startswith("acceptscope."):
            cloudpickle.register_pickle_by_value(mod)
    return classes


def _reduce_partition(batches, est, refits, kw: dict, classes: dict, chunk_rows: int):
    """One partition's requests through the run's accumulator in chunks of whole requests: one payload."""
    t0 = time.process_time()
    acc = RunAccumulator(est=_Remote(est, refits), estimators=classes, **dict(kw))
    for tbl in whole_requests(batches, chunk_rows):
        acc.add(_to_model(tbl, schema.REQUEST_STEPS))
    if acc.chunks:
        st = acc.state(time.process_time() - t0)
        yield pa.RecordBatch.from_arrays([pa.array([cloudpickle.dumps(st, protocol=5)], pa.binary())], names=["payload"])


PLANNER_COLUMNS = ("run_id", "rank", "epoch", "forward_ct", "rid", "step_index", "prefix_len", "window",
                   "correct_drafts", "cap_trim", "bonus_token", "confidence", "ceiling", "temperature", "workload",
                   "finished")


def _planner(store, acc: RunAccumulator, steps: pd.DataFrame, table, n_rows: int):
    """The planner audit: its budget recomputation needs whole decode steps with every request's
    history (confidence vectors), so it reads those columns on the driver, for the whole run up to
    ``estimators.stream.PLANNER_ROWS`` request-steps (exact: ``run_all``'s audit) and for the first
    decode steps beyond (``estimators.stream.planner_window`` over the rows Spark read). The lost
    drafts are the run's totals from the executors' sums."""
    if n_rows > PLANNER_ROWS:
        return planner_window(_WindowStore(store, acc.run_id, steps, PLANNER_ROWS), acc, steps, table, PLANNER_ROWS, None)
    tbl = store.read_arrow("request_steps", acc.run_id, columns=[c for c in PLANNER_COLUMNS
                                                                 if c in schema.REQUEST_STEPS.names])
    frame = BlockFrame.from_request_steps(tbl, gamma=acc.G)
    p = audit(frame, steps, table, ceiling_estimate=None if acc.exact else frame.correct.astype(float))
    if not acc.exact:  # the estimated ceilings stay on the executors: their sum came back
        s, t = p.summary, acc.trim
        s["accepted_drafts_lost"] = float(t["ceiling_tokens"] - t["delivered"])
        s["lost_per_saved_token"] = s["accepted_drafts_lost"] / max(s["verify_tokens_saved"], 1.0)
    return p


class _WindowStore:
    """What ``_planner_window`` reads (``request_steps`` of the first decode steps of one run), read
    by Spark and served from an in-memory DuckDB connection."""

    def __init__(self, store, run_id: str, steps: pd.DataFrame, max_rows: int):
        st = steps.sort_values(["epoch", "forward_ct"])
        per = st.groupby(["epoch", "forward_ct"])["bs"].max().fillna(0).cumsum()
        upto = per[per <= max_rows]
        e, f = upto.index[-1] if len(upto) else per.index[0]
        df = store.frame("request_steps").where((F.col("run_id") == run_id) & ((F.col("epoch") < int(e)) | (
            (F.col("epoch") == int(e)) & (F.col("forward_ct") <= int(f)))))
        self.tbl = _to_model(df.select(*TAIL_COLUMNS).toArrow(), schema.REQUEST_STEPS)

    def connect(self, read_only: bool = True):
        con = duckdb.connect()
        con.register("request_steps", self.tbl)
        return con


LAKE_NO_HEALTH = ("interval health is checked by `estimate --db` on the DuckDB store (it re-estimates the production "
                  "arm alone over the audited requests); the lake path does not run it")


def run_lake(store: LakeStore, engine: SparkTail, run_id: str, n_boot: int = 200, hazard_boot: int = 20, seed: int = 0,
             sample_rows: int = 1 << 19, fit_rows: int = 1 << 18, cache: dict | None = None) -> dict[str, Any]:
    """:func:`estimators.run_all` of one run of the lake: the run's accumulator on the executors, the
    results assembled by :func:`estimators.pipeline.assemble` (see the module docstring). Equal to
    ``run_all`` on runs up to ``sample_rows`` request-steps (calibration rows) and ``fit_rows``
    training request-steps (hazard fit)."""
    c = store.query_df("SELECT count(*) AS n_rows, count(ceiling) AS n_truth FROM request_steps WHERE run_id = ?",
                       [run_id])
    n_rows, n_truth = int(c.n_rows.iloc[0]), int(c.n_truth.iloc[0])
    if n_rows == 0:
        raise ValueError(f"run {run_id!r} has no request_steps")
    side = run_side(store, run_id, [], steps=store.read_table("steps", run_id))
    gamma, exact = int(side.data["run"]["gamma"]), n_truth == n_rows
    plan = hazard_plan(store, run_id, gamma, exact, side.data["run"].get("audit_group"))
    train_note = plan.note
    cache = {} if cache is None else cache
    if (plan.fit, plan.calibrate) not in cache:
        try:
            est = engine.fit(store, list(plan.fit), None, gamma, fit_rows=fit_rows, seed=seed,
                             expect_truth=exact or n_truth > 0 or plan.fit != (run_id,))
            if plan.calibrate:
                engine.calibrate(est, list(plan.calibrate), gamma, fit_rows, seed)
                train_note += est.calibration_note()
        except ValueError as e:
            if not plan.calibrate:
                raise
            est = engine.fit(store, list(plan.calibrate), None, gamma, fit_rows=fit_rows, seed=seed, expect_truth=True)
            train_note = f"{e} in this run's own outcomes: hazards fitted on {', '.join(plan.calibrate)} (its audit)"
        cache[(plan.fit, plan.calibrate)] = (est, engine.fit_note, {}, train_note)
    est, fit_note, refit_cache, train_note = cache[(plan.fit, plan.calibrate)]
    side.notes = [train_note] + ([fit_note] if fit_note else [])
    hb = 0 if exact else hazard_boot
    if hb and hasattr(est.hazard, "_train") and (hb, seed) not in refit_cache:
        refit_cache[(hb, seed)] = engine.refits(est, hb, seed)
    refits = refit_cache.get((hb, seed)) if hb else None
    steps = side.data["steps"]
    acc = engine.reduce(est, refits, new_accumulator(est, run_id, gamma, exact, n_rows, side, store, n_boot,
                                                     hazard_boot, seed, sample_rows),
                        steps, None if len(steps) else step_rows(store, run_id))
    res = assemble(acc, side, n_boot, seed, planner=lambda table, steps: _planner(store, acc, steps, table, n_rows))
    if plan.calibrate:  # estimators.health re-estimates the production arm over the audited requests from DuckDB
        res["skipped"]["interval_health"] = LAKE_NO_HEALTH
    return res


def estimate_lake(lake: str | Path, run_ids: Sequence[str] | None = None, master: str = "local[2]",
                  n_boot: int = 200, seed: int = 0, spark=None, engine_stats: dict | None = None) -> dict[str, Any]:
    """``acceptscope estimate --lake LAKE --engine spark --json``: ``{run_id: results as JSON}``.
    ``engine_stats``: filled with what the executors did and sent back, per run."""

    own = spark is None and SparkSession.getActiveSession() is None  # stop only a session made here
    spark = spark or spark_session(master)
    try:
        store = LakeStore(spark, lake)
        runs = store.runs()
        ids = list(run_ids) if run_ids else runs.run_id.tolist()
        for r in ids:
            if r not in set(runs.run_id):
                raise KeyError(f"run {r!r} not in {store.path}")
        incomplete = set(incomplete_runs(runs, ids))
        cache: dict = {}
        out = {}
        for rid in ids:
            engine = SparkTail(store)
            try:
                out[rid] = to_jsonable(run_lake(store, engine, rid, n_boot=n_boot, seed=seed, cache=cache))
            except ValueError as e:
                out[rid] = {"error": str(e)}
            out[rid]["complete"] = rid not in incomplete  # as `estimate --db` says it
            if engine_stats is not None:
                engine_stats[rid] = dict(engine.stats)
        return out
    finally:
        if own:
            spark.stop()


# ---------------------------------------------------------------------------
# STS temperatures over the lake: per-position binned statistics on the executors, the 1-D fit on the driver
# ---------------------------------------------------------------------------
STS_Z_BIN = 1 / 64  # logit bin width
STS_P_BIN = 1 / 256  # width of a bin of the survival of the earlier positions (prev)
CAL_COLUMNS = ("run_id", "rank", "epoch", "forward_ct", "rid", "step_index", "prefix_len", "window", "correct_drafts",
               "confidence", "confidence_logit", "survival", "ceiling", "temperature", "workload", "finished")


def _cal_rows(tbl: pa.Table, label: str, gamma: int, temperatures) -> tuple[np.ndarray, np.ndarray]:
    """(z, y) of a batch, as ``calibration_data`` builds them for ``acceptscope calibrate``."""
    try:
        if label == "greedy":
            d = calibration_data(None, "greedy", sts_samples=tbl.to_pandas(), gamma=gamma)
        else:
            d = calibration_data(_block_frame(tbl, gamma), "realized", temperatures=temperatures)
    except ValueError:  # no labelled rows in this batch
        return np.zeros((0, gamma)), np.zeros((0, gamma))
    return d.z, d.y


def _block_frame(tbl: pa.Table, gamma: int):
    return BlockFrame.from_request_steps(_to_model(tbl, schema.REQUEST_STEPS), gamma=gamma)


STS_FIELDS = [("cell", pa.int64()), ("y", pa.float64()), ("n", pa.int64()), ("sz", pa.float64()), ("sp", pa.float64())]


def _sts_partition(batches, label: str, gamma: int, temperatures, fitted: list[float], k: int):
    """Per (z-bin, prev-bin, label) cell of position ``k``: count, sum of z, sum of prev (the survival
    through positions < k under the temperatures already ``fitted``)."""
    for batch in batches:
        if batch.num_rows == 0:
            continue
        z, y = _cal_rows(pa.Table.from_batches([batch]), label, gamma, temperatures)
        if not len(z):
            continue
        prev = np.ones(len(z))
        for j, t in enumerate(fitted):
            prev = prev * 0.5 * (1.0 + np.tanh(0.5 * z[:, j] / t))
        zb = np.floor(z[:, k] / STS_Z_BIN).astype(np.int64)
        pb = np.minimum(np.floor(prev / STS_P_BIN).astype(np.int64), int(1 / STS_P_BIN))
        cell = (zb * 1024 + pb) * 2 + (y[:, k] > 0.5)
        u, inv = np.unique(cell, return_inverse=True)
        yield pa.RecordBatch.from_arrays(
            [pa.array(u >> 1 << 1), pa.array((u & 1).astype(float)), pa.array(np.bincount(inv, minlength=u.size)),
             pa.array(np.bincount(inv, weights=z[:, k], minlength=u.size)),
             pa.array(np.bincount(inv, weights=prev, minlength=u.size))], schema=pa.schema(STS_FIELDS))


def sts_fit_lake(store: LakeStore, run_id: str, label: str = "realized", method: str = "smooth-nll") -> dict:
    """``acceptscope calibrate``'s final fit (``StsCalibrator(method).fit`` on every sample) over the
    lake: one Spark job per position ``k`` aggregates, across partitions, the count and the sums of
    ``z_k`` and of ``prev_k`` (survival through the earlier positions under the temperatures fitted
    so far) per cell of a (``z_k``, ``prev_k``, label) grid; the driver minimizes the same loss
    (``scipy`` bounded, same bounds and tolerance) over the cells, each at its mean point.

    Why binned: the sequential NLL / Brier objective is a sum over samples of a nonlinear function
    of (prev, z, y), with no finite exact sufficient statistic; cell means make the error second
    order in the cell width (measured against the local fit in tests/test_estimators_spark.py).
    ``sequential-ece`` (a grid search on ECE bins of the survival) is not binned this way: refused."""


    if method not in ("smooth-nll", "smooth-brier"):
        raise ValueError(f"sts_fit_lake fits smooth-nll or smooth-brier, not {method!r} (use acceptscope calibrate --db)")
    data = load_run(store, run_id, skip=("request_steps", "steps", "estimator_rows", "estimator_gather",
                                         "estimator_eos", "sts_samples"))
    gamma = int(data["run"]["gamma"])
    temps = sts_in_force(data)
    if label == "greedy":
        src = store.frame("sts_samples").where(F.col("run_id") == run_id)
    elif label == "realized":
        src = store.frame("request_steps").where((F.col("run_id") == run_id) & F.col("ceiling").isNotNull())
        src = src.select(*[c for c in CAL_COLUMNS if c in src.columns])
    else:
        raise ValueError(f"label must be 'realized' or 'greedy', got {label!r}")
    loss = method.split("-")[1]
    T: list[float] = []
    cells = 0
    n_samples = None
    for k in range(gamma):
        fitted = list(T)

        def fn(batches, k=k, fitted=fitted):
            return _sts_partition(batches, label, gamma, temps, fitted, k)

        agg = (src.mapInArrow(fn, _spark_struct(STS_FIELDS)).groupBy("cell", "y")
               .agg(F.sum("n").alias("n"), F.sum("sz").alias("sz"), F.sum("sp").alias("sp")).toArrow())
        n = agg.column("n").to_numpy().astype(float)
        if not n.size:
            raise ValueError(f"run {run_id!r}: no {label} calibration samples in {store.path}")
        y = agg.column("y").to_numpy()
        mz, mp = agg.column("sz").to_numpy() / n, agg.column("sp").to_numpy() / n
        n_samples, cells = int(n.sum()), cells + n.size

        def obj(lt, mz=mz, mp=mp, y=y, n=n):
            p = np.clip(mp * 0.5 * (1.0 + np.tanh(0.5 * mz / math.exp(lt))), 1e-12, 1 - 1e-12)
            if loss == "nll":
                return float(-(n * (y * np.log(p) + (1 - y) * np.log1p(-p))).sum() / n.sum())
            return float((n * (p - y) ** 2).sum() / n.sum())

        r = minimize_scalar(obj, bounds=LOG_T_BOUNDS, method="bounded", options=dict(xatol=1e-5))
        T.append(float(math.exp(r.x)))
    return dict(temperatures=T, num_samples=n_samples, cells=cells, method=method, label=label,
                bins=dict(z=STS_Z_BIN, prev=STS_P_BIN))
