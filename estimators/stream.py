"""Every estimator over a whole store in one pass, in memory bounded by a chunk of requests.

Why: one SGLang server at batch 256 writes ~25k request-steps a second (90M an hour). The
in-memory facade (:func:`estimators.run_all`) builds one :class:`~estimators.frame.BlockFrame`
and one per-block table for the whole run, which costs gigabytes per million rows. Here the
store is read **once**, ordered by request, as Arrow record batches; batches are cut at request
boundaries into chunks of whole requests (``chunk_rows``); each chunk is estimated with the
run's :class:`~estimators.tail.TailEstimator` and reduced to sums before the next one:

* tail: per-(group, request) sufficient statistics (:func:`estimators.bootstrap.request_stats`)
  for the run, workload and batch-size-band aggregates, plus per-group hazard-refit shifts;
  intervals come from :func:`estimators.bootstrap.aggregate_stats`, whose draws are seeded by
  the request key, so they do not depend on ``chunk_rows``;
* utilization: per-group sums, per-position sums, the window histogram, a per-request table;
* trim counters: sums; calibration: the rows of a stable hash-sample of requests (about
  ``sample_rows``); hazards are fitted on such a sample of their training requests (at most
  ``fit_rows`` request-steps);
* cost: the run's ``steps`` table (one row per decode step, ~1/batch of the request-steps; only the
  columns the cost fit, the batch-size bands and the planner read: :data:`STEP_COLUMNS`); past
  :data:`COST_STEPS` steps it is not held through the pass: the batch sizes only (:class:`StepSizes`,
  16 bytes a step), then at the end a stable hash-sample of :data:`COST_STEPS` steps for the cost fit;
* planner audit: exact on runs that fit in one chunk; on bigger runs, on the first
  :data:`PLANNER_ROWS` request-steps in step order (the budget recomputation needs whole decode
  steps with each request's history; those steps found and read in DuckDB when the run's are not
  held), with the run's streamed totals for the trimming counts.

Memory: a chunk (``chunk_rows`` request-steps, a few hundred bytes each plus the estimator's
per-block arrays), the per-request statistics (~100 bytes per (group, request); runs up to
``sample_rows`` only, bigger ones keep per-replicate sums) and DuckDB's sort, capped by
``duckdb_memory`` (it spills to a temporary directory); the peak is the sort with a chunk on top. Results have the
interface of :func:`estimators.run_all`'s (``to_json()``; drawn by ``acceptscope.figures``) and equal them on a
run that fits in one chunk (the tail's point estimates for any chunking).

Example::

    >>> import tempfile, os
    >>> from acceptscope.store import Store
    >>> from acceptscope.estimators.synthetic import simulate
    >>> from acceptscope.estimators.stream import run_all_stream
    >>> st = Store(os.path.join(tempfile.mkdtemp(), "t.duckdb"))
    >>> _ = st.append(simulate(n_requests=40, seed=1).tables)
    >>> a = run_all_stream(st, n_boot=20, chunk_rows=200)["syn-cap"]
    >>> b = run_all_stream(st, n_boot=20, chunk_rows=1 << 20)["syn-cap"]
    >>> bool(a["tail"].aggregate(n_boot=50).equals(b["tail"].aggregate(n_boot=50)))
    True
"""

from __future__ import annotations

import math
import tempfile
from dataclasses import dataclass, field
from typing import Any, Iterator

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope import schema
from acceptscope.store import fetch_arrow, fetch_arrow_reader
from acceptscope.estimators.bootstrap import (add_sums, aggregate_from_sums, aggregate_stats, group_codes, replicate_sums,
                                  request_keys, request_stats, row_request_keys, shift_sums, uniforms)
from acceptscope.estimators.calibration import CalData, calibration_data
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.planner import audit
from acceptscope.estimators.run_data import (RUN_KEYS, _Table, fit_calibration, fit_cost, hazard_runs, load_run, sglang_bracket,
                                 sts_in_force, temperature_filled_select)
from acceptscope.estimators.tail import TailEstimator, observation_statement
from acceptscope.estimators.utilization import UtilizationResult
from acceptscope.estimators.validation import batch_band

GROUPINGS = ((), ("workload",), ("band",))
TAIL_COLUMNS = ("run_id", "rank", "epoch", "forward_ct", "rid", "step_index", "prefix_len", "window", "correct_drafts",
                "cap_trim", "bonus_token", "draft_tokens", "confidence", "confidence_logit", "draft_logprob",
                "target_logprob", "committed_tokens", "ceiling", "temperature", "workload", "finished")
ORDER = "run_id, rid, epoch, forward_ct"
S_ORDER = "s.run_id, s.rid, s.epoch, s.forward_ct"
PLANNER_ROWS = 1 << 17  # request-steps of the first decode steps a big run's planner audit recomputes
DUCKDB_MEMORY = "256MB"  # DuckDB's share while sorting by request (it spills beyond; 3M: 955 vs 1051 MB peak at 384MB)
AUTO_MEMORY = "auto"  # run_all_stream: DuckDB's share from the rows sorted (:func:`sort_memory`)
CHUNK_ROWS = 1 << 16  # request-steps per chunk: a chunk's estimator arrays sit on top of the sort (1 << 17: +~100 MB)
FOLD_CHUNKS = 32  # per-chunk group sums (utilization, windows, refit shifts) are added up every this many chunks


def aggregate_specs(n_boot: int, seed: int) -> list[tuple]:
    """The tail aggregates (grouping, n_boot, target, seed) the results read: the tail summary (400
    replicates, seed 0), the figures (200, seed 0) and the utilization intervals per grouping. A
    big run keeps only these, as per-replicate partial sums (memory flat in its rows)."""
    return sorted({((), 400, "run", 0), *((g, 200, "run", 0) for g in GROUPINGS),
                   *((g, n_boot, "run", seed) for g in GROUPINGS)})


