"""Planner audit: rebuild the lagged survival the budget came from, recompute theta(M) and the budget.

SGLang sizes the verify budget from the confidence of ``lag_steps`` decode steps earlier
(the relay ring; reference §7), with fresh requests at survival 1, then takes the global
argmax of ``theta(M) = (N + sum of the M largest survivals) / step_time(N, N + M)``
(additive table; 1-D: ``tau * SPS_floor(N + M)``; reference §4.3). The lagged survival is
not recorded, so this module rebuilds it from the same rid's survival ``lag_steps`` decode
records back (the latest record at or before that step; none -> ones), recomputes the
budget with an SPS table, and audits it against the recorded ``budget`` /
``predicted_theta`` / ``predicted_step_ms``. It also counts trimming and what it saved:
verify tokens not scheduled vs accepted drafts lost (``ceiling - correct_drafts``, exact
with a ceiling, else the tail estimate), and the optimism of fresh requests.

Example (the budget rule on a hand case: one request, survivals 0.9 and 0.5, a table where
each extra token costs 10% of the base step)::

    >>> import numpy as np
    >>> from acceptscope.domain.sps import SpsTableAdditive
    >>> from acceptscope.estimators.planner import budget_rule
    >>> t = SpsTableAdditive(1.0, [1, 2], [0.0, 0.0], [1, 3], [0.0, 0.2])
    >>> budget_rule(np.array([[0.9, 0.5]]), t)["budget"]   # theta: 1/1, 1.9/1.1, 2.4/1.2
    2
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from acceptscope.domain.scheduler import compute_budget
from acceptscope.domain.sps import SpsTable
from acceptscope.estimators.bootstrap import group_codes
from acceptscope.estimators.frame import BlockFrame

def budget_rule(S_lag: np.ndarray, table: SpsTable) -> dict:
    """SGLang's ``compute_verify_token_budget`` on an ``(N, G)`` lagged-survival matrix (the engine's rule)."""
    d = compute_budget(np.asarray(S_lag), table)
    step_ms = d.predicted_step_seconds * 1e3 if d.predicted_step_seconds is not None else float("inf")
    return dict(budget=d.budget, predicted_theta=d.predicted_theta, predicted_step_ms=step_ms,
                n_candidates=d.n_candidates)


def lagged_survival(frame: BlockFrame, steps: pd.DataFrame | None = None, default_lag: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """Per request-step, the same rid's survival ``lag`` decode steps back (ones when fresh).

    Returns ``(S_lag (n, G), fresh (n,))``. Decode-step ordinals come from the ``steps`` table
    of each (run, rank, epoch) when given, else from the request-steps' forward_ct values."""
    df = frame.df
    key = ["run_id", "rank", "epoch"]
    if steps is not None and len(steps):
        st = steps[key + ["forward_ct", "lag_steps"]].copy()
    else:
        st = df[key + ["forward_ct"]].drop_duplicates().copy()
        st["lag_steps"] = np.nan
    st = st.sort_values(key + ["forward_ct"])
    st["ord"] = st.groupby(key).cumcount()
    st["lag"] = st["lag_steps"].fillna(default_lag).clip(lower=1).astype(np.int64)
    m = df[key + ["forward_ct"]].reset_index().merge(st, on=key + ["forward_ct"], how="left").sort_values("index")
    ord_ = m["ord"].to_numpy()
    lag = m["lag"].fillna(default_lag).to_numpy(np.int64)
    surv = np.where(np.isnan(frame.confidence), np.nan, np.cumprod(np.nan_to_num(frame.confidence, nan=1.0), 1))
    # rows are sorted by request then step: find, per row, the latest earlier row of the same
    # request whose ordinal <= ord - lag
    req = frame.request
    target = ord_ - lag
    G = frame.gamma
    out = np.ones((frame.n, G))
    fresh = np.ones(frame.n, bool)
    okord = ~np.isnan(ord_)
    comp = np.where(okord, req * 10_000_000 + np.nan_to_num(ord_, nan=-1), -1)
    tq = np.where(okord, req * 10_000_000 + np.nan_to_num(target, nan=-1), -1)
    # comp is non-decreasing within each request (rows sorted by step); search the latest <= tq
    pos = np.searchsorted(comp, tq, side="right") - 1
    hit = (pos >= 0) & okord
    hit &= req[np.clip(pos, 0, None)] == req
    hit &= comp[np.clip(pos, 0, None)] <= tq
    idx = np.flatnonzero(hit)
    out[idx] = np.nan_to_num(surv[pos[idx]], nan=1.0)
    fresh[idx] = False
    return out, fresh


