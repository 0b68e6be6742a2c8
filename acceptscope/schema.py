"""The telemetry record model: every table, column, type, unit and natural key.

This module is the single vocabulary of acceptscope. Sources (the reference
engine, SGLang ingest, the live poller) translate into these tables; the store
writes them; estimators and surfaces read them. No other module re-declares a
column: import the names from here.

Conventions
-----------
* Times are milliseconds (``*_ms``) or seconds (``*_s``); the suffix says which.
* Token counts follow SGLang's DSpark semantics (sglang 0.5.23):
  ``verify_len`` counts the anchor row, so ``window = verify_len - 1`` drafts are
  verified; ``acc_len = correct_drafts + 1`` (bonus included);
  ``ceiling`` = uncapped correct drafts a full-gamma verify would accept (exact in
  ``cap-accept`` as ``correct_drafts + cap_trim``, and in ``static``; NULL in
  ``compact`` where it must be estimated).
* Per-position arrays have length ``gamma`` (position k = draft d_k, 0-based).
  ``target_logprob[k]`` is NULL where the target never scored that draft.
* ``epoch`` separates incarnations of one server (a restart resets
  ``forward_ct``); the reference engine always writes epoch 0.
* ``rank`` is the DP rank; for SGLang ``/server_info`` it is the observed
  (arrival-order, fingerprinted) rank slot.

Per-position layout decision
----------------------------
Per-position arrays are stored as DuckDB ``LIST`` columns on ``request_steps``
rather than in a long ``(row, position)`` table. The queries the estimators and
the dashboard run are (a) whole-row reads of a run (estimators walk each block
left to right, which wants the row's arrays together) and (b) per-position
aggregates (``UNNEST`` with ordinality, or ``list_extract``). ``bench/layout.py``
measures both layouts side by side (300k rows, gamma 7, DuckDB 2.0.1, 2 shared
cores; long = scalar table + normalised position table joined on the key): LIST
is 3.0-3.6x faster for per-position confidence/acceptance per workload, 2.4x for
a whole run into pandas, 17x for a whole run into Arrow, 1.3-2.6x for one
request's drill-down; the long layout's file is 20% smaller and loads about as
fast (0.9-1.1x). LIST wins the reads that matter.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import pandas as pd
import pyarrow as pa

# runs.role (issue 31): its values and rule live in run_roles; re-exported for the modules that read the schema
from acceptscope.run_roles import ROLE_SQL, ROLES, run_role, with_roles  # noqa: F401

ARMS = ("compact", "cap-accept", "static")
ENGINES = ("reference", "sglang")
SOURCES = ("live", "file")

F32_LIST = pa.list_(pa.float32())
F64_LIST = pa.list_(pa.float64())
I32_LIST = pa.list_(pa.int32())
I64_LIST = pa.list_(pa.int64())


@dataclass(frozen=True)
class Column:
    """One column: its Arrow type, whether NULL is allowed, and its unit/meaning."""

    name: str
    type: pa.DataType
    doc: str
    nullable: bool = True


@dataclass(frozen=True)
class Table:
    """One table: ordered columns and the natural key that makes ingest idempotent."""

    name: str
    columns: tuple[Column, ...]
    key: tuple[str, ...]
    doc: str = ""
    _index: dict = field(default_factory=dict, compare=False, repr=False)

    @property
    def names(self) -> list[str]:
        return [c.name for c in self.columns]

    @property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([pa.field(c.name, c.type, nullable=c.nullable) for c in self.columns])

    def column(self, name: str) -> Column:
        for c in self.columns:
            if c.name == name:
                return c
        raise KeyError(f"table {self.name!r} has no column {name!r}")


def _c(name: str, type_: pa.DataType, doc: str, nullable: bool = True) -> Column:
    return Column(name, type_, doc, nullable)


# ---------------------------------------------------------------------------
# runs
# ---------------------------------------------------------------------------
RUNS = Table(
    "runs",
    (
        _c("run_id", pa.string(), "unique run id", False),
        _c("arm", pa.string(), "verify mode: compact | cap-accept | static", False),
        _c("engine", pa.string(), "reference | sglang", False),
        _c("gamma", pa.int32(), "draft block size (drafted tokens per block)", False),
        _c("temperature", pa.float64(), "default sampling temperature (0 = greedy)"),
        _c("target_model", pa.string(), "target model id or path"),
        _c("draft_model", pa.string(), "draft model id or path"),
        _c("sts_hash", pa.string(), "sha256 of the STS calibration JSON in use (NULL: none)"),
        _c("sps_hash", pa.string(), "sha256 of the SPS cost table in use (NULL: none)"),
        _c("started_at", pa.timestamp("us", tz="UTC"), "run start time"),
        _c("config_json", pa.string(), "full run configuration as JSON"),
        _c("source", pa.string(), "live | file"),
        _c("audit_group", pa.string(), "id shared by the arms of one audit (NULL: standalone run)"),
        _c("completed_at", pa.timestamp("us", tz="UTC"),
           "when the command writing the run (run, audit, ingest, live) finished it; NULL: still running or killed"),
        _c("role", pa.string(), "production | audit | calibration | curve (see run_role; NULL in a file from "
           "before schema version 7 until its first read-write open)"),
    ),
    key=("run_id",),
    doc="One row per run (one arm of one engine configuration).",
)

# ---------------------------------------------------------------------------
# steps: one row per decode step per DP rank (SGLang DecodeStepRecord)
# ---------------------------------------------------------------------------
STEPS = Table(
    "steps",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rank", pa.int32(), "DP rank (observed slot for SGLang)", False),
        _c("epoch", pa.int32(), "server incarnation; increments on restart", False),
        _c("forward_ct", pa.int64(), "scheduler forward counter (counts prefill/idle passes too)", False),
        _c("bs", pa.int32(), "requests in the local verify batch"),
        _c("mode", pa.string(), "planner mode as recorded"),
        _c("budget", pa.int32(), "extra verify tokens above the 1-per-request floor (NULL: none)"),
        _c("lag_steps", pa.int32(), "configured confidence lag in decode steps"),
        _c("num_running_reqs", pa.int32(), "running requests (SGLang duplicate of bs)"),
        _c("num_verify_tokens", pa.int32(), "scheduled verify tokens (SGLang num_verify_tokens)"),
        _c("verify_tokens_local", pa.int32(), "local verify tier (tokens)"),
        _c("verify_tokens_dp_synced", pa.int32(), "DP-max gathered tier (tokens)"),
        _c("verify_tokens_graph_key", pa.int32(), "CUDA-graph token key"),
        _c("executed_verify_tokens", pa.int32(), "target rows actually run (reference engine)"),
        _c("predicted_step_ms", pa.float64(), "planner predicted step time (ms)"),
        _c("predicted_theta", pa.float64(), "planner objective at the chosen budget (tokens/s)"),
        _c("step_cpu_ms", pa.float64(), "host inter-step wall time (ms)"),
        _c("step_gpu_ms", pa.float64(), "device step time (ms)"),
        _c("draft_gpu_ms", pa.float64(), "drafter time (ms)"),
        _c("target_verify_gpu_ms", pa.float64(), "target verify time (ms)"),
        _c("wall_time_s", pa.float64(), "seconds since run start when the step ended"),
        _c("modeled_step_ms", pa.float64(), "virtual-clock step time: the run's cost profile's prediction for the "
           "verify tokens actually executed (ms); NULL when the run used the wall clock"),
    ),
    key=("run_id", "rank", "epoch", "forward_ct"),
    doc="One row per decode step per DP rank.",
)

# ---------------------------------------------------------------------------
# request_steps: one row per request per step (SGLang ReqDetail + our extras)
# ---------------------------------------------------------------------------
REQUEST_STEPS = Table(
    "request_steps",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rank", pa.int32(), "DP rank", False),
        _c("epoch", pa.int32(), "server incarnation", False),
        _c("forward_ct", pa.int64(), "step forward counter", False),
        _c("rid", pa.string(), "request id (SGLang may omit it: then 'pool:<req_pool_index>')", False),
        _c("req_pool_index", pa.int32(), "KV request-pool slot (reused across requests)"),
        _c("step_index", pa.int32(), "0-based ordinal of this step within the request"),
        _c("prefix_len", pa.int32(), "sequence length before the step; anchor sits at prefix_len"),
        _c("verify_len", pa.int32(), "verified rows incl. the anchor row (1..gamma+1)"),
        _c("window", pa.int32(), "verified drafts = verify_len - 1"),
        _c("correct_drafts", pa.int32(), "accepted drafts after capping (<= window)"),
        _c("acc_len", pa.int32(), "SGLang commit length = correct_drafts + 1 (bonus included; output may be cut at a stop/length limit)"),
        _c("cap_trim", pa.int32(), "raw accepted - capped accepted (exact only in cap-accept)"),
        _c("bonus_token", pa.int64(), "token committed after the accepted drafts"),
        _c("draft_tokens", I64_LIST, "all gamma drafted token ids"),
        _c("confidence", F32_LIST, "post-STS confidence per position"),
        _c("survival", F32_LIST, "cumprod(confidence) per position"),
        _c("confidence_logit", F32_LIST, "pre-STS confidence-head logit per position (NULL: unknown)"),
        _c("draft_logprob", F32_LIST, "log q(draft token) per position under the draft distribution"),
        _c("target_logprob", F32_LIST, "log p(draft token) per position where the target scored it"),
        _c("committed_tokens", I64_LIST, "tokens appended to the output this step (accepted drafts + bonus, cut at EOS / max_new_tokens)"),
        _c("ceiling", pa.int32(), "uncapped correct drafts of a full verify (NULL in compact)"),
        _c("temperature", pa.float64(), "sampling temperature (0 = greedy); filled on write (domain.temperature)"),
        _c("workload", pa.string(), "workload label"),
        _c("finished", pa.bool_(), "request finished at this step"),
    ),
    key=("run_id", "rank", "epoch", "forward_ct", "rid"),
    doc="One row per request per decode step.",
)

# ---------------------------------------------------------------------------
# requests: per-request summary (incl. SGLang meta_info spec_* fields)
# ---------------------------------------------------------------------------
REQUESTS = Table(
    "requests",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rid", pa.string(), "request id", False),
        _c("workload", pa.string(), "workload label"),
        _c("prompt_index", pa.int32(), "index of the prompt in its workload (pairs arms)"),
        _c("seed", pa.int64(), "sampling seed"),
        _c("temperature", pa.float64(), "sampling temperature"),
        _c("prompt_tokens", pa.int32(), "prompt length in tokens"),
        _c("completion_tokens", pa.int32(), "generated tokens"),
        _c("finish_reason", pa.string(), "stop | length | abort | ..."),
        _c("output_tokens", I64_LIST, "generated token ids (for parity checks)"),
        _c("latency_s", pa.float64(), "end-to-end latency (s)"),
        _c("spec_verify_ct", pa.int32(), "SGLang meta_info: verify steps"),
        _c("spec_accept_rate", pa.float64(), "SGLang meta_info: correct / (verify_ct * gamma)"),
        _c("spec_accept_length", pa.float64(), "SGLang meta_info: completion_tokens / verify_ct"),
        _c("spec_num_correct_drafts", pa.int64(), "SGLang meta_info"),
        _c("spec_num_proposed_drafts", pa.int64(), "SGLang meta_info"),
        _c("spec_cap_length", pa.float64(), "SGLang meta_info: mean verify_len"),
        _c("spec_block_accept_length", pa.float64(), "SGLang meta_info (cap-accept only)"),
        _c("spec_correct_drafts_histogram", I64_LIST, "SGLang meta_info"),
        _c("spec_cap_lens_histogram", I64_LIST, "SGLang meta_info"),
    ),
    key=("run_id", "rid"),
    doc="One row per request.",
)

# ---------------------------------------------------------------------------
# SGLang block-accept estimator JSONL
# ---------------------------------------------------------------------------
ESTIMATOR_ROWS = Table(
    "estimator_rows",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rid", pa.string(), "request id", False),
        _c("fct", pa.int64(), "forward_ct of the row", False),
        _c("w", pa.int32(), "window (verified drafts)"),
        _c("cl", pa.int32(), "capped correct drafts"),
        _c("ct", pa.int32(), "cap_trim"),
        _c("trimmed_tokens", I64_LIST, "drafts[w:gamma] when a block opened"),
        _c("q_lp", F64_LIST, "draft log-probs of the trimmed tokens"),
        _c("source_line", pa.int64(), "1-based line in the JSONL file"),
    ),
    key=("run_id", "rid", "fct"),
    doc="Row records of SGLANG_DSPARK_BLOCK_ACCEPT_ESTIMATE_PATH.",
)

ESTIMATOR_GATHER = Table(
    "estimator_gather",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rid", pa.string(), "request id", False),
        _c("block_fct", pa.int64(), "fct of the block this entry advances", False),
        _c("offset", pa.int32(), "1-based draft offset within the block", False),
        _c("row_fct", pa.int64(), "fct of the row record that carried the entry"),
        _c("p_lp", pa.float64(), "target log-prob of the trimmed token"),
        _c("trimmed_token", pa.int64(), "the trimmed draft token"),
        _c("realized_token", pa.int64(), "the token actually committed there"),
    ),
    key=("run_id", "rid", "block_fct", "offset"),
    doc="`pg` gather entries of the estimator JSONL.",
)

ESTIMATOR_EOS = Table(
    "estimator_eos",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rid", pa.string(), "request id", False),
        _c("block_fct", pa.int64(), "block closed by a natural stop", False),
    ),
    key=("run_id", "rid", "block_fct"),
    doc="`eos_end` markers of the estimator JSONL.",
)

# ---------------------------------------------------------------------------
# STS
# ---------------------------------------------------------------------------
STS_SAMPLES = Table(
    "sts_samples",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("shard", pa.int32(), "shard number k of {stem}.{k}.pt", False),
        _c("row_index", pa.int64(), "row within the shard", False),
        _c("logits", F32_LIST, "pre-STS confidence logits (gamma)"),
        _c("prefix_mask", F32_LIST, "1.0 where position < greedy correct prefix (gamma)"),
        _c("label_kind", pa.string(), "greedy-argmax (SGLang) | realized"),
    ),
    key=("run_id", "shard", "row_index"),
    doc="STS calibration samples.",
)

STS_TABLES = Table(
    "sts_tables",
    (
        _c("table_hash", pa.string(), "sha256 of the JSON text", False),
        _c("position", pa.int32(), "draft position k", False),
        _c("temperature", pa.float64(), "T_k"),
        _c("ece_before", pa.float64(), "ECE before fit at k"),
        _c("ece_after", pa.float64(), "ECE after fit at k"),
        _c("dataset", pa.string(), "dataset string from the file"),
        _c("num_samples", pa.int64(), "samples used by the fit"),
        _c("source_path", pa.string(), "file it came from"),
    ),
    key=("table_hash", "position"),
    doc="STS calibration tables (long: one row per position).",
)

# ---------------------------------------------------------------------------
# SPS
# ---------------------------------------------------------------------------
SPS_TABLES = Table(
    "sps_tables",
    (
        _c("table_hash", pa.string(), "sha256 of the JSON text", False),
        _c("kind", pa.string(), "diagonal | additive", False),
        _c("component", pa.string(), "steps_per_sec | alpha_seconds | theta_seconds | bias_seconds | max_batch_tokens", False),
        _c("probe", pa.int64(), "probe (batch tokens, bs, or N+M); -1 for scalars", False),
        _c("value", pa.float64(), "value at the probe"),
        _c("source_path", pa.string(), "file it came from"),
    ),
    key=("table_hash", "component", "probe"),
    doc="SPS cost tables (long form, both SGLang formats).",
)

SPS_PROFILE_RECORDS = Table(
    "sps_profile_records",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("repeat", pa.int32(), "repeat", False),
        _c("batch_size", pa.int32(), "total batch size", False),
        _c("batch_size_per_rank", pa.int32(), "batch size per rank"),
        _c("frac", pa.float64(), "forced budget fraction (NULL: diagonal)"),
        _c("dp_rank", pa.int32(), "DP rank", False),
        _c("forward_ct", pa.int64(), "forward counter", False),
        _c("num_running_reqs", pa.int32(), "running requests"),
        _c("num_verify_tokens", pa.int32(), "verify tokens"),
        _c("step_time_s", pa.float64(), "step time (s)"),
    ),
    key=("run_id", "repeat", "batch_size", "dp_rank", "forward_ct"),
    doc="SGLang SPS profiler <stem>.records.jsonl.",
)

SPS_PROFILE_ROUNDS = Table(
    "sps_profile_rounds",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("repeat", pa.int32(), "repeat", False),
        _c("batch_size", pa.int32(), "total batch size", False),
        _c("batch_size_per_rank", pa.int32(), "batch size per rank"),
        _c("frac", pa.float64(), "forced budget fraction (-1: diagonal)", False),
        _c("batch_tokens", pa.int64(), "N+M tokens of the cell"),
        _c("steps_per_sec", pa.float64(), "1 / median step time"),
        _c("num_steady_steps", pa.int32(), "steady steps"),
        _c("match_fraction", pa.float64(), "fraction of aligned steps"),
        _c("per_rank_median_step_time", F64_LIST, "per-rank median step time (s)"),
        _c("load_info_json", pa.string(), "load_info as JSON"),
    ),
    key=("run_id", "repeat", "batch_size", "frac"),
    doc="SGLang SPS profiler <stem>.rounds.jsonl.",
)

SPS_PROFILE_MANIFESTS = Table(
    "sps_profile_manifests",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("source_path", pa.string(), "manifest file", False),
        _c("verify_num_draft_tokens", pa.int32(), "gamma + 1"),
        _c("tp_size", pa.int32(), "TP size"),
        _c("dp_size", pa.int32(), "DP size"),
        _c("body_json", pa.string(), "whole manifest as JSON"),
    ),
    key=("run_id", "source_path"),
    doc="SGLang SPS profiler <out>.manifest.json.",
)

# ---------------------------------------------------------------------------
# data-quality tables
# ---------------------------------------------------------------------------
REJECTS = Table(
    "rejects",
    (
        _c("source", pa.string(), "file path or URL", False),
        _c("line", pa.int64(), "1-based line (JSONL) or record ordinal (JSON); 0 = whole file", False),
        _c("field", pa.string(), "offending field path, e.g. internal_states[0].records[12].reqs[3].confidence", False),
        _c("reason", pa.string(), "what was wrong", False),
        _c("run_id", pa.string(), "run the record belonged to (if known)"),
        _c("raw", pa.string(), "the offending record, truncated to 2000 chars"),
        _c("ingested_at", pa.timestamp("us", tz="UTC"), "when it was rejected"),
    ),
    key=("source", "line", "field"),
    doc="Invalid records with the reason; valid records of the same source are kept.",
)

GAPS = Table(
    "gaps",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rank", pa.int32(), "DP rank slot", False),
        _c("epoch", pa.int32(), "server incarnation", False),
        _c("from_forward_ct", pa.int64(), "last forward_ct seen before the gap", False),
        _c("to_forward_ct", pa.int64(), "first forward_ct seen after the gap", False),
        _c("kind", pa.string(), "overflow | restart | clear-loss | missing", False),
        _c("detail", pa.string(), "free text"),
    ),
    key=("run_id", "rank", "epoch", "from_forward_ct", "kind"),
    doc="Detected holes in a telemetry stream.",
)

ALL_TABLES: tuple[Table, ...] = (
    RUNS,
    STEPS,
    REQUEST_STEPS,
    REQUESTS,
    ESTIMATOR_ROWS,
    ESTIMATOR_GATHER,
    ESTIMATOR_EOS,
    STS_SAMPLES,
    STS_TABLES,
    SPS_TABLES,
    SPS_PROFILE_RECORDS,
    SPS_PROFILE_ROUNDS,
    SPS_PROFILE_MANIFESTS,
    REJECTS,
    GAPS,
)
TABLES: dict[str, Table] = {t.name: t for t in ALL_TABLES}

# ---------------------------------------------------------------------------
# derived tables: per-run summaries the store keeps up to date as it appends
# (acceptscope.summaries), so a dashboard panel reads kilobytes, not millions of rows.
# Not part of the record model: exports and row counts leave them out.
# ---------------------------------------------------------------------------
SCHEMA_VERSION = 8  # 1: no summaries, no store_meta table; 2: summary tables + store_meta; 3: + sum_step_bins,
# sum_request_keys; 4: + sum_run_rids; 5: + sum_key_pairs, sum_pairs; 6: + sum_request_page, sum_page_runs;
# 7: runs.role (filled by ROLE_SQL for the runs already in the file); 8: request_steps.temperature filled on
# write by the one rule (acceptscope.domain.temperature), the NULLs of an older file filled once
TEMPERATURES_FILLED_SINCE = 8


STORE_META = Table(
    "store_meta",
    (
        _c("key", pa.string(), "setting name (schema_version)", False),
        _c("value", pa.string(), "its value", False),
    ),
    key=("key",),
    doc="Store-level settings: the schema version the file was written with.",
)

_SUM_COUNTS = (
    _c("n", pa.int64(), "request_steps rows", False),
    _c("sum_acc_len", pa.int64(), "Σ acc_len"),
    _c("n_acc_len", pa.int64(), "rows with acc_len"),
    _c("sum_window", pa.int64(), "Σ window"),
    _c("n_window", pa.int64(), "rows with window"),
    _c("sum_correct", pa.int64(), "Σ correct_drafts"),
    _c("n_correct", pa.int64(), "rows with correct_drafts"),
    _c("sum_ceil1", pa.int64(), "Σ (ceiling + 1)"),
    _c("n_ceil", pa.int64(), "rows with a ceiling"),
    _c("sum_acc_len_ceil", pa.int64(), "Σ acc_len over rows with a ceiling"),
    _c("sum_cap_trim", pa.int64(), "Σ cap_trim"),
    _c("n_cap_trim", pa.int64(), "rows with cap_trim"),
)

SUM_CELLS = Table(
    "sum_cells",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("workload", pa.string(), "workload label ('?' where NULL)", False),
        _c("window", pa.int32(), "verified drafts (-1 where NULL)", False),
        *_SUM_COUNTS,
    ),
    key=("run_id", "workload", "window"),
    doc="request_steps sums per (run, workload, window).",
)

SUM_REQUESTS = Table(
    "sum_requests",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rid", pa.string(), "request id", False),
        _c("workload", pa.string(), "workload label ('?' where NULL)", False),
        *_SUM_COUNTS,
        _c("sum_x", pa.float64(), "Σ (1 + Σ_k survival_k): the confidence-implied accept length"),
        _c("n_x", pa.int64(), "rows with survival"),
    ),
    key=("run_id", "rid", "workload"),
    doc="request_steps sums per (run, request, workload): a workload filter reads them too.",
)

SUM_POSITIONS = Table(
    "sum_positions",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("workload", pa.string(), "workload label ('?' where NULL)", False),
        _c("k", pa.int32(), "1-based draft position", False),
        _c("n", pa.int64(), "rows with a survival list reaching k", False),
        _c("sum_s", pa.float64(), "Σ survival_k"),
        _c("n_s", pa.int64(), "non-NULL survival_k"),
        _c("sum_emp", pa.int64(), "rows with ceiling >= k"),
        _c("n_emp", pa.int64(), "rows with a ceiling"),
        _c("n_reached", pa.int64(), "rows with window >= k"),
        _c("sum_acc_given", pa.int64(), "rows with window >= k and correct_drafts >= k"),
        _c("n_acc_given", pa.int64(), "rows with window >= k and correct_drafts"),
    ),
    key=("run_id", "workload", "k"),
    doc="Per-position survival and acceptance counts per (run, workload).",
)

SUM_RELIABILITY = Table(
    "sum_reliability",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("workload", pa.string(), "workload label ('?' where NULL)", False),
        _c("position", pa.int32(), "1-based draft position", False),
        _c("variant", pa.string(), "after (post-STS confidence) | before (sigmoid of the logit)", False),
        _c("bin", pa.int32(), "equal-width confidence bin (summaries.RELIABILITY_BINS bins)", False),
        _c("sum_p", pa.float64(), "Σ predicted confidence"),
        _c("hits", pa.int64(), "labels = 1 (ceiling >= position)"),
        _c("n", pa.int64(), "labelled samples", False),
    ),
    key=("run_id", "workload", "position", "variant", "bin"),
    doc="Calibration bins over blocks with an observed ceiling, per (run, workload).",
)

SUM_STEPS = Table(
    "sum_steps",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("n", pa.int64(), "steps rows", False),
        _c("max_wall_s", pa.float64(), "max wall_time_s"),
        _c("sum_bs", pa.int64(), "Σ bs"),
        _c("n_bs", pa.int64(), "rows with bs"),
        _c("sum_executed", pa.int64(), "Σ executed_verify_tokens"),
        _c("n_executed", pa.int64(), "rows with executed_verify_tokens"),
        _c("sum_modeled_ms", pa.float64(), "Σ modeled_step_ms"),
        _c("n_modeled", pa.int64(), "rows with modeled_step_ms"),
    ),
    key=("run_id",),
    doc="steps sums per run.",
)

STEP_BIN = 64  # forward_ct values per sum_step_bins row


def _bin_sum(name: str, what: str, t: pa.DataType = pa.float64()) -> tuple[Column, Column]:
    return _c(f"sum_{name}", t, f"Σ {what}"), _c(f"n_{name}", pa.int64(), f"rows with {what}")


SUM_STEP_BINS = Table(
    "sum_step_bins",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rank", pa.int32(), "DP rank", False),
        _c("epoch", pa.int32(), "server incarnation", False),
        _c("bin", pa.int64(), "forward_ct // schema.STEP_BIN", False),
        _c("n", pa.int64(), "steps rows", False),
        _c("max_wall_s", pa.float64(), "max wall_time_s"),
        *_bin_sum("bs", "bs", pa.int64()),
        *_bin_sum("budget", "budget", pa.int64()),
        *_bin_sum("num_verify", "num_verify_tokens", pa.int64()),
        *_bin_sum("executed", "executed_verify_tokens", pa.int64()),
        *_bin_sum("predicted_ms", "predicted_step_ms"),
        *_bin_sum("theta", "predicted_theta"),
        *_bin_sum("cpu_ms", "step_cpu_ms"),
        *_bin_sum("gpu_ms", "step_gpu_ms"),
        *_bin_sum("modeled_ms", "modeled_step_ms"),
    ),
    key=("run_id", "rank", "epoch", "bin"),
    doc="steps sums per (run, rank, epoch, STEP_BIN consecutive forward_ct): the cost plot of a long run.",
)

SUM_REQUEST_KEYS = Table(
    "sum_request_keys",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("workload", pa.string(), "requests.workload ('' where NULL: see nulls)", False),
        _c("prompt_index", pa.int32(), "requests.prompt_index (0 where NULL)", False),
        _c("seed", pa.int64(), "requests.seed (0 where NULL)", False),
        _c("nulls", pa.int32(), "which key parts are NULL: 1 workload, 2 prompt_index, 4 seed", False),
        _c("n_requests", pa.int64(), "requests rows with this key", False),
        *_SUM_COUNTS,
        _c("sum_x", pa.float64(), "Σ (1 + Σ_k survival_k)"),
        _c("n_x", pa.int64(), "rows with survival"),
    ),
    key=("run_id", "workload", "prompt_index", "seed", "nulls"),
    doc="request_steps sums per (run, request key) of requests that have a requests row: the pairing key "
        "of the audit arms, so sampling inference joins nothing at read time.",
)

SUM_RUN_RIDS = Table(
    "sum_run_rids",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("scope", pa.int32(), "0: one workload's request ids; 1: the whole run's (workload '')", False),
        _c("workload", pa.string(), "workload label ('?' where NULL; '' for scope 1)", False),
        _c("n", pa.int64(), "distinct rid with request_steps rows", False),
    ),
    key=("run_id", "scope", "workload"),
    doc="Distinct requests with blocks per (run, workload) and per run: run_summary's requests_seen "
        "without a count(DISTINCT rid) over every request.",
)

SUM_KEY_PAIRS = Table(
    "sum_key_pairs",
    (
        _c("compact_run", pa.string(), "the pair's compact run", False),
        _c("audit_run", pa.string(), "the pair's cap-accept run", False),
        _c("workload", pa.string(), "sum_request_keys.workload", False),
        _c("prompt_index", pa.int32(), "sum_request_keys.prompt_index", False),
        _c("seed", pa.int64(), "sum_request_keys.seed", False),
        _c("nulls", pa.int32(), "sum_request_keys.nulls", False),
        _c("n", pa.int64(), "the compact run's blocks with this key (w)", False),
        _c("sum_acc_len", pa.int64(), "its Σ acc_len"),
        _c("n_acc_len", pa.int64(), "its rows with acc_len"),
        _c("sum_x", pa.float64(), "its Σ (1 + Σ_k survival_k)"),
        _c("n_x", pa.int64(), "its rows with survival"),
        _c("audit_sum_ceil1", pa.int64(), "the audit run's Σ (ceiling + 1) (NULL: key not audited)"),
        _c("audit_n_ceil", pa.int64(), "the audit run's rows with a ceiling (NULL: key not audited)"),
    ),
    key=("compact_run", "audit_run", "workload", "prompt_index", "seed", "nulls"),
    doc="sum_request_keys of a compact run side by side with its audit run's, per request key of the compact "
        "run: sampling inference reads one table, no join of 2 x n keys.",
)

SUM_PAIRS = Table(
    "sum_pairs",
    (
        _c("compact_run", pa.string(), "compact run", False),
        _c("audit_run", pa.string(), "cap-accept run of the same audit group", False),
    ),
    key=("compact_run", "audit_run"),
    doc="The (compact, cap-accept) run pairs whose sum_key_pairs rows are kept complete.",
)

SUM_REQUEST_PAGE = Table(
    "sum_request_page",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("rid", pa.string(), "request id", False),
        _c("pos", pa.int64(), "rank in (workload, prompt_index, rid) order at the run's last sort (NULL: added since)"),
        _c("grown", pa.bool_(), "blocks added since the run's last sort (its copy in sum_request_sorted is behind)"),
        _c("has_req", pa.bool_(), "a requests row is stored (only those are listed)", False),
        _c("workload", pa.string(), "requests.workload"),
        _c("prompt_index", pa.int32(), "requests.prompt_index"),
        _c("seed", pa.int64(), "requests.seed"),
        _c("temperature", pa.float64(), "requests.temperature"),
        _c("completion_tokens", pa.int32(), "requests.completion_tokens"),
        _c("finish_reason", pa.string(), "requests.finish_reason"),
        _c("latency_s", pa.float64(), "requests.latency_s"),
        _c("n", pa.int64(), "request_steps rows", False),
        _c("sum_acc_len", pa.int64(), "Σ acc_len"),
        _c("n_acc_len", pa.int64(), "rows with acc_len"),
        _c("sum_window", pa.int64(), "Σ window"),
        _c("n_window", pa.int64(), "rows with window"),
        _c("sum_ceil1", pa.int64(), "Σ (ceiling + 1)"),
        _c("n_ceil", pa.int64(), "rows with a ceiling"),
    ),
    key=("run_id", "rid"),
    doc="The drill-down's rows per (run, request): the requests row's columns and the request's block sums, "
        "ranked (pos) when enough were added since the run's last sort; sum_request_sorted holds a copy in "
        "that order, so a page is a range of pos plus the few rows added since (summaries.page_of_requests).",
)

SUM_REQUEST_SORTED = Table(
    "sum_request_sorted",
    (
        _c("run_id", pa.string(), "run id"),
        _c("pos", pa.int64(), "sum_request_page.pos"),
        *(c for c in SUM_REQUEST_PAGE.columns if c.name not in ("run_id", "pos", "grown", "has_req")),
    ),
    key=("run_id", "pos"),
    doc="sum_request_page's ranked rows of each run as of its last sort, written in pos order (physically "
        "clustered: zone maps skip all but a page's rows). Not in SUMMARY_TABLES: created without a primary "
        "key by acceptscope.summaries, because deleting a run's rows from an ART-indexed table costs ~70 us "
        "a row at commit.",
)

SUM_PAGE_RUNS = Table(
    "sum_page_runs",
    (
        _c("run_id", pa.string(), "run id", False),
        _c("n_base", pa.int64(), "rows of sum_request_page with a pos (the sorted part)", False),
    ),
    key=("run_id",),
    doc="Per run, how many drill-down rows are in sorted order (sum_request_page.pos 0 .. n_base - 1).",
)

SUMMARY_TABLES: tuple[Table, ...] = (SUM_CELLS, SUM_REQUESTS, SUM_POSITIONS, SUM_RELIABILITY, SUM_STEPS,
                                     SUM_STEP_BINS, SUM_REQUEST_KEYS, SUM_RUN_RIDS, SUM_KEY_PAIRS, SUM_PAIRS,
                                     SUM_REQUEST_PAGE, SUM_PAGE_RUNS)


def table(name: str) -> Table:
    """Look a table up by name, with a clear error."""
    try:
        return TABLES[name]
    except KeyError:
        raise KeyError(f"unknown table {name!r}; known: {sorted(TABLES)}") from None


def empty_batch(t: Table) -> pa.RecordBatch:
    return pa.RecordBatch.from_pylist([], schema=t.arrow_schema)


def to_batch(t: Table, rows: Sequence[dict]) -> pa.RecordBatch:
    """Build an Arrow batch of table ``t`` from row dicts (missing keys become NULL)."""
    cols = {c.name: [r.get(c.name) for r in rows] for c in t.columns}
    return pa.RecordBatch.from_pydict(cols, schema=t.arrow_schema)


# ---------------------------------------------------------------------------
# input coercion
# ---------------------------------------------------------------------------
def _check_columns(t: Table, names: Sequence[str], what: str) -> None:
    known = set(t.names)
    unknown = [n for n in names if n not in known]
    if unknown:
        raise ValueError(f"{what} for table {t.name!r} has unknown column(s) {unknown}; known: {t.names}")


def _conform(t: Table, data: pa.Table, what: str) -> pa.Table:
    _check_columns(t, data.column_names, what)
    cols = []
    for c in t.columns:
        if c.name in data.column_names:
            col = data.column(c.name)
            if col.type != c.type:
                try:
                    col = col.cast(c.type)
                except (pa.ArrowInvalid, pa.ArrowNotImplementedError, pa.ArrowTypeError) as e:
                    raise ValueError(
                        f"{what} for table {t.name!r}: column {c.name!r} of type {col.type} "
                        f"cannot become {c.type}: {e}"
                    ) from e
        else:
            col = pa.nulls(data.num_rows, c.type)
        if not c.nullable and col.null_count:
            raise ValueError(
                f"{what} for table {t.name!r}: column {c.name!r} is required but has {col.null_count} NULL value(s)"
            )
        cols.append(col)
    return pa.Table.from_arrays(cols, schema=t.arrow_schema)


def as_arrow(t: Table, data: Any) -> pa.Table:
    """Coerce row dicts, a DataFrame, or Arrow data into table ``t``'s exact schema.

    Unknown columns, uncastable values and NULLs in required columns raise a
    ``ValueError`` naming the table and column; missing nullable columns become NULL.
    """
    if isinstance(data, pa.RecordBatch):
        data = pa.Table.from_batches([data])
    if isinstance(data, pa.Table):
        return _conform(t, data, "Arrow data")
    if isinstance(data, pd.DataFrame):
        _check_columns(t, [str(c) for c in data.columns], "DataFrame")
        arrays = []
        for c in t.columns:
            if c.name not in data.columns:
                arrays.append(pa.nulls(len(data), c.type))
                continue
            try:
                arrays.append(pa.array(data[c.name], type=c.type, from_pandas=True))
            except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
                raise ValueError(
                    f"DataFrame for table {t.name!r}: column {c.name!r} cannot become {c.type}: {e}"
                ) from e
        return _conform(t, pa.Table.from_arrays(arrays, names=t.names), "DataFrame")
    if isinstance(data, Mapping):
        data = [data]
    rows = list(data)
    if rows and not all(isinstance(r, Mapping) for r in rows):
        bad = next(i for i, r in enumerate(rows) if not isinstance(r, Mapping))
        raise ValueError(f"rows for table {t.name!r}: row {bad} is {type(rows[bad]).__name__}, not a dict")
    keys: set[str] = set()
    for r in rows:
        keys.update(r.keys())
    _check_columns(t, sorted(keys), "rows")
    cols = {}
    for c in t.columns:
        vals = [r.get(c.name) for r in rows]
        try:
            cols[c.name] = pa.array(vals, type=c.type)
        except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, ValueError, OverflowError) as e:
            bad = _first_bad(vals, c.type)
            raise ValueError(
                f"rows for table {t.name!r}: column {c.name!r} row {bad} value {vals[bad]!r:.80} "
                f"cannot become {c.type}: {e}"
            ) from e
    return _conform(t, pa.Table.from_pydict(cols, schema=t.arrow_schema), "rows")


def _first_bad(vals: list, type_: pa.DataType) -> int:
    for i, v in enumerate(vals):
        try:
            pa.array([v], type=type_)
        except Exception:  # noqa: BLE001 - we are locating the offender
            return i
    return 0
