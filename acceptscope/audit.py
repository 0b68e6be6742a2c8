"""The audit workflow: production arm + audit arm on the same traffic, then the verdict.

Why this module exists: a production ``compact`` arm trims verify windows with
its confidence head and cannot see what it trimmed away. The ``cap-accept``
audit arm verifies every block in full but commits exactly what compact would,
so on the same workload and seeds it measures the uncapped ceiling of the same
token stream. One audit therefore

1. runs compact and cap-accept (optionally static) on one workload and seed
   into one DuckDB file, with a shared ``audit_group`` id in ``runs``;
2. checks parity: both arms must commit identical tokens per request
   (:mod:`acceptscope.parity`); any divergence is a finding;
3. with ``audit_fraction < 1`` replays only a seeded sample of requests in the
   audit arm and infers the full-traffic ceiling and utilization
   (:mod:`acceptscope.audit_sampling`);
4. runs the estimators and writes the HTML report (:mod:`acceptscope.report`).
"""

from __future__ import annotations

import datetime as dt
import time
import uuid
from pathlib import Path
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Optional

from acceptscope import audit_sampling, live
from acceptscope.engine import EngineConfig, run_engine
from acceptscope.domain.workloads import BUILTIN, disjoint_prompts, load_prompts, parse_spec
from acceptscope.exit_codes import EXIT_FAILURE, EXIT_OK
from acceptscope.outputs import atomic_write
from acceptscope.parity import check_parity
from acceptscope.reader import Reader
from acceptscope.report import Thresholds, write_report
from acceptscope.store import Store
from acceptscope.estimators.calibration import StsCalibrator, calibration_data

PRODUCTION_ARM = "compact"
AUDIT_ARM = "cap-accept"
STS_CALIBRATE = "calibrate"
# The regime the audit serves in unless told otherwise: SGLang's planner on a cost table measured on a GPU
# (an H200, Qwen3-8B shape) at a batch where extra verify tokens cost real time (64: a full-width verify
# takes 1.7x the one-row step there), STS in force. Not 256 (issue 13): there the main job's 240 requests
# start in one batch in lockstep, the step's survival threshold swings (0.2-0.8) from step to step, and chat
# (mid-range survival) served 5-8 points below what one threshold at the same windows gives; at 64, slots
# refill as requests finish, the steps desynchronise and the gap is 1.3-1.8 points (bench/regime.py --diagnose).
AUDIT_DEFAULTS = {"cost_profile": "h200-qwen3-8b", "max_running_requests": 64, "sts": STS_CALIBRATE}


def effective_options(engine_options: dict) -> dict:
    """The audit's engine options: ``AUDIT_DEFAULTS`` under what was given.

    ``sps`` given without ``cost_profile`` means the wall clock on that table; ``cost_profile='none'``
    likewise drops the profile; ``sts='none'`` serves without STS.
    """
    opts = dict(engine_options)
    if "cost_profile" not in opts and "sps" not in opts:
        opts["cost_profile"] = AUDIT_DEFAULTS["cost_profile"]
    if opts.get("cost_profile") in (None, "none"):
        opts.pop("cost_profile", None)
    opts.setdefault("max_running_requests", AUDIT_DEFAULTS["max_running_requests"])
    opts.setdefault("sts", AUDIT_DEFAULTS["sts"])
    if opts.get("sts") in (None, "none"):
        opts.pop("sts", None)
    return opts


@dataclass
class AuditConfig:
    db: str
    engine: str = "reference"
    workload: str = "mixed"
    out: Optional[str] = "report.html"
    with_static: bool = False
    audit_fraction: float = 1.0
    sample_seed: int = 0
    audit_group: Optional[str] = None
    estimators: bool = True
    n_boot: int = 2000
    # engine options (same names and meaning as `acceptscope run` / EngineConfig); the audit's defaults
    # (AUDIT_DEFAULTS) fill what is not given: a GPU cost profile, its batch, STS fitted on a calibration split
    engine_options: dict = field(default_factory=dict)
    # cap-accept requests of the STS calibration split (prompts disjoint from the audited ones);
    # 0 = half the audit's requests, at least 16
    calibration_requests: int = 0
    # compact-vs-static throughput over batch sizes on the virtual clock, for the highest- and lowest-accept
    # workloads (needs a cost profile); () = skip
    curve_batches: tuple = (1, 4, 16, 64, 256)
    curve_min_requests: int = 8
    curve_max_new_tokens: int = 32


