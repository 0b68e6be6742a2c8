"""Side-file tailing: estimator JSONL across truncation/replacement, STS shards across rewrites."""

from __future__ import annotations

import os
import time

import torch

from acceptscope.live.tailer import JsonlTailer, StsShardTailer


def test_jsonl_partial_lines_and_truncation(tmp_path):
    p = tmp_path / "est.jsonl"
    t = JsonlTailer(p)
    assert t.poll() == []  # not created yet
    p.write_text('{"rid": "a", "fct": 1}\n{"rid": "a", "fc')
    assert t.poll() == [(1, '{"rid": "a", "fct": 1}')]  # the partial line waits for its newline
    with p.open("a") as f:
        f.write('t": 2}\n\n{"rid": "b", "fct": 3}\n')
    assert t.poll() == [(2, '{"rid": "a", "fct": 2}'), (4, '{"rid": "b", "fct": 3}')]  # blank line 3 skipped
    assert t.poll() == []
    # restart: SGLang reopens the file with "w" -> truncated, then new lines
    p.write_text('{"rid": "c", "fct": 1}\n')
    assert t.poll() == [(1, '{"rid": "c", "fct": 1}')]
    assert t.generation == 1 and t.events[-1].kind == "truncated"
    # replaced by a new file (new inode) of greater size
    q = tmp_path / "new.jsonl"
    q.write_text("".join(f'{{"rid": "d", "fct": {i}}}\n' for i in range(1, 6)))
    os.replace(q, p)
    got = t.poll()
    assert [n for n, _ in got] == [1, 2, 3, 4, 5] and t.generation == 2 and t.events[-1].kind == "replaced"


def test_jsonl_bounded_read_per_poll(tmp_path):
    p = tmp_path / "big.jsonl"
    p.write_text("".join(f'{{"i": {i}}}\n' for i in range(1000)))
    t = JsonlTailer(p, max_bytes_per_poll=1000)
    n = 0
    polls = 0
    while True:
        got = t.poll()
        if not got:
            break
        n += len(got)
        polls += 1
    assert n == 1000 and polls > 5  # memory per poll is bounded, nothing lost


def _save(path, rows, gamma=3, seed=0):
    g = torch.Generator().manual_seed(seed)
    torch.save({"logits": torch.randn(rows, gamma, generator=g), "prefix_mask": torch.ones(rows, gamma)}, path)


def test_sts_shards_settle_then_rewrite_starts_a_generation(tmp_path):
    stem = tmp_path / "sts" / "cap"
    stem.parent.mkdir()
    t = StsShardTailer(str(stem))
    _save(f"{stem}.0.pt", 5)
    _save(f"{stem}.1.pt", 7)
    (tmp_path / "sts" / "cap.x.pt").write_bytes(b"not a shard")
    assert t.poll() == []  # first sight: wait for the size to settle
    ready = t.poll()
    assert [(k, g) for k, g, _ in ready] == [(0, 0), (1, 0)]
    for k, _, _ in ready:
        t.mark_done(k)
    assert t.poll() == []
    # a restarted server writes shard 0 and 1 again: one new generation, not two
    time.sleep(0.01)
    _save(f"{stem}.0.pt", 9, seed=1)
    t.poll()
    _save(f"{stem}.1.pt", 11, seed=2)
    t.poll()
    ready = t.poll()
    assert sorted((k, g) for k, g, _ in ready) == [(0, 1), (1, 1)]
    assert t.generation == 1 and any(e.kind == "overwritten" for e in t.events)
    _save(f"{stem}.2.pt", 3)
    assert [k for k, _, _ in t.poll(settle=False)] == [0, 1, 2]  # last poll: no second look needed


def _wait(pred, timeout=10.0):
    t0 = time.monotonic()
    while time.monotonic() - t0 < timeout:
        if pred():
            return True
        time.sleep(0.02)
    return False


def test_capture_tails_estimator_and_sts_across_a_restart(tmp_path):
    import json

    from acceptscope.live.driver import DriveConfig, load_prompts
    from acceptscope.live.session import STS_GENERATION_STRIDE, CaptureConfig, LiveCapture
    from acceptscope.store import Store
    from tests.fake_sglang_server import FakeConfig, FakeSGLangServer

    est, stem = tmp_path / "est.jsonl", tmp_path / "sts" / "cap"
    cfg = FakeConfig(mode="cap-accept", gamma=4, estimator_path=str(est), sts_stem=str(stem), sts_flush_every=15, seed=9)
    store = Store(tmp_path / "t.duckdb")
    prompts = load_prompts("humaneval", 6)
    drive = dict(concurrency=(3,), max_new_tokens=40, temperature=0.9, loopback_only=True)
    with FakeSGLangServer(cfg) as s:
        cap = LiveCapture(store, CaptureConfig(base_url=s.url, arm="cap-accept", run_id="tail", poll_interval_s=0.1,
                                               tail_interval_s=0.05, estimator_path=str(est), sts_stem=str(stem),
                                               scrape_metrics=False, loopback_only=True)).start()
        cap.drive(prompts, DriveConfig(base_url=s.url, run_id="", **drive))
        with s.engine.lock:  # force pending estimator lines out (SGLang flushes every 16 steps / at prefill)
            s.engine._flush_estimator()
        n0 = len(s.engine.est_written[0])
        assert _wait(lambda: cap.tail.stats["estimator_lines"] >= n0)  # all of incarnation 0 read before the restart
        assert _wait(lambda: cap.tail.stats["sts_shards"] >= len(s.engine.sts_written[0]))
        s.engine.restart()  # truncates the JSONL and restarts shard numbering at 0
        cap.drive([p for p in prompts], DriveConfig(base_url=s.url, run_id="", rid_prefix="tail-b", **drive))
        with s.engine.lock:
            s.engine._flush_estimator()
        n1 = len(s.engine.est_written[1])
        assert _wait(lambda: cap.tail.stats["estimator_lines"] >= n0 + n1)
        written = [[json.loads(x) for x in gen] for gen in s.engine.est_written]
        shards = [list(g) for g in s.engine.sts_written]
        summary = cap.stop()
    rows = store.read_table("estimator_rows", "tail")
    want = sum(1 for gen in written for o in gen if "fct" in o)
    assert len(rows) == want and want > 0
    assert summary.tail["estimator_generations"] == 2 and any("truncated" in e for e in summary.tail["events"])
    gather = store.read_table("estimator_gather", "tail")
    assert len(gather) == sum(len(o.get("pg", [])) for gen in written for o in gen)
    gaps = store.read_table("gaps", "tail")
    assert set(gaps["kind"]) == {"restart"} and (gaps["epoch"] == 1).all()
    assert store.read_table("rejects", "tail").empty
    sts = store.read_table("sts_samples", "tail")
    shard_ids = sorted(set(sts["shard"]))
    assert shard_ids == sorted([k for k in range(len(shards[0]))] + [STS_GENERATION_STRIDE + k for k in range(len(shards[1]))])
    assert len(shards[0]) >= 1 and len(shards[1]) >= 1
    assert (sts["label_kind"] == "greedy-argmax").all() and sts["logits"].map(len).eq(4).all()
