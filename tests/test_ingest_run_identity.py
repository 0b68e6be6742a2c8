"""Run identity from the server, linked tables, temperatures and the payload-level fallbacks of ingest."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import msgspec
import numpy as np
import pandas as pd
import pytest

from acceptscope.ingest import ingest_paths
from acceptscope.ingest.detect import detect
from acceptscope.ingest.estimator_jsonl import parse_estimator_jsonl
from acceptscope.ingest.identity import assign_runs, identity_from_bytes
from acceptscope.ingest.meta_info import parse_responses
from acceptscope.ingest.synth import make_server_info
from acceptscope.store import Store
from acceptscope.estimators.frame import NO_WORKLOAD
from acceptscope.estimators.synthetic import simulate
from acceptscope.estimators.tail import TailEstimator

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"


def _dump(path: Path, **over) -> Path:
    doc = make_server_info(ranks=2, n_steps=12, bs=3, gamma=4, seed=over.pop("seed", 1))
    doc.update(over)
    path.write_bytes(msgspec.json.encode(doc))
    return path


def test_identity_is_the_servers_launch_fields_not_the_file_name(tmp_path):
    a = identity_from_bytes(_dump(tmp_path / "x.json", port=30000).read_bytes())
    b = identity_from_bytes(_dump(tmp_path / "y.json", port=30000, startup_time=5.0, seed=2).read_bytes())
    c = identity_from_bytes(_dump(tmp_path / "z.json", port=30001).read_bytes())
    assert a.run_id() == b.run_id()  # a later incarnation of the same server: same run (a new epoch)
    assert a.run_id() != c.run_id()  # another port: another server
    assert a.run_id().startswith("sglang-cap-accept-target-") and a.gamma == 4
    assert identity_from_bytes(b"not json") is None
    # through ingest: the restart is epoch 1 of the same run (in start order, whatever the file names);
    # the other port is a run of its own
    store = Store(tmp_path / "s.duckdb")
    s = ingest_paths([tmp_path / "y.json", tmp_path / "x.json", tmp_path / "z.json"], store, progress=False)
    assert sorted(s["runs"]) == sorted({a.run_id(), c.run_id()})
    ep = store.query_df("SELECT run_id, max(epoch) AS e FROM steps GROUP BY run_id").set_index("run_id").e
    assert ep[a.run_id()] == 1 and ep[c.run_id()] == 0


def test_artifacts_without_identity_join_their_servers_run(tmp_path):
    one, two = tmp_path / "one", tmp_path / "two"
    one.mkdir(), two.mkdir()
    _dump(one / "server_info.json", port=1)
    _dump(two / "dump.json", port=2)
    shutil.copy(FIX / "capacc.estimator.jsonl", one / "block_accept.jsonl")
    shutil.copy(FIX / "capacc.estimator.jsonl", tmp_path / "loose.jsonl")
    kinds = [(f, detect(f)) for f in sorted(tmp_path.rglob("*.json*"))]
    plan = assign_runs(kinds)
    assert plan.run_of[one / "block_accept.jsonl"] == plan.run_of[one / "server_info.json"]
    assert plan.run_of[one / "server_info.json"] != plan.run_of[two / "dump.json"]
    assert plan.run_of[tmp_path / "loose.jsonl"] == "loose"  # two servers, not its directory: named and said so
    assert any("loose.jsonl" in n and "--run-id" in n for n in plan.notes)
    forced = assign_runs(kinds, run_id="R")
    assert set(forced.run_of.values()) == {"R"}


def test_one_corrupt_opening_block_rejects_only_itself():
    lines = [json.loads(x) for x in (FIX / "capacc.estimator.jsonl").read_text().splitlines() if x.strip()]
    opening = next(i for i, o in enumerate(lines) if "trimmed_tokens" in o)
    bad = dict(lines[opening], trimmed_tokens=lines[opening]["trimmed_tokens"] + [7],
               q_lp=lines[opening]["q_lp"] + [-1.0])
    data = "\n".join(json.dumps(o) for o in lines[:opening] + [bad] + lines[opening + 1:]).encode()
    good = parse_estimator_jsonl((FIX / "capacc.estimator.jsonl").read_bytes(), source="f", run_id="r")
    b = parse_estimator_jsonl(data, source="f", run_id="r")  # alone: no run gamma known
    assert len(b.rejects) == 1 and "gamma mismatch" in b.rejects[0]["reason"]
    assert len(b.rows("estimator_rows")) == len(good.rows("estimator_rows")) - 1


def test_bad_payload_field_falls_back_to_what_the_other_snapshots_establish(tmp_path):
    polls = [make_server_info(ranks=1, n_steps=n, bs=2, gamma=4, seed=3) for n in (10, 20, 30)]
    polls[0]["internal_states"][0]["dspark_info_record"]["gamma"] = "four"  # the FIRST snapshot is the bad one
    polls[1]["internal_states"][0]["dspark_info_record"]["mode"] = "capaccept"
    f = tmp_path / "polls.jsonl"
    f.write_bytes(b"\n".join(msgspec.json.encode(p) for p in polls) + b"\n")
    store = Store(tmp_path / "s.duckdb")
    s = ingest_paths([f], store, progress=False)
    fields = sorted(r.split(": ")[1] for r in s["rejects"]["messages"])
    assert any(x.startswith("internal_states[0].gamma") for x in fields)
    assert any(x.startswith("internal_states[0].mode") for x in fields)
    assert store.counts()["steps"] == 30 and len(store.runs()) == 1  # every record of every snapshot kept


def test_empty_states_and_empty_files_are_reported_not_silent(tmp_path):
    (tmp_path / "empty_states.json").write_text(json.dumps({"model_path": "m", "internal_states": []}))
    (tmp_path / "block_accept.jsonl").write_text("")
    s = ingest_paths([tmp_path], Store(tmp_path / "s.duckdb"), progress=False)
    assert s["rejects"]["count"] == 1 and "no DP rank reported a DSpark dump" in s["rejects"]["messages"][0]
    assert [Path(p).name for p in s["empty"]] == ["block_accept.jsonl"]


def test_request_temperature_from_the_traffic_drivers_record():
    rec = {"text": "", "meta_info": {"id": "a", "completion_tokens": 3}, "sampling_params": {"temperature": 0.7}}
    bad = {"text": "", "meta_info": {"id": "b"}, "sampling_params": {"temperature": -1}}
    b = parse_responses("\n".join(json.dumps(x) for x in (rec, bad)).encode(), source="r.jsonl", run_id="R")
    assert [r["temperature"] for r in b.rows("requests")] == pytest.approx([0.7])
    assert b.rejects[0]["field"] == "sampling_params.temperature"


def test_tail_aggregate_groups_unlabelled_workloads():
    rs = simulate(n_requests=30, seed=4).tables["request_steps"].copy()
    rs["workload"] = np.where(np.arange(len(rs)) % 2 == 0, None, rs["workload"])  # some SGLang rows: no label
    est = TailEstimator().fit(rs)
    res = est.estimate(rs.assign(ceiling=pd.NA, cap_trim=pd.NA))
    agg = res.aggregate(by="workload", n_boot=20)
    assert NO_WORKLOAD in set(agg.workload) and agg.n.sum() == len(rs)
    assert (agg.lo <= agg.mean_ceiling).all() and (agg.mean_ceiling <= agg.hi).all()
