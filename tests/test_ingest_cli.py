"""``acceptscope ingest`` over the committed SGLang fixtures: detection, store write, idempotency, --strict."""

from __future__ import annotations

import json
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.ingest import ingest_paths
from acceptscope.ingest.detect import detect, run_id_for
from acceptscope.store import Store
from tests._close import assert_close

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"
runner = CliRunner()


def test_detect_rules():
    kinds = {p.name: detect(p) for p in FIX.iterdir()}
    assert kinds == {
        "capacc.estimator.jsonl": "estimator_jsonl",
        "capacc.generate.json": "responses",
        "capacc.openai.jsonl": "responses",
        "capacc.polls.jsonl": "server_info",
        "capacc.server_info.json": "server_info",
        "capacc.sts.0.pt": "sts_shard",
        "capacc.sts.1.pt": "sts_shard",
        "capacc.sts_calibration.json": "sts_table",
        "compact.server_info.json": "server_info",
        "spsadd.sps_table.json": "sps_table",
        "spsprof.json": "sps_table",
        "spsprof.json.manifest.json": "sps_profile_manifest",
        "spsprof.records.jsonl": "sps_profile_records",
        "spsprof.rounds.jsonl": "sps_profile_rounds",
        "drive.py": "skip",
        "make_fixtures.py": "skip",
        "scenarios.py": "skip",
        **({"README.md": "skip"} if (FIX / "README.md").exists() else {}),
    }
    assert run_id_for("capacc.sts.0.pt") == "capacc"


