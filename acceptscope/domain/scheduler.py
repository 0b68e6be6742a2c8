"""Confidence scheduler: SGLang 0.5.23's verify-token budget and top-k allocation, exactly.

Two separate decisions, as in SGLang's ``HostConfidenceBudgetPlanner`` + ``dspark_schedule``:

1. **Budget** (extra verify tokens above one row per request) from the *lagged* survival
   (``lag_steps`` decode steps back; fresh requests count as survival 1 everywhere):
   ``cands = sort_desc(S[S >= eps])``, ``tau(M) = N + sum(cands[:M])``,
   ``theta(M) = tau(M) / step_time(N, M)`` (additive) or ``tau(M) * SPS_floor(N + M)`` (1-D),
   ``budget = argmax_M theta(M)`` (first maximum, no early stop).
2. **Allocation** of the budget with the *current* survival: valid cells (>= eps) ordered by
   survival desc, position asc, request asc; the first ``min(budget, n_valid)`` are selected;
   ``verify_len_r = 1 + selected_r`` (a prefix per request, since survival is non-increasing).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass
from typing import Optional

import numpy as np

from acceptscope.domain.sps import SpsTable, SpsTableAdditive

SURVIVAL_EPS = 1e-6
DEFAULT_LAG_STEPS = 2


@dataclass(frozen=True)
class BudgetDecision:
    budget: int
    predicted_step_seconds: Optional[float]
    predicted_theta: float
    n_candidates: int = 0


def compute_budget(history_survival: np.ndarray, table: SpsTable) -> BudgetDecision:
    """SGLang's ``compute_verify_token_budget`` on a [N, gamma] lagged-survival matrix.

    The one budget rule: the engine schedules with it and ``estimators.planner`` audits
    recorded budgets with it. 1-D tables score ``tau * SPS`` (not ``tau / (1 / SPS)``) so
    that argmax ties break as in SGLang.
    """
    n = int(history_survival.shape[0])
    cands = history_survival.reshape(-1)
    cands = cands[cands >= SURVIVAL_EPS].astype(np.float64)
    cands = -np.sort(-cands)
    tau = n + np.concatenate([[0.0], np.cumsum(cands)])
    m = np.arange(tau.size, dtype=np.float64)
    if isinstance(table, SpsTableAdditive):
        st = table.step_seconds(n, m)
        theta = tau / st
        i = int(np.argmax(theta))
        return BudgetDecision(i, float(st[i]), float(theta[i]), int(cands.size))
    sps = table.lookup(n + m)
    theta = tau * sps
    i = int(np.argmax(theta))
    return BudgetDecision(i, (1.0 / float(sps[i])) if sps[i] > 0 else None, float(theta[i]), int(cands.size))


def allocate(current_survival: np.ndarray, budget: int) -> np.ndarray:
    """Selected drafts per request (the window); ``verify_len = 1 + window``."""
    n, g = current_survival.shape
    flat = current_survival.reshape(-1).astype(np.float64)
    pos = np.tile(np.arange(g), n)
    req = np.repeat(np.arange(n), g)
    valid = flat >= SURVIVAL_EPS
    order = np.lexsort((req[valid], pos[valid], -flat[valid]))
    take = order[: max(0, min(int(budget), order.size))]
    return np.bincount(req[valid][take], minlength=n).astype(np.int64)


class LaggedSurvival:
    """Per-request ring of past survival vectors; emulates SGLang's confidence relay lag.

    ``lagged()`` returns the survival of the block drafted ``lag_steps`` decode steps
    before the current one, or all ones for a request younger than that (SGLang's
    generation check makes new or reused slots 'certain').
    """

    def __init__(self, gamma: int, lag_steps: int = DEFAULT_LAG_STEPS):
        self.gamma = gamma
        self.lag_steps = max(int(lag_steps), 1)
        self._hist: dict[str, deque] = {}
        self._ones = np.ones(gamma, dtype=np.float32)

    def lagged(self, rids: list[str]) -> np.ndarray:
        out = np.empty((len(rids), self.gamma), dtype=np.float32)
        for i, rid in enumerate(rids):
            h = self._hist.get(rid)
            out[i] = h[0] if h is not None and len(h) == self.lag_steps else self._ones
        return out

    def push(self, rids: list[str], survival: np.ndarray) -> None:
        for i, rid in enumerate(rids):
            h = self._hist.get(rid)
            if h is None:
                h = self._hist[rid] = deque(maxlen=self.lag_steps)
            h.append(survival[i])

    def drop(self, rid: str) -> None:
        self._hist.pop(rid, None)


@dataclass
class Schedule:
    windows: np.ndarray  # [N] verified drafts
    budget: Optional[int]
    predicted_step_seconds: Optional[float]
    predicted_theta: Optional[float]


def schedule_step(
    current_survival: np.ndarray,
    lagged_survival: np.ndarray,
    table: SpsTable,
    warm: bool,
) -> Schedule:
    """Budget from the lagged survival, allocation from the current one.

    ``warm`` is False for the first ``lag_steps`` decode steps of a run, when SGLang's relay
    has no snapshot yet: budget None and a full (uniform) layout. An uninitialised SPS table
    (<= 1 probe) also degenerates to verify-all, as in SGLang.
    """
    n, g = current_survival.shape
    if not warm or getattr(table, "uninitialized", False):
        return Schedule(np.full(n, g, dtype=np.int64), None, None, None)
    d = compute_budget(lagged_survival, table)
    return Schedule(allocate(current_survival, d.budget), d.budget, d.predicted_step_seconds, d.predicted_theta)