def _fold(parts: list[pd.DataFrame], by: list[str]) -> list[pd.DataFrame]:
    """Per-group sum rows of several chunks as one frame (bounded memory over many chunks)."""
    d = pd.concat(parts, ignore_index=True)
    return [d.groupby(by, dropna=False, sort=False).sum().reset_index() if by else d.sum().to_frame().T]


# ----------------------------------------------------------------------------------------------
# reading whole requests
# ----------------------------------------------------------------------------------------------
def sort_memory(rows: int) -> str:
    """DuckDB's memory for sorting ``rows`` request-steps by request: at least :data:`DUCKDB_MEMORY`,
    growing with the square root of the rows (its external sort merges sorted runs that each need a
    buffer in memory: 256 MB sorted 10M request-steps and ran out at 100M; 1 GB sorted 100M, see
    docs/scale.md §8)."""
    return f"{max(256, round(320 * math.sqrt(max(rows, 0) / 10e6)))}MB"


def _configure(con, duckdb_memory: str | None) -> None:
    if duckdb_memory:
        con.execute(f"SET memory_limit='{duckdb_memory}'")
    spill = f"{tempfile.gettempdir()}/acceptscope-duckdb-spill"
    if con.execute("SELECT current_setting('temp_directory')").fetchone()[0] != spill:
        try:  # a nested cursor shares the database: its spill directory cannot change once used
            con.execute(f"SET temp_directory='{spill}'")
        except duckdb.NotImplementedException:
            pass
    con.execute("SET preserve_insertion_order=false")
    con.execute("SET threads=1")  # the sort by request: one thread's buffers (10M: 697 vs 778 MB, same CPU-s)
    try:
        con.execute("SET enable_progress_bar=false")
    except duckdb.Error:  # in a Jupyter kernel DuckDB wants ipywidgets to change this: leave it
        pass


def request_chunks(store, run_ids, chunk_rows: int = CHUNK_ROWS, columns=TAIL_COLUMNS, where: str = "",
                   params: list | None = None, duckdb_memory: str | None = DUCKDB_MEMORY,
                   whole_runs: bool = False) -> Iterator[tuple[str, pa.Table]]:
    """``(run_id, table)`` pieces of ``request_steps`` holding whole requests of one run, about
    ``chunk_rows`` rows each (a request longer than that is one piece), in one ordered scan.
    ``whole_runs``: cut only between runs (each run is one piece, however long)."""
    with store.connect(read_only=True) as con:
        _configure(con, duckdb_memory)
        cols, src = temperature_filled_select(con, columns, run_ids)
        sql = f"SELECT {cols} FROM {src} WHERE s.run_id IN (SELECT UNNEST(?)) {where} ORDER BY {S_ORDER}"
        reader = fetch_arrow_reader(con, sql, [list(run_ids)] + list(params or []), batch_rows=min(chunk_rows, 1 << 16))
        for tbl in whole_requests(reader, chunk_rows, whole_runs):
            yield from _split_runs(tbl)


def whole_requests(batches, chunk_rows: int, whole_runs: bool = False) -> Iterator[pa.Table]:
    """Regroup record batches sorted by (run_id, rid) into tables of about ``chunk_rows`` rows that
    never split a request (a request longer than that is one table), nor a run with ``whole_runs``.
    Shared by this module's store pass and the Spark executors' partition pass."""
    pending: list[pa.RecordBatch] = []
    size = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        pending.append(batch)
        size += batch.num_rows
        if size < chunk_rows:
            continue
        tbl = pa.Table.from_batches(pending)
        cut = _last_request_start(tbl, whole_runs)
        if cut == 0:  # one request so far: keep reading
            continue
        yield tbl.slice(0, cut)
        rest = tbl.slice(cut).combine_chunks()
        pending, size = rest.to_batches(), rest.num_rows
    if size:
        yield pa.Table.from_batches(pending)


def _last_request_start(tbl: pa.Table, whole_runs: bool = False) -> int:
    """Index of the first row of the table's last (run_id, rid), or last run_id with ``whole_runs``
    (rows sorted by run_id, rid)."""
    n = tbl.num_rows
    run, rid = tbl.column("run_id"), tbl.column("rid")
    same = pc.equal(run, run[n - 1]) if whole_runs else pc.and_(pc.equal(rid, rid[n - 1]), pc.equal(run, run[n - 1]))
    return int(pc.index(same, True).as_py())


def _split_runs(tbl: pa.Table) -> Iterator[tuple[str, pa.Table]]:
    run = tbl.column("run_id").combine_chunks()
    if run[0] == run[len(run) - 1]:
        yield run[0].as_py(), tbl
        return
    codes = np.asarray(pc.dictionary_encode(run).indices)
    starts = np.concatenate([[0], np.flatnonzero(np.diff(codes)) + 1, [len(codes)]])
    for a, b in zip(starts[:-1], starts[1:]):
        yield run[int(a)].as_py(), tbl.slice(int(a), int(b - a))


def sample_from_counts(batches, max_rows: int, seed: int) -> pa.Table | None:
    """A stable hash-sample of requests with at most ``max_rows`` request-steps in all, from their
    per-request counts (Arrow batches of ``run_id, rid, n``; ``None``: every request fits): the
    requests of lowest uniform (:func:`uniforms` of the request key, stream 3) while their
    request-steps add up to ``max_rows`` (at least one request).

    Streamed, keeping only the candidates: a request outside the lowest-uniform prefix of some
    requests is outside it for any superset of them, so memory is bounded by the sample, not by the
    run's requests (3.9M requests at 100M: 1.46 GB when they were held in pandas)."""
    keep = None  # (run_id, rid, n, u) of the candidates, in uniform order
    total = 0
    for batch in batches:
        if batch.num_rows == 0:
            continue
        run = batch.column("run_id").to_numpy(zero_copy_only=False)
        rid = batch.column("rid").to_numpy(zero_copy_only=False)
        n = batch.column("n").to_numpy().astype(np.int64)
        total += int(n.sum())
        cand = (run, rid, n, uniforms(request_keys(run, rid), 0, seed, stream=3))
        if keep is not None:
            cand = tuple(np.concatenate([a, b]) for a, b in zip(keep, cand))
        order = np.argsort(cand[3], kind="stable")
        fits = int(np.searchsorted(np.cumsum(cand[2][order]), max_rows, side="right"))
        keep = tuple(a[order[:max(fits, 1)]] for a in cand)
    if keep is None or total <= max_rows:
        return None
    return pa.table({"run_id": keep[0].astype(str), "rid": keep[1].astype(str)})


