"""The vectorised path of the info-dump translation: raw records -> Arrow columns.

Why: decoding a ring of request-steps into Python objects costs ~30 objects per
row. Instead the new records' raw JSON (one object per line) becomes a
``RECORD_SCHEMA`` table -- first through :mod:`acceptscope.ingest.fast_decode`
(msgspec structs + one vectorised number parse per list column; single-threaded,
x1.32-1.67 cheaper than Arrow's reader on a cold 200k request-step dump),
else through Arrow's C++ JSON reader with an explicit schema -- and every check of
``server_info.check_req`` / ``_check_step`` is evaluated on whole columns with
numpy. Anything irregular at record level (parse error, wrong type, NaN token,
bad header) returns None and the caller takes the exact per-record path;
request-level problems come back as row positions for the caller to explain.
"""

from __future__ import annotations

import io
from dataclasses import dataclass
from typing import Any, Optional, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

from acceptscope import schema
from acceptscope.arrow_columns import one_array

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
SENTINELS = ("bs", "num_running_reqs", "num_verify_tokens", "verify_tokens_local",
             "verify_tokens_dp_synced", "verify_tokens_graph_key")
OPT_INTS = ("budget", "lag_steps")
TIMES = ("step_cpu_ms", "step_gpu_ms", "draft_gpu_ms", "target_verify_gpu_ms", "predicted_step_ms")
RECORD_SCHEMA = pa.schema(
    [("forward_ct", _I), ("mode", pa.string())]
    + [(f, _I) for f in SENTINELS + OPT_INTS]
    + [(f, _F) for f in TIMES + ("predicted_theta",)]
    + [("reqs", pa.list_(REQ_TYPE))]
)
USE_THREADS = True


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


def read_records(lines: Sequence[bytes]) -> Optional[pa.Table]:
    """Parse JSON record objects (one per item) into RECORD_SCHEMA; None on any parse/type error.

    Arrow's reader is type-strict like msgspec (a string where an int belongs is an
    error, an int where a float belongs is fine), which the reject rules rely on;
    DuckDB's reader was measured no faster here and silently casts 17 -> '17'.
    """
    data = b"\n".join(lines)
    if not data:
        return None
    try:
        return pj.read_json(
            io.BytesIO(data),
            read_options=pj.ReadOptions(use_threads=USE_THREADS,
                                        block_size=max(1 << 22, 2 * max(map(len, lines)) + 2)),
            parse_options=pj.ParseOptions(explicit_schema=RECORD_SCHEMA, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowInvalid, pa.ArrowTypeError, pa.ArrowNotImplementedError):
        return None


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
            rb = _bad_float_rows(c, s, gamma)
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


def _bad_float_rows(c: np.ndarray, s: np.ndarray, gamma: int) -> Optional[np.ndarray]:
    """Rows of (confidence, survival) matrices that ``check_req`` rejects; None when there is none.

    Each rule is first checked on the whole matrix (one reduction, no per-row mask); the
    per-row masks are only built for a rule that some row breaks (valid dumps: never).
    NaN fails every comparison, so it fails the range rules as in ``check_req``.
    """
    rb = None
    with np.errstate(invalid="ignore"):
        for m in (c, s):
            lo, hi = m.min(), m.max()
            if not (lo >= 0 and hi <= 1):
                r = ~((m >= 0) & (m <= 1)).all(axis=1)
                rb = r if rb is None else rb | r
        if (s[:, 0] > 1).any() or (s[:, 1:] > s[:, :-1]).any():  # non-increasing from 1.0
            r = (np.diff(s, axis=1, prepend=1.0) > 0).any(axis=1)
            rb = r if rb is None else rb | r
        tol = 5e-5 * (np.arange(gamma) + 2) + 1e-6
        dev = np.cumprod(c, axis=1)
        np.subtract(s, dev, out=dev)
        np.abs(dev, out=dev)
        if (dev > tol).any():
            r = (dev > tol).any(axis=1)
            rb = r if rb is None else rb | r
    return rb


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
