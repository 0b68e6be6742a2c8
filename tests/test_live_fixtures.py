"""The live path over payloads SGLang's own serialisers produced (fixtures/sglang/), served over loopback HTTP.

The live poller/tailers must yield exactly what the file ingest path yields for
the same bytes. Tests that need the committed SGLang samples skip until
``fixtures/sglang/make_fixtures.py`` has written them.
"""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path

import pytest

from acceptscope.ingest.estimator_jsonl import parse_estimator_jsonl
from acceptscope.ingest.server_info import ServerInfoIngestor
from acceptscope.live.driver import DriveConfig, Driver, load_prompts
from acceptscope.live.poller import ServerInfoPoller
from acceptscope.live.session import _EstimatorLines
from acceptscope.live.tailer import JsonlTailer
from tests.fake_sglang_server import FakeConfig, FakeSGLangServer

FIX = Path(__file__).resolve().parent.parent / "fixtures" / "sglang"
needs_fixtures = pytest.mark.skipif(not (FIX / "capacc.polls.jsonl").exists(),
                                    reason="fixtures/sglang artifacts not generated yet (make_fixtures.py)")


def _sorted(rows, key):
    return sorted((dict(r) for r in rows), key=lambda r: tuple(r[k] for k in key))


@needs_fixtures
def test_polling_sglang_payloads_equals_file_ingest():
    lines = [ln for ln in (FIX / "capacc.polls.jsonl").read_bytes().split(b"\n") if ln.strip()]
    # file path: the ingest package reading the recorded polls
    ref = ServerInfoIngestor("fx", "file")
    want_steps, want_rs = [], []
    for i, ln in enumerate(lines, 1):
        b = ref.feed_bytes(ln, source="polls", line=i)
        want_steps += b.rows("steps")
        want_rs += b.rows("request_steps")
    # live path: the same payloads served by HTTP, polled
    got: dict[str, list] = {}
    with FakeSGLangServer(FakeConfig(replay_server_info=[json.loads(x) for x in lines])) as s:
        p = ServerInfoPoller(s.url, "fx", lambda t: [got.setdefault(k, []).extend(list(v)) for k, v in t.items()])
        for _ in lines:
            p.poll_once()
    key = ("rank", "epoch", "forward_ct")
    assert _sorted(got["steps"], key) == _sorted(want_steps, key) and len(want_steps) > 0
    key2 = key + ("rid",)
    assert _sorted(got["request_steps"], key2) == _sorted(want_rs, key2)
    assert p.stats.rejects == 0 and p.stats.ranks_seen == 2


@needs_fixtures
def test_driver_reads_sglang_generate_responses():
    responses = json.loads((FIX / "capacc.generate.json").read_text())
    with FakeSGLangServer(FakeConfig(replay_generate=responses)) as s:
        res = Driver(DriveConfig(base_url=s.url, run_id="fxg", loopback_only=True)).run(load_prompts("mbpp", 3))
    assert len(res.rows) == 3 and not res.rejects
    for row, resp in zip(sorted(res.rows, key=lambda r: r["prompt_index"]), responses):
        assert row["spec_verify_ct"] == resp["meta_info"]["spec_verify_ct"]
        assert row["spec_block_accept_length"] == pytest.approx(resp["meta_info"]["spec_block_accept_length"])


def _estimator_source(tmp_path: Path) -> bytes:
    """SGLang's estimator JSONL sample when present, else one written by the fake engine."""
    if (FIX / "capacc.estimator.jsonl").exists():
        return (FIX / "capacc.estimator.jsonl").read_bytes()
    est = tmp_path / "gen.jsonl"
    with FakeSGLangServer(FakeConfig(estimator_path=str(est), gamma=4, seed=4)) as s:
        Driver(DriveConfig(base_url=s.url, run_id="g", concurrency=(3,), max_new_tokens=60, temperature=0.9,
                           loopback_only=True)).run(load_prompts("gsm8k", 6))
        with s.engine.lock:
            s.engine._flush_estimator()
    return est.read_bytes()


def test_tailing_in_random_chunks_equals_whole_file_parse(tmp_path):
    data = _estimator_source(tmp_path)
    assert data.count(b"\n") > 10
    whole = parse_estimator_jsonl(data, source="est", run_id="t", gamma=None)
    path = tmp_path / "est.jsonl"
    path.write_bytes(b"")
    tail, parser = JsonlTailer(path), _EstimatorLines("t", "est", None)
    got: dict[str, list] = {}
    rng = random.Random(0)
    pos = 0
    while pos < len(data):  # the writer appends arbitrary byte chunks, cutting lines anywhere
        step = rng.randint(1, 700)
        with path.open("ab") as f:
            f.write(data[pos:pos + step])
        pos += step
        lines = tail.poll()
        if lines:
            for k, v in parser.feed_lines(lines).tables.items():
                got.setdefault(k, []).extend(list(v))
    for name, key in (("estimator_rows", ("rid", "fct")), ("estimator_gather", ("rid", "block_fct", "offset")),
                      ("estimator_eos", ("rid", "block_fct"))):
        assert _sorted(got.get(name, []), key) == _sorted(whole.rows(name), key), name
    assert {r["source_line"] for r in got["estimator_rows"]} == {r["source_line"] for r in whole.rows("estimator_rows")}


@needs_fixtures
def test_sts_fixture_shards_through_the_tailer(tmp_path):
    from acceptscope.ingest.sts_shards import ingest_sts_shard
    from acceptscope.live.session import _parse_sts_shard
    from acceptscope.live.tailer import StsShardTailer

    shards = sorted(FIX.glob("capacc.sts.*.pt"))
    assert shards
    for p in shards:
        shutil.copy(p, tmp_path / p.name)
    t = StsShardTailer(str(tmp_path / "capacc.sts"))
    ready = t.poll(settle=False)
    assert sorted(k for k, _, _ in ready) == list(range(len(shards)))
    for k, g, p in ready:
        mine = _parse_sts_shard("s", p, k, None).rows("sts_samples")
        ref = ingest_sts_shard(FIX / p.name, run_id="s").rows("sts_samples")
        assert [r["row_index"] for r in mine] == [r["row_index"] for r in ref] and len(mine) > 0
