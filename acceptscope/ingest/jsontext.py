"""Decode one JSON document that may carry NaN / Infinity tokens.

SGLang's tables are written by msgspec (strict JSON), but hand-edited or
foreign files can hold ``NaN``; those must parse so that the offending *field*
is rejected by name, rather than the whole file as "malformed".
"""

from __future__ import annotations

import json
import re
from typing import Any, Optional

import msgspec

from acceptscope.ingest.rejects import find_poison


def decode_document(text: bytes) -> Any:
    """Parse ``text``; raises ValueError (or UnicodeDecodeError) when it is not JSON at all, is nested
    too deeply, or holds a value no table can hold (an int outside int64, a lone surrogate): the
    message then names the field."""
    try:
        try:
            obj = msgspec.json.decode(text)
        except msgspec.DecodeError:
            obj = json.loads(text)  # NaN / Infinity tokens: parse, then reject the field
    except RecursionError as e:
        raise ValueError(f"nested too deeply to decode ({e})") from None
    poison = find_poison(obj)
    if poison is not None:
        raise ValueError(f"{poison[0]}: {poison[1]}")
    return obj


# a JSON string token (escapes included) or one bracket; possessive, so a long string is one step
_TOKEN = re.compile(rb'"(?:[^"\\]++|\\.)*+"|[\[\]{}]')
TOO_DEEP = b'{"acceptscope_value_too_deep": true}'


def defuse_deep(data: bytes, max_depth: int) -> tuple[Optional[bytes], int]:
    """``data`` with every value nested deeper than ``max_depth`` replaced by :data:`TOO_DEEP`.

    For a document no decoder can read without exhausting the stack (RecursionError): after the
    replacement it decodes, and the record that held the deep value fails its own type checks
    (an object where an int or a list belongs), so it is rejected by field while its siblings are
    kept. Returns (new bytes, values replaced), or (None, 0) when nothing is that deep.
    """
    out: list[bytes] = []
    last = depth = replaced = 0
    cut = -1
    for m in _TOKEN.finditer(data):
        c = data[m.start()]
        if c == 0x22:  # a string: brackets inside it do not count
            continue
        if c in (0x5B, 0x7B):  # [ {
            depth += 1
            if depth == max_depth + 1 and cut < 0:
                cut = m.start()
        else:
            if depth == max_depth + 1 and cut >= 0:
                out += [data[last:cut], TOO_DEEP]
                last, cut = m.end(), -1
                replaced += 1
            depth -= 1
    if not replaced:
        return None, 0
    out.append(data[last:])
    return b"".join(out), replaced
