"""vLLM's per-request spec-decode metrics (``--per-request-spec-decode-metrics summary|detailed``), from the
response bodies a client kept (one JSON object a line, one JSON document holding a list of them, or a saved
stream: ``data: {...}`` lines, the metrics on the final usage chunk).

Format source: ``docs/features/speculative_decoding/acceptance_metrics.md`` of vllm-project/vllm at commit
02cf515f0b62e6fc36d5ff8fb9b486a30e8dbe08 (the response's ``metrics.speculative_decoding``; marked experimental
there) and, for the earlier shape, the same file at cd199986df1171c3255ce2e07e2c63be4385ef9f (per choice,
``choices[i].speculative_decoding_stats``, a sparse ``{"j": count}`` histogram, flag
``--per-request-spec-decode-stats``). vLLM's own producer (``RequestSpecDecodeMetrics`` in
``vllm/v1/metrics/stats.py``) is not in the stored snapshot of that file (28ed1fb8 predates it) and imports
the engine, so the fixtures are written from the documented format. One record:

* ``num_spec_tokens`` (k), ``num_spec_steps`` (verify steps), ``num_accepted_draft_tokens`` (bonus excluded),
  ``num_draft_tokens`` (proposed, after structured-output invalidation);
* ``acceptance_histogram``: k+1 counts, index j = steps that accepted exactly j drafts;
* ``acceptance_histogram_by_draft_length`` (02cf515f): ``{"d": [d+1 counts]}`` by drafts proposed at the step;
* ``detailed`` adds ``per_step_accepted`` and ``per_step_drafted``, one entry per verify step, in order;
* ``mean_acceptance_length`` = 1 + accepted / steps and ``draft_acceptance_rate`` = accepted / draft tokens.

Rows: a ``requests`` row per record (``spec_verify_ct``, ``spec_num_correct_drafts``,
``spec_num_proposed_drafts``, ``spec_correct_drafts_histogram``, ``completion_tokens`` from ``usage``), and
``engine_request_counts`` cells: ``step_accepted`` / ``step_drafted`` by step, ``accepted_hist_by_len`` by
(accepted, proposed). Every identity the format defines is checked (histogram sums, per-step sums and lengths,
accepted <= proposed <= k per step, the two ratios); a record that breaks one is rejected alone with its line
and field, and nothing of it is kept. A null record (speculation off, ``n > 1``) or a body without one (a
streamed chunk before the last) is counted in the run's ``config_json``, not rejected.
"""

from __future__ import annotations

import json
import math
from typing import Any, Iterator, Optional

from acceptscope.ingest.engines.records import EngineBatch, json_count, request_count_row, run_row
from acceptscope.ingest.rejects import INT32_MAX, decode_failure, find_poison, safe_text

SOURCE_VERSION = ("vllm-project/vllm@02cf515f0b62e6fc36d5ff8fb9b486a30e8dbe08 "
                  "docs/features/speculative_decoding/acceptance_metrics.md (metrics.speculative_decoding); "
                  "@cd199986df1171c3255ce2e07e2c63be4385ef9f (choices[].speculative_decoding_stats)")
MAX_SPEC_TOKENS = 1024
RATIO_TOL = 1e-9


def _objects(data: bytes, source: str, b: EngineBatch, run_id: str) -> Iterator[tuple[int, str, Any]]:
    """(line, field prefix, object) of every response body: a JSON document (an object or a list), else JSONL."""
    try:
        doc = json.loads(data)
    except (ValueError, UnicodeDecodeError, RecursionError):
        doc = None
    if isinstance(doc, list):
        for i, o in enumerate(doc):
            yield 1, f"[{i}].", o
        return
    if isinstance(doc, dict):
        yield 1, "", doc
        return
    for ln, raw in enumerate(data.splitlines(), 1):
        raw = raw.strip()
        if raw.startswith(b"data:"):  # a saved server-sent-event stream: the payload after "data:"
            raw = raw[5:].strip()
        if not raw or raw == b"[DONE]":
            continue
        try:
            yield ln, "", json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            b.reject(source, ln, "$", f"not JSON: {decode_failure(e)}", raw[:200], run_id)


