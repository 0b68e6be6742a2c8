"""Interval health on the user's own data: the production arm's own interval against its audit's truth.

On the shared small real audit (tests/test_audit.py: every request of the compact arm replayed by the
cap-accept arm), the check's run row must be exactly what `estimate` says of the compact run when it is
estimated alone (the same file with the compact run taken out of its audit group), and its truth exactly
the cap-accept arm's recorded mean ceiling.
"""

from __future__ import annotations

import shutil

import duckdb
import pytest

from acceptscope.estimators import run_all, to_jsonable
from acceptscope.run_roles import with_roles
from acceptscope.store import Store
from tests._close import close
from tests.test_audit import build_audit_db


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    return build_audit_db(tmp_path_factory)


def _role(store: Store, role: str) -> str:
    runs = with_roles(store.runs())
    return runs.loc[(runs.role == role) & (runs.arm != "static"), "run_id"].iloc[0]


def test_health_is_the_production_estimate_alone_against_the_audit_truth(audit, tmp_path):
    db, _ = audit
    store = Store(db, read_only=True)
    compact, cap = _role(store, "production"), _role(store, "audit")
    res = to_jsonable(run_all(store, compact))
    h = res["interval_health"]
    assert h["production"] == compact and h["audit"] == cap
    groups = {g["group"]: g for g in h["groups"]}
    run = groups["run"]
    truth = store.query_df("SELECT avg(ceiling) AS t, count(*) AS n FROM request_steps WHERE run_id = ?", [cap])
    assert close(run["truth"], float(truth.t.iloc[0]), rtol=1e-12) and run["n_truth_blocks"] == int(truth.n.iloc[0])
    assert run["covered"] == (run["lo"] <= run["truth"] <= run["hi"])
    assert set(groups) - {"run"} == set(store.query_df(
        "SELECT DISTINCT workload FROM request_steps WHERE run_id = ?", [compact]).workload.astype(str))
    assert f"in {sum(g['covered'] for g in h['groups'])} of {len(h['groups'])} groups" in h["verdict"]

    # the same compact run estimated alone: no audit arm in its group
    alone_db = tmp_path / "alone.duckdb"
    shutil.copy(db, alone_db)
    with duckdb.connect(str(alone_db)) as con:
        con.execute("UPDATE runs SET audit_group = NULL WHERE run_id = ?", [compact])
    alone = to_jsonable(run_all(Store(alone_db, read_only=True), compact))
    assert "interval_health" not in alone
    a = alone["tail"]["aggregate"][0]
    assert close(run["estimate"], a["mean_ceiling"], rtol=1e-9)
    assert close(run["lo"], a["lo"], rtol=1e-9) and close(run["hi"], a["hi"], rtol=1e-9)