def _sample_requests(store, run_ids, max_rows: int, seed: int, duckdb_memory: str | None = DUCKDB_MEMORY,
                     batch_rows: int = 1 << 16) -> pa.Table | None:
    """:func:`sample_from_counts` over the runs' per-request counts, aggregated in DuckDB and
    read in batches of ``batch_rows`` requests."""
    sql = ("SELECT run_id, rid, count(*) AS n FROM request_steps WHERE run_id IN (SELECT UNNEST(?)) "
           "GROUP BY run_id, rid")
    with store.connect(read_only=True) as con:
        _configure(con, duckdb_memory)
        return sample_from_counts(fetch_arrow_reader(con, sql, [list(run_ids)], batch_rows=batch_rows), max_rows, seed)


def read_sample(store, run_ids, max_rows: int, seed: int = 0, columns=TAIL_COLUMNS,
                duckdb_memory: str | None = DUCKDB_MEMORY) -> pa.Table:
    """``request_steps`` of a stable hash-sample of the runs' requests (whole requests; at most
    ``max_rows`` rows, all of them when they fit), ordered by request."""
    sel = _sample_requests(store, run_ids, max_rows, seed, duckdb_memory)
    with store.connect(read_only=True) as con:
        _configure(con, duckdb_memory)
        cols, src = temperature_filled_select(con, columns, run_ids)
        if sel is None:
            sql = f"SELECT {cols} FROM {src} WHERE s.run_id IN (SELECT UNNEST(?)) ORDER BY {S_ORDER}"
            return fetch_arrow(con, sql, [list(run_ids)])
        con.register("_acceptscope_sample", sel)
        try:
            sql = (f"SELECT {cols} FROM {src} SEMI JOIN _acceptscope_sample k "
                   f"ON s.run_id = k.run_id AND s.rid = k.rid ORDER BY {S_ORDER}")
            return fetch_arrow(con, sql)
        finally:
            con.unregister("_acceptscope_sample")


# ----------------------------------------------------------------------------------------------
# results with the facade's interface
# ----------------------------------------------------------------------------------------------
@dataclass
class StreamTail:
    """The tail estimator's result over a streamed run: sums, not blocks (see module docstring)."""

    counts: dict
    stats: dict  # grouping (tuple) -> per-(group, request) statistics (runs up to ``sample_rows``)
    shifts: dict  # grouping -> per-group hazard-refit shifts (or absent)
    gamma: int
    levels: tuple
    hazard_info: dict
    notes: list[str] = field(default_factory=list)
    sums: dict = field(default_factory=dict)  # (grouping, n_boot, target, seed) -> [replicate partial sums]

    def summary(self) -> dict:
        c = self.counts
        recorded = c["n_truth"] == c["n"]
        return dict(n_request_steps=int(c["n"]), n_censored=int(c["n_censored"]),
                    censored_by_mode={k: int(v) for k, v in c["modes"].items() if v},
                    mean_ceiling=c["sum_mean"] / max(c["n"], 1), mean_accept_length=c["sum_mean"] / max(c["n"], 1) + 1,
                    greedy_resolved=int(c["greedy_resolved"]), n_resolved=int(c["resolved"]),
                    n_unresolved=int(c["n_censored"] - c["resolved"]),
                    ceiling="recorded" if recorded else "estimated",
                    statement=observation_statement(int(c["n"]), int(c["n_censored"]), int(c["resolved"]),
                                                    c["sum_truth"] / max(c["n"], 1) if recorded else None,
                                                    self.notes),
                    hazard=self.hazard_info, notes=self.notes)

    def aggregate(self, by: list[str] | str | None = None, level: float = 0.95, n_boot: int = 400,
                  target: str = "run", seed: int = 0) -> pd.DataFrame:
        by = [by] if isinstance(by, str) else list(by or [])
        key = tuple(by)
        spec = (key, n_boot, target, seed)
        if spec in self.sums:
            return aggregate_from_sums(self.sums[spec], level=level, shift=self.shifts.get(key))
        if key not in self.stats:
            raise ValueError(f"streamed tail results keep the groupings {[list(g) for g in self.stats]} and the "
                             f"aggregates (grouping, n_boot, target, seed) {sorted(self.sums)}, not {spec}")
        return aggregate_stats(self.stats[key], by, level=level, n_boot=n_boot, target=target, seed=seed,
                               shift=self.shifts.get(key))

    def to_json(self) -> dict:
        return dict(summary=self.summary(), aggregate=self.aggregate().to_dict("records"))


