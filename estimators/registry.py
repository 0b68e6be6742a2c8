"""Estimators that plug into the one pipeline: register an accumulator class and every executor runs it.

Why: a run's results are assembled in one place (:mod:`estimators.pipeline`) over one accumulator
(:class:`estimators.accumulator.RunAccumulator`) that the in-memory, streamed and Spark executors all
feed. A registered estimator rides along: it sees every chunk of whole requests the run's accumulator
sees, is shipped and merged with it on Spark, and its result lands under its ``name`` in the results
dict, which ``estimate --json``, the report, the dashboard and the exporter read. Adding one touches
its own module, one registration line (the import in ``estimators/__init__.py``) and its figure
(``acceptscope.figures.figure_for``).

The protocol (duck-typed; :class:`ChunkEstimator` spells it out)::

    @register
    class MeanWindow:
        name = "mean_window"                      # its key in the results and in estimate --json
        def __init__(self, run: RunInfo):          # once per run and per executor partition
            self.n, self.total = 0, 0.0
        def add(self, chunk: Chunk) -> None:       # a chunk of whole requests of the run
            self.n += chunk.frame.n
            self.total += float(chunk.frame.window.sum())
        def merge(self, other: "MeanWindow") -> None:   # another partition's accumulator (Spark)
            self.n += other.n
            self.total += other.total
        def result(self):                          # anything with to_json(); raise Skip("why") to skip
            return MeanWindowResult(self.total / max(self.n, 1))

The accumulator must be picklable (the Spark executors send it back) and its memory must not grow
with the run's rows (sums, not rows): that is what lets every executor run it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import pandas as pd


@dataclass(frozen=True)
class RunInfo:
    """What a registered estimator knows of its run when it is created."""

    run_id: str
    gamma: int
    exact: bool  # the ceiling is recorded on every request-step (cap-accept / static): nothing is estimated
    seed: int


@dataclass
class Chunk:
    """One chunk of whole requests of a run, after the tail estimator has walked it."""

    frame: Any  # estimators.frame.BlockFrame: the request-steps, one row per block
    blocks: pd.DataFrame  # the tail estimator's per-block predictions (mean, censored, mode, workload, band, ...)
    ceiling: np.ndarray  # per block: the recorded ceiling (exact runs) or the estimated mean ceiling, in drafts
    exact: bool


class Skip(ValueError):
    """Raised by ``result()`` when the run cannot support the estimate; the message is the reason."""


class ChunkEstimator(Protocol):
    name: str

    def __init__(self, run: RunInfo) -> None: ...

    def add(self, chunk: Chunk) -> None: ...

    def merge(self, other: "ChunkEstimator") -> None: ...

    def result(self) -> Any: ...


_REGISTRY: dict[str, type] = {}


def register(cls: type) -> type:
    """Class decorator: run ``cls`` on every run of every executor (see the module docstring)."""
    for attr in ("name", "add", "merge", "result"):
        if not hasattr(cls, attr):
            raise TypeError(f"{cls.__name__} cannot be registered: it has no {attr!r} (see estimators.registry)")
    if cls.name in _REGISTRY and _REGISTRY[cls.name] is not cls:
        raise ValueError(f"an estimator named {cls.name!r} is registered already ({_REGISTRY[cls.name].__name__})")
    _REGISTRY[cls.name] = cls
    return cls


def unregister(name: str) -> None:
    """Remove a registered estimator (tests and examples that register a toy one)."""
    _REGISTRY.pop(name, None)


def registered() -> dict[str, type]:
    """The registered estimators, by name, in registration order."""
    return dict(_REGISTRY)