def _records(obj: dict, pre: str) -> Iterator[tuple[str, Optional[str], Any]]:
    """(field path, rid suffix, record) of one body: ``metrics.speculative_decoding``, else per choice."""
    metrics = obj.get("metrics")
    if isinstance(metrics, dict) and "speculative_decoding" in metrics:
        yield f"{pre}metrics.speculative_decoding", None, metrics["speculative_decoding"]
        return
    choices = obj.get("choices")
    if isinstance(choices, list):
        with_stats = [(i, c) for i, c in enumerate(choices) if isinstance(c, dict) and "speculative_decoding_stats" in c]
        for i, c in with_stats:
            idx = c.get("index", i)
            yield (f"{pre}choices[{i}].speculative_decoding_stats", None if len(choices) == 1 else f"#{idx}",
                   c["speculative_decoding_stats"])


def _hist(v: Any, K: int) -> Optional[list[int]]:
    """The dense histogram of a record (a list of k+1 counts, or the sparse ``{"j": count}`` map)."""
    if isinstance(v, dict):
        out = [0] * (K + 1)
        for j, n in v.items():
            jj, nn = (int(j) if isinstance(j, str) and j.isdigit() else None), json_count(n)
            if jj is None or jj > K or nn is None:
                return None
            out[jj] = nn
        return out
    if isinstance(v, list) and len(v) == K + 1:
        cells = [json_count(x) for x in v]
        return None if any(c is None for c in cells) else cells
    return None


def _close(x: Any, want: float) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x) and \
        abs(x - want) <= RATIO_TOL * max(1.0, abs(want))


def check_record(r: Any, K_run: Optional[int]) -> tuple[Optional[dict], Optional[tuple[str, str]]]:
    """The record's counts, or (field, reason) of the first identity it breaks."""
    if not isinstance(r, dict):
        return None, ("", f"expected an object, got {type(r).__name__}")
    K = json_count(r.get("num_spec_tokens"), MAX_SPEC_TOKENS)
    if not K:
        return None, ("num_spec_tokens", f"not a draft length 1..{MAX_SPEC_TOKENS}: {r.get('num_spec_tokens')!r}")
    if K_run is not None and K != K_run:
        return None, ("num_spec_tokens", f"k = {K}, but this file's run has k = {K_run}")
    s, a, d = (json_count(r.get(f), INT32_MAX) for f in ("num_spec_steps", "num_accepted_draft_tokens",
                                                          "num_draft_tokens"))
    for f, v in (("num_spec_steps", s), ("num_accepted_draft_tokens", a), ("num_draft_tokens", d)):
        if v is None:
            return None, (f, f"not a count: {r.get(f)!r}")
    if a > d or d > s * K:
        return None, ("num_accepted_draft_tokens" if a > d else "num_draft_tokens",
                      f"accepted {a} <= proposed {d} <= steps {s} x k {K} does not hold")
    h = _hist(r.get("acceptance_histogram"), K)
    if h is None:
        return None, ("acceptance_histogram", f"expected {K + 1} counts (a list, or a map of 0..{K})")
    if sum(h) != s or sum(j * n for j, n in enumerate(h)) != a:
        return None, ("acceptance_histogram", f"sums to {sum(h)} steps and {sum(j * n for j, n in enumerate(h))} "
                      f"accepted, not {s} and {a}")
    if s and "mean_acceptance_length" in r and not _close(r["mean_acceptance_length"], 1 + a / s):
        return None, ("mean_acceptance_length", f"{r['mean_acceptance_length']!r} is not 1 + {a}/{s}")
    if d and "draft_acceptance_rate" in r and not _close(r["draft_acceptance_rate"], a / d):
        return None, ("draft_acceptance_rate", f"{r['draft_acceptance_rate']!r} is not {a}/{d}")
    out = {"K": K, "steps": s, "accepted": a, "drafted": d, "hist": h, "by_len": {}, "pa": None, "pd": None}
    by_len = r.get("acceptance_histogram_by_draft_length")
    if by_len is not None:
        cells = {}
        ok = isinstance(by_len, dict)
        for k, row in (by_len.items() if ok else ()):
            kk = int(k) if isinstance(k, str) and k.isdigit() else None
            rr = [json_count(x) for x in row] if isinstance(row, list) else None
            if kk is None or kk > K or rr is None or len(rr) != kk + 1 or any(x is None for x in rr):
                ok = False
                break
            cells[kk] = rr
        if not ok or sum(map(sum, cells.values())) != s or \
                sum(j * n for row in cells.values() for j, n in enumerate(row)) != a or \
                sum(k * sum(row) for k, row in cells.items()) != d:
            return None, ("acceptance_histogram_by_draft_length", "expected {\"d\": [d+1 counts]} for d <= k, "
                          f"summing to {s} steps, {a} accepted and {d} proposed")
        out["by_len"] = cells
    pa_, pd_ = r.get("per_step_accepted"), r.get("per_step_drafted")
    if pa_ is not None or pd_ is not None:
        for f, v in (("per_step_accepted", pa_), ("per_step_drafted", pd_)):
            if not isinstance(v, list) or len(v) != s or any(json_count(x, K) is None for x in v):
                return None, (f, f"expected {s} counts of 0..{K} (one per verify step)")
        bad = next((i for i, (x, y) in enumerate(zip(pa_, pd_)) if x > y), None)
        if bad is not None:
            return None, (f"per_step_accepted[{bad}]", f"{pa_[bad]} accepted of {pd_[bad]} proposed")
        if sum(pa_) != a or sum(pd_) != d or [pa_.count(j) for j in range(K + 1)] != h:
            return None, ("per_step_accepted", "the per-step arrays do not sum to the record's counts and histogram")
        out["pa"], out["pd"] = [int(x) for x in pa_], [int(x) for x in pd_]
    return out, None


