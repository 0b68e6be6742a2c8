"""What a run is for (``runs.role``), decided in one place for every writer, reader and old file.

Why (issue 31): an audit stored its STS calibration split as arm ``cap-accept``, so code and users that
picked "the cap-accept run" got the calibration split instead of the audit arm, and the throughput-curve
runs looked like production arms. A role says it: ``production`` (a served arm), ``audit`` (the cap-accept
arm that replays production with the ceiling observed), ``calibration`` (an audit's STS calibration split)
or ``curve`` (a point of an audit's throughput curve).
"""

from __future__ import annotations

import pandas as pd

ROLES = ("production", "audit", "calibration", "curve")

# run_role in SQL over the runs table: fills runs.role of a file written before schema version 7
ROLE_SQL = ("CASE WHEN audit_group LIKE '%/calibration' THEN 'calibration' WHEN audit_group LIKE '%/curve' "
            "THEN 'curve' WHEN arm = 'cap-accept' THEN 'audit' ELSE 'production' END")


def run_role(arm: str | None, audit_group: str | None = None) -> str:
    """The role of a run from what every writer knows: an audit puts its STS calibration split in audit group
    ``<group>/calibration`` and its curve points in ``<group>/curve``; otherwise cap-accept is the audit arm
    and every other arm is production (an SGLang server of any other verify mode included)."""
    g = audit_group or ""
    if g.endswith("/calibration"):
        return "calibration"
    if g.endswith("/curve"):
        return "curve"
    return "audit" if arm == "cap-accept" else "production"


def with_roles(runs: pd.DataFrame) -> pd.DataFrame:
    """``runs`` with every ``role`` set (a file not yet migrated, or a writer that left it NULL: run_role)."""
    if runs.empty and "role" in runs.columns:
        return runs
    groups = runs["audit_group"] if "audit_group" in runs else [None] * len(runs)
    derived = [run_role(a, g if isinstance(g, str) else None) for a, g in zip(runs["arm"], groups)]
    have = runs["role"] if "role" in runs.columns else [None] * len(runs)
    return runs.assign(role=[r if isinstance(r, str) else d for r, d in zip(have, derived)])
