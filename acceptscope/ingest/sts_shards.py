"""SGLang STS collection shards ``{stem}.{k}.pt`` -> ``sts_samples``.

Each shard is ``torch.save({"logits": f32[n, gamma], "prefix_mask": f32[n, gamma]})``
(reference §3.1): pre-sigmoid, pre-STS confidence logits and the greedy
argmax-match prefix label (so ``label_kind = 'greedy-argmax'``). Loaded with
``torch.load(weights_only=True)``. Rows are anonymous; the row index within the
shard is the key. A row with a non-finite logit or a mask that is not a 0/1
prefix is rejected alone (SGLang's own fitter silently degrades on NaN rows).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from acceptscope.ingest.batch import IngestBatch, table_from_columns
from acceptscope.ingest.rejects import describe_number, make_reject

SHARD_RE = re.compile(r"^(?P<stem>.+)\.(?P<k>\d+)\.pt$")


def shard_number(path: Path) -> Optional[int]:
    m = SHARD_RE.match(Path(path).name)
    return int(m.group("k")) if m else None


def load_shard(path: Path) -> Any:
    import torch

    return torch.load(str(path), map_location="cpu", weights_only=True)


def parse_sts_shard(
    obj: Any, *, source: str, run_id: str, shard: int, gamma: Optional[int] = None
) -> IngestBatch:
    """Translate one loaded shard object. ``gamma``: expected (run/file) gamma when known."""
    batch = IngestBatch()
    rej = lambda f, why, line=0, raw=None: batch.reject(make_reject(source, line, f, why, raw, run_id))  # noqa: E731
    if not isinstance(obj, dict):
        rej("$", f"expected a dict of tensors, got {type(obj).__name__}")
        return batch
    arrs = {}
    for key in ("logits", "prefix_mask"):
        t = obj.get(key)
        if t is None:
            rej(key, "missing")
            return batch
        try:
            a = t.detach().cpu().numpy() if hasattr(t, "detach") else np.asarray(t)
        except (TypeError, RuntimeError) as e:
            rej(key, f"not a tensor: {e}")
            return batch
        if a.ndim != 2:
            rej(key, f"expected a 2-D [n, gamma] tensor, got shape {tuple(a.shape)}")
            return batch
        if a.dtype != np.float32:
            rej(key, f"expected float32, got {a.dtype}")
            return batch
        arrs[key] = a
    logits, mask = arrs["logits"], arrs["prefix_mask"]
    if logits.shape != mask.shape:
        rej("prefix_mask", f"shape {tuple(mask.shape)} != logits shape {tuple(logits.shape)}")
        return batch
    n, g = logits.shape
    if gamma is not None and g != gamma:
        rej("logits", f"gamma mismatch: shard has {g} positions, expected {gamma}")
        return batch
    if g == 0:
        rej("logits", "zero positions")
        return batch
    bad_logit = ~np.isfinite(logits).all(axis=1)
    is01 = ((mask == 0.0) | (mask == 1.0)).all(axis=1)
    prefix = (np.diff(mask, axis=1) <= 0).all(axis=1) if g > 1 else np.ones(n, dtype=bool)
    bad = bad_logit | ~is01 | ~prefix
    for i in np.flatnonzero(bad):
        if bad_logit[i]:
            k = int(np.flatnonzero(~np.isfinite(logits[i]))[0])
            rej(f"logits[{i}][{k}]", describe_number(float(logits[i, k])), int(i) + 1, logits[i].tolist())
        elif not is01[i]:
            k = int(np.flatnonzero((mask[i] != 0) & (mask[i] != 1))[0])
            rej(f"prefix_mask[{i}][{k}]", f"{float(mask[i, k])!r} is not 0/1", int(i) + 1, mask[i].tolist())
        else:
            rej(f"prefix_mask[{i}]", "not a prefix (1s must precede 0s)", int(i) + 1, mask[i].tolist())
    keep = np.flatnonzero(~bad)
    m = len(keep)
    if m:
        offs = pa.array(np.arange(0, (m + 1) * g, g, dtype=np.int32))
        cols = {
            "run_id": pa.repeat(pa.scalar(run_id), m),
            "shard": pa.array(np.full(m, shard, dtype=np.int32)),
            "row_index": pa.array(keep.astype(np.int64)),
            "logits": pa.ListArray.from_arrays(offs, pa.array(logits[keep].reshape(-1))),
            "prefix_mask": pa.ListArray.from_arrays(offs, pa.array(mask[keep].reshape(-1))),
            "label_kind": pa.repeat(pa.scalar("greedy-argmax"), m),
        }
        batch.extend("sts_samples", table_from_columns("sts_samples", cols, m))
    return batch


def ingest_sts_shard(path: Path, *, run_id: str, gamma: Optional[int] = None) -> IngestBatch:
    path = Path(path)
    k = shard_number(path)
    try:
        obj = load_shard(path)
    except Exception as e:  # noqa: BLE001 - torch.load raises many kinds for a bad file
        b = IngestBatch()
        b.reject(make_reject(str(path), 0, "$", f"cannot load shard with torch.load(weights_only=True): {e}",
                             None, run_id))
        return b
    return parse_sts_shard(obj, source=str(path), run_id=run_id, shard=k if k is not None else 0, gamma=gamma)


def ingest_shard(path: Path, *, run_id: str, shard: Optional[int] = None, gamma: Optional[int] = None) -> IngestBatch:
    """Load and translate one shard; load errors propagate (a live tailer retries a half-written file)."""
    path = Path(path)
    k = shard if shard is not None else shard_number(path)
    obj = load_shard(path)
    return parse_sts_shard(obj, source=str(path), run_id=run_id, shard=k if k is not None else 0, gamma=gamma)
