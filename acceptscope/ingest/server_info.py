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
  restarts at 0 when its ``prefix_len`` goes backwards: a new request took the slot).
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
  at a time: one typed msgspec pass + vectorised checks (:mod:`acceptscope.ingest.server_info_fast`),
  or, for a chunk that pass declines, the exact per-record path below. A document the scan
  cannot cut (repeated keys, malformed JSON, NaN tokens) is read whole and takes the exact path.
* Bad input never aborts: the smallest invalid unit (one ReqDetail, one step
  header, one component name, one state) goes to ``rejects`` with its field
  path, and every valid sibling is kept.
"""

from __future__ import annotations

import gc
import hashlib
import json
import math
import os
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timezone
from itertools import chain
from typing import Any, Callable, Optional, Sequence

import msgspec
import numpy as np
import pyarrow as pa
from pyarrow.compute import is_null as pc_is_null

from acceptscope import schema
from acceptscope.arrow_columns import one_array
from acceptscope.ingest import server_info_columns as fast
from acceptscope.ingest import stream
from acceptscope.ingest.batch import IngestBatch, table_from_columns
from acceptscope.ingest.rejects import (
    INT32_MAX,
    INT64_MAX,
    MAX_DEPTH,
    describe_number,
    has_surrogates,
    join_path,
    make_reject,
    msgspec_error_path,
    safe_text,
)

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
_MAX_GAMMA = 1024  # far above any draft block SGLang runs; a larger one is a corrupt header, not a setting
_EMPTY_STATES = "empty: no DP rank reported a DSpark dump (is this a DSpark server with SGLANG_DSPARK_DEBUG_DUMP set?)"
KNOWN_COMPONENTS = frozenset(
    {"core", "step_cpu_time", "step_gpu_time", "draft_gpu_time", "target_verify_gpu_time", "reqs"}
)
_SENTINEL_FIELDS = (
    "bs",
    "num_running_reqs",
    "num_verify_tokens",
    "verify_tokens_local",
    "verify_tokens_dp_synced",
    "verify_tokens_graph_key",
)
_TIME_FIELDS = ("step_cpu_ms", "step_gpu_ms", "draft_gpu_ms", "target_verify_gpu_ms")
# Server args worth keeping in runs.config_json (others are noise for an audit).
_ARG_KEYS = (
    "model_path",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_draft_tokens",
    "speculative_dspark_confidence_sts_path",
    "speculative_dspark_sps_table_path",
    "speculative_dspark_block_size",
    "speculative_dspark_align_verify_tokens_to_graph_tier",
    "tp_size",
    "dp_size",
    "attn_dp_size",
    "max_running_requests",
    "disable_cuda_graph",
    "avg_spec_accept_length",
    "version",
)


# ---------------------------------------------------------------------------
# typed mirrors of SGLang's structs (defaults as SGLang declares them)
# ---------------------------------------------------------------------------
class ReqDetail(msgspec.Struct):
    """Mirror of SGLang 0.5.23 ``ReqDetail`` (one verify-batch row)."""

    req_pool_index: int
    prefix_len: int
    verify_len: int
    acc_len: int
    correct_drafts: int
    cap_trim: int
    bonus_token: int
    draft_tokens: list[int]
    rid: Optional[str] = None
    confidence: Optional[list[float]] = None
    survival: Optional[list[float]] = None


class StepRecord(msgspec.Struct):
    """Mirror of SGLang 0.5.23 ``DecodeStepRecord`` without ``reqs`` (decoded lazily)."""

    forward_ct: int
    bs: int = -1
    mode: str = ""
    budget: Optional[int] = None
    lag_steps: Optional[int] = None
    num_running_reqs: int = -1
    num_verify_tokens: int = -1
    verify_tokens_local: int = -1
    verify_tokens_dp_synced: int = -1
    verify_tokens_graph_key: int = -1
    predicted_step_ms: Optional[float] = None
    predicted_theta: Optional[float] = None
    step_cpu_ms: Optional[float] = None
    step_gpu_ms: Optional[float] = None
    draft_gpu_ms: Optional[float] = None
    target_verify_gpu_ms: Optional[float] = None


class _StepRecordRaw(StepRecord):
    reqs: msgspec.Raw = None  # type: ignore[assignment]  (msgspec: Raw cannot sit in a Union)


class _StepRecordObj(StepRecord):
    reqs: Any = None


class _StepRecordTyped(StepRecord, gc=False):
    """A record of the fast path: header exactly as ``StepRecord`` (so a record the exact path would
    refuse fails the chunk's decode), ReqDetails with their per-position lists kept raw for
    :func:`acceptscope.ingest.fast.records_table`."""

    reqs: Optional[list[fast.ReqRawLists]] = None


_ArgFields = [(k, Any, None) for k in _ARG_KEYS]


def _document_structs() -> tuple[Any, Any]:
    """(top, payload) msgspec types of a /server_info document, its records kept raw."""
    payload = msgspec.defstruct(
        "_Payload",
        [
            ("gamma", Any, None),
            ("verify_num_draft_tokens", Any, None),
            ("mode", Any, None),
            ("components", Any, None),
            ("records", Optional[list[msgspec.Raw]], None),
            ("simulate_acc_len", Any, None),
        ],
    )
    state = msgspec.defstruct("_State", [("dspark_info_record", Optional[payload], None)] + _ArgFields)
    top = msgspec.defstruct(
        "_Top",
        [
            ("internal_states", Optional[list[state]], None),
            ("startup_time", Any, None),
            ("dspark_info_record", Optional[payload], None),
            ("records", msgspec.Raw, None),
        ]
        + [f for f in _ArgFields if f[0] != "version"]
        + [("version", Any, None)],
    )
    return top, payload


# The exact fallback decodes the document (a skeleton, or the whole of an irregular one) with records
# raw and each record on its own; the fast path decodes a chunk of records in one typed pass.
_TopRaw, _PayloadRaw = _document_structs()
_dec_top = msgspec.json.Decoder(_TopRaw)
_dec_payload = msgspec.json.Decoder(_PayloadRaw)
_dec_chunk = msgspec.json.Decoder(list[_StepRecordTyped])
_dec_record = msgspec.json.Decoder(_StepRecordRaw)
_dec_reqs = msgspec.json.Decoder(list[ReqDetail])
_dec_raw_list = stream.RAW_LIST
_dec_req = msgspec.json.Decoder(ReqDetail)


def _nr(raw: Any) -> Any:
    """A decoded ``msgspec.Raw`` holding JSON null -> None."""
    if raw is None or (isinstance(raw, msgspec.Raw) and len(raw) == 4 and bytes(raw) == b"null"):
        return None
    return raw


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


def loads_lenient(data: bytes | str) -> Any:
    """Parse JSON accepting NaN/Infinity tokens (Python's json), for the slow path."""
    return json.loads(data)


# ---------------------------------------------------------------------------
# one rank's state (a view over either raw JSON bytes or builtins)
# ---------------------------------------------------------------------------
@dataclass
class _State:
    index: int  # position in internal_states (arrival order)
    prefix: str  # field-path prefix for rejects
    gamma: int
    vndt: int
    mode: str
    components: list[str]
    simulate_acc_len: Optional[float]
    args: dict
    records: Sequence[Any]  # raw items (a list, or stream.ChunkedRecords read a chunk at a time) or dicts
    is_raw: bool
    _headers: dict = field(default_factory=dict)

    def release(self) -> None:
        """Drop the records once translated (~400 B of decoded objects per request-step, freed early)."""
        self.records = ()
        self._headers.clear()

    def ranges(self, lo: int, hi: int) -> list[tuple[int, int]]:
        """[lo, hi) cut at the chunk boundaries of the records (one range for records held in memory)."""
        r = self.records
        if not isinstance(r, stream.ChunkedRecords):
            return [(lo, hi)] if lo < hi else []
        return [(max(lo, a), min(hi, b)) for a, b in zip(r.starts, r.starts[1:]) if max(lo, a) < min(hi, b)]

    def range_json(self, a: int, b: int) -> bytes | bytearray:
        """records[a:b] as one JSON array (a whole chunk is read as it lies in the file)."""
        r = self.records
        if isinstance(r, stream.ChunkedRecords):
            c = r.chunk_of(a)
            if a == r.starts[c] and b == r.starts[c + 1]:
                return r.chunk_json(c)
        if self.is_raw:
            return b"[" + b",".join(r[a:b]) + b"]"
        return msgspec.json.encode(list(r[a:b]))

    def header(self, j: int) -> StepRecord:
        """Decode record j's header (cached while its chunk is); raises msgspec.ValidationError/DecodeError."""
        h = self._headers.get(j)
        if h is None:
            item = self.records[j]
            h = _dec_record.decode(item) if self.is_raw else _convert_checked(item, _StepRecordObj, skip="reqs")
            if len(self._headers) > 100_000:
                self._headers.clear()
            self._headers[j] = h
        return h

    def fct(self, j: int) -> int:
        return self.header(j).forward_ct


class _Seen:
    """forward_cts of a state's records translated so far (fast chunks as sorted arrays, exact ones in a set)."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []
        self.set: set[int] = set()
        self.max = -1

    def add_sorted(self, f: np.ndarray) -> None:
        if len(f):
            self.arrays.append(f)
            self.max = max(self.max, int(f[-1]))

    def add(self, x: int) -> None:
        self.set.add(x)
        self.max = max(self.max, x)

    def __contains__(self, x: int) -> bool:
        if x in self.set:
            return True
        for f in self.arrays:
            i = int(np.searchsorted(f, x))
            if i < len(f) and f[i] == x:
                return True
        return False


def _fingerprint(h: StepRecord, reqs: Optional[list[ReqDetail]]) -> tuple:
    """Content fingerprint of one record: tells 'the same record' from 'same forward_ct, new server'."""
    rq = frozenset((r.rid if r.rid is not None else f"pool:{r.req_pool_index}", r.req_pool_index, r.prefix_len,
                    r.bonus_token) for r in reqs if r is not None) if reqs else frozenset()
    return _fp(h.forward_ct, h.bs, h.num_verify_tokens, h.budget, h.step_cpu_ms, rq)


def _fp(fct, bs, nvt, budget, step_cpu_ms, rq) -> tuple:
    # order-free (the store keeps no row order within a step) and built from stored columns only
    return (int(fct), int(bs), int(nvt), budget, step_cpu_ms, rq)


def _rids(reqs: Optional[list[ReqDetail]]) -> frozenset:
    if not reqs:
        return frozenset()
    return frozenset(r.rid if r.rid is not None else f"pool:{r.req_pool_index}" for r in reqs if r is not None)


@dataclass
class _Rank:
    slot: int
    watermark: int = -1
    last_fp: Optional[tuple] = None
    last_rids: frozenset = frozenset()


# ---------------------------------------------------------------------------
# validation of one ReqDetail (the exact path; server_info_fast.translate mirrors it on columns)
# ---------------------------------------------------------------------------
def _surv_tol(k: int) -> float:
    # confidence and survival are each rounded to 4 dp after SGLang's float32 cumprod
    return 5e-5 * (k + 2) + 1e-6


def check_req(r: ReqDetail, gamma: int, mode: str) -> Optional[tuple[str, str]]:
    """First problem of one ReqDetail as (sub-field, reason), or None when valid."""
    for name in ("req_pool_index", "prefix_len", "bonus_token"):
        v = getattr(r, name)
        if v < 0:
            return name, f"negative ({v})"
        if v > (INT64_MAX if name == "bonus_token" else INT32_MAX):
            return name, f"{v} too large ({'int64' if name == 'bonus_token' else 'int32'})"
    if not 1 <= r.verify_len <= gamma + 1:
        return "verify_len", f"{r.verify_len} outside [1, gamma+1={gamma + 1}]"
    window = r.verify_len - 1
    if r.correct_drafts < 0:
        return "correct_drafts", f"negative ({r.correct_drafts})"
    if r.correct_drafts > window:
        return "correct_drafts", f"{r.correct_drafts} > window {window} (verify_len-1)"
    if r.acc_len != r.correct_drafts + 1:
        return "acc_len", f"{r.acc_len} != correct_drafts+1 ({r.correct_drafts + 1})"
    if r.cap_trim < 0:
        return "cap_trim", f"negative ({r.cap_trim})"
    if r.correct_drafts + r.cap_trim > gamma:
        return "cap_trim", f"correct_drafts+cap_trim = {r.correct_drafts + r.cap_trim} > gamma {gamma}"
    if mode == "static":
        if r.verify_len != gamma + 1:
            return "verify_len", f"{r.verify_len} != gamma+1 in static mode"
        if r.cap_trim != 0:
            return "cap_trim", f"{r.cap_trim} != 0 in static mode"
    if len(r.draft_tokens) != gamma:
        return "draft_tokens", f"length {len(r.draft_tokens)} != gamma {gamma}"
    for k, t in enumerate(r.draft_tokens):
        if t < 0:
            return f"draft_tokens[{k}]", f"negative token id ({t})"
        if t > INT64_MAX:
            return f"draft_tokens[{k}]", f"token id {t} outside int64"
    if r.rid is not None and not r.rid:
        return "rid", "empty string"
    if r.rid is not None and has_surrogates(r.rid):
        return "rid", f"string with a lone surrogate: '{safe_text(r.rid)[:80]}'"
    conf, surv = r.confidence, r.survival
    if (conf is None) != (surv is None):
        return ("survival" if surv is None else "confidence"), "confidence and survival must come together"
    if conf is not None:
        if len(conf) != gamma:
            return "confidence", f"length {len(conf)} != gamma {gamma}"
        if len(surv) != gamma:
            return "survival", f"length {len(surv)} != gamma {gamma}"
        for k, c in enumerate(conf):
            if not (0.0 <= c <= 1.0):  # NaN fails too
                return f"confidence[{k}]", describe_number(c) if not math.isfinite(c) else f"{c!r} outside [0, 1]"
        prod = 1.0
        prev = 1.0
        for k, s in enumerate(surv):
            if not (0.0 <= s <= 1.0):
                return f"survival[{k}]", describe_number(s) if not math.isfinite(s) else f"{s!r} outside [0, 1]"
            if s > prev:
                return f"survival[{k}]", f"{s!r} > survival[{k - 1}] {prev!r} (must be non-increasing)"
            prod *= conf[k]
            if abs(s - prod) > _surv_tol(k):
                return f"survival[{k}]", f"{s!r} inconsistent with cumprod(confidence) {prod:.6f}"
            prev = s
    return None


# ---------------------------------------------------------------------------
# run metadata
# ---------------------------------------------------------------------------
def _sha256_file(path: Any) -> Optional[str]:
    if not path or not isinstance(path, str) or not os.path.isfile(path):
        return None
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def _started_at(startup_time: Any) -> Optional[datetime]:
    if isinstance(startup_time, (int, float)) and not isinstance(startup_time, bool):
        try:
            return datetime.fromtimestamp(float(startup_time), tz=timezone.utc)
        except (OverflowError, OSError, ValueError):
            return None
    return None


def run_row_from_server_info(
    run_id: str,
    payload: dict,
    server_args: Optional[dict] = None,
    *,
    source: str = "file",
    audit_group: Optional[str] = None,
) -> dict:
    """The ``runs`` row of an SGLang run from a /server_info response, one state, or a bare dump.

    arm = the dump's ``mode``; gamma = its ``gamma``; target/draft model and the
    STS/SPS file hashes come from the server args (``server_args`` overrides what
    the payload carries). Raises ValueError when the payload has no DSpark dump.
    """
    top = payload if isinstance(payload, dict) else {}
    state = top
    if isinstance(top.get("internal_states"), list):
        state = next((s for s in top["internal_states"] if isinstance(s, dict) and "dspark_info_record" in s), {})
    dump = state.get("dspark_info_record", state if "records" in state else None)
    if not isinstance(dump, dict):
        raise ValueError("payload has no dspark_info_record")
    args = {k: top[k] for k in _ARG_KEYS if k in top}
    args.update({k: state[k] for k in _ARG_KEYS if k in state})
    args.update(server_args or {})
    return _run_row(
        run_id,
        mode=dump.get("mode"),
        gamma=dump.get("gamma"),
        vndt=dump.get("verify_num_draft_tokens"),
        components=dump.get("components") or [],
        simulate_acc_len=dump.get("simulate_acc_len"),
        args=args,
        startup_time=top.get("startup_time"),
        source=source,
        audit_group=audit_group,
    )


def _run_row(run_id, *, mode, gamma, vndt, components, simulate_acc_len, args, startup_time, source,
             audit_group=None) -> dict:
    sts_path = args.get("speculative_dspark_confidence_sts_path")
    sps_path = args.get("speculative_dspark_sps_table_path")
    config = {
        "engine": "sglang",
        "mode": mode,
        "gamma": gamma,
        "verify_num_draft_tokens": vndt,
        "components": list(components),
        "simulate_acc_len": simulate_acc_len,
        "startup_time": startup_time,
        "server_args": {k: v for k, v in args.items() if v is not None},
    }
    args = {k: safe_text(v) if isinstance(v, str) else v for k, v in args.items()}
    return {
        "run_id": run_id,
        "arm": mode,
        "engine": "sglang",
        "gamma": gamma,
        "temperature": None,
        "target_model": args.get("model_path"),
        "draft_model": args.get("speculative_draft_model_path"),
        "sts_hash": _sha256_file(sts_path),
        "sps_hash": _sha256_file(sps_path),
        "started_at": _started_at(startup_time),
        "config_json": json.dumps(config, sort_keys=True, default=str),
        "source": source if source in schema.SOURCES else "file",
        "audit_group": audit_group,
    }


# ---------------------------------------------------------------------------
# the ingestor
# ---------------------------------------------------------------------------
class ServerInfoIngestor:
    """Stateful translator of successive /server_info payloads of one run.

    ``feed(payload_dict)``, ``feed_bytes(json_bytes)`` (the live poller) and
    ``feed_source(stream.FileSource(path))`` (files) return an :class:`IngestBatch` holding only
    what is new since the previous call. Documents are read a chunk of records at a time
    (:mod:`acceptscope.ingest.stream`); each chunk takes the one fast path
    (:mod:`acceptscope.ingest.server_info_fast`) or, when that declines, the exact per-record
    path, which names every problem by field. With :attr:`sink` set, each chunk's rows are handed
    to it as soon as they are made, so memory is bounded by a chunk, not by the document.
    """

    def __init__(self, run_id: str, source: str = "live", *, ring_capacity: int = RING_CAPACITY,
                 expected_gamma: Optional[int] = None, expected_arm: Optional[str] = None,
                 server_args: Optional[dict] = None):
        self.run_id = run_id
        self.source = source
        self.ring_capacity = ring_capacity
        self.gamma: Optional[int] = expected_gamma
        self.arm: Optional[str] = expected_arm
        self.server_args = dict(server_args or {})
        self.epoch = 0
        self.ranks: list[_Rank] = []
        self.startup_time: Any = None
        self.run_emitted = False
        self._step_ct: dict[str, int] = {}
        self._pool_prefix: dict[str, int] = {}
        self.polls = 0
        self.use_fast = True  # the vectorised path per chunk; the exact per-record path is the fallback
        # where rows go as they are translated, a chunk at a time (None: all stay in the returned batch);
        # the returned batch keeps the rejects, duplicates and what was not handed over yet
        self.sink: Optional[Callable[[IngestBatch], None]] = None
        self.chunk_bytes = stream.CHUNK_BYTES  # records per chunk, in bytes of JSON (tests make it tiny)

    # -- resuming from a store ---------------------------------------------
    def resume(self, store: Any) -> bool:
        """Continue a run already in ``store``: epoch, per-rank watermarks and fingerprints, rid step counts.

        Without this a second ``acceptscope ingest`` of later polls would start rank slots in
        arrival order again and could file a DP rank's records under another rank's slot.
        Returns False when the store has no steps of this run.
        """
        snapshot = getattr(store, "snapshot", None)
        if snapshot is None:
            return self._resume(store)
        with snapshot():  # one read-only connection for all the queries below (nested connects reuse it)
            return self._resume(store)

    def _resume(self, store: Any) -> bool:
        got = store.query_df(
            "SELECT epoch, rank, max(forward_ct) AS wm FROM steps WHERE run_id = ? AND epoch = "
            "(SELECT max(epoch) FROM steps WHERE run_id = ?) GROUP BY epoch, rank ORDER BY rank",
            [self.run_id, self.run_id])
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
            fp = _fp(int(row.wm), nn(step["bs"], -1), nn(step["num_verify_tokens"], -1),
                     None if budget is None else int(budget), nn(step["step_cpu_ms"]), rq)
            self.ranks.append(_Rank(slot=int(row.rank), watermark=int(row.wm), last_fp=fp,
                                    last_rids=frozenset(r[0] for r in rq)))
        counts = store.query_df(
            "SELECT rid, max(step_index) + 1 AS n, max(prefix_len) AS p FROM request_steps WHERE run_id = ? "
            "AND epoch = ? GROUP BY rid", [self.run_id, self.epoch])
        self._step_ct = {r.rid: int(r.n) for r in counts.itertuples()}
        self._pool_prefix = {r.rid: int(r.p) for r in counts.itertuples() if r.rid.startswith("pool:")}
        runs = store.query_df("SELECT arm, gamma, config_json FROM runs WHERE run_id = ?", [self.run_id])
        if not runs.empty:
            self.run_emitted = True
            self.arm = self.arm or runs["arm"].iloc[0]
            self.gamma = self.gamma or int(runs["gamma"].iloc[0])
            try:
                self.startup_time = json.loads(runs["config_json"].iloc[0]).get("startup_time")
            except (TypeError, ValueError):
                pass
        return True

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
        except _PayloadRejected:
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
            from acceptscope.ingest.jsontext import defuse_deep

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
            top = _dec_top.decode(data)
        except (msgspec.DecodeError, msgspec.ValidationError):
            top = None
        if top is not None:
            batch = IngestBatch()
            try:
                states = self._states_from_raw(top, data, src, line, batch, chunked)
            except _SlowPath:
                states = None
            except _PayloadRejected:
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

    # -- payload shapes -----------------------------------------------------
    def _states_from_obj(self, payload: Any, src: str, line: int, batch: IngestBatch):
        if not isinstance(payload, dict):
            batch.reject(make_reject(src, line, "$", f"expected a JSON object, got {type(payload).__name__}",
                                     payload, self.run_id))
            raise _PayloadRejected
        top_args = {k: payload[k] for k in _ARG_KEYS if k in payload}
        if "internal_states" in payload:
            sts = payload["internal_states"]
            if not isinstance(sts, list):
                batch.reject(make_reject(src, line, "internal_states", "expected a list", sts, self.run_id))
                raise _PayloadRejected
            items = [(i, f"internal_states[{i}]", s) for i, s in enumerate(sts)]
            if not items:
                batch.reject(make_reject(src, line, "internal_states", _empty_states_reason(None), None, self.run_id))
                raise _PayloadRejected
        elif "dspark_info_record" in payload:
            items = [(0, "", payload)]
        elif "records" in payload:
            items = [(0, "", {"dspark_info_record": payload})]
        else:
            batch.reject(make_reject(src, line, "$", "no internal_states / dspark_info_record in payload",
                                     _clip(payload), self.run_id))
            raise _PayloadRejected
        states = []
        for i, prefix, s in items:
            if not isinstance(s, dict):
                batch.reject(make_reject(src, line, prefix or "$", "expected an object", s, self.run_id))
                continue
            dump = s.get("dspark_info_record")
            args = dict(top_args)
            args.update({k: s[k] for k in _ARG_KEYS if k in s})
            st = self._make_state(i, prefix, dump, args, False, src, line, batch)
            if st is not None:
                states.append(st)
        return states, payload.get("startup_time")

    def _states_from_raw(self, top: Any, data: bytes, src: str, line: int, batch: IngestBatch,
                         chunked: Optional[dict] = None):
        """States of a decoded document (records raw; ``chunked``: the records arrays the stream
        scan cut out of it, by :class:`acceptscope.ingest.stream.Scan` key); raises _SlowPath on
        anything irregular."""
        top_args = {k: getattr(top, k) for k in _ARG_KEYS if getattr(top, k) is not None}
        if top.internal_states is not None:
            items = []
            for i, st in enumerate(top.internal_states):
                args = dict(top_args)
                args.update({k: getattr(st, k) for k in _ARG_KEYS if getattr(st, k) is not None})
                items.append((i, f"internal_states[{i}]", st.dspark_info_record, args))
            if not items:
                batch.reject(make_reject(src, line, "internal_states", _empty_states_reason(data), None, self.run_id))
                raise _PayloadRejected
        elif top.dspark_info_record is not None:
            items = [("top", "", top.dspark_info_record, top_args)]
        elif _nr(top.records) is not None:
            try:
                items = [(None, "", _dec_payload.decode(data), top_args)]
            except (msgspec.DecodeError, msgspec.ValidationError):
                raise _SlowPath from None
        else:
            batch.reject(make_reject(src, line, "$", "no internal_states / dspark_info_record in payload",
                                     None, self.run_id))
            raise _PayloadRejected
        states = []
        for key, prefix, dump, args in items:
            s = self._make_state(key if isinstance(key, int) else 0, prefix, dump, args, True, src, line, batch)
            if s is not None:
                if chunked and key in chunked:
                    s.records = chunked[key]
                states.append(s)
        return states

    def _make_state(self, i, prefix, dump, args, is_raw, src, line, batch) -> Optional[_State]:
        """Validate a payload header; return a _State or reject it (whole state)."""
        pfx = (prefix + ".") if prefix else ""
        rej = lambda f, why, raw=None: batch.reject(make_reject(src, line, pfx + f, why, raw, self.run_id))  # noqa: E731
        if dump is None:
            rej("dspark_info_record", "missing (DSpark info dump not enabled: set SGLANG_DSPARK_DEBUG_DUMP)")
            return None
        get = (lambda k: getattr(dump, k)) if is_raw else (lambda k: dump.get(k))
        if not is_raw and not isinstance(dump, dict):
            rej("dspark_info_record", "expected an object", dump)
            return None
        gamma, vndt, mode = get("gamma"), get("verify_num_draft_tokens"), get("mode")
        comps, records, sim = get("components"), get("records"), get("simulate_acc_len")
        # A corrupt payload-level field falls back to what the run (the server's other snapshots,
        # or the store) establishes; the field is rejected, the snapshot's records are kept.
        known = self.gamma
        vndt_ok = _is_int(vndt) and vndt >= 2
        if not _is_int(gamma) or not 1 <= gamma <= _MAX_GAMMA:  # (beyond: a corrupt header, e.g. 2**70)
            shown = _show(gamma)
            if known is None or (vndt_ok and vndt != known + 1):
                rej("gamma", f"expected a positive int up to {_MAX_GAMMA}, got {shown}")
                return None
            rej("gamma", f"expected a positive int up to {_MAX_GAMMA}, got {shown}: using the run's gamma {known}")
            gamma = known
        elif known is not None and gamma != known:
            if not (vndt_ok and vndt == known + 1):
                rej("gamma", f"gamma {gamma} != run {self.run_id!r} gamma {known}")
                return None
            rej("gamma", f"gamma {gamma} != run {self.run_id!r} gamma {known} (verify_num_draft_tokens "
                         f"{vndt} agrees with the run): using {known}")
            gamma = known
        if not _is_int(vndt) or vndt != gamma + 1:
            rej("verify_num_draft_tokens", f"{vndt!r} != gamma+1 ({gamma + 1})" +
                (": using gamma+1" if known is not None else ""))
            if known is None:
                return None
            vndt = gamma + 1
        if mode not in schema.ARMS:
            if self.arm is None:
                rej("mode", f"unknown mode {mode!r} (expected one of {list(schema.ARMS)})")
                return None
            rej("mode", f"unknown mode {mode!r} (expected one of {list(schema.ARMS)}): using the run's "
                        f"mode {self.arm!r}")
            mode = self.arm
        if self.arm is not None and mode != self.arm:
            rej("mode", f"mode {mode!r} != run {self.run_id!r} arm {self.arm!r}")
            return None
        if records is None:
            records = []
        if not isinstance(records, list):
            rej("records", f"expected a list, got {type(records).__name__}")
            return None
        comp_list: list[str] = []
        if comps is not None and not isinstance(comps, list):
            rej("components", f"expected a list, got {comps!r}")
        for k, c in enumerate(comps or []):
            if c not in KNOWN_COMPONENTS:
                rej(f"components[{k}]", f"unknown info-dump component {c!r} (known: {sorted(KNOWN_COMPONENTS)})")
            else:
                comp_list.append(c)
        if sim is not None and not (isinstance(sim, float) and math.isfinite(sim)
                                    or _is_int(sim) and abs(sim) <= INT64_MAX):  # (math.isfinite(10**400) raises)
            rej("simulate_acc_len", f"expected a number or null, got {safe_text(repr(sim))[:80]}"
                if not isinstance(sim, int) or abs(sim) <= INT64_MAX else "integer outside int64")
            sim = None
        self.gamma = gamma
        self.arm = mode
        return _State(i, prefix, gamma, vndt, mode, comp_list, sim, args, records, is_raw)

    # -- matching, gaps, translation ---------------------------------------
    def _ingest(self, states: list[_State], startup: Any, src: str, line: int, batch: IngestBatch) -> None:
        if not states:
            return
        if not self.run_emitted:
            st0 = states[0]
            args = dict(st0.args)
            args.update(self.server_args)
            batch.add("runs", _run_row(self.run_id, mode=st0.mode, gamma=st0.gamma, vndt=st0.vndt,
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
        assignment: dict[int, _Rank] = {}
        if not restart and self.ranks:
            assignment, restart = self._match(states, same_server)
        if restart:
            old = self.ranks
            self.epoch += 1
            self.ranks = []
            self._step_ct.clear()
            self._pool_prefix.clear()
            for k, s in enumerate(states):
                r = _Rank(slot=k)
                self.ranks.append(r)
                assignment[id(s)] = r
                first = self._first_fct(s)
                prev = old[k].watermark if k < len(old) else -1
                batch.add("gaps", {
                    "run_id": self.run_id, "rank": k, "epoch": self.epoch,
                    "from_forward_ct": max(prev, 0), "to_forward_ct": first if first is not None else 0,
                    "kind": "restart",
                    "detail": f"server restarted (epoch {self.epoch - 1} -> {self.epoch}); "
                              f"previous watermark forward_ct={prev}",
                })
        else:
            for s in states:
                if id(s) not in assignment:
                    r = _Rank(slot=len(self.ranks))
                    self.ranks.append(r)
                    assignment[id(s)] = r
        for s in states:
            rank = assignment[id(s)]
            self._ingest_state(s, rank, src, line, batch)
            s.release()

    def _flush(self, cols: "_Columns", batch: IngestBatch) -> None:
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

    def _first_fct(self, s: _State) -> Optional[int]:
        for j in range(len(s.records)):
            try:
                return s.fct(j)
            except (msgspec.DecodeError, msgspec.ValidationError):
                continue
        return None

    def _safe_fct(self, s: _State, j: int) -> Optional[int]:
        try:
            return s.fct(j)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def _find_fct(self, s: _State, target: int) -> Optional[int]:
        """Index of the record with forward_ct == target (bisect over the ring order), else None."""
        lo, hi = 0, len(s.records)
        while lo < hi:
            mid = (lo + hi) // 2
            f = self._safe_fct(s, mid)
            if f is None:
                # unreadable record in the way: fall back to a scan
                for j in range(len(s.records)):
                    if self._safe_fct(s, j) == target:
                        return j
                return None
            if f < target:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(s.records) and self._safe_fct(s, lo) == target:
            return lo
        return None

    def _record_fp(self, s: _State, j: int) -> Optional[tuple]:
        try:
            h = s.header(j)
            reqs, _ = self._decode_reqs(s, j, h, None, "", 0)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None
        return _fingerprint(h, reqs)

    def _match(self, states: list[_State], same_server: bool = False) -> tuple[dict[int, _Rank], bool]:
        """Assign each state to the rank it continues; report a restart when one cannot be.

        ``same_server`` (the payload's ``startup_time`` is the known one): a state older than
        every watermark is a replayed earlier poll, not a restart; its records are duplicates.
        """
        assignment: dict[int, _Rank] = {}
        free = list(self.ranks)
        pending = []
        # 1) strong: the state still holds the rank's watermark record, unchanged
        for s in states:
            hit = None
            for r in free:
                if r.watermark < 0:
                    continue
                j = self._find_fct(s, r.watermark)
                if j is not None and self._record_fp(s, j) == r.last_fp:
                    hit = r
                    break
            if hit is not None:
                assignment[id(s)] = hit
                free.remove(hit)
            else:
                pending.append(s)
        # 2) continuation after a clear/overflow: every record newer than the watermark; rid overlap
        restart = False
        for s in pending:
            first = self._first_fct(s)
            cands = [r for r in free if first is None or first > r.watermark]
            if not cands and same_server and s.records:
                last = self._safe_fct(s, len(s.records) - 1)  # an older snapshot replayed: all duplicates
                cands = sorted((r for r in free if last is not None and last <= r.watermark), key=lambda r: r.slot)
            if not cands:
                restart = True  # forward_ct went backwards (or same ct, different content)
                break
            if len(cands) > 1 and first is not None:
                j0 = next(j for j in range(len(s.records)) if self._safe_fct(s, j) == first)
                try:
                    reqs, _ = self._decode_reqs(s, j0, s.header(j0), None, "", 0)
                except (msgspec.DecodeError, msgspec.ValidationError):
                    reqs = None
                rids = _rids(reqs)
                cands.sort(key=lambda r: (-len(rids & r.last_rids), r.slot))
            assignment[id(s)] = cands[0]
            free.remove(cands[0])
        return assignment, restart

    # -- one state --------------------------------------------------------
    def _decode_reqs(self, s: _State, j: int, h: Any, batch: Optional[IngestBatch], src: str, line: int):
        """Decode record j's ReqDetail list; per-element rejects on bad items. Returns (reqs, bad_idx)."""
        raw = _nr(h.reqs) if s.is_raw else h.reqs
        if raw is None:
            return None, []
        if s.is_raw:
            try:
                return _dec_reqs.decode(raw), []
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
            items = _dec_raw_list.decode(raw)  # the record decoded, so this is valid JSON
            conv = _dec_req.decode
        else:
            if not isinstance(raw, list):
                raise msgspec.ValidationError(f"Expected `array | null`, got `{type(raw).__name__}` - at `$.reqs`")
            try:
                return msgspec.convert(raw, list[ReqDetail]), []
            except (msgspec.ValidationError, UnicodeEncodeError):
                pass
            items = raw
            conv = lambda x: _convert_checked(x, ReqDetail)  # noqa: E731
        out: list[Optional[ReqDetail]] = []
        bad = []
        for k, it in enumerate(items):
            try:
                out.append(conv(it))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                out.append(None)
                bad.append(k)
                if batch is not None:
                    path, why = msgspec_error_path(e)
                    field_ = join_path(f"{s.prefix + '.' if s.prefix else ''}records[{j}].reqs[{k}]", path)
                    batch.reject(make_reject(src, line, field_, why, it, self.run_id))
        return out, bad

    def _ingest_state(self, s: _State, rank: _Rank, src: str, line: int, batch: IngestBatch) -> None:
        n = len(s.records)
        if n == 0:
            return
        w = rank.watermark
        # first index with forward_ct > watermark (ring is in forward_ct order)
        start = 0
        if w >= 0:
            j = self._find_fct(s, w)
            if j is not None:
                start = j + 1
            else:
                lo, hi = 0, n
                ok = True
                while lo < hi:
                    mid = (lo + hi) // 2
                    f = self._safe_fct(s, mid)
                    if f is None:
                        ok = False
                        break
                    if f <= w:
                        lo = mid + 1
                    else:
                        hi = mid
                start = lo if ok else 0
                first_new = self._first_fct_from(s, start)
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
            batch.note_duplicates("request_steps", self._count_reqs(s, 0, start))
        # chunk by chunk: the fast path, else the exact one; rows leave through _flush as they are made
        seen = _Seen()
        last: Any = None  # the last record translated: its index (fast) or (header, reqs) (exact)
        for a, b in s.ranges(start, n):
            cols = _Columns()
            got = self.use_fast and self._fast_range(s, rank, a, b, seen, src, line, batch, cols)
            if got:
                last = b - 1
            else:
                last = self._exact_range(s, rank, a, b, w, seen, src, line, batch, cols) or last
            self._flush(cols, batch)
        if isinstance(last, int):
            try:
                h = s.header(last)
                reqs, _ = self._decode_reqs(s, last, h, None, "", 0)
            except (msgspec.DecodeError, msgspec.ValidationError):
                h, reqs = None, None
            rank.watermark = seen.max
            rank.last_fp = _fingerprint(h, reqs) if h is not None else None
            rank.last_rids = _rids(reqs)
        elif last is not None:
            h, reqs = last
            rank.watermark = h.forward_ct
            rank.last_fp = _fingerprint(h, reqs)
            rank.last_rids = _rids(reqs)

    def _exact_range(self, s: _State, rank: _Rank, a: int, b: int, w: int, seen: _Seen, src: str, line: int,
                     batch: IngestBatch, cols: "_Columns") -> Optional[tuple]:
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
                batch.note_duplicates("request_steps", self._count_reqs(s, j, j + 1))
                continue
            if fct in seen:
                batch.reject(make_reject(src, line, where + ".forward_ct", f"duplicate record for forward_ct {fct}",
                                         s.records[j], self.run_id))
                continue
            seen.add(fct)
            try:
                reqs, _bad = self._decode_reqs(s, j, h, batch, src, line)
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                path, why = msgspec_error_path(e)
                batch.reject(make_reject(src, line, join_path(where, path), why, s.records[j], self.run_id))
                reqs = None
            step_problem = _check_step(h, s, reqs)
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

    def _fast_range(self, s: _State, rank: _Rank, a: int, b: int, seen: _Seen, src: str, line: int,
                    batch: IngestBatch, cols: "_Columns") -> bool:
        """Translate records[a:b] on the vectorised path; False (nothing done) to fall back."""
        try:
            recs = _dec_chunk.decode(s.range_json(a, b))
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
                                             self._item(s, j, k), self.run_id))
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

    def _item(self, s: _State, j: int, k: int) -> Any:
        if s.is_raw:
            return bytes(_dec_raw_list.decode(_nr(s.header(j).reqs))[k])
        return s.header(j).reqs[k]

    def _explain(self, s: _State, j: int, k: int) -> Optional[tuple[str, str, Any]]:
        """Why ReqDetail k of record j is invalid: (sub-path, reason, raw), or None if it is valid."""
        try:
            item = self._item(s, j, k)
            r = _dec_req.decode(item) if s.is_raw else msgspec.convert(item, ReqDetail)
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
        ct = self._step_ct
        missing = np.flatnonzero(fast._np(pc_is_null(rid_arr))) if rid_arr.null_count else np.zeros(0, np.int64)
        if len(missing):
            pool = fast._np(one_array(reqs.column("req_pool_index")).take(pa.array(kept_idx[missing])))
            prefix = fast._np(one_array(reqs.column("prefix_len")).take(pa.array(kept_idx[missing])))
            filled = rid_arr.to_pylist()
            for q, pidx, pl in zip(missing, pool, prefix):
                rid = f"pool:{int(pidx)}"
                last = self._pool_prefix.get(rid)
                if last is not None and pl < last:
                    ct[rid] = 0
                self._pool_prefix[rid] = int(pl)
                i = ct.get(rid, 0)
                ct[rid] = i + 1
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
            base = np.fromiter((ct.get(u, 0) for u in uniq), dtype=np.int64, count=len(uniq))
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
            ct.update(zip(uniq, (base + totals).tolist()))  # (python ints; no numpy scalar per rid)
        return rid_arr, step_index

    def _count_reqs(self, s: _State, lo: int, hi: int) -> int:
        """ReqDetails in records[lo:hi] without decoding them (for the duplicates tally), a chunk at a time."""
        if not s.is_raw:
            return sum(len(r.get("reqs") or []) for r in s.records[lo:hi] if isinstance(r, dict))
        return sum(s.range_json(a, b).count(b'"req_pool_index"') for a, b in s.ranges(lo, hi))

    def _first_fct_from(self, s: _State, start: int) -> Optional[int]:
        for j in range(start, len(s.records)):
            f = self._safe_fct(s, j)
            if f is not None:
                return f
        return None

    def _add_reqs(self, s, rank, rec_meta, req_all, req_pos, src, line, batch, cols) -> None:
        gamma = s.gamma
        pfx = f"{s.prefix}." if s.prefix else ""
        ct = self._step_ct
        pool_prefix = self._pool_prefix
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
                if rid is None:
                    rid = f"pool:{r.req_pool_index}"
                    last = pool_prefix.get(rid)
                    if last is not None and r.prefix_len < last:
                        ct[rid] = 0
                    pool_prefix[rid] = r.prefix_len
                if rid in seen:
                    k = req_pos[q][1]
                    batch.reject(make_reject(src, line, f"{pfx}records[{j}].reqs[{k}].rid",
                                             f"duplicate rid {rid!r} in one step", msgspec.to_builtins(r), self.run_id))
                    continue
                seen.add(rid)
                i = ct.get(rid, 0)
                ct[rid] = i + 1
                keep.append(r)
                rids.append(rid)
                fcts.append(h.forward_ct)
                step_idx.append(i)
        if keep:
            cols.add_reqs(rank.slot, fcts, s.mode, gamma, keep, rids, step_idx)


def _check_step(h: StepRecord, s: _State, reqs: Optional[list]) -> Optional[tuple[str, str]]:
    """First problem of a step header as (field, reason), or None."""
    if h.mode and h.mode != s.mode:
        return "mode", f"record mode {h.mode!r} != payload mode {s.mode!r}"
    for f in _SENTINEL_FIELDS:
        v = getattr(h, f)
        if v < -1:
            return f, f"negative ({v}); -1 is the only sentinel"
        if v > INT32_MAX:
            return f, f"{v} too large (int32)"
    for f in ("budget", "lag_steps"):
        v = getattr(h, f)
        if v is not None and v < 0:
            return f, f"negative ({v})"
        if v is not None and v > INT32_MAX:
            return f, f"{v} too large (int32)"
    for f in _TIME_FIELDS + ("predicted_step_ms",):
        v = getattr(h, f)
        if v is not None and not (math.isfinite(v) and v >= 0):
            return f, describe_number(v) if not math.isfinite(v) else f"negative ({v})"
    if h.predicted_theta is not None and not math.isfinite(h.predicted_theta):
        return "predicted_theta", describe_number(h.predicted_theta)
    if h.bs >= 0 and h.num_running_reqs >= 0 and h.bs != h.num_running_reqs:
        return "num_running_reqs", f"{h.num_running_reqs} != bs {h.bs}"
    if reqs is not None and h.bs >= 0 and len(reqs) != h.bs:
        return "bs", f"bs {h.bs} != len(reqs) {len(reqs)}"
    return None


# ---------------------------------------------------------------------------
# columnar accumulation (no per-row dicts)
# ---------------------------------------------------------------------------
def _none_if_sentinel(v: int) -> Optional[int]:
    return None if v == -1 else v


class _Columns:
    def __init__(self) -> None:
        self.step_rank: list[int] = []
        self.steps: list[StepRecord] = []
        self.req_rank: list[int] = []
        self.req_fct: list[int] = []
        self.req_mode: list[str] = []
        self.reqs: list[ReqDetail] = []
        self.rids: list[str] = []
        self.step_idx: list[int] = []
        self.gamma = 0
        self.fast_steps: list[pa.Table] = []
        self.fast_reqs: list[pa.Table] = []

    @property
    def n_steps(self) -> int:
        return len(self.steps)

    @property
    def n_reqs(self) -> int:
        return len(self.reqs)

    def add_step(self, rank: int, h: StepRecord) -> None:
        self.step_rank.append(rank)
        self.steps.append(h)

    def add_reqs(self, rank, fcts, mode, gamma, keep, rids, step_idx) -> None:
        m = len(keep)
        self.req_rank.extend([rank] * m)
        self.req_fct.extend(fcts)
        self.req_mode.extend([mode] * m)
        self.reqs.extend(keep)
        self.rids.extend(rids)
        self.step_idx.extend(step_idx)
        self.gamma = gamma

    def steps_table(self, run_id: str, epoch: int) -> pa.Table:
        st = self.steps
        n = len(st)
        cols: dict[str, Any] = {
            "run_id": pa.array([run_id] * n, pa.string()),
            "rank": self.step_rank,
            "epoch": pa.array(np.full(n, epoch, dtype=np.int32)),
            "forward_ct": [h.forward_ct for h in st],
            "mode": [h.mode or None for h in st],
        }
        for f in _SENTINEL_FIELDS:
            cols[f] = [_none_if_sentinel(getattr(h, f)) for h in st]
        for f in ("budget", "lag_steps", "predicted_step_ms", "predicted_theta") + _TIME_FIELDS:
            cols[f] = [getattr(h, f) for h in st]
        return table_from_columns("steps", cols, n)

    def reqs_table(self, run_id: str, epoch: int) -> pa.Table:
        rq = self.reqs
        n = len(rq)
        g = self.gamma
        vlen = np.fromiter((r.verify_len for r in rq), dtype=np.int32, count=n)
        cd = np.fromiter((r.correct_drafts for r in rq), dtype=np.int32, count=n)
        ct = np.fromiter((r.cap_trim for r in rq), dtype=np.int32, count=n)
        mode = self.req_mode
        cap = np.fromiter((m == "cap-accept" for m in mode), dtype=bool, count=n)
        static = np.fromiter((m == "static" for m in mode), dtype=bool, count=n)
        ceiling = np.where(cap, cd + ct, cd)
        ceiling_mask = ~(cap | static)
        gamma_offsets = pa.array(np.arange(0, (n + 1) * g, g, dtype=np.int32))
        drafts = pa.ListArray.from_arrays(
            gamma_offsets,
            pa.array(np.fromiter(chain.from_iterable(r.draft_tokens for r in rq), dtype=np.int64, count=n * g)),
        )
        conf = _optional_f32_lists([r.confidence for r in rq], g)
        surv = _optional_f32_lists([r.survival for r in rq], g)
        # committed = drafts[:cd] + [bonus]
        lens = cd.astype(np.int64) + 1
        offs = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(lens, out=offs[1:])
        committed_vals = np.fromiter(
            chain.from_iterable(r.draft_tokens[: r.correct_drafts] + [r.bonus_token] for r in rq),
            dtype=np.int64, count=int(offs[-1]),
        )
        committed = pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), pa.array(committed_vals))
        cols = {
            "run_id": pa.array([run_id] * n, pa.string()),
            "rank": pa.array(np.asarray(self.req_rank, dtype=np.int32)),
            "epoch": pa.array(np.full(n, epoch, dtype=np.int32)),
            "forward_ct": pa.array(np.asarray(self.req_fct, dtype=np.int64)),
            "rid": pa.array(self.rids, pa.string()),
            "req_pool_index": pa.array(np.fromiter((r.req_pool_index for r in rq), dtype=np.int64, count=n)).cast(pa.int32()),
            "step_index": pa.array(np.asarray(self.step_idx, dtype=np.int32)),
            "prefix_len": pa.array(np.fromiter((r.prefix_len for r in rq), dtype=np.int64, count=n)).cast(pa.int32()),
            "verify_len": pa.array(vlen),
            "window": pa.array(vlen - 1),
            "correct_drafts": pa.array(cd),
            "acc_len": pa.array(np.fromiter((r.acc_len for r in rq), dtype=np.int32, count=n)),
            "cap_trim": pa.array(ct),
            "bonus_token": pa.array(np.fromiter((r.bonus_token for r in rq), dtype=np.int64, count=n)),
            "draft_tokens": drafts,
            "confidence": conf,
            "survival": surv,
            "committed_tokens": committed,
            "ceiling": pa.array(ceiling.astype(np.int32), mask=ceiling_mask),
        }
        return table_from_columns("request_steps", cols, n)