class StepSizes:
    """Batch size per decode step ``(rank, epoch, forward_ct)``, looked up per request-step: one sorted
    int64 key and one float per step (16 bytes; a pandas MultiIndex Series took several times that,
    and a ``steps`` row is ~1/batch of a run's request-steps, so this is the part that grows)."""

    def __init__(self, d: pd.DataFrame):
        d = d.drop_duplicates(["rank", "epoch", "forward_ct"])  # the first row of a key wins, as before
        cols = [d[c].to_numpy(np.int64) for c in ("rank", "epoch", "forward_ct")]
        self.lo = [int(c.min()) if c.size else 0 for c in cols]
        self.span = [int(c.max()) - lo + 1 if c.size else 1 for c, lo in zip(cols, self.lo)]
        if self.span[0] * self.span[1] * self.span[2] >= 1 << 62:  # never in practice: keys far apart
            self._series = d.set_index(["rank", "epoch", "forward_ct"])["bs"]
            return
        self._series = None
        key = self._key(*cols)
        order = np.argsort(key, kind="stable")
        self.keys, self.bs = key[order], d["bs"].to_numpy(float)[order]

    def _key(self, rank, epoch, fct) -> np.ndarray:
        (r0, e0, f0), (_, E, F) = self.lo, self.span
        return ((rank.astype(np.int64) - r0) * E + (epoch.astype(np.int64) - e0)) * F + (fct.astype(np.int64) - f0)

    def lookup(self, rank, epoch, fct) -> np.ndarray:
        """Batch sizes of these decode steps (NaN where the step is not in the table)."""
        if self._series is not None:
            return self._series.reindex(pd.MultiIndex.from_arrays([rank, epoch, fct])).to_numpy(float)
        out = np.full(len(rank), np.nan)
        inside = np.ones(len(rank), bool)
        for v, lo, sp in zip((rank, epoch, fct), self.lo, self.span):
            v = np.asarray(v, np.int64)
            inside &= (v >= lo) & (v < lo + sp)
        if not self.keys.size or not inside.any():
            return out
        k = self._key(*(np.asarray(v)[inside] for v in (rank, epoch, fct)))
        at = np.minimum(np.searchsorted(self.keys, k), self.keys.size - 1)
        hit = self.keys[at] == k
        sub = np.full(k.size, np.nan)
        sub[hit] = self.bs[at[hit]]
        out[inside] = sub
        return out


