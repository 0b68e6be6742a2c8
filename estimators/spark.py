"""The estimators over a Parquet telemetry lake on Spark (``pip install acceptscope[spark]``).

``acceptscope estimate --lake LAKE --engine spark`` runs :func:`estimators.run_all` with two
pieces swapped: the store is a :class:`LakeStore` (Spark SQL views over the lake exactly as
``acceptscope export`` wrote it: Hive partitions ``run_id=`` / ``rank=``, partition types pinned
from the record model, no copy), and the tail estimator is a :class:`SparkTail`. Everything
downstream of the tail (aggregate bootstrap, utilization, calibration, cost, planner) is the
single-machine code, fed the same inputs, so the JSON equals ``estimate --db`` on the same runs.

What runs where (docs/scale.md has the measured costs):

* **executors**, over ``request_steps`` hash-partitioned by ``(run_id, rid)`` so that every
  request's steps sit in one partition (the walk follows a trimmed draft into the request's
  later steps): the tail walk over the list columns, the hazard model's training positions
  (one row per trimmed position with a known outcome), and, with the fitted model and its
  bootstrap refits broadcast, the per-block predictive pmf, mean, variance, bounds and intervals.
  Per-block uniforms are hashed from the block itself, and refit weights are drawn on the
  driver per training request, so nothing depends on the partitioning.
* **driver**: the hazard fit from the collected training positions (the same
  ``HazardModel.fit_long`` the local path calls, on the same rows in the same order: the fit is
  bit-identical), its ``hazard_boot`` refits, and the aggregation of the collected per-block
  results (scalars and the pmf; the draft, committed-token and log-prob lists never leave the
  executors). The driver reads ``request_steps`` without those lists (scalars and the
  confidence vectors the calibration and planner audit use), and the small tables whole.

pyspark is imported here only, lazily.
"""

from __future__ import annotations

import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa

from acceptscope import schema
from estimators.stream import whole_requests

# request_steps list columns only the tail walk reads: they stay on the executors
WALK_ONLY = ("draft_tokens", "committed_tokens", "draft_logprob", "target_logprob", "survival")
CHUNK_ROWS = 1 << 16  # request-steps per executor pass (whole requests; bounded memory)


def spark_session(master: str = "local[2]", shuffle_partitions: int | None = None, app_name: str = "acceptscope",
                  driver_memory: str = "2g"):
    """A SparkSession for the lake (local mode by default). Workers run this Python."""
    from pyspark.sql import SparkSession

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
    from pyspark.sql.pandas.types import from_arrow_schema

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
        from urllib.parse import unquote

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
        return self.query_df("SELECT * FROM runs ORDER BY started_at, run_id")

    def read_arrow(self, name: str, run_id: str | Sequence[str] | None = None,
                   columns: Sequence[str] | None = None) -> pa.Table:
        """One table (rows of ``run_id``), sorted by its key, in the record model's types."""
        from pyspark.sql import functions as F

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


# ---------------------------------------------------------------------------
# executors: whole requests per pass
# ---------------------------------------------------------------------------
def _frame(tbl: pa.Table, gamma: int):
    from estimators.frame import BlockFrame

    return BlockFrame.from_request_steps(_to_model(tbl, schema.REQUEST_STEPS).to_pandas(), gamma=gamma)