def _optional_f32_lists(rows: list[Optional[list[float]]], g: int) -> pa.Array:
    """Fixed-length (g) float lists, some NULL, as an Arrow list<float32> without per-row objects."""
    n = len(rows)
    present = np.fromiter((r is not None for r in rows), dtype=bool, count=n)
    k = int(present.sum())
    if k == 0:
        return pa.nulls(n, schema.F32_LIST)
    vals = np.fromiter(chain.from_iterable(r for r in rows if r is not None), dtype=np.float32, count=k * g)
    offs = np.zeros(n + 1, dtype=np.int32)
    np.cumsum(present.astype(np.int32) * g, out=offs[1:])
    mask = None if k == n else pa.array(~present)
    return pa.ListArray.from_arrays(pa.array(offs), pa.array(vals), mask=mask)


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _clip(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: ("..." if isinstance(v, (list, dict)) else v) for k, v in list(obj.items())[:20]}
    return obj


def _convert_checked(item: Any, typ: Any, skip: Optional[str] = None) -> Any:
    """``msgspec.convert`` of a decoded (lenient-path) record, with a poisoned value (an int beyond
    int64, a lone surrogate, deep nesting) raised as the ValidationError of its field, as msgspec
    words one; ``skip``: a key checked elsewhere (a record's ``reqs``, checked per request)."""
    from acceptscope.ingest.rejects import find_poison

    if isinstance(item, dict):
        p = find_poison({k: v for k, v in item.items() if k != skip} if skip else item)
        if p is not None:
            path = p[0] if p[0] == "$" else ("$" + p[0] if p[0].startswith("[") else "$." + p[0])
            raise msgspec.ValidationError(f"{p[1]} - at `{path}`")
    try:
        return msgspec.convert(item, typ)
    except UnicodeEncodeError as e:  # (msgspec cannot even word the error of a surrogate)
        raise msgspec.ValidationError(f"string with a lone surrogate ({e.reason}) - at `$`") from None


def _show(v: Any) -> str:
    """repr of a header value for a reject; an int past int64 as such (its repr may not even exist)."""
    if _is_int(v) and abs(v) > INT64_MAX:
        return "an integer outside int64"
    try:
        return safe_text(repr(v))[:120]
    except (ValueError, RecursionError):
        return f"a {type(v).__name__}"


def _empty_states_reason(data: Optional[bytes]) -> str:
    why = _EMPTY_STATES
    if data is not None and data.count(b'"internal_states"') > 1:
        why += ("; the document repeats the top-level key 'internal_states' and JSON decoders keep the last "
                "(empty) one")
    return why


class _PayloadRejected(Exception):
    pass


class _SlowPath(Exception):
    pass
