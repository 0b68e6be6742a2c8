"""The embedded reference DSpark serving engine (PyTorch, CPU-friendly).

Public API: :func:`run_engine` (``EngineConfig`` -> ``RunSummary``). It loads the target and
drafter, builds the prompt mix, serves it with continuous batching in one of SGLang's three
verify modes, and streams ``runs`` / ``steps`` / ``request_steps`` / ``requests`` rows into a
DuckDB store. The serving loop itself is :class:`acceptscope.engine.runner.Engine`.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Optional

import torch

from acceptscope import schema
from acceptscope.domain import sps as sps_mod
from acceptscope.domain import sts as sts_mod
from acceptscope.domain.chat import format_chat
from acceptscope.domain.locations import DEFAULT_DRAFTER, DEFAULT_TARGET, resolve_cost_profile, resolve_model_path
from acceptscope.domain.workloads import load_prompts
from acceptscope.engine import profiler
from acceptscope.engine.drafter import DSparkDrafter
from acceptscope.engine.profiler import StepClock
from acceptscope.engine.runner import Engine, RequestSpec
from acceptscope.engine.target import load_target
from acceptscope.engine.telemetry import TelemetrySink
from acceptscope.engine.tokenizer import load_tokenizer
from acceptscope.engine.verify import check_mode
from acceptscope.ingest.sps import parse_sps_table
from acceptscope.ingest.sts_table import parse_sts_table
from acceptscope.store import Store

PACKAGE_DATA = Path(__file__).resolve().parent / "data"
DEFAULT_SPS = PACKAGE_DATA / "sps_reference.json"

__all__ = ["EngineConfig", "RunSummary", "run_engine", "profile_engine", "load_models", "DEFAULT_SPS", "table_rows"]


@dataclass
class EngineConfig:
    arm: str = "cap-accept"
    target: str = DEFAULT_TARGET
    drafter: str = DEFAULT_DRAFTER
    workload: str = "mixed"
    num_requests: int = 240
    max_new_tokens: int = 64
    max_prompt_tokens: int = 192
    temperature: float = 0.0
    seed: int = 0
    gamma: Optional[int] = None
    max_running_requests: int = 32
    sts: Optional[str] = None
    sps: Optional[str] = "default"  # "default" = the shipped table, "none" = no table (verify-all)
    lag_steps: int = 2
    per_position: bool = True
    db: Optional[str] = None
    run_id: Optional[str] = None
    audit_group: Optional[str] = None
    threads: Optional[int] = None
    flush_steps: int = 64
    # serve only these (workload, prompt_index) pairs of the workload list (e.g. an audit sample);
    # rids and prompt indices stay those of the full list, so arms pair by request
    request_keys: Optional[list] = None
    # run_id (same db) whose per-request verify windows this arm replays (audit arm on a subset)
    window_replay_run: Optional[str] = None
    # serve on a cost profile (a shipped name such as "h200-qwen3-8b", or an SPS table path): the planner
    # uses that table (it replaces sps) and every decode step is timed on the virtual clock
    cost_profile: Optional[str] = None
    # skip the first N prompts of every workload (a calibration split disjoint from the audited prompts)
    prompt_offset: int = 0


@dataclass
class RunSummary:
    run_id: str
    arm: str
    gamma: int
    requests: int
    completion_tokens: int
    decode_steps: int
    forward_ct: int
    wall_s: float
    tokens_per_s: float
    mean_accept_length: float  # completion tokens per verify step (SGLang spec_accept_length, pooled)
    mean_window: float
    mean_correct_drafts: float
    scheduled_verify_tokens: int
    executed_verify_tokens: int
    db: Optional[str]
    by_workload: dict = field(default_factory=dict)
    writer_stats: Optional[dict] = None
    clock: str = "wall"  # "modeled": step times from the cost profile (modeled_s); wall_s is CPU time either way
    modeled_s: Optional[float] = None
    modeled_tokens_per_s: Optional[float] = None  # decode tokens / modeled decode seconds

    def to_dict(self) -> dict:
        return asdict(self)


def _set_threads(n: Optional[int]) -> None:
    n = n or 1  # default 1: on small shared CPUs intra-op threads oversubscribe (see README of bench/engine.py)
    torch.set_num_threads(max(1, int(n)))


def _load_sps(spec: Optional[str]):
    if spec is None or spec == "none":
        return None, None
    path = DEFAULT_SPS if spec == "default" else resolve_model_path(spec)
    if spec == "default" and not path.exists():
        return None, None
    return sps_mod.load_sps(path), str(path)


def load_models(target: str | Path, drafter: str | Path):
    """(target dir, drafter dir, target model, drafter) with clear errors for missing directories."""
    tpath = resolve_model_path(target)
    dpath = resolve_model_path(drafter)
    for label, p in (("target", tpath), ("drafter", dpath)):
        if not (p / "config.json").is_file():
            raise FileNotFoundError(f"{label} model directory {p}: no config.json (relative paths resolve against the "
                                    "cwd, then $ACCEPTSCOPE_HOME, then the checkout: set ACCEPTSCOPE_HOME to a checkout "
                                    "holding fixtures/models, or pass --target/--drafter)")
    model = load_target(tpath)
    return tpath, dpath, model, DSparkDrafter.from_pretrained(dpath, target=model)


def profile_engine(target: str | Path, drafter: str | Path, out: str | Path, *, fmt: str = "both",
                   batch_sizes=(1, 2, 4, 8, 16, 32), fracs=(0.0, 0.25, 0.5, 0.75, 1.0), steps: int = 8,
                   context_len: int = 64, mbin: int = 16, monotone: bool = True, gamma: Optional[int] = None,
                   threads: Optional[int] = None, progress: Optional[Callable[[], None]] = None) -> dict:
    """Profile the engine's step cost and write SGLang SPS tables; returns paths, hashes and cells."""
    _set_threads(threads)
    _, _, model, dr = load_models(target, drafter)
    g = int(gamma or dr.config.gamma)
    eng = Engine(model, dr, mode="compact", gamma=g, max_running_requests=max(batch_sizes),
                 max_seq_len=context_len + 2 * g + 4)
    t0 = time.perf_counter()
    cells = profiler.profile_cells(eng, batch_sizes, fracs, context_len=context_len, steps=steps, progress=progress)
    wall = time.perf_counter() - t0
    out = Path(out)
    tables = {}
    if fmt in ("additive", "both"):
        t = profiler.fit_additive(cells, mbin=mbin, monotone=monotone)
        tables["additive"] = {"path": str(out), "sha256": sps_mod.write_sps(t, out)}
    if fmt in ("diagonal", "both"):
        t1 = profiler.fit_diagonal(cells, g, max_batch_tokens=max(batch_sizes) * (g + 1))
        p1 = out if fmt == "diagonal" else out.with_name(out.name.removesuffix(".json") + ".1d.json")
        tables["diagonal"] = {"path": str(p1), "sha256": sps_mod.write_sps(t1, p1)}
    return {"tables": tables, "wall_s": wall, "gamma": g,
            "cells": [{"bs": c.bs, "frac": c.frac, "batch_tokens": c.batch_tokens, "median_step_s": c.median_s}
                      for c in cells]}


