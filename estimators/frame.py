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

RS = schema.REQUEST_STEPS

_LIST_FLOAT = ("confidence", "survival", "confidence_logit", "draft_logprob", "target_logprob")


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
        if c.null_count == 0 and lens.max() <= width:  # short lists (committed_tokens): fill row prefixes
            dst[np.arange(width)[None, :] < lens[:, None]] = flat
            continue
        row_at = np.arange(m) * width
        dest = np.arange(flat.size) + np.repeat(row_at - (o[:-1] - o[0]), lens)
        keep = dest < np.repeat(row_at + width, lens)  # entries past width are dropped
        if c.null_count:
            keep &= np.repeat(~np.asarray(c.is_null(), dtype=bool), lens)
        dst.reshape(-1)[dest[keep]] = flat[keep]
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


def _col(df: pd.DataFrame, name: str, fill, dtype) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), fill, dtype=dtype)
    s = df[name]
    if s.dtype.kind in "iubf" and not s.hasnans:  # numeric, no NULL: no coercion
        return s.to_numpy(dtype=dtype)
    s = pd.to_numeric(s, errors="coerce")
    return s.fillna(fill).to_numpy(dtype=dtype)


NO_WORKLOAD = "(unlabelled)"  # the workload of request-steps whose traffic carried no label


