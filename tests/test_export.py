"""Parquet export: hive layout, DuckDB and pyarrow round trips equal the store, re-export, CLI."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pyarrow as pa
import pytest
from typer.testing import CliRunner

from acceptscope import schema
from acceptscope.cli import app
from acceptscope.export import duckdb_source, export_parquet, exportable_tables, read_export
from acceptscope.store import Store
from bench.support import synthetic as H
from tests._close import assert_close


def _sorted(t: pa.Table, name: str) -> pa.Table:
    return t.sort_by([(k, "ascending") for k in schema.table(name).key])


@pytest.fixture(scope="module")
def filled(tmp_path_factory) -> Store:
    s = Store(tmp_path_factory.mktemp("exp") / "e.duckdb")
    s.append({
        "runs": [H.run_row("run-a"), dict(H.run_row("0042", arm="cap-accept"), config_json='{"x": 1}')],
        "request_steps": H.request_steps(1200, run_id="run-a", ranks=2),
        "steps": H.steps(40, run_id="run-a") + H.steps(20, run_id="0042", ranks=1),
        "requests": [{"run_id": "0042", "rid": f"r{i}", "output_tokens": list(range(i)), "latency_s": 0.5 * i}
                     for i in range(5)],
        "rejects": [{"source": "f.jsonl", "line": 3, "field": "x", "reason": "bad"},
                    {"source": "f.jsonl", "line": 4, "field": "y", "reason": "bad", "run_id": "run-a"}],
    })
    return s


def test_all_tables_round_trip_through_pyarrow_and_duckdb(filled: Store, tmp_path: Path) -> None:
    out = tmp_path / "pq"
    summary = export_parquet(filled, None, out)
    assert summary["tables"]["request_steps"] == 1200 and summary["tables"]["rejects"] == 2
    assert sorted(summary["runs"]) == ["0042", "run-a"]
    # hive layout: run_id, and rank for the per-step tables
    assert list((out / "request_steps").glob("run_id=run-a/rank=*/part-*.parquet"))
    assert {p.name for p in (out / "request_steps" / "run_id=run-a").iterdir()} == {"rank=0", "rank=1"}
    assert (out / "runs" / "run_id=0042").is_dir()
    con = duckdb.connect()
    for t in exportable_tables():
        src = filled.read_arrow(t.name)
        via_arrow = read_export(out, t.name)
        assert_close(_sorted(via_arrow, t.name), _sorted(src, t.name), where=str(t.name))
        if not src.num_rows:
            continue
        cols = ", ".join(f'"{c}"' for c in t.names)
        via_duck = con.sql(f"SELECT {cols} FROM {duckdb_source(out, t.name)}").to_arrow_table()
        assert_close(_sorted(via_duck.cast(t.arrow_schema), t.name), _sorted(src, t.name), where=str(t.name))
    # the plain DuckDB idiom works too (run ids that look numeric need hive_types, see duckdb_source)
    n, conf = con.execute(
        f"SELECT count(*), sum(list_sum(confidence)) FROM read_parquet('{out}/request_steps/**/*.parquet', "
        "hive_partitioning = true) WHERE run_id = 'run-a' AND rank = 1"
    ).fetchone()
    want = filled.query_df("SELECT count(*) AS n, sum(list_sum(confidence)) AS c FROM request_steps WHERE rank = 1")
    assert n == want["n"][0] and conf == pytest.approx(want["c"][0], rel=1e-6)
    # pandas via pyarrow.dataset
    df = read_export(out, "requests", run_ids=["0042"]).to_pandas()
    assert list(df.sort_values("rid")["output_tokens"].map(len)) == [0, 1, 2, 3, 4]
    assert (out / "_acceptscope_export.json").exists()


def test_one_run_and_reexport_replaces(filled: Store, tmp_path: Path) -> None:
    out = tmp_path / "pq"
    export_parquet(filled, ["0042"], out)
    assert not (out / "request_steps").exists() or not list((out / "request_steps").glob("run_id=run-a"))
    assert read_export(out, "steps").num_rows == 20
    assert read_export(out, "rejects").num_rows == 0  # the NULL-run reject only goes with --all
    filled.append({"steps": H.steps(5, run_id="0042", ranks=1, start_forward_ct=20)})
    export_parquet(filled, ["0042"], out)
    export_parquet(filled, ["0042"], out)
    assert read_export(out, "steps").num_rows == 25  # replaced, not appended
    with pytest.raises(KeyError, match="not in"):
        export_parquet(filled, ["nope"], out)


def test_cli_export(filled: Store, tmp_path: Path) -> None:
    runner = CliRunner()
    out = tmp_path / "cli"
    r = runner.invoke(app, ["export", "run-a", "--parquet", str(out), "--db", str(filled.path), "--json"])
    assert r.exit_code == 0, r.output
    summary = json.loads(r.stdout)
    assert summary["runs"] == ["run-a"] and summary["tables"]["request_steps"] == 1200
    r = runner.invoke(app, ["export", "--all", "--parquet", str(out), "--db", str(filled.path),
                            "--table", "steps", "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.stdout)["tables"] == {"steps": filled.counts()["steps"]}
    assert runner.invoke(app, ["export", "--parquet", str(out), "--db", str(filled.path)]).exit_code == 2
    assert runner.invoke(app, ["export", "zzz", "--parquet", str(out), "--db", str(filled.path)]).exit_code == 3
    assert runner.invoke(app, ["export", "--all", "--parquet", str(out), "--db", str(tmp_path / "no.db")]).exit_code == 2
    assert "Example" in runner.invoke(app, ["export", "--help"]).output