@dataclass
class AuditResult:
    audit_group: str
    db: str
    runs: dict  # arm -> run summary dict
    parity: Any  # ParityReport
    sampling: Any = None  # SamplingInference
    report: Any = None  # ReportResult
    audited_keys: int = 0
    wall_s: float = 0.0
    calibration: Optional[dict] = None  # the STS calibration split (calibrate_sts), when fitted
    curve: list = field(default_factory=list)  # compact-vs-static throughput points (run_curve)

    @property
    def exit_code(self) -> int:
        return EXIT_OK if self.parity is None or self.parity.ok else EXIT_FAILURE

    def to_dict(self) -> dict:
        rep = self.report
        return {
            "audit_group": self.audit_group,
            "db": self.db,
            "wall_s": round(self.wall_s, 2),
            "runs": self.runs,
            "parity": self.parity.to_dict() if self.parity is not None else None,
            "sampling": self.sampling.to_dict() if self.sampling is not None else None,
            "report": None if rep is None else {
                "path": str(rep.path) if rep.path else None, "findings": [asdict(f) for f in rep.findings],
                "estimators": rep.estimators, "headline": rep.headline,
            },
            "calibration": self.calibration,
            "curve": self.curve,
            "exit_code": self.exit_code,
        }


def new_audit_group() -> str:
    return "audit-" + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


# ---------------------------------------------------------------------------
# reference engine
# ---------------------------------------------------------------------------
def _engine_config(cfg: AuditConfig, arm: str, group: str, opts: Optional[dict] = None, **overrides: Any) -> Any:

    base = cfg.engine_options if opts is None else opts
    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(base) - known)
    if unknown:
        raise ValueError(f"unknown engine option(s): {', '.join(unknown)}")
    merged = {"run_id": f"{group}-{arm}", "workload": cfg.workload, **base, **overrides}
    return EngineConfig(arm=arm, db=str(cfg.db), audit_group=merged.pop("audit_group", group), **merged)


def sts_path_for(db: str, group: str) -> Path:
    """Where the audit writes the STS table it fits (next to the database)."""
    p = Path(db)
    return p.with_name(f"{p.stem}.{group}.sts.json")


