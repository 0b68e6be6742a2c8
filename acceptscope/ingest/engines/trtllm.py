"""TensorRT-LLM's DFlash/DSpark accept statistics (``dflash_accept_stats_rank<r>.json``).

Format source: ``tensorrt_llm/_torch/speculative/accept_stats.py`` of NVIDIA/TensorRT-LLM at commit
00e61311bf66a501595679a621645a379c9c4b82 (``DFlashAcceptStatsRecorder.snapshot``, written when
``TLLM_DFLASH_ACCEPT_STATS_DIR`` is set). One JSON object per rank:

* ``rank``, ``max_draft_len`` (K), ``num_steps`` (verify steps recorded);
* ``accepted_draft_hist``: K+1 counts, ``hist[a]`` = verify steps (one request each) that accepted exactly
  ``a`` draft tokens, bonus not counted; request id 0 (warmup and DP padding) is excluded by the producer;
* ``per_request``: ``{request id: {"steps", "accepted_draft"}}``;
* ``confidence_calibration``: ``num_bins`` (default 20) and ``attempts`` / ``accepted`` as K x bins counts:
  position k (0-based), bin b covers confidence ``[b/bins, (b+1)/bins)``; ``accepted`` counts blocks that
  accepted position k. Empty unless the DSpark confidence provider is installed.

Rows: ``engine_counts`` cells (``num_steps``, ``accepted_draft_hist`` by position = a, ``calib_attempts`` /
``calib_accepted`` by position and bin, bins with no attempts left out; ``calib_num_bins``), ``requests`` rows from ``per_request`` (``spec_verify_ct`` =
steps, ``spec_num_correct_drafts`` = accepted_draft), one ``runs`` row. The verify width is not
recorded: the run is filed as ``static`` and, as the producer warns, with ``confidence_threshold`` > 0 a
trimmed position is *forced to be rejected*, so its histogram counts trimmed drafts as rejected.

Bad records are rejected alone: a per-request entry, one position's calibration row, the histogram (a
histogram missing a bin would misstate every rate, so it goes whole, naming the bad bin); a file whose
``rank`` or ``max_draft_len`` is unreadable is rejected whole (nothing in it can be placed).
"""

from __future__ import annotations

import json
from typing import Any

from acceptscope.ingest.engines.records import EngineBatch, count_row, json_count, run_row
from acceptscope.ingest.rejects import INT32_MAX, decode_failure

SOURCE_VERSION = ("NVIDIA/TensorRT-LLM@00e61311bf66a501595679a621645a379c9c4b82 "
                  "tensorrt_llm/_torch/speculative/accept_stats.py")
MAX_DRAFT_LEN = 1024


def parse_accept_stats(data: bytes, source: str, run_id: str) -> EngineBatch:
    """One rank's snapshot (see the module docstring)."""
    b = EngineBatch()
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError) as e:
        b.reject(source, 1, "$", f"not JSON: {decode_failure(e)}", data[:200], run_id)
        return b
    if not isinstance(doc, dict):
        b.reject(source, 1, "$", f"expected a JSON object, got {type(doc).__name__}", doc, run_id)
        return b
    rank, K = json_count(doc.get("rank"), INT32_MAX), json_count(doc.get("max_draft_len"), MAX_DRAFT_LEN)
    if rank is None or not K:
        fld = "rank" if rank is None else "max_draft_len"
        b.reject(source, 1, fld, f"{fld} {doc.get(fld)!r} is not a valid count: the file cannot be placed", None, run_id)
        return b
    b.runs.append(run_row(run_id, "tensorrt-llm", "static", K, None, {
        "format": "trtllm-accept-stats", "producer": SOURCE_VERSION, "file": source,
        "arm": "verify width not recorded; with confidence_threshold > 0 trimmed positions count as rejected"}))
    n = json_count(doc.get("num_steps"))
    if n is None:
        b.reject(source, 1, "num_steps", f"not a count: {doc.get('num_steps')!r}", None, run_id)
    else:
        b.counts.append(count_row(run_id, source, rank, "num_steps", n))
    _hist(b, doc.get("accepted_draft_hist"), K, rank, source, run_id)
    _requests(b, doc.get("per_request"), K, source, run_id)
    _calibration(b, doc.get("confidence_calibration"), K, rank, source, run_id)
    return b


def _hist(b: EngineBatch, hist: Any, K: int, rank: int, source: str, run_id: str) -> None:
    if not isinstance(hist, list) or len(hist) != K + 1:
        b.reject(source, 1, "accepted_draft_hist", f"expected a list of max_draft_len + 1 = {K + 1} counts", hist, run_id)
        return
    cells = [json_count(v) for v in hist]
    bad = [i for i, c in enumerate(cells) if c is None]
    if bad:
        b.reject(source, 1, f"accepted_draft_hist[{bad[0]}]", f"not a count: {hist[bad[0]]!r} (the histogram is "
                 "not stored: a missing bin would misstate every rate)", hist, run_id)
        return
    b.counts.extend(count_row(run_id, source, rank, "accepted_draft_hist", c, a) for a, c in enumerate(cells))


def _requests(b: EngineBatch, per: Any, K: int, source: str, run_id: str) -> None:
    if per is None:
        return
    if not isinstance(per, dict):
        b.reject(source, 1, "per_request", f"expected an object of request ids, got {type(per).__name__}", per, run_id)
        return
    for rid, v in per.items():
        fld = f"per_request.{rid}"
        steps = json_count(v.get("steps"), INT32_MAX) if isinstance(v, dict) else None
        acc = json_count(v.get("accepted_draft")) if isinstance(v, dict) else None
        if steps is None or acc is None:
            b.reject(source, 1, fld + (".steps" if steps is None else ".accepted_draft"),
                     "expected {\"steps\": count, \"accepted_draft\": count}", v, run_id)
            continue
        if acc > steps * K:
            b.reject(source, 1, fld + ".accepted_draft", f"{acc} accepted drafts in {steps} steps of at most {K}", v, run_id)
            continue
        b.requests.append({"run_id": run_id, "rid": str(rid), "spec_verify_ct": steps, "spec_num_correct_drafts": acc})


def _calibration(b: EngineBatch, cc: Any, K: int, rank: int, source: str, run_id: str) -> None:
    if cc is None:
        return
    nb = json_count(cc.get("num_bins"), 1 << 16) if isinstance(cc, dict) else None
    if not nb:
        b.reject(source, 1, "confidence_calibration.num_bins", "not a bin count", cc, run_id)
        return
    att, acc = cc.get("attempts"), cc.get("accepted")
    if not (isinstance(att, list) and isinstance(acc, list) and len(att) == len(acc) == K):
        b.reject(source, 1, "confidence_calibration", f"expected attempts and accepted as {K} rows", cc, run_id)
        return
    b.counts.append(count_row(run_id, source, rank, "calib_num_bins", nb))
    for k in range(K):
        ra, rc = att[k], acc[k]
        ok = isinstance(ra, list) and isinstance(rc, list) and len(ra) == len(rc) == nb
        cells = [(json_count(x), json_count(y)) for x, y in zip(ra, rc)] if ok else []
        if not ok or any(x is None or y is None or y > x for x, y in cells):
            b.reject(source, 1, f"confidence_calibration.attempts[{k}]", f"position {k}: expected {nb} counts each, "
                     "accepted <= attempts", {"attempts": ra, "accepted": rc}, run_id)
            continue
        for j, (x, y) in enumerate(cells):
            if x:
                b.counts.append(count_row(run_id, source, rank, "calib_attempts", x, k, j))
                b.counts.append(count_row(run_id, source, rank, "calib_accepted", y, k, j))