@dataclass
class PlannerAudit:
    per_step: pd.DataFrame
    summary: dict
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(summary=self.summary, notes=self.notes)


def audit(request_steps, steps: pd.DataFrame, table: SpsTable, ceiling_estimate: np.ndarray | None = None,
          gamma: int | None = None) -> PlannerAudit:
    """Recompute every recorded step's budget and count trimming (see module docstring).

    ``ceiling_estimate``: per-request-step ceiling (frame order) for runs without truth."""
    frame = request_steps if isinstance(request_steps, BlockFrame) else BlockFrame.from_request_steps(request_steps, gamma)
    G = frame.gamma
    S_lag, fresh = lagged_survival(frame, steps)
    df = frame.df
    key = ["run_id", "rank", "epoch", "forward_ct"]
    codes, uniq = group_codes(df, key)  # integer codes per decode step (no per-row string join)
    order = np.argsort(codes, kind="stable")
    bounds = np.searchsorted(codes[order], np.arange(len(uniq) + 1))
    surv_now = np.cumprod(np.nan_to_num(frame.confidence, nan=1.0), 1)
    rows = []
    for i in range(len(uniq)):
        r = order[bounds[i]:bounds[i + 1]]
        b = budget_rule(S_lag[r], table)
        w = frame.window[r]
        sched = len(r) + float(np.where(np.arange(G)[None, :] < w[:, None], surv_now[r], 0).sum())
        rows.append(dict(run_id=df.run_id.iat[r[0]], rank=df["rank"].iat[r[0]], epoch=df.epoch.iat[r[0]],
                         forward_ct=df.forward_ct.iat[r[0]], n_rows=len(r), fresh_rows=int(fresh[r].sum()),
                         recomputed_budget=b["budget"], recomputed_theta=b["predicted_theta"],
                         recomputed_step_ms=b["predicted_step_ms"], scheduled_window_tokens=int(w.sum()),
                         expected_committed_scheduled=sched, committed=int((frame.correct[r] + 1).sum()),
                         trimmed_rows=int((w < G).sum())))
    ps = pd.DataFrame(rows)
    if len(steps):
        cols = [c for c in ("bs", "budget", "predicted_theta", "predicted_step_ms", "step_cpu_ms", "step_gpu_ms",
                            "num_verify_tokens", "lag_steps") if c in steps]
        ps = ps.merge(steps[key + cols], on=key, how="left")
    has_b = ps["budget"].notna() if "budget" in ps else pd.Series(False, index=ps.index)
    ceil = frame.ceiling.astype(float) if frame.has_truth.all() else (
        None if ceiling_estimate is None else np.asarray(ceiling_estimate, float))
    saved = float((G - frame.window).sum())
    summary = dict(
        steps=int(len(ps)), steps_with_recorded_budget=int(has_b.sum()),
        budget_exact_match_rate=float((ps.loc[has_b, "budget"] == ps.loc[has_b, "recomputed_budget"]).mean()) if has_b.any() else None,
        budget_mae=float((ps.loc[has_b, "budget"] - ps.loc[has_b, "recomputed_budget"]).abs().mean()) if has_b.any() else None,
        predicted_theta_median_rel_err=float(((ps.loc[has_b, "predicted_theta"] - ps.loc[has_b, "recomputed_theta"]).abs()
                                              / ps.loc[has_b, "predicted_theta"]).median()) if has_b.any() and "predicted_theta" in ps else None,
        steps_with_trimming=int((ps.trimmed_rows > 0).sum()),
        request_steps=int(frame.n), trimmed_request_steps=int((frame.window < G).sum()),
        fresh_request_steps=int(fresh.sum()),
        verify_tokens_saved=saved,
        accepted_drafts_lost=None if ceil is None else float((ceil - frame.correct).sum()),
        accepted_drafts_lost_source="ceiling" if frame.has_truth.all() else ("tail estimate" if ceil is not None else None),
        expected_committed_scheduled=float(ps.expected_committed_scheduled.sum()), committed=int(ps.committed.sum()),
    )
    if ceil is not None:
        summary["lost_per_saved_token"] = summary["accepted_drafts_lost"] / max(saved, 1.0)
    notes = [f"lag from steps.lag_steps (default 2); SPS table kind: {table.kind}"]
    return PlannerAudit(per_step=ps, summary=summary, notes=notes)
