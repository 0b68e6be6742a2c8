"""Typed msgspec decode of info-dump records straight into Arrow columns.

Why: the ring holds ~30 numbers per request-step; building one Python object per
number is slow (msgspec into typed lists: ~2.4 s for the bench dump's records vs
~0.3 s with the lists kept raw, before any number is parsed). Here msgspec
decodes every record into small ``gc=False`` structs whose per-position lists
(``draft_tokens``, ``confidence``, ``survival``) stay as ``msgspec.Raw`` JSON
text; those texts are then joined into one (mutable) buffer and parsed by
Arrow's number parser (``cast(string -> int64/float64)``) in a single vectorised
pass: every byte that is not part of a number (``[ , ]``, whitespace) is
overwritten with ``'0'``, in place, and becomes a leading zero of the next
number, so token boundaries are the only thing numpy has to find (compact
arrays: one scan for the commas; the row boundaries follow from the '[' scan).

The structs come either from :func:`decode_records` (one record line at a time)
or, for whole documents, from ``server_info``'s single typed pass over the
bytes (``ReqRawLists`` inside its records); :func:`records_table` turns
either into columns.

The result has exactly the shape of :func:`server_info_arrow.read_records`
(``RECORD_SCHEMA``), so the vectorised validation in
:func:`server_info_arrow.translate` is shared. Anything unusual (a type
error, a null inside a list, nested lists, strings, a number Arrow cannot
parse) returns None and the caller falls back to the Arrow JSON reader and,
from there, to the exact per-record path; so this module never decides
whether input is valid, it only declines inputs it cannot represent exactly.

Measured (bench/ingest.py, one pinned core, CPU seconds, best of 3): on a cold
204,800 request-step dump the whole parse with this path (document typed pass +
:func:`records_table` + translate) takes 0.77-0.97 s against 1.27-1.29 s with
Arrow's JSON reader (ours-parse vs ours-parse-arrowjson, x1.32-1.67 over two runs
on a shared box; before the in-place tokenizer and the per-field int reads:
1.27-1.46 s, x1.17-1.24); per list column the compact tokenizer + Arrow's number
parser take ~45-50 ms per 100k request-steps (warm; was ~65-75 ms with a copy of
the buffer and a scan for every ']'). For a 5-record slice it costs ~1 ms more per
call (fixed numpy/Arrow overheads).
"""

from __future__ import annotations

from itertools import chain
from operator import attrgetter
from typing import Any, Optional, Sequence

import msgspec
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope.ingest.server_info_arrow import OPT_INTS, RECORD_SCHEMA, REQ_TYPE, SENTINELS, TIMES

__all__ = ["decode_records", "records_table", "parse_number_lists", "ReqRawLists"]


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


class _Rec(msgspec.Struct, gc=False):
    """DecodeStepRecord with absent fields as None (the Arrow reader's nulls; translate maps sentinels)."""

    forward_ct: int
    mode: Optional[str] = None
    bs: Optional[int] = None
    num_running_reqs: Optional[int] = None
    num_verify_tokens: Optional[int] = None
    verify_tokens_local: Optional[int] = None
    verify_tokens_dp_synced: Optional[int] = None
    verify_tokens_graph_key: Optional[int] = None
    budget: Optional[int] = None
    lag_steps: Optional[int] = None
    step_cpu_ms: Optional[float] = None
    step_gpu_ms: Optional[float] = None
    draft_gpu_ms: Optional[float] = None
    target_verify_gpu_ms: Optional[float] = None
    predicted_step_ms: Optional[float] = None
    predicted_theta: Optional[float] = None
    reqs: Optional[list[ReqRawLists]] = None


_dec_rec = msgspec.json.Decoder(_Rec)
_INTS = ("req_pool_index", "prefix_len", "verify_len", "acc_len", "correct_drafts", "cap_trim", "bonus_token")


