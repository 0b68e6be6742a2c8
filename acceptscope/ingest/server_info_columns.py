"""The fast path of /server_info ingest: a chunk of records -> validated Arrow columns.

Why: the ring holds ~30 numbers per request-step, and one Python object per number is slow.
A chunk of records (``server_info`` decodes it in one typed msgspec pass) arrives here as small
``gc=False`` structs whose per-position lists (``draft_tokens``, ``confidence``, ``survival``)
stay as ``msgspec.Raw`` JSON text (:class:`ReqRawLists`). :func:`records_table` turns them into a
``RECORD_SCHEMA`` table: the list texts are joined into one (mutable) buffer and parsed by Arrow's
number parser (``cast(string -> int64/float64)``) in a single vectorised pass -- every byte that is
not part of a number (``[ , ]``, whitespace) is overwritten with ``'0'``, in place, and becomes a
leading zero of the next number, so token boundaries are the only thing numpy has to find (compact
arrays: one scan for the commas; the row boundaries follow from the '[' scan).
:func:`translate` then evaluates every check of ``server_info.check_req`` / ``_check_step`` on whole
columns with numpy.

This module never decides that input is invalid: anything it cannot represent exactly (a type
error, a null inside a list, nested lists, strings, a number Arrow cannot parse, an irregular
record header) makes it decline (None) and the caller takes the exact per-record path for that
chunk; request-level problems come back as row positions for the caller to explain.

Measured before the merge into one path (bench/ingest.py, one pinned core, CPU seconds, best of
3): the whole parse of a cold 204,800 request-step dump through :func:`records_table` + translate
took 0.77-0.97 s against 1.27-1.29 s with Arrow's JSON reader (x1.32-1.67); per list column the
compact tokenizer + Arrow's number parser take ~45-50 ms per 100k request-steps.
Session 6 (``bench/ingest.py --parsers``, records -> this module's RECORD_SCHEMA, one CPU): msgspec +
:func:`records_table` stays the fastest way (0.1M / 1M request-steps): ``pyarrow.json.read_json`` with the
schema explicit runs at 0.60-0.80 / 0.70-0.79x its speed, DuckDB's ``read_json`` (its lines file already
written) 0.64-0.75 / 0.96x, DuckDB's ``json_transform`` 0.12-0.14 / 0.17x, so a "C fast path" through either
reader would cost time (and its fallback checks more), not save it.
"""

from __future__ import annotations

from dataclasses import dataclass
from itertools import chain
from operator import attrgetter
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope import schema
from acceptscope.arrow_columns import one_array
from acceptscope.ingest.batch import table_from_columns
from acceptscope.ingest.server_info_checks import bad_float_rows
from acceptscope.ingest.server_info_records import SENTINEL_FIELDS, TIME_FIELDS, ReqDetail, ReqRawLists, StepRecord

__all__ = ["records_table", "translate", "request_steps_table", "parse_number_lists", "ReqRawLists",
           "RECORD_SCHEMA", "FastResult", "Columns"]

_I = pa.int64()
_I32_MAX = 2**31 - 1  # the store's int32 columns (rejects.INT32_MAX)
_F = pa.float64()
REQ_TYPE = pa.struct([
    ("req_pool_index", _I), ("prefix_len", _I), ("verify_len", _I), ("acc_len", _I),
    ("correct_drafts", _I), ("cap_trim", _I), ("bonus_token", _I), ("draft_tokens", pa.list_(_I)),
    ("rid", pa.string()), ("confidence", pa.list_(_F)), ("survival", pa.list_(_F)),
])
_REQUIRED = ("req_pool_index", "prefix_len", "verify_len", "acc_len", "correct_drafts", "cap_trim",
             "bonus_token", "draft_tokens")
SENTINELS = SENTINEL_FIELDS
OPT_INTS = ("budget", "lag_steps")
TIMES = TIME_FIELDS + ("predicted_step_ms",)
RECORD_SCHEMA = pa.schema(
    [("forward_ct", _I), ("mode", pa.string())]
    + [(f, _I) for f in SENTINELS + OPT_INTS]
    + [(f, _F) for f in TIMES + ("predicted_theta",)]
    + [("reqs", pa.list_(REQ_TYPE))]
)


