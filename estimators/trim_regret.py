"""Trim regret with its interval: TensorRT-LLM's model-free rate, and the part of it known to be real.

Why: TensorRT-LLM's ``DSparkRaggedStats.trim_regret_rate`` (trimmed blocks that accepted their whole
window / trimmed blocks) is "an exact, unbiased count, no model", but a count of a sample: a run of a
few hundred requests gives it with an error nobody states. And a block that accepted its whole window
only *might* have lost a token to trimming: its first trimmed draft could still have been rejected.
That first draft's outcome is in the telemetry (:func:`estimators.tail.walk` reads it from the
committed stream, ``_first_from_bonus`` from the capped bonus token; a recorded ceiling holds it in
cap-accept and static runs), so the regret that is known to be real is a count too. Both rates, per
run and per workload:

* ``trim_regret_rate``: regret blocks (``correct == window < gamma``) / trimmed blocks (``window < gamma``);
* ``first_accepted_rate``: trimmed blocks whose first trimmed draft would have been accepted / trimmed
  blocks (a lower bound where that outcome is unknown; ``first_accepted_bound_hi`` counts every unknown
  one as accepted: the two ends are what the data identify, with no model).

Intervals: 95% request-clustered bootstrap of the ratio, keyed Poisson(1) weights
(:func:`estimators.bootstrap.cluster_weights`) summed per replicate chunk by chunk. The weights and the
counts are integers, so the replicate sums are exact in float64 and add up to the same numbers in any
chunking, executor or merge order. The ``first_accepted`` interval runs from the lower end of the known
rate's interval to the upper end of the identified upper bound's.

Memory: per group (the run, each workload) four counts and ``N_BOOT`` x 4 replicate sums.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from acceptscope.estimators.bootstrap import cluster_weights, replicate_blocks, row_request_keys
from acceptscope.estimators.frame import NO_WORKLOAD
from acceptscope.estimators.registry import Chunk, RunInfo, Skip, register

N_BOOT = 400  # replicates (the tail summary's interval uses as many)
LEVEL = 0.95
STATS = ("trimmed", "regret", "first_accepted", "first_rejected")  # per trimmed block, summed
UNKNOWN = {  # why a regret block's first trimmed draft has no known outcome (estimators.tail._first_from_bonus)
    "no_draft": "the drafts past the window were not recorded (no draft tokens on the row)",
    "no_bonus": "no bonus token recorded and the committed stream ends before the position",
    "no_walk": "the chunk carried no walk bounds",
}


@dataclass
class TrimRegretResult:
    """Trim regret per group (``by`` = run | workload) with its bootstrap interval."""

    by_group: pd.DataFrame
    exact: bool
    n_boot: int
    level: float
    seed: int
    notes: list[str] = field(default_factory=list)
    unknown: dict = field(default_factory=dict)  # the run's regret blocks of unknown first outcome, by reason (UNKNOWN)

    def run_row(self) -> dict:
        return self.by_group[self.by_group["by"] == "run"].iloc[0].to_dict()

    def to_json(self) -> dict:
        summary = {k: v for k, v in self.run_row().items() if k not in ("by", "group")}
        summary.update(first_outcome="recorded ceiling" if self.exact else "walk (committed stream, capped bonus)",
                       n_boot=self.n_boot, level=self.level, seed=self.seed)
        return dict(summary=summary, by_group=self.by_group.to_dict("records"), unknown_by_reason=dict(self.unknown),
                    notes=list(self.notes))


def _ratio(num: np.ndarray, den: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, num / np.where(den > 0, den, 1.0), np.nan)


def _quantile(x: np.ndarray, q: float) -> float | None:
    x = x[np.isfinite(x)]
    return float(np.quantile(x, q)) if x.size else None


@register
class TrimRegret:
    """Sums of the trimmed blocks of a run: counts and keyed-bootstrap replicate sums per group."""

    name = "trim_regret"

    def __init__(self, run: RunInfo):
        self.run_id, self.G, self.exact, self.seed = run.run_id, run.gamma, run.exact, run.seed
        self.counts: dict[tuple[str, str], np.ndarray] = {}  # (by, group) -> the STATS' sums
        self.reps: dict[tuple[str, str], np.ndarray] = {}  # (by, group) -> (N_BOOT, len(STATS)) weighted sums
        self.unknown = dict.fromkeys(UNKNOWN, 0)  # regret blocks whose first outcome is unknown, by reason

    def add(self, chunk: Chunk) -> None:
        frame, b = chunk.frame, chunk.blocks
        idx = np.flatnonzero(frame.window < self.G)
        if not idx.size:
            return
        w = frame.window[idx]
        regret = frame.correct[idx] == w
        if chunk.exact:  # the recorded ceiling: d_w was accepted iff the uncapped verify went past it
            k = frame.ceiling[idx]
            first_acc, first_rej = regret & (k > w), regret & (k == w)
        elif {"bound_lo", "bound_hi"} <= set(b.columns):
            # the walk's identification bounds: above the window iff position w is a known 1, equal to it
            # at the top iff a known 0 (estimators.tail.TailEstimator._censored)
            first_acc = regret & (b["bound_lo"].to_numpy()[idx] > w)
            first_rej = regret & (b["bound_hi"].to_numpy()[idx] == w)
        else:
            first_acc = first_rej = np.zeros(idx.size, bool)
            self.unknown["no_walk"] += int(regret.sum())
        if not chunk.exact and "bound_lo" in b:
            u = np.flatnonzero(regret & ~first_acc & ~first_rej)
            no_draft = frame.draft.reshape(-1).take(idx[u] * self.G + w[u]) < 0
            self.unknown["no_draft"] += int(no_draft.sum())
            self.unknown["no_bonus"] += int((~no_draft).sum())
        X = np.stack([np.ones(idx.size), regret, first_acc, first_rej], 1).astype(float)
        keys = row_request_keys(b["run_id"].take(idx), b["rid"].take(idx))
        if "workload" in b:  # a NULL workload is a group of its own
            gcode, uniq = pd.factorize(b["workload"].take(idx), use_na_sentinel=False)
            glabels = ["None" if pd.isna(v) else str(v) for v in uniq]
        else:
            gcode, glabels = np.zeros(idx.size, np.int64), ["None"]
        groups = [("run", self.run_id)] + [("workload", g) for g in glabels]
        col = np.concatenate([np.zeros(idx.size, np.int64), gcode.astype(np.int64) + 1])  # each row: run + its workload
        kcode, kuniq = pd.factorize(keys)
        kk = np.concatenate([kcode, kcode])
        S, ng, nk = len(STATS), len(groups), len(kuniq)
        XX = np.concatenate([X, X])
        # per-(request, group) sums as a (requests, groups x stats) matrix: the bootstrap is weights @ M
        M = np.zeros((nk, ng * S))
        for j in range(S):
            M[:, j::S] = np.bincount(kk * ng + col, weights=XX[:, j], minlength=nk * ng).reshape(nk, ng)
        reps = np.empty((N_BOOT, ng * S))
        for blk in replicate_blocks(N_BOOT, nk):  # keyed draws: the same weights in any blocking
            W = cluster_weights(np.asarray(kuniq, np.uint64), blk.size, self.seed, start=int(blk[0]))
            # einsum, not W @ M: a BLAS call this small took 30-40 ms under a loaded machine's thread contention
            reps[blk] = np.einsum("rk,kc->rc", W, M, optimize=False)
        tot = M.sum(0)
        for j, g in enumerate(groups):
            cj, rj = tot[j * S:(j + 1) * S], reps[:, j * S:(j + 1) * S]
            if g in self.counts:
                self.counts[g] = self.counts[g] + cj
                self.reps[g] = self.reps[g] + rj
            else:
                self.counts[g], self.reps[g] = cj, rj.copy()

    def merge(self, other: "TrimRegret") -> None:
        for g, c in other.counts.items():
            if g in self.counts:
                self.counts[g] = self.counts[g] + c
                self.reps[g] = self.reps[g] + other.reps[g]
            else:
                self.counts[g], self.reps[g] = c.copy(), other.reps[g].copy()
        for k, v in other.unknown.items():
            self.unknown[k] += v

    def result(self) -> TrimRegretResult:
        run = ("run", self.run_id)
        if run not in self.counts or self.counts[run][0] == 0:
            raise Skip("no trimmed blocks (the window was gamma on every block): trim regret is undefined")
        a = (1 - LEVEL) / 2
        rows = []
        wl = sorted(g for g in self.counts if g[0] == "workload")
        if len(wl) == 1 and wl[0][1] in ("None", NO_WORKLOAD):  # the blocks carry no workload: the run's row says it all
            wl = []
        for g in [run] + wl:
            n_t, n_r, n_a, n_j = (float(x) for x in self.counts[g])
            R = self.reps[g]
            unknown = n_r - n_a - n_j
            rate_b = _ratio(R[:, 1], R[:, 0])
            acc_lo_b, acc_hi_b = _ratio(R[:, 2], R[:, 0]), _ratio(R[:, 1] - R[:, 3], R[:, 0])
            rows.append(dict(by=g[0], group=g[1], n_trimmed=int(n_t), n_regret=int(n_r), n_first_accepted=int(n_a),
                             n_first_rejected=int(n_j), n_first_unknown=int(unknown),
                             trim_regret_rate=n_r / n_t, trim_regret_lo=_quantile(rate_b, a),
                             trim_regret_hi=_quantile(rate_b, 1 - a),
                             first_accepted_rate=n_a / n_t, first_accepted_bound_hi=(n_a + unknown) / n_t,
                             first_accepted_lo=_quantile(acc_lo_b, a), first_accepted_hi=_quantile(acc_hi_b, 1 - a),
                             real_share_of_regret=(n_a / (n_a + n_j)) if n_a + n_j else None))
        notes = ["trim_regret_rate: trimmed blocks that accepted their whole window / trimmed blocks "
                 "(TensorRT-LLM's DSparkRaggedStats, no model); first_accepted_rate: trimmed blocks whose first "
                 "trimmed draft would have been accepted / trimmed blocks (the regret that cost a token)",
                 f"intervals: {LEVEL:.0%} request-clustered bootstrap ({N_BOOT} keyed Poisson(1) replicates, "
                 f"seed {self.seed}): the same in any chunking and executor"]
        r0 = rows[0]
        if self.exact:
            notes.append("the ceiling is recorded on every block: each first trimmed draft's outcome is read from it")
        else:
            notes.append(f"first trimmed draft's outcome known on {r0['n_first_accepted'] + r0['n_first_rejected']} "
                         f"of {r0['n_regret']} regret blocks (the committed stream or the capped bonus token)")
        if r0["n_first_unknown"]:
            why = "; ".join(f"{n}: {UNKNOWN[k]}" for k, n in self.unknown.items() if n)
            notes.append(f"{r0['n_first_unknown']} regret blocks unresolved ({why}): first_accepted_rate counts them as "
                         "rejected (a lower bound), first_accepted_bound_hi as accepted")
        return TrimRegretResult(pd.DataFrame(rows), exact=self.exact, n_boot=N_BOOT, level=LEVEL, seed=self.seed,
                                notes=notes, unknown={k: v for k, v in self.unknown.items() if v})
