"""The reject record: one invalid unit of input, with where it was and why.

Every parser reports bad input the same way: a row of the ``rejects`` table
naming the file, the line (1-based for JSONL; the payload ordinal, normally 1,
for a single JSON document; 0 for the whole file) and the field path of the
smallest invalid unit, e.g. ``internal_states[0].records[12].reqs[3].confidence[2]``.
Valid siblings are always kept. ``format_reject`` renders the human message
``dump.json:1: internal_states[0]...confidence[2]: NaN``.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import msgspec

from acceptscope.domain.sps import describe_number  # noqa: F401 - the one wording, re-exported

RAW_LIMIT = 2000
INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT32_MIN, INT32_MAX = -(2**31), 2**31 - 1
MAX_DEPTH = 64  # nesting of a decoded record: SGLang's deepest (a ReqDetail list in a record) is 7


def _now() -> datetime:
    return datetime.now(timezone.utc)


def safe_text(s: Any) -> str:
    """``s`` as text the store can hold: lone surrogates (``"\\ud800"`` in JSON, undecodable bytes in
    a file name) become ``\\udXXX`` escapes instead of failing the UTF-8 encode of a whole batch."""
    s = str(s)
    try:
        s.encode("utf-8")
        return s
    except UnicodeEncodeError:
        return s.encode("utf-8", "backslashreplace").decode("utf-8")


def has_surrogates(s: str) -> bool:
    try:
        s.encode("utf-8")
        return False
    except UnicodeEncodeError:
        return True


def find_poison(obj: Any, max_depth: int = MAX_DEPTH) -> tuple[str, str] | None:
    """First value of a decoded JSON record that no table can hold, as (field path, reason), else None.

    Poisoned: an int outside int64, a string (value or key) with a lone surrogate, nesting deeper
    than ``max_depth``. Walked iteratively (no recursion), so the check itself cannot overflow the
    stack. Parsers call it per record, before their own checks, so one such value rejects its
    record alone instead of failing the file's Arrow conversion.
    """
    stack: list[tuple[Any, str, int]] = [(obj, "", 0)]
    while stack:
        v, path, depth = stack.pop()
        if isinstance(v, bool) or v is None or isinstance(v, float):
            continue
        if isinstance(v, int):
            if not INT64_MIN <= v <= INT64_MAX:
                return path or "$", f"integer {_short_int(v)} outside int64"
        elif isinstance(v, str):
            if has_surrogates(v):
                return path or "$", f"string with a lone surrogate: '{safe_text(v)[:80]}'"
        elif isinstance(v, (list, dict)):
            if depth >= max_depth:
                return path or "$", f"nested deeper than {max_depth} levels"
            if isinstance(v, list):
                for k in range(len(v) - 1, -1, -1):
                    stack.append((v[k], f"{path}[{k}]", depth + 1))
            else:
                for k, x in reversed(list(v.items())):
                    if isinstance(k, str) and has_surrogates(k):
                        return path or "$", f"key with a lone surrogate: '{safe_text(k)[:80]}'"
                    stack.append((x, f"{path}.{k}" if path else str(k), depth + 1))
    return None


def _short_int(v: int) -> str:
    """A huge int for a message: ``2**70``-sized values are shown by their digit count."""
    try:
        s = str(v)
    except ValueError:  # beyond sys.get_int_max_str_digits()
        return f"with more than {4300} digits"
    return s if len(s) <= 40 else f"{s[:12]}... ({len(s)} digits)"


def decode_failure(e: BaseException) -> str:
    """The reason of an undecodable JSON text (RecursionError included), for a reject."""
    if isinstance(e, RecursionError):
        return f"nested too deeply to decode ({e})"
    return f"malformed or truncated JSON: {e}"


def raw_text(obj: Any) -> str | None:
    """The offending record as text (JSON where possible), truncated to RAW_LIMIT chars."""
    if obj is None:
        return None
    if isinstance(obj, (bytes, bytearray, memoryview)):
        text = bytes(obj[: RAW_LIMIT * 4]).decode("utf-8", errors="replace")  # (never the whole of a huge body)
    elif isinstance(obj, str):
        text = obj[: RAW_LIMIT * 4]
    else:
        try:
            text = msgspec.json.encode(obj, enc_hook=repr).decode()
        except (TypeError, ValueError, RecursionError, msgspec.EncodeError):
            try:
                text = repr(obj)
            except (ValueError, RecursionError) as e:  # too deep, or an int beyond the str() digit limit
                text = f"<{type(obj).__name__} not shown: {type(e).__name__}>"
    text = safe_text(text)
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
        "source": safe_text(source),
        "line": int(line),
        "field": safe_text(field or "$"),
        "reason": safe_text(reason),
        "run_id": None if run_id is None else safe_text(run_id),
        "raw": raw_text(raw),
        "ingested_at": _now(),
    }


def format_reject(r: dict) -> str:
    """``file:line: field: reason`` (the message printed for a reject)."""
    return f"{r['source']}:{r['line']}: {r['field']}: {r['reason']}"


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
