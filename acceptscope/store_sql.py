"""The record model in DuckDB's terms: column types, quoted names, CREATE TABLE and added columns.

Why a module of its own: the store, its dedupe and the Parquet export all write SQL over the record
model's tables; one type mapping and one identifier quoting serve them all.
"""

from __future__ import annotations

from typing import Sequence

import duckdb
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
    """The DuckDB column type of a record-model Arrow type."""
    try:
        return _DUCK_TYPES[t]
    except KeyError:
        raise TypeError(f"no DuckDB type mapping for Arrow type {t}") from None


def quote_ident(name: str) -> str:
    """A DuckDB identifier (table or column name) in double quotes, quotes inside doubled."""
    return '"' + name.replace('"', '""') + '"'


def add_trailing_columns(con: duckdb.DuckDBPyConnection, tables: Sequence[schema.Table]) -> None:
    """Columns the record model added at the end of a table since a file was created (nullable only)."""
    for t in tables:
        have = [r[0] for r in con.execute(
            "SELECT column_name FROM duckdb_columns() WHERE table_name = ? ORDER BY column_index", [t.name]).fetchall()]
        names = [c.name for c in t.columns]
        if len(have) < len(names) and names[: len(have)] == have:
            for c in t.columns[len(have):]:
                if c.nullable:
                    con.execute(f"ALTER TABLE {quote_ident(t.name)} ADD COLUMN {quote_ident(c.name)} "
                                f"{duck_type(c.type)}")


def create_table_sql(t: schema.Table, primary_key: bool = True) -> str:
    """``CREATE TABLE IF NOT EXISTS`` of a record-model table (``primary_key``: its natural key as PRIMARY KEY)."""
    cols = ",\n  ".join(
        f'{quote_ident(c.name)} {duck_type(c.type)}{"" if c.nullable else " NOT NULL"}' for c in t.columns
    )
    if primary_key:
        cols += ",\n  PRIMARY KEY (" + ", ".join(quote_ident(k) for k in t.key) + ")"
    return f"CREATE TABLE IF NOT EXISTS {quote_ident(t.name)} (\n  {cols}\n)"
