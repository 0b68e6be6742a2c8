"""Batch-size bands: the grouping that utilization, the tail's aggregates and the validation harness share.

Why a module of its own: the bands are a reading of the decode step's batch size, used wherever results are
grouped by load; they lived in the validation harness, so every estimate imported the harness (and with it the
ingest package) to label a group.

Example::

    >>> import numpy as np
    >>> batch_band(np.array([1, 8, 9, 64, 200, np.nan])).tolist()
    ['1-8', '1-8', '9-16', '33-64', '>128', 'unknown']
"""

from __future__ import annotations

import numpy as np

BANDS = (0, 8, 16, 32, 64, 128, 1 << 30)


def batch_band(bs) -> np.ndarray:
    """Batch-size band label ('1-8', '9-16', ...; 'unknown' where the batch size is missing)."""
    bs = np.asarray(bs, float)
    edges = np.array(BANDS)
    i = np.clip(np.searchsorted(edges, bs, side="left") - 1, 0, len(edges) - 2)
    lab = np.array([f"{edges[j] + 1}-{edges[j + 1]}" if edges[j + 1] < (1 << 30) else f">{edges[j]}"
                    for j in range(len(edges) - 1)], dtype=object)
    out = lab[i]
    return np.where(np.isnan(bs), "unknown", out)
