"""Parquet export of the telemetry store, hive-partitioned for other engines.

Layout (Spark-standard hive partitioning, ``key=value`` directories)::

    OUT/<table>/run_id=<id>/part-<uuid>-<n>.parquet                  most tables
    OUT/request_steps/run_id=<id>/rank=<r>/part-<uuid>-<n>.parquet   and steps
    OUT/sps_tables/table_hash=<h>/part-<uuid>-<n>.parquet            and sts_tables
    OUT/_acceptscope_export.json                                     what was written

Every table with a ``run_id`` column is exported (``runs`` included), and a full
export (``tables=None``) adds the SPS / STS table rows the exported runs reference by
hash (``runs.sps_hash`` / ``sts_hash``), partitioned by ``table_hash``. Partition
values are URI-encoded by pyarrow; a NULL ``run_id`` (only ``rejects`` allows
one) goes to ``run_id=__HIVE_DEFAULT_PARTITION__`` as Hive/Spark expect. The
partition columns live in the path, not in the files, so a reader must enable
hive partitioning: ``read_export`` (pyarrow) and ``duckdb_source`` (DuckDB SQL)
do it with the record model's types, e.g. so a numeric-looking run id stays a
string. Spark reads the same tree with ``spark.read.parquet(OUT + "/steps")``.

Re-exporting a run replaces that run's directory of each table (no stale files,
no duplicates). Each (table, run) is read on its own short read-only connection,
so a live writer process is only held off for one run's table at a time.

Crash safety: a (table, run) partition is written whole under ``OUT/.staging-<token>/`` first; only
then is the old partition moved aside (``OUT/.trash-<token>/``) and the new one renamed into its
place, and the manifest is written last (atomically, :mod:`acceptscope.outputs`). A kill or a full
disk mid-export leaves every old partition readable and the old manifest; the hidden staging and
trash folders of a killed export are removed by the next export.
"""

from __future__ import annotations

import json
import os
import shutil
import time
import uuid
from pathlib import Path
from typing import Any, Callable, Sequence
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.dataset as ds

from acceptscope import schema
from acceptscope.outputs import atomic_write, fsync_dir
from acceptscope.runs_table import read_runs
from acceptscope.store import Store, fetch_arrow_reader
from acceptscope.store_sql import duck_type, quote_ident

MANIFEST = "_acceptscope_export.json"
NULL_PARTITION = "__HIVE_DEFAULT_PARTITION__"
# Extra partition columns after run_id: per-rank files keep one rank's steps together.
EXTRA_PARTITIONS: dict[str, tuple[str, ...]] = {"request_steps": ("rank",), "steps": ("rank",)}


# Tables keyed by a content hash that ``runs`` rows reference (``sps_hash``, ``sts_hash``): a full
# export also writes the rows of the referenced hashes, partitioned by ``table_hash``, so the
# lake holds everything the estimators read for a run.
HASH_TABLES: dict[str, str] = {"sps_tables": "sps_hash", "sts_tables": "sts_hash"}


def exportable_tables() -> list[schema.Table]:
    return [t for t in schema.ALL_TABLES if "run_id" in t.names]


def hash_tables() -> list[schema.Table]:
    return [schema.table(n) for n in HASH_TABLES]


def partition_columns(t: schema.Table) -> tuple[str, ...]:
    if t.name in HASH_TABLES:
        return ("table_hash",)
    return ("run_id",) + EXTRA_PARTITIONS.get(t.name, ())


def _partitioning(t: schema.Table) -> ds.Partitioning:
    fields = [pa.field(c, t.column(c).type) for c in partition_columns(t)]
    return ds.HivePartitioning(pa.schema(fields), null_fallback=NULL_PARTITION)


def _run_dirs(table_dir: Path, run_id: str | None, key: str = "run_id") -> list[Path]:
    """The partition directories of one run (or hash) in ``table_dir``."""
    if not table_dir.is_dir():
        return []
    want = NULL_PARTITION if run_id is None else run_id
    return [d for d in table_dir.iterdir()
            if d.is_dir() and d.name.startswith(f"{key}=") and unquote(d.name[len(key) + 1:]) == want]


