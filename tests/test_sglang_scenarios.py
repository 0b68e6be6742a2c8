"""The SGLang production path end to end, as a user meets it (sglang tier: needs .venv-sglang).

``fixtures/sglang/scenarios.py`` drives SGLang 0.5.23's real recorders (info dumper, block-accept
estimator, STS recorder and fitter, SPS table) on CPU and writes one directory per server,
exactly as the server and a user's poller leave it, with the simulator's truth beside them:
a compact production server, a cap-accept audit server of the same trajectories, a greedy
server, and a mixed-temperature server that served with an STS and an SPS table. Each
directory goes through the CLI: ``ingest DIR`` -> ``estimate --json`` -> ``calibrate`` ->
``report``.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from acceptscope import glossary
from acceptscope.cli import app
from acceptscope.store import Store
from acceptscope.estimators import scenario_validation as sv

ROOT = Path(__file__).resolve().parent.parent
SGLANG_PY = ROOT / ".venv-sglang" / "bin" / "python"
pytestmark = [pytest.mark.sglang, pytest.mark.skipif(not SGLANG_PY.exists(), reason=".venv-sglang not present")]
runner = CliRunner()


def cli(*args: str, code: int = 0):
    res = runner.invoke(app, list(args))
    assert res.exit_code == code, res.output
    return res


@pytest.fixture(scope="module")
def scen(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("scenarios")
    subprocess.run([str(SGLANG_PY), str(ROOT / "fixtures" / "sglang" / "scenarios.py"), str(out)], check=True,
                   capture_output=True, timeout=900)
    return out


@pytest.fixture(scope="module")
def db(scen, tmp_path_factory) -> dict:
    """Every scenario directory ingested by the CLI into one database, one `ingest DIR` each."""
    path = tmp_path_factory.mktemp("db") / "sglang.duckdb"
    summaries = {}
    for name in ("compact", "cap-accept", "greedy", "sts"):
        extra = ["--temperature", "0"] if name == "greedy" else []
        res = cli("ingest", str(scen / name), "--db", str(path), "--json", "--strict", *extra)
        summaries[name] = json.loads(res.stdout)
    return {"path": path, "ingest": summaries, "runs": {k: v["runs"][0] for k, v in summaries.items()}}


def test_one_run_per_server_with_its_tables_linked(db, scen):
    store = Store(db["path"], read_only=True)
    runs = store.runs().set_index("run_id")
    assert len(runs) == 4  # four servers, whatever their files are called
    for name, s in db["ingest"].items():
        assert len(s["runs"]) == 1 and s["rejects"]["count"] == 0, name
        assert {f["run_id"] for f in s["files"] if f["kind"] not in ("sps_table", "sts_table")} == set(s["runs"])
        kinds = {f["kind"] for f in s["files"]}
        assert {"server_info", "sps_table"} <= kinds
        assert name == "greedy" or "estimator_jsonl" in kinds
    sps_hash = store.query_df("SELECT DISTINCT table_hash FROM sps_tables").table_hash.tolist()
    assert len(sps_hash) == 1 and (runs.sps_hash == sps_hash[0]).all()
    sts = runs.loc[db["runs"]["sts"]]
    assert sts.sts_hash is not None and runs.drop(db["runs"]["sts"]).sts_hash.isna().all()
    temps = store.query_df("SELECT position, temperature FROM sts_tables WHERE table_hash = ? ORDER BY position",
                           [sts.sts_hash]).temperature.tolist()
    assert temps == pytest.approx(json.loads((scen / "sts" / "sts_table.json").read_text())["temperatures"])
    assert runs.loc[db["runs"]["greedy"], "temperature"] == pytest.approx(0.0, abs=1e-12)
    # SGLang's estimator writes an empty file for greedy-only traffic: listed, not a reject (--strict passed)
    assert [Path(p).name for p in db["ingest"]["greedy"]["empty"]] == ["block_accept.jsonl"]
    assert db["runs"]["compact"].startswith("sglang-compact-Qwen3-8B-")
    assert db["runs"]["cap-accept"].startswith("sglang-cap-accept-Qwen3-8B-")


def test_reingest_and_later_table_link(db, scen, tmp_path):
    """Polls ingested again append nothing; a table ingested after its server's dumps links then."""
    p = tmp_path / "later.duckdb"
    dumps = sorted((scen / "sts").glob("server_info-*.json"))
    first = json.loads(cli("ingest", *map(str, dumps), "--db", str(p), "--json").stdout)
    assert any("sts_table.json, which is not in the store" in n for n in first["notes"])
    again = json.loads(cli("ingest", str(scen / "sts"), "--db", str(p), "--json").stdout)
    assert again["runs"] == first["runs"] and again["tables"]["request_steps"]["written"] == 0
    run = Store(p, read_only=True).runs().iloc[0]
    assert run.run_id == db["runs"]["sts"] and run.sts_hash is not None and run.sps_hash is not None


