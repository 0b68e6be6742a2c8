"""SGLang ``/server_info`` DSpark info dumps -> ``runs`` / ``steps`` / ``request_steps`` / ``gaps``.

What SGLang 0.5.23 gives us (reference §2): ``internal_states[i].dspark_info_record``
per DP rank, in *arrival order* (no rank id), each holding the whole in-memory
ring of ``DecodeStepRecord`` (200 000 records max) on every call. The structs
are ``msgspec.Struct(omit_defaults=True)``, so fields equal to their default
are absent from the JSON.

Translation decisions (documented here because readers depend on them):

* Defaults are filled as SGLang declares them, then the ``-1`` "unknown"
  sentinels of ``bs``, ``num_running_reqs``, ``num_verify_tokens`` and
  ``verify_tokens_*`` are stored as **NULL** (one spelling of "unknown" in the
  store); ``mode == ""`` (no ``core`` component) is stored as NULL.
* ``rid`` NULL -> ``'pool:<req_pool_index>'``; ``window = verify_len - 1``;
  ``ceiling = correct_drafts + cap_trim`` in cap-accept, ``correct_drafts`` in
  static, NULL in compact; ``committed_tokens = draft_tokens[:correct_drafts] + [bonus]``;
  ``step_index`` counts a rid's steps seen by this ingestor (a ``pool:`` rid
  restarts at 0 when its ``prefix_len`` goes backwards: a new request took the slot); the counts are
  held for the recently seen named rids only (:mod:`~acceptscope.ingest.rid_steps`: memory bounded
  whatever the stream's length; a rid unseen for 2**18 other rids restarts at 0) and for every pool slot.
* The ingestor is stateful: per observed rank slot a ``forward_ct`` watermark
  (records at or below it are duplicates from the ring and are skipped), the
  fingerprint of the record at the watermark, and the rids of the last step.
  Each incoming state is matched to the rank whose watermark record it still
  holds (same fingerprint), else to the rank it continues (rid overlap), else
  it is a restart (``epoch += 1``; also on a changed ``startup_time`` or
  ``forward_ct`` going backwards).
* Gaps: if a matched state no longer holds the watermark record and its oldest
  record is newer than ``watermark + 1``: ``overflow`` when the ring is full
  (``ring_capacity`` records), else ``clear-loss`` (cleared between polls).
  ``forward_ct`` jumps inside a snapshot are normal (prefill/idle passes) and
  are not gaps.
* Reading: a document is scanned once for its skeleton (everything but the records arrays)
  and its records' chunk boundaries (:mod:`acceptscope.ingest.stream`), then translated a chunk
  at a time. Two paths, no more: the fast path (one typed msgspec pass of the chunk,
  :mod:`~acceptscope.ingest.server_info_columns` builds and checks its columns) and, for a chunk it
  declines, the exact fallback (each record as builtins, ``State.obj``: a lenient parse, then
  ``msgspec.convert`` with poisoned values found by field; the rules of
  :mod:`~acceptscope.ingest.server_info_checks`). A document the scan cannot cut (repeated keys,
  malformed JSON, NaN tokens) is read whole and takes the exact fallback; so does a dict payload.
* Where things live: this module walks documents, states and chunks;
  :mod:`~acceptscope.ingest.server_info_records` (structs, decoders, a rank's records),
  :mod:`~acceptscope.ingest.server_info_payload` (payload shapes and headers -> one state per rank),
  :mod:`~acceptscope.ingest.server_info_ranks` (which rank a state is),
  :mod:`~acceptscope.ingest.server_info_run` (the ``runs`` row).
* Bad input never aborts: the smallest invalid unit (one ReqDetail, one step
  header, one component name, one state) goes to ``rejects`` with its field
  path, and every valid sibling is kept.
"""

from __future__ import annotations

import gc
import json
import math
from contextlib import contextmanager
from typing import Any, Callable, Optional

import msgspec
import numpy as np
import pyarrow as pa
from pyarrow.compute import is_null as pc_is_null