def calibrate_sts(cfg: AuditConfig, group: str, opts: dict, n_audit: int,
                  progress: Optional[Callable[[str, int, int], None]] = None) -> dict:
    """Fit STS on a calibration split and write an SGLang-loadable table; returns what was done.

    The split is a cap-accept run (every block verified in full, so the label is uncensored) on prompts
    disjoint from the audit's (``prompt_offset`` = the audit's request count, so no workload repeats an
    audited prompt index), served without STS, in audit group ``<group>/calibration``. Temperatures are
    fitted by the smooth NLL method (``estimators.calibration``) on the realized label; both audit arms
    then serve with the table, as production would.
    """

    n = int(cfg.calibration_requests) or max(16, int(n_audit) // 2)
    keep = {k: v for k, v in opts.items() if k not in ("sts", "num_requests", "request_keys", "window_replay_run",
                                                         "run_id", "audit_group", "prompt_offset")}
    run_id = f"{group}-calibration"
    workload = keep.get("workload", cfg.workload)
    # disjoint by text, not only by prompt index: the generators and cycled files repeat texts
    prompts, pool = disjoint_prompts(workload, n, int(n_audit))
    if not prompts:
        raise ValueError(f"workload {workload!r}: every prompt text is already among the {n_audit} audited ones, "
                         "so no calibration split is left (serve fewer requests, a larger prompt file, or --sts none)")
    n = len(prompts)
    cb = None if progress is None else (lambda n_done, _t: progress("calibration", n_done, n))
    run_engine(_engine_config(cfg, AUDIT_ARM, group, keep, run_id=run_id, audit_group=f"{group}/calibration",
                              num_requests=pool, prompt_offset=int(n_audit),
                              request_keys=[(p.workload, p.prompt_index) for p in prompts]), progress=cb)
    rs = Store(cfg.db, read_only=True).read_table("request_steps", run_id=run_id)
    data = calibration_data(rs, label="realized")
    cal = StsCalibrator("smooth-nll").fit(data.z, data.y)
    path = sts_path_for(cfg.db, group)
    atomic_write(path, cal.to_sglang_json(dataset=f"{cfg.db}:{run_id}", label=data.label,
                                          extra={"calibration_run": run_id, "prompt_offset": int(n_audit)}))

    seen = {p.text for p in load_prompts(workload, int(n_audit))}
    overlap = sum(p.text in seen for p in prompts)  # 0 by construction; stated in the report
    return {"run_id": run_id, "path": str(path), "temperatures": cal.temperatures_, "samples": int(len(data.z)),
            "prompts_shared_with_audit": int(overlap),
            "ece_before_in_sample": cal.ece_before_, "ece_after_in_sample": cal.ece_after_}


def _label_map(workload: str) -> dict:

    return {(w if w in BUILTIN else Path(w).stem): w for w in parse_spec(workload)}


def run_curve(cfg: AuditConfig, group: str, opts: dict, by_workload: dict,
              progress: Optional[Callable[[str, int, int], None]] = None) -> list[dict]:
    """Compact vs static over ``cfg.curve_batches`` on the virtual clock, highest- and lowest-accept workloads.

    Each point is a real engine run (``max_running_requests = batch``, ``max(batch, curve_min_requests)``
    requests of ``curve_max_new_tokens`` tokens, no per-position telemetry) in audit group
    ``<group>/curve``; throughput is decode tokens per modeled second. The high-accept workload is math
    when served (the blog's gsm8k class), else the highest-accept one; the low one the lowest-accept.
    Returns the points (the report recomputes them from the database).
    """

    if not opts.get("cost_profile") or not cfg.curve_batches:
        return []
    acc = {w: d.get("accept_length") or 0.0 for w, d in by_workload.items() if d.get("verify_ct")}
    labels = _label_map(cfg.workload)
    ranked = [w for w in sorted(acc, key=acc.get, reverse=True) if w in labels]
    if not ranked:
        return []
    chosen = list(dict.fromkeys(["math" if "math" in ranked else ranked[0], ranked[-1]]))
    keep = {k: v for k, v in opts.items() if k not in ("num_requests", "request_keys", "window_replay_run",
                                                         "run_id", "audit_group", "max_running_requests",
                                                         "per_position", "workload", "max_new_tokens")}
    points = []
    total = 2 * len(chosen) * sum(max(int(b), int(cfg.curve_min_requests)) for b in cfg.curve_batches)
    for wl in chosen:
        for b in cfg.curve_batches:
            n = max(int(b), int(cfg.curve_min_requests))
            for arm in (PRODUCTION_ARM, "static"):
                rid = f"{group}-curve-{wl}-b{b}-{arm}"
                cb = None if progress is None else (lambda n_done, _t: progress("curve", n_done, total))
                s = run_engine(_engine_config(cfg, arm, group, keep, run_id=rid, audit_group=f"{group}/curve",
                                              workload=labels[wl], num_requests=n, max_running_requests=int(b),
                                              max_new_tokens=int(cfg.curve_max_new_tokens), per_position=False),
                               progress=cb)
                points.append({"workload": wl, "batch": int(b), "arm": arm, "run_id": rid,
                               "modeled_tokens_per_s": s.modeled_tokens_per_s, "mean_window": s.mean_window})
    return points


def _run_reference(cfg: AuditConfig, group: str, progress: Optional[Callable[[str, int, int], None]]) -> dict:
    """Run the arms on the reference engine; returns arm -> (run summary dict, run_id)."""

    out: dict = {}
    opts = effective_options(cfg.engine_options)
    n_total = opts.get("num_requests", EngineConfig.num_requests)
    if opts.get("sts") == STS_CALIBRATE:
        cal = calibrate_sts(cfg, group, opts, n_total, progress)
        opts["sts"] = cal["path"]
        out["_calibration"] = cal

    def prog(arm: str, total: Optional[int]):
        # the engine reports (requests finished now, their tokens); surfaces want (arm, advance, total)
        return None if progress is None else (lambda n_done, _tokens: progress(arm, n_done, total))

    s = run_engine(_engine_config(cfg, PRODUCTION_ARM, group, opts), progress=prog(PRODUCTION_ARM, n_total))
    out[PRODUCTION_ARM] = s.to_dict()
    n_audit = s.requests
    subset: dict = {}
    if cfg.audit_fraction < 1:
        # The audit arm serves a seeded sample of the traffic. Its batches differ from
        # production's, so its own planner would pick other windows; it replays the
        # production windows instead, which is what the audit must measure.
        keys = audit_sampling.keys_of(Reader(cfg.db), s.run_id)
        sample = audit_sampling.sample_keys(keys, cfg.audit_fraction, cfg.sample_seed)
        subset["request_keys"] = [(w, int(i)) for w, i in zip(sample["workload"], sample["prompt_index"])]
        n_audit = len(subset["request_keys"])
    a = run_engine(_engine_config(cfg, AUDIT_ARM, group, opts, **subset,
                                  **({"window_replay_run": s.run_id} if subset else {})),
                   progress=prog(AUDIT_ARM, n_audit))
    out[AUDIT_ARM] = a.to_dict()
    if cfg.with_static:
        st = run_engine(_engine_config(cfg, "static", group, opts, **subset), progress=prog("static", n_audit))
        out["static"] = st.to_dict()
    out["_curve"] = run_curve(cfg, group, opts, s.by_workload, progress)
    return out


def _run_sglang(cfg: AuditConfig, group: str, progress: Any) -> dict:
    """Delegate to ``acceptscope.live.run_audit`` (launch or attach to real SGLang servers).

    Engine options pass through (``urls`` selects attach mode); run ids are
    ``f"{group}-{arm}"`` as on the reference engine.
    """
    arms = [PRODUCTION_ARM, AUDIT_ARM] + (["static"] if cfg.with_static else [])
    return live.run_audit(db=str(cfg.db), audit_group=group, arms=arms, workload=cfg.workload,
              audit_fraction=cfg.audit_fraction, sample_seed=cfg.sample_seed, **cfg.engine_options)


# ---------------------------------------------------------------------------
# the workflow
# ---------------------------------------------------------------------------
def run_audit(cfg: AuditConfig, progress: Optional[Callable[[str, int, int], None]] = None,
              stage: Optional[Callable[[str], None]] = None) -> AuditResult:
    """Run both arms, check parity, infer utilization, run estimators, write the report."""
    if cfg.engine not in ("reference", "sglang"):
        raise ValueError(f"--engine must be reference or sglang, got {cfg.engine!r}")
    if not 0 < cfg.audit_fraction <= 1:
        raise ValueError(f"--audit-fraction must be in (0, 1], got {cfg.audit_fraction}")
    say = stage or (lambda s: None)
    t0 = time.perf_counter()
    group = cfg.audit_group or new_audit_group()
    say(f"running arms ({cfg.engine} engine, audit group {group})")
    runs = (_run_reference if cfg.engine == "reference" else _run_sglang)(cfg, group, progress)
    extras = {k: runs.pop(k) for k in ("_calibration", "_curve") if k in runs}
    reader = Reader(cfg.db)
    ids = {arm: r["run_id"] for arm, r in runs.items()}
    say("checking parity")
    parity = check_parity(reader, ids[PRODUCTION_ARM], ids[AUDIT_ARM])
    sampling = None
    try:
        say("inferring full-traffic ceiling")
        sampling = audit_sampling.infer_runs(reader, ids[PRODUCTION_ARM], ids[AUDIT_ARM], n_boot=cfg.n_boot,
                                             seed=cfg.sample_seed)
    except ValueError as e:
        say(f"no full-traffic inference: {e}")
    report = None
    if cfg.out:
        say("running estimators and writing the report")
        report = write_report(cfg.db, cfg.out, run_ids=list(ids.values()), parity=parity, sampling=sampling,
                              thresholds=Thresholds(), use_estimators=cfg.estimators,
                              title=f"acceptscope audit {group}")
    audited = sampling.n_audited if sampling is not None else 0
    return AuditResult(group, str(cfg.db), runs, parity, sampling, report, audited, time.perf_counter() - t0,
                       calibration=extras.get("_calibration"), curve=extras.get("_curve") or [])