class _Swap:
    """One export's staging and trash folders: a partition is written in staging, then swapped in."""

    def __init__(self, out: Path, token: str):
        self.out = out
        for old in out.glob(".staging-*"):  # a killed export's leftovers (its old partitions were never moved)
            shutil.rmtree(old, ignore_errors=True)
        for old in out.glob(".trash-*"):
            shutil.rmtree(old, ignore_errors=True)
        self.staging = out / f".staging-{token}"
        self.trash = out / f".trash-{token}"
        self.n = 0

    def stage(self, table: str) -> Path:
        d = self.staging / table
        shutil.rmtree(d, ignore_errors=True)
        return d

    def replace(self, table: str, run_id: str | None, key: str = "run_id") -> None:
        """Move the run's old partitions of ``table`` aside, the staged ones in; then drop the old."""
        table_dir, staged = self.out / table, self.staging / table
        old = _run_dirs(table_dir, run_id, key)
        new = _run_dirs(staged, run_id, key)
        moved = []
        for d in old:
            self.n += 1
            dest = self.trash / f"{self.n}"
            dest.mkdir(parents=True, exist_ok=True)
            os.replace(d, dest / d.name)
            moved.append(dest)
        table_dir.mkdir(parents=True, exist_ok=True)
        for d in new:
            os.replace(d, table_dir / d.name)
        fsync_dir(table_dir)
        for d in moved:
            shutil.rmtree(d, ignore_errors=True)

    def close(self) -> None:
        shutil.rmtree(self.staging, ignore_errors=True)
        shutil.rmtree(self.trash, ignore_errors=True)


def _write(con_factory, t: schema.Table, sql: str, params, table_dir: Path, token: str) -> int:
    """Stream one query's rows into ``table_dir`` (hive partitions of ``t``); returns the row count."""
    rows = 0
    with con_factory() as con:
        reader = fetch_arrow_reader(con, sql, params)

        def batches(reader=reader):
            nonlocal rows
            for b in reader:
                rows += b.num_rows
                yield b.cast(t.arrow_schema) if b.schema != t.arrow_schema else b

        ds.write_dataset(
            pa.RecordBatchReader.from_batches(t.arrow_schema, batches()),
            table_dir,
            format="parquet",
            partitioning=_partitioning(t),
            basename_template=f"part-{token}-{{i}}.parquet",
            existing_data_behavior="overwrite_or_ignore",
            file_options=ds.ParquetFileFormat().make_write_options(compression="zstd"),
            max_rows_per_group=128 * 1024,
        )
    return rows


