"""Local paths named by remote peers are never opened (issue 30, item 5): the STS / SPS table paths in a
dump's server args are names on the server's disk; a table is linked only when the user ingests it."""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

import msgspec

from acceptscope.ingest import ingest_paths
from acceptscope.ingest.synth import make_server_info
from acceptscope.store import Store

PROFILE = Path(__file__).resolve().parents[1] / "fixtures" / "profiles" / "h200-qwen3-8b.1d.json"


def test_a_table_named_by_the_server_is_not_read_until_the_user_hands_it_over(tmp_path):
    ours = tmp_path / "secret" / "sps.json"  # a file on *our* disk at the path the server names
    ours.parent.mkdir()
    shutil.copy(PROFILE, ours)
    doc = make_server_info(ranks=1, n_steps=10, bs=2, gamma=4)
    doc["speculative_dspark_sps_table_path"] = str(ours)
    doc["speculative_dspark_confidence_sts_path"] = "/etc/passwd"
    dump = tmp_path / "run" / "server_info.json"
    dump.parent.mkdir()
    dump.write_bytes(msgspec.json.encode(doc))
    store = Store(tmp_path / "s.duckdb")
    s = ingest_paths([dump], store, progress=False)
    run = store.query_df("SELECT sps_hash, sts_hash, config_json FROM runs")
    assert run["sps_hash"].isna().all() and run["sts_hash"].isna().all()
    assert str(ours) in run["config_json"].iloc[0]  # recorded as a name
    assert any("not in the store" in n for n in s["notes"])
    # the user hands the table over (same directory as the dump, a later ingest): now it is linked
    shutil.copy(PROFILE, dump.parent / "sps.json")
    ingest_paths([dump.parent / "sps.json"], store, progress=False)
    got = store.query_df("SELECT sps_hash FROM runs")["sps_hash"].iloc[0]
    assert got is not None and got == hashlib.sha256(PROFILE.read_bytes()).hexdigest()