from acceptscope.arrow_columns import one_array
from acceptscope.ingest import server_info_columns as fast
from acceptscope.ingest import stream
from acceptscope.ingest.batch import IngestBatch, table_from_columns
from acceptscope.ingest.jsontext import defuse_deep
from acceptscope.ingest.rejects import (
    INT64_MAX,
    MAX_DEPTH,
    join_path,
    make_reject,
    msgspec_error_path,
)
from acceptscope.ingest.rid_steps import CAPACITY as RID_CAPACITY, RidStepCounts
from acceptscope.ingest.server_info_checks import check_req, check_step
from acceptscope.ingest.server_info_columns import Columns
from acceptscope.ingest.server_info_payload import KNOWN_COMPONENTS, PayloadReader, PayloadRejected, SlowPath
from acceptscope.ingest.server_info_ranks import Rank, Seen, fingerprint, fp, match_states, rids_of
from acceptscope.ingest.server_info_records import (
    CHUNK_DECODER,
    TOP_DECODER,
    ReqDetail,
    State,
    StepRecord,
    loads_lenient,
)
from acceptscope.ingest.server_info_run import run_row, run_row_from_server_info
from acceptscope.runs_table import read_runs

__all__ = [
    "ServerInfoIngestor",
    "IngestBatch",
    "ReqDetail",
    "StepRecord",
    "run_row_from_server_info",
    "RING_CAPACITY",
    "KNOWN_COMPONENTS",
]

RING_CAPACITY = 200_000  # SGLang INFO_DUMP_MAX_RECORDS


@contextmanager
def _gc_paused():
    """Hold the cyclic GC off while a payload is decoded.

    Decoding allocates ~10 Python objects per request-step, none of them cyclic;
    each allocation burst would otherwise trigger full collections that walk every
    object of the process (measured: 8-9 collections, ~0.1-0.3 s CPU per 200k
    request-steps, pyarrow/pandas/duckdb loaded).
    """
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