def _row_keys(frame) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(run_id, rid, position within the request) of every frame row (rows are grouped by request)."""
    first = np.searchsorted(frame.request, frame.request)  # request codes are sorted in the frame
    return (frame.df["run_id"].to_numpy(object), frame.df["rid"].to_numpy(object),
            np.arange(frame.n, dtype=np.int64) - first)


TRAIN_FIELDS = [("run_id", pa.string()), ("rid", pa.string()), ("pos", pa.int64()), ("seq", pa.int64()),
                ("k", pa.int64()), ("x", pa.float64()), ("y", pa.float64()), ("wt", pa.float64()),
                ("greedy", pa.bool_()), ("state", pa.int64()), ("n", pa.int64()), ("truth", pa.bool_()),
                ("cpu_s", pa.float64())]


def _train_partition(batches, est, gamma: int, chunk_rows: int):
    """Hazard training positions of a partition's requests (``HazardModel._long`` per chunk), then one
    row per request (``pos = -1``) with its number of request-steps ``n`` and whether it has truth."""
    import time

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
             pa.array(np.concatenate([np.zeros(m + q - 1), [time.process_time() - t0]]) if q else np.zeros(m))],
            schema=sch)


def _estimate_partition(batches, est, refits, gamma: int, seed: int, chunk_rows: int):
    """Per-block tail results of a partition's requests, one pickled payload per chunk."""
    import time

    for tbl in whole_requests(batches, chunk_rows):
        t0 = time.process_time()
        frame = _frame(tbl, gamma)
        res = est.estimate(frame, hazard_boot=len(refits or ()), seed=seed, refits=refits)
        run, rid, pos = _row_keys(frame)
        payload = dict(run_id=run, rid=rid, pos=pos, blocks=res.blocks, pmf=res.pmf, boot=res._boot,
                       notes=list(frame.notes), rows=frame.n, cpu_s=time.process_time() - t0)
        yield pa.RecordBatch.from_arrays([pa.array([pickle.dumps(payload, protocol=5)], pa.binary())], names=["payload"])


def _by_request(df, parts: int):
    return df.repartition(parts, "run_id", "rid").sortWithinPartitions("run_id", "rid", "rank", "epoch", "forward_ct")


def _request_index(run_id, rid) -> tuple[dict, np.ndarray]:
    """Codes of (run_id, rid) in the order ``BlockFrame`` numbers requests (sorted keys)."""
    run = pd.Series(run_id, dtype=object)
    one_run = run.nunique() <= 1
    key = pd.Series(rid, dtype=object) if one_run else run.astype(str) + "\x00" + pd.Series(rid, dtype=object).astype(str)
    codes, uniq = pd.factorize(key, sort=True)
    return {(a, b): c for a, b, c in zip(run_id, rid, codes)}, codes


def _strip(model):
    """A copy of a fitted hazard model without its training layout (what executors need to predict)."""
    import copy

    m = copy.copy(model)
    for a in ("_train", "_grp", "_cell"):
        m.__dict__.pop(a, None)
    return m


