"""Appending without duplicates: a batch's rows whose natural key is already stored, or repeats inside
the batch, are dropped before the INSERT.

Every table has a natural key (``schema.Table.key``). Re-ingesting a source
inserts nothing new. Two implementations exist and are detected per file:

* ``primary_keys=True``: the key is a DuckDB ``PRIMARY KEY`` and inserts use
  ``INSERT OR IGNORE`` (an ART index, kept in memory, grows with the table);
* ``primary_keys=False`` (default for new files): no index; each insert first
  looks up which of the batch's keys already exist (a semi-join on the key
  columns only, restricted by the min/max of the batch's integer and string
  key columns so DuckDB's zone maps skip row groups that cannot collide:
  telemetry arrives in ``forward_ct`` order, so a flush only touches the tail
  of the table), drops those rows and duplicates inside the batch in Arrow,
  and appends the rest with a plain INSERT, which keeps arrival order (a
  read without ORDER BY returns rows as written; ``INSERT OR IGNORE`` into a
  PRIMARY KEY table does not). When no stored row lies inside the batch's key
  box at all (a fresh store, a new run, a poll past the stored ``forward_ct``
  range: one zone-map probe tells), the semi-join is skipped and only repeats
  inside the batch are dropped (bulk append: 0.03-0.04 s of checks per 200k
  request_steps instead of 0.06-0.1 s, measured on a fresh table, one core).

``bench/writer.py`` measures both side by side; the figures (see ``acceptscope/writer.py``'s
docstring) chose the default. Why a module of its own: this is the one insert path (``Store.write_arrow``,
hence ingest, the engine and live capture).
"""

from __future__ import annotations

from typing import Any

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from acceptscope import schema, summaries
from acceptscope.arrow_columns import one_array
from acceptscope.store_sql import quote_ident


def _literal(v: Any) -> str | None:
    if isinstance(v, bool) or v is None:
        return None
    if isinstance(v, int):
        return str(v)
    if isinstance(v, str):
        return "'" + v.replace("'", "''") + "'"
    return None


def _packed_keys(t: schema.Table, keys: pa.Table) -> np.ndarray | None:
    """One int64 per row that is equal exactly when the natural keys are; None when they do not fit.

    Integer key columns are offset by their minimum, string ones replaced by their
    dictionary index, and the columns combined in mixed radix. Anything else (a
    float or timestamp key, a NULL, a radix product past 2**62) returns None.
    """
    packed = np.zeros(keys.num_rows, dtype=np.int64)
    span = 1
    for k in t.key:
        col = one_array(keys.column(k))
        if col.null_count:
            return None
        if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
            enc = pc.dictionary_encode(col)
            v = enc.indices.to_numpy().astype(np.int64)
            size = len(enc.dictionary)
        elif pa.types.is_integer(col.type):
            v = col.to_numpy().astype(np.int64)
            lo = int(v.min())
            size = int(v.max()) - lo + 1
            v = v - lo
        else:
            return None
        if span * size > 2**62:
            return None
        packed *= size
        packed += v
        span *= size
    return packed


def dedupe_batch(t: schema.Table, data: pa.Table) -> pa.Table:
    """Drop rows whose natural key repeats an earlier row of the same batch (first one wins).

    The common case, no repeat at all, is settled by sorting one packed int64 per
    row (``_packed_keys``: ~2-4x cheaper than a group-by on 200k request_steps keys).
    Repeats, or keys that do not pack, go through a hash group-by in Arrow (a SQL
    window over the batch materialises every column, list columns included: ~8x slower).
    """
    if data.num_rows < 2:
        return data
    keys = data.select(list(t.key))
    packed = _packed_keys(t, keys)
    if packed is not None:
        s = np.sort(packed)
        if not (s[1:] == s[:-1]).any():
            return data
    elif keys.group_by(list(t.key), use_threads=False).aggregate([]).num_rows == data.num_rows:
        return data
    idx = keys.append_column("_i", pa.array(range(data.num_rows), pa.int64()))
    first = idx.group_by(list(t.key), use_threads=False).aggregate([("_i", "min")]).column("_i_min")
    first = first.combine_chunks()
    return data.take(first.take(pc.sort_indices(first)))  # keep the original row order


