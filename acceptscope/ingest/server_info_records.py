"""What a ``/server_info`` document holds, as msgspec types, and one rank's records read through them.

Why one module: the fast path (a chunk of records in one typed pass, per-position lists kept raw)
and the exact fallback (one record at a time, every problem named by field) decode the same SGLang
0.5.23 structs (``ReqDetail``, ``DecodeStepRecord`` with ``omit_defaults``: an absent field is its
default); :class:`State` is a rank's records (held, or read a chunk at a time from the file) with
the record lookups the watermark and rank matching need.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Optional, Sequence

import msgspec

from acceptscope.ingest import stream
from acceptscope.ingest.rejects import find_poison

__all__ = ["ReqDetail", "StepRecord", "ReqRawLists", "State", "ARG_KEYS", "SENTINEL_FIELDS", "TIME_FIELDS",
           "TOP_DECODER", "PAYLOAD_DECODER", "CHUNK_DECODER", "loads_lenient", "convert_checked", "null_raw"]

SENTINEL_FIELDS = (
    "bs",
    "num_running_reqs",
    "num_verify_tokens",
    "verify_tokens_local",
    "verify_tokens_dp_synced",
    "verify_tokens_graph_key",
)
TIME_FIELDS = ("step_cpu_ms", "step_gpu_ms", "draft_gpu_ms", "target_verify_gpu_ms")
# Server args worth keeping in runs.config_json (others are noise for an audit).
ARG_KEYS = (
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


class _StepRecordObj(StepRecord):
    """A record of the exact fallback: its ``reqs`` left as builtins, each ReqDetail converted on its own."""

    reqs: Any = None



class ReqRawLists(msgspec.Struct, gc=False):
    """ReqDetail with its per-position lists kept as raw JSON text."""

    req_pool_index: int
    prefix_len: int
    verify_len: int
    acc_len: int
    correct_drafts: int
    cap_trim: int
    bonus_token: int
    draft_tokens: msgspec.Raw
    rid: Optional[str] = None
    confidence: msgspec.Raw = None  # type: ignore[assignment]
    survival: msgspec.Raw = None  # type: ignore[assignment]


class _StepRecordTyped(StepRecord, gc=False):
    """A record of the fast path: header exactly as ``StepRecord`` (so a record the exact path would
    refuse fails the chunk's decode), ReqDetails with their per-position lists kept raw for
    :func:`acceptscope.ingest.server_info_columns.records_table`."""

    reqs: Optional[list[ReqRawLists]] = None


class _RawReqs(msgspec.Struct):
    """A record's ReqDetails as their JSON texts (only to quote one in a reject)."""

    reqs: Optional[list[msgspec.Raw]] = None


_dec_raw_reqs = msgspec.json.Decoder(_RawReqs)
_ARG_FIELDS = [(k, Any, None) for k in ARG_KEYS]


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
    state = msgspec.defstruct("_State", [("dspark_info_record", Optional[payload], None)] + _ARG_FIELDS)
    top = msgspec.defstruct(
        "_Top",
        [
            ("internal_states", Optional[list[state]], None),
            ("startup_time", Any, None),
            ("dspark_info_record", Optional[payload], None),
            ("records", msgspec.Raw, None),
        ]
        + [f for f in _ARG_FIELDS if f[0] != "version"]
        + [("version", Any, None)],
    )
    return top, payload


# The document (a skeleton, or the whole of an irregular one) decodes with its records raw; the fast path
# decodes a chunk of records in one typed pass, the exact fallback one record at a time (:meth:`State.obj`).
_TopRaw, _PayloadRaw = _document_structs()
TOP_DECODER = msgspec.json.Decoder(_TopRaw)
PAYLOAD_DECODER = msgspec.json.Decoder(_PayloadRaw)
CHUNK_DECODER = msgspec.json.Decoder(list[_StepRecordTyped])


def null_raw(raw: Any) -> Any:
    """A decoded ``msgspec.Raw`` holding JSON null -> None."""
    if raw is None or (isinstance(raw, msgspec.Raw) and len(raw) == 4 and bytes(raw) == b"null"):
        return None
    return raw



def loads_lenient(data: bytes | str) -> Any:
    """Parse JSON accepting NaN/Infinity tokens (Python's json), for the slow path."""
    return json.loads(data)


def convert_checked(item: Any, typ: Any, skip: Optional[str] = None) -> Any:
    """``msgspec.convert`` of a decoded (lenient-path) record, with a poisoned value (an int beyond
    int64, a lone surrogate, deep nesting) raised as the ValidationError of its field, as msgspec
    words one; ``skip``: a key checked elsewhere (a record's ``reqs``, checked per request)."""
    if isinstance(item, dict):
        p = find_poison({k: v for k, v in item.items() if k != skip} if skip else item)
        if p is not None:
            path = p[0] if p[0] == "$" else ("$" + p[0] if p[0].startswith("[") else "$." + p[0])
            raise msgspec.ValidationError(f"{p[1]} - at `{path}`")
    try:
        return msgspec.convert(item, typ)
    except UnicodeEncodeError as e:  # (msgspec cannot even word the error of a surrogate)
        raise msgspec.ValidationError(f"string with a lone surrogate ({e.reason}) - at `$`") from None



@dataclass
class State:
    """One rank's dump: its payload header and its records (raw JSON items or builtins), decoded on demand."""

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
            h = convert_checked(self.obj(j), _StepRecordObj, skip="reqs")
            if len(self._headers) > 100_000:
                self._headers.clear()
            self._headers[j] = h
        return h

    def fct(self, j: int) -> int:
        return self.header(j).forward_ct

    def safe_fct(self, j: int) -> Optional[int]:
        try:
            return self.fct(j)
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def first_fct(self, start: int = 0) -> Optional[int]:
        """forward_ct of the first readable record from ``start`` on."""
        for j in range(start, len(self.records)):
            f = self.safe_fct(j)
            if f is not None:
                return f
        return None

    def find_fct(self, target: int) -> Optional[int]:
        """Index of the record with forward_ct == target (bisect over the ring order), else None."""
        lo, hi = 0, len(self.records)
        while lo < hi:
            mid = (lo + hi) // 2
            f = self.safe_fct(mid)
            if f is None:
                # unreadable record in the way: fall back to a scan
                for j in range(len(self.records)):
                    if self.safe_fct(j) == target:
                        return j
                return None
            if f < target:
                lo = mid + 1
            else:
                hi = mid
        if lo < len(self.records) and self.safe_fct(lo) == target:
            return lo
        return None

    def obj(self, j: int) -> Any:
        """Record j as builtins, the exact fallback's one reading: a raw item is parsed leniently (``NaN``
        survives to be named by its field); raises msgspec.DecodeError when it is not JSON at all."""
        item = self.records[j]
        if not isinstance(item, (msgspec.Raw, bytes, bytearray)):
            return item
        try:
            return loads_lenient(bytes(item))
        except (ValueError, RecursionError) as e:  # (JSONDecodeError and UnicodeDecodeError are ValueErrors)
            raise msgspec.DecodeError(f"malformed record: {type(e).__name__}: {e}") from None

    def decode_reqs(self, j: int, h: Any, reject: Optional[Callable[[int, Exception, Any], None]] = None):
        """Record j's ReqDetail list as (reqs, bad positions); an item that does not convert is None in it and
        is handed to ``reject(k, error, item)``. Raises msgspec.ValidationError when ``reqs`` is not a list."""
        raw = h.reqs
        if raw is None:
            return None, []
        if not isinstance(raw, list):
            raise msgspec.ValidationError(f"Expected `array | null`, got `{type(raw).__name__}` - at `$.reqs`")
        try:
            return msgspec.convert(raw, list[ReqDetail]), []
        except (msgspec.ValidationError, UnicodeEncodeError):
            pass
        out: list[Optional[ReqDetail]] = []
        bad = []
        for k, it in enumerate(raw):
            try:
                out.append(convert_checked(it, ReqDetail))
            except (msgspec.DecodeError, msgspec.ValidationError) as e:
                out.append(None)
                bad.append(k)
                if reject is not None:
                    reject(k, e, it)
        return out, bad

    def reqs_or_none(self, j: int) -> Optional[list]:
        """Record j's ReqDetails (for fingerprints and rid overlap), None when they do not decode."""
        try:
            return self.decode_reqs(j, self.header(j))[0]
        except (msgspec.DecodeError, msgspec.ValidationError):
            return None

    def convert_req(self, item: Any) -> ReqDetail:
        """One ReqDetail item (builtins) as the struct; raises msgspec.ValidationError."""
        return convert_checked(item, ReqDetail)

    def item(self, j: int, k: int) -> Any:
        """ReqDetail k of record j for a reject's ``raw``: its text as it came when the record is JSON text
        (located by a raw-list decode, not parsed), else the builtins."""
        it = self.records[j]
        if isinstance(it, (msgspec.Raw, bytes, bytearray)):
            try:
                reqs = _dec_raw_reqs.decode(it).reqs
                if reqs is not None and 0 <= k < len(reqs):
                    return bytes(reqs[k])
            except (msgspec.DecodeError, msgspec.ValidationError):
                pass
        return self.header(j).reqs[k]

    def count_reqs(self, lo: int, hi: int) -> int:
        """ReqDetails in records[lo:hi] without decoding them (for the duplicates tally), a chunk at a time."""
        if not self.is_raw:
            return sum(len(r.get("reqs") or []) for r in self.records[lo:hi] if isinstance(r, dict))
        return sum(self.range_json(a, b).count(b'"req_pool_index"') for a, b in self.ranges(lo, hi))