def table_rows(sps_bytes: Optional[bytes], sps_path: Optional[str], sts_bytes: Optional[bytes],
               sts_path: Optional[str | Path], gamma: int, run_id: str) -> dict[str, list]:
    """``sps_tables`` / ``sts_tables`` rows for the tables a run uses, built by the ingest parsers.

    Why: the estimators and the planner's audit look a run's tables up by the hash in ``runs``;
    parsing the same bytes that were hashed gives ``table_hash == runs.sps_hash / sts_hash``
    (both are sha256 of the file bytes). A table the SGLang-strict parser refuses yields
    ``rejects`` rows instead (the run itself loaded it with the engine's own loader).
    """
    out: dict[str, list] = {}
    batches = []
    if sps_bytes is not None:
        batches.append(parse_sps_table(sps_bytes, source=str(sps_path), run_id=run_id))
    if sts_bytes is not None:
        batches.append(parse_sts_table(sts_bytes, source=str(sts_path), gamma=gamma, run_id=run_id))
    for b in batches:
        for name, rows in b.tables.items():
            if len(rows):
                out.setdefault(name, []).extend(list(rows))
    return out


def run_engine(config: EngineConfig, progress: Optional[Callable[[int, int], None]] = None) -> RunSummary:
    """Run one arm end to end and return its summary (telemetry goes to ``config.db`` if set)."""
    check_mode(config.arm)
    _set_threads(config.threads)
    tpath, dpath, model, drafter = load_models(config.target, config.drafter)
    tok = load_tokenizer(tpath)
    gamma = int(config.gamma or drafter.config.gamma)

    sts_table, sts_hash, sts_bytes, sp = None, None, None, None
    if config.sts:
        sp = resolve_model_path(config.sts)
        sts_table = sts_mod.load_sts(sp)
        sts_table.check_gamma(gamma, str(sp))
        sts_bytes = Path(sp).read_bytes()
        sts_hash = hashlib.sha256(sts_bytes).hexdigest()  # = sts_mod.file_sha256 = ingest's table_hash
    clock = None
    if config.cost_profile:
        sps_table, sps_path = _load_sps(str(resolve_cost_profile(config.cost_profile)))
        clock = StepClock.from_profile(sps_table, sps_path)
    else:
        sps_table, sps_path = _load_sps(config.sps)
    sps_bytes = Path(sps_path).read_bytes() if sps_path else None
    sps_hash = hashlib.sha256(sps_bytes).hexdigest() if sps_bytes is not None else None

    eos = getattr(model.config, "eos_token_id", None)
    if eos is None:
        eos = tok.eos_token_id
    prompts = load_prompts(config.workload, config.num_requests, offset=config.prompt_offset)
    if config.request_keys is not None:
        keep = {(str(w), int(i)) for w, i in config.request_keys}
        prompts = [p for p in prompts if (p.workload, p.prompt_index) in keep]
        if not prompts:
            raise ValueError("request_keys selects none of the workload's prompts")
    specs = []
    for i, pr in enumerate(prompts):
        text = format_chat([{"role": "user", "content": pr.text}], add_generation_prompt=True)
        ids = tok.encode(text, add_special_tokens=False)[-config.max_prompt_tokens :]
        specs.append(RequestSpec(rid=f"{pr.workload}-{pr.prompt_index}", prompt_ids=ids,
                                 max_new_tokens=config.max_new_tokens, temperature=config.temperature,
                                 seed=config.seed, workload=pr.workload, prompt_index=pr.prompt_index))
    max_len = max(len(s.prompt_ids) for s in specs) + config.max_new_tokens + gamma + 2

    run_id = config.run_id or f"ref-{config.arm}-{uuid.uuid4().hex[:8]}"
    store = None
    if config.db:
        store = Store(config.db)
        cfg = asdict(config)
        cfg.update(gamma=gamma, target=str(tpath), drafter=str(dpath), sps_path=sps_path,
                   torch_threads=torch.get_num_threads(), clock="modeled" if config.cost_profile else "wall",
                   clock_ref_context=clock.ref_context if clock else None,
                   clock_context_term=clock.source if clock else None)
        store.append({schema.RUNS.name: [{
            "run_id": run_id, "arm": config.arm, "engine": "reference", "gamma": gamma,
            "temperature": config.temperature, "target_model": str(tpath), "draft_model": str(dpath),
            "sts_hash": sts_hash, "sps_hash": sps_hash, "started_at": datetime.now(timezone.utc),
            "config_json": json.dumps(cfg, sort_keys=True, default=str), "source": "live",
            "audit_group": config.audit_group, "role": schema.run_role(config.arm, config.audit_group),
        }]})
        store.append(table_rows(sps_bytes, sps_path, sts_bytes, sp, gamma, run_id))
    window_replay = None
    if config.window_replay_run is not None:
        if store is None:
            raise ValueError("window_replay_run needs db (the windows are read from that run's request_steps)")
        wr = store.query_df('SELECT rid, step_index, "window" AS w FROM request_steps WHERE run_id = ? '
                            "ORDER BY rid, step_index", [config.window_replay_run])
        if wr.empty:
            raise ValueError(f"window_replay_run {config.window_replay_run!r}: no request_steps rows in {config.db}")
        window_replay = {rid: g.w.astype(int).tolist() for rid, g in wr.groupby("rid", sort=False)}
    sink = TelemetrySink(store, flush_steps=config.flush_steps) if store is not None else None
    engine = Engine(model, drafter, mode=config.arm, gamma=gamma, max_running_requests=config.max_running_requests,
                    max_seq_len=max_len, eos_token_id=eos, sts=sts_table, sps=sps_table, lag_steps=config.lag_steps,
                    seed=config.seed, per_position=config.per_position, sink=sink, run_id=run_id,
                    window_replay=window_replay, clock_table=clock)
    t0 = time.perf_counter()
    results = engine.run(specs, progress=progress)
    wall = time.perf_counter() - t0
    wstats = sink.close() if sink is not None else None
    if store is not None:
        store.mark_complete(run_id)  # every row is committed: a killed run never gets this mark
    return summarize(engine, results, run_id, config.arm, gamma, wall, config.db, wstats)