@dataclass
class FastResult:
    steps: pa.Table  # schema 'steps' minus run_id/rank/epoch (filled by caller)
    reqs: Optional[pa.Table]  # flattened request rows (valid + bad), read types
    req_record: np.ndarray  # record offset (0-based within the slice) of each request row
    req_pos: np.ndarray  # position k of each request row inside its record's reqs list
    bad: np.ndarray  # bool per request row: a check failed (caller explains + drops)
    dup: np.ndarray  # bool per request row: later duplicate of a (record, rid) pair
    last_fct: int


def _np(a: pa.ChunkedArray | pa.Array, fill: Any = None) -> np.ndarray:
    a = one_array(a)
    if fill is not None and a.null_count:  # (fill_null copies even a column without NULLs)
        a = pc.fill_null(a, fill)
    return a.to_numpy(zero_copy_only=False)


def translate(tbl: pa.Table, *, gamma: int, mode: str, watermark: int) -> Optional[FastResult]:
    """Validate and flatten a parsed record slice; None when any record header is irregular."""
    n = tbl.num_rows
    fct = tbl.column("forward_ct")
    if fct.null_count:
        return None
    f = _np(fct)
    if (f <= watermark).any() or (n > 1 and (np.diff(f) <= 0).any()) or (f < 0).any():
        return None
    rmode = tbl.column("mode")
    if pc.any(pc.and_(pc.is_valid(rmode), pc.and_(pc.not_equal(rmode, ""), pc.not_equal(rmode, mode)))).as_py():
        return None
    for name in SENTINELS:
        v = _np(tbl.column(name), -1)
        if (v < -1).any() or (v > _I32_MAX).any():
            return None
    for name in OPT_INTS:
        v = _np(tbl.column(name), 0)
        if (v < 0).any() or (v > _I32_MAX).any():
            return None
    for name in TIMES:
        v = _np(tbl.column(name), 0.0)
        if not (np.isfinite(v) & (v >= 0)).all():
            return None
    if not np.isfinite(_np(tbl.column("predicted_theta"), 0.0)).all():
        return None
    bs = _np(tbl.column("bs"), -1)
    nrr = _np(tbl.column("num_running_reqs"), -1)
    if ((bs >= 0) & (nrr >= 0) & (bs != nrr)).any():
        return None
    reqs_col = one_array(tbl.column("reqs"))
    has_reqs = _np(pc.is_valid(reqs_col))
    nreq = _np(pc.list_value_length(reqs_col), 0)
    if (has_reqs & (bs >= 0) & (nreq != bs)).any():
        return None

    steps = _steps_columns(tbl)
    if not has_reqs.any():
        z = np.zeros(0, dtype=np.int64)
        return FastResult(steps, None, z, z, z.astype(bool), z.astype(bool), int(f[-1]))

    flat = reqs_col.flatten()
    parents = _np(pc.list_parent_indices(reqs_col)).astype(np.int64, copy=False)
    offs = _np(reqs_col.offsets).astype(np.int64)
    pos = np.arange(len(flat), dtype=np.int64) - offs[parents]
    cols = {name: flat.field(name) for name in REQ_TYPE.names}
    m = len(flat)
    bad = np.zeros(m, dtype=bool)
    if flat.null_count:
        bad |= _np(pc.is_null(flat))
    for name in _REQUIRED:
        if cols[name].null_count:
            bad |= _np(pc.is_null(cols[name]))
    pool = _np(cols["req_pool_index"], -1)
    prefix = _np(cols["prefix_len"], -1)
    bonus = _np(cols["bonus_token"], -1)
    vlen = _np(cols["verify_len"], 0)
    cd = _np(cols["correct_drafts"], -1)
    acc = _np(cols["acc_len"], -1)
    ct = _np(cols["cap_trim"], -1)
    bad |= (pool < 0) | (prefix < 0) | (bonus < 0) | (vlen < 1) | (vlen > gamma + 1)
    bad |= (pool > _I32_MAX) | (prefix > _I32_MAX)  # int32 columns
    bad |= (cd < 0) | (cd > vlen - 1) | (acc != cd + 1) | (ct < 0) | (cd + ct > gamma)
    if mode == "static":
        bad |= (vlen != gamma + 1) | (ct != 0)
    drafts = cols["draft_tokens"]
    dlen = _np(pc.list_value_length(drafts), -1)
    bad |= dlen != gamma
    dvals = drafts.flatten()
    if dvals.null_count or len(dvals) != int(dlen[dlen > 0].sum()):
        return None  # null token ids inside a list: let the exact path name them
    if len(dvals):
        neg = _np(dvals) < 0
        if neg.any():
            dpar = _np(pc.list_parent_indices(drafts))
            bad[np.unique(dpar[neg])] = True
    rid = cols["rid"]
    bad |= _np(pc.equal(pc.fill_null(rid, "x"), ""))
    conf, surv = cols["confidence"], cols["survival"]
    cv, sv = _np(pc.is_valid(conf)), _np(pc.is_valid(surv))
    bad |= cv != sv
    both = cv & sv & ~bad
    if both.any():
        clen = _np(pc.list_value_length(conf), -1)
        slen = _np(pc.list_value_length(surv), -1)
        bad |= both & ((clen != gamma) | (slen != gamma))
        both &= ~bad
        idx = np.flatnonzero(both)
        if len(idx):
            c = _gather_fixed(conf, idx, gamma)
            s = _gather_fixed(surv, idx, gamma)
            if c is None or s is None:
                return None
            rb = bad_float_rows(c, s, gamma)
            if rb is not None:
                bad[idx[rb]] = True
    # duplicate (record, rid) pairs: later occurrences
    dup = np.zeros(m, dtype=bool)
    rid_key = pc.fill_null(rid, "")
    enc = pc.dictionary_encode(one_array(rid_key))
    ridx = _np(enc.indices).astype(np.int64)
    named = _np(pc.is_valid(rid))
    key = parents * (len(enc.dictionary) + 1) + ridx
    kk = key[named & ~bad]
    if len(kk) > 1:
        sk = np.sort(kk)
        has_dup = bool((sk[1:] == sk[:-1]).any())
    else:
        has_dup = False
    if has_dup:
        where = np.flatnonzero(named & ~bad)
        order = np.argsort(kk, kind="stable")
        ks = kk[order]
        later = np.zeros(len(kk), dtype=bool)
        later[order[1:][ks[1:] == ks[:-1]]] = True
        dup[where[later]] = True
    reqs = pa.table({name: cols[name] for name in REQ_TYPE.names})
    return FastResult(steps, reqs, parents, pos, bad, dup, int(f[-1]))


