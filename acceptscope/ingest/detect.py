"""Sniff which SGLang artifact a file is.

Rules, first match wins (names are checked before content):

1. ``*.pt`` -> ``sts_shard`` (``{stem}.{k}.pt``).
2. Other engines (:mod:`acceptscope.ingest.engines`): ``dflash_accept_stats_rank*.json`` ->
   ``trtllm_accept_stats``; ``*profile_export.jsonl`` -> ``aiperf_profile_export``; ``*.prom`` /
   ``*.txt`` / ``*.metrics`` holding ``vllm:spec_decode_`` -> ``vllm_metrics`` (else ``skip``).
   ``*.manifest.json`` -> ``sps_profile_manifest``; ``*.records.jsonl`` ->
   ``sps_profile_records``; ``*.rounds.jsonl`` -> ``sps_profile_rounds``.
3. Other ``.json`` / ``.jsonl`` / ``.ndjson`` files: the first 64 KiB are searched
   for key names (with their quotes):
   ``"internal_states"`` / ``"dspark_info_record"`` / (``"verify_num_draft_tokens"``
   and ``"records"``) -> ``server_info``;
   ``"round_summaries"`` -> ``sps_profile_manifest``;
   ``"step_time"`` and ``"dp_rank"`` -> ``sps_profile_records``;
   ``"steps_per_sec"`` and ``"batch_tokens"`` -> ``sps_profile_rounds``;
   ``"sample_batch_tokens"`` or ``"bias_seconds"`` -> ``sps_table``;
   ``"temperatures"`` -> ``sts_table``;
   ``"eos_end"``, or ``"rid"`` with ``"fct"`` -> ``estimator_jsonl``;
   ``"spec_decode_steps"`` and ``"metadata"`` -> ``aiperf_profile_export``;
   ``"meta_info"`` / ``"spec_tokens_details"`` / ``"sglext"`` -> ``responses``.
4. An empty (or whitespace-only) file with those extensions is ``empty``: listed, not
   rejected (SGLang's estimator writes one for a greedy-only run).
5. Anything else with those extensions is ``unknown`` (a reject); files with
   other extensions are ``skip`` (not an artifact: READMEs, scripts, plots).
"""

from __future__ import annotations

from pathlib import Path

from acceptscope.ingest.rejects import safe_text

KINDS = (
    "server_info",
    "estimator_jsonl",
    "sts_shard",
    "sts_table",
    "sps_table",
    "sps_profile_records",
    "sps_profile_rounds",
    "sps_profile_manifest",
    "responses",
    # other engines (acceptscope.ingest.engines)
    "vllm_metrics",
    "trtllm_accept_stats",
    "aiperf_profile_export",
)
ENGINE_TEXT_SUFFIXES = (".prom", ".txt", ".metrics")  # a Prometheus text dump
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
HEAD_BYTES = 64 * 1024


def detect_bytes(head: bytes) -> str:
    """Kind from the beginning of a JSON / JSONL file (rule 3)."""
    h = head
    if b'"internal_states"' in h or b'"dspark_info_record"' in h or (
        b'"verify_num_draft_tokens"' in h and b'"records"' in h
    ):
        return "server_info"
    if b'"round_summaries"' in h:
        return "sps_profile_manifest"
    if b'"step_time"' in h and b'"dp_rank"' in h:
        return "sps_profile_records"
    if b'"steps_per_sec"' in h and b'"batch_tokens"' in h:
        return "sps_profile_rounds"
    if b'"sample_batch_tokens"' in h or b'"bias_seconds"' in h:
        return "sps_table"
    if b'"temperatures"' in h:
        return "sts_table"
    if b'"eos_end"' in h or (b'"rid"' in h and b'"fct"' in h):
        return "estimator_jsonl"
    if b'"spec_decode_steps"' in h and b'"metadata"' in h:
        return "aiperf_profile_export"
    if b'"meta_info"' in h or b'"spec_tokens_details"' in h or b'"sglext"' in h:
        return "responses"
    return "unknown"


def detect(path: str | Path) -> str:
    """Kind of the file at ``path`` (see the module docstring for the rules)."""
    p = Path(path)
    name = p.name
    if name.endswith(".pt"):
        return "sts_shard"
    if name.endswith(".manifest.json"):
        return "sps_profile_manifest"
    if name.endswith(".records.jsonl"):
        return "sps_profile_records"
    if name.endswith(".rounds.jsonl"):
        return "sps_profile_rounds"
    if name.startswith("dflash_accept_stats_rank") and name.endswith(".json"):
        return "trtllm_accept_stats"
    if name.endswith("profile_export.jsonl"):
        return "aiperf_profile_export"
    if name.endswith(ENGINE_TEXT_SUFFIXES):
        with open(p, "rb") as f:
            return "vllm_metrics" if b"vllm:spec_decode_" in f.read(HEAD_BYTES) else "skip"
    if not name.endswith(JSON_SUFFIXES):
        return "skip"
    with open(p, "rb") as f:
        head = f.read(HEAD_BYTES)
    if not head.strip():
        return "empty"  # e.g. SGLang's estimator file of a greedy-only run: nothing to ingest, nothing wrong
    return detect_bytes(head)


def run_id_for(path: str | Path) -> str:
    """Default run id of an artifact: its file name up to the first dot (``capacc.server_info.json`` -> ``capacc``)."""
    name = safe_text(Path(path).name)  # (a file name of undecodable bytes holds lone surrogates)
    stem = name.split(".", 1)[0]
    return stem or name