def parse_responses(data: bytes, source: str, run_id: str) -> EngineBatch:
    """Every per-request record of one file (see the module docstring)."""
    b = EngineBatch()
    skipped = {"null": 0, "no_spec_decode": 0}
    K_run: Optional[int] = None
    full = True  # every step verified all k drafts (fixed-k speculation)
    detailed = False
    seen: set[str] = set()
    for ln, pre, obj in _objects(data, source, b, run_id):
        if not isinstance(obj, dict):
            b.reject(source, ln, pre.rstrip(".") or "$", f"expected a response object, got {type(obj).__name__}",
                     obj, run_id)
            continue
        poison = find_poison(obj)
        if poison is not None:
            b.reject(source, ln, pre + poison[0], poison[1], None, run_id)
            continue
        recs = list(_records(obj, pre))
        if not recs:
            skipped["no_spec_decode"] += 1
            continue
        usage = obj.get("usage") if isinstance(obj.get("usage"), dict) else {}
        for fld, suffix, r in recs:
            if r is None:
                skipped["null"] += 1
                continue
            c, bad = check_record(r, K_run)
            rid = obj.get("id")
            if bad is None and not (isinstance(rid, str) and rid):
                b.reject(source, ln, f"{pre}id", "no response id", None, run_id)
                continue
            if bad is not None:
                b.reject(source, ln, f"{fld}.{bad[0]}".rstrip("."), bad[1], r, run_id)
                continue
            rid = safe_text(rid + (suffix or ""))
            if rid in seen:
                b.reject(source, ln, f"{pre}id", f"request {rid!r} repeated: the first is kept", None, run_id)
                continue
            seen.add(rid)
            K_run = c["K"]
            full = full and c["drafted"] == c["steps"] * c["K"]
            row = {"run_id": run_id, "rid": rid, "spec_verify_ct": c["steps"], "spec_num_correct_drafts": c["accepted"],
                   "spec_num_proposed_drafts": c["drafted"], "spec_correct_drafts_histogram": c["hist"]}
            ct = json_count(usage.get("completion_tokens"), INT32_MAX) if len(recs) == 1 else None
            if ct is not None:
                row["completion_tokens"] = ct
            b.requests.append(row)
            if c["pa"] is not None:
                detailed = True
                for i, (x, y) in enumerate(zip(c["pa"], c["pd"])):
                    b.request_counts.append(request_count_row(run_id, rid, "step_accepted", x, i))
                    b.request_counts.append(request_count_row(run_id, rid, "step_drafted", y, i))
            for k, row_ in c["by_len"].items():
                b.request_counts.extend(request_count_row(run_id, rid, "accepted_hist_by_len", n, j, k)
                                        for j, n in enumerate(row_) if n)
    if b.requests:
        b.runs.append(run_row(run_id, "vllm", "static" if full else "compact", K_run, None, {
            "format": "vllm-per-request-metrics", "producer": SOURCE_VERSION, "file": source,
            "level": "detailed" if detailed else "summary", "not_stored": skipped}))
    return b
