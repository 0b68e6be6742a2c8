"""The AUROC interval's normal limit against the bootstrap it stands for, on a store's recorded run.

``estimate``'s held-out STS comparison gives a position with ``AUROC_NORMAL_CLUSTERS`` requests or more the
interval ``auroc +- z sd``, ``sd`` the first-order spread of the request-clustered Poisson bootstrap
(``_Prepared.auroc_sd``). This scores the run's held-out split as ``estimate`` does (the realized label,
the identity temperatures) and prints, per position, the width of that interval beside the widths of the
basic bootstrap intervals of ``--replicates`` exact pair-count replicates and of 200 (what the comparison
used before), with the ends' distance to the many-replicate interval's.

Usage::

    .venv/bin/python bench/auroc_limit.py --db /tmp/fleet/single-exact.duckdb --replicates 2000
"""

from __future__ import annotations

import argparse

import numpy as np
import pandas as pd

from acceptscope.estimators import calibration_metrics as cm
from acceptscope.estimators.calibration import calibration_data, survival
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.run_data import read_request_steps
from acceptscope.store import Store


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--db", required=True)
    ap.add_argument("--run", help="a run whose ceiling is recorded (default: the store's biggest)")
    ap.add_argument("--replicates", type=int, default=2000, help="the many-replicate bootstrap's size")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    st = Store(a.db, read_only=True)
    run = a.run or st.query_df("SELECT run_id FROM request_steps GROUP BY run_id HAVING count(ceiling) = count(*) "
                               "ORDER BY count(*) DESC LIMIT 1").run_id.iloc[0]
    gamma = int(st.runs().set_index("run_id").gamma[run])
    _, test = calibration_data(BlockFrame.from_request_steps(read_request_steps(st, run), gamma=gamma)).split(seed=a.seed)
    P = survival(test.z, np.ones(test.z.shape[1]))
    print(f"{run}: {len(P)} held-out rows, {pd.unique(np.asarray(test.groups)).size} requests")
    limit = cm.position_metrics(P, test.y, test.groups, n_boot=200, seed=a.seed)
    normal_from = cm.AUROC_NORMAL_CLUSTERS
    cm.AUROC_NORMAL_CLUSTERS = 1 << 62  # every position takes the pair-count bootstrap
    try:
        boot = {n: cm.position_metrics(P, test.y, test.groups, n_boot=n, seed=a.seed) for n in (200, a.replicates)}
    finally:
        cm.AUROC_NORMAL_CLUSTERS = normal_from
    many = boot[a.replicates]
    print(f"{'pos':>3} {'limit':>9} {f'boot {a.replicates}':>10} {'boot 200':>9}   widths; ends' largest distance to "
          f"boot {a.replicates}'s (limit, boot 200)")
    for k in range(P.shape[1]):
        w = {name: d.auroc_hi[k] - d.auroc_lo[k] for name, d in (("limit", limit), ("many", many), ("200", boot[200]))}
        off = {name: max(abs(d.auroc_lo[k] - many.auroc_lo[k]), abs(d.auroc_hi[k] - many.auroc_hi[k]))
               for name, d in (("limit", limit), ("200", boot[200]))}
        print(f"{k:3d} {w['limit']:9.5f} {w['many']:10.5f} {w['200']:9.5f}   {off['limit']:.5f} {off['200']:.5f}")

if __name__ == "__main__":
    main()
