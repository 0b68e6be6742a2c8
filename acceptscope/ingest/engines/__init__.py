"""Ingest of other engines' speculative-decoding telemetry into acceptscope's record model.

Why: operators run vLLM and TensorRT-LLM too; their acceptance counts land in the same store as SGLang's
so one report or dashboard reads them side by side. Each format is read exactly as its producer writes
it (the module of each engine names the producer's file and version), and each bad record is rejected
alone with file, line and field, as for SGLang (``acceptscope.ingest.rejects``).

What lands where:

* ``runs``: one row per producer run (``engine`` = vllm | tensorrt-llm, ``source`` = file);
* ``requests``: per-request totals where the producer keeps them (TensorRT-LLM ``per_request``, AIPerf's
  records: verify steps -> ``spec_verify_ct``, accepted drafts -> ``spec_num_correct_drafts``, proposed
  drafts -> ``spec_num_proposed_drafts`` where recorded);
* ``engine_counts`` (:data:`acceptscope.ingest.engines.records.ENGINE_COUNTS`): every run-level counter cell, as written;
* ``engine_request_counts`` (:data:`~acceptscope.ingest.engines.records.ENGINE_REQUEST_COUNTS`): per-request cells
  (vLLM's per-step arrays and histogram by draft length), as written;
* ``rejects``: the records that could not be read.

What each engine's data identifies is :func:`acceptscope.ingest.engines.identify.engine_figures`.

Kinds (:func:`detect_engine`): ``vllm_metrics`` (a Prometheus text exposition holding
``vllm:spec_decode_*`` samples: ``*.prom`` / ``*.txt`` / ``*.metrics``), ``trtllm_accept_stats``
(``dflash_accept_stats_rank<r>.json``), ``aiperf_profile_export`` (``profile_export.jsonl``, or a JSONL whose
first records hold ``"metadata"`` and ``"spec_decode_steps"``), ``vllm_request_metrics`` (vLLM response bodies
with per-request spec-decode metrics, :mod:`~acceptscope.ingest.engines.vllm_requests`), ``trtllm_dspark_stats``
(``DSparkRaggedStats.summary()`` snapshots, JSON or the server log, :mod:`~acceptscope.ingest.engines.trtllm_dspark`).
"""

from __future__ import annotations

from pathlib import Path
from typing import Iterable, Optional

from acceptscope.schema import as_arrow
from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.detect import detect, run_id_for
from acceptscope.ingest.kinds import ENGINE
from acceptscope.ingest.engines import aiperf, trtllm, trtllm_dspark, vllm, vllm_requests
from acceptscope.ingest.engines.records import ENGINE_COUNTS, ENGINE_REQUEST_COUNTS, EngineBatch
from acceptscope.store_sql import create_table_sql, quote_ident

ENGINE_KINDS = ENGINE  # (the registry: acceptscope.ingest.kinds)


def detect_engine(path: str | Path) -> Optional[str]:
    """The engine kind of a file (:func:`acceptscope.ingest.detect.detect`'s rules), or None."""
    kind = detect(path)
    return kind if kind in ENGINE_KINDS else None


def default_run_id(path: Path, kind: str) -> str:
    """A run per file, named by its stem, except TensorRT-LLM's rank files: one run per stats directory."""
    return path.parent.name or run_id_for(path) if kind == "trtllm_accept_stats" else run_id_for(path)


