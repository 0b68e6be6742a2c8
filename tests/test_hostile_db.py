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

FX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"


@pytest.fixture(scope="module")
def real_db(tmp_path_factory) -> Path:
    db = tmp_path_factory.mktemp("real") / "real.duckdb"
    ingest_paths([FX / "capacc.server_info.json"], Store(db), progress=False)
    return db


def _corrupt(kind: str, real: Path, out: Path) -> Path:
    data = real.read_bytes()
    if kind == "random":
        out.write_bytes(bytes((i * 7919 + 13) % 256 for i in range(100_000)))
    elif kind == "tiny":
        out.write_bytes(b"DUCK")
    elif kind == "jsonl":
        out.write_bytes((FX / "capacc.estimator.jsonl").read_bytes())
    elif kind == "truncated":
        out.write_bytes(data[: len(data) // 3])
    elif kind == "zeroed-middle":
        mid = len(data) // 2
        out.write_bytes(data[:4096] + b"\0" * (mid - 4096) + data[mid:])
    return out


@pytest.mark.parametrize("cmd", ["estimate", "report"])
@pytest.mark.parametrize("kind", ["random", "tiny", "jsonl", "truncated", "zeroed-middle"])
def test_corrupt_database_is_one_line_and_exit_2(real_db, tmp_path, kind, cmd):
    db = _corrupt(kind, real_db, tmp_path / f"{kind}.duckdb")
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
