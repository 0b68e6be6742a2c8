"""SGLang SPS cost tables (both formats) -> ``sps_tables`` (long form).

* 1-D diagonal ``SpsCostTable``: ``sample_batch_tokens`` (strictly increasing
  ints >= 1), ``sample_steps_per_sec``, ``max_batch_tokens`` (>= last probe).
  Rows: component ``steps_per_sec`` at probe = batch tokens, ``max_batch_tokens``
  at probe -1.
* additive ``SpsAdditiveCostTable``: ``bias_seconds`` (> 0, probe -1),
  ``alpha_seconds`` at ``bs_probes``, ``theta_seconds`` at ``m_probes`` (N+M).

The format is chosen exactly as SGLang's ``load_sps_table_from_path`` does: the
additive one iff the file text contains the substring ``"bias_seconds"``
(anywhere, even in a nested key). The invariants SGLang's ``__post_init__``
enforces are checked; a table SGLang would refuse is rejected whole (its rows
would describe nothing the server can load). Probes must be JSON ints.
"""

from __future__ import annotations

import hashlib
import math
from pathlib import Path
from typing import Any, Optional

from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.jsontext import decode_document
from acceptscope.ingest.rejects import describe_number, make_reject

ADDITIVE_MARKER = b'"bias_seconds"'


def sps_kind(text: bytes) -> str:
    """'additive' or 'diagonal', decided as SGLang 0.5.23 decides it."""
    return "additive" if ADDITIVE_MARKER in text else "diagonal"


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _probes(obj: dict, name: str, minimum: int) -> tuple[Optional[list], Optional[tuple[str, str]]]:
    p = obj.get(name)
    if not isinstance(p, list) or not p:
        return None, (name, "required: a non-empty list of ints")
    for k, v in enumerate(p):
        if not _int(v):
            return None, (f"{name}[{k}]", f"expected a JSON int, got {v!r} (SGLang's msgspec decoder is strict)")
        if v < minimum:
            return None, (f"{name}[{k}]", f"{v} < {minimum}")
        if k and v <= p[k - 1]:
            return None, (f"{name}[{k}]", f"{v} <= {p[k - 1]}: probes must be strictly increasing")
    return p, None


def _values(obj: dict, name: str, n: int, positive: bool) -> tuple[Optional[list], Optional[tuple[str, str]]]:
    v = obj.get(name)
    if not isinstance(v, list):
        return None, (name, "required: a list of numbers")
    if len(v) != n:
        return None, (name, f"length {len(v)} != number of probes {n}")
    for k, x in enumerate(v):
        if not _num(x) or not math.isfinite(x):
            return None, (f"{name}[{k}]", describe_number(x) if _num(x) else f"expected a number, got {x!r}")
        if positive and x <= 0:
            return None, (f"{name}[{k}]", f"{x!r} must be > 0")
    return v, None


def parse_sps_table(text: bytes, *, source: str, run_id: Optional[str] = None) -> IngestBatch:
    batch = IngestBatch()
    try:
        obj = decode_document(text)
    except (ValueError, UnicodeDecodeError) as e:
        batch.reject(make_reject(source, 0, "$", f"malformed or truncated JSON: {e}", text, run_id))
        return batch
    kind = sps_kind(text)
    h = hashlib.sha256(text).hexdigest()

    def fail(prob: tuple[str, str]) -> IngestBatch:
        batch.reject(make_reject(source, 1, prob[0], f"{kind} SPS table: {prob[1]}", None, run_id))
        return batch

    if not isinstance(obj, dict):
        return fail(("$", f"expected an object, got {type(obj).__name__}"))
    rows: list[tuple[str, int, float]] = []
    if kind == "diagonal":
        probes, err = _probes(obj, "sample_batch_tokens", 1)
        if err:
            return fail(err)
        sps, err = _values(obj, "sample_steps_per_sec", len(probes), True)
        if err:
            return fail(err)
        mbt = obj.get("max_batch_tokens")
        if not _int(mbt):
            return fail(("max_batch_tokens", f"expected a JSON int, got {mbt!r}"))
        if mbt < probes[-1]:
            return fail(("max_batch_tokens", f"{mbt} < largest probe {probes[-1]}"))
        rows += [("steps_per_sec", p, float(v)) for p, v in zip(probes, sps)]
        rows.append(("max_batch_tokens", -1, float(mbt)))
    else:
        bias = obj.get("bias_seconds")
        if not _num(bias) or not math.isfinite(bias) or bias <= 0:
            return fail(("bias_seconds", f"{describe_number(bias) if _num(bias) else repr(bias)} (must be > 0)"))
        for probes_name, values_name in (("bs_probes", "alpha_seconds"), ("m_probes", "theta_seconds")):
            probes, err = _probes(obj, probes_name, -(2**62))
            if err:
                return fail(err)
            vals, err = _values(obj, values_name, len(probes), False)
            if err:
                return fail(err)
            rows += [(values_name, p, float(v)) for p, v in zip(probes, vals)]
        rows.append(("bias_seconds", -1, float(bias)))
    for comp, probe, value in rows:
        batch.add("sps_tables", {"table_hash": h, "kind": kind, "component": comp, "probe": probe,
                                 "value": value, "source_path": source})
    return batch


def ingest_sps_table(path: Path, *, run_id: Optional[str] = None) -> IngestBatch:
    return parse_sps_table(Path(path).read_bytes(), source=str(path), run_id=run_id)
