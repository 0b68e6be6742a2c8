"""SGLang SPS cost tables (both formats) -> ``sps_tables`` (long form).

* 1-D diagonal ``SpsCostTable``: ``sample_batch_tokens`` (strictly increasing
  ints >= 1), ``sample_steps_per_sec``, ``max_batch_tokens`` (>= last probe).
  Rows: component ``steps_per_sec`` at probe = batch tokens, ``max_batch_tokens``
  at probe -1.
* additive ``SpsAdditiveCostTable``: ``bias_seconds`` (> 0, probe -1),
  ``alpha_seconds`` at ``bs_probes``, ``theta_seconds`` at ``m_probes`` (N+M).

The format is chosen exactly as SGLang's ``load_sps_table_from_path`` does: the
additive one iff the file text contains the substring ``"bias_seconds"``
(anywhere, even in a nested key). The invariants SGLang's ``__post_init__``
enforces are checked by ``acceptscope.domain.sps.sps_problem``; a table SGLang would refuse is rejected whole (its rows
would describe nothing the server can load). Probes must be JSON ints.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Optional

from acceptscope.domain.sps import sps_kind, sps_problem
from acceptscope.ingest.batch import IngestBatch
from acceptscope.ingest.jsontext import decode_document
from acceptscope.ingest.rejects import make_reject


def parse_sps_table(text: bytes, *, source: str, run_id: Optional[str] = None) -> IngestBatch:
    batch = IngestBatch()
    try:
        obj = decode_document(text)
    except (ValueError, UnicodeDecodeError) as e:
        batch.reject(make_reject(source, 0, "$", f"malformed or truncated JSON: {e}", text, run_id))
        return batch
    kind = sps_kind(text)
    h = hashlib.sha256(text).hexdigest()

    def fail(prob: tuple[str, str]) -> IngestBatch:
        batch.reject(make_reject(source, 1, prob[0], f"{kind} SPS table: {prob[1]}", None, run_id))
        return batch

    err = sps_problem(obj, kind)  # the one validator (acceptscope.domain.sps)
    if err:
        return fail(err)
    rows: list[tuple[str, int, float]] = []
    if kind == "diagonal":
        rows += [("steps_per_sec", p, float(v)) for p, v in zip(obj["sample_batch_tokens"], obj["sample_steps_per_sec"])]
        rows.append(("max_batch_tokens", -1, float(obj["max_batch_tokens"])))
    else:
        for probes_name, values_name in (("bs_probes", "alpha_seconds"), ("m_probes", "theta_seconds")):
            rows += [(values_name, p, float(v)) for p, v in zip(obj[probes_name], obj[values_name])]
        rows.append(("bias_seconds", -1, float(obj["bias_seconds"])))
    for comp, probe, value in rows:
        batch.add("sps_tables", {"table_hash": h, "kind": kind, "component": comp, "probe": probe,
                                 "value": value, "source_path": source})
    return batch


def ingest_sps_table(path: Path, *, run_id: Optional[str] = None) -> IngestBatch:
    return parse_sps_table(Path(path).read_bytes(), source=str(path), run_id=run_id)
