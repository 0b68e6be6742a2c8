"""TensorRT-LLM's DSpark ragged-verify counters (``DSparkRaggedStats.summary()``), as JSON or as the server log.

Format source: ``tensorrt_llm/_torch/speculative/dspark_observability.py`` of NVIDIA/TensorRT-LLM at commit
313662604a532c9038e9580a063fcc9b1a2ad155 (``DSparkRaggedStats``; the earlier 0f94c044ff1e37ec4e1e31ea56421ae6bc44d6fe
lacks the ``requests_cap_trimmed`` / ``cap_trim_max`` / ``cap_trim_hist`` / ``cap_trim_concentration`` keys,
read when present). ``summary()`` is "a JSON-safe snapshot, for logging or assertions"; ``log_summary`` writes
it through TensorRT-LLM's logger as ``DSpark ragged verify: {...}`` (a Python dict literal, read here with
``ast.literal_eval``). The DSpark worker makes one per rank (``dspark.py``); its counters are cumulative:

* steps: ``steps_total`` = ``steps_ragged`` + ``steps_uniform_windows`` + ``steps_no_windows``, ``steps_multi_request``;
* tokens *submitted to the target* (bonus included): ``ceiling_tokens`` (rows x (1 + K): no trim),
  ``window_tokens`` (what the windows asked for), ``delivered_tokens`` (after rounding up to a captured bucket);
  ``trim_ratio`` = 1 - delivered / ceiling: the compute the schedule saved, not acceptance lost;
* acceptance per scored request-step: ``requests_scored``, ``requests_trimmed`` (window < K), ``accept_len``
  (mean accepted drafts, bonus excluded), ``trim_regret_rate`` = trimmed request-steps that accepted their whole
  window / trimmed request-steps (the count, ``trimmed_hit_ceiling``, is not in the summary);
  ``cap_trim_tokens`` (accepted positions the window discarded: measured under ``cap-accept`` only, 0 = "not
  measured" elsewhere), ``accept_loss_per_request`` = cap_trim_tokens / requests_scored;
* histograms ``verify_len_hist`` (windows handed out), ``bucket_hist``, ``padded_bs_hist``, ``cap_trim_hist``;
  graph replay counts; ``fallbacks`` / ``graph_miss_*`` / ``planner`` reason maps (kept in ``config_json``).

The four ratios are written rounded to 4 decimals, so each is stored as the integer ``round(x * 1e4)``
(``dspark_<name>_e4``: exactly what was written); a count they hide (the regret count, accepted drafts) is
identified as the interval of integers that round to the written value (:func:`rate_preimage`). The draft
length K is not in the summary: a ``max_draft_len`` key beside it, else the largest tier of the worker's
``DSpark verify planner: tiers=[...]`` log line, else the largest window handed out (a lower bound; the run's
``config_json`` says which). Rank: a ``rank`` key, the logger's ``[MPI_Rank n]`` prefix (``tensorrt_llm/logger.py``
@ 027cd518e3b63809a5c5799187991e7f1164fb12; INFO lines need ``TLLM_LOG_LEVEL=info``), or ``rank<n>`` in the
file name.

Rows: one ``engine_counts`` cell per count (``dspark_<field>``; histograms by ``position`` = the key), each
snapshot under its own ``source`` (``file:line``), so cumulative snapshots stay apart and the latest one per
rank is read (:mod:`~acceptscope.ingest.engines.identify`). A snapshot that breaks an identity of the format
(the step split, ``distinct_verify_lens``, a ratio no count rounds to, a histogram that is not counts) is
rejected alone with its line and field; every other snapshot is kept.
"""

from __future__ import annotations

import ast
import json
import re
from typing import Any, Optional

from acceptscope.ingest.engines.records import EngineBatch, count_row, json_count, run_row
from acceptscope.ingest.rejects import INT32_MAX, decode_failure, find_poison