def _gather_fixed(lists: pa.Array, idx: np.ndarray, g: int) -> Optional[np.ndarray]:
    """Rows idx of a list<float64> array whose rows all have length g, as an (len(idx), g) matrix."""
    sub = lists if len(idx) == len(lists) and lists.null_count == 0 and lists.offset == 0 else lists.take(pa.array(idx))
    vals = sub.flatten()
    if vals.null_count:
        return None
    return _np(vals).astype(np.float64, copy=False).reshape(len(idx), g)




def _steps_columns(tbl: pa.Table) -> pa.Table:
    cols: dict[str, Any] = {"forward_ct": tbl.column("forward_ct")}
    mode = tbl.column("mode")
    cols["mode"] = pc.if_else(pc.equal(pc.fill_null(mode, ""), ""), pa.scalar(None, pa.string()), mode)
    for name in SENTINELS:
        c = tbl.column(name)
        cols[name] = pc.if_else(pc.equal(pc.fill_null(c, -1), -1), pa.scalar(None, _I), c)
    for name in OPT_INTS + TIMES + ("predicted_theta",):
        cols[name] = tbl.column(name)
    return pa.table(cols)


def request_steps_table(
    res: FastResult, keep: np.ndarray, *, run_id: str, rank: int, epoch: int, fcts: np.ndarray,
    rids: pa.Array, step_index: np.ndarray, mode: str, gamma: int,
) -> pa.Table:
    """The schema ``request_steps`` table of the kept request rows."""
    t = res.reqs if keep.all() else res.reqs.filter(pa.array(keep))  # (a filter copies every list column)
    n = t.num_rows
    vlen = _np(t.column("verify_len")).astype(np.int32)
    cd = _np(t.column("correct_drafts")).astype(np.int32)
    ct = _np(t.column("cap_trim")).astype(np.int32)
    bonus = _np(t.column("bonus_token")).astype(np.int64)
    drafts = one_array(t.column("draft_tokens"))
    dflat = _np(drafts.flatten()).astype(np.int64)
    # committed = drafts[:cd] + [bonus]
    lens = cd.astype(np.int64) + 1
    offs = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lens, out=offs[1:])
    row = np.repeat(np.arange(n, dtype=np.int64), lens)
    p = np.arange(int(offs[-1]), dtype=np.int64) - offs[:-1][row]
    vals = np.where(p < cd[row], dflat[np.minimum(row * gamma + p, max(len(dflat) - 1, 0))] if len(dflat) else 0,
                    bonus[row])
    committed = pa.ListArray.from_arrays(pa.array(offs.astype(np.int32)), pa.array(vals, pa.int64()))
    if mode == "cap-accept":
        ceiling = pa.array((cd + ct).astype(np.int32))
    elif mode == "static":
        ceiling = pa.array(cd)
    else:
        ceiling = pa.nulls(n, pa.int32())
    cols = {
        "run_id": pa.array([run_id] * n, pa.string()) if n < 2 else pa.repeat(pa.scalar(run_id), n),
        "rank": pa.array(np.full(n, rank, dtype=np.int32)),
        "epoch": pa.array(np.full(n, epoch, dtype=np.int32)),
        "forward_ct": pa.array(fcts.astype(np.int64)),
        "rid": rids,
        "req_pool_index": t.column("req_pool_index"),
        "step_index": pa.array(step_index.astype(np.int32)),
        "prefix_len": t.column("prefix_len"),
        "verify_len": pa.array(vlen),
        "window": pa.array(vlen - 1),
        "correct_drafts": pa.array(cd),
        "acc_len": t.column("acc_len"),
        "cap_trim": pa.array(ct),
        "bonus_token": pa.array(bonus),
        "draft_tokens": drafts,
        "confidence": t.column("confidence"),
        "survival": t.column("survival"),
        "committed_tokens": committed,
        "ceiling": ceiling,
    }
    out = []
    for c in schema.REQUEST_STEPS.columns:
        v = cols.get(c.name)
        if v is None:
            out.append(pa.nulls(n, c.type))
        else:
            v = one_array(v)
            out.append(v if v.type == c.type else v.cast(c.type))
    return pa.Table.from_arrays(out, schema=schema.REQUEST_STEPS.arrow_schema)


# ---------------------------------------------------------------------------
# decoding: structs with raw lists -> RECORD_SCHEMA
# ---------------------------------------------------------------------------


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


def records_table(recs: Sequence[Any]) -> Optional[pa.Table]:
    """Decoded records (header attributes, ``reqs`` a list of :class:`ReqRawLists`) -> RECORD_SCHEMA.

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


# ---------------------------------------------------------------------------
# columnar accumulation (no per-row dicts)
# ---------------------------------------------------------------------------
def _none_if_sentinel(v: int) -> Optional[int]:
    return None if v == -1 else v


class Columns:
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
        for f in SENTINEL_FIELDS:
            cols[f] = [_none_if_sentinel(getattr(h, f)) for h in st]
        for f in ("budget", "lag_steps", "predicted_step_ms", "predicted_theta") + TIME_FIELDS:
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