def parse_engine_file(path: str | Path, kind: str, run_id: Optional[str] = None) -> EngineBatch:
    """Parse one file of a known engine kind (no store write)."""
    p = Path(path)
    rid = run_id or default_run_id(p, kind)
    if kind == "vllm_metrics":
        return vllm.parse_prometheus_text(p.read_bytes(), source=str(p), run_id=rid)
    if kind == "trtllm_accept_stats":
        return trtllm.parse_accept_stats(p.read_bytes(), source=str(p), run_id=rid)
    if kind == "aiperf_profile_export":
        return aiperf.parse_profile_export(p.read_bytes(), source=str(p), run_id=rid)
    if kind == "vllm_request_metrics":
        return vllm_requests.parse_responses(p.read_bytes(), source=str(p), run_id=rid)
    if kind == "trtllm_dspark_stats":
        return trtllm_dspark.parse_stats(p.read_bytes(), source=str(p), run_id=rid)
    b = EngineBatch()
    b.reject(str(p), 0, "$", f"not an engine file this reader knows (kind {kind!r}; known: {list(ENGINE_KINDS)})",
             None, rid)
    return b


def write_engine_counts(store, counts: list, table=ENGINE_COUNTS) -> int:
    """Store ``engine_counts`` (or ``table``'s) rows (the table is created when absent); rows already stored
    are kept."""
    if not counts:
        return 0
    t = as_arrow(table, counts)
    with store.connect() as con:
        con.execute(create_table_sql(table, primary_key=True))
        con.register("_engine_counts_new", t)
        try:
            con.execute(f"INSERT OR IGNORE INTO {quote_ident(table.name)} SELECT * FROM _engine_counts_new")
        finally:
            con.unregister("_engine_counts_new")
    return t.num_rows


def write_engine_batch(store, batch: EngineBatch) -> dict[str, int]:
    """Store one batch: runs, requests and rejects through ``Store.append``, the counts into ``engine_counts``."""
    tables = {name: rows for name, rows in (("runs", batch.runs), ("requests", batch.requests),
                                            ("rejects", batch.rejects)) if rows}
    out = store.append(tables) if tables else {}
    if batch.counts:
        out["engine_counts"] = write_engine_counts(store, batch.counts)
    if batch.request_counts:
        out["engine_request_counts"] = write_engine_counts(store, batch.request_counts, ENGINE_REQUEST_COUNTS)
    return out


def engine_ingest_batch(path: Path, kind: str, run_id: str, store) -> IngestBatch:
    """``acceptscope ingest``'s reader of an engine file: the counts go straight to ``engine_counts`` (not a
    record-model table, so not through the ingest writer); runs, requests and rejects ride the batch."""
    p = Path(path)
    if kind == "trtllm_accept_stats" and run_id == run_id_for(p):  # the planner's per-file default
        run_id = default_run_id(p, kind)
    eb = parse_engine_file(p, kind, run_id)
    if store is not None and not getattr(store, "read_only", False):
        write_engine_counts(store, eb.counts)
        write_engine_counts(store, eb.request_counts, ENGINE_REQUEST_COUNTS)
    b = IngestBatch()
    for name, rows in (("runs", eb.runs), ("requests", eb.requests)):
        for r in rows:
            b.add(name, r)
    for r in eb.rejects:
        b.reject(r)
    return b


def ingest_engine_files(store, paths: Iterable[str | Path], run_id: Optional[str] = None) -> EngineBatch:
    """Detect, parse and store each file; returns everything parsed (rejects included)."""
    total = EngineBatch()
    for p in paths:
        kind = detect_engine(p)
        b = parse_engine_file(p, kind or "unknown", run_id)
        write_engine_batch(store, b)
        total.extend(b)
    return total


def engine_counts_rows(con) -> int:
    """Rows of ``engine_counts`` (-1: no such table): part of a store's data version."""
    if not has_engine_counts(con):
        return -1
    return int(con.execute(f"SELECT count(*) FROM {quote_ident(ENGINE_COUNTS.name)}").fetchone()[0])


def has_engine_counts(con, table=ENGINE_COUNTS) -> bool:
    """Whether the store holds the ``engine_counts`` (or ``table``) table (a store no engine file was ingested
    into has none)."""
    return bool(con.execute("SELECT count(*) FROM duckdb_tables() WHERE table_name = ?",
                            [table.name]).fetchone()[0])
