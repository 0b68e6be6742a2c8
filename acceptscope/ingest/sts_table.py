"""SGLang STS calibration JSON (``--speculative-dspark-confidence-sts-path``) -> ``sts_tables``.

Format (reference §3.3, ``DSparkStsCalibration``, omit_defaults): ``temperatures``
(required, all > 0), ``dataset`` (""), ``num_samples`` (0), ``ece_before`` /
``ece_after`` ([]). Extra keys are ignored, as SGLang's decoder ignores them.
Stored long (one row per position) under ``table_hash = sha256(file text)``.
A table SGLang itself would refuse (no temperatures, T <= 0, non-finite) is
rejected whole; a malformed ECE list is rejected as that field (stored NULL)
while the temperatures are kept.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Optional

from acceptscope.domain.sts import sts_problem
from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.jsontext import decode_document
from acceptscope.ingest.rejects import describe_number, make_reject


def _num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def parse_sts_table(text: bytes, *, source: str, gamma: Optional[int] = None,
                    run_id: Optional[str] = None) -> IngestBatch:
    batch = IngestBatch()
    rej = lambda f, why, raw=None: batch.reject(make_reject(source, 1, f, why, raw, run_id))  # noqa: E731
    try:
        obj = decode_document(text)
    except (ValueError, UnicodeDecodeError) as e:
        batch.reject(make_reject(source, 0, "$", f"malformed or truncated JSON: {e}", text, run_id))
        return batch
    if not isinstance(obj, dict):
        rej("$", f"expected an object, got {type(obj).__name__}")
        return batch
    temps = obj.get("temperatures")
    problem = sts_problem(temps, gamma)  # what SGLang itself refuses: the whole table goes
    if problem:
        rej(*problem)
        return batch
    dataset = obj.get("dataset", "")
    if not isinstance(dataset, str):
        rej("dataset", f"expected a string, got {dataset!r}")
        dataset = None
    ns = obj.get("num_samples", 0)
    if not (isinstance(ns, int) and not isinstance(ns, bool)) or ns < 0:
        rej("num_samples", f"expected a non-negative int, got {ns!r}")
        ns = None
    eces = {}
    for name in ("ece_before", "ece_after"):
        v = obj.get(name, [])
        eces[name] = None
        if not isinstance(v, list):
            rej(name, f"expected a list, got {v!r}")
        elif v and len(v) != len(temps):
            rej(name, f"length {len(v)} != len(temperatures) {len(temps)}")
        elif v:
            badk = next((k for k, x in enumerate(v) if not _num(x) or not (0.0 <= x <= 1.0)), None)
            if badk is not None:
                x = v[badk]
                rej(f"{name}[{badk}]", (describe_number(x) if _num(x) else repr(x)) + " (ECE must be in [0, 1])")
            else:
                eces[name] = v
    h = hashlib.sha256(text).hexdigest()
    for k, t in enumerate(temps):
        batch.add("sts_tables", {
            "table_hash": h, "position": k, "temperature": float(t),
            "ece_before": float(eces["ece_before"][k]) if eces["ece_before"] else None,
            "ece_after": float(eces["ece_after"][k]) if eces["ece_after"] else None,
            "dataset": dataset, "num_samples": ns, "source_path": source,
        })
    return batch


def ingest_sts_table(path: Path, *, gamma: Optional[int] = None, run_id: Optional[str] = None) -> IngestBatch:
    return parse_sts_table(Path(path).read_bytes(), source=str(path), gamma=gamma, run_id=run_id)