def export_parquet(
    store: Store,
    run_ids: Sequence[str] | None,
    out_dir: str | Path,
    *,
    tables: Sequence[str] | None = None,
    progress: Callable[[str, int], None] | None = None,
) -> dict[str, Any]:
    """Write ``run_ids`` (None: every run, plus NULL-run rows) of every run-keyed table as Parquet.

    Returns a summary ``{"out_dir", "runs", "tables": {name: rows}}`` (also written
    to ``OUT/_acceptscope_export.json``). ``progress(table, rows)`` is called per
    (table, run) written. Unknown run ids raise ``KeyError``.
    """
    out = Path(out_dir)
    chosen = exportable_tables()
    if tables is not None:
        names = {t.name for t in chosen}
        bad = [n for n in tables if n not in names]
        if bad:
            raise KeyError(f"not exportable (no run_id column or unknown): {bad}; exportable: {sorted(names)}")
        chosen = [t for t in chosen if t.name in set(tables)]
    known = set(read_runs(store.query_df, columns=["run_id"])["run_id"])
    if run_ids is None:
        runs: list[str | None] = sorted(known)
        for t in chosen:  # telemetry may exist for runs without a runs row (e.g. file ingest)
            ids = store.query_df(f"SELECT DISTINCT run_id FROM {quote_ident(t.name)} WHERE run_id IS NOT NULL")["run_id"]
            runs.extend(i for i in ids if i not in runs)
        runs.append(None)  # rows without a run (only rejects can have them)
    else:
        runs = list(dict.fromkeys(run_ids))
        missing = [r for r in runs if r not in known]
        if missing:
            raise KeyError(f"run(s) {missing} not in {store.path}; known runs: {sorted(known)[:20]}")
    out.mkdir(parents=True, exist_ok=True)
    # one short connection finds which (table, run) pairs have rows; only those get a connection of their own
    with store.connect(read_only=True) as con:
        present = {
            t.name: {r for (r,) in con.execute(f"SELECT DISTINCT run_id FROM {quote_ident(t.name)}").fetchall()}
            for t in chosen
        }
    token = uuid.uuid4().hex[:12]
    swap = _Swap(out, token)
    try:
        written = _export_tables(store, chosen, runs, present, swap, token, progress)
        if tables is None:  # the SPS / STS tables the exported runs reference, by hash
            written.update(_export_hash_tables(store, [r for r in runs if r is not None], swap, token, progress))
            chosen = chosen + hash_tables()
    finally:
        swap.close()
    summary = {
        "out_dir": str(out),
        "runs": [r for r in runs if r is not None],
        "tables": written,
        "partitioning": {t.name: list(partition_columns(t)) for t in chosen},
        "exported_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    _merge_manifest(out / MANIFEST, summary)  # last: it names only partitions already in place
    return summary


def _export_tables(store: Store, chosen: list, runs: list, present: dict, swap: _Swap, token: str,
                   progress: Callable[[str, int], None] | None) -> dict[str, int]:
    """Each (table, run): written in staging, then swapped in for the old partition."""
    written: dict[str, int] = {t.name: 0 for t in chosen}
    for t in chosen:
        for run in runs:
            staged = swap.stage(t.name)
            if run in present[t.name]:
                where = "run_id IS NULL" if run is None else "run_id = ?"
                order = ", ".join(quote_ident(k) for k in t.key)
                sql = f"SELECT * FROM {quote_ident(t.name)} WHERE {where} ORDER BY {order}"
                rows = _write(lambda: store.connect(read_only=True), t, sql, None if run is None else [run], staged,
                              token)
                written[t.name] += rows
                if progress is not None:
                    progress(t.name, rows)
            swap.replace(t.name, run)
    return written


def _export_hash_tables(store: Store, ids: list, swap: _Swap, token: str,
                        progress: Callable[[str, int], None] | None) -> dict[str, int]:
    """The SPS / STS table rows the runs reference, one ``table_hash`` partition at a time."""
    written: dict[str, int] = {}
    for t in hash_tables():
        ref = HASH_TABLES[t.name]
        hashes = sorted(h for h in store.query_df(
            f"SELECT DISTINCT {quote_ident(ref)} AS h FROM runs WHERE {quote_ident(ref)} IS NOT NULL "
            "AND run_id IN (SELECT UNNEST(?))", [ids])["h"]) if ids else []
        written[t.name] = 0
        for h in hashes:
            staged = swap.stage(t.name)
            order = ", ".join(quote_ident(k) for k in t.key)
            sql = f"SELECT * FROM {quote_ident(t.name)} WHERE table_hash = ? ORDER BY {order}"
            rows = _write(lambda: store.connect(read_only=True), t, sql, [h], staged, token)
            swap.replace(t.name, h, "table_hash")
            written[t.name] += rows
            if progress is not None and rows:
                progress(t.name, rows)
    return written


def _merge_manifest(path: Path, summary: dict[str, Any]) -> None:
    try:
        old = json.loads(path.read_text())
    except (FileNotFoundError, json.JSONDecodeError):
        old = {"exports": []}
    old.setdefault("exports", []).append(summary)
    old["exports"] = old["exports"][-100:]
    atomic_write(path, json.dumps(old, indent=2))


# ---------------------------------------------------------------------------
# reading an export back
# ---------------------------------------------------------------------------
def read_export(out_dir: str | Path, table: str, run_ids: Sequence[str] | None = None) -> pa.Table:
    """Read one exported table with pyarrow.dataset, columns in record-model order and types."""
    t = schema.table(table)
    root = Path(out_dir) / t.name
    if not root.is_dir():
        return t.arrow_schema.empty_table()
    dataset = ds.dataset(root, format="parquet", partitioning=_partitioning(t), schema=t.arrow_schema)
    flt = None
    if run_ids is not None:
        flt = ds.field("run_id").isin(list(run_ids))
    return dataset.to_table(filter=flt).select(t.names)


def duckdb_source(out_dir: str | Path, table: str) -> str:
    """A DuckDB table expression reading one exported table, e.g. ``SELECT * FROM {duckdb_source(...)}``."""
    t = schema.table(table)
    glob = str(Path(out_dir) / t.name / "**" / "*.parquet").replace("'", "''")
    types = ", ".join(f"'{c}': '{duck_type(t.column(c).type)}'" for c in partition_columns(t))
    return f"read_parquet('{glob}', hive_partitioning = true, hive_types = {{{types}}})"