def test_cli_ingest_fixtures_then_idempotent(tmp_path):
    db = tmp_path / "x.duckdb"
    res = runner.invoke(app, ["ingest", str(FIX), "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    s = json.loads(res.stdout)
    t = s["tables"]
    assert s["rejects"]["count"] == 0
    store = Store(db)
    counts = store.counts()
    for name in ("runs", "steps", "request_steps", "estimator_rows", "estimator_gather", "estimator_eos",
                 "sts_samples", "sts_tables", "sps_tables", "sps_profile_records", "sps_profile_rounds",
                 "sps_profile_manifests", "requests"):
        assert counts[name] > 0, name
        assert t[name]["written"] == counts[name]
    assert t["steps"]["duplicates_ignored"] > 0  # the three capacc polls overlap
    runs = store.runs().set_index("arm")
    # one run per server (from /server_info's launch fields), whatever the files are called
    assert sorted(runs.index) == ["cap-accept", "compact"] and set(runs["gamma"]) == {4}
    capacc = runs.loc["cap-accept", "run_id"]
    assert sorted(s["runs"]) == sorted(runs.run_id) and capacc.startswith("sglang-cap-accept-target-model-")
    by_file = {Path(f["path"]).name: f["run_id"] for f in s["files"]}
    for name in ("capacc.polls.jsonl", "capacc.server_info.json", "capacc.estimator.jsonl", "capacc.sts.0.pt",
                 "capacc.generate.json"):
        assert by_file[name] == capacc, name
    rs = store.query_df("SELECT rank, min(rid) a, max(rid) b FROM request_steps WHERE run_id=? GROUP BY rank", [capacc])
    for r in rs.itertuples():  # rank slots stay with their DP rank although arrival order flips
        assert r.a.split("-")[0] == r.b.split("-")[0] == f"rank{r.rank}"
    res2 = runner.invoke(app, ["ingest", str(FIX), "--db", str(db), "--json"])
    s2 = json.loads(res2.stdout)
    assert all(v["written"] == 0 for v in s2["tables"].values())
    assert store.counts() == counts


def test_cli_human_output_and_strict(tmp_path):
    d = tmp_path / "in"
    d.mkdir()
    shutil.copy(FIX / "compact.server_info.json", d)
    p = json.loads((FIX / "capacc.server_info.json").read_text())
    p["internal_states"][0]["dspark_info_record"]["records"][12]["reqs"][3]["confidence"][2] = float("nan")
    (d / "dump.json").write_text(json.dumps(p))
    (d / "junk.json").write_text('{"hello": 1}')
    db = tmp_path / "y.duckdb"
    res = runner.invoke(app, ["ingest", str(d), "--db", str(db)])
    assert res.exit_code == 0
    assert "request_steps" in res.output and "top reject reasons" in res.output
    assert "dump.json:1: internal_states[0].records[12].reqs[3].confidence[2]: NaN" in res.output
    res = runner.invoke(app, ["ingest", str(d), "--db", str(db), "--strict"])
    assert res.exit_code == 2
    rej = Store(db).read_table("rejects")
    assert len(rej) == 2 and set(rej["reason"]) == {"NaN", "unrecognised artifact (kind 'unknown'); see "
                                                              "acceptscope.ingest.detect"}
    assert runner.invoke(app, ["ingest", str(tmp_path / "missing"), "--db", str(db)]).exit_code == 2


def test_ingest_paths_run_id_and_store_gamma_check(tmp_path):
    store = Store(tmp_path / "z.duckdb")
    s = ingest_paths([FIX / "capacc.server_info.json"], store, run_id="R", progress=False)
    assert s["tables"]["request_steps"]["written"] > 0
    # a later ingest of another arm under the same run id is refused (its arm/gamma are the run's)
    s = ingest_paths([FIX / "compact.server_info.json"], store, run_id="R", progress=False)
    assert s["rejects"]["count"] == 2 and "arm 'cap-accept'" in s["rejects"]["messages"][0]


@pytest.mark.parametrize("name", ["capacc.polls.jsonl"])
def test_jsonl_of_polls_is_split_per_line(name, tmp_path):
    s = ingest_paths([FIX / name], Store(tmp_path / "p.duckdb"), progress=False)
    (f,) = s["files"]
    assert f["duplicates"]["steps"] > 0 and f["rows"]["steps"] > 0


def test_second_invocation_resumes_rank_slots(tmp_path):
    """Polls ingested in one call and the later dump in another give the same rows as one call."""
    one = Store(tmp_path / "one.duckdb")
    ingest_paths([FIX / "capacc.polls.jsonl", FIX / "capacc.server_info.json"], one, progress=False)
    two = Store(tmp_path / "two.duckdb")
    ingest_paths([FIX / "capacc.polls.jsonl"], two, progress=False)
    s = ingest_paths([FIX / "capacc.server_info.json"], two, progress=False)
    assert s["tables"]["steps"]["duplicates_ignored"] > 0 and s["rejects"]["count"] == 0
    assert not s["tables"].get("gaps")
    q = "SELECT * FROM {} ORDER BY ALL"
    for t in ("steps", "request_steps"):
        a = one.query_df(q.format(t)).drop(columns=[]).to_dict("records")
        b = two.query_df(q.format(t)).to_dict("records")
        assert len(a) == len(b) and [(r["rank"], r["forward_ct"]) for r in a] == [(r["rank"], r["forward_ct"]) for r in b]
    rs = two.query_df("SELECT DISTINCT rank, split_part(rid, '-', 1) AS r FROM request_steps")
    assert all(f"rank{x.rank}" == x.r for x in rs.itertuples())


def test_reingest_and_overlapping_poll_write_each_row_once(tmp_path):
    """Bulk append on new keys, semi-join on old ones: re-ingest and an overlapping later poll add no duplicates."""
    import msgspec

    from acceptscope.ingest.synth import make_server_info

    full = make_server_info(ranks=2, n_steps=60, bs=4, gamma=4, seed=7)
    first = json.loads(json.dumps(full))
    later = json.loads(json.dumps(full))
    for s_first, s_later in zip(first["internal_states"], later["internal_states"]):
        recs = s_first["dspark_info_record"]["records"]
        s_first["dspark_info_record"]["records"] = recs[:40]
        s_later["dspark_info_record"]["records"] = recs[20:]  # the ring dropped 20, holds 40 new
    for name, payload in (("run.first.json", first), ("run.later.json", later), ("whole.all.json", full)):
        (tmp_path / name).write_bytes(msgspec.json.encode(payload))
    store = Store(tmp_path / "s.duckdb")
    a = ingest_paths([tmp_path / "run.first.json"], store, progress=False)
    n_first = store.counts()
    assert a["tables"]["request_steps"]["written"] == n_first["request_steps"] == 2 * 40 * 4
    again = ingest_paths([tmp_path / "run.first.json"], store, progress=False)
    assert all(t["written"] == 0 for t in again["tables"].values()) and store.counts() == n_first
    b = ingest_paths([tmp_path / "run.later.json"], store, progress=False)
    rs = b["tables"]["request_steps"]
    assert rs["written"] == 2 * 20 * 4 and rs["duplicates_ignored"] == 2 * 20 * 4
    assert store.counts()["request_steps"] == n_first["request_steps"] + rs["written"]
    c = ingest_paths([tmp_path / "run.later.json", tmp_path / "run.first.json"], store, progress=False)
    assert all(t["written"] == 0 for t in c["tables"].values())
    key = "run_id, rank, epoch, forward_ct, rid"
    dups = store.query_df(f"SELECT count(*) - count(DISTINCT ({key})) AS d FROM request_steps")["d"][0]
    assert dups == 0 and not store.counts()["gaps"] and not store.counts()["rejects"]
    whole = Store(tmp_path / "w.duckdb")
    ingest_paths([tmp_path / "whole.all.json"], whole, run_id="run", progress=False)
    q = "SELECT * EXCLUDE (run_id) FROM {} ORDER BY ALL"
    for t in ("steps", "request_steps"):
        assert_close(store.query_df(q.format(t)), whole.query_df(q.format(t)), where=str(t))


def test_bulk_ingest_allocator_settings_move_arrow_onto_the_tuned_heap():
    """The ``acceptscope ingest`` process's allocator set-up: on glibc, Arrow's buffers come from the same
    (threshold-tuned) malloc heap as numpy's, not from Arrow's default pool; run in a child, since the
    settings are process-wide and must not leak into the test process."""
    code = ("import pyarrow as pa; from acceptscope.ingest import tune_allocator_for_bulk_ingest as tune; "
            "before = pa.default_memory_pool().backend_name; ok = tune(); "
            "print(ok, before, pa.default_memory_pool().backend_name)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    glibc = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"
    assert out[0] == str(glibc)
    assert out[2] == ("system" if glibc else out[1])
