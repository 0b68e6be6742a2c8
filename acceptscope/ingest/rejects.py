"""The reject record: one invalid unit of input, with where it was and why.

Every parser reports bad input the same way: a row of the ``rejects`` table
naming the file, the line (1-based for JSONL; the payload ordinal, normally 1,
for a single JSON document; 0 for the whole file) and the field path of the
smallest invalid unit, e.g. ``internal_states[0].records[12].reqs[3].confidence[2]``.
Valid siblings are always kept. ``format_reject`` renders the human message
``dump.json:1: internal_states[0]...confidence[2]: NaN``.
"""

from __future__ import annotations

import math
from datetime import datetime, timezone
from typing import Any

import msgspec

RAW_LIMIT = 2000

def _now() -> datetime:
    return datetime.now(timezone.utc)


def raw_text(obj: Any) -> str | None:
    """The offending record as text (JSON where possible), truncated to RAW_LIMIT chars."""
    if obj is None:
        return None
    if isinstance(obj, (bytes, bytearray, memoryview)):
        text = bytes(obj).decode("utf-8", errors="replace")
    elif isinstance(obj, str):
        text = obj
    else:
        try:
            text = msgspec.json.encode(obj, enc_hook=repr).decode()
        except (TypeError, ValueError, msgspec.EncodeError):
            text = repr(obj)
    return text if len(text) <= RAW_LIMIT else text[: RAW_LIMIT - 3] + "..."


def make_reject(
    source: str,
    line: int,
    field: str,
    reason: str,
    raw: Any = None,
    run_id: str | None = None,
) -> dict:
    """One ``rejects`` row."""
    return {
        "source": str(source),
        "line": int(line),
        "field": field or "$",
        "reason": reason,
        "run_id": run_id,
        "raw": raw_text(raw),
        "ingested_at": _now(),
    }


def format_reject(r: dict) -> str:
    """``file:line: field: reason`` (the message printed for a reject)."""
    return f"{r['source']}:{r['line']}: {r['field']}: {r['reason']}"


def describe_number(v: Any) -> str:
    """A short reason for a bad number: 'NaN', 'inf', or its repr."""
    if isinstance(v, float):
        if math.isnan(v):
            return "NaN"
        if math.isinf(v):
            return "inf" if v > 0 else "-inf"
    return repr(v)


def join_path(prefix: str, sub: str) -> str:
    """Join a field-path prefix and a msgspec-style sub path (``$.a[1]`` / ``a``)."""
    sub = sub[1:] if sub.startswith("$") else sub
    if not sub:
        return prefix
    if not prefix:
        return sub.lstrip(".")
    if sub.startswith("["):
        return prefix + sub
    return prefix + "." + sub.lstrip(".")


def msgspec_error_path(err: Exception) -> tuple[str, str]:
    """Split a msgspec ValidationError message into (path, reason).

    msgspec reports ``Expected `int`, got `str` - at `$.reqs[3].prefix_len```.
    """
    msg = str(err)
    marker = " - at `"
    if marker in msg and msg.endswith("`"):
        reason, _, path = msg.rpartition(marker)
        return path[:-1], reason
    return "$", msg


class IngestError(ValueError):
    """A whole-file problem (unreadable, unknown kind). Carries its reject row."""

    def __init__(self, reject: dict):
        super().__init__(format_reject(reject))
        self.reject = reject
