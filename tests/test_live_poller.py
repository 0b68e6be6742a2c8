"""/server_info poller + session over real loopback HTTP: DP ranks in shuffled order, overflow, restart, clear-loss, backpressure."""

from __future__ import annotations

import time

import pytest

from acceptscope.ingest.server_info import ServerInfoIngestor
from acceptscope.live.driver import DriveConfig, load_prompts
from acceptscope.live.poller import ServerInfoPoller
from acceptscope.live.session import CaptureConfig, CaptureError, capture
from acceptscope.live.sink import StoreSink
from acceptscope.store import Store
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer


def _submit(engine, n, max_new=400, temp=0.8):
    return [engine.submit(8, {"max_new_tokens": max_new, "temperature": temp, "ignore_eos": True}, f"r{engine.restarts}-{i}-{time.monotonic_ns()}") for i in range(n)]


class _Collect:
    """A sink that keeps what the poller hands over (for deterministic poll-by-poll checks)."""

    def __init__(self):
        self.tables: dict[str, list] = {}

    def __call__(self, tables):
        for k, v in tables.items():
            self.tables.setdefault(k, []).extend(list(v))


def _manual_server(**kw):
    cfg = FakeConfig(tick_s=0, **kw)  # no clock: the test advances the engine explicitly
    return FakeSGLangServer(cfg)


def test_capture_three_dp_ranks_shuffled(tmp_path):
    with FakeSGLangServer(FakeConfig(dp_ranks=3, shuffle_ranks=True, gamma=4, seed=11)) as s:
        store = Store(tmp_path / "a.duckdb")
        prompts = load_prompts("gsm8k,humaneval", 12)
        summary = capture(
            store,
            CaptureConfig(base_url=s.url, arm="cap-accept", poll_interval_s=0.1, loopback_only=True,
                          metrics_interval_s=0.2, audit_group="g1"),
            prompts,
            DriveConfig(base_url=s.url, run_id="", concurrency=(3,), max_new_tokens=30, temperature=0.7),
        )
        rings = {r.index: [rec["forward_ct"] for rec in r.ring] for r in s.engine.ranks}
        owner = {rid: q.rank for rid, q in s.engine.reqs.items()}
    rid = summary.run_id
    assert summary.polls["ranks_seen"] == 3 and summary.polls["polls"] >= 3
    assert summary.drive["ok"] == 12 and summary.rejects == 0 and summary.gaps == {}
    runs = store.read_table("runs", rid)
    assert runs.loc[0, "arm"] == "cap-accept" and runs.loc[0, "gamma"] == 4 and runs.loc[0, "audit_group"] == "g1"
    assert runs.loc[0, "source"] == "live"
    rs = store.read_table("request_steps", rid)
    steps = store.read_table("steps", rid)
    # every stored rank slot holds exactly one server rank's requests, and the slots are a bijection
    slot_to_rank = {}
    for slot, grp in rs.groupby("rank"):
        ranks = {owner[r] for r in grp["rid"]}
        assert len(ranks) == 1, f"slot {slot} mixes server ranks {ranks}"
        slot_to_rank[slot] = ranks.pop()
    assert sorted(slot_to_rank.values()) == [0, 1, 2]
    # nothing lost or duplicated: each slot's forward_cts are exactly that rank's ring
    for slot, rank in slot_to_rank.items():
        got = sorted(steps.loc[steps["rank"] == slot, "forward_ct"].tolist())
        assert got == sorted(rings[rank])
    req = store.read_table("requests", rid)
    assert len(req) == 12 and req["spec_verify_ct"].gt(0).all()
    assert summary.metrics["scrapes"] >= 1 and any("spec_accept_length" in k for k in summary.metrics["latest"])


def test_ring_overflow_is_a_gap():
    with _manual_server(ring_size=30, gamma=3) as s:
        col = _Collect()
        p = ServerInfoPoller(s.url, "ov", col, ingestor=ServerInfoIngestor("ov", "live", ring_capacity=30))
        _submit(s.engine, 2)
        for _ in range(10):
            s.engine.tick()
        p.poll_once()
        wm = max(r["forward_ct"] for r in col.tables["steps"])
        for _ in range(100):  # far more than the ring holds
            s.engine.tick()
        p.poll_once()
    gaps = [g for g in col.tables.get("gaps", []) if g["kind"] == "overflow"]
    assert len(gaps) == 1 and gaps[0]["from_forward_ct"] == wm and gaps[0]["to_forward_ct"] > wm + 1
    assert p.stats.gaps == {"overflow": 1}
    assert len(col.tables["steps"]) == 9 + 30  # first poll (after one prefill pass) + the whole ring


def test_server_restart_starts_a_new_epoch():
    with _manual_server(gamma=3, dp_ranks=2) as s:
        col = _Collect()
        p = ServerInfoPoller(s.url, "rs", col)
        _submit(s.engine, 2)
        for _ in range(20):
            s.engine.tick()
        p.poll_once()
        s.engine.restart()  # forward_ct restarts, rings empty, new startup_time
        time.sleep(0.01)
        _submit(s.engine, 2)
        for _ in range(5):
            s.engine.tick()
        p.poll_once()
    epochs = {(r["rank"], r["epoch"]) for r in col.tables["steps"]}
    assert {e for _, e in epochs} == {0, 1}
    restart = [g for g in col.tables["gaps"] if g["kind"] == "restart"]
    assert len(restart) == 2 and all(g["epoch"] == 1 for g in restart)  # one per DP rank slot
    # the same forward_ct values occur in both epochs, as distinct rows
    e0 = {r["forward_ct"] for r in col.tables["steps"] if r["epoch"] == 0}
    e1 = {r["forward_ct"] for r in col.tables["steps"] if r["epoch"] == 1}
    assert e0 & e1


