"""SGLang SPS profiler outputs -> ``sps_profile_records`` / ``sps_profile_rounds`` / ``sps_profile_manifests``.

Written by ``benchmark/dspark_sps_profiler.py`` (reference §4.2):

* ``<stem>.records.jsonl``: one line per (step, rank): ``repeat, batch_size,
  batch_size_per_rank, dp_rank, forward_ct, num_running_reqs, num_verify_tokens,
  step_time`` (seconds). The profiler does not write the cell's ``frac`` on
  these lines, so ``frac`` is stored NULL (rounds carry it).
* ``<stem>.rounds.jsonl``: one line per cell; ``frac`` null (diagonal) is stored
  as -1 because it is part of the natural key.
* ``<out>.manifest.json``: stored whole as ``body_json`` plus a few columns.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Optional

import msgspec

from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.jsontext import decode_document
from acceptscope.ingest.rejects import decode_failure, describe_number, find_poison, make_reject

_dec = msgspec.json.Decoder()


def _int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _lines(data: bytes, source: str, run_id: str, batch: IngestBatch):
    for i, raw in enumerate(data.split(b"\n"), start=1):
        if not raw.strip():
            continue
        try:
            try:
                o = _dec.decode(raw)
            except msgspec.DecodeError:
                o = json.loads(raw)
        except (ValueError, UnicodeDecodeError, RecursionError) as e:
            batch.reject(make_reject(source, i, "$", decode_failure(e).replace("JSON", "JSON line", 1), raw, run_id))
            continue
        poison = find_poison(o)  # a value no column can hold rejects its line alone
        if poison is not None:
            batch.reject(make_reject(source, i, *poison, raw, run_id))
            continue
        if not isinstance(o, dict):
            batch.reject(make_reject(source, i, "$", f"expected an object, got {type(o).__name__}", raw, run_id))
            continue
        yield i, o, raw


def _need_int(o: dict, name: str, minimum: int = 0) -> Optional[str]:
    v = o.get(name)
    if not _int(v):
        return f"expected an int, got {v!r}"
    if v < minimum:
        return f"{v} < {minimum}"
    return None


def _need_pos(o: dict, name: str) -> Optional[str]:
    v = o.get(name)
    if not _num(v) or not math.isfinite(v):
        return describe_number(v) if _num(v) else f"expected a number, got {v!r}"
    if v <= 0:
        return f"{v!r} must be > 0"
    return None


def _first_bad_int(o: dict, fields: tuple[tuple[str, int], ...]) -> Optional[tuple[str, str]]:
    """(field, reason) of the first field that is not an int >= its minimum, else None."""
    for name, mn in fields:
        why = _need_int(o, name, mn)
        if why:
            return name, why
    return None


def parse_profile_records(data: bytes, *, source: str, run_id: str) -> IngestBatch:
    batch = IngestBatch()
    seen = set()
    for line, o, raw in _lines(data, source, run_id, batch):
        prob = _first_bad_int(o, (("repeat", 0), ("batch_size", 1), ("batch_size_per_rank", 1), ("dp_rank", 0),
                                  ("forward_ct", 0), ("num_running_reqs", 0), ("num_verify_tokens", 0)))
        if prob is None:
            why = _need_pos(o, "step_time")
            if why:
                prob = ("step_time", why)
        key = (o.get("repeat"), o.get("batch_size"), o.get("dp_rank"), o.get("forward_ct"))
        if prob is None and key in seen:
            prob = ("forward_ct", f"duplicate record for (repeat, batch_size, dp_rank, forward_ct) = {key}")
        if prob:
            batch.reject(make_reject(source, line, prob[0], prob[1], raw, run_id))
            continue
        seen.add(key)
        batch.add("sps_profile_records", {
            "run_id": run_id, "repeat": o["repeat"], "batch_size": o["batch_size"],
            "batch_size_per_rank": o["batch_size_per_rank"], "frac": None, "dp_rank": o["dp_rank"],
            "forward_ct": o["forward_ct"], "num_running_reqs": o["num_running_reqs"],
            "num_verify_tokens": o["num_verify_tokens"], "step_time_s": float(o["step_time"]),
        })
    return batch


def parse_profile_rounds(data: bytes, *, source: str, run_id: str) -> IngestBatch:
    batch = IngestBatch()
    seen = set()
    for line, o, raw in _lines(data, source, run_id, batch):
        prob = _first_bad_int(o, (("repeat", 0), ("batch_size", 1), ("batch_size_per_rank", 1), ("batch_tokens", 1),
                                  ("num_steady_steps", 0)))
        frac = o.get("frac")
        if prob is None and frac is not None and (not _num(frac) or not (0.0 <= frac <= 1.0)):
            prob = ("frac", f"expected null or a number in [0, 1], got {frac!r}")
        if prob is None:
            why = _need_pos(o, "steps_per_sec")
            if why:
                prob = ("steps_per_sec", why)
        mf = o.get("match_fraction")
        if prob is None and (not _num(mf) or not (0.0 <= mf <= 1.0)):
            prob = ("match_fraction", f"expected a number in [0, 1], got {mf!r}")
        med = o.get("per_rank_median_step_time")
        if prob is None:
            if not isinstance(med, list):
                prob = ("per_rank_median_step_time", f"expected a list, got {med!r}")
            else:
                for k, v in enumerate(med):
                    if not _num(v) or not math.isfinite(v) or v <= 0:
                        prob = (f"per_rank_median_step_time[{k}]", describe_number(v) if _num(v) else repr(v))
                        break
        key = (o.get("repeat"), o.get("batch_size"), -1.0 if frac is None else frac)
        if prob is None and key in seen:
            prob = ("frac", f"duplicate round for (repeat, batch_size, frac) = {key}")
        if prob:
            batch.reject(make_reject(source, line, prob[0], prob[1], raw, run_id))
            continue
        seen.add(key)
        batch.add("sps_profile_rounds", {
            "run_id": run_id, "repeat": o["repeat"], "batch_size": o["batch_size"],
            "batch_size_per_rank": o["batch_size_per_rank"], "frac": -1.0 if frac is None else float(frac),
            "batch_tokens": o["batch_tokens"], "steps_per_sec": float(o["steps_per_sec"]),
            "num_steady_steps": o["num_steady_steps"], "match_fraction": float(mf),
            "per_rank_median_step_time": [float(v) for v in med],
            "load_info_json": json.dumps(o.get("load_info"), sort_keys=True) if o.get("load_info") is not None else None,
        })
    return batch


def parse_profile_manifest(data: bytes, *, source: str, run_id: str) -> IngestBatch:
    batch = IngestBatch()
    try:
        o = decode_document(data)
    except (ValueError, UnicodeDecodeError) as e:
        batch.reject(make_reject(source, 0, "$", f"malformed or truncated JSON: {e}", data, run_id))
        return batch
    if not isinstance(o, dict):
        batch.reject(make_reject(source, 1, "$", f"expected an object, got {type(o).__name__}", data, run_id))
        return batch
    vals = {}
    for name in ("verify_num_draft_tokens", "tp_size", "dp_size"):
        v = o.get(name)
        if v is not None and (not _int(v) or v < 1):
            batch.reject(make_reject(source, 1, name, f"expected a positive int, got {v!r}", None, run_id))
            v = None
        vals[name] = v
    batch.add("sps_profile_manifests", {
        "run_id": run_id, "source_path": source, **vals,
        "body_json": json.dumps(o, sort_keys=True),
    })
    return batch


def ingest_profile_file(path: Path, kind: str, *, run_id: str) -> IngestBatch:
    data = Path(path).read_bytes()
    fn = {"sps_profile_records": parse_profile_records, "sps_profile_rounds": parse_profile_rounds,
          "sps_profile_manifest": parse_profile_manifest}[kind]
    return fn(data, source=str(path), run_id=run_id)
