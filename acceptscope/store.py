"""The DuckDB telemetry store: schema creation, idempotent Arrow appends, readers.

Concurrency design: DuckDB allows one read-write *process* per file. The writer
therefore holds its connection only for the duration of a flush (open, append
one Arrow batch per table in one transaction, close), and readers open short
``read_only`` connections with retry. A dashboard can thus read while a run is
being written; each sees a consistent, committed snapshot.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

import duckdb
import pandas as pd
import pyarrow as pa

from acceptscope import schema

_DUCK_TYPES = {
    pa.string(): "VARCHAR",
    pa.int32(): "INTEGER",
    pa.int64(): "BIGINT",
    pa.float32(): "FLOAT",
    pa.float64(): "DOUBLE",
    pa.bool_(): "BOOLEAN",
    pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ",
    schema.F32_LIST: "FLOAT[]",
    schema.F64_LIST: "DOUBLE[]",
    schema.I32_LIST: "INTEGER[]",
    schema.I64_LIST: "BIGINT[]",
}


def duck_type(t: pa.DataType) -> str:
    try:
        return _DUCK_TYPES[t]
    except KeyError:
        raise TypeError(f"no DuckDB type mapping for Arrow type {t}") from None


def create_table_sql(t: schema.Table) -> str:
    cols = ",\n  ".join(
        f'"{c.name}" {duck_type(c.type)}{"" if c.nullable else " NOT NULL"}' for c in t.columns
    )
    key = ", ".join(f'"{k}"' for k in t.key)
    return f'CREATE TABLE IF NOT EXISTS "{t.name}" (\n  {cols},\n  PRIMARY KEY ({key})\n)'


def _connect(path: str | Path, read_only: bool, timeout_s: float) -> duckdb.DuckDBPyConnection:
    """Open a connection, retrying while another process holds the file lock."""
    deadline = time.monotonic() + timeout_s
    delay = 0.005
    while True:
        try:
            return duckdb.connect(str(path), read_only=read_only)
        except duckdb.IOException as e:
            if "lock" not in str(e).lower() or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


def as_arrow(t: schema.Table, data: Any) -> pa.Table:
    """Coerce row dicts, a DataFrame, or Arrow data into table ``t``'s exact schema."""
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        missing = [n for n in t.names if n not in data.column_names]
        for n in missing:
            data = data.append_column(n, pa.nulls(data.num_rows, t.column(n).type))
        return data.select(t.names).cast(t.arrow_schema)
    if isinstance(data, pd.DataFrame):
        data = data.to_dict("records")
    if isinstance(data, Mapping):
        data = [data]
    return pa.Table.from_batches([schema.to_batch(t, list(data))])


class Store:
    """A DuckDB file holding acceptscope telemetry."""

    def __init__(self, path: str | Path, *, lock_timeout_s: float = 30.0):
        self.path = Path(path)
        self.lock_timeout_s = lock_timeout_s
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with self.connect() as con:
            for t in schema.ALL_TABLES:
                con.execute(create_table_sql(t))

    # -- connections ------------------------------------------------------
    @contextmanager
    def connect(self, read_only: bool = False) -> Iterator[duckdb.DuckDBPyConnection]:
        con = _connect(self.path, read_only, self.lock_timeout_s)
        try:
            yield con
        finally:
            con.close()

    # -- writes -----------------------------------------------------------
    def append(self, tables: Mapping[str, Any]) -> dict[str, int]:
        """Append data to several tables in one transaction; duplicates by natural key are ignored.

        Returns the number of rows offered per table.
        """
        arrow = {name: as_arrow(schema.table(name), data) for name, data in tables.items()}
        with self.connect() as con:
            con.execute("BEGIN TRANSACTION")
            try:
                for name, tbl in arrow.items():
                    if tbl.num_rows == 0:
                        continue
                    con.register("_incoming", tbl)
                    con.execute(f'INSERT OR IGNORE INTO "{name}" SELECT * FROM _incoming')
                    con.unregister("_incoming")
                con.execute("COMMIT")
            except Exception:
                con.execute("ROLLBACK")
                raise
        return {name: tbl.num_rows for name, tbl in arrow.items()}

    # -- reads ------------------------------------------------------------
    def query_arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table:
        with self.connect(read_only=True) as con:
            return con.execute(sql, params or []).fetch_arrow_table()

    def query_df(self, sql: str, params: Sequence[Any] | None = None) -> pd.DataFrame:
        with self.connect(read_only=True) as con:
            return con.execute(sql, params or []).df()

    def read_table(self, name: str, run_id: str | Sequence[str] | None = None) -> pd.DataFrame:
        """Read one table as a DataFrame, optionally filtered to one or more runs."""
        t = schema.table(name)
        if run_id is None or "run_id" not in t.names:
            return self.query_df(f'SELECT * FROM "{t.name}"')
        ids = [run_id] if isinstance(run_id, str) else list(run_id)
        return self.query_df(f'SELECT * FROM "{t.name}" WHERE run_id IN (SELECT UNNEST(?))', [ids])

    def runs(self) -> pd.DataFrame:
        return self.query_df('SELECT * FROM runs ORDER BY started_at')

    def counts(self) -> dict[str, int]:
        with self.connect(read_only=True) as con:
            return {
                t.name: con.execute(f'SELECT count(*) FROM "{t.name}"').fetchone()[0]
                for t in schema.ALL_TABLES
            }
