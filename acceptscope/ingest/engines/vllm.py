"""vLLM's spec-decode counters, from a Prometheus text exposition (a ``curl /metrics`` dump).

Format source: ``vllm/v1/spec_decode/metrics.py`` of vllm-project/vllm at commit
016a8587edb04ae53c913a1da9355a07dc0ca4ae (``SpecDecodingProm``; the family is unchanged since PR #16665
added ``num_drafts`` and the per-position counter, and PR #24049 the ``engine`` label). Four
``prometheus_client.Counter`` s, labelled ``model_name`` and ``engine`` (the data-parallel engine index),
exposed with the ``_total`` suffix:

* ``vllm:spec_decode_num_drafts_total``: (request, step) pairs that carried a draft;
* ``vllm:spec_decode_num_draft_tokens_total``: draft tokens proposed (and verified: vLLM verifies every one);
* ``vllm:spec_decode_num_accepted_tokens_total``: accepted draft tokens (the bonus token is not counted);
* ``vllm:spec_decode_num_accepted_tokens_per_pos_total{position}``: drafts whose token at 0-based
  ``position`` was accepted (``SpecDecodingStats.observe_draft`` adds 1 to positions ``0..accepted-1``).

Each sample line is read alone: a line that does not parse, a value that is not a finite non-negative
integer, a position that is not a small integer or a sample seen twice is rejected with its line, and
every other sample is kept. ``_created`` samples (the counter's creation time) are not counts and are
skipped. One run per ``model_name`` (the run id gets ``:<model>`` when a dump holds several); DP engines
are kept apart in ``engine_counts.rank``.

The run's ``gamma`` is the number of positions; its ``arm`` is ``static`` when every draft was verified in
full (``num_draft_tokens == num_drafts * gamma``, fixed-k speculation), else ``compact`` (the windows
varied, e.g. adaptive DSpark verification; the counters do not say how).
"""

from __future__ import annotations

import math
import re

from acceptscope.ingest.engines.records import EngineBatch, count_row, run_row
from acceptscope.ingest.rejects import INT64_MAX, safe_text

SOURCE_VERSION = "vllm-project/vllm@016a8587edb04ae53c913a1da9355a07dc0ca4ae vllm/v1/spec_decode/metrics.py"
PREFIX = "vllm:spec_decode_"
METRICS = {  # exposed sample name -> engine_counts.metric
    "vllm:spec_decode_num_drafts_total": "num_drafts",
    "vllm:spec_decode_num_draft_tokens_total": "num_draft_tokens",
    "vllm:spec_decode_num_accepted_tokens_total": "num_accepted_tokens",
    "vllm:spec_decode_num_accepted_tokens_per_pos_total": "accepted_per_pos",
}
MAX_POSITIONS = 1024
_NAME = re.compile(r"^\s*([A-Za-z_:][A-Za-z0-9_:]*)")


def _sample(line: str):
    """The one sample of a text-format line (raises ValueError when it is not one)."""
    from prometheus_client.parser import text_string_to_metric_families

    fams = list(text_string_to_metric_families(line + "\n"))
    samples = [s for f in fams for s in f.samples]
    if len(samples) != 1:
        raise ValueError("not one sample")
    return samples[0]


def _count(v: float) -> int | None:
    if not math.isfinite(v) or v < 0 or v != int(v) or v > INT64_MAX:
        return None
    return int(v)


def parse_prometheus_text(data: bytes, source: str, run_id: str) -> EngineBatch:
    """Counters of every ``model_name`` in one exposition (see the module docstring)."""
    b = EngineBatch()
    text = data.decode("utf-8", errors="replace")
    cells: dict[tuple, int] = {}  # (model, engine, metric, position) -> count
    for ln, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        m = _NAME.match(line)
        if not m or not m.group(1).startswith(PREFIX):
            continue
        name = m.group(1)
        if name.endswith("_created"):
            continue
        try:
            s = _sample(line)
        except Exception as e:  # noqa: BLE001 - prometheus_client raises several kinds on a bad line
            b.reject(source, ln, name, f"not a Prometheus sample line ({type(e).__name__}: {safe_text(e)[:120]})", line, run_id)
            continue
        metric = METRICS.get(s.name)
        if metric is None:
            continue  # another spec_decode series (a later vLLM may add some): not one we read
        v = _count(s.value)
        if v is None:
            b.reject(source, ln, f"{s.name}.value", f"not a count: {s.value!r} (expected a finite integer >= 0)", line, run_id)
            continue
        engine = s.labels.get("engine", "0")
        if not engine.isdigit() or int(engine) > 2**31 - 1:
            b.reject(source, ln, f"{s.name}.engine", f"engine label {engine!r} is not an engine index", line, run_id)
            continue
        pos = -1
        if metric == "accepted_per_pos":
            p = s.labels.get("position", "")
            if not p.isdigit() or int(p) >= MAX_POSITIONS:
                b.reject(source, ln, f"{s.name}.position", f"position label {p!r} is not a draft position "
                         f"(0..{MAX_POSITIONS - 1})", line, run_id)
                continue
            pos = int(p)
        key = (s.labels.get("model_name", ""), int(engine), metric, pos)
        if key in cells:
            b.reject(source, ln, s.name, f"sample repeated (engine {engine}, position {pos}): the first is kept", line, run_id)
            continue
        cells[key] = v
    models = sorted({k[0] for k in cells})
    for model in models:
        rid = run_id if len(models) == 1 else f"{run_id}:{model}"
        mine = {k[1:]: v for k, v in cells.items() if k[0] == model}
        positions = sorted({p for (_, met, p) in mine if met == "accepted_per_pos"})
        if not positions:
            b.reject(source, 0, "vllm:spec_decode_num_accepted_tokens_per_pos_total",
                     f"model {model!r}: no per-position counter, so the number of draft positions is unknown; "
                     "its counters are not stored", None, rid)
            continue
        gamma = positions[-1] + 1
        drafts = sum(v for (e, met, p), v in mine.items() if met == "num_drafts")
        tokens = sum(v for (e, met, p), v in mine.items() if met == "num_draft_tokens")
        arm = "static" if tokens == drafts * gamma else "compact"
        b.runs.append(run_row(rid, "vllm", arm, gamma, model or None,
                              {"format": "vllm-prometheus", "producer": SOURCE_VERSION, "file": source}))
        for (engine, met, p), v in sorted(mine.items()):
            b.counts.append(count_row(rid, source, engine, met, v, p))
    return b