class _RunAcc:
    """Sums of one run over its chunks."""

    def __init__(self, run_id: str, gamma: int, est, exact: bool, steps: pd.DataFrame, hazard_boot: int, seed: int,
                 cal_fraction: float, temperatures, step_rows: pd.DataFrame | None = None, keep_per_request: bool = True,
                 specs=(), keep_stats: bool = True):
        self.run_id, self.G, self.est, self.exact = run_id, gamma, est, exact
        self.hazard_boot, self.seed = hazard_boot, seed
        self.cal_fraction, self.temperatures = cal_fraction, temperatures
        self.counts = dict(n=0, n_censored=0, sum_mean=0.0, greedy_resolved=0, modes={}, resolved=0, n_truth=0,
                           sum_truth=0.0)
        self.stats = {g: [] for g in GROUPINGS}
        self.shifts = {g: [] for g in GROUPINGS}
        self.util = {g: [] for g in GROUPINGS}
        self.pos = np.zeros((3, gamma))  # accepted, ceiling_reached, verified
        self.windows: list[pd.DataFrame] = []
        self.per_request: list[pd.DataFrame] = []
        self.labels: dict[str, dict] = {}  # group column -> label -> code (see _compact)
        self.keep_per_request = keep_per_request
        # the keyed bootstrap: per-replicate partial sums of ``specs`` added chunk by chunk (memory flat in
        # rows); the per-(group, request) statistics too only when ``keep_stats`` (any aggregate, small runs)
        self.specs, self.keep_stats = tuple(specs), keep_stats
        self.sums: dict = {}  # spec -> one replicate_sums part (the chunks so far, added up)
        self.trim = dict(request_steps=0, trimmed=0, regret=0, window_tokens=0, delivered=0, ceiling_tokens=0.0)
        self.cal: list = []
        self.notes: list[str] = []
        self.chunks = 0
        # batch size per decode step: the steps table, else (as run_all) the run's request rows per step
        self._bs = StepSizes(steps if len(steps) else step_rows)
        self.bs_note = None if len(steps) else "batch size taken as the number of request rows per step (no steps table)"

    def add(self, tbl: pa.Table) -> None:
        self.chunks += 1
        frame = BlockFrame.from_request_steps(tbl, gamma=self.G)
        G, n = self.G, frame.n
        tail = self.est.estimate(frame, hazard_boot=0 if self.exact else self.hazard_boot, seed=self.seed)
        for note in tail.notes:  # the frame's, then the hazard model's (levels it was not trained on)
            if note.split(" ")[0].isdigit():
                continue  # per-chunk counts (discontinuities): not repeated per chunk
            if note not in self.notes:
                self.notes.append(note)
        b = tail.blocks
        df = frame.pandas_columns(("run_id", "rid", "rank", "epoch", "forward_ct"))  # not the whole lazy frame.df
        b["band"] = batch_band(self._bs.lookup(df["rank"].to_numpy(), df["epoch"].to_numpy(), df["forward_ct"].to_numpy()))
        keys = row_request_keys(b["run_id"], b["rid"])
        cens = b["censored"].to_numpy(bool)
        c = self.counts
        c["n"] += n
        c["n_censored"] += int(cens.sum())
        c["sum_mean"] += float(b["mean"].sum())
        for m, v in b.loc[cens, "mode"].value_counts().items():
            c["modes"][m] = c["modes"].get(m, 0) + int(v)
        c["greedy_resolved"] += int((cens & (b["mode"].to_numpy() == "greedy") & b["resolved"].to_numpy(bool)).sum())
        c["resolved"] += int((cens & b["resolved"].to_numpy(bool)).sum())
        if "truth" in b:
            t = b["truth"].to_numpy(float)
            c["n_truth"] += int((~np.isnan(t)).sum())
            c["sum_truth"] += float(np.nansum(t))
        deltas = tail._boot["means"] - b["mean"].to_numpy(float)[None, :] if tail._boot else None
        # ceiling for utilization: exact where recorded, else the estimate
        if self.exact:
            ceil = frame.ceiling.astype(float)
            reach = (np.arange(G)[None, :] < frame.ceiling[:, None]).sum(0).astype(float)
        else:
            ceil = b["mean"].to_numpy(float)
            reach = (1 - np.cumsum(tail.pmf, 1)[:, :G]).sum(0)
        acc = frame.correct + 1
        fold = self.chunks % FOLD_CHUNKS == 0
        for g in GROUPINGS:
            by = list(g)
            st = request_stats(b, by, keys=keys)
            for sp in self.specs:
                if sp[0] == g:
                    part = replicate_sums(st, by, n_boot=sp[1], target=sp[2], seed=sp[3])
                    self.sums[sp] = add_sums([self.sums[sp], part]) if sp in self.sums else part
            if self.keep_stats:
                self.stats[g].append(self._compact(st, g))
            if deltas is not None:
                self.shifts[g].append(shift_sums(b, by, deltas))
                if fold:
                    self.shifts[g] = _fold(self.shifts[g], by)
            gc, groups = group_codes(b, by)
            ng = len(groups)
            u = groups.copy() if by else pd.DataFrame(index=range(ng))
            for name, w in (("n", None), ("window", frame.window), ("committed", acc), ("ceiling_tokens", ceil + 1),
                            ("correct", frame.correct)):
                u[name] = np.bincount(gc, weights=w, minlength=ng)
            self.util[g].append(u)
            if fold:
                self.util[g] = _fold(self.util[g], by)
        self.pos[0] += (np.arange(G)[None, :] < frame.correct[:, None]).sum(0)
        self.pos[1] += reach
        self.pos[2] += (np.arange(G)[None, :] < frame.window[:, None]).sum(0)
        base = pd.DataFrame({"run_id": df["run_id"].to_numpy(), "rid": df["rid"].to_numpy(),
                             "workload": b["workload"].to_numpy(), "window": frame.window, "acc_len": acc,
                             "ceiling": ceil})
        self.windows.append(base.groupby(["workload", "window"], dropna=False).size().rename("count").reset_index())
        if fold:
            self.windows = _fold(self.windows, ["workload", "window"])
        pr = base.groupby(["run_id", "rid"], sort=False).agg(n=("acc_len", "size"), committed=("acc_len", "sum"),
                                                              ceiling_tokens=("ceiling", "sum"), mean_window=("window", "mean"))
        pr["ceiling_tokens"] += pr["n"]
        if self.keep_per_request:
            self.per_request.append(pr.reset_index())
        t = self.trim
        trimmed = frame.window < G
        t["request_steps"] += n
        t["trimmed"] += int(trimmed.sum())
        t["regret"] += int((trimmed & (frame.correct == frame.window)).sum())
        t["window_tokens"] += int(frame.window.sum())
        t["delivered"] += int(acc.sum())
        t["ceiling_tokens"] += float((ceil + 1).sum())
        if self.exact and self.cal_fraction > 0:
            pick = uniforms(keys, 0, self.seed, stream=4) < self.cal_fraction
            if pick.any():
                try:
                    d = calibration_data(frame, "realized", temperatures=self.temperatures)
                except ValueError:
                    d = None
                if d is not None:
                    ok = frame.has_truth & np.isfinite(frame.logits(self.temperatures)[0]).all(1)
                    sel = pick[ok]
                    self.cal.append((d.z[sel], d.y[sel], keys[ok][sel], d.notes))
        # the exact planner audit of a one-chunk run needs them; a later chunk frees them (bounded memory)
        self.last_frame, self.last_tail = (frame, tail) if self.chunks == 1 else (None, None)

    def _compact(self, st: pd.DataFrame, g: tuple) -> pd.DataFrame:
        """Per-(group, request) statistics kept between chunks in ~64 bytes a row: group labels as
        int32 codes of a per-run dictionary, counts as int32."""
        for c in g:
            lab = self.labels.setdefault(c, {})
            vals = st[c].to_numpy(object)
            codes = np.empty(len(vals), np.int32)
            null = pd.isna(vals)
            if null.any():
                codes[null] = lab.setdefault("None", len(lab))
            for v in pd.unique(vals[~null]):  # a few distinct labels per chunk
                codes[~null & (vals == v)] = lab.setdefault(str(v), len(lab))
            st[c] = codes
        for c in ("n", "n_censored", "n_truth"):
            st[c] = st[c].astype(np.int32)
        return st

    def _expand(self, st: pd.DataFrame, g: tuple) -> pd.DataFrame:
        for c in g:
            lab = self.labels.get(c, {})
            cats = [None] * len(lab)
            for k, v in lab.items():
                cats[v] = k
            st[c] = pd.Categorical.from_codes(st[c].to_numpy(), categories=cats)
        return st

    # -- results ---------------------------------------------------------
    def tail_result(self, info: dict, notes: list[str]) -> StreamTail:
        stats = {g: self._expand(pd.concat(v, ignore_index=True), g) for g, v in self.stats.items() if v}
        shifts = {}
        for g, v in self.shifts.items():
            if v:
                d = pd.concat(v, ignore_index=True)
                shifts[g] = d.groupby(list(g), dropna=False).sum().reset_index() if g else d.sum().to_frame().T
        return StreamTail(counts=self.counts, stats=stats, shifts=shifts, gamma=self.G,
                          levels=tuple(self.est.levels), hazard_info=info, notes=list(self.notes) + notes,
                          sums={sp: [part] for sp, part in self.sums.items()})

    def utilization_result(self, tail: StreamTail, n_boot: int, seed: int):
        rows = []
        G = self.G
        for g, by_name in zip(GROUPINGS, ("run", "workload", "band")):
            by = list(g)
            d = pd.concat(self.util[g], ignore_index=True)
            d = d.groupby(by, dropna=False).sum().reset_index() if by else d.sum().to_frame().T
            ci = None
            if not self.exact:
                ci = tail.aggregate(by=by, level=0.95, n_boot=n_boot, seed=seed)
                ci = ci.set_index("group" if not by else by[0])
            for _, r in d.iterrows():
                grp = self.run_id if not by else ("None" if pd.isna(r[by[0]]) else str(r[by[0]]))
                com, ce, nn = float(r["committed"]), float(r["ceiling_tokens"]), float(r["n"])
                row = dict(by=by_name, group=grp, n=int(nn), mean_window=float(r["window"] / nn),
                           committed=int(com), ceiling_tokens=ce, utilization=com / ce, exact=self.exact,
                           in_window_accept_rate=float(r["correct"] / max(r["window"], 1)),
                           spec_accept_rate=float(r["correct"] / (nn * G)))
                if ci is not None:
                    key = "all" if not by else grp
                    if key in ci.index:
                        lo, hi = ci.loc[key, "lo"], ci.loc[key, "hi"]
                        row["util_lo"], row["util_hi"] = float(com / (nn * (hi + 1))), float(com / (nn * (lo + 1)))
                else:
                    row["util_lo"] = row["util_hi"] = row["utilization"]
                rows.append(row)
        k = np.arange(G)
        by_pos = pd.DataFrame({"position": k, "accepted": self.pos[0].astype(np.int64), "ceiling_reached": self.pos[1],
                               "verified": self.pos[2].astype(np.int64)})
        by_pos["utilization"] = by_pos.accepted / by_pos.ceiling_reached.clip(lower=1e-12)
        win = pd.concat(self.windows, ignore_index=True).groupby(["workload", "window"], dropna=False)["count"].sum().reset_index()
        win["workload"] = win["workload"].astype(object).where(win["workload"].notna(), "None")
        win["share"] = win["count"] / win.groupby("workload")["count"].transform("sum")
        per_req = pd.concat(self.per_request, ignore_index=True) if self.per_request else \
            pd.DataFrame(columns=["run_id", "rid", "n", "committed", "ceiling_tokens", "mean_window"])
        per_req["utilization"] = per_req.committed / per_req.ceiling_tokens
        notes = [] if self.exact else ["ceiling estimated by the tail estimator; intervals: bootstrap of the mean ceiling"]
        if self.bs_note:
            notes.append(self.bs_note)
        if not self.keep_per_request:
            notes.append("per-request table not kept for a run this size (bounded memory)")
        return UtilizationResult(by_group=pd.DataFrame(rows), by_position=by_pos, windows=win, per_request=per_req,
                                 notes=notes)

    def realized_calibration(self):
        """The realized-label calibration rows this pass kept (a stable hash sample of requests when
        ``cal_fraction`` < 1), as :class:`estimators.calibration.CalData` (the streamed and Spark paths)."""
        if not self.cal:
            raise ValueError("label 'realized' needs request-steps with a ceiling (a cap-accept or static run)")
        z = np.concatenate([c[0] for c in self.cal])
        y = np.concatenate([c[1] for c in self.cal])
        grp = np.concatenate([c[2] for c in self.cal])
        notes = [self.cal[0][3][0], f"realized label: position k reached past iff k < ceiling ({len(z)} request-steps)"]
        if self.cal_fraction < 1:
            notes.append("calibration on a stable hash-sample of the run's requests")
        return CalData(z, y, grp, "realized", notes)

    def trim_counters(self) -> dict:
        t = self.trim
        out = {"request_steps": t["request_steps"], "trimmed_request_steps": t["trimmed"],
               "trim_regret_rate": t["regret"] / max(t["trimmed"], 1), "window_tokens": t["window_tokens"],
               "delivered_tokens": t["delivered"], "ceiling_tokens": t["ceiling_tokens"],
               "trim_ratio": 1 - t["delivered"] / t["ceiling_tokens"]}
        return out