SOURCE_VERSION = ("NVIDIA/TensorRT-LLM@313662604a532c9038e9580a063fcc9b1a2ad155 "
                  "tensorrt_llm/_torch/speculative/dspark_observability.py (DSparkRaggedStats.summary)")
LOG_MARK = "DSpark ragged verify: {"
MODES = ("static", "cap-accept", "compact")
COUNTS = ("steps_total", "steps_ragged", "steps_multi_request", "steps_uniform_windows", "steps_no_windows",
          "ceiling_tokens", "window_tokens", "delivered_tokens", "distinct_verify_lens", "requests_scored",
          "requests_trimmed", "cap_trim_tokens")
OPTIONAL_COUNTS = ("requests_cap_trimmed", "cap_trim_max", "graph_replays", "graph_eager")
HISTS = ("verify_len_hist", "bucket_hist", "padded_bs_hist", "cap_trim_hist")
RATES = ("trim_ratio", "accept_len", "trim_regret_rate", "accept_loss_per_request", "cap_trim_concentration")
REASON_MAPS = ("fallbacks", "graph_miss_reasons", "graph_miss_keys", "planner")
MAX_DRAFT_LEN = 1024
LOWER_BOUND = "largest window handed out (a lower bound)"
_RANK_LOG = re.compile(r"\[(?:MPI_Rank|RANK) (\d+)\]")  # tensorrt_llm/logger.py @027cd518: "[TRT-LLM] [MPI_Rank r] [I] "
_TIERS = re.compile(r"DSpark verify planner: tiers=[\[(]([0-9, ]*)[\])]")
_RANK_FILE = re.compile(r"rank(\d+)")


def rate_preimage(written: float, n: int, top: int) -> Optional[tuple[int, int]]:
    """The integers h in [0, top] with ``round(h / n, 4) == written`` (how the producer wrote the ratio), as
    (lo, hi), or None when no count gives the written value. ``n == 0``: the producer writes 0.0."""
    if n <= 0:
        return (0, 0) if written == 0 else None
    r = lambda h: round(h / n, 4)  # noqa: E731 - the producer's own rounding, applied to a candidate count
    lo, hi = 0, top
    while lo < hi:  # smallest h with r(h) >= written (r is non-decreasing in h)
        m = (lo + hi) // 2
        lo, hi = (m + 1, hi) if r(m) < written else (lo, m)
    first = lo
    lo, hi = first, top
    while lo < hi:  # largest h with r(h) <= written
        m = (lo + hi + 1) // 2
        lo, hi = (m, hi) if r(m) <= written else (lo, m - 1)
    return (first, lo) if first <= top and r(first) == written else None


def _hist(v: Any) -> Optional[dict[int, int]]:
    if not isinstance(v, dict):
        return None
    out = {}
    for k, n in v.items():
        kk = k if isinstance(k, int) and not isinstance(k, bool) else int(k) if isinstance(k, str) and k.isdigit() else None
        nn = json_count(n)
        if kk is None or kk < 0 or kk > INT32_MAX or nn is None:
            return None
        out[kk] = nn
    return out


def _rate(v: Any) -> Optional[int]:
    """A 4-decimal ratio as the integer it was written as (x * 1e4), or None. (``trim_ratio`` went negative
    before 313662604a rebased the ceiling on padded rows, so negatives are read as written.)"""
    if isinstance(v, bool) or not isinstance(v, (int, float)) or not -1e6 <= v <= 1e6:
        return None
    e4 = round(v * 10_000)
    return e4 if abs(e4 / 10_000 - v) < 1e-9 else None


