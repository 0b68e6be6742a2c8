"""What makes a /server_info record valid: the rules, once per record and once on whole columns.

Why together: the exact fallback (:func:`check_req`, :func:`check_step`: the first problem of one
ReqDetail or step header, named by field) and the fast path (``server_info_columns.translate`` and
:func:`bad_float_rows`: the same rules on a chunk's columns, only locating the rows) must agree row
for row; a rule changed here is changed for both (the fast path hands every row it flags to
:func:`check_req` for its reason).
"""

from __future__ import annotations

import math
from typing import Optional

import numpy as np

from acceptscope.ingest.rejects import INT32_MAX, INT64_MAX, describe_number, has_surrogates, safe_text
from acceptscope.ingest.server_info_records import SENTINEL_FIELDS, TIME_FIELDS, ReqDetail, StepRecord

__all__ = ["check_req", "check_step", "bad_float_rows", "surv_tol"]


def surv_tol(k: int) -> float:
    """How far survival[k] may stray from cumprod(confidence)[k]."""
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
            if abs(s - prod) > surv_tol(k):
                return f"survival[{k}]", f"{s!r} inconsistent with cumprod(confidence) {prod:.6f}"
            prev = s
    return None



def check_step(h: StepRecord, mode: str, reqs: Optional[list]) -> Optional[tuple[str, str]]:
    """First problem of a step header as (field, reason), or None."""
    if h.mode and h.mode != mode:
        return "mode", f"record mode {h.mode!r} != payload mode {mode!r}"
    for f in SENTINEL_FIELDS:
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
    for f in TIME_FIELDS + ("predicted_step_ms",):
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



def bad_float_rows(c: np.ndarray, s: np.ndarray, gamma: int) -> Optional[np.ndarray]:
    """Rows of (confidence, survival) matrices that :func:`check_req` rejects; None when there is none.

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