# ----------------------------------------------------------------------------------------------
# the facade
# ----------------------------------------------------------------------------------------------
STEP_COLUMNS = ("rank", "epoch", "forward_ct", "bs", "budget", "lag_steps", "num_verify_tokens", "executed_verify_tokens",
                "predicted_step_ms", "predicted_theta", "step_cpu_ms", "step_gpu_ms")  # what cost fit and planner read


COST_STEPS = 1 << 17  # decode steps a big run's cost fit reads (a stable hash-sample of them beyond)


def _read_steps(store, run_id: str, columns=STEP_COLUMNS, max_steps: int | None = None) -> pd.DataFrame:
    """The run's ``steps`` in key order, only the columns the cost fit, the batch sizes and the planner
    audit read, without ``run_id`` (one value; :func:`_with_run` adds it back to the rows the audit
    gets): a ``steps`` row is ~1/batch of the request-steps, so whatever is kept per step is the
    streamed path's growth in memory with the run's rows. ``max_steps``: beyond that many steps, a
    stable hash-sample of about that many (multiplicative hash of the step key, computed in DuckDB)."""
    have = set(schema.table("steps").names)
    cols = [c for c in columns if c in have]
    n = _count_steps(store, run_id) if max_steps else 0
    if max_steps and n > max_steps:
        keep = int((max_steps / n) * (1 << 32))
        d = store.query_df(f"SELECT {', '.join(cols)} FROM steps WHERE run_id = ? AND ((forward_ct * 2654435761 + "
                           "epoch * 40503 + rank * 97) % 4294967296) < ?", [run_id, keep])
        d.attrs["sampled_from"] = n
    else:
        d = store.read_table("steps", run_id, columns=cols)
    return d if len(d) < 2 else d.sort_values(["rank", "epoch", "forward_ct"], kind="stable", ignore_index=True)


def _count_steps(store, run_id: str) -> int:
    return int(store.query_df("SELECT count(*) AS n FROM steps WHERE run_id = ?", [run_id]).n.iloc[0])


def _with_run(steps: pd.DataFrame, run_id: str) -> pd.DataFrame:
    return steps if "run_id" in steps else steps.assign(run_id=run_id)


def _run_meta(store, run_ids) -> pd.DataFrame:
    q = ("SELECT r.*, c.n_rows, c.n_truth FROM runs r JOIN (SELECT run_id, count(*) AS n_rows, count(ceiling) AS n_truth "
         "FROM request_steps WHERE run_id IN (SELECT UNNEST(?)) GROUP BY run_id) c USING (run_id)")
    return store.query_df(q, [list(run_ids)])


