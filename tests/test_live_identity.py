"""Live identity (issue 30, item 2): while attached, the server behind the URL flips to another server and
back, and polls break (``"reqs": null``); another server's polls are refused (one reject each), a bad
poll is a reject and never a restart, and no record is stored twice."""

from __future__ import annotations

import copy
from collections import Counter

import pyarrow as pa

from acceptscope.ingest.synth import make_server_info
from acceptscope.live.poller import ServerInfoPoller
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer


def _ring(doc: dict, n: int) -> dict:
    out = copy.deepcopy(doc)
    for st in out["internal_states"]:
        st["dspark_info_record"]["records"] = st["dspark_info_record"]["records"][:n]
    return out


def _rows(tables: list[dict], name: str) -> list[dict]:
    out = []
    for t in tables:
        v = t.get(name)
        if v is None:
            continue
        out.extend(v.to_pylist() if isinstance(v, pa.Table) else list(v))
    return out


def test_identity_flips_and_bad_polls_store_nothing_twice():
    a = make_server_info(ranks=2, n_steps=60, bs=3, gamma=4, seed=1, startup_time=1000.0)
    b = make_server_info(ranks=2, n_steps=60, bs=3, gamma=4, seed=2, startup_time=5000.0)
    b["model_path"], b["port"] = "other/model", 31000  # another server answers at the same address
    broken = _ring(a, 40)
    for st in broken["internal_states"]:
        for rec in st["dspark_info_record"]["records"]:
            rec["reqs"] = None  # a transient malformed poll
    polls = [_ring(a, 20), _ring(b, 30), _ring(a, 30), broken, broken, _ring(b, 60), _ring(a, 50), _ring(a, 60)]
    got: list[dict] = []
    with FakeSGLangServer(FakeConfig(replay_server_info=polls, tick_s=0)) as srv:
        p = ServerInfoPoller(srv.url, "run-a", got.append, timeout_s=10)
        for _ in polls:
            p.poll_once()
    steps = _rows(got, "steps")
    keys = Counter((s["rank"], s["epoch"], s["forward_ct"]) for s in steps)
    assert max(keys.values()) == 1  # no step header stored twice
    assert len(steps) == 2 * 60  # every record of server a, once; none of server b
    assert {s["epoch"] for s in steps} == {0}  # no flip or bad poll became a restart
    assert not [g for g in _rows(got, "gaps") if g["kind"] == "restart"]
    rs = _rows(got, "request_steps")
    assert max(Counter((r["rank"], r["epoch"], r["forward_ct"], r["rid"]) for r in rs).values()) == 1
    rejects = [r["reason"] for r in _rows(got, "rejects")]
    assert sum("server identity changed" in r for r in rejects) == 2 == p.stats.identity_changes
    assert sum("not counted as a restart" in r for r in rejects) >= 1
    assert all("\n" not in r for r in rejects)