def summarize(engine: Any, results: list, run_id: str, arm: str, gamma: int, wall: float,
              db: Optional[str], wstats: Optional[dict] = None) -> RunSummary:
    toks = sum(len(r.output_tokens) for r in results)
    vct = sum(r.verify_ct for r in results)
    corr = sum(r.correct_drafts for r in results)
    by: dict[str, dict] = {}
    for r in results:
        d = by.setdefault(r.workload, {"requests": 0, "tokens": 0, "verify_ct": 0, "correct": 0})
        d["requests"] += 1
        d["tokens"] += len(r.output_tokens)
        d["verify_ct"] += r.verify_ct
        d["correct"] += r.correct_drafts
    for d in by.values():
        d["accept_length"] = d["tokens"] / d["verify_ct"] if d["verify_ct"] else None
    modeled = getattr(engine, "modeled_s", 0.0) if getattr(engine, "clock_table", None) is not None else None
    decode_toks = toks - len(results)  # the prefill pass commits each request's first token
    return RunSummary(
        clock="wall" if modeled is None else "modeled", modeled_s=modeled,
        modeled_tokens_per_s=(decode_toks / modeled) if modeled else None,
        run_id=run_id, arm=arm, gamma=gamma, requests=len(results), completion_tokens=toks,
        decode_steps=engine.decode_steps, forward_ct=engine.forward_ct, wall_s=wall,
        tokens_per_s=toks / wall if wall > 0 else 0.0,
        mean_accept_length=toks / vct if vct else 0.0,
        mean_window=(engine.scheduled_tokens / max(vct, 1)) - 1.0,
        mean_correct_drafts=corr / vct if vct else 0.0,
        scheduled_verify_tokens=engine.scheduled_tokens, executed_verify_tokens=engine.executed_tokens,
        db=db, by_workload=by, writer_stats=wstats,
    )