def _fit_estimator(store, meta_row, meta: pd.DataFrame, fit_rows: int, seed: int, cache: dict,
                   hazards_from: str | None = None, duckdb_memory: str | None = DUCKDB_MEMORY):
    """The run's fitted TailEstimator and a note on what it was fitted on (the policy of
    :func:`estimators.hazard_runs`, as :func:`estimators.run_all`). ``duckdb_memory``: the pass's
    share, for the sample's read (:func:`run_all_stream` fits every run before its ordered scan opens)."""
    rid, gamma = meta_row.run_id, int(meta_row.gamma)
    if meta_row.n_truth == meta_row.n_rows:
        train = (rid,)
        note = "this run: ceiling recorded on every request-step (the verify ran the whole block): no tail is estimated"
    else:
        others, note = hazard_runs(store, rid, gamma, meta_row.get("audit_group"), hazards_from)
        train = tuple(others) or (rid,)
    if train not in cache:
        tbl = read_sample(store, train, fit_rows, seed=seed, duckdb_memory=duckdb_memory)
        est = TailEstimator().fit(BlockFrame.from_request_steps(tbl, gamma=gamma))
        n_total = int(store.query_df("SELECT count(*) AS n FROM request_steps WHERE run_id IN (SELECT UNNEST(?))",
                                     [list(train)]).n.iloc[0])
        sample_note = (f"hazards fitted on a stable hash-sample of {tbl.num_rows} of {n_total} request-steps "
                       f"(whole requests)") if tbl.num_rows < n_total else None
        cache[train] = (est, sample_note)
    est, sample_note = cache[train]
    return est, [note] + ([sample_note] if sample_note else [])


def run_all_stream(store, run_ids=None, n_boot: int = 200, hazard_boot: int = 20, seed: int = 0,
                   chunk_rows: int = CHUNK_ROWS, sample_rows: int = 1 << 19, fit_rows: int = 1 << 18,
                   duckdb_memory: str | None = AUTO_MEMORY, progress=None,
                   hazards_from: str | None = None, whole_runs: bool = False) -> dict[str, Any]:
    """:func:`estimators.run_all` for every run in ``run_ids`` (default: all) in one ordered pass
    over ``request_steps``; see the module docstring. Returns ``{run_id: results}``; a run that
    cannot be estimated maps to its ``ValueError``. ``whole_runs``: every run is one chunk (small
    runs: then the results are :func:`estimators.run_all`'s in-memory ones)."""
    if run_ids is None:
        run_ids = store.runs().run_id.tolist()
    run_ids = list(run_ids)
    meta = _run_meta(store, run_ids)
    out: dict[str, Any] = {r: ValueError(f"run {r!r} has no request_steps") for r in run_ids}
    known = set(store.runs().run_id)
    for r in run_ids:
        if r not in known:
            out[r] = KeyError(f"run {r!r} not in {store.path}")
    if meta.empty:
        return out
    meta = meta.set_index("run_id", drop=False)
    if duckdb_memory == AUTO_MEMORY:
        duckdb_memory = sort_memory(int(meta.n_rows.sum()))
    # every run's hazards are fitted before the ordered scan starts: the sample read and the fit then
    # never sit on top of the sort's memory (100M: 2.5 GB when they did)
    cache: dict = {}
    fitted: dict[str, Any] = {}
    for rid in sorted(meta.run_id):
        try:
            fitted[rid] = _fit_estimator(store, meta.loc[rid], meta, fit_rows, seed, cache, hazards_from, duckdb_memory)
        except ValueError as e:
            fitted[rid] = e
    accs: dict[str, _RunAcc] = {}
    side: dict[str, dict] = {}

    def open_run(rid: str) -> _RunAcc:
        m = meta.loc[rid]
        if isinstance(fitted[rid], ValueError):
            raise fitted[rid]
        est, notes = fitted.pop(rid)
        data = load_run(store, rid, skip=("request_steps", "steps"))
        # a big run's steps are not held through the pass (they grow with its rows): the batch sizes
        # only, kept compactly by the accumulator; the cost fit and the planner read theirs at the end
        big = _count_steps(store, rid) > COST_STEPS
        data["steps"] = _read_steps(store, rid, ("rank", "epoch", "forward_ct", "bs") if big else STEP_COLUMNS)
        try:
            sts_in_force(data)
        except ValueError as e:  # the confidences are post-STS and the table is missing: no calibration
            side_skips = {"calibration": str(e)}
            data["sts_temperatures"] = None
        else:
            side_skips = {}
        frac = min(1.0, sample_rows / max(int(m.n_rows), 1))
        step_rows = None
        if not len(data["steps"]):
            step_rows = store.query_df("SELECT rank, epoch, forward_ct, count(*) AS bs FROM request_steps "
                                       "WHERE run_id = ? GROUP BY ALL", [rid])
        acc = _RunAcc(rid, int(m.gamma), est, bool(m.n_truth == m.n_rows), data["steps"], hazard_boot, seed,
                      frac, data["sts_temperatures"], step_rows, keep_per_request=int(m.n_rows) <= sample_rows,
                      specs=aggregate_specs(n_boot, seed), keep_stats=int(m.n_rows) <= sample_rows)
        if big:
            data["steps"] = None  # read again at the end (:func:`_results`)
        side[rid] = dict(data=data, notes=notes, skipped=side_skips)
        return acc

    def finish(rid: str) -> None:
        acc = accs.pop(rid)
        try:
            out[rid] = _results(store, acc, side.pop(rid), n_boot, seed, sample_rows, duckdb_memory)
        except ValueError as e:
            out[rid] = e
        if progress is not None:
            progress(rid)

    current = None
    for rid, tbl in request_chunks(store, meta.run_id.tolist(), chunk_rows=chunk_rows, duckdb_memory=duckdb_memory,
                                   whole_runs=whole_runs):
        try:
            if rid != current:
                if current in accs:
                    finish(current)
                current = rid
                accs[rid] = open_run(rid)
            if rid in accs:
                accs[rid].add(tbl)
        except ValueError as e:  # this run cannot be estimated: say why, go on with the others
            out[rid] = e
            accs.pop(rid, None)
            side.pop(rid, None)
    if current in accs:
        try:
            finish(current)
        except ValueError as e:
            out[current] = e
    return out