def _key_ranges(t: schema.Table, incoming: pa.Table, alias: str) -> list[str]:
    """``alias.k BETWEEN lo AND hi`` for each integer/string key column of the batch.

    Every key of the batch lies in this box, so a stored row outside it cannot
    collide; DuckDB's zone maps skip the row groups that lie outside.
    """
    terms = []
    for k in t.key:
        col = incoming.column(k)
        if not (pa.types.is_integer(col.type) or pa.types.is_string(col.type)):
            continue
        mm = pc.min_max(col).as_py()
        lo, hi = _literal(mm["min"]), _literal(mm["max"])
        if lo is None or hi is None:
            continue
        terms.append(f"{alias}.{quote_ident(k)} BETWEEN {lo} AND {hi}")
    return terms


def _existing_keys_sql(t: schema.Table, box: list[str], keys_view: str) -> str:
    """Row indices (``_i``) of the batch whose natural key is already in the table.

    Only the key columns take part (a semi-join), pruned to the batch's key box
    (``_key_ranges``) so zone maps skip row groups that cannot collide.
    """
    keys = [quote_ident(k) for k in t.key]
    on = " AND ".join(f"e.{k} = i.{k}" for k in keys)
    where = " AND ".join([on] + box)
    return f"SELECT i._i FROM {keys_view} i WHERE EXISTS (SELECT 1 FROM {quote_ident(t.name)} e WHERE {where})"


def _may_collide(con: duckdb.DuckDBPyConnection, t: schema.Table, box: list[str]) -> bool:
    """Whether any stored row lies inside the batch's key box (``_key_ranges``; else none of its keys can exist).

    A probe on zone maps: a fresh table, a new run, or a poll whose ``forward_ct``
    range starts past the stored ones answers False without reading the batch.
    """
    where = " AND ".join(box) or "TRUE"
    return bool(con.execute(f"SELECT EXISTS (SELECT 1 FROM {quote_ident(t.name)} e WHERE {where})").fetchall()[0][0])


def insert_new_rows(con: duckdb.DuckDBPyConnection, t: schema.Table, tbl: pa.Table, primary_keys: bool) -> int:
    """Insert the rows of ``tbl`` (record-model schema) whose natural key is new; returns rows inserted.

    Arrival order is preserved (a plain appending INSERT of the surviving rows),
    so a table read without ORDER BY comes back in the order it was written.
    Index-free: when no stored row lies inside the batch's key box (``_may_collide``)
    the existing-keys semi-join is skipped (bulk append: only in-batch repeats are dropped).
    The rows inserted are folded into the per-run summaries in the same transaction
    (``summaries.add``): the one place every writer (ingest, engine, live) goes through.
    """
    view = f"_incoming_{t.name}"
    summarised = t.name in summaries.SUMMARISED
    if primary_keys and not summarised:
        con.register(view, tbl)
        row = con.execute(f"INSERT OR IGNORE INTO {quote_ident(t.name)} SELECT * FROM {view}").fetchone()
        con.unregister(view)
        return int(row[0]) if row else 0
    tbl = dedupe_batch(t, tbl)
    box = _key_ranges(t, tbl, "e")  # (min and max of every key column: once for the probe and the semi-join)
    if _may_collide(con, t, box):
        keys_view = f"_keys_{t.name}"
        keys = tbl.select(list(t.key)).append_column("_i", pa.array(np.arange(tbl.num_rows, dtype=np.int64)))
        con.register(keys_view, keys)
        dup = con.execute(_existing_keys_sql(t, box, keys_view)).fetchnumpy()["_i"]
        con.unregister(keys_view)
        if len(dup):
            keep = np.ones(tbl.num_rows, dtype=bool)
            keep[np.asarray(dup, dtype=np.int64)] = False
            tbl = tbl.filter(pa.array(keep))
    if tbl.num_rows == 0:
        return 0
    con.register(view, tbl)
    row = con.execute(f"INSERT INTO {quote_ident(t.name)} SELECT * FROM {view}").fetchone()
    con.unregister(view)
    n = int(row[0]) if row else 0
    if summarised:
        if n != tbl.num_rows:  # cannot happen after the semi-join; refuse to miscount rather than guess
            raise RuntimeError(f"{t.name}: inserted {n} of {tbl.num_rows} new rows; summaries would miscount")
        summaries.add(con, t.name, tbl)
    return n
