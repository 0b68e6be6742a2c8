"""The streamed executor: every run of a store in one ordered pass, memory bounded by a chunk of requests.

Why: one SGLang server at batch 256 writes ~25k request-steps a second (90M an hour). The store is
read **once**, ordered by request, as Arrow record batches cut into chunks of whole requests
(:func:`estimators.chunks.request_chunks`); each chunk goes into its run's
:class:`~estimators.accumulator.RunAccumulator` and the results are assembled by
:func:`estimators.pipeline.assemble`, as for every executor. What this executor adds is how it reads:

* hazards are fitted before the scan opens, on a stable hash-sample of their training requests (at most
  ``fit_rows`` request-steps), so the fit never sits on top of the sort's memory;
* cost: the run's ``steps`` (one row per decode step, ~1/batch of the request-steps); past
  :data:`~estimators.pipeline.COST_STEPS` steps only the batch sizes are held through the pass, then a
  stable hash-sample of steps for the cost fit;
* planner audit: exact on runs that fit in one chunk; on bigger runs, on the first
  :data:`~estimators.pipeline.PLANNER_ROWS` request-steps in step order (the budget recomputation needs
  whole decode steps with each request's history), with the run's streamed totals for the trimming counts.

Memory: a chunk (``chunk_rows`` request-steps plus the estimator's per-block arrays), the per-request
statistics (runs up to ``sample_rows`` only; bigger ones keep per-replicate sums) and the sort by request:
a run of up to :data:`~estimators.chunks.SORT_ROWS` request-steps is sorted in memory, a bigger one by
DuckDB, capped by ``duckdb_memory`` (it spills to a temporary directory). Results equal the in-memory ones on a
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

from dataclasses import dataclass, field
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope import schema
from acceptscope.store import fetch_arrow
from acceptscope.estimators.accumulator import RunAccumulator
from acceptscope.estimators.chunks import (AUTO_MEMORY, CHUNK_ROWS, S_ORDER, TAIL_COLUMNS, configure, request_chunks,
                                           s_columns, sort_memory)
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.pipeline import (COST_STEPS, PLANNER_ROWS, STEP_COLUMNS, RunSide, assemble, count_steps,
                                             fit_hazards, new_accumulator, read_steps, run_meta, run_side, with_run)
from acceptscope.estimators.planner import AUDIT_COLUMNS, audit

WINDOW_COLUMNS = tuple(c for c in TAIL_COLUMNS if c in AUDIT_COLUMNS)  # what a planner window holds of a row


def run_all_stream(store, run_ids=None, n_boot: int = 200, hazard_boot: int = 20, seed: int = 0,
                   chunk_rows: int = CHUNK_ROWS, sample_rows: int = 1 << 19, fit_rows: int = 1 << 18,
                   duckdb_memory: str | None = AUTO_MEMORY, progress=None,
                   hazards_from: str | None = None, whole_runs: bool = False, gather=None,
                   cache: dict | None = None) -> dict[str, Any]:
    """Every estimator for every run in ``run_ids`` (default: all) in one ordered pass over
    ``request_steps``; see the module docstring. Returns ``{run_id: results}``; a run that cannot be
    estimated maps to its ``ValueError`` (``KeyError`` for an unknown run). ``whole_runs``: every run
    is one chunk (small runs: the in-memory results). ``gather``: SGLang's pg p/q for the tail walk.
    ``cache``: the hazard fits (:func:`estimators.pipeline.fit_hazards`), to share them with a caller.

    One read-only connection serves the whole pass (the ordered scan holds one anyway; every other read
    nests in it instead of opening the file again, ~14 ms each, hundreds of times over a store of runs)."""
    with store.connect(read_only=True):
        return _stream_runs(store, run_ids, n_boot, hazard_boot, seed, chunk_rows, sample_rows, fit_rows,
                            duckdb_memory, progress, hazards_from, whole_runs, gather, cache)


def _stream_runs(store, run_ids, n_boot, hazard_boot, seed, chunk_rows, sample_rows, fit_rows, duckdb_memory,
                 progress, hazards_from, whole_runs, gather, cache=None) -> dict[str, Any]:
    if run_ids is None:
        run_ids = store.runs().run_id.tolist()
    run_ids = list(run_ids)
    meta = run_meta(store, run_ids)
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
    cache = {} if cache is None else cache
    fitted: dict[str, Any] = {}
    for rid in sorted(meta.run_id):
        try:
            fitted[rid] = fit_hazards(store, meta.loc[rid], fit_rows, seed, cache, hazards_from, duckdb_memory,
                                      hazard_boot)
        except ValueError as e:
            fitted[rid] = e
    open_runs: dict[str, tuple[RunAccumulator, RunSide, bool]] = {}
    windows: dict[str, Window] = {}  # runs in several chunks: their planner window's rows, kept as they pass

    def open_run(rid: str) -> None:
        m = meta.loc[rid]
        if isinstance(fitted[rid], ValueError):
            raise fitted[rid]
        est, notes = fitted.pop(rid)
        # a big run's steps are not held through the pass (they grow with its rows): the batch sizes
        # only; the cost fit and the planner read theirs at the end
        big = count_steps(store, rid) > COST_STEPS
        side = run_side(store, rid, notes, read_steps(store, rid, ("rank", "epoch", "forward_ct", "bs") if big
                                                      else STEP_COLUMNS))
        acc = new_accumulator(est, rid, int(m.gamma), bool(m.n_truth == m.n_rows), int(m.n_rows), side, store,
                              n_boot, hazard_boot, seed, sample_rows, gather=gather)
        if not whole_runs and int(m.n_rows) > chunk_rows:  # several chunks: the planner audits a window
            windows[rid] = Window.of(store, rid, None if big else side.data["steps"], PLANNER_ROWS, duckdb_memory)
        if big:
            side.data["steps"] = None  # the accumulator keeps the batch sizes; the cost fit reads a sample at the end
        open_runs[rid] = (acc, side, big)

    def finish(rid: str) -> None:
        acc, side, big = open_runs.pop(rid)
        win = windows.pop(rid, None)
        try:
            cost_steps = read_steps(store, rid, max_steps=COST_STEPS) if big else None
            out[rid] = assemble(acc, side, n_boot, seed, planner=lambda table, steps: _planner(
                store, acc, steps, table, duckdb_memory, win), cost_steps=cost_steps)
            if acc.chunks > 1:
                out[rid]["tail"].notes.append(f"estimated in {acc.chunks} chunks of whole requests")
        except ValueError as e:
            out[rid] = e
        if progress is not None:
            progress(rid)

    current = None
    for rid, tbl in request_chunks(store, meta.run_id.tolist(), chunk_rows=chunk_rows, duckdb_memory=duckdb_memory,
                                   whole_runs=whole_runs):
        try:
            if rid != current:
                if current in open_runs:
                    finish(current)
                current = rid
                open_run(rid)
            if rid in open_runs:
                open_runs[rid][0].add(tbl)
                if rid in windows:
                    windows[rid].keep(tbl)
        except ValueError as e:  # this run cannot be estimated: say why, go on with the others
            out[rid] = e
            open_runs.pop(rid, None)
            windows.pop(rid, None)
    if current in open_runs:
        finish(current)
    return out


def _planner(store, acc: RunAccumulator, steps: pd.DataFrame, table, duckdb_memory, win: "Window | None" = None):
    """The planner audit of a DuckDB store's run: exact when the run was one chunk, else on a window
    (``win``: its bounds and rows, kept during the pass)."""
    if acc.chunks == 1:
        return audit(acc.last_frame, with_run(steps, acc.run_id), table,
                     ceiling_estimate=None if acc.exact else acc.last_tail.blocks["mean"].to_numpy())
    return planner_window(store, acc, None if "sampled_from" in steps.attrs else steps, table, PLANNER_ROWS,
                          duckdb_memory, win)


@dataclass
class Window:
    """A run's planner window: its last decode step ``(epoch, forward_ct)``, the steps up to it (``upto``)
    and the ``steps`` rows it audits; ``rows``: its request-steps, kept from the streamed chunks as they
    pass (:meth:`keep`; the window was read again from the store after the pass before: a second scan
    of up to :data:`~estimators.pipeline.PLANNER_ROWS` request-steps per run)."""

    last: tuple
    upto: Any
    steps: pd.DataFrame
    rows: list = field(default_factory=list)

    @classmethod
    def of(cls, store, run_id: str, steps: pd.DataFrame | None, max_rows: int, duckdb_memory) -> "Window":
        """The window of the run's first decode steps holding at most ``max_rows`` request-steps (the
        budget needs whole steps and each request's history). ``steps=None``: found and read in DuckDB
        (a big run's steps are not held)."""
        if steps is None:
            last, steps = window_steps(store, run_id, max_rows, duckdb_memory)
            upto = pd.MultiIndex.from_frame(steps[["epoch", "forward_ct"]].drop_duplicates())
        else:
            st = steps.sort_values(["epoch", "forward_ct"])
            per = st.groupby(["epoch", "forward_ct"])["bs"].max().fillna(0).cumsum()
            upto = per[per <= max_rows].index
            last = upto[-1] if len(upto) else per.index[0]
        return cls(tuple(last), upto, steps)

    def keep(self, tbl: pa.Table) -> None:
        """Keep the chunk's request-steps inside the window, the columns the audit reads (chunks come in
        request order: kept in order; the draft tokens and log-probs were ~2/3 of a kept row)."""
        e, f = (int(x) for x in self.last)
        ep, fc = tbl.column("epoch"), tbl.column("forward_ct")
        inside = pc.or_(pc.less(ep, e), pc.and_(pc.equal(ep, e), pc.less_equal(fc, f)))
        self.rows.append(tbl.select(list(WINDOW_COLUMNS)).filter(pc.fill_null(inside, False)))

    def read(self, store, run_id: str, duckdb_memory) -> pa.Table:
        """The window's request-steps in request order (what the pass kept, handed over, else read from the
        store)."""
        if self.rows:  # (chunked, not combined: no second copy of the window)
            tbl, self.rows = pa.concat_tables(self.rows), []
            return tbl
        e, f = (int(x) for x in self.last)
        with store.connect(read_only=True) as con:
            configure(con, duckdb_memory)
            return fetch_arrow(con, f"SELECT {s_columns(WINDOW_COLUMNS)} FROM request_steps s WHERE s.run_id = ? AND "
                                    f"(s.epoch < ? OR (s.epoch = ? AND s.forward_ct <= ?)) ORDER BY {S_ORDER}",
                               [run_id, e, e, f])


def planner_window(store, acc: RunAccumulator, steps: pd.DataFrame | None, table, max_rows: int, duckdb_memory,
                   win: Window | None = None):
    """Planner audit of the run's first decode steps (:class:`Window`), with the streamed run totals.
    ``steps=None``: the window's steps are found and read in DuckDB (a big run's are not held);
    ``win``: the window as the pass found and kept it (else found and read now)."""
    win = win or Window.of(store, acc.run_id, steps, max_rows, duckdb_memory)
    last, upto, steps = win.last, win.upto, win.steps
    frame = BlockFrame.from_request_steps(win.read(store, acc.run_id, duckdb_memory), gamma=acc.G)
    p = audit(frame, with_run(steps[steps.set_index(["epoch", "forward_ct"]).index.isin(upto if len(upto) else [last])],
                              acc.run_id), table, ceiling_estimate=None)
    t = acc.trim
    s = p.summary
    n_window = s["steps"]
    s.update(request_steps=t["request_steps"], trimmed_request_steps=t["trimmed"],
             verify_tokens_saved=float(acc.G * t["request_steps"] - t["window_tokens"]),
             accepted_drafts_lost=float(t["ceiling_tokens"] - t["delivered"]),
             accepted_drafts_lost_source="ceiling" if acc.exact else "tail estimate",
             audited_steps=n_window, audited_request_steps=int(frame.n))
    s["lost_per_saved_token"] = s["accepted_drafts_lost"] / max(s["verify_tokens_saved"], 1.0)
    p.notes.append(f"budget recomputation on the first {n_window} decode steps ({frame.n} request-steps); "
                   "trimming counts over the whole run")
    return p


def window_steps(store, run_id: str, max_rows: int, duckdb_memory) -> tuple[tuple, pd.DataFrame]:
    """The last (epoch, forward_ct) of the run's first decode steps holding at most ``max_rows``
    request-steps (each step counted at its largest ``bs`` over ranks; at least the first step), and
    the ``steps`` rows up to it: what :func:`planner_window` computes from a whole ``steps`` table."""
    with store.connect(read_only=True) as con:
        configure(con, duckdb_memory)
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