def parse_number_lists(raws: list, value_type: pa.DataType, nullable: bool = True) -> Optional[pa.Array]:
    """JSON arrays of numbers (raw texts; None = NULL row) -> ``list<value_type>``; None if unsure.

    The texts are valid JSON (msgspec validated them as ``Raw``); this declines
    anything but flat arrays of plain numbers (a JSON ``null`` included: the
    slower paths name it). ``nullable=False`` skips the scan for None rows.
    """
    n = len(raws)
    nnull = raws.count(None) if nullable else 0  # (a required field is never None)
    if nnull == n:
        return pa.nulls(n, pa.list_(value_type))
    valid = None
    if nnull:
        valid = np.fromiter((r is not None for r in raws), dtype=bool, count=n)
        present = [r for r in raws if r is not None]
    else:
        present = raws
    # a bytearray: the compact tokenizer overwrites the separators in place (no copy of the buffer)
    buf = bytearray().join(present)
    nvalid = n - nnull
    if len(buf) >= 2**31 - 1:
        return None
    a = np.frombuffer(buf, dtype=np.uint8)
    # flat arrays only (also declines a JSON null, a bare number, a nested list): nvalid '[' in all,
    # the buffer opens with '[' and ends with ']', and every other '[' directly follows a ']'
    # (in valid JSON a nested '[' follows '[', ',' or whitespace, a row's first byte follows its
    # predecessor's last), so each row holds exactly one '[' and opens with it
    opens = np.flatnonzero(a == 91)
    if len(opens) != nvalid or opens[0] != 0 or a[-1] != 93 or (a[opens[1:] - 1] != 93).any():
        return None
    # compact JSON first (what SGLang writes): every number ends at a ',' or at a row's closing ']' that
    # does not close an empty list. Arrow's number parser then checks every token: a space, an exponent
    # in an int column, a string, true/false/null all fail the cast (a token must be digits, sign, '.',
    # exponent)
    parsed = _cast_tokens(_compact_tokens(a, opens), value_type)
    if parsed is None:  # whitespace (pretty-printed) or exponents in an int column: the general tokenizer
        a = np.frombuffer(b"".join(present), dtype=np.uint8)  # (the compact pass overwrote buf)
        spaced = _spaced_tokens(a, nvalid)
        parsed = _cast_tokens(spaced, value_type) if spaced is not None else None
    if parsed is None:
        return None
    tok_end, values = parsed
    # a row's first number is the first token ending after its '['
    first = np.searchsorted(tok_end, opens).astype(np.int32)
    loffs = np.empty(n + 1, dtype=np.int32)
    loffs[-1] = len(tok_end)
    if valid is None:
        loffs[:-1] = first
    else:  # a NULL row is empty: its offset is the next valid row's (or the end)
        pos = np.full(n + 1, -1, dtype=np.int64)
        pos[:-1][valid] = first
        pos[n] = len(tok_end)
        nxt = np.where(pos >= 0, np.arange(n + 1), n)
        nxt = np.minimum.accumulate(nxt[::-1])[::-1]
        loffs[:] = pos[nxt]
    mask = None if valid is None else pa.array(~valid)
    return pa.ListArray.from_arrays(pa.array(loffs), values, mask=mask)