@dataclass
class BlockFrame:
    """``request_steps`` of one or more runs as sorted, padded arrays (one row per request-step).

    Build with :meth:`from_request_steps`. Positions ``k >= gamma`` never exist; NaN marks a
    missing float, ``-1`` a missing token.
    """

    gamma: int
    df: pd.DataFrame  # scalar columns, sorted; index 0..n-1
    draft: np.ndarray  # (n, G) int64
    committed: np.ndarray  # (n, G+1) int64
    confidence: np.ndarray  # (n, G)
    confidence_logit: np.ndarray  # (n, G)
    draft_logprob: np.ndarray  # (n, G)
    target_logprob: np.ndarray  # (n, G)
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
    # stream built lazily
    _stream: dict | None = None

    @property
    def n(self) -> int:
        return len(self.df)

    @property
    def greedy(self) -> np.ndarray:
        return self.temperature <= 0

    @property
    def workload(self) -> np.ndarray:
        """Workload label per row (object array; :data:`NO_WORKLOAD` where the traffic carried none)."""
        if "workload" not in self.df:
            return np.full(self.n, NO_WORKLOAD, dtype=object)
        w = self.df["workload"].to_numpy(object)
        return np.where(pd.isna(w), NO_WORKLOAD, w).astype(object) if pd.isna(w).any() else w

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

        ``skip``: list columns not needed by the caller (left all-missing), e.g. the tail
        estimator never reads ``confidence_logit`` or ``survival``."""
        if isinstance(data, (pa.Table, pa.RecordBatch)):
            tbl = pa.Table.from_batches([data]) if isinstance(data, pa.RecordBatch) else data
            lists = {c: tbl.column(c) for c in tbl.column_names
                     if isinstance(tbl.schema.field(c).type, pa.ListType) and c not in skip}
            tbl = tbl.drop([c for c in skip if c in tbl.column_names])
            df = tbl.drop([c for c in lists]).to_pandas(split_blocks=True)  # no 2-D block copy: ~2x faster
            list_cols = {c: v for c, v in lists.items()}
        else:
            df = data.reset_index(drop=True)
            list_cols = {c: df[c] for c in df.columns
                         if c in (*_LIST_FLOAT, "draft_tokens", "committed_tokens") and c not in skip}
            df = df.drop(columns=list(list_cols) + [c for c in skip if c in df.columns])
        required = ("rid", "prefix_len", "window", "correct_drafts")
        missing = [c for c in required if c not in df.columns]
        if missing:
            raise ValueError(f"request_steps frame lacks required column(s) {missing}")
        if len(df) == 0:
            raise ValueError("request_steps frame is empty")
        if "run_id" not in df.columns:
            df["run_id"] = "run"
        if "workload" in df.columns and df["workload"].isna().any():
            # SGLang telemetry carries no workload: one group of its own, never a NULL group key
            df["workload"] = df["workload"].astype(object).where(df["workload"].notna(), NO_WORKLOAD)
        for c, d in (("epoch", 0), ("forward_ct", 0), ("rank", 0)):
            if c not in df.columns:
                df[c] = d
        notes: list[str] = []
        if gamma is None:
            if "draft_tokens" in list_cols:
                lens = pa.compute.list_value_length(pa.array(list(list_cols["draft_tokens"]), from_pandas=True)) if not isinstance(list_cols["draft_tokens"], (pa.Array, pa.ChunkedArray)) else pa.compute.list_value_length(list_cols["draft_tokens"])
                gamma = int(pa.compute.max(lens).as_py() or 0)
            if not gamma:
                gamma = int(df["window"].max())
                notes.append(f"gamma not given and no draft_tokens: using max(window)={gamma}")
        G = int(gamma)
        step_key = "step_index" if "step_index" in df.columns and df["step_index"].notna().all() else "forward_ct"
        req0 = _request_codes(df)
        ep = df["epoch"].to_numpy(np.int64)
        stp = df[step_key].to_numpy(np.int64)
        fct0 = df["forward_ct"].to_numpy(np.int64)
        keyv = [fct0, stp, ep, req0]
        sorted_already = True
        eq = np.ones(len(df) - 1, bool)
        for kv in reversed(keyv):  # lexicographic check, most significant first
            dv = np.diff(kv)
            if np.any(eq & (dv < 0)):
                sorted_already = False
                break
            eq &= dv == 0
        order = np.arange(len(df)) if sorted_already else np.lexsort(keyv)
        if not sorted_already:
            df = df.iloc[order].reset_index(drop=True)

        def take(name, width, fill, dtype):
            if name in skip:  # not needed by the caller: a read-only view of ``fill``, no memory
                return np.broadcast_to(np.array(fill, dtype), (len(df), width))
            if name not in list_cols:
                return np.full((len(df), width), fill, dtype=dtype)
            col = list_cols[name]
            if not sorted_already:
                if isinstance(col, (pa.Array, pa.ChunkedArray)):
                    # pad, then reorder the padded rows (row-wise, so the same array): an Arrow take of a
                    # list column costs several times a numpy take of its padded rows
                    return padded(col, width, fill, dtype)[order]
                else:
                    col = col.iloc[order] if isinstance(col, pd.Series) else [col[i] for i in order]
            return padded(col, width, fill, dtype)

        draft = take("draft_tokens", G, -1, np.int64)
        committed = take("committed_tokens", G + 1, -1, np.int64)
        conf = take("confidence", G, np.nan, np.float64)
        zl = take("confidence_logit", G, np.nan, np.float64)
        dlp = take("draft_logprob", G, np.nan, np.float64)
        tlp = take("target_logprob", G, np.nan, np.float64)

        window = _col(df, "window", 0, np.int64)
        correct = _col(df, "correct_drafts", 0, np.int64)
        prefix = _col(df, "prefix_len", 0, np.int64)
        bonus = _col(df, "bonus_token", -1, np.int64)
        if "committed_tokens" not in list_cols and (draft >= 0).any():
            # committed = accepted drafts + bonus (SGLang dumps carry no committed list)
            k = np.arange(G + 1)[None, :]
            committed = np.where(k < correct[:, None], np.pad(draft, ((0, 0), (0, 1)), constant_values=-1), -1)
            committed[np.arange(len(df)), np.minimum(correct, G)] = bonus
            notes.append("committed_tokens reconstructed from draft_tokens[:correct_drafts] + bonus_token")
        elif (bonus < 0).any() and "committed_tokens" in list_cols:
            ok = bonus < 0
            bonus = np.where(ok, committed[np.arange(len(df)), np.clip(correct, 0, G)], bonus)
        temperature = _col(df, "temperature", np.nan, np.float64)
        if np.isnan(temperature).any():
            notes.append("temperature missing on some rows: treated as sampled (T>0)")
            temperature = np.where(np.isnan(temperature), 1.0, temperature)
        # codes by first appearance in row order (sorted rows: req0 already is)
        request = req0.astype(np.int64) if sorted_already else pd.factorize(req0[order])[0].astype(np.int64)
        # continuity: next prefix == prefix + correct + 1 within a request (and epoch)
        new_req = np.ones(len(df), bool)
        new_req[1:] = (request[1:] != request[:-1]) | (df["epoch"].to_numpy()[1:] != df["epoch"].to_numpy()[:-1])
        cont = np.zeros(len(df), bool)
        cont[1:] = prefix[1:] == prefix[:-1] + correct[:-1] + 1
        seg_start = new_req | ~cont
        segment = np.cumsum(seg_start) - 1
        breaks = int((~new_req & ~cont).sum())
        if breaks:
            notes.append(f"{breaks} prefix_len discontinuities: requests split into segments there")
        fin = df["finished"].fillna(False).to_numpy(bool) if "finished" in df.columns else np.zeros(len(df), bool)
        return cls(
            gamma=G, df=df, draft=draft, committed=committed, confidence=conf, confidence_logit=zl,
            draft_logprob=dlp, target_logprob=tlp, window=window, correct=correct,
            cap_trim=_col(df, "cap_trim", -1, np.int64), ceiling=_col(df, "ceiling", -1, np.int64),
            prefix=prefix, bonus=bonus, temperature=temperature, request=request, segment=segment,
            finished=fin, notes=notes,
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
        # committed positions per row: correct + 1, fewer when the request hit its token limit
        # mid-step and the engine committed a truncated list (missing entries are -1)
        present = self.committed >= 0
        cnt = present[:, 0].astype(np.int64)
        for j in range(1, G + 1):  # column by column: a row-wise sum over G + 1 entries is slower
            cnt += present[:, j]
        np.minimum(cnt, self.correct + 1, out=cnt)
        on = np.arange(G + 1)[None, :] < cnt[:, None]  # (row, j) committed; row-major = stream order
        realized = self.committed[on]
        # the drafts scored at j < G in stream order, then -1 / NaN put back at each bonus entry
        # (j == G: no draft there), i.e. after the G drafted entries of every row with cnt > G
        drafted = np.arange(G)[None, :] < np.minimum(cnt, G)[:, None]
        full = np.flatnonzero(cnt > G)
        bonus_at = np.cumsum(cnt)[full] - 1 - np.arange(full.size)
        scored_tok = np.insert(self.draft[drafted], bonus_at, -1)
        scored_lp = np.insert(self.target_logprob[drafted], bonus_at, np.nan)
        nseg = int(self.segment.max()) + 1 if self.n else 0
        seg_first_row = np.searchsorted(self.segment, np.arange(nseg))
        seg_first_pos = self.prefix[seg_first_row] + 1
        seg_len = np.bincount(self.segment, weights=cnt, minlength=nseg).astype(np.int64)
        seg_offset = np.cumsum(seg_len) - seg_len
        self._stream = dict(realized=realized, scored_tok=scored_tok, scored_lp=scored_lp,
                            seg_first_pos=seg_first_pos, seg_offset=seg_offset, seg_len=seg_len)
        return self._stream

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
        for name, fill in (("realized", -1), ("scored_tok", -1), ("scored_lp", np.nan)):
            a = st[name]
            out[name] = v = a.take(idx, mode="clip") if a.size else np.full(idx.shape, fill)
            np.putmask(v, ~valid, fill)
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
