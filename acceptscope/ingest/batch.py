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
from acceptscope.ingest.rejects import make_reject


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


REJECT_CAP = 1000  # reject rows kept per batch (one file, one poll); the rest are counted in one summary row


@dataclass
class IngestBatch:
    """Rows per schema table, plus how many input records were skipped as duplicates.

    Rejects are capped at :data:`REJECT_CAP` rows per batch: past it each reject is only counted,
    in one summary reject row (``N more rejects ... not stored``), so a file of a million bad
    records costs a bounded amount of memory and store space. :meth:`rejects_total` counts them all.
    """

    tables: dict[str, Sequence[dict]] = field(default_factory=dict)
    duplicates: dict[str, int] = field(default_factory=dict)
    rejects_dropped: int = 0
    _reject_summary: Any = field(default=None, repr=False, compare=False)

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
        if len(self.tables.get("rejects", ())) - (self._reject_summary is not None) < REJECT_CAP:
            self.add("rejects", row)
        else:
            self._drop_rejects(1, row)

    def _drop_rejects(self, n: int, first: dict) -> None:
        if not n:
            return
        self.rejects_dropped += n
        if self._reject_summary is None:
            self._reject_summary = dict(first, line=0, field="$", raw=None)
            self.add("rejects", self._reject_summary)
        first_msg = self._reject_summary.setdefault(
            "_first", first.get("_first") or f"{first['field']}: {first['reason']}"[:300])
        self._reject_summary["reason"] = (
            f"{self.rejects_dropped} more rejects not stored (at most {REJECT_CAP} per file or poll); "
            f"first of them: {first_msg}")

    def rejects_total(self) -> int:
        """Rejects found, stored or only counted past the cap."""
        return len(self.tables.get("rejects", ())) - (self._reject_summary is not None) + self.rejects_dropped

    def note_duplicates(self, name: str, n: int) -> None:
        if n:
            self.duplicates[name] = self.duplicates.get(name, 0) + n

    def merge(self, *others: "IngestBatch") -> "IngestBatch":
        """Fold other batches into this one (in order); returns self."""
        for o in others:
            for name, rows in o.tables.items():
                if name == "rejects":
                    for r in rows:
                        if r is not o._reject_summary:
                            self.reject(r)
                    if o._reject_summary is not None:
                        self._drop_rejects(o.rejects_dropped, o._reject_summary)
                    continue
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

    def storable(self, source: str, run_id: Any = None) -> dict[str, pa.Table]:
        """:meth:`arrow_tables`, except that a row no Arrow column can hold (an int beyond its column's
        width, a string that is not UTF-8) is moved to ``rejects`` (named by its column) instead of
        failing the conversion of every row of the file. The parsers reject such values first, by
        their input field; this is the net under them. Bad rows are found by bisection, so a large
        table with one bad row costs O(log n) conversions, not n."""
        moved: list[dict] = []
        for t in schema.ALL_TABLES:
            rows = self.tables.get(t.name)
            if t.name == "rejects" or rows is None or not len(rows) or not isinstance(rows, list):
                continue
            try:
                schema.to_batch(t, rows)
                continue
            except _UNSTORABLE:
                pass
            good: list[dict] = []
            todo = [(0, len(rows))]
            while todo:
                lo, hi = todo.pop()
                try:
                    schema.to_batch(t, rows[lo:hi])
                    good.extend(rows[lo:hi])
                    continue
                except _UNSTORABLE as e:
                    if hi - lo > 1:
                        mid = (lo + hi) // 2
                        todo += [(mid, hi), (lo, mid)]  # left half first: rows keep their order
                        continue
                    err = e
                row = rows[lo]
                col, why = _unstorable_column(t, row, err)
                moved.append(make_reject(source, int(row.get("source_line") or 0), f"{t.name}.{col}",
                                         f"value cannot be stored: {why}", None, row.get("run_id", run_id)))
            self.tables[t.name] = good
        for r in moved:
            self.reject(r)
        return self.arrow_tables()

    def __bool__(self) -> bool:
        return any(len(v) for v in self.tables.values())

    def write(self, store: Any) -> dict[str, int]:
        """Write every table to a Store (streaming writer if it has one)."""
        payload = self.arrow_tables()
        if not payload:
            return {}
        return store.append(payload)


_UNSTORABLE = (pa.ArrowException, OverflowError, ValueError, TypeError, UnicodeError)


def _unstorable_column(t: Any, row: dict, err: BaseException) -> tuple[str, str]:
    """(column, reason) of the first value of ``row`` its column cannot hold."""
    for c in t.columns:
        try:
            pa.array([row.get(c.name)], type=c.type)
        except _UNSTORABLE as e:
            return c.name, f"{type(e).__name__}: {str(e)[:200]}"
    return "$", f"{type(err).__name__}: {str(err)[:200]}"


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
