"""Runs carry their role (issue 31): production arm, audit arm, calibration split, curve point. One rule
(schema.run_role) in Python and SQL, set by the writers, filled in a file written before schema version 7
on its first read-write open, and used to select runs."""

from __future__ import annotations

import itertools

import duckdb
import pandas as pd
import pytest

from acceptscope import schema
from acceptscope.ingest.server_info_run import run_row_from_server_info
from acceptscope.ingest.synth import make_server_info
from acceptscope.reader import Reader, select_runs
from acceptscope.store import Store

ARMS = (*schema.ARMS, None)
GROUPS = (None, "g", "g/calibration", "g/curve", "calibration", "a/b/curve", "g/curves")


def test_run_role_in_python_and_sql_agree():
    con = duckdb.connect()
    rows = list(itertools.product(ARMS, GROUPS))
    con.execute("CREATE TABLE runs (arm VARCHAR, audit_group VARCHAR)")
    con.executemany("INSERT INTO runs VALUES (?, ?)", rows)
    got = con.execute(f"SELECT arm, audit_group, {schema.ROLE_SQL} FROM runs").fetchall()
    assert len(got) == len(rows)
    for arm, group, role in got:
        assert role == schema.run_role(arm, group), (arm, group)
        assert role in schema.ROLES
    assert schema.run_role("cap-accept", "g/calibration") == "calibration"
    assert schema.run_role("cap-accept", "g") == "audit" and schema.run_role("compact", "g") == "production"


def _runs(store: Store) -> None:
    base = dict(engine="reference", gamma=7, source="live")
    store.append({"runs": [
        dict(run_id="g-compact", arm="compact", audit_group="g", role="production", **base),
        dict(run_id="g-cap-accept", arm="cap-accept", audit_group="g", role="audit", **base),
        dict(run_id="g-calibration", arm="cap-accept", audit_group="g/calibration", role="calibration", **base),
        dict(run_id="g-curve-b8", arm="compact", audit_group="g/curve", role="curve", **base),
    ]})


def test_a_store_from_before_roles_gets_them(tmp_path):
    """Version 6 file (no role column): a read-only open derives each role; the first read-write open
    adds the column and fills it (the calibration split is not the audit arm)."""
    p = tmp_path / "v6.duckdb"
    _runs(Store(p))
    con = duckdb.connect(str(p))
    con.execute("ALTER TABLE runs DROP COLUMN role")
    con.execute(f"UPDATE {schema.STORE_META.name} SET value = '6' WHERE key = 'schema_version'")
    con.close()
    want = {"g-compact": "production", "g-cap-accept": "audit", "g-calibration": "calibration",
            "g-curve-b8": "curve"}
    ro = Store(p, read_only=True).runs()
    assert dict(zip(ro.run_id, ro.role)) == want
    Store(p)  # read-write: migrated
    con = duckdb.connect(str(p), read_only=True)
    assert dict(con.execute("SELECT run_id, role FROM runs").fetchall()) == want
    assert con.execute(f"SELECT value FROM {schema.STORE_META.name} WHERE key = 'schema_version'").fetchone()[0] \
        == str(schema.SCHEMA_VERSION)
    con.close()


def test_select_by_role(tmp_path):
    p = tmp_path / "r.duckdb"
    _runs(Store(p))
    r = Reader(p)
    assert select_runs(r, roles=["audit"]) == ["g-cap-accept"]
    assert sorted(select_runs(r, roles=["production", "audit"])) == ["g-cap-accept", "g-compact"]
    assert select_runs(r, roles=["calibration"]) == ["g-calibration"]
    with pytest.raises(KeyError, match="unknown role"):
        select_runs(r, roles=["bogus"])
    runs = Store(p, read_only=True).runs()
    assert runs.query("role == 'audit'").run_id.iloc[0] == "g-cap-accept"  # the README's snippet


def test_ingested_servers_are_production_unless_cap_accept():
    for mode, role in (("compact", "production"), ("cap-accept", "audit"), ("static", "production")):
        row = run_row_from_server_info("r", make_server_info(mode=mode, n_steps=2, ranks=1))
        assert row["arm"] == mode and row["role"] == role


def test_with_roles_keeps_a_written_role_and_fills_a_missing_one():
    df = pd.DataFrame({"run_id": ["a", "b"], "arm": ["cap-accept", "cap-accept"],
                       "audit_group": ["g", "g/calibration"], "role": ["audit", None]})
    assert schema.with_roles(df).role.tolist() == ["audit", "calibration"]
    assert schema.with_roles(df.drop(columns="role")).role.tolist() == ["audit", "calibration"]
