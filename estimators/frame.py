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

from acceptscope import schema

RS = schema.REQUEST_STEPS

_LIST_FLOAT = ("confidence", "survival", "confidence_logit", "draft_logprob", "target_logprob")


def padded(values, width: int, fill: float | int = np.nan, dtype=np.float64) -> np.ndarray:
    """Ragged list column (Arrow or pandas) -> ``(n, width)`` array; missing/NULL entries -> ``fill``."""
    arr = values if isinstance(values, (pa.Array, pa.ChunkedArray)) else pa.array(list(values), from_pandas=True)
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks() if arr.num_chunks else pa.array([], type=arr.type)
    n = len(arr)
    out = np.full((n, width), fill, dtype=dtype)
    if n == 0 or pa.types.is_null(arr.type):
        return out
    if not (pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type)):
        raise TypeError(f"expected a list column, got {arr.type}")
    offsets = np.asarray(arr.offsets, dtype=np.int64)
    flat = arr.values
    if (arr.null_count == 0 and offsets[-1] - offsets[0] == n * width and np.all(np.diff(offsets) == width)):
        # fixed-length fast path (the engine always writes gamma entries); NULL elements -> fill
        sl = flat.slice(offsets[0], n * width)
        if sl.null_count:
            sl = pa.compute.fill_null(sl.cast(pa.float64()), float(fill))
        vals = np.asarray(sl.to_numpy(zero_copy_only=False), dtype=np.float64)
        return vals.reshape(n, width).astype(dtype, copy=False)
    lens = np.diff(offsets)
    if arr.null_count:
        lens = np.where(np.asarray(arr.is_null(), dtype=bool), 0, lens)
    flat = arr.values
    fvals = np.asarray(flat.to_numpy(zero_copy_only=False), dtype=np.float64)
    fnull = np.asarray(flat.is_null(), dtype=bool) if flat.null_count else None
    row = np.repeat(np.arange(n), lens)
    pos = np.arange(row.size) - np.repeat(np.cumsum(lens) - lens, lens)
    src = offsets[:-1][row] + pos
    keep = pos < width
    if fnull is not None:
        keep &= ~fnull[src]
    row, pos = row[keep], pos[keep]
    vals = fvals[src[keep]]
    out[row, pos] = vals
    return out


def _col(df: pd.DataFrame, name: str, fill, dtype) -> np.ndarray:
    if name not in df.columns:
        return np.full(len(df), fill, dtype=dtype)
    s = pd.to_numeric(df[name], errors="coerce")
    return s.fillna(fill).to_numpy(dtype=dtype)


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
            df = tbl.drop([c for c in lists]).to_pandas()
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
        req0 = pd.factorize(df["run_id"].astype(str) + "\x00" + df["rid"].astype(str), sort=True)[0] \
            if df["run_id"].nunique() > 1 else pd.factorize(df["rid"], sort=True)[0]
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
            if name not in list_cols:
                return np.full((len(df), width), fill, dtype=dtype)
            col = list_cols[name]
            if not sorted_already:
                if isinstance(col, (pa.Array, pa.ChunkedArray)):
                    col = col.take(pa.array(order))
                else:
                    col = col.iloc[order] if isinstance(col, pd.Series) else [col[i] for i in order]
            return padded(col, width, fill, np.float64).astype(dtype) if dtype != np.float64 else padded(col, width, fill, dtype)

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
        request = (req0[order] if not sorted_already else req0).astype(np.int64)
        request = pd.factorize(request)[0].astype(np.int64)
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
        cnt = np.minimum(self.correct + 1, (self.committed >= 0).sum(1))
        row = np.repeat(np.arange(self.n), cnt)
        j = np.arange(row.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        realized = self.committed[row, np.minimum(j, G)]
        jd = np.minimum(j, G - 1)
        has_draft = j < G
        scored_tok = np.where(has_draft, self.draft[row, jd], -1)
        scored_lp = np.where(has_draft, self.target_logprob[row, jd], np.nan)
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
        P = self.prefix[rows][:, None] + np.arange(G)[None, :] + 1
        rel = P - st["seg_first_pos"][seg][:, None]
        valid = (rel >= 0) & (rel < st["seg_len"][seg][:, None])
        idx = np.where(valid, st["seg_offset"][seg][:, None] + rel, 0)
        out = {"valid": valid}
        for k in ("realized", "scored_tok", "scored_lp"):
            a = st[k]
            if a.size == 0:
                v = np.full(idx.shape, -1 if k != "scored_lp" else np.nan)
            else:
                v = a[idx]
            fill = np.nan if k == "scored_lp" else -1
            out[k] = np.where(valid, v, fill)
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