def _compact_tokens(a: np.ndarray, opens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Token ends and number text of compact arrays, in place: ',' and the brackets become leading '0's.

    ``a`` (writable) is overwritten. A row closes right before the next row's '[' (and at the end:
    the caller checked both), so only the commas need a scan; a close directly after its '[' ends
    an empty list, not a number. Any other byte stays as it is for the cast to judge (a ']' or '['
    inside a string, say, comes with a '"', which no number holds).
    """
    sep = a == 44
    sep[opens[1:] - 1] = True
    sep[-1] = True
    after = opens + 1  # (in range: every row ends with a ']' after its '[')
    empty = after[a[after] == 93]
    if len(empty):
        sep[empty] = False
        a[empty] = 48
    tok_end = np.flatnonzero(sep)
    a[tok_end] = 48
    a[opens] = 48
    return tok_end, a


def _spaced_tokens(a: np.ndarray, nvalid: int) -> Optional[tuple[np.ndarray, np.ndarray]]:
    """Token ends and number text of arrays with whitespace/exponents; None for anything else."""
    isnum = np.subtract(a, 45, dtype=np.uint8) <= 12  # - . / 0-9 (uint8 wrap-around: one compare)
    comma = a == 44
    close = a == 93
    other = ~isnum & ~comma & ~close & (a != 91)
    # exponents (1e-05) and whitespace are fine; anything else (true, strings, objects) is declined
    ch = a[other]
    exp = (ch == 101) | (ch == 69) | (ch == 43)
    ws = (ch == 32) | (ch == 10) | (ch == 13) | (ch == 9)
    if int(np.count_nonzero(close)) != nvalid or np.count_nonzero(a == 47) or not (exp | ws).all():
        return None
    if exp.any():
        isnum |= (a == 101) | (a == 69) | (a == 43)
    # token t ends where a number byte is followed by a separator
    tok_end = np.flatnonzero(isnum[:-1] & ~isnum[1:]) + 1
    # bytes between numbers become '0's: leading zeros of the next number
    return tok_end, np.where(isnum, a, np.uint8(48))


def _cast_tokens(tokens: tuple[np.ndarray, np.ndarray], value_type: pa.DataType):
    """(token ends, numbers) parsed by Arrow; None when any token is not a number of that type."""
    tok_end, data = tokens
    offsets = np.empty(len(tok_end) + 1, dtype=np.int32)
    offsets[0] = 0
    offsets[1:] = tok_end
    strings = pa.StringArray.from_buffers(len(tok_end), pa.py_buffer(offsets), pa.py_buffer(data))
    try:
        return tok_end, pc.cast(strings, value_type)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError):
        return None


def _col(values: list, typ: pa.DataType) -> pa.Array:
    return pa.array(values, type=typ)


def decode_records(lines: Sequence[bytes]) -> Optional[pa.Table]:
    """Record JSON objects (one per item) -> a ``RECORD_SCHEMA`` table; None when anything is irregular."""
    if not len(lines):
        return None
    try:
        recs = [_dec_rec.decode(x) for x in lines]
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return records_table(recs)


def records_table(recs: Sequence[Any]) -> Optional[pa.Table]:
    """Decoded records (``_Rec``-shaped: header attributes, ``reqs`` a list of ReqRawLists) -> RECORD_SCHEMA.

    Absent header fields may be None or their SGLang default (-1, ""): translate reads both
    the same way. None when anything is irregular.
    """
    if not len(recs):
        return None
    try:
        cols: dict[str, pa.Array] = {
            "forward_ct": _col([r.forward_ct for r in recs], pa.int64()),
            "mode": _col([r.mode for r in recs], pa.string()),
        }
        for name in SENTINELS + OPT_INTS:
            cols[name] = _col(list(map(attrgetter(name), recs)), pa.int64())
        for name in TIMES + ("predicted_theta",):
            cols[name] = _col(list(map(attrgetter(name), recs)), pa.float64())
    except (pa.ArrowInvalid, OverflowError, TypeError):
        return None
    req_lists = [r.reqs for r in recs]
    has = np.fromiter((q is not None for q in req_lists), dtype=bool, count=len(recs))
    nreq = np.fromiter((len(q) if q is not None else 0 for q in req_lists), dtype=np.int64, count=len(recs))
    reqs = list(chain.from_iterable(q for q in req_lists if q))
    m = len(reqs)
    roffs = np.zeros(len(recs) + 1, dtype=np.int32)
    np.cumsum(nreq, out=roffs[1:])
    # one fromiter per field (into its row of one block) is ~15% cheaper than one over (7-tuples)
    by_field = np.empty((7, m), dtype=np.int64)
    try:
        for k, name in enumerate(_INTS):
            by_field[k] = np.fromiter(map(attrgetter(name), reqs), dtype=np.int64, count=m)
    except (OverflowError, TypeError, ValueError):
        return None
    children = [pa.array(by_field[k]) for k in range(7)]
    drafts = parse_number_lists(list(map(attrgetter("draft_tokens"), reqs)), pa.int64(), nullable=False)
    if drafts is None:
        return None
    try:
        rid = pa.array(list(map(attrgetter("rid"), reqs)), pa.string())
    except (pa.ArrowInvalid, TypeError):
        return None
    conf = parse_number_lists(list(map(attrgetter("confidence"), reqs)), pa.float64())
    surv = parse_number_lists(list(map(attrgetter("survival"), reqs)), pa.float64()) if conf is not None else None
    if conf is None or surv is None:
        return None
    struct = pa.StructArray.from_arrays(children + [drafts, rid, conf, surv], fields=list(REQ_TYPE))
    cols["reqs"] = pa.ListArray.from_arrays(pa.array(roffs), struct,
                                            mask=None if has.all() else pa.array(~has))
    return pa.Table.from_arrays([cols[f.name] for f in RECORD_SCHEMA], schema=RECORD_SCHEMA)