def _results(store, acc: _RunAcc, side: dict, n_boot: int, seed: int, sample_rows: int, duckdb_memory) -> dict:
    data = side["data"]
    res: dict[str, Any] = {"skipped": {}}
    res["run"] = _Table(pd.DataFrame(), {k: data["run"].get(k) for k in RUN_KEYS})
    tail = acc.tail_result(dict(acc.est.hazard.info_), side["notes"])
    if acc.chunks > 1:
        tail.notes.append(f"estimated in {acc.chunks} chunks of whole requests")
    res["tail"] = tail
    tc = acc.trim_counters()
    gamma = acc.G
    res["bracket"] = sglang_bracket(data, tc, gamma)
    res["utilization"] = acc.utilization_result(tail, n_boot, seed)
    def make_data():
        d = acc.realized_calibration() if acc.exact else \
            calibration_data(None, "greedy", sts_samples=data["sts_samples"], gamma=gamma)
        if side.get("skipped", {}).get("calibration"):
            raise ValueError(side["skipped"]["calibration"])
        return d, data["sts_temperatures"]

    fit_calibration(res, make_data, n_boot, seed)
    steps = data["steps"]
    if steps is None:  # a big run: the cost fit on a stable hash-sample of its decode steps
        steps = _read_steps(store, acc.run_id, max_steps=COST_STEPS)
    table = fit_cost(res, steps, data["sps_table"], seed)
    if "sampled_from" in steps.attrs and "cost" in res:
        res["cost"].notes.append(f"fitted on a stable hash-sample of {len(steps)} of {steps.attrs['sampled_from']} "
                                 "decode steps (bounded memory)")
    if table is not None and len(steps):
        if acc.chunks == 1:  # the whole run was one chunk: the exact audit
            frame, ptail = acc.last_frame, acc.last_tail
            p = audit(frame, _with_run(steps, acc.run_id), table, ceiling_estimate=None if acc.exact else ptail.blocks["mean"].to_numpy())
        else:
            p = _planner_window(store, acc, None if "sampled_from" in steps.attrs else steps, table, PLANNER_ROWS,
                                duckdb_memory)
        p.notes.append("SPS table: " + ("the run's recorded table" if data["sps_table"] else "fitted from this run's timings"))
        res["planner"] = p
    else:
        res["skipped"]["planner"] = "no SPS table recorded and no step timings to fit one"
    return res


def _planner_window(store, acc: _RunAcc, steps: pd.DataFrame, table, max_rows: int, duckdb_memory):
    """Planner audit of the run's first decode steps (at most ``max_rows`` request-steps: the
    budget needs whole steps and each request's history), with the streamed run totals.
    ``steps=None``: the window's steps are found and read in DuckDB (a big run's are not held)."""
    if steps is None:
        last, steps = _window_steps(store, acc.run_id, max_rows, duckdb_memory)
        upto = pd.MultiIndex.from_frame(steps[["epoch", "forward_ct"]].drop_duplicates())
    else:
        st = steps.sort_values(["epoch", "forward_ct"])
        per = st.groupby(["epoch", "forward_ct"])["bs"].max().fillna(0).cumsum()
        upto = per[per <= max_rows].index
        last = upto[-1] if len(upto) else per.index[0]
    with store.connect(read_only=True) as con:
        _configure(con, duckdb_memory)
        cols, src = temperature_filled_select(con, TAIL_COLUMNS, [acc.run_id])
        tbl = fetch_arrow(con, f"SELECT {cols} FROM {src} WHERE s.run_id = ? AND (s.epoch < ? OR (s.epoch = ? AND "
                               f"s.forward_ct <= ?)) ORDER BY {S_ORDER}", [acc.run_id, int(last[0]), int(last[0]), int(last[1])])
    frame = BlockFrame.from_request_steps(tbl, gamma=acc.G)
    p = audit(frame, _with_run(steps[steps.set_index(["epoch", "forward_ct"]).index.isin(upto if len(upto) else [last])],
                               acc.run_id), table, ceiling_estimate=None)
    t = acc.trim
    s = p.summary
    window_steps = s["steps"]
    s.update(request_steps=t["request_steps"], trimmed_request_steps=t["trimmed"],
             verify_tokens_saved=float(acc.G * t["request_steps"] - t["window_tokens"]),
             accepted_drafts_lost=float(t["ceiling_tokens"] - t["delivered"]),
             accepted_drafts_lost_source="ceiling" if acc.exact else "tail estimate",
             audited_steps=window_steps, audited_request_steps=int(frame.n))
    s["lost_per_saved_token"] = s["accepted_drafts_lost"] / max(s["verify_tokens_saved"], 1.0)
    p.notes.append(f"budget recomputation on the first {window_steps} decode steps ({frame.n} request-steps); "
                   "trimming counts over the whole run")
    return p


def _window_steps(store, run_id: str, max_rows: int, duckdb_memory) -> tuple[tuple, pd.DataFrame]:
    """The last (epoch, forward_ct) of the run's first decode steps holding at most ``max_rows``
    request-steps (each step counted at its largest ``bs`` over ranks; at least the first step), and
    the ``steps`` rows up to it: what :func:`_planner_window` computes from a whole ``steps`` table."""
    with store.connect(read_only=True) as con:
        _configure(con, duckdb_memory)
        cum = ("SELECT epoch, forward_ct, sum(coalesce(b, 0)) OVER (ORDER BY epoch, forward_ct ROWS UNBOUNDED PRECEDING) "
               "AS cum FROM (SELECT epoch, forward_ct, max(bs) AS b FROM steps WHERE run_id = ? GROUP BY epoch, forward_ct)")
        last = con.execute(f"SELECT epoch, forward_ct FROM ({cum}) WHERE cum <= ? ORDER BY epoch DESC, forward_ct DESC "
                           "LIMIT 1", [run_id, max_rows]).fetchone() or \
            con.execute("SELECT epoch, forward_ct FROM steps WHERE run_id = ? ORDER BY epoch, forward_ct LIMIT 1",
                        [run_id]).fetchone()
        have = set(schema.table("steps").names)
        cols = ", ".join(c for c in STEP_COLUMNS if c in have)
        steps = con.execute(f"SELECT {cols} FROM steps WHERE run_id = ? AND (epoch < ? OR (epoch = ? AND forward_ct <= ?)) "
                            "ORDER BY rank, epoch, forward_ct", [run_id, last[0], last[0], last[1]]).df()
    return tuple(last), steps