def test_compact_only_estimate_holds_the_truth(db, scen):
    res = json.loads(cli("estimate", "--db", str(db["path"]), "--run", db["runs"]["compact"], "--json").stdout)
    r = res[db["runs"]["compact"]]
    assert r["run"]["arm"] == "compact" and r["tail"]["summary"]["ceiling"] == "estimated"
    assert "own observed outcomes" in r["tail"]["summary"]["statement"]
    out = sv.compact_only(Store(db["path"], read_only=True), db["runs"]["compact"], sv.read_truth(scen, "compact"))
    # the utilization interval of the production arm alone holds the audit arm's truth
    assert out["util_covers"] and out["agg_covers"], out
    assert out["n_unresolved"] > 500 and 0.87 <= out["cov90_unresolved"] <= 0.93, out
    assert abs(out["bias_unresolved"]) < 0.1 and out["resolved_exact"] == out["n_resolved"]
    # the cap-accept server decoded the same trajectories: its recorded ceiling is the same truth
    cap = Store(db["path"], read_only=True).query_df(
        "SELECT avg(ceiling) AS c FROM request_steps WHERE run_id = ?", [db["runs"]["cap-accept"]]).c[0]
    assert cap == pytest.approx(out["agg_truth"])


def test_greedy_censored_blocks_resolve_exactly(db, scen):
    out = sv.compact_only(Store(db["path"], read_only=True), db["runs"]["greedy"], sv.read_truth(scen, "greedy"))
    assert out["resolved_exact"] == out["n_resolved"] >= 0.9 * out["n_censored"]
    # what stays unresolved is cut by the end of its request: bounds, and intervals that hold
    assert out["util_covers"] and out["cov95_unresolved"] >= 0.9


def test_hazards_from_another_run_only_when_named_and_compatible(db):
    p, comp = str(db["path"]), db["runs"]["compact"]
    bad = cli("estimate", "--db", p, "--run", comp, "--hazards-from", db["runs"]["sts"], code=2)
    assert "not compatible" in bad.output and "STS table in force differs" in bad.output
    ok = json.loads(cli("estimate", "--db", p, "--run", comp, "--hazards-from", db["runs"]["cap-accept"],
                        "--json").stdout)
    assert "named by --hazards-from" in ok[comp]["tail"]["summary"]["statement"]


def test_calibrate_composes_with_the_table_in_force(db, scen, tmp_path):
    out = tmp_path / "next_sts.json"
    res = json.loads(cli("calibrate", "--db", str(db["path"]), "--run", db["runs"]["sts"], "--out", str(out),
                         "--json", "--n-boot", "50").stdout)
    in_force = json.loads((scen / "sts" / "sts_table.json").read_text())["temperatures"]
    assert res["in_force"] == pytest.approx(in_force)
    held = {r["method"]: r["ece"] for r in res["held_out"]}
    assert held["smooth-nll"] < held["in-force"] < held["identity"]
    # SGLang's own loader takes the file as is
    chk = subprocess.run([str(SGLANG_PY), "-c",
                          "import json,sys;from sglang.srt.speculative.dspark_components.dspark_sts import "
                          "load_sts_calibration_from_path as L;print(json.dumps(list(L(sys.argv[1]).temperatures)))",
                          str(out)], capture_output=True, text=True, timeout=300, check=True)
    assert json.loads(chk.stdout.strip().splitlines()[-1]) == pytest.approx(res["temperatures"])
    meta = json.loads(out.read_text())["acceptscope"]
    assert meta["composed_with"]["temperatures"] == pytest.approx(in_force)


def test_calibrate_refuses_post_sts_confidences_without_the_table(scen, tmp_path):
    p = tmp_path / "no_table.duckdb"
    dumps = sorted((scen / "sts").glob("server_info-*.json"))
    run = json.loads(cli("ingest", *map(str, dumps), "--db", str(p), "--json").stdout)["runs"][0]
    res = cli("calibrate", "--db", str(p), "--run", run, "--out", str(tmp_path / "x.json"), code=3)
    assert "sts_table.json" in res.output and "not in the store" in res.output


def test_report_on_a_production_arm_alone(db, tmp_path):
    html_path = tmp_path / "r.html"
    res = json.loads(cli("report", "--db", str(db["path"]), "--run", db["runs"]["compact"], "-o", str(html_path),
                         "--json").stdout)
    text = html_path.read_text()
    util = [f for f in res["findings"] if f["area"] == "utilization"]
    label = glossary.FIGURES["utilization"].label  # "utilization (estimated ceiling)": the glossary's one label
    assert util and label in util[0]["text"] and "model-based" in util[0]["text"]
    assert "estimated with predictive intervals" in text


def test_dashboard_on_a_production_arm_alone(db, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ACCEPTSCOPE_DB", str(db["path"]))
    at = AppTest.from_file(str(ROOT / "app" / "dashboard.py"), default_timeout=600).run()
    at.multiselect(key="runs").set_value([db["runs"]["compact"]]).run()
    assert not at.exception and not at.error, [e.value for e in (*at.exception, *at.error)]
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["compact utilization (estimated ceiling)"].endswith("%")
    n_unres, n_cens = (int(x) for x in metrics["trimmed blocks model-based"].split(" / "))
    assert 0 < n_unres < n_cens
