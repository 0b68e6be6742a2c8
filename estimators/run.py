"""The :func:`run_all` facade (re-exported as ``estimators.run_all``): every estimator that applies to a
run, through the one pipeline (:mod:`estimators.pipeline`); see ``estimators/__init__.py``."""

from __future__ import annotations

from typing import Any

from acceptscope.estimators.pipeline import add_interval_health
from acceptscope.estimators.stream import run_all_stream

# runs up to this many request-steps are estimated as one chunk (per-block tail predictions kept, the
# planner audit on every decode step); bigger ones are streamed in chunks of whole requests (the planner
# audit then on their first PLANNER_ROWS request-steps). Why 64k: a chunk costs ~3.7 GB per million
# request-steps; over the main job's audit replicated to 2M request-steps in 23 runs, 256k peaked at
# 1,597 MB and 64k at 1,203 MB with 7% less CPU (bench/fleet.py)
STREAM_ROWS = 1 << 16


def run_all(store, run_id: str, n_boot: int = 200, hazard_boot: int = 20, seed: int = 0,
            use_sglang_pg: bool = False, hazards_from: str | None = None) -> dict[str, Any]:
    """Every estimator that applies to ``run_id``; see the module docstring.

    Tail hazards of a run without a recorded ceiling come from its own observed outcomes, from
    the truth-bearing arm of its own audit (``audit_group``), or from ``hazards_from`` when the
    user names a run; a named run must pass :func:`hazard_compatibility` (ValueError).
    ``use_sglang_pg``: SGLang's pg p/q extend the tail walk (off by default: not validated yet)."""
    return run_all_runs(store, [run_id], n_boot=n_boot, hazard_boot=hazard_boot, seed=seed,
                        use_sglang_pg=use_sglang_pg, hazards_from=hazards_from, raise_errors=True)[run_id]


def run_all_runs(store, run_ids=None, n_boot: int = 200, hazard_boot: int = 20, seed: int = 0, progress=None,
                 use_sglang_pg: bool = False, hazards_from: str | None = None,
                 raise_errors: bool = False) -> dict[str, Any]:
    """:func:`run_all` for many runs without a query per run: one ordered scan of ``request_steps`` for
    every run up to :data:`STREAM_ROWS` request-steps (each run one chunk) and one streamed pass for the
    bigger runs. Returns ``{run_id: results}``; a run that cannot be estimated maps to its exception
    (raised instead with ``raise_errors``)."""
    ids = store.runs().run_id.tolist() if run_ids is None else list(run_ids)
    n = store.query_df("SELECT run_id, count(*) AS n FROM request_steps WHERE run_id IN (SELECT UNNEST(?)) "
                       "GROUP BY run_id", [ids]).set_index("run_id")["n"]
    big = [r for r in ids if n.get(r, 0) > STREAM_ROWS and not use_sglang_pg]
    small = [r for r in ids if r not in set(big)]
    out = {}
    cache: dict = {}  # the hazard fits, shared with interval health (the production run alone)
    kw = dict(n_boot=n_boot, hazard_boot=hazard_boot, seed=seed, progress=progress, hazards_from=hazards_from,
              cache=cache)
    if small:
        gather = _sglang_gather(store, small) if use_sglang_pg else None
        out.update(run_all_stream(store, small, chunk_rows=STREAM_ROWS, whole_runs=True, gather=gather, **kw))
    if big:
        out.update(run_all_stream(store, big, **kw))
    if raise_errors:
        for r in ids:
            if isinstance(out[r], Exception):
                raise out[r]
    if hazards_from is None:  # a named run may be other traffic: nothing pairs with it
        for r in ids:
            if not isinstance(out[r], Exception):
                add_interval_health(store, out[r], r, cache, hazard_boot, seed)
    return {r: out[r] for r in ids}


def _sglang_gather(store, run_ids) -> dict | None:
    """SGLang's estimator JSONL rows and pg entries of the runs, for the tail walk (``use_sglang_pg``)."""
    rows = store.read_table("estimator_rows", list(run_ids))
    gather = store.read_table("estimator_gather", list(run_ids))
    return {"gather": gather, "rows": rows} if len(gather) else None
