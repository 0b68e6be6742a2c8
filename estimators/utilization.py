"""Utilization against the ceiling, window distributions and honest accept rates.

``utilization = committed tokens / uncapped accept length`` with both in accept-length units
(``acc_len = correct + 1`` over ``ceiling + 1``): the share of what a full verify would have
committed that the trimmed schedule actually committed. Exact where the ceiling is recorded
(cap-accept, static); estimated with intervals from the tail estimator elsewhere (compact).
Reported per run, workload, request, batch-size band and draft position.

The *in-window* accept rate is ``sum(correct_drafts) / sum(window)``: what fraction of the
drafts the scheduler chose to verify were accepted. SGLang's ``spec_accept_rate`` divides by
``verify_ct * gamma`` (the fixed-gamma denominator, reference §8) and is shown next to it for
contrast: under trimming it understates the drafter.

Example::

    >>> from acceptscope.estimators.synthetic import simulate
    >>> from acceptscope.estimators.utilization import utilization
    >>> u = utilization(simulate(n_requests=60, seed=9).tables["request_steps"])
    >>> r = u.by_group[u.by_group.by == "run"].iloc[0]
    >>> bool(0 < r.utilization <= 1 and r.exact and r.in_window_accept_rate >= r.spec_accept_rate)
    True
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.tail import TailResult
from acceptscope.estimators.bands import batch_band


@dataclass
class UtilizationResult:
    by_group: pd.DataFrame
    by_position: pd.DataFrame
    windows: pd.DataFrame  # window histogram per workload
    per_request: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    def to_json(self) -> dict:
        return dict(by_group=self.by_group.to_dict("records"), by_position=self.by_position.to_dict("records"),
                    notes=self.notes)


def utilization(data, tail=None, steps: pd.DataFrame | None = None, gamma: int | None = None,
                n_boot: int = 200, seed: int = 0) -> UtilizationResult:
    """Utilization tables. ``tail``: a :class:`~estimators.tail.TailResult` of the same rows
    (required when the ceiling is not recorded)."""
    frame = data if isinstance(data, BlockFrame) else BlockFrame.from_request_steps(data, gamma=gamma)
    G = frame.gamma
    df = frame.df
    exact = bool(frame.has_truth.all())
    notes = []
    if exact:
        ceil_mean = frame.ceiling.astype(float)
        pmf = np.zeros((frame.n, G + 1))
        pmf[np.arange(frame.n), frame.ceiling] = 1.0
        blocks = None
    else:
        if tail is None:
            raise ValueError("the ceiling is not recorded here: pass a TailResult (tail estimator) for these rows")
        blocks = tail.blocks
        if len(blocks) != frame.n:
            raise ValueError("tail result does not match these request-steps")
        ceil_mean = blocks["mean"].to_numpy()
        pmf = tail.pmf
        notes.append("ceiling estimated by the tail estimator; intervals: bootstrap of the mean ceiling")
    base = pd.DataFrame({"run_id": df.run_id.to_numpy(), "rid": df.rid.to_numpy(),
                         "workload": df["workload"].fillna("all").to_numpy() if "workload" in df else "all",
                         "window": frame.window, "correct": frame.correct, "acc_len": frame.correct + 1,
                         "ceiling": ceil_mean, "forward_ct": df.forward_ct.to_numpy(), "rank": df["rank"].to_numpy(),
                         "epoch": df.epoch.to_numpy()})
    if steps is not None and len(steps):
        base = base.merge(steps[["run_id", "rank", "epoch", "forward_ct", "bs"]], on=["run_id", "rank", "epoch", "forward_ct"], how="left")
        base["band"] = batch_band(base["bs"])
    else:
        base["band"] = batch_band(base.groupby(["run_id", "rank", "epoch", "forward_ct"])["rid"].transform("size"))
        notes.append("batch size taken as the number of request rows per step (no steps table)")
    rows = []
    for by in ("run", "workload", "band"):
        keys = base["run_id"] if by == "run" else base[by].astype(str)
        ci = None
        if not exact:
            tb = tail.blocks.assign(band=base["band"].to_numpy(), workload=base["workload"].to_numpy())
            tr = TailResult(blocks=tb, pmf=tail.pmf, gamma=G, levels=tail.levels, hazard_info={}, _boot=tail._boot)
            ci = tr.aggregate(by=None if by == "run" else [by], level=0.95, n_boot=n_boot, seed=seed)
            ci = ci.set_index("group" if by == "run" else by)
        for g, sub in base.groupby(keys):
            com, ce = sub.acc_len.sum(), (sub.ceiling + 1).sum()
            r = dict(by=by, group=str(g), n=len(sub), mean_window=float(sub.window.mean()),
                     committed=int(com), ceiling_tokens=float(ce), utilization=float(com / ce), exact=exact,
                     in_window_accept_rate=float(sub.correct.sum() / max(sub.window.sum(), 1)),
                     spec_accept_rate=float(sub.correct.sum() / (len(sub) * G)))
            if ci is not None:
                key = "all" if by == "run" else str(g)
                if by == "run" and base.run_id.nunique() > 1:
                    key = "all"
                if key in ci.index:
                    lo, hi = ci.loc[key, "lo"], ci.loc[key, "hi"]
                    r["util_lo"], r["util_hi"] = float(com / (len(sub) * (hi + 1))), float(com / (len(sub) * (lo + 1)))
            else:
                r["util_lo"] = r["util_hi"] = r["utilization"]
            rows.append(r)
    by_group = pd.DataFrame(rows)
    # per position: verified-and-accepted vs would-be-accepted (P(K > k) from the predictive pmf)
    k = np.arange(G)
    reach = 1 - np.cumsum(pmf, 1)[:, :G]  # P(K > k)
    acc_k = (k[None, :] < frame.correct[:, None]).sum(0)
    by_pos = pd.DataFrame({"position": k, "accepted": acc_k, "ceiling_reached": reach.sum(0),
                           "verified": (k[None, :] < frame.window[:, None]).sum(0)})
    by_pos["utilization"] = by_pos.accepted / by_pos.ceiling_reached.clip(lower=1e-12)
    win = base.groupby(["workload", "window"]).size().rename("count").reset_index()
    win["share"] = win["count"] / win.groupby("workload")["count"].transform("sum")
    per_req = base.groupby(["run_id", "rid"]).agg(n=("acc_len", "size"), committed=("acc_len", "sum"),
                                                  ceiling_tokens=("ceiling", lambda s: float((s + 1).sum())),
                                                  mean_window=("window", "mean")).reset_index()
    per_req["utilization"] = per_req.committed / per_req.ceiling_tokens
    return UtilizationResult(by_group=by_group, by_position=by_pos, windows=win, per_request=per_req, notes=notes)
