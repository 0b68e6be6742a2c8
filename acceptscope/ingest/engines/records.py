"""The rows one file of another engine produces (:class:`EngineBatch`) and the run row they share."""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from typing import Any, Optional

import pyarrow as pa

from acceptscope.ingest.rejects import INT64_MAX, make_reject
from acceptscope.schema import Column, Table

# Other engines' run-level counts. Not in schema.ALL_TABLES: a read-only open requires every table there,
# so a store written before this table would be refused; the engine ingest creates it when it writes.
ENGINE_COUNTS = Table(
    "engine_counts",
    (
        Column("run_id", pa.string(), "run id", False),
        Column("source", pa.string(), "file the count was read from", False),
        Column("rank", pa.int32(), "engine index / rank the producer labelled (vLLM `engine`, TensorRT-LLM rank)", False),
        Column("metric", pa.string(), "the producer's counter: num_drafts, num_draft_tokens, num_accepted_tokens, "
               "accepted_per_pos (vLLM); num_steps, accepted_draft_hist, calib_num_bins, calib_attempts, "
               "calib_accepted (TensorRT-LLM accept stats); dspark_<field> (TensorRT-LLM DSparkRaggedStats, ratios as "
               "dspark_<ratio>_e4 = round(x * 1e4))", False),
        Column("position", pa.int32(), "0-based draft position or histogram index (-1: none)", False),
        Column("bin", pa.int32(), "confidence bin (-1: none)", False),
        Column("value", pa.int64(), "the count as the producer wrote it", False),
    ),
    key=("run_id", "source", "rank", "metric", "position", "bin"),
    doc="Counts another engine wrote, exactly as written (one row a counter cell).",
)


# Per-request cells another engine wrote (vLLM's per-request spec-decode metrics): one request's per-step
# arrays and its histogram by draft length. Optional like ENGINE_COUNTS, for the same reason.
ENGINE_REQUEST_COUNTS = Table(
    "engine_request_counts",
    (
        Column("run_id", pa.string(), "run id", False),
        Column("rid", pa.string(), "request id", False),
        Column("metric", pa.string(), "step_accepted / step_drafted (position = 0-based verify step of the request); "
               "accepted_hist_by_len (position = accepted drafts, bin = drafts proposed at that step)", False),
        Column("position", pa.int32(), "verify step, or accepted-draft count (see metric)", False),
        Column("bin", pa.int32(), "drafts proposed (accepted_hist_by_len; -1: none)", False),
        Column("value", pa.int64(), "the count as the producer wrote it", False),
    ),
    key=("run_id", "rid", "metric", "position", "bin"),
    doc="Per-request counts another engine wrote, exactly as written (one row a cell).",
)


@dataclass
class EngineBatch:
    """What one file of another engine produced, per table."""

    runs: list = field(default_factory=list)
    requests: list = field(default_factory=list)
    counts: list = field(default_factory=list)
    request_counts: list = field(default_factory=list)
    rejects: list = field(default_factory=list)

    def reject(self, source: str, line: int, fld: str, reason: str, raw=None, run_id: Optional[str] = None) -> None:
        self.rejects.append(make_reject(source, line, fld, reason, raw, run_id))

    def extend(self, other: "EngineBatch") -> None:
        for k in ("runs", "requests", "counts", "request_counts", "rejects"):
            getattr(self, k).extend(getattr(other, k))


def run_row(run_id: str, engine: str, arm: str, gamma: int, model: Optional[str], config: dict) -> dict:
    """The ``runs`` row of an engine file: ``config`` names the format, its producer and version."""
    return {"run_id": run_id, "arm": arm, "engine": engine, "gamma": int(gamma), "target_model": model,
            "source": "file", "config_json": json.dumps(config, sort_keys=True)}


def count_row(run_id: str, source: str, rank: int, metric: str, value: int, position: int = -1, bin_: int = -1) -> dict:
    """One ``engine_counts`` cell."""
    return {"run_id": run_id, "source": source, "rank": int(rank), "metric": metric, "position": int(position),
            "bin": int(bin_), "value": int(value)}


def request_count_row(run_id: str, rid: str, metric: str, value: int, position: int, bin_: int = -1) -> dict:
    """One ``engine_request_counts`` cell."""
    return {"run_id": run_id, "rid": rid, "metric": metric, "position": int(position), "bin": int(bin_),
            "value": int(value)}


def json_count(v: Any, cap: int = INT64_MAX) -> int | None:
    """A count as a JSON producer writes it (an integer >= 0, or a float holding one), else None."""
    if isinstance(v, bool):
        return None
    if isinstance(v, float) and math.isfinite(v) and v == int(v):
        v = int(v)
    return v if isinstance(v, int) and 0 <= v <= cap else None
