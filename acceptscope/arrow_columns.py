"""Arrow column access shared by the store and the ingest paths.

Why a module: ``ChunkedArray.combine_chunks`` copies even a single chunk, and on the
ingest hot path (200k request-steps with LIST columns) those copies were measurable;
the store's key packing and the vectorised translation both need "this column as
one Array" without that copy.
"""

from __future__ import annotations

import pyarrow as pa

__all__ = ["one_array"]


def one_array(a: pa.ChunkedArray | pa.Array) -> pa.Array:
    """The Array of a column: its only chunk as is, else the chunks joined (a copy)."""
    if isinstance(a, pa.ChunkedArray):
        return a.chunk(0) if a.num_chunks == 1 else a.combine_chunks()
    return a
