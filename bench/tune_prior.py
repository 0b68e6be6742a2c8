"""Choose the unobserved-position prior (``estimators/margin.py``) on the validation grid's *tune* seeds.

For every tune configuration of ``bench/paired_grid.py`` (compact alone, its truth from the cap-accept
run of the same seed), the compact run's tail hazards are fitted as production fits them (the run's own
observed outcomes) and its mean ceiling is computed under a range of logit shifts of the hazards the
walk could not follow. The shift at which the estimate meets the truth is that configuration's
*needed* shift. The prior's center is their median and its half-width the largest distance from it,
rounded up to a quarter logit: every tune configuration's truth then lies inside the band's point
range (sampling noise widens the interval beyond that). Scoring seeds are never read here.

A configuration whose truth lies outside what any shift in ``SHIFTS`` reaches informs no shift (its miss
is not the unobserved positions'; it is listed with its distance to the reachable range, not clipped to
the grid's end), and neither does one whose estimate hardly moves (``INSENSITIVE``). The shipped
constants (``estimators/margin.py``) are printed beside the derived ones, with whether their band holds
every informative configuration's needed shift.

Usage::

    .venv/bin/python bench/paired_grid.py generate --split tune --n 12 --volume 0 --workdir /tmp/grid-tune
    .venv/bin/python bench/tune_prior.py --workdir /tmp/grid-tune
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the grid's modules, as bench/paired_grid.py imports them

from acceptscope.estimators.chunks import read_sample  # noqa: E402
from acceptscope.estimators.frame import BlockFrame  # noqa: E402
from acceptscope.estimators.margin import PRIOR_CENTER, PRIOR_HALF_WIDTH, UnobservedPrior  # noqa: E402
from acceptscope.estimators.tail import TailEstimator  # noqa: E402
from acceptscope.store import Store  # noqa: E402
import paired_grid_report as rep  # noqa: E402
from paired_grid import EOS_TOKEN_IDS  # noqa: E402

SHIFTS = np.arange(-5.0, 2.01, 0.25)
INSENSITIVE = 0.02  # drafts: a run whose mean ceiling moves less than this over every shift does not inform the prior


def needed_shift(run_dir: Path, fit_rows: int = 1 << 18) -> dict:
    """Mean ceiling of the compact run under each shift, and the shift that meets the truth."""
    truth = rep.paired_truth(str(run_dir / "compact.duckdb"), str(run_dir / "truth.duckdb"), eos=EOS_TOKEN_IDS)
    st = Store(run_dir / "compact.duckdb", read_only=True)
    gamma = int(st.runs().gamma.iloc[0])
    frame = BlockFrame.from_request_steps(read_sample(st, ["c"], fit_rows), gamma=gamma)
    est = TailEstimator().fit(frame)
    if est.prior_ is None:  # fitted on truth, or too little censoring: nothing to tune
        return {"truth": truth["mean_ceiling"], "needed": None}
    means = []
    for d in SHIFTS:
        est.prior_ = UnobservedPrior(center=float(d), half_width=0.0)
        means.append(float(est.estimate(frame).blocks["mean"].mean()))
    means = np.asarray(means)  # increasing in the shift
    t = truth["mean_ceiling"]
    out = {"truth": t, "unshifted": float(means[np.searchsorted(SHIFTS, 0.0)]), "span": float(means[-1] - means[0])}
    if out["span"] < INSENSITIVE:  # hardly any block left to the model: any shift meets the truth as well
        return {**out, "needed": None}
    if not means[0] <= t <= means[-1]:  # no shift meets it: the gap to the nearest reachable mean, in drafts
        return {**out, "needed": None, "beyond": float(t - (means[0] if t < means[0] else means[-1]))}
    return {**out, "needed": float(np.interp(t, means, SHIFTS))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workdir", type=Path, required=True)
    a = ap.parse_args()
    rows = []
    for meta_path in sorted((a.workdir / "runs").glob("*/meta.json")):
        meta = json.loads(meta_path.read_text())
        c = meta["config"]
        if c.get("split") != "tune":
            continue
        r = needed_shift(meta_path.parent)
        r.update(workload=c["workload"], temperature=c["temperature"], batch=c["batch"], seed=c["seed"])
        rows.append(r)
        print(json.dumps(r), flush=True)
    need = np.array([r["needed"] for r in rows if r["needed"] is not None])
    if not need.size:
        sys.exit("no tune configuration had hazards fitted without truth")
    center = float(np.median(need))
    half = math.ceil(float(np.abs(need - center).max()) * 4) / 4
    beyond = [r for r in rows if "beyond" in r]
    print(f"\n{need.size} informative tune configurations of {len(rows)}; needed shifts {np.round(np.sort(need), 2).tolist()}")
    for r in beyond:
        print(f"beyond every shift: {r['workload']} T{r['temperature']} b{r['batch']} seed {r['seed']}: the truth "
              f"{r['beyond']:+.3f} drafts past the reachable mean ceiling")
    print(f"derived: PRIOR_CENTER = {center:.2f}; PRIOR_HALF_WIDTH = {half:.2f}")
    lo, hi = PRIOR_CENTER - PRIOR_HALF_WIDTH, PRIOR_CENTER + PRIOR_HALF_WIDTH
    held = int(((need >= lo) & (need <= hi)).sum())
    print(f"shipped: PRIOR_CENTER = {PRIOR_CENTER:.2f}; PRIOR_HALF_WIDTH = {PRIOR_HALF_WIDTH:.2f}: its band "
          f"[{lo:.2f}, {hi:.2f}] holds {held} of {need.size} needed shifts")


if __name__ == "__main__":
    main()