class SparkTail:
    """:class:`estimators.LocalTail` on Spark: fit and apply the tail estimator over a lake's
    ``request_steps`` (see the module docstring for what is distributed)."""

    def __init__(self, store: LakeStore, chunk_rows: int = CHUNK_ROWS):
        self.store, self.spark, self.chunk_rows = store, store.spark, chunk_rows
        self.parts = int(self.spark.conf.get("spark.sql.shuffle.partitions"))
        # what the last fit / estimate cost: executor CPU seconds (summed over chunks) and what came back
        self.stats: dict[str, float] = {}

    def _rs(self, run_ids):
        from pyspark.sql import functions as F

        return self.store.frame("request_steps").where(F.col("run_id").isin(list(run_ids)))

    def fit(self, store, run_ids: list[str], frame, gamma: int):
        """Hazard training positions on the executors (one job), the fit (``fit_long``) on the driver.

        ``frame``: the driver's frame of ``run_ids`` when the run fits on itself (it says whether
        there is truth); None for truth-bearing training runs."""
        from estimators.tail import TailEstimator

        est = TailEstimator()
        hz = est.hazard
        est.gamma_ = gamma
        if hz.method == "confidence":  # no fit: the confidence itself
            hz.gamma_, hz.fitted_, hz.info_ = gamma, True, dict(method="confidence", source="none")
            return est
        expect_truth = frame is None or bool(frame.has_truth.any())
        used = "truth" if hz.source == "truth" or (hz.source == "auto" and expect_truth) else "observed"
        got = self._train_rows(run_ids, gamma, used)
        is_req = got.column("pos").to_numpy() < 0
        if not is_req.any():
            raise ValueError(f"no request_steps for runs {run_ids} in {self.store.path}")
        has_truth = bool(got.column("truth").to_numpy(zero_copy_only=False)[is_req].any())
        if hz.source == "auto" and used == "truth" and not has_truth:  # training runs without truth after all
            used = "observed"
            got = self._train_rows(run_ids, gamma, used)
            is_req = got.column("pos").to_numpy() < 0
        col = lambda c: got.column(c).to_numpy(zero_copy_only=False)
        run, rid, pos = col("run_id"), col("rid"), col("pos")
        # global frame order: request code (sorted keys), position within the request, then position order
        index, codes = _request_index(run[is_req], rid[is_req])
        by_code = np.empty(len(codes), np.int64)
        by_code[codes] = col("n")[is_req]
        starts = np.concatenate([[0], np.cumsum(by_code)[:-1]])
        p = ~is_req
        req = np.array([index[(a, b)] for a, b in zip(run[p], rid[p])], np.int64)
        row = starts[req] + pos[p]
        order = np.lexsort((col("seq")[p], row))
        L = dict(row=row[order], k=col("k")[p][order], x=col("x")[p][order], y=col("y")[p][order],
                 wt=col("wt")[p][order], greedy=col("greedy")[p][order].astype(bool), state=col("state")[p][order],
                 req=req[order], n_req=int(len(codes)))
        self.stats.update(fit_executor_cpu_s=float(col("cpu_s").sum()), fit_rows_collected=int(got.num_rows),
                          fit_bytes_collected=int(got.nbytes))
        hz.fit_long(L, used, gamma)
        return est

    def refits(self, est, hazard_boot: int, seed: int) -> list:
        """The hazard model's ``hazard_boot`` request-bootstrap refits, spread over tasks: the training
        layout is broadcast, the weights are drawn on the driver in the order the local path draws
        them (``TailEstimator.refit_weights``), so every refit is the local one."""
        import time

        weights = est.refit_weights(hazard_boot, seed)
        bc = self.spark.sparkContext.broadcast(est.hazard)
        t0 = time.perf_counter()

        def one(iw):
            i, w = iw
            t = time.process_time()
            m = _strip(bc.value.refit(w))
            return i, pickle.dumps(m, protocol=5), time.process_time() - t

        slices = max(1, min(hazard_boot, self.parts))  # a few refits per task: a task costs ~1 s of overhead here
        got = sorted(self.spark.sparkContext.parallelize(list(enumerate(weights)), slices).map(one).collect())
        bc.destroy()
        self.stats.update(refit_tasks=len(got), refit_executor_cpu_s=float(sum(g[2] for g in got)),
                          refit_wall_s=time.perf_counter() - t0)
        return [pickle.loads(g[1]) for g in got]

    def _train_rows(self, run_ids, gamma: int, used: str) -> pa.Table:
        from estimators.tail import TailEstimator

        remote = TailEstimator()
        remote.hazard.source = used
        bc = self.spark.sparkContext.broadcast(remote)
        chunk = self.chunk_rows

        def fn(batches):
            return _train_partition(batches, bc.value, gamma, chunk)

        got = _by_request(self._rs(run_ids), self.parts).mapInArrow(fn, _spark_struct(TRAIN_FIELDS)).toArrow()
        bc.destroy()
        return got

    def estimate(self, est, run_id: str, frame, gather, hazard_boot: int, seed: int):
        """Per-block results on the executors, assembled on the driver in ``frame``'s row order."""
        from estimators.tail import TailResult

        if gather is not None:
            raise NotImplementedError("SGLang pg log-probs (use_sglang_pg) are not distributed: run estimate --db")
        refits = self.refits(est, hazard_boot, seed) if hazard_boot and hasattr(est.hazard, "_train") else None
        remote = _broadcastable(est)
        bc = self.spark.sparkContext.broadcast((remote, refits))
        G, chunk = frame.gamma, self.chunk_rows

        def fn(batches):
            e, r = bc.value
            return _estimate_partition(batches, e, r, G, seed, chunk)

        rows = _by_request(self._rs([run_id]), self.parts).mapInArrow(fn, "payload binary").toArrow()
        bc.destroy()
        payloads = rows.column("payload").to_pylist()
        parts = [pickle.loads(p) for p in payloads]
        self.stats.update(estimate_executor_cpu_s=float(sum(p["cpu_s"] for p in parts)), estimate_chunks=len(parts),
                          estimate_bytes_collected=int(sum(len(p) for p in payloads)))
        if not parts:
            raise ValueError(f"run {run_id!r} has no request_steps in {self.store.path}")
        # place every executor row at its frame row: first row of its request + position in it
        first = np.searchsorted(frame.request, np.arange(int(frame.request.max()) + 1))
        code = dict(zip(zip(frame.df["run_id"].to_numpy(object)[first], frame.df["rid"].to_numpy(object)[first]),
                        range(first.size)))
        idx = np.concatenate([first[[code[k] for k in zip(p["run_id"], p["rid"])]] + p["pos"] for p in parts])
        if idx.size != frame.n or np.unique(idx).size != frame.n:
            raise RuntimeError(f"executor rows ({idx.size}) do not match the run's request-steps ({frame.n})")
        order = np.argsort(idx, kind="stable")
        blocks = pd.concat([p["blocks"] for p in parts], ignore_index=True).iloc[order].reset_index(drop=True)
        if "truth" in blocks and not frame.has_truth.any():
            blocks = blocks.drop(columns="truth")
        pmf = np.concatenate([p["pmf"] for p in parts])[order]
        boot = None
        if refits:
            boot = {k: np.concatenate([p["boot"][k] for p in parts], axis=1)[:, order] for k in ("means", "vars")}
        notes = list(frame.notes)
        for p in parts:  # notes only the walk's columns can raise (the driver frame lacks them)
            for n in p["notes"]:
                if n.startswith("committed_tokens reconstructed") and n not in notes:
                    notes.insert(0, n)
        return TailResult(blocks=blocks, pmf=pmf, gamma=G, levels=tuple(est.levels),
                          hazard_info=dict(est.hazard.info_), notes=notes, _boot=boot)


