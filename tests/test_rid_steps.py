"""step_index's memory (acceptscope.ingest.rid_steps): bounded, exact for the rids still decoding."""

from __future__ import annotations

import copy
import doctest

import numpy as np
import pytest

from acceptscope.ingest import rid_steps
from acceptscope.ingest.rid_steps import RidStepCounts
from acceptscope.ingest.server_info import ServerInfoIngestor
from acceptscope.ingest.synth import make_server_info
from acceptscope.store import Store


def test_module_example_runs():
    r = doctest.testmod(rid_steps)
    assert r.attempted > 0 and r.failed == 0


def test_counts_stay_bounded_and_a_rid_seen_within_the_horizon_is_kept():
    counts = RidStepCounts(capacity=100)
    counts.set("kept", 1)
    for i in range(10_000):
        counts.set(f"r{i}", 1)
        if i % 99 == 0:  # seen again before 100 other rids went by
            counts.set("kept", counts.get("kept") + 1)
        assert len(counts) <= 2 * 100
    assert counts.get("kept") == 1 + len(range(0, 10_000, 99))
    assert counts.get("r0") == 0  # unseen for 9,999 other rids: forgotten, numbered from 0 again
    assert counts.get("r9999") == 1
    names = ["kept", "r0", "r9998", "nobody"]
    assert counts.get_many(names).tolist() == [counts.get(n) for n in names]


def test_a_zero_count_is_kept_not_read_through_to_the_previous_generation():
    counts = RidStepCounts(capacity=2)
    counts.set("pool:3", 5)
    counts.set("x", 1)  # rotates: pool:3 -> previous generation
    counts.set("pool:3", 0)  # a new request took the slot
    assert counts.get("pool:3") == 0 and counts.get_many(["pool:3"]).tolist() == [0]


def test_capacity_must_be_positive():
    with pytest.raises(ValueError, match="capacity"):
        RidStepCounts(capacity=0)


def _step_index(batch) -> dict:
    return {(r["rank"], r["forward_ct"], r["rid"]): r["step_index"] for r in batch.rows("request_steps")}


@pytest.mark.parametrize("fast", [True, False])
@pytest.mark.parametrize("with_rids", [True, False])
def test_a_small_memory_numbers_every_step_as_an_unbounded_one(fast, with_rids):
    """Requests decode in consecutive steps: a memory of 8 rids (the 2 ranks x bs 4 decoding at once)
    numbers 50 requests' steps exactly as the default one, and never holds more than two generations."""
    p = make_server_info(ranks=2, n_steps=200, bs=4, gamma=4, seed=5, with_rids=with_rids)
    got = {}
    for cap in (rid_steps.CAPACITY, 8):
        ing = ServerInfoIngestor("r", source="t", rid_capacity=cap)
        ing.use_fast = fast
        ing.chunk_bytes = 4096  # many chunks: the counts carry across chunk boundaries
        b = ing.feed(copy.deepcopy(p))
        assert not b.rejects
        got[cap] = _step_index(b)
        assert len(ing._step_ct) <= 2 * cap + 2 * 200 * 4  # (a chunk's rids go in before the rotation)
    assert got[8] == got[rid_steps.CAPACITY]
    if with_rids:  # (pool slots have their own, unbounded memory: the pool's size bounds it)
        assert len({k[2] for k in got[8]}) > 2 * 8  # the small memory rotated, several times
    assert max(got[8].values()) > 8  # requests longer than the memory's size were numbered through


def test_resume_loads_only_the_most_recent_rids_and_continues_their_numbering(tmp_path):
    full = make_server_info(ranks=2, n_steps=120, bs=4, gamma=4, seed=8)
    first = copy.deepcopy(full)
    for s in first["internal_states"]:
        s["dspark_info_record"]["records"] = s["dspark_info_record"]["records"][:70]
    later = copy.deepcopy(full)
    for s in later["internal_states"]:
        s["dspark_info_record"]["records"] = s["dspark_info_record"]["records"][50:]

    store = Store(tmp_path / "s.duckdb")
    store.write_arrow(ServerInfoIngestor("r", source="first").feed(first).arrow_tables())
    n_rids = store.query_df("SELECT count(DISTINCT rid) AS n FROM request_steps")["n"].iloc[0]
    ing = ServerInfoIngestor("r", source="later", rid_capacity=12)
    assert ing.resume(store)
    assert len(ing._step_ct) <= 11 < n_rids  # the 8 rids decoding at the cut, and 3 more recent ones
    resumed = _step_index(ing.feed(later))
    whole = _step_index(ServerInfoIngestor("r", source="whole").feed(full))
    assert resumed and all(whole[k] == v for k, v in resumed.items())
    assert np.unique([k[2] for k in resumed]).size > 12
