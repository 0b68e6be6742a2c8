"""Engine telemetry -> store: columnar Arrow batches built per step, handed over in batches.

Why columnar: a step of 32 requests x gamma 7 produces ~1,500 per-position values; building
row dicts for them would cost more than the tiny model's forward. Each step becomes one
Arrow RecordBatch built from numpy arrays (list columns from flat values + offsets), and
every ``flush_steps`` steps or ``flush_seconds`` (whichever comes first; big batches keep
DuckDB's per-commit cost low, the time bound keeps live readers current) the batches go to the
store's streaming writer
(``store.writer()``) or, if that does not exist, to ``store.append``.

``request_steps`` at the length limit and at EOS (the runner's ``_emit_request_steps`` has the
full column semantics): ``acc_len = correct_drafts + 1`` and ``bonus_token`` are what the
verify step decided, exactly as SGLang records them; ``committed_tokens`` is what reached the
output, which on a request's finishing step may be shorter than ``acc_len`` because the commit
is cut at ``max_new_tokens`` and after the first EOS (as SGLang truncates its output).
"""

from __future__ import annotations

import time
from typing import Any, Optional

import numpy as np
import pyarrow as pa

from acceptscope import schema


def list_column(values: np.ndarray, typ: pa.DataType, null_nan: bool = False) -> pa.Array:
    """[B, G] numpy -> Arrow list array of length B (NaN elements become NULL if asked)."""
    B, G = values.shape
    flat = values.reshape(-1)
    mask = np.isnan(flat) if null_nan and flat.dtype.kind == "f" else None
    child = pa.array(flat, type=typ.value_type, mask=mask)
    offsets = pa.array(np.arange(0, B * G + 1, G, dtype=np.int32))
    return pa.ListArray.from_arrays(offsets, child)


def ragged_list_column(flat: np.ndarray, counts: np.ndarray, typ: pa.DataType) -> pa.Array:
    offsets = np.zeros(len(counts) + 1, dtype=np.int32)
    np.cumsum(counts, out=offsets[1:])
    return pa.ListArray.from_arrays(pa.array(offsets), pa.array(flat, type=typ.value_type))


def null_column(n: int, typ: pa.DataType) -> pa.Array:
    return pa.nulls(n, typ)


def record_batch(table: schema.Table, cols: dict[str, Any], n: int) -> pa.RecordBatch:
    """Assemble a batch in the table's column order; absent columns are NULL."""
    arrays = []
    for c in table.columns:
        v = cols.get(c.name)
        if v is None:
            arrays.append(pa.nulls(n, c.type))
        elif isinstance(v, pa.Array):
            arrays.append(v if v.type == c.type else v.cast(c.type))
        else:
            arrays.append(pa.array(v, type=c.type))
    return pa.RecordBatch.from_arrays(arrays, schema=table.arrow_schema)


class TelemetrySink:
    """Buffers per-table record batches and hands them to the store in batches."""

    def __init__(self, store: Any, flush_steps: int = 64, flush_seconds: float = 5.0):
        self.store = store
        self.flush_steps = max(1, int(flush_steps))
        self.flush_seconds = float(flush_seconds)
        self._last_hand_over = time.monotonic()
        self._pending: dict[str, list[pa.RecordBatch]] = {}
        self._steps_since = 0
        self._writer = None
        if store is not None and hasattr(store, "writer"):
            self._writer = store.writer()
        self.rows_written: dict[str, int] = {}

    def add(self, table: schema.Table, batch: pa.RecordBatch) -> None:
        self._pending.setdefault(table.name, []).append(batch)

    def add_rows(self, table: schema.Table, rows: list[dict]) -> None:
        if rows:
            self.add(table, schema.to_batch(table, rows))

    def step_done(self) -> None:
        self._steps_since += 1
        if self._steps_since >= self.flush_steps or time.monotonic() - self._last_hand_over >= self.flush_seconds:
            self.hand_over()

    def hand_over(self) -> None:
        """Give everything buffered to the writer (which commits it in the background)."""
        self._steps_since = 0
        self._last_hand_over = time.monotonic()
        if not self._pending:
            return
        tables = {name: pa.Table.from_batches(bs) for name, bs in self._pending.items() if bs}
        self._pending = {}
        for name, t in tables.items():
            self.rows_written[name] = self.rows_written.get(name, 0) + t.num_rows
        if self.store is None:
            return
        if self._writer is not None:
            for name, t in tables.items():
                self._writer.append(name, t)
        else:
            self.store.append(tables)

    def close(self) -> Optional[dict]:
        self.hand_over()
        if self._writer is not None:
            self._writer.close()
            return self._writer.stats() if hasattr(self._writer, "stats") else None
        return None
