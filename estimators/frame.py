"""Columnar view of ``request_steps`` that every estimator walks: padded numpy arrays.

Why: the tail walk, calibration and utilization all need per-position arrays
(drafts, confidence, log-probs) side by side with the scalar columns, ordered by
request and step, plus the request's *committed token stream by absolute
position* (to follow a trimmed draft into later steps). Building that once, with
no per-row Python, keeps the estimators vectorised.

Alignment (SGLang ``ReqDetail`` convention, reference §2.4): the anchor sits at
absolute position ``prefix_len`` and draft ``d_k`` (0-based) at
``prefix_len + k + 1``. A step commits ``correct_drafts + 1`` tokens at positions
``prefix_len + 1 .. prefix_len + correct_drafts + 1``; the next step of the same
request starts at ``prefix_len' = prefix_len + correct_drafts + 1``. Where that
continuity breaks (a missing step, a retraction) the request is split into
*segments*: a walk never crosses a segment boundary.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope import schema
from acceptscope.domain.temperature import UNKNOWN_NOTE, as_served

RS = schema.REQUEST_STEPS

_LIST_FLOAT = ("confidence", "survival", "confidence_logit", "draft_logprob", "target_logprob")
# list columns a frame built from Arrow pads on first use (the attribute holding the padded array)
_LAZY = {"committed_tokens": "_committed", "confidence": "_confidence", "draft_logprob": "_draft_logprob",
         "target_logprob": "_target_logprob"}


def padded(values, width: int, fill: float | int = np.nan, dtype=np.float64) -> np.ndarray:
    """Ragged list column (Arrow or pandas) -> ``(n, width)`` array; missing/NULL entries -> ``fill``.

    Each Arrow chunk is copied straight into its rows of the output (no ``combine_chunks``):
    one reshape when every list has ``width`` entries (the engine's draft columns), one masked
    fill when none has more, else a scatter by flat destination index."""
    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(list(values), from_pandas=True)
    chunks = arr.chunks if isinstance(arr, pa.ChunkedArray) else [arr]
    n = len(arr)
    if n == 0 or pa.types.is_null(arr.type):
        return np.full((n, width), fill, dtype=dtype)
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise TypeError(f"expected a list column, got {arr.type}")
    offsets = [np.asarray(c.offsets, dtype=np.int64) for c in chunks]
    fixed = [c.null_count == 0 and bool(np.all(np.diff(o) == width)) for c, o in zip(chunks, offsets)]
    out = np.empty((n, width), dtype=dtype) if all(fixed) else np.full((n, width), fill, dtype=dtype)
    at = 0
    for c, o, fx in zip(chunks, offsets, fixed):
        m, at = len(c), at + len(c)
        if m == 0:
            continue
        dst = out[at - m:at]
        vals = c.values.slice(o[0], o[-1] - o[0])
        if vals.null_count:  # NULL -> fill in Arrow, so the numpy view below stays zero-copy
            nan_into_int = pa.types.is_integer(vals.type) and not float(fill).is_integer()
            vals = pc.fill_null(vals.cast(pa.float64()) if nan_into_int else vals, fill)
        flat = vals.to_numpy(zero_copy_only=False)
        if fx:
            dst[:] = flat.reshape(m, width)
            continue
        lens = np.diff(o)
        row_at = np.arange(m) * width
        dest = np.arange(flat.size) + np.repeat(row_at - (o[:-1] - o[0]), lens)
        if c.null_count == 0 and lens.max() <= width:  # short lists (committed_tokens): every entry lands
            dst.reshape(-1)[dest] = flat  # (a flat scatter: ~2x a boolean-mask fill of the row prefixes)
            continue
        keep = dest < np.repeat(row_at + width, lens)  # entries past width are dropped
        if c.null_count:
            keep &= np.repeat(~np.asarray(c.is_null(), dtype=bool), lens)
        dst.reshape(-1)[dest[keep]] = flat[keep]
    return out


def _fixed_chunks(values, width: int) -> tuple[np.ndarray, list[np.ndarray]] | None:
    """An Arrow list column whose every list has ``width`` entries (no NULL list) as numpy views,
    one ``(rows, width)`` array per chunk in its own dtype (NULL floats as NaN; zero-copy without
    NULLs), with the chunks' first rows (and the total) in ``starts``: what :func:`padded` would
    give, without the padded copy. None for anything else (NULL lists, other lengths, NULL ints)."""
    if not isinstance(values, (pa.Array, pa.ChunkedArray)) or not (pa.types.is_list(values.type)
                                                                   or pa.types.is_large_list(values.type)):
        return None
    starts, views = [0], []
    for c in (values.chunks if isinstance(values, pa.ChunkedArray) else [values]):
        if len(c) == 0:
            continue
        o = np.asarray(c.offsets, dtype=np.int64)
        if c.null_count or not bool(np.all(np.diff(o) == width)):
            return None
        vals = c.values.slice(o[0], o[-1] - o[0])
        if vals.null_count and not pa.types.is_floating(vals.type):
            return None
        views.append(vals.to_numpy(zero_copy_only=False).reshape(len(c), width))
        starts.append(starts[-1] + len(c))
    return (np.asarray(starts), views) if views else None


def _chunk_rows(fc, rows: np.ndarray) -> np.ndarray:
    """Rows (any order) of :func:`_fixed_chunks` views, as one ``(len(rows), width)`` array."""
    starts, views = fc
    if len(views) == 1:
        return views[0].take(rows, axis=0)
    cid = np.searchsorted(starts, rows, side="right") - 1
    out = np.empty((len(rows), views[0].shape[1]), views[0].dtype)
    for c, v in enumerate(views):
        sel = np.flatnonzero(cid == c)
        if sel.size:
            out[sel] = v.take(rows[sel] - starts[c], axis=0)
    return out


def _chunk_flat(fc, idx: np.ndarray) -> np.ndarray:
    """``padded.reshape(-1).take(idx, mode="clip")`` of :func:`_fixed_chunks` views, for ascending
    flat indices ``idx`` (row * width + column): each chunk takes its own range of them."""
    starts, views = fc
    if len(views) == 1:
        return views[0].reshape(-1).take(idx, mode="clip")
    width = views[0].shape[1]
    bounds = np.searchsorted(idx, starts * width)
    bounds[-1] = len(idx)  # past the end: clipped into the last chunk
    out = np.empty(len(idx), views[0].dtype)
    for c, v in enumerate(views):
        a, b = bounds[c], bounds[c + 1]
        if b > a:
            out[a:b] = v.reshape(-1).take(idx[a:b] - starts[c] * width, mode="clip")
    return out


def _request_codes(df: pd.DataFrame) -> np.ndarray:
    """Code per row of (run_id, rid), numbered in sorted key order.

    Rows arriving sorted by a string ``rid`` (as the store returns them) are coded by one
    adjacent comparison instead of a hash-and-sort factorize."""
    run = df["run_id"]
    one_run = bool((run == run.iloc[0]).all())  # (the caller refuses an empty frame)
    key = df["rid"] if one_run else df["run_id"].astype(str) + "\x00" + df["rid"].astype(str)
    if len(key) > 1 and pd.api.types.is_string_dtype(key.dtype) and not key.hasnans:
        a = pa.array(key.array)
        if pa.types.is_string(a.type) or pa.types.is_large_string(a.type):
            prev, nxt = a.slice(0, len(a) - 1), a.slice(1)
            if not pc.any(pc.less(nxt, prev)).as_py():
                return np.concatenate([[0], np.cumsum(pc.not_equal(nxt, prev).to_numpy(zero_copy_only=False))])
    return pd.factorize(key, sort=True)[0]


NO_WORKLOAD = "(unlabelled)"  # the workload of request-steps whose traffic carried no label


def _col(df: pd.DataFrame, name: str, fill, dtype) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), fill, dtype=dtype)
    s = df[name]
    if s.dtype.kind in "iubf" and not s.hasnans:  # numeric, no NULL: no coercion
        return s.to_numpy(dtype=dtype)
    s = pd.to_numeric(s, errors="coerce")
    return s.fillna(fill).to_numpy(dtype=dtype)


def _arrow_col(tbl: pa.Table, name: str, fill, dtype) -> np.ndarray:
    """:func:`_col` read straight from an Arrow column (NULL -> ``fill`` in Arrow, then one numpy
    conversion); a non-numeric column goes through :func:`_col` for its coercion rules."""
    if name not in tbl.column_names:
        return np.full(tbl.num_rows, fill, dtype=dtype)
    c = tbl.column(name)
    t = c.type
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        return _col(tbl.select([name]).to_pandas(), name, fill, dtype)
    if c.null_count == len(c):  # all NULL (compact telemetry's ceiling)
        return np.full(len(c), fill, dtype=dtype)
    if c.null_count:
        if not pa.types.is_floating(t) and not float(fill).is_integer():
            c = c.cast(pa.float64())  # NaN fill into an integer column
        c = pc.fill_null(c, pa.scalar(fill, c.type) if not pa.types.is_boolean(t) else bool(fill))
    return np.asarray(c.to_numpy(), dtype=dtype)


def _arrow_request_codes(tbl: pa.Table) -> np.ndarray | None:
    """:func:`_request_codes` in Arrow: string keys without NULLs dictionary-encoded once and
    numbered in sorted key order (None: other key types, left to the pandas path)."""
    rid = tbl.column("rid")
    strs = (pa.types.is_string, pa.types.is_large_string)
    if rid.null_count or not any(f(rid.type) for f in strs):
        return None
    if "run_id" in tbl.column_names:
        run = tbl.column("run_id")
        if run.null_count or not any(f(run.type) for f in strs):
            return None
        if pc.count_distinct(run).as_py() > 1:
            rid = pc.binary_join_element_wise(run.cast(pa.large_string()), rid.cast(pa.large_string()),
                                              pa.scalar("\x00", pa.large_string()))
    rid = rid.combine_chunks() if isinstance(rid, pa.ChunkedArray) else rid
    if len(rid) > 1:
        prev, nxt = rid.slice(0, len(rid) - 1), rid.slice(1)
        if not pc.any(pc.less(nxt, prev)).as_py():  # sorted (the store's order): one adjacent comparison
            return np.concatenate([[0], np.cumsum(pc.not_equal(nxt, prev).to_numpy(zero_copy_only=False))])
    enc = pc.dictionary_encode(rid)
    rank = np.empty(len(enc.dictionary), np.int64)
    rank[pc.sort_indices(enc.dictionary).to_numpy()] = np.arange(len(enc.dictionary))
    return rank[enc.indices.to_numpy()]


def _workload_codes(values) -> tuple[np.ndarray, np.ndarray]:
    """Workload per row as (int32 code, object array of labels): NULL is :data:`NO_WORKLOAD`.
    Why: the hazard model looks workloads up per call; a handful of labels, not one string per row."""
    if isinstance(values, (pa.Array, pa.ChunkedArray)):
        if pa.types.is_null(values.type):
            return np.zeros(len(values), np.int32), np.array([NO_WORKLOAD], object)
        enc = values if pa.types.is_dictionary(values.type) else pc.dictionary_encode(values)
        enc = enc.combine_chunks() if isinstance(enc, pa.ChunkedArray) else enc
        labels = list(enc.dictionary.to_pylist())
        idx = enc.indices
        codes = np.asarray(pc.fill_null(idx, -1).to_numpy(), np.int32) if idx.null_count else \
            np.asarray(idx.to_numpy(), np.int32)
    else:
        codes, uniq = pd.factorize(pd.Series(values).to_numpy(object))
        labels, codes = list(uniq), codes.astype(np.int32)
    if (codes < 0).any():
        if NO_WORKLOAD not in labels:
            labels.append(NO_WORKLOAD)
        codes = np.where(codes < 0, labels.index(NO_WORKLOAD), codes).astype(np.int32)
    out = np.empty(len(labels), object)
    out[:] = labels
    return codes, out


def _pandas_defaults(df: pd.DataFrame, names=None) -> pd.DataFrame:
    """The scalar columns every frame has (in place): run_id, a workload without NULLs, epoch,
    forward_ct, rank (``names``: only those of them)."""
    if "run_id" not in df.columns and (names is None or "run_id" in names):
        df["run_id"] = "run"
    if "workload" in df.columns and df["workload"].isna().any():
        # SGLang telemetry carries no workload: one group of its own, never a NULL group key
        df["workload"] = df["workload"].astype(object).where(df["workload"].notna(), NO_WORKLOAD)
    for c, d in (("epoch", 0), ("forward_ct", 0), ("rank", 0)):
        if c not in df.columns and (names is None or c in names):
            df[c] = d
    return df


@dataclass
class BlockFrame:
    """``request_steps`` of one or more runs as sorted, padded arrays (one row per request-step).

    Build with :meth:`from_request_steps`. Positions ``k >= gamma`` never exist; NaN marks a
    missing float, ``-1`` a missing token. ``df`` (the scalar columns as a sorted DataFrame) is
    built on first use from Arrow input: the estimators read the numpy arrays.
    """

    gamma: int
    _df: pd.DataFrame | None  # scalar columns, sorted; index 0..n-1 (None: not built yet, see ``df``)
    draft: np.ndarray  # (n, G) int64
    _committed: np.ndarray | None  # (n, G+1) int64: see ``committed`` (None: padded on first use)
    _confidence: np.ndarray | None  # (n, G)
    confidence_logit: np.ndarray  # (n, G)
    _draft_logprob: np.ndarray | None  # (n, G)
    _target_logprob: np.ndarray | None  # (n, G)
    window: np.ndarray
    correct: np.ndarray
    cap_trim: np.ndarray  # -1 where NULL
    ceiling: np.ndarray  # -1 where NULL
    prefix: np.ndarray
    bonus: np.ndarray  # -1 where NULL
    temperature: np.ndarray
    request: np.ndarray  # int code per (run_id, rid)
    segment: np.ndarray  # int code per continuous stretch of a request
    finished: np.ndarray  # bool
    notes: list[str] = field(default_factory=list)
    forward_ct: np.ndarray | None = None  # int64
    workload_codes: np.ndarray | None = None  # int32 index into workload_labels
    workload_labels: np.ndarray | None = None  # object array (NO_WORKLOAD for NULL)
    _src: pa.Table | None = None  # Arrow scalar columns in input order (``df`` is built from them)
    _order: np.ndarray | None = None  # input row of each frame row (None: input already sorted)
    # stream built lazily
    _stream: dict | None = None
    # Arrow list columns not padded yet: name -> (column, width, fill, dtype), in input row order
    _pending: dict = field(default_factory=dict)
    _flat: dict = field(default_factory=dict)  # name -> _fixed_chunks of a pending column (None: not fixed-width)

    def _padded(self, name: str) -> np.ndarray:
        """A lazily padded list column, padded (and put in frame row order) on first use."""
        attr = _LAZY[name]
        a = getattr(self, attr)
        if a is None:
            col, width, fill, dtype = self._pending.pop(name)
            a = padded(col, width, fill, dtype)
            self._flat.pop(name, None)
            if self._order is not None:
                a = a[self._order]
            setattr(self, attr, a)
        return a

    @property
    def committed(self) -> np.ndarray:
        """(n, G+1) committed tokens (-1: none)."""
        return self._padded("committed_tokens")

    @property
    def confidence(self) -> np.ndarray:
        return self._padded("confidence")

    @property
    def draft_logprob(self) -> np.ndarray:
        return self._padded("draft_logprob")

    @property
    def target_logprob(self) -> np.ndarray:
        return self._padded("target_logprob")

    def list_rows(self, name: str, rows: np.ndarray) -> np.ndarray:
        """``getattr(frame, name)[rows]`` of a lazily padded list column (``confidence``,
        ``draft_logprob``, ...) without padding every row. Why: the tail estimator reads the
        draft log-probs and confidences of the censored rows only (a fifth of the rows)."""
        key = {"committed": "committed_tokens"}.get(name, name)
        a = getattr(self, _LAZY[key])
        if a is not None:
            return a[rows]
        col, width, fill, dtype = self._pending[key]
        if key not in self._flat:  # (cached: the censored rows of each chunk read it again)
            self._flat[key] = _fixed_chunks(col, width)
        fc = self._flat[key]
        if fc is None:
            return self._padded(key)[rows]
        return _chunk_rows(fc, rows if self._order is None else self._order[rows]).astype(dtype)

    @property
    def n(self) -> int:
        return self.window.size

    @property
    def df(self) -> pd.DataFrame:
        """Scalar columns, sorted, index 0..n-1 (built once, on first use, from Arrow input)."""
        if self._df is None:
            self._df = self.pandas_columns(self._src.column_names)
        return self._df

    def pandas_columns(self, names) -> pd.DataFrame:
        """Some scalar columns as ``df`` has them (same dtypes), without building all of ``df``."""
        if self._df is not None:
            return self._df[[c for c in names if c in self._df.columns]]
        have = [c for c in names if c in self._src.column_names]
        tbl = self._src.select(have)
        if self._order is not None:
            tbl = tbl.take(pa.array(self._order))
        df = tbl.to_pandas(split_blocks=True)  # no 2-D block copy: ~2x faster
        return _pandas_defaults(df, None if len(have) == len(self._src.column_names) else names)

    @property
    def greedy(self) -> np.ndarray:
        return self.temperature <= 0

    @property
    def workload(self) -> np.ndarray:
        """Workload label per row (object array; :data:`NO_WORKLOAD` where the traffic carried none)."""
        return self.workload_labels.take(self.workload_codes)

    @property
    def has_truth(self) -> np.ndarray:
        return self.ceiling >= 0

    @property
    def trimmed(self) -> np.ndarray:
        """Window shorter than gamma (the scheduler cut drafts)."""
        return self.window < self.gamma

    @property
    def censored(self) -> np.ndarray:
        """Right-censored blocks: whole window accepted while drafts were trimmed (SGLang opens a block)."""
        return (self.correct == self.window) & (self.window < self.gamma)

    # ------------------------------------------------------------------
    @classmethod
    def from_request_steps(cls, data, gamma: int | None = None, skip: tuple = ()) -> "BlockFrame":
        """Build from a ``request_steps`` DataFrame or Arrow table (any subset of columns beyond the basics).

        Arrow input is read column by column straight into numpy (string keys dictionary-encoded
        once), with no DataFrame: ``df`` is built only if a caller asks for it.
        ``skip``: list columns not needed by the caller (left all-missing), e.g. the tail
        estimator never reads ``confidence_logit`` or ``survival``."""
        df = src = None
        if isinstance(data, (pa.Table, pa.RecordBatch)):
            tbl = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
            list_cols = {c: tbl.column(c) for c in tbl.column_names
                         if isinstance(tbl.schema.field(c).type, pa.ListType) and c not in skip}
            src = tbl.drop([c for c in tbl.column_names if c in list_cols or c in skip])
            cols, nrows = src.column_names, src.num_rows
            get = lambda name, fill, dtype: _arrow_col(src, name, fill, dtype)  # noqa: E731
        else:
            df = data.reset_index(drop=True)
            list_cols = {c: df[c] for c in df.columns
                         if c in (*_LIST_FLOAT, "draft_tokens", "committed_tokens") and c not in skip}
            df = df.drop(columns=list(list_cols) + [c for c in skip if c in df.columns])
            cols, nrows = list(df.columns), len(df)
            get = lambda name, fill, dtype: _col(df0, name, fill, dtype)  # noqa: E731 (input row order)
        required = ("rid", "prefix_len", "window", "correct_drafts")
        missing = [c for c in required if c not in cols]
        if missing:
            raise ValueError(f"request_steps frame lacks required column(s) {missing}")
        if nrows == 0:
            raise ValueError("request_steps frame is empty")
        if df is not None:
            df = df0 = _pandas_defaults(df)
            wl = _workload_codes(df["workload"]) if "workload" in df.columns else None
        else:
            wl = _workload_codes(src.column("workload")) if "workload" in cols else None
        if wl is None:
            wl = (np.zeros(nrows, np.int32), np.array([NO_WORKLOAD], object))
        notes: list[str] = []
        if gamma is None:
            if "draft_tokens" in list_cols:
                lens = pa.compute.list_value_length(pa.array(list(list_cols["draft_tokens"]), from_pandas=True)) if not isinstance(list_cols["draft_tokens"], (pa.Array, pa.ChunkedArray)) else pa.compute.list_value_length(list_cols["draft_tokens"])
                gamma = int(pa.compute.max(lens).as_py() or 0)
            if not gamma:
                gamma = int(get("window", 0, np.int64).max())
                notes.append(f"gamma not given and no draft_tokens: using max(window)={gamma}")
        G = int(gamma)
        has_step = "step_index" in cols and not (src.column("step_index").null_count if src is not None
                                                 else df["step_index"].isna().any())
        step_key = "step_index" if has_step else "forward_ct"
        req0 = _arrow_request_codes(src) if src is not None else None
        if req0 is None:
            req0 = _request_codes(df if df is not None else _pandas_defaults(src.select(
                [c for c in ("run_id", "rid") if c in cols]).to_pandas()))
        ep = get("epoch", 0, np.int64)
        stp = get(step_key, 0, np.int64)
        fct0 = get("forward_ct", 0, np.int64)
        keyv = [fct0, stp, ep, req0]
        sorted_already = True
        eq = np.ones(nrows - 1, bool)
        for kv in reversed(keyv):  # lexicographic check, most significant first
            dv = np.diff(kv)
            if np.any(eq & (dv < 0)):
                sorted_already = False
                break
            eq &= dv == 0
        order = None if sorted_already else np.lexsort(keyv)

        def sort(a):  # a per-input-row array in frame row order
            return a if order is None else a[order]

        if df is not None and order is not None:
            df = df.iloc[order].reset_index(drop=True)

        def take(name, width, fill, dtype):
            if name in skip:  # not needed by the caller: a read-only view of ``fill``, no memory
                return np.broadcast_to(np.array(fill, dtype), (nrows, width))
            if name not in list_cols:
                return np.full((nrows, width), fill, dtype=dtype)
            col = list_cols[name]
            if order is not None:
                if isinstance(col, (pa.Array, pa.ChunkedArray)):
                    # pad, then reorder the padded rows (row-wise, so the same array): an Arrow take of a
                    # list column costs several times a numpy take of its padded rows
                    return padded(col, width, fill, dtype)[order]
                else:
                    col = col.iloc[order] if isinstance(col, pd.Series) else [col[i] for i in order]
            return padded(col, width, fill, dtype)

        pending = {}

        def take_lazy(name, width, fill, dtype):  # Arrow input: padded on first use (BlockFrame._padded)
            if src is not None and name in list_cols:
                pending[name] = (list_cols[name], width, fill, dtype)
                return None
            return take(name, width, fill, dtype)

        draft = take("draft_tokens", G, -1, np.int64)
        committed = take_lazy("committed_tokens", G + 1, -1, np.int64)
        conf = take_lazy("confidence", G, np.nan, np.float64)
        zl = take("confidence_logit", G, np.nan, np.float64)
        dlp = take_lazy("draft_logprob", G, np.nan, np.float64)
        tlp = take_lazy("target_logprob", G, np.nan, np.float64)

        window = sort(get("window", 0, np.int64))
        correct = sort(get("correct_drafts", 0, np.int64))
        prefix = sort(get("prefix_len", 0, np.int64))
        bonus = sort(get("bonus_token", -1, np.int64))
        n = nrows
        if "committed_tokens" not in list_cols and (draft >= 0).any():
            # committed = accepted drafts + bonus (SGLang dumps carry no committed list)
            k = np.arange(G + 1)[None, :]
            committed = np.where(k < correct[:, None], np.pad(draft, ((0, 0), (0, 1)), constant_values=-1), -1)
            committed[np.arange(n), np.minimum(correct, G)] = bonus
            notes.append("committed_tokens reconstructed from draft_tokens[:correct_drafts] + bonus_token")
        elif (bonus < 0).any() and "committed_tokens" in list_cols:
            if committed is None:
                committed = take("committed_tokens", G + 1, -1, np.int64)
                del pending["committed_tokens"]
            ok = bonus < 0
            bonus = np.where(ok, committed[np.arange(n), np.clip(correct, 0, G)], bonus)
        temperature = sort(get("temperature", np.nan, np.float64))  # as stored (filled on write)
        if np.isnan(temperature).any():  # unknown: read by the one rule (acceptscope.domain.temperature)
            notes.append(UNKNOWN_NOTE)
            temperature = as_served(temperature)
        # codes by first appearance in row order (sorted rows: req0 already is)
        request = req0.astype(np.int64) if order is None else pd.factorize(req0[order])[0].astype(np.int64)
        epoch = sort(ep)
        # continuity: next prefix == prefix + correct + 1 within a request (and epoch)
        new_req = np.ones(n, bool)
        new_req[1:] = (request[1:] != request[:-1]) | (epoch[1:] != epoch[:-1])
        cont = np.zeros(n, bool)
        cont[1:] = prefix[1:] == prefix[:-1] + correct[:-1] + 1
        seg_start = new_req | ~cont
        segment = np.cumsum(seg_start) - 1
        breaks = int((~new_req & ~cont).sum())
        if breaks:
            notes.append(f"{breaks} prefix_len discontinuities: requests split into segments there")
        if df is not None:
            fin = df["finished"].fillna(False).to_numpy(bool) if "finished" in df.columns else np.zeros(n, bool)
        else:
            fin = sort(get("finished", False, bool))
        return cls(
            gamma=G, _df=df, draft=draft, _committed=committed, _confidence=conf, confidence_logit=zl,
            _draft_logprob=dlp, _target_logprob=tlp, window=window, correct=correct,
            cap_trim=sort(get("cap_trim", -1, np.int64)), ceiling=sort(get("ceiling", -1, np.int64)),
            prefix=prefix, bonus=bonus, temperature=temperature, request=request, segment=segment,
            finished=fin, notes=notes, forward_ct=sort(fct0), workload_codes=sort(wl[0]), workload_labels=wl[1],
            _src=src, _order=order, _pending=pending,
        )

    # ------------------------------------------------------------------
    def stream(self) -> dict:
        """Per-segment committed stream by absolute position.

        Returns arrays over all committed positions (concatenated in row order):
        ``realized`` (the committed token), ``scored_tok`` (the draft the target scored at
        that position on the committed path, -1 if none), ``scored_lp`` (its log p, NaN if
        unknown), and per segment ``seg_first_pos`` / ``seg_offset`` / ``seg_len`` to map an
        absolute position ``P`` of segment ``g`` to ``seg_offset[g] + P - seg_first_pos[g]``.
        """
        if self._stream is not None:
            return self._stream
        G = self.gamma
        fast = self._stream_from_lists()
        if fast is not None:  # the committed lists are the stream as they are: no padded copy
            realized, cnt = fast
            ends = np.cumsum(cnt)
            # entry (row r, j) of the drafts sits at r * G + j
            sa = np.repeat(np.arange(self.n) * G - (ends - cnt), cnt)
            sa += np.arange(realized.size)
        else:
            # committed positions per row: correct + 1, fewer when the request hit its token limit
            # mid-step and the engine committed a truncated list (missing entries are -1)
            present = self.committed >= 0
            cnt = present[:, 0].astype(np.int64)
            for j in range(1, G + 1):  # column by column: a row-wise sum over G + 1 entries is slower
                cnt += present[:, j]
            np.minimum(cnt, self.correct + 1, out=cnt)
            on = np.arange(G + 1)[None, :] < cnt[:, None]  # (row, j) committed; row-major = stream order
            at = np.flatnonzero(on)  # one flat index, three takes
            realized = self.committed.reshape(-1).take(at)
            # entry (row r, j) of the drafts sits at r * G + j (at - r)
            sa = at - np.repeat(np.arange(self.n), cnt)
            ends = np.cumsum(cnt)
        # the drafts scored at j < G in stream order; -1 / NaN put back at each bonus entry (j == G:
        # no draft there), the last entry of every row with cnt > G
        bonus_at = ends[cnt > G] - 1
        scored_tok = self.draft.reshape(-1).take(sa, mode="clip")
        scored_tok[bonus_at] = -1
        fc = None  # the target log-probs as Arrow has them, when they are the padded rows as they are
        if self._order is None and self._target_logprob is None and "target_logprob" in self._pending:
            if "target_logprob" not in self._flat:
                self._flat["target_logprob"] = _fixed_chunks(self._pending["target_logprob"][0], G)
            fc = self._flat["target_logprob"]
        if fc is not None:
            scored_lp = _chunk_flat(fc, sa).astype(np.float64, copy=False)
        else:
            scored_lp = np.ascontiguousarray(self.target_logprob).reshape(-1).take(sa, mode="clip")
        scored_lp[bonus_at] = np.nan
        nseg = int(self.segment.max()) + 1 if self.n else 0
        seg_first_row = np.searchsorted(self.segment, np.arange(nseg))
        seg_first_pos = self.prefix[seg_first_row] + 1
        starts = ends - cnt  # segments are runs of rows: their lengths from the running sum
        seg_offset = starts[seg_first_row]
        seg_len = np.diff(np.append(seg_offset, ends[-1] if self.n else 0))
        self._stream = dict(realized=realized, scored_tok=scored_tok, scored_lp=scored_lp,
                            seg_first_pos=seg_first_pos, seg_offset=seg_offset, seg_len=seg_len)
        return self._stream

    def _stream_from_lists(self) -> tuple[np.ndarray, np.ndarray] | None:
        """(realized, count per row) read straight off Arrow ``committed_tokens`` when every list is
        exactly a row's committed tokens (no NULL, no negative token, at most ``correct + 1`` and
        ``G + 1`` entries, input in frame order): what the padded path would select. Else None."""
        if self._committed is not None or self._order is not None or "committed_tokens" not in self._pending:
            return None
        col = self._pending["committed_tokens"][0]
        chunks = [c for c in (col.chunks if isinstance(col, pa.ChunkedArray) else [col]) if len(c)]
        if not chunks or any(c.null_count for c in chunks):
            return None
        lens, vals = [], []
        for c in chunks:
            o = np.asarray(c.offsets, dtype=np.int64)
            v = c.values.slice(o[0], o[-1] - o[0])
            if v.null_count or not pa.types.is_integer(v.type):
                return None
            lens.append(np.diff(o))
            vals.append(v.to_numpy())
        cnt = lens[0] if len(lens) == 1 else np.concatenate(lens)
        realized = (vals[0] if len(vals) == 1 else np.concatenate(vals)).astype(np.int64, copy=False)
        if cnt.size != self.n or (realized.size and realized.min() < 0) or (cnt > self.gamma + 1).any() \
                or (cnt > self.correct + 1).any():
            return None
        return realized, cnt

    def later(self, rows: np.ndarray) -> dict:
        """For rows, look up the committed stream at every draft position ``k`` (absolute ``prefix+k+1``).

        Returns ``(len(rows), G)`` arrays ``valid`` (position committed within the segment),
        ``realized``, ``scored_tok``, ``scored_lp``.
        """
        st = self.stream()
        G = self.gamma
        seg = self.segment[rows]
        k = np.arange(G)[None, :]
        rel0 = self.prefix[rows] + 1 - st["seg_first_pos"][seg]  # stream offset of k = 0 in the segment
        valid = (rel0 >= 0)[:, None] & (k < (st["seg_len"][seg] - rel0)[:, None])
        idx = (st["seg_offset"][seg] + rel0)[:, None] + k  # out of range only where not valid
        out = {"valid": valid}
        invalid = ~valid
        for name, fill in (("realized", -1), ("scored_tok", -1), ("scored_lp", np.nan)):
            a = st[name]
            out[name] = v = a.take(idx, mode="clip") if a.size else np.full(idx.shape, fill)
            np.putmask(v, invalid, fill)
        return out

    def logits(self, temperatures: np.ndarray | None = None, clip: float = 1e-4) -> tuple[np.ndarray, str]:
        """Pre-STS confidence logits: the recorded ``confidence_logit`` where present, else
        ``T_k * logit(c)`` reconstructed from the rounded post-STS confidence (clipped)."""
        z = self.confidence_logit.copy()
        miss = np.isnan(z) & ~np.isnan(self.confidence)
        note = "confidence_logit recorded"
        if miss.any():
            T = np.ones(self.gamma) if temperatures is None else np.asarray(temperatures, float)
            c = np.clip(self.confidence, clip, 1 - clip)
            rec = T[None, :] * np.log(c / (1 - c))
            z = np.where(miss, rec, z)
            note = (f"confidence_logit reconstructed as T_k*logit(c) on {miss.any(axis=1).mean():.0%} of rows "
                    f"(c clipped to [{clip}, {1-clip}]; 4-dp rounding limits resolution near 0/1)")
        return z, note