def check_snapshot(s: Any, K: int) -> tuple[Optional[dict], Optional[tuple[str, str]]]:
    """The snapshot's counts ({field: int | {key: int}}), or (field, reason) of the first identity it breaks."""
    if not isinstance(s, dict):
        return None, ("$", f"expected an object, got {type(s).__name__}")
    if s.get("mode") not in MODES:
        return None, ("mode", f"{s.get('mode')!r} is not one of {list(MODES)}")
    c: dict = {}
    for f in COUNTS + OPTIONAL_COUNTS:
        if f in s or f in COUNTS:
            v = json_count(s.get(f))
            if v is None:
                return None, (f, f"not a count: {s.get(f)!r}")
            c[f] = v
    for f in HISTS:
        if f in s:
            h = _hist(s[f])
            if h is None:
                return None, (f, "expected {key: count} with keys and counts >= 0")
            c[f] = h
    for f in RATES:
        if f in s:
            e4 = _rate(s[f])
            if e4 is None:
                return None, (f, f"not a ratio written to 4 decimals: {s[f]!r}")
            c[f + "_e4"] = e4
    if c["steps_ragged"] + c["steps_uniform_windows"] + c["steps_no_windows"] != c["steps_total"]:
        return None, ("steps_total", "is not steps_ragged + steps_uniform_windows + steps_no_windows")
    if c.get("verify_len_hist") and max(c["verify_len_hist"]) > K:
        return None, ("verify_len_hist", f"a window of {max(c['verify_len_hist'])} drafts, over K = {K}")
    if "verify_len_hist" in c and c["distinct_verify_lens"] != len(c["verify_len_hist"]):
        return None, ("distinct_verify_lens", f"{c['distinct_verify_lens']} != {len(c['verify_len_hist'])} windows in verify_len_hist")
    if c["requests_trimmed"] > c["requests_scored"] or c["steps_multi_request"] > c["steps_total"]:
        return None, ("requests_trimmed" if c["requests_trimmed"] > c["requests_scored"] else "steps_multi_request",
                      "more than its total (requests_scored / steps_total)")
    N, T = c["requests_scored"], c["requests_trimmed"]
    checks = (("trim_ratio", None if not c["ceiling_tokens"] else round(1.0 - c["delivered_tokens"] / c["ceiling_tokens"], 4),
               c["ceiling_tokens"] == 0),
              ("accept_loss_per_request", None if not N else round(c["cap_trim_tokens"] / N, 4), N == 0))
    for f, want, zero in checks:
        if f + "_e4" in c and (c[f + "_e4"] != 0 if zero else c[f + "_e4"] != round(want * 10_000)):
            return None, (f, f"{s[f]!r} is not what the counts give ({0.0 if zero else want!r})")
    if "trim_regret_rate_e4" in c and rate_preimage(s["trim_regret_rate"], T, T) is None:
        return None, ("trim_regret_rate", f"{s['trim_regret_rate']!r}: no count of {T} trimmed request-steps rounds to it")
    if "accept_len_e4" in c and rate_preimage(s["accept_len"], N, N * K) is None:
        return None, ("accept_len", f"{s['accept_len']!r}: no count of accepted drafts over {N} request-steps "
                      f"(at most {K} each) rounds to it")
    ct = c.get("cap_trim_hist")
    if ct is not None and "requests_cap_trimmed" in c and (
            sum(ct.values()) != c["requests_cap_trimmed"] or sum(k * n for k, n in ct.items()) != c["cap_trim_tokens"]):
        return None, ("cap_trim_hist", "does not sum to requests_cap_trimmed and cap_trim_tokens")
    return c, None


def _snapshots(data: bytes, source: str, b: EngineBatch, run_id: str):
    """(line, rank or None, K hint or None, snapshot) of a JSON document / JSONL / server log."""
    text = data.decode("utf-8", errors="replace")
    try:
        doc = json.loads(text)
    except (ValueError, RecursionError):
        doc = None
    if isinstance(doc, (dict, list)):
        for o in (doc if isinstance(doc, list) else [doc]):
            yield 1, None, None, o
        return
    tiers_k: Optional[int] = None
    for ln, line in enumerate(text.splitlines(), 1):
        tiers = _TIERS.search(line)
        if tiers:
            ks = [int(x) for x in tiers.group(1).replace(" ", "").split(",") if x]
            tiers_k = max(ks) if ks else tiers_k
            continue
        if LOG_MARK in line:
            rk = _RANK_LOG.search(line[: line.index(LOG_MARK)])
            body = line[line.index(LOG_MARK) + len(LOG_MARK) - 1:]
            try:
                obj = ast.literal_eval(body.strip())
            except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
                b.reject(source, ln, "$", f"not a summary dict literal ({type(e).__name__})", body[:200], run_id)
                continue
            yield ln, int(rk.group(1)) if rk else None, tiers_k, obj
        elif line.lstrip().startswith("{"):
            try:
                yield ln, None, None, json.loads(line)
            except (ValueError, RecursionError) as e:
                b.reject(source, ln, "$", f"not JSON: {decode_failure(e)}", line[:200], run_id)


