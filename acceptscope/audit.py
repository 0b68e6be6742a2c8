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
import uuid
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Callable, Optional

from acceptscope.cli._common import EXIT_FAILURE, EXIT_OK

PRODUCTION_ARM = "compact"
AUDIT_ARM = "cap-accept"


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
    # engine options (same names and meaning as `acceptscope run` / EngineConfig)
    engine_options: dict = field(default_factory=dict)


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
            "exit_code": self.exit_code,
        }


def new_audit_group() -> str:
    return "audit-" + dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d-%H%M%S") + "-" + uuid.uuid4().hex[:6]


# ---------------------------------------------------------------------------
# reference engine
# ---------------------------------------------------------------------------
def _engine_config(cfg: AuditConfig, arm: str, group: str, **overrides: Any) -> Any:
    from acceptscope.engine import EngineConfig

    known = {f.name for f in fields(EngineConfig)}
    unknown = sorted(set(cfg.engine_options) - known)
    if unknown:
        raise ValueError(f"unknown engine option(s): {', '.join(unknown)}")
    opts = {**cfg.engine_options, **overrides}
    return EngineConfig(arm=arm, workload=cfg.workload, db=str(cfg.db), audit_group=group,
                        run_id=f"{group}-{arm}", **opts)


def _run_reference(cfg: AuditConfig, group: str, progress: Optional[Callable[[str, int, int], None]]) -> dict:
    """Run the arms on the reference engine; returns arm -> (run summary dict, run_id)."""
    from acceptscope import audit_sampling
    from acceptscope.engine import EngineConfig, run_engine
    from app.data import Reader

    out: dict = {}
    n_total = cfg.engine_options.get("num_requests", EngineConfig.num_requests)

    def prog(arm: str, total: Optional[int]):
        # the engine reports (requests finished now, their tokens); surfaces want (arm, advance, total)
        return None if progress is None else (lambda n_done, _tokens: progress(arm, n_done, total))

    s = run_engine(_engine_config(cfg, PRODUCTION_ARM, group), progress=prog(PRODUCTION_ARM, n_total))
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
    a = run_engine(_engine_config(cfg, AUDIT_ARM, group, **subset,
                                  **({"window_replay_run": s.run_id} if subset else {})),
                   progress=prog(AUDIT_ARM, n_audit))
    out[AUDIT_ARM] = a.to_dict()
    if cfg.with_static:
        st = run_engine(_engine_config(cfg, "static", group, **subset), progress=prog("static", n_audit))
        out["static"] = st.to_dict()
    return out


def _run_sglang(cfg: AuditConfig, group: str, progress: Any) -> dict:
    """Delegate to ``acceptscope.live.run_audit`` (launch or attach to real SGLang servers).

    Engine options pass through (``urls`` selects attach mode); run ids are
    ``f"{group}-{arm}"`` as on the reference engine.
    """
    try:
        from acceptscope import live
    except ImportError as e:  # pragma: no cover
        raise RuntimeError(f"--engine sglang needs acceptscope.live: {e}") from None
    fn = getattr(live, "run_audit", None)
    if fn is None:
        raise RuntimeError(
            "--engine sglang: this install's acceptscope.live has no run_audit() entry point. Run the arms with "
            "`acceptscope live ...` (same --audit-group), then `acceptscope report --audit-group GROUP`.")
    arms = [PRODUCTION_ARM, AUDIT_ARM] + (["static"] if cfg.with_static else [])
    return fn(db=str(cfg.db), audit_group=group, arms=arms, workload=cfg.workload,
              audit_fraction=cfg.audit_fraction, sample_seed=cfg.sample_seed, **cfg.engine_options)


# ---------------------------------------------------------------------------
# the workflow
# ---------------------------------------------------------------------------
def run_audit(cfg: AuditConfig, progress: Optional[Callable[[str, int, int], None]] = None,
              stage: Optional[Callable[[str], None]] = None) -> AuditResult:
    """Run both arms, check parity, infer utilization, run estimators, write the report."""
    import time

    from acceptscope import audit_sampling
    from acceptscope.parity import check_parity
    from acceptscope.report import Thresholds, write_report
    from app.data import Reader

    if cfg.engine not in ("reference", "sglang"):
        raise ValueError(f"--engine must be reference or sglang, got {cfg.engine!r}")
    if not 0 < cfg.audit_fraction <= 1:
        raise ValueError(f"--audit-fraction must be in (0, 1], got {cfg.audit_fraction}")
    say = stage or (lambda s: None)
    t0 = time.perf_counter()
    group = cfg.audit_group or new_audit_group()
    say(f"running arms ({cfg.engine} engine, audit group {group})")
    runs = (_run_reference if cfg.engine == "reference" else _run_sglang)(cfg, group, progress)
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
    return AuditResult(group, str(cfg.db), runs, parity, sampling, report, audited, time.perf_counter() - t0)