def test_clear_after_get_records_clear_loss():
    with _manual_server(gamma=3) as s:
        col = _Collect()
        p = ServerInfoPoller(s.url, "cl", col, clear="every")
        real_clear = p._clear

        def racing_clear():  # steps land between the GET and the clear, as on a busy server
            for _ in range(3):
                s.engine.tick()
            return real_clear()

        p._clear = racing_clear
        _submit(s.engine, 2)
        for _ in range(10):
            s.engine.tick()
        p.poll_once()
        wm = max(r["forward_ct"] for r in col.tables["steps"])
        for _ in range(10):
            s.engine.tick()
        p.poll_once()
        assert p.stats.clears == 2 and p.stats.records_in_payload == 10  # ring stays bounded by the clears
    gaps = [g for g in col.tables["gaps"] if g["kind"] == "clear-loss"]
    assert len(gaps) == 1 and gaps[0]["from_forward_ct"] == wm and gaps[0]["to_forward_ct"] == wm + 4
    fcts = sorted(r["forward_ct"] for r in col.tables["steps"])
    assert not set(range(wm + 1, wm + 4)) & set(fcts)  # lost rows are reported, never invented


def test_down_server_is_counted_not_fatal():
    import socket

    with socket.socket() as sk:
        sk.bind(("127.0.0.1", 0))
        port = sk.getsockname()[1]
    col = _Collect()
    p = ServerInfoPoller(f"http://127.0.0.1:{port}", "dn", col, timeout_s=0.5, max_polls=1)
    assert p.poll_once() is None and p.poll_once() is None
    assert p.stats.down_polls == 2 and p.stats.polls == 0 and "ConnectionError" in p.stats.last_error


def test_capture_refuses_wrong_arm(tmp_path):
    with FakeSGLangServer(FakeConfig(mode="compact", gamma=3)) as s:
        with pytest.raises(CaptureError, match="'compact' but arm 'cap-accept'"):
            capture(Store(tmp_path / "x.duckdb"), CaptureConfig(base_url=s.url, arm="cap-accept", scrape_metrics=False))
    with FakeSGLangServer(FakeConfig(components=())) as s:
        with pytest.raises(CaptureError, match="SGLANG_DSPARK_DEBUG_DUMP"):
            capture(Store(tmp_path / "y.duckdb"), CaptureConfig(base_url=s.url, scrape_metrics=False))


class _SlowStore:
    """A store stand-in whose appends are slow (no streaming writer): forces the queue to fill."""

    def __init__(self, delay):
        self.delay, self.seen, self.calls = delay, 0, 0

    def append(self, payload):
        time.sleep(self.delay)
        self.calls += 1
        self.seen += sum(t.num_rows for t in payload.values())


def test_sink_backpressure_bounds_the_queue():
    slow = _SlowStore(0.05)
    sink = StoreSink(slow, max_batches=2, coalesce=1)
    row = {"run_id": "b", "rank": 0, "epoch": 0, "forward_ct": 0}
    t0 = time.monotonic()
    for i in range(10):
        sink.put({"steps": [dict(row, forward_ct=i)]})
    produced = time.monotonic() - t0
    sink.close()
    st = sink.stats()
    assert slow.seen == 10 and st["rows"] == {"steps": 10}
    assert st["max_queue_depth"] <= 2 and st["blocked_s"] > 0.1 and produced > 0.2


def test_sink_error_is_sticky(tmp_path):
    class Broken:
        def append(self, payload):
            raise OSError("disk full")

    sink = StoreSink(Broken(), max_batches=4)
    sink.put({"steps": [{"run_id": "x", "rank": 0, "epoch": 0, "forward_ct": 1}]})
    with pytest.raises(Exception, match="disk full"):
        sink.flush()
    with pytest.raises(Exception, match="disk full"):
        sink.put({"steps": [{"run_id": "x", "rank": 0, "epoch": 0, "forward_ct": 2}]})
    with pytest.raises(Exception, match="disk full"):
        sink.close()


def test_poller_thread_with_live_clock_and_clear_threshold(tmp_path):
    """A background poll loop against a running engine, clearing when the ring passes a threshold."""
    with FakeSGLangServer(FakeConfig(gamma=3, dp_ranks=2, tick_s=0.001)) as s:
        store = Store(tmp_path / "c.duckdb")
        sink = StoreSink(store)
        p = ServerInfoPoller(s.url, "thr", sink.put, interval_s=0.05, clear="threshold", clear_threshold_records=40)
        _submit(s.engine, 4, max_new=300)
        p.start(deadline=time.monotonic() + 1.0)
        time.sleep(1.2)
        p.stop()
        sink.close()
    assert p.stats.clears >= 1 and p.stats.polls >= 5
    n = store.query_df("SELECT count(*) AS n FROM steps WHERE run_id = 'thr'")["n"][0]
    gaps = store.query_df("SELECT count(*) AS n FROM gaps WHERE run_id = 'thr' AND kind = 'clear-loss'")["n"][0]
    assert n > 50 and gaps == p.stats.gaps.get("clear-loss", 0)
