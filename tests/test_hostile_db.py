"""Read commands never write, and a corrupt database is one line and exit 2 (issue 11)."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.ingest import ingest_paths
from acceptscope.store import Store
from bench.support.corrupt_db import KINDS, corrupt

FX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"


@pytest.fixture(scope="module")
def real_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("real") / "real.duckdb"
    ingest_paths([FX / "capacc.server_info.json"], Store(db), progress=False)
    return db


@pytest.mark.parametrize("cmd", ["estimate", "report"])
@pytest.mark.parametrize("kind", KINDS)
def test_corrupt_database_is_one_line_and_exit_2(real_db, tmp_path, kind, cmd):
    db = corrupt(kind, real_db, tmp_path / f"{kind}.duckdb")
    args = [cmd, "--db", str(db)] + (["--out", str(tmp_path / "r.html"), "--no-estimators"] if cmd == "report" else [])
    r = CliRunner().invoke(app, args, env={"COLUMNS": "80"})
    assert r.exit_code == 2, r.output
    assert "Traceback" not in r.output and len(r.output.strip().splitlines()) == 1, r.output
    assert str(db) in r.output


def test_estimate_on_a_foreign_duckdb_creates_nothing(tmp_path):
    db = tmp_path / "foreign.duckdb"
    con = duckdb.connect(str(db))
    con.execute("CREATE TABLE mine (x INTEGER)")
    con.close()
    r = CliRunner().invoke(app, ["estimate", "--db", str(db)], env={"COLUMNS": "80"})
    assert r.exit_code == 2 and "not an acceptscope store" in r.output
    con = duckdb.connect(str(db), read_only=True)
    assert [t for (t,) in con.execute("SELECT table_name FROM duckdb_tables()").fetchall()] == ["mine"]
    con.close()


def test_estimate_opens_the_store_read_only(real_db, tmp_path):
    db = tmp_path / "ro.duckdb"
    shutil.copy(real_db, db)
    before = db.read_bytes()
    r = CliRunner().invoke(app, ["estimate", "--db", str(db), "--json", "--n-boot", "10"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert db.read_bytes() == before and not Path(str(db) + ".wal").exists()  # not one byte written


def test_killed_run_is_reported_incomplete(real_db, tmp_path):
    """issue 11: a run killed at 40% looked finished. A run without the completion mark is warned about
    (exit 0) and carries complete: false; an ingest that finishes marks its runs complete."""
    db = tmp_path / "k.duckdb"
    shutil.copy(real_db, db)
    store = Store(db)
    assert store.incomplete_runs() == []  # the ingest that wrote it finished
    with store.connect() as con:  # what a SIGKILL leaves: rows written, no completion mark
        con.execute("UPDATE runs SET completed_at = NULL")
    (rid,) = store.incomplete_runs()
    r = CliRunner().invoke(app, ["estimate", "--db", str(db), "--json", "--n-boot", "10"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    assert f"warning: run {rid} is incomplete" in " ".join(r.output.split())
    d = __import__("json").loads(r.stdout[r.stdout.index("{"):])
    assert d[rid]["complete"] is False
    r = CliRunner().invoke(app, ["report", "--db", str(db), "--out", str(tmp_path / "r.html"), "--json",
                                 "--no-estimators"], env={"COLUMNS": "80"})
    assert r.exit_code == 0, r.output
    d = __import__("json").loads(r.stdout[r.stdout.index("{"):])
    assert d["headline"]["complete"] == {rid: False}
    assert any(f["area"] == "runs" and "is incomplete" in f["text"] for f in d["findings"])


def test_file_from_before_the_mark_is_migrated_and_not_misreported(real_db, tmp_path):
    db = tmp_path / "old.duckdb"
    shutil.copy(real_db, db)
    con = duckdb.connect(str(db))
    con.execute("ALTER TABLE runs DROP COLUMN completed_at")  # a file written before the column existed
    con.close()
    assert Store(db, read_only=True).incomplete_runs() == []  # unknown, not "incomplete"
    store = Store(db)  # a writer adds the column, then marks what it finishes
    assert len(store.incomplete_runs()) == 1
    store.mark_complete(store.runs().run_id.tolist())
    assert store.incomplete_runs() == []


def test_truncated_file_that_duckdb_still_opens_is_refused(real_db, tmp_path):
    """DuckDB reads blocks lazily: a copy cut to a third can open and answer from the blocks that
    survived. The store compares the file's length with the blocks its header counts."""
    db = corrupt("truncated", real_db, tmp_path / "cut.duckdb")
    try:
        con = duckdb.connect(str(db), read_only=True)
        opens = con.execute("SELECT count(*) FROM request_steps").fetchone()[0] > 0
        con.close()
    except duckdb.Error:
        opens = False  # this cut already fails inside DuckDB; the store must still refuse it
    with pytest.raises(ValueError, match="truncated DuckDB file") if opens else pytest.raises((ValueError, duckdb.Error)):
        Store(db, read_only=True)
    Store(real_db, read_only=True)  # the whole file opens
