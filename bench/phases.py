"""Where `estimate`'s CPU goes, by phase and by run, without a profiler's overhead.

cProfile's per-call cost inflates Python-heavy phases several-fold (a fleet's 27.6 CPU-s read 41 under it), so
the shares it gives mislead. This wraps the pipeline's phases (the functions in ``PHASES``, looked up by
name at run time) in ``time.process_time`` and runs ``acceptscope estimate --db DB --json`` in this process:
the CPU seconds of each phase (inclusive: a phase's lines are indented under the phase that calls it) and of
each run (its hazard fit, its chunks, its assembly).

Usage::

    .venv/bin/python bench/phases.py --db /tmp/fleet15/fleet.duckdb [--run RUN_ID]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import importlib
import io
import sys
import time

t_start = time.process_time()
from acceptscope.cli import app  # noqa: E402  (first: its process defaults must precede numpy, as in the console script)

# (module, owner class or None, function, label, how to name the run it works for or None)
PHASES = (
    ("acceptscope.estimators.stream", None, "fit_hazards", "hazard fits", lambda store, meta, *a, **k: meta.run_id),
    ("acceptscope.estimators.pipeline", None, "fit_estimator", "  fit on a sample", None),
    ("acceptscope.estimators.pipeline", None, "read_sample", "    the sample's read", None),
    ("acceptscope.estimators.tail", "TailEstimator", "fit", "    the tail's fit", None),
    ("acceptscope.estimators.tail", "TailEstimator", "calibrate_prior", "  the audit's shift", None),
    ("acceptscope.estimators.tail", "TailEstimator", "frozen", "  the hazard refits", None),
    ("acceptscope.estimators.accumulator", "RunAccumulator", "add", "accumulating chunks",
     lambda self, *a, **k: self.run_id),
    ("acceptscope.estimators.tail", "TailEstimator", "estimate", "  the tail's walk", None),
    ("acceptscope.estimators.accumulator", None, "request_stats", "  per-request statistics", None),
    ("acceptscope.estimators.accumulator", None, "grouping_sums", "  per-replicate sums", None),
    ("acceptscope.estimators.trim_regret", "TrimRegret", "add", "  trim regret", None),
    ("acceptscope.estimators.stream", None, "assemble", "assembling", lambda acc, *a, **k: acc.run_id),
    ("acceptscope.estimators.pipeline", None, "fit_calibration", "  the held-out STS comparison", None),
    ("acceptscope.estimators.stream", None, "_planner", "  the planner audit", None),
    ("acceptscope.estimators.run", None, "add_interval_health", "interval health", None),
)


def instrument(per_phase: collections.Counter, per_run: dict) -> None:
    for module, owner, name, label, run_of in PHASES:
        target = importlib.import_module(module)
        target = getattr(target, owner) if owner else target
        fn = getattr(target, name)

        def timed(*a, _fn=fn, _label=label, _run_of=run_of, **k):
            t = time.process_time()
            try:
                return _fn(*a, **k)
            finally:
                dt = time.process_time() - t
                per_phase[_label] += dt
                if _run_of is not None:
                    per_run[_run_of(*a, **k)][_label] += dt
        setattr(target, name, timed)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", action="append", default=[], help="only these runs (repeatable)")
    a = ap.parse_args()
    import acceptscope.estimators.run  # noqa: F401  (the modules PHASES names, loaded before they are wrapped)
    import acceptscope.estimators.stream  # noqa: F401
    t_imports = time.process_time() - t_start
    per_phase: collections.Counter = collections.Counter()
    per_run: dict = collections.defaultdict(collections.Counter)
    instrument(per_phase, per_run)
    sys.argv = ["acceptscope", "estimate", "--db", a.db, "--json"] + [x for r in a.run for x in ("--run", r)]
    t0 = time.process_time()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.suppress(SystemExit):
        app()
    total = time.process_time() - t0
    print(f"imports {t_imports:.2f} CPU-s; estimate {total:.2f} CPU-s")
    for _, _, _, label, _ in PHASES:
        print(f"{label:<34} {per_phase[label]:7.2f}")
    print("\nper run: hazard fits, chunks, assembly, total")
    for run, c in sorted(per_run.items(), key=lambda kv: -sum(kv[1].values())):
        print(f"{run:<60} {c['hazard fits']:6.2f} {c['accumulating chunks']:6.2f} {c['assembling']:6.2f} "
              f"{sum(c.values()):6.2f}")


if __name__ == "__main__":
    main()
