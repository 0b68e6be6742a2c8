"""Incarnations of one server get epochs in startup order, whatever the ingest order or concurrency (issue 30, 1)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import msgspec
import pytest

from acceptscope.ingest import epochs, ingest_paths
from acceptscope.ingest.synth import make_server_info
from acceptscope.store import Store

N_STEPS, BS = 200, 4


def _incarnation(path: Path, tag: str, startup: float, seed: int) -> Path:
    """One server's dump (same launch fields every time) at ``startup``, its rids marked with ``tag``."""
    doc = make_server_info(ranks=1, n_steps=N_STEPS, bs=BS, gamma=4, seed=seed, startup_time=startup)
    data = msgspec.json.encode(doc).replace(b'"d0-', b'"' + tag.encode() + b'-d0-')
    path.write_bytes(data)
    return path


def _check(db: Path, order: dict[str, float]) -> None:
    """Each incarnation whole, in its own epoch, epochs in startup order, no row re-pointed."""
    store = Store(db, read_only=True)
    steps = store.query_df("SELECT epoch, count(*) AS n FROM steps GROUP BY epoch ORDER BY epoch")
    assert steps["n"].tolist() == [N_STEPS] * len(order), steps
    per = store.query_df("SELECT epoch, split_part(rid, '-', 1) AS tag, count(*) AS n FROM request_steps "
                         "GROUP BY ALL ORDER BY epoch")
    want = [t for t, _ in sorted(order.items(), key=lambda kv: kv[1])]
    assert per["tag"].tolist() == want, per  # one incarnation per epoch, in startup order
    assert store.query_df("SELECT count(DISTINCT run_id) AS n FROM steps")["n"].iloc[0] == 1
    orphans = store.query_df(
        "SELECT count(*) AS n FROM request_steps r ANTI JOIN steps s USING (run_id, rank, epoch, forward_ct)")
    assert orphans["n"].iloc[0] == 0
    dup = store.query_df("SELECT count(*) AS n FROM (SELECT run_id, rank, epoch, forward_ct, rid FROM request_steps "
                         "GROUP BY ALL HAVING count(*) > 1)")
    assert dup["n"].iloc[0] == 0


def test_sequential_ingests_in_reverse_time_order(tmp_path):
    late = _incarnation(tmp_path / "late.json", "late", 2_000.0, 2)
    mid = _incarnation(tmp_path / "mid.json", "mid", 1_500.0, 3)
    early = _incarnation(tmp_path / "early.json", "early", 1_000.0, 1)
    db = tmp_path / "s.duckdb"
    for f in (late, early, mid):  # each a separate ingest, the newest first
        ingest_paths([f], Store(db), progress=False)
    _check(db, {"early": 1_000.0, "mid": 1_500.0, "late": 2_000.0})
    # ingesting one of them again changes nothing
    s = ingest_paths([mid], Store(db), progress=False)
    assert s["tables"]["steps"]["written"] == 0
    _check(db, {"early": 1_000.0, "mid": 1_500.0, "late": 2_000.0})


def test_epoch_order_keeps_restarts_seen_without_a_startup_time():
    """An epoch with no known startup_time rides with the incarnation before it."""
    remap, mapping = epochs._order({100.0: 0, 300.0: 2}, [0, 1, 2], [200.0])
    assert mapping == {100.0: 0, 200.0: 2, 300.0: 3} and remap == {2: 3}


def _cli(paths, db, env):
    return subprocess.Popen([sys.executable, "-c", "from acceptscope.cli import main; main()", "ingest", *map(str, paths), "--db", str(db),
                             "--json"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)


@pytest.mark.parametrize("first", ["early", "late"])
def test_two_concurrent_ingest_processes_one_incarnation_each(tmp_path, first):
    files = {"early": _incarnation(tmp_path / "a.json", "early", 1_000.0, 1),
             "late": _incarnation(tmp_path / "b.json", "late", 2_000.0, 2)}
    db = tmp_path / "s.duckdb"
    env = dict(os.environ, COLUMNS="80")
    second = "late" if first == "early" else "early"
    p1 = _cli([files[first]], db, env)
    time.sleep(0.05)
    p2 = _cli([files[second]], db, env)
    for p in (p1, p2):
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0, err.decode()
    _check(db, {"early": 1_000.0, "late": 2_000.0})


def test_one_registry_of_artifact_kinds():
    """Sniffing, read order, identity and the readers all come from acceptscope.ingest.kinds (issue 29)."""
    from acceptscope.ingest import identity, kinds, readers_of_kinds
    from acceptscope.ingest.detect import KINDS as SNIFFED
    from acceptscope.ingest.engines import ENGINE_KINDS

    assert SNIFFED == kinds.NAMES and set(readers_of_kinds()) == set(kinds.NAMES)
    assert identity.SERVER_SIDE_KINDS == kinds.SERVER_SIDE and ENGINE_KINDS == kinds.ENGINE
    assert kinds.ORDER["server_info"] < min(v for k, v in kinds.ORDER.items() if k != "server_info")
    assert kinds.kind_of_name("x.sts.0.pt") == "sts_shard" and kinds.kind_of_head(b'{"temperatures": [1]}') == "sts_table"
