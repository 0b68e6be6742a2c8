"""IngestBatch: what one parse produced, per schema table, ready for the store.

``batch.tables`` maps a schema table name (incl. ``rejects`` and ``gaps``) to its
rows. Small tables hold plain ``list[dict]``; the bulk tables (``steps``,
``request_steps``, ``sts_samples``) are built column by column straight into
Arrow (no per-row dicts on the hot path) and are exposed as :class:`ArrowRows`,
a read-only ``Sequence[dict]`` view over an Arrow table, so code that wants
dicts still gets them while the store path (:meth:`IngestBatch.arrow`) never
materialises them.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Iterator, Mapping

import pyarrow as pa

from acceptscope import schema


class ArrowRows(Sequence):
    """A ``Sequence[dict]`` over an Arrow table (rows materialised on demand)."""

    __slots__ = ("table", "_rows")

    def __init__(self, table: pa.Table):
        self.table = table
        self._rows: list[dict] | None = None

    def _materialise(self) -> list[dict]:
        if self._rows is None:
            self._rows = self.table.to_pylist()
        return self._rows

    def __len__(self) -> int:
        return self.table.num_rows

    def __getitem__(self, i):  # type: ignore[override]
        return self._materialise()[i]

    def __iter__(self) -> Iterator[dict]:
        return iter(self._materialise())

    def __eq__(self, other: object) -> bool:
        if isinstance(other, ArrowRows):
            return self.table.equals(other.table)
        if isinstance(other, Sequence):
            return list(self) == list(other)
        return NotImplemented

    def __repr__(self) -> str:
        return f"ArrowRows({self.table.num_rows} rows)"


def _to_arrow(name: str, rows: Any) -> pa.Table:
    t = schema.table(name)
    if isinstance(rows, ArrowRows):
        return rows.table
    if isinstance(rows, pa.Table):
        return rows
    return pa.Table.from_batches([schema.to_batch(t, list(rows))])


@dataclass
class IngestBatch:
    """Rows per schema table, plus how many input records were skipped as duplicates."""

    tables: dict[str, Sequence[dict]] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)

    # -- building ---------------------------------------------------------
    def add(self, name: str, row: dict) -> None:
        """Append one row (small tables)."""
        rows = self.tables.get(name)
        if rows is None:
            self.tables[name] = [row]
        elif isinstance(rows, list):
            rows.append(row)
        else:
            self.tables[name] = list(rows) + [row]

    def extend(self, name: str, rows: Any) -> None:
        """Append rows: a list of dicts, an Arrow table, or ArrowRows."""
        if isinstance(rows, pa.Table):
            rows = ArrowRows(rows)
        if not len(rows):
            return
        cur = self.tables.get(name)
        if cur is None or not len(cur):
            self.tables[name] = rows if isinstance(rows, ArrowRows) else list(rows)
        elif isinstance(cur, list) and not isinstance(rows, ArrowRows):
            cur.extend(rows)
        else:
            merged = pa.concat_tables([_to_arrow(name, cur), _to_arrow(name, rows)])
            self.tables[name] = ArrowRows(merged)

    def reject(self, row: dict) -> None:
        self.add("rejects", row)

    def note_duplicates(self, name: str, n: int) -> None:
        if n:
            self.duplicates[name] = self.duplicates.get(name, 0) + n

    def merge(self, *others: "IngestBatch") -> "IngestBatch":
        """Fold other batches into this one (in order); returns self."""
        for o in others:
            for name, rows in o.tables.items():
                self.extend(name, rows)
            for name, n in o.duplicates.items():
                self.note_duplicates(name, n)
        return self

    # -- reading ----------------------------------------------------------
    def counts(self) -> dict[str, int]:
        """Rows per table (non-empty tables only)."""
        return {k: len(v) for k, v in self.tables.items() if len(v)}

    def n(self, name: str) -> int:
        return len(self.tables.get(name, ()))

    @property
    def rejects(self) -> Sequence[dict]:
        return self.tables.get("rejects", [])

    @property
    def gaps(self) -> Sequence[dict]:
        return self.tables.get("gaps", [])

    def rows(self, name: str) -> list[dict]:
        return list(self.tables.get(name, []))

    def arrow(self, name: str) -> pa.Table:
        """One table as Arrow in its schema (cheap for ArrowRows parts)."""
        rows = self.tables.get(name)
        if rows is None:
            return schema.table(name).arrow_schema.empty_table()
        return _to_arrow(name, rows)

    def arrow_tables(self) -> dict[str, pa.Table]:
        """All non-empty tables as Arrow, in schema order (what ``store.append`` takes)."""
        return {t.name: self.arrow(t.name) for t in schema.ALL_TABLES if self.n(t.name)}

    def __bool__(self) -> bool:
        return any(len(v) for v in self.tables.values())

    def write(self, store: Any) -> dict[str, int]:
        """Write every table to a Store (streaming writer if it has one)."""
        payload = self.arrow_tables()
        if not payload:
            return {}
        return store.append(payload)


def table_from_columns(name: str, cols: Mapping[str, Any], n: int) -> pa.Table:
    """Build an Arrow table of schema table ``name`` from column arrays (missing -> NULL)."""
    t = schema.table(name)
    arrays = []
    for c in t.columns:
        v = cols.get(c.name)
        if v is None:
            arrays.append(pa.nulls(n, c.type))
        elif isinstance(v, (pa.Array, pa.ChunkedArray)):
            arrays.append(v if v.type == c.type else v.cast(c.type))
        else:
            arrays.append(pa.array(v, type=c.type))
    return pa.Table.from_arrays(arrays, schema=t.arrow_schema)