def parse_stats(data: bytes, source: str, run_id: str) -> EngineBatch:
    """Every snapshot of one file (see the module docstring)."""
    b = EngineBatch()
    fr = _RANK_FILE.search(source.rsplit("/", 1)[-1])
    mode: Optional[str] = None
    K_run: Optional[int] = None
    k_from = None
    reasons: dict = {}
    for ln, rank_log, tiers_k, s in _snapshots(data, source, b, run_id):
        poison = find_poison(s) if isinstance(s, (dict, list)) else None
        if poison is not None:
            b.reject(source, ln, poison[0], poison[1], None, run_id)
            continue
        if isinstance(s, dict):
            k_key = json_count(s.get("max_draft_len"), MAX_DRAFT_LEN) if "max_draft_len" in s else None
            vl = _hist(s.get("verify_len_hist")) or {}
            K, how = ((k_key, "max_draft_len") if k_key else (tiers_k, "planner tiers") if tiers_k else
                      (max(vl), LOWER_BOUND) if vl else (None, None))
        else:
            K, how = None, None
        if isinstance(s, dict) and not K:
            b.reject(source, ln, "max_draft_len", "the draft length is unknown: no max_draft_len key, planner tiers "
                     "line or window in verify_len_hist", None, run_id)
            continue
        bound = how == LOWER_BOUND  # K only bounded below: checked against the largest K there can be
        c, bad = check_snapshot(s, MAX_DRAFT_LEN if bound else K)
        if bad is None and mode is not None and s["mode"] != mode:
            bad = ("mode", f"{s['mode']!r}, but this file's earlier snapshots ran {mode!r}")
        if bad is None and not bound and K_run is not None and k_from != LOWER_BOUND and K != K_run:
            bad = ("max_draft_len", f"K = {K}, but this file's earlier snapshots have K = {K_run}")
        if bad is not None:
            b.reject(source, ln, bad[0], bad[1], s, run_id)
            continue
        rank = json_count(s.get("rank"), INT32_MAX) if "rank" in s else None
        rank = rank if rank is not None else rank_log if rank_log is not None else int(fr.group(1)) if fr else 0
        if bound and k_from not in (None, LOWER_BOUND):
            K = K_run  # a snapshot that names K set it for the file
        else:
            K, k_from = (max(K, K_run or 0), how) if bound else (K, how)
        mode, K_run = s["mode"], K
        reasons[str(rank)] = {f: s[f] for f in REASON_MAPS if isinstance(s.get(f), dict)}
        src = f"{source}:{ln}"
        for f, v in c.items():
            if isinstance(v, dict):
                b.counts.extend(count_row(run_id, src, rank, f"dspark_{f}", n, k) for k, n in sorted(v.items()))
            else:
                b.counts.append(count_row(run_id, src, rank, f"dspark_{f}", v))
        b.counts.append(count_row(run_id, src, rank, "dspark_max_draft_len", K))
    if mode is not None:
        b.runs.append(run_row(run_id, "tensorrt-llm", mode, K_run, None, {
            "format": "trtllm-dspark-ragged-stats", "producer": SOURCE_VERSION, "file": source,
            "gamma": f"K from {k_from}", "reasons_latest": reasons}))
    return b