# ---------------------------------------------------------------------------
# the ingestor
# ---------------------------------------------------------------------------
class ServerInfoIngestor(PayloadReader):
    """Stateful translator of successive /server_info payloads of one run.

    ``feed(payload_dict)``, ``feed_bytes(json_bytes)`` (the live poller) and
    ``feed_source(stream.FileSource(path))`` (files) return an :class:`IngestBatch` holding only
    what is new since the previous call. Documents are read a chunk of records at a time
    (:mod:`acceptscope.ingest.stream`); each chunk takes the one fast path
    (:mod:`acceptscope.ingest.server_info_columns`) or, when that declines, the exact per-record
    path, which names every problem by field. With :attr:`sink` set, each chunk's rows are handed
    to it as soon as they are made, so memory is bounded by a chunk, not by the document.
    ``rid_capacity``: the rids whose step counts are held per generation (:mod:`~acceptscope.ingest.rid_steps`).
    """

    def __init__(self, run_id: str, source: str = "live", *, ring_capacity: int = RING_CAPACITY,
                 expected_gamma: Optional[int] = None, expected_arm: Optional[str] = None,
                 server_args: Optional[dict] = None, rid_capacity: int = RID_CAPACITY):
        self.run_id = run_id
        self.source = source
        self.ring_capacity = ring_capacity
        self.gamma: Optional[int] = expected_gamma
        self.arm: Optional[str] = expected_arm
        self.server_args = dict(server_args or {})
        self.epoch = 0
        self.ranks: list[Rank] = []
        self.startup_time: Any = None
        # incarnation (startup_time) -> epoch, placed in startup order by the ingest (:mod:`~acceptscope.ingest.epochs`);
        # a startup time it does not hold takes the next free epoch
        self.epoch_of: dict[float, int] = {}
        self._store: Any = None  # the store resumed from: a placed incarnation it holds is resumed at its epoch
        self.run_emitted = False
        self._step_ct = RidStepCounts(rid_capacity)  # named rids: the recently seen ones
        # 'pool:<idx>' rids (no rid in the dump): one entry per pool slot, bounded by the pool's size
        self._pool_ct: dict[str, int] = {}
        self._pool_prefix: dict[str, int] = {}
        self.polls = 0
        self.use_fast = True  # the vectorised path per chunk; the exact per-record path is the fallback
        # where rows go as they are translated, a chunk at a time (None: all stay in the returned batch);
        # the returned batch keeps the rejects, duplicates and what was not handed over yet
        self.sink: Optional[Callable[[IngestBatch], None]] = None
        self.chunk_bytes = stream.CHUNK_BYTES  # records per chunk, in bytes of JSON (tests make it tiny)

    # -- resuming from a store ---------------------------------------------
    def resume(self, store: Any, epoch: Optional[int] = None) -> bool:
        """Continue a run already in ``store``: epoch (default: the last), per-rank watermarks and
        fingerprints, rid step counts.

        Without this a second ``acceptscope ingest`` of later polls would start rank slots in
        arrival order again and could file a DP rank's records under another rank's slot.
        Returns False when the store has no steps of this run (of that epoch).
        """
        self._store = store
        snapshot = getattr(store, "snapshot", None)
        if snapshot is None:
            return self._resume(store, epoch)
        with snapshot():  # one read-only connection for all the queries below (nested connects reuse it)
            return self._resume(store, epoch)

    def _resume(self, store: Any, epoch: Optional[int] = None) -> bool:
        which = "(SELECT max(epoch) FROM steps WHERE run_id = ?)" if epoch is None else "?"
        got = store.query_df(
            f"SELECT epoch, rank, max(forward_ct) AS wm FROM steps WHERE run_id = ? AND epoch = {which} "
            "GROUP BY epoch, rank ORDER BY rank", [self.run_id, self.run_id if epoch is None else int(epoch)])
        if got.empty:
            return False
        self.epoch = int(got["epoch"].iloc[0])
        self.ranks = []
        for row in got.itertuples():
            step = store.query_df(
                "SELECT bs, num_verify_tokens, budget, step_cpu_ms FROM steps WHERE run_id = ? AND epoch = ? "
                "AND rank = ? AND forward_ct = ?", [self.run_id, self.epoch, int(row.rank), int(row.wm)]).iloc[0]
            # (the watermark is max(forward_ct) of steps, so that step row exists)
            reqs = store.query_df(
                "SELECT rid, req_pool_index, prefix_len, bonus_token FROM request_steps WHERE run_id = ? AND "
                "epoch = ? AND rank = ? AND forward_ct = ?", [self.run_id, self.epoch, int(row.rank), int(row.wm)])
            rq = frozenset((r.rid, int(r.req_pool_index), int(r.prefix_len), int(r.bonus_token))
                           for r in reqs.itertuples())
            nn = lambda v, d=None: d if v is None or (isinstance(v, float) and math.isnan(v)) else v  # noqa: E731
            budget = nn(step["budget"])
            last_fp = fp(int(row.wm), nn(step["bs"], -1), nn(step["num_verify_tokens"], -1),
                     None if budget is None else int(budget), nn(step["step_cpu_ms"]), rq)
            self.ranks.append(Rank(slot=int(row.rank), watermark=int(row.wm), last_fp=last_fp,
                                    last_rids=frozenset(r[0] for r in rq)))
        # the counts this ingestor would hold had it read the run: every pool slot, and the most recently seen
        # named rids, as many as one generation holds (DuckDB aggregates the run's rids; only these come back)
        counts = store.query_df(
            "SELECT rid, max(step_index) + 1 AS n, max(prefix_len) AS p, starts_with(rid, 'pool:') AS pool "
            "FROM request_steps WHERE run_id = ? AND epoch = ? GROUP BY rid "
            "QUALIFY pool OR row_number() OVER (PARTITION BY pool ORDER BY max(forward_ct) DESC) < ?",
            [self.run_id, self.epoch, self._step_ct.capacity])
        named, pool = counts[~counts["pool"]], counts[counts["pool"]]
        self._step_ct.clear()
        self._step_ct.set_many(named["rid"].tolist(), named["n"].astype(int).tolist())
        self._pool_ct = {r.rid: int(r.n) for r in pool.itertuples()}
        self._pool_prefix = {r.rid: int(r.p) for r in pool.itertuples()}
        runs = read_runs(store.query_df, [self.run_id], ["arm", "gamma", "config_json"])
        if not runs.empty:
            self.run_emitted = True
            self.arm = self.arm or runs["arm"].iloc[0]
            self.gamma = self.gamma or int(runs["gamma"].iloc[0])
            try:
                cfg = json.loads(runs["config_json"].iloc[0])
            except (TypeError, ValueError):
                cfg = {}
            at = {int(e): s for s, e in (cfg.get("epochs") or []) if isinstance(e, (int, float))}
            self.startup_time = at.get(self.epoch, cfg.get("startup_time") if not at else None)
        return True

    def _next_epoch(self) -> int:
        return max([self.epoch, *self.epoch_of.values()]) + 1

    def _enter_epoch(self, startup: Any) -> bool:
        """Move to the epoch placed for ``startup`` (resuming it when the store holds it); True when resumed."""
        key = float(startup) if isinstance(startup, (int, float)) and not isinstance(startup, bool) else None
        if key is not None and key in self.epoch_of:
            self.epoch = self.epoch_of[key]
        else:
            self.epoch = self._next_epoch()
            if key is not None:
                self.epoch_of[key] = self.epoch
        return self._store is not None and self._resume_at(self.epoch)

    def _resume_at(self, epoch: int) -> bool:
        try:
            return self.resume(self._store, epoch)
        except Exception:  # noqa: BLE001 - nothing stored to continue: the epoch starts fresh
            return False

    # -- entry points -------------------------------------------------------
    def feed(self, payload: dict, *, source: Optional[str] = None, line: int = 0) -> IngestBatch:
        """Ingest one /server_info response (or one state, or one bare dump) given as builtins."""
        with _gc_paused():
            return self._feed(payload, source=source, line=line)

    def _feed(self, payload: dict, *, source: Optional[str] = None, line: int = 0) -> IngestBatch:
        src = source or self.source
        batch = IngestBatch()
        self.polls += 1
        try:
            states, startup = self._states_from_obj(payload, src, line, batch)
        except PayloadRejected:
            return batch
        self._ingest(states, startup, src, line, batch)
        return batch

    def feed_bytes(self, data: bytes, *, source: Optional[str] = None, line: int = 0) -> IngestBatch:
        """Ingest one JSON document given as bytes (:meth:`feed_source`)."""
        return self.feed_source(stream.BytesSource(data), source=source, line=line)

    def feed_source(self, doc: "stream.Source", *, source: Optional[str] = None, line: int = 0) -> IngestBatch:
        """Ingest one JSON document read from ``doc`` a chunk of records at a time; lenient fallback on bad input.

        Values nested too deeply for any decoder (RecursionError) are replaced first
        (:func:`acceptscope.ingest.jsontext.defuse_deep`), so only the records holding them are
        rejected; anything else unexpected rejects this payload alone, never the caller's later ones.
        """
        with _gc_paused():
            try:
                return self._feed_source(doc, source=source, line=line)
            except RecursionError:
                pass
            except Exception as e:  # noqa: BLE001 - one payload's failure must not cost the next ones
                batch = IngestBatch()
                batch.reject(make_reject(source or self.source, line, "$",
                                         f"payload could not be ingested: {type(e).__name__}: {e}", None, self.run_id))
                return batch
            fixed, n = defuse_deep(doc.read_all(), MAX_DEPTH)
            note = make_reject(source or self.source, line, "$",
                               f"{n} value(s) nested deeper than {MAX_DEPTH} levels replaced before decoding; "
                               "a record holding one is rejected by field", None, self.run_id)
            if fixed is None:
                batch = IngestBatch()
                batch.reject(dict(note, reason="nested too deeply to decode"))
                return batch
            try:
                batch = self._feed_source(stream.BytesSource(fixed), source=source, line=line)
            except Exception as e:  # noqa: BLE001
                batch = IngestBatch()
                note["reason"] += f"; payload still could not be ingested: {type(e).__name__}: {e}"
            batch.reject(note)
            return batch

    def _feed_source(self, doc: "stream.Source", *, source: Optional[str] = None, line: int = 0) -> IngestBatch:
        src = source or self.source
        top = chunked = None
        sc = stream.scan(doc, self.chunk_bytes)
        if sc is not None:  # the skeleton (records arrays emptied) decodes like the document
            data = sc.skeleton
            chunked = {k: stream.ChunkedRecords(doc, v) for k, v in sc.arrays.items()}
        else:  # irregular: the whole document, its records raw
            data = doc.read_all()
        try:
            top = TOP_DECODER.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            top = None
        if top is not None:
            batch = IngestBatch()
            try:
                states = self._states_from_raw(top, data, src, line, batch, chunked)
            except SlowPath:
                states = None
            except PayloadRejected:
                self.polls += 1
                return batch
            if states is not None:
                self.polls += 1
                startup, top = top.startup_time, None  # the states hold what is still needed
                self._ingest(states, startup, src, line, batch)
                return batch
        if sc is not None:
            data = doc.read_all()
        try:
            obj = loads_lenient(data)
        except (ValueError, UnicodeDecodeError) as e:
            batch = IngestBatch()
            batch.reject(make_reject(src, line, "$", f"malformed or truncated JSON: {e}", data, self.run_id))
            return batch
        return self._feed(obj, source=src, line=line)

    # -- matching, gaps, translation ---------------------------------------
    def _ingest(self, states: list[State], startup: Any, src: str, line: int, batch: IngestBatch) -> None:
        if not states:
            return
        if not self.run_emitted:
            st0 = states[0]
            args = dict(st0.args)
            args.update(self.server_args)
            batch.add("runs", run_row(self.run_id, mode=st0.mode, gamma=st0.gamma, vndt=st0.vndt,
                                       components=st0.components, simulate_acc_len=st0.simulate_acc_len,
                                       args=args, startup_time=startup,
                                       source="live" if self.source == "live" or self.source.startswith("http") else "file"))
            self.run_emitted = True
        restart = False
        same_server = startup is not None and startup == self.startup_time
        if startup is not None and self.startup_time is not None and startup != self.startup_time:
            restart = True
        if startup is not None:
            self.startup_time = startup
        assignment: dict[int, Rank] = {}
        if not restart and self.ranks:
            assignment, restart = match_states(self.ranks, states, same_server)
            if restart and same_server:  # the same process cannot go back: a malformed poll, not a restart
                batch.reject(make_reject(src, line, "$", f"poll does not continue the server's records (same "
                                         f"startup_time {startup!r}; e.g. a transient malformed ring): poll rejected, "
                                         "not counted as a restart", None, self.run_id))
                for s in states:
                    s.release()
                return
        elif not self.ranks and startup is not None and not isinstance(startup, bool) \
                and isinstance(startup, (int, float)) and self.epoch_of.get(float(startup), self.epoch) != self.epoch:
            self.epoch = self.epoch_of[float(startup)]  # the first document: the epoch placed for it
        if restart:
            old = self.ranks
            self.ranks = []
            self._step_ct.clear()
            self._pool_ct.clear()
            self._pool_prefix.clear()
            prev_epoch = self.epoch
            resumed = self._enter_epoch(startup)
            if startup is not None:
                self.startup_time = startup
            if resumed:  # an incarnation the store holds already: continue it
                assignment, _ = match_states(self.ranks, states, True) if self.ranks else ({}, False)
                for s in states:
                    if id(s) not in assignment:
                        r = Rank(slot=len(self.ranks))
                        self.ranks.append(r)
                        assignment[id(s)] = r
                states_restart: list = []
            else:
                states_restart = list(states)
            for k, s in enumerate(states_restart):
                r = Rank(slot=k)
                self.ranks.append(r)
                assignment[id(s)] = r
                first = s.first_fct()
                prev = old[k].watermark if k < len(old) else -1
                batch.add("gaps", {
                    "run_id": self.run_id, "rank": k, "epoch": self.epoch,
                    "from_forward_ct": max(prev, 0), "to_forward_ct": first if first is not None else 0,
                    "kind": "restart",
                    "detail": f"server restarted (epoch {prev_epoch} -> {self.epoch}); "
                              f"previous watermark forward_ct={prev}",
                })
        else:
            for s in states:
                if id(s) not in assignment:
                    r = Rank(slot=len(self.ranks))
                    self.ranks.append(r)
                    assignment[id(s)] = r
        for s in states:
            rank = assignment[id(s)]
            self._ingest_state(s, rank, src, line, batch)
            s.release()

    def _flush(self, cols: Columns, batch: IngestBatch) -> None:
        """Move a chunk's translated rows into ``batch``, and hand them to :attr:`sink` when there is one."""
        steps = list(cols.fast_steps)
        reqs = list(cols.fast_reqs)
        if cols.n_steps:
            steps.append(cols.steps_table(self.run_id, self.epoch))
        if cols.n_reqs:
            reqs.append(cols.reqs_table(self.run_id, self.epoch))
        if steps:
            batch.extend("steps", pa.concat_tables(steps) if len(steps) > 1 else steps[0])
        if reqs:
            batch.extend("request_steps", pa.concat_tables(reqs) if len(reqs) > 1 else reqs[0])
        if self.sink is not None and (steps or reqs):
            part = IngestBatch()
            for name in ("runs", "gaps", "steps", "request_steps"):  # (rejects stay: capped and counted per poll)
                rows = batch.tables.pop(name, None)
                if rows is not None:
                    part.extend(name, rows)
            self.sink(part)

    # -- one state --------------------------------------------------------
    def _ingest_state(self, s: State, rank: Rank, src: str, line: int, batch: IngestBatch) -> None:
        n = len(s.records)
        if n == 0:
            return
        w = rank.watermark
        # first index with forward_ct > watermark (ring is in forward_ct order)
        start = 0
        if w >= 0:
            j = s.find_fct(w)
            if j is not None:
                start = j + 1
            else:
                lo, hi = 0, n
                ok = True
                while lo < hi:
                    mid = (lo + hi) // 2
                    f = s.safe_fct(mid)
                    if f is None:
                        ok = False
                        break
                    if f <= w:
                        lo = mid + 1
                    else:
                        hi = mid
                start = lo if ok else 0
                first_new = s.first_fct(start)
                if first_new is not None and first_new > w + 1 and start == 0:
                    kind = "overflow" if n >= self.ring_capacity else "clear-loss"
                    batch.add("gaps", {
                        "run_id": self.run_id, "rank": rank.slot, "epoch": self.epoch,
                        "from_forward_ct": w, "to_forward_ct": first_new, "kind": kind,
                        "detail": (f"ring full ({n} records): records after forward_ct {w} dropped before this poll"
                                   if kind == "overflow" else
                                   f"ring cleared between polls: forward_ct {w + 1}..{first_new - 1} unaccounted "
                                   "(some may be non-decode passes)"),
                    })
        if start:
            batch.note_duplicates("steps", start)
            batch.note_duplicates("request_steps", s.count_reqs(0, start))
        # chunk by chunk: the fast path, else the exact one; rows leave through _flush as they are made
        seen = Seen()
        last: Any = None  # the last record translated: its index (fast) or (header, reqs) (exact)
        for a, b in s.ranges(start, n):
            cols = Columns()
            got = self.use_fast and self._fast_range(s, rank, a, b, seen, src, line, batch, cols)
            if got:
                last = b - 1
            else:
                last = self._exact_range(s, rank, a, b, w, seen, src, line, batch, cols) or last
            self._flush(cols, batch)
        if isinstance(last, int):
            try:
                h = s.header(last)
                reqs, _ = s.decode_reqs(last, h)
            except (msgspec.DecodeError, msgspec.ValidationError):
                h, reqs = None, None
            rank.watermark = seen.max
            rank.last_fp = fingerprint(h, reqs) if h is not None else None
            rank.last_rids = rids_of(reqs)
        elif last is not None:
            h, reqs = last
            rank.watermark = h.forward_ct
            rank.last_fp = fingerprint(h, reqs)
            rank.last_rids = rids_of(reqs)

    def _exact_range(self, s: State, rank: Rank, a: int, b: int, w: int, seen: Seen, src: str, line: int,
                     batch: IngestBatch, cols: Columns) -> Optional[tuple]:
        """records[a:b] one by one, every problem rejected by field; returns the last good (header, reqs)."""
        pfx = (s.prefix + ".") if s.prefix else ""
        last_good = None
        # pass 1: headers + ReqDetail lists of the new records
        req_all: list[ReqDetail] = []
        req_pos: list[tuple[int, int]] = []  # (record index j, position k in its reqs list)
        rec_meta: list[tuple[int, StepRecord, int, int]] = []  # (j, header, first, end) into req_all
        for j in range(a, b):
            try:
                h = s.header(j)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                path, why = msgspec_error_path(e)
                batch.reject(make_reject(src, line, join_path(f"{pfx}records[{j}]", path), why,
                                         s.records[j], self.run_id))
                continue
            fct = h.forward_ct
            where = f"{pfx}records[{j}]"
            if fct < 0 or fct > INT64_MAX:
                batch.reject(make_reject(src, line, where + ".forward_ct",
                                         f"negative ({fct})" if fct < 0 else f"{fct} outside int64",
                                         s.records[j], self.run_id))
                continue
            if fct <= w:
                batch.note_duplicates("steps", 1)
                batch.note_duplicates("request_steps", s.count_reqs(j, j + 1))
                continue
            if fct in seen:
                batch.reject(make_reject(src, line, where + ".forward_ct", f"duplicate record for forward_ct {fct}",
                                         s.records[j], self.run_id))
                continue
            seen.add(fct)
            try:
                reqs, _bad = s.decode_reqs(j, h, lambda k, e, it, j=j: batch.reject(make_reject(
                    src, line, join_path(f"{pfx}records[{j}].reqs[{k}]", msgspec_error_path(e)[0]),
                    msgspec_error_path(e)[1], s.item(j, k), self.run_id)))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                path, why = msgspec_error_path(e)
                batch.reject(make_reject(src, line, join_path(where, path), why, s.records[j], self.run_id))
                reqs = None
            step_problem = check_step(h, s.mode, reqs)
            if step_problem:
                f_, why = step_problem
                batch.reject(make_reject(src, line, f"{where}.{f_}", why, s.records[j], self.run_id))
                # its requests go too (no request_steps row without its steps row), each counted as a reject
                for k, r in enumerate(reqs or ()):
                    if r is not None:
                        batch.reject(make_reject(src, line, f"{where}.reqs[{k}]",
                                                 f"step header rejected ({f_}): request row dropped with it",
                                                 None, self.run_id))
                last_good = (h, reqs)
                continue
            cols.add_step(rank.slot, h)
            first = len(req_all)
            if reqs:
                if None in reqs:
                    for k, r in enumerate(reqs):
                        if r is not None:
                            req_all.append(r)
                            req_pos.append((j, k))
                else:
                    req_all.extend(reqs)
                    req_pos.extend((j, k) for k in range(len(reqs)))
            rec_meta.append((j, h, first, len(req_all)))
            last_good = (h, reqs)
        # pass 2: validate every ReqDetail of this range at once, then translate
        if req_all:
            self._add_reqs(s, rank, rec_meta, req_all, req_pos, src, line, batch, cols)
        return last_good

    def _fast_range(self, s: State, rank: Rank, a: int, b: int, seen: Seen, src: str, line: int,
                    batch: IngestBatch, cols: Columns) -> bool:
        """Translate records[a:b] on the vectorised path; False (nothing done) to fall back."""
        try:
            recs = CHUNK_DECODER.decode(s.range_json(a, b))
        except (msgspec.DecodeError, msgspec.ValidationError, TypeError, ValueError, msgspec.EncodeError):
            return False  # (ValueError: a lone surrogate in a decoded record that JSON cannot carry)
        tbl = fast.records_table(recs)
        del recs
        if tbl is None:
            return False
        res = fast.translate(tbl, gamma=s.gamma, mode=s.mode, watermark=max(rank.watermark, seen.max))
        if res is None:
            return False
        seen.add_sorted(fast._np(tbl.column("forward_ct")))
        m = res.steps.num_rows
        st = {name: res.steps.column(name) for name in res.steps.column_names}
        st["run_id"] = pa.repeat(pa.scalar(self.run_id), m)
        st["rank"] = pa.array(np.full(m, rank.slot, dtype=np.int32))
        st["epoch"] = pa.array(np.full(m, self.epoch, dtype=np.int32))
        cols.fast_steps.append(table_from_columns("steps", st, m))
        pfx = f"{s.prefix}." if s.prefix else ""
        if res.reqs is not None and res.reqs.num_rows:
            bad = res.bad.copy()
            for q in np.flatnonzero(bad):
                j = a + int(res.req_record[q])
                k = int(res.req_pos[q])
                why = self._explain(s, j, k)
                if why is None:
                    bad[q] = False
                    continue
                batch.reject(make_reject(src, line, f"{pfx}records[{j}].reqs[{k}]" + why[0], why[1], why[2],
                                         self.run_id))
            dup = res.dup & ~bad
            if dup.any():
                rid_py = res.reqs.column("rid")
                for q in np.flatnonzero(dup):
                    j = a + int(res.req_record[q])
                    k = int(res.req_pos[q])
                    batch.reject(make_reject(src, line, f"{pfx}records[{j}].reqs[{k}].rid",
                                             f"duplicate rid {rid_py[int(q)].as_py()!r} in one step",
                                             s.item(j, k), self.run_id))
            keep = ~(bad | dup)
            if keep.any():
                kept_idx = np.flatnonzero(keep)
                fcts = fast._np(tbl.column("forward_ct"))[res.req_record[kept_idx]]
                rid_arr = one_array(res.reqs.column("rid"))
                if len(kept_idx) < len(rid_arr):
                    rid_arr = rid_arr.take(pa.array(kept_idx))
                rids, step_index = self._rids_and_steps(rid_arr, res.reqs, kept_idx)
                cols.fast_reqs.append(fast.request_steps_table(
                    res, keep, run_id=self.run_id, rank=rank.slot, epoch=self.epoch, fcts=fcts, rids=rids,
                    step_index=step_index, mode=s.mode, gamma=s.gamma))
        return True

    def _explain(self, s: State, j: int, k: int) -> Optional[tuple[str, str, Any]]:
        """Why ReqDetail k of record j is invalid: (sub-path, reason, raw), or None if it is valid."""
        item = None
        try:
            item = s.item(j, k)  # (quoted as it came)
            r = s.convert_req(s.header(j).reqs[k])
        except (msgspec.DecodeError, msgspec.ValidationError) as e:
            path, why = msgspec_error_path(e)
            sub = join_path("", path)
            return ("." + sub if sub and not sub.startswith("[") else sub), why, item
        prob = check_req(r, s.gamma, s.header(j).mode or s.mode)
        if prob is None:
            return None
        return "." + prob[0], prob[1], item

    def _rids_and_steps(self, rid_arr: pa.Array, reqs: pa.Table, kept_idx: np.ndarray):
        """Fill 'pool:<idx>' for missing rids and number each rid's steps (vectorised for named rids)."""
        n = len(rid_arr)
        step_index = np.zeros(n, dtype=np.int64)
        ct, pool_ct = self._step_ct, self._pool_ct
        missing = np.flatnonzero(fast._np(pc_is_null(rid_arr))) if rid_arr.null_count else np.zeros(0, np.int64)
        if len(missing):
            pool = fast._np(one_array(reqs.column("req_pool_index")).take(pa.array(kept_idx[missing])))
            prefix = fast._np(one_array(reqs.column("prefix_len")).take(pa.array(kept_idx[missing])))
            filled = rid_arr.to_pylist()
            for q, pidx, pl in zip(missing, pool, prefix):
                rid = f"pool:{int(pidx)}"
                last = self._pool_prefix.get(rid)
                if last is not None and pl < last:
                    pool_ct[rid] = 0
                self._pool_prefix[rid] = int(pl)
                i = pool_ct.get(rid, 0)
                pool_ct[rid] = i + 1
                step_index[q] = i
                filled[q] = rid
            rid_arr = pa.array(filled, pa.string())
        named = np.ones(n, dtype=bool)
        named[missing] = False
        if named.any():
            sub = rid_arr.filter(pa.array(named)) if len(missing) else rid_arr
            enc = sub.dictionary_encode()
            idx = fast._np(enc.indices).astype(np.int64)
            uniq = enc.dictionary.to_pylist()
            base = ct.get_many(uniq)
            order = np.argsort(idx, kind="stable")
            sidx = idx[order]
            starts = np.flatnonzero(np.r_[True, sidx[1:] != sidx[:-1]])
            counts = np.diff(np.r_[starts, len(sidx)])
            within = np.arange(len(sidx)) - np.repeat(starts, counts)
            cum = np.empty(len(sidx), dtype=np.int64)
            cum[order] = within
            vals = base[idx] + cum
            step_index[np.flatnonzero(named)] = vals
            totals = np.bincount(idx, minlength=len(uniq))
            ct.set_many(uniq, (base + totals).tolist())
        return rid_arr, step_index

    def _add_reqs(self, s, rank, rec_meta, req_all, req_pos, src, line, batch, cols) -> None:
        gamma = s.gamma
        pfx = f"{s.prefix}." if s.prefix else ""
        ct = self._step_ct
        pool_ct, pool_prefix = self._pool_ct, self._pool_prefix
        keep: list[ReqDetail] = []
        rids: list[str] = []
        fcts: list[int] = []
        step_idx: list[int] = []
        for j, h, first, end in rec_meta:
            if first == end:
                continue
            mode = h.mode or s.mode
            seen: set[str] = set()
            for q in range(first, end):
                r = req_all[q]
                prob = check_req(r, gamma, mode)
                if prob is not None:
                    k = req_pos[q][1]
                    batch.reject(make_reject(src, line, f"{pfx}records[{j}].reqs[{k}].{prob[0]}", prob[1],
                                             msgspec.to_builtins(r), self.run_id))
                    continue
                rid = r.rid
                pooled = rid is None
                if pooled:
                    rid = f"pool:{r.req_pool_index}"
                    last = pool_prefix.get(rid)
                    if last is not None and r.prefix_len < last:
                        pool_ct[rid] = 0
                    pool_prefix[rid] = r.prefix_len
                if rid in seen:
                    k = req_pos[q][1]
                    batch.reject(make_reject(src, line, f"{pfx}records[{j}].reqs[{k}].rid",
                                             f"duplicate rid {rid!r} in one step", msgspec.to_builtins(r), self.run_id))
                    continue
                seen.add(rid)
                if pooled:
                    i = pool_ct.get(rid, 0)
                    pool_ct[rid] = i + 1
                else:
                    i = ct.get(rid)
                    ct.set(rid, i + 1)
                keep.append(r)
                rids.append(rid)
                fcts.append(h.forward_ct)
                step_idx.append(i)
        if keep:
            cols.add_reqs(rank.slot, fcts, s.mode, gamma, keep, rids, step_idx)
