"""Decode one JSON document that may carry NaN / Infinity tokens.

SGLang's tables are written by msgspec (strict JSON), but hand-edited or
foreign files can hold ``NaN``; those must parse so that the offending *field*
is rejected by name, rather than the whole file as "malformed".
"""

from __future__ import annotations

import json
from typing import Any

import msgspec


def decode_document(text: bytes) -> Any:
    """Parse ``text``; raises ValueError (or UnicodeDecodeError) when it is not JSON at all."""
    try:
        return msgspec.json.decode(text)
    except msgspec.DecodeError:
        return json.loads(text)  # NaN / Infinity tokens: parse, then reject the field