def _broadcastable(est):
    """A copy of a fitted TailEstimator whose hazard model has no training layout (for broadcast)."""
    import copy

    e = copy.copy(est)
    e.hazard = _strip(est.hazard)
    return e


def _spark_struct(fields):
    from pyspark.sql.pandas.types import from_arrow_schema

    return from_arrow_schema(pa.schema(fields))


def estimate_lake(lake: str | Path, run_ids: Sequence[str] | None = None, master: str = "local[2]",
                  n_boot: int = 200, seed: int = 0, spark=None) -> dict[str, Any]:
    """``acceptscope estimate --lake LAKE --engine spark --json``: ``{run_id: to_jsonable(run_all(...))}``."""
    from acceptscope.store import incomplete_runs
    from estimators import run_all, to_jsonable

    from pyspark.sql import SparkSession

    own = spark is None and SparkSession.getActiveSession() is None  # stop only a session made here
    spark = spark or spark_session(master)
    try:
        store = LakeStore(spark, lake)
        ids = list(run_ids) if run_ids else store.runs().run_id.tolist()
        engine = SparkTail(store)
        incomplete = set(incomplete_runs(store.runs(), ids))
        out = {}
        for rid in ids:
            try:
                out[rid] = to_jsonable(run_all(store, rid, n_boot=n_boot, seed=seed, tail_engine=engine))
            except ValueError as e:
                out[rid] = {"error": str(e)}
            out[rid]["complete"] = rid not in incomplete  # as `estimate --db` says it
        return out
    finally:
        if own:
            spark.stop()
