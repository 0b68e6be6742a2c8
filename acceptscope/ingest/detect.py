"""Sniff which SGLang artifact a file is.

Rules, first match wins (names are checked before content); the kinds, their name rules and their
keys are the registry's (:mod:`acceptscope.ingest.kinds`), listed here for the reader:

1. ``*.pt`` -> ``sts_shard`` (``{stem}.{k}.pt``).
2. Other engines (:mod:`acceptscope.ingest.engines`): ``dflash_accept_stats_rank*.json`` ->
   ``trtllm_accept_stats``; ``*profile_export.jsonl`` -> ``aiperf_profile_export``; ``*.prom`` /
   ``*.txt`` / ``*.metrics`` holding ``vllm:spec_decode_`` -> ``vllm_metrics``; ``*.log`` / ``*.txt`` holding
   ``DSpark ragged verify: {`` (TensorRT-LLM's ``DSparkRaggedStats.log_summary``) -> ``trtllm_dspark_stats``
   (else ``skip``).
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
   ``"speculative_decoding"`` / ``"speculative_decoding_stats"`` with ``"num_spec_steps"`` -> ``vllm_request_metrics``;
   ``"steps_no_windows"`` and ``"trim_regret_rate"`` -> ``trtllm_dspark_stats``;
   ``"meta_info"`` / ``"spec_tokens_details"`` / ``"sglext"`` -> ``responses``.
4. An empty (or whitespace-only) file with those extensions is ``empty``: listed, not
   rejected (SGLang's estimator writes one for a greedy-only run).
5. Anything else with those extensions is ``unknown`` (a reject); files with
   other extensions are ``skip`` (not an artifact: READMEs, scripts, plots).
"""

from __future__ import annotations

from pathlib import Path

from acceptscope.ingest.kinds import NAMES, kind_of_head, kind_of_name
from acceptscope.ingest.rejects import safe_text

KINDS = NAMES  # (the registry: acceptscope.ingest.kinds)
ENGINE_TEXT_SUFFIXES = (".prom", ".txt", ".metrics", ".log")  # a Prometheus text dump, a server log
DSPARK_LOG_MARK = b"DSpark ragged verify: {"  # TensorRT-LLM's DSparkRaggedStats.log_summary line
JSON_SUFFIXES = (".json", ".jsonl", ".ndjson")
HEAD_BYTES = 64 * 1024


def detect_bytes(head: bytes) -> str:
    """Kind from the beginning of a JSON / JSONL file (rule 3; the keys are the registry's)."""
    return kind_of_head(head)


def detect(path: str | Path) -> str:
    """Kind of the file at ``path`` (see the module docstring for the rules)."""
    p = Path(path)
    name = p.name
    by_name = kind_of_name(name)  # rules 1-2 (the registry's name rules)
    if by_name is not None:
        return by_name
    if name.endswith(ENGINE_TEXT_SUFFIXES):
        with open(p, "rb") as f:
            head = f.read(HEAD_BYTES)
        if b"vllm:spec_decode_" in head and not name.endswith(".log"):
            return "vllm_metrics"
        found = DSPARK_LOG_MARK in head or (name.endswith(".log") and _contains(p, DSPARK_LOG_MARK))
        return "trtllm_dspark_stats" if found else "skip"
    if not name.endswith(JSON_SUFFIXES):
        return "skip"
    with open(p, "rb") as f:
        head = f.read(HEAD_BYTES)
    if not head.strip():
        return "empty"  # e.g. SGLang's estimator file of a greedy-only run: nothing to ingest, nothing wrong
    return detect_bytes(head)


def _contains(p: Path, mark: bytes, chunk: int = 1 << 20) -> bool:
    """Whether the file holds ``mark`` anywhere (a server log prints its stats summary late, past any head)."""
    tail = b""
    with open(p, "rb") as f:
        while block := f.read(chunk):
            if mark in tail + block:
                return True
            tail = block[-len(mark):]
    return False


def run_id_for(path: str | Path) -> str:
    """Default run id of an artifact: its file name up to the first dot (``capacc.server_info.json`` -> ``capacc``)."""
    name = safe_text(Path(path).name)  # (a file name of undecodable bytes holds lone surrogates)
    stem = name.split(".", 1)[0]
    return stem or name
