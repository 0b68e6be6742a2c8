"""AIPerf's per-request records (``profile_export.jsonl``) with speculative-decoding metrics.

Format source, ai-dynamo/aiperf: ``src/aiperf/common/models/record_export_models.py`` at commit
745695dd14c122a737a25b2747ba666538f79078 (``MetricRecordInfo``: one JSON object a line with
``metadata``, ``metrics`` = ``{tag: {"value", "unit"}}`` and ``error``), the record metadata in
``src/aiperf/common/models/record_models.py`` at 017c63d230ace93f323d5e423e95a6bb9aad1335
(``session_num``, ``x_request_id``, ``turn_index``, ``request_start_ns``, ``request_end_ns``,
``benchmark_phase``), and the spec-decode record metrics in
``src/aiperf/metrics/types/spec_decode_metrics.py`` at 1849cd1baf9f1bfc88e4d047c4028bc291d091a4, read
from the engine-neutral ``SpecDecodeAcceptanceRecord`` (``src/aiperf/common/models/spec_decode_models.py``
at 0786f0ca7116427792e7feb5b97834bd1f0b0243):

* ``spec_decode_steps``: verify steps of the request (``num_spec_steps``);
* ``spec_decode_accepted_draft_tokens``: accepted draft tokens, bonus excluded;
* ``spec_decode_draft_tokens``: proposed draft tokens counted toward acceptance (vLLM reports them after
  removing structured-output-invalidated drafts).

(``spec_decode_acceptance_length`` and ``spec_decode_draft_acceptance_rate`` are ratios of those three;
the per-request histogram is pooled by AIPerf into ``profile_export_aiperf.json``, not written per line.)

Rows: one ``requests`` row per profiling record with the three counts (``spec_verify_ct``,
``spec_num_correct_drafts``, ``spec_num_proposed_drafts``) and ``latency_s``; warmup records, failed
requests and requests without spec-decode metrics (speculation off or no verify step) are counted in the
run's ``config_json``, not stored. A line that is not a record, or whose counts are not non-negative
integers with accepted <= proposed, is rejected alone. The run's ``gamma`` is not in the records: it is
the largest whole number of draft tokens per step any request averaged (a lower bound of k), ``arm``
static; ``config_json`` says so.
"""

from __future__ import annotations

import json

from acceptscope.ingest.engines.records import EngineBatch, json_count, run_row
from acceptscope.ingest.rejects import INT32_MAX, INT64_MAX, decode_failure

SOURCE_VERSION = ("ai-dynamo/aiperf@745695dd14c122a737a25b2747ba666538f79078 "
                  "src/aiperf/common/models/record_export_models.py; spec_decode_metrics.py@1849cd1b")
TAGS = {"spec_decode_steps": "spec_verify_ct", "spec_decode_accepted_draft_tokens": "spec_num_correct_drafts",
        "spec_decode_draft_tokens": "spec_num_proposed_drafts"}


def parse_profile_export(data: bytes, source: str, run_id: str) -> EngineBatch:
    """Every record of one ``profile_export.jsonl`` (see the module docstring)."""
    b = EngineBatch()
    skipped = {"warmup": 0, "error": 0, "no_spec_decode": 0}
    per_step = 0
    for ln, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            rec = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            b.reject(source, ln, "$", f"not JSON: {decode_failure(e)}", raw[:200], run_id)
            continue
        meta = rec.get("metadata") if isinstance(rec, dict) else None
        metrics = rec.get("metrics") if isinstance(rec, dict) else None
        if not isinstance(meta, dict) or not isinstance(metrics, dict):
            b.reject(source, ln, "$", "not an AIPerf MetricRecordInfo (needs metadata and metrics objects)", rec, run_id)
            continue
        if meta.get("benchmark_phase") == "warmup":
            skipped["warmup"] += 1
            continue
        if rec.get("error"):
            skipped["error"] += 1
            continue
        if not any(t in metrics for t in TAGS):
            skipped["no_spec_decode"] += 1
            continue
        row: dict = {"run_id": run_id}
        bad = None
        for tag, col in TAGS.items():
            mv = metrics.get(tag)
            v = json_count(mv.get("value"), INT32_MAX if col == "spec_verify_ct" else INT64_MAX) if isinstance(mv, dict) else None
            if v is None:
                bad = (f"metrics.{tag}.value", f"expected a count, got {mv!r}")
                break
            row[col] = v
        if bad is None and row["spec_num_correct_drafts"] > row["spec_num_proposed_drafts"]:
            bad = ("metrics.spec_decode_accepted_draft_tokens.value",
                   f"{row['spec_num_correct_drafts']} accepted of {row['spec_num_proposed_drafts']} proposed")
        rid = meta.get("x_request_id") or (f"session{meta.get('session_num')}.turn{meta.get('turn_index') or 0}"
                                            if meta.get("session_num") is not None else None)
        if bad is None and not isinstance(rid, str):
            bad = ("metadata.x_request_id", "no request id (x_request_id or session_num)")
        if bad is not None:
            b.reject(source, ln, bad[0], bad[1], rec, run_id)
            continue
        row["rid"] = rid
        t0, t1 = meta.get("request_start_ns"), meta.get("request_end_ns")
        if isinstance(t0, int) and isinstance(t1, int) and t1 >= t0:
            row["latency_s"] = (t1 - t0) / 1e9
        if row["spec_verify_ct"]:
            per_step = max(per_step, row["spec_num_proposed_drafts"] // row["spec_verify_ct"])
        b.requests.append(row)
    if b.requests:
        b.runs.append(run_row(run_id, "aiperf", "static", max(per_step, 1), None, {
            "format": "aiperf-profile-export", "producer": SOURCE_VERSION, "file": source, "not_stored": skipped,
            "gamma": "not recorded: the largest whole number of draft tokens per step a request averaged (a lower "
                     "bound of k)"}))
    return b
