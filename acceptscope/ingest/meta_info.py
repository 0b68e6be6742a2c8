"""Saved SGLang client responses -> ``requests`` (per-request spec_* summaries).

* native ``/generate``: ``{"text", "output_ids"?, "meta_info": {...}, "sampling_params"?}``
  or a list of them (batch); ``sampling_params`` is the request's, as a traffic driver logs it
  beside the response (SGLang does not echo it): its ``temperature`` is the only source of a
  request's temperature in SGLang telemetry; ``meta_info`` carries ``id`` (the rid), ``prompt_tokens``,
  ``completion_tokens``, ``finish_reason`` (``{"type": ...}``), ``e2e_latency``
  and, for finished speculative requests with ``spec_verify_ct > 0``, the
  ``spec_*`` keys of reference §6.1 (absent keys stay NULL).
* OpenAI-compatible (``return_spec_tokens_details``): ``sglext.spec_tokens_details``,
  one object, or a list for ``n > 1`` (rid = ``<id>:<i>``). SGLang fills absent
  values with 0 / []; a 0 ``spec_cap_length`` or ``spec_block_accept_length`` means
  "not reported" (a real one is >= 1) and is stored NULL.

A file holds one JSON document or JSON lines (each a response or a batch).
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator, Optional

import msgspec

from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.jsontext import defuse_deep
from acceptscope.ingest.rejects import MAX_DEPTH, decode_failure, describe_number, find_poison, make_reject

SPEC_KEYS = ("spec_verify_ct", "spec_accept_rate", "spec_accept_length", "spec_num_correct_drafts",
             "spec_num_proposed_drafts", "spec_cap_length", "spec_block_accept_length",
             "spec_correct_drafts_histogram", "spec_cap_lens_histogram")
_INTS = ("spec_verify_ct", "spec_num_correct_drafts", "spec_num_proposed_drafts")
_FLOATS = ("spec_accept_rate", "spec_accept_length", "spec_cap_length", "spec_block_accept_length")
_HISTS = ("spec_correct_drafts_histogram", "spec_cap_lens_histogram")


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def documents(data: bytes) -> Iterator[tuple[int, Any, bytes]]:
    """(line, parsed, raw) for a JSON document or JSON lines; parsed is an Exception on failure."""
    try:
        doc = msgspec.json.decode(data)
    except (msgspec.DecodeError, RecursionError):
        pass
    else:
        yield 1, doc, data
        return
    try:
        doc = json.loads(data)
    except RecursionError:  # one value nested too deeply: replace it, so only its response is rejected
        fixed, _ = defuse_deep(data, MAX_DEPTH)
        try:
            doc = json.loads(fixed) if fixed is not None else None
        except (ValueError, UnicodeDecodeError, RecursionError):
            doc = None
        if doc is not None:
            yield 1, doc, data
            return
    except (ValueError, UnicodeDecodeError):
        pass
    else:
        yield 1, doc, data
        return
    for i, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            yield i, json.loads(raw), raw
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            yield i, e, raw


def _check_spec(spec: dict, prefix: str, openai: bool) -> tuple[dict, Optional[tuple[str, str]]]:
    out: dict[str, Any] = {}
    for k in _INTS:
        v = spec.get(k)
        if v is None:
            out[k] = None
        elif not _int(v) or v < 0:
            return out, (prefix + k, f"expected a non-negative int, got {v!r}")
        else:
            out[k] = v
    for k in _FLOATS:
        v = spec.get(k)
        if v is None:
            out[k] = None
        elif not _num(v) or not math.isfinite(v) or v < 0:
            return out, (prefix + k, describe_number(v) if _num(v) else f"expected a number, got {v!r}")
        else:
            out[k] = float(v)
    if out["spec_accept_rate"] is not None and out["spec_accept_rate"] > 1.0:
        return out, (prefix + "spec_accept_rate", f"{out['spec_accept_rate']!r} > 1")
    nc, npd = out["spec_num_correct_drafts"], out["spec_num_proposed_drafts"]
    if nc is not None and npd is not None and nc > npd:
        return out, (prefix + "spec_num_correct_drafts", f"{nc} > spec_num_proposed_drafts {npd}")
    for k in _HISTS:
        v = spec.get(k)
        if v is None:
            out[k] = None
            continue
        if not isinstance(v, list):
            return out, (prefix + k, f"expected a list, got {v!r}")
        for j, x in enumerate(v):
            if not _int(x) or x < 0:
                return out, (f"{prefix}{k}[{j}]", f"expected a non-negative int, got {x!r}")
        out[k] = v
    if openai:
        for k in ("spec_cap_length", "spec_block_accept_length"):
            if out[k] == 0.0:
                out[k] = None
        for k in _HISTS:
            if out[k] == []:
                out[k] = None
        if out["spec_verify_ct"] == 0:
            out = {k: None for k in out}
    return out, None


def _finish(fr: Any) -> Optional[str]:
    if isinstance(fr, dict):
        t = fr.get("type")
        return t if isinstance(t, str) else None
    return fr if isinstance(fr, str) else None


def parse_responses(data: bytes, *, source: str, run_id: str, workload: Optional[str] = None) -> IngestBatch:
    batch = IngestBatch()
    seen: set[str] = set()

    def add(row: dict, line: int, field: str, raw: Any) -> None:
        if row["rid"] in seen:
            batch.reject(make_reject(source, line, field, f"duplicate request id {row['rid']!r}", raw, run_id))
            return
        seen.add(row["rid"])
        batch.add("requests", row)

    for line, doc, raw in documents(data):
        if isinstance(doc, Exception):
            batch.reject(make_reject(source, line, "$", decode_failure(doc), raw, run_id))
            continue
        items = doc if isinstance(doc, list) else [doc]
        for i, item in enumerate(items):
            pfx = f"[{i}]." if isinstance(doc, list) else ""
            poison = find_poison(item)  # a value no column can hold rejects its response alone
            if poison is not None:
                batch.reject(make_reject(source, line, pfx + poison[0] if poison[0] != "$" else pfx.rstrip(".") or "$",
                                         poison[1], None, run_id))
                continue
            if not isinstance(item, dict):
                batch.reject(make_reject(source, line, pfx.rstrip(".") or "$",
                                         f"expected an object, got {type(item).__name__}", item, run_id))
                continue
            if "meta_info" in item:
                _native(item, pfx, line, source, run_id, workload, batch, add)
            elif "choices" in item or "sglext" in item:
                _openai(item, pfx, line, source, run_id, workload, batch, add)
            else:
                batch.reject(make_reject(source, line, pfx.rstrip(".") or "$",
                                         "neither a native /generate response (meta_info) nor an OpenAI response",
                                         item, run_id))
    return batch


def _native(item, pfx, line, source, run_id, workload, batch, add) -> None:
    mi = item["meta_info"]
    if not isinstance(mi, dict):
        batch.reject(make_reject(source, line, pfx + "meta_info", "expected an object", item, run_id))
        return
    rid = mi.get("id")
    if not isinstance(rid, str) or not rid:
        batch.reject(make_reject(source, line, pfx + "meta_info.id", f"expected a request id, got {rid!r}", mi, run_id))
        return
    spec, prob = _check_spec(mi, pfx + "meta_info.", openai=False)
    for k in ("prompt_tokens", "completion_tokens"):
        v = mi.get(k)
        if prob is None and v is not None and (not _int(v) or v < 0):
            prob = (pfx + "meta_info." + k, f"expected a non-negative int, got {v!r}")
    lat = mi.get("e2e_latency")
    if prob is None and lat is not None and (not _num(lat) or not math.isfinite(lat) or lat < 0):
        prob = (pfx + "meta_info.e2e_latency", describe_number(lat) if _num(lat) else repr(lat))
    out_ids = item.get("output_ids")
    if prob is None and out_ids is not None and (not isinstance(out_ids, list) or not all(_int(x) for x in out_ids)):
        prob = (pfx + "output_ids", "expected a list of token ids")
    temp = None
    sp = item.get("sampling_params")
    if prob is None and sp is not None:
        temp = sp.get("temperature") if isinstance(sp, dict) else None
        if not isinstance(sp, dict):
            prob = (pfx + "sampling_params", f"expected an object, got {type(sp).__name__}")
        elif temp is not None and (not _num(temp) or not math.isfinite(temp) or temp < 0):
            prob = (pfx + "sampling_params.temperature",
                    describe_number(temp) if _num(temp) else f"expected a number >= 0, got {temp!r}")
    if prob:
        batch.reject(make_reject(source, line, prob[0], prob[1], mi, run_id))
        return
    add({
        "run_id": run_id, "rid": rid, "workload": workload, "prompt_tokens": mi.get("prompt_tokens"),
        "temperature": float(temp) if temp is not None else None,
        "completion_tokens": mi.get("completion_tokens"), "finish_reason": _finish(mi.get("finish_reason")),
        "output_tokens": out_ids, "latency_s": float(lat) if lat is not None else None, **spec,
    }, line, pfx + "meta_info.id", mi)


def _openai(item, pfx, line, source, run_id, workload, batch, add) -> None:
    rid = item.get("id")
    if not isinstance(rid, str) or not rid:
        batch.reject(make_reject(source, line, pfx + "id", f"expected a response id, got {rid!r}", item, run_id))
        return
    ext = item.get("sglext") or {}
    details = ext.get("spec_tokens_details") if isinstance(ext, dict) else None
    choices = item.get("choices") if isinstance(item.get("choices"), list) else []
    usage = item.get("usage") if isinstance(item.get("usage"), dict) else {}
    if details is None:
        batch.reject(make_reject(source, line, pfx + "sglext.spec_tokens_details",
                                 "missing (request with return_spec_tokens_details=true)", _clip(item), run_id))
        return
    many = isinstance(details, list)
    for k, d in enumerate(details if many else [details]):
        f = pfx + "sglext.spec_tokens_details" + (f"[{k}]" if many else "")
        if not isinstance(d, dict):
            batch.reject(make_reject(source, line, f, "expected an object", d, run_id))
            continue
        spec, prob = _check_spec(d, f + ".", openai=True)
        if prob:
            batch.reject(make_reject(source, line, prob[0], prob[1], d, run_id))
            continue
        ch = choices[k] if k < len(choices) and isinstance(choices[k], dict) else {}
        add({
            "run_id": run_id, "rid": f"{rid}:{k}" if many else rid, "workload": workload,
            "prompt_tokens": usage.get("prompt_tokens") if _int(usage.get("prompt_tokens")) else None,
            "completion_tokens": (usage.get("completion_tokens")
                                  if not many and _int(usage.get("completion_tokens")) else None),
            "finish_reason": ch.get("finish_reason") if isinstance(ch.get("finish_reason"), str) else None,
            **spec,
        }, line, f, d)


def _clip(item: dict) -> dict:
    return {k: v for k, v in item.items() if k != "choices"}


def ingest_responses(path: Path, *, run_id: str) -> IngestBatch:
    return parse_responses(Path(path).read_bytes(), source=str(path), run_id=run_id)
