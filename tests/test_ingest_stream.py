"""Reading /server_info dumps a chunk of records at a time (acceptscope.ingest.stream).

The scan must cut only at record boundaries (or give up), and an ingest read in tiny chunks must
store exactly what one read whole stores: the same rows, rejects, duplicates and watermarks.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path

import msgspec
import pytest

from acceptscope.ingest import ingest_paths, stream
from acceptscope.ingest.server_info import ServerInfoIngestor
from acceptscope.ingest.synth import make_records, make_server_info
from acceptscope.store import Store

FIX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"


def _records_of(sc: stream.Scan, src: stream.Source) -> dict:
    return {k: [bytes(x) for x in stream.ChunkedRecords(src, v)[:]] for k, v in sc.arrays.items()}


@pytest.mark.parametrize("chunk", [200, 1500, 1 << 20])
def test_scan_cuts_at_record_boundaries(chunk):
    """Every record comes back whole and in order, however small the chunks; the skeleton decodes to the
    document without its records."""
    p = make_server_info(ranks=3, n_steps=9, bs=2, seed=4)
    data = msgspec.json.encode(p)
    sc = stream.scan(stream.BytesSource(data), chunk_bytes=chunk)
    assert sc is not None
    got = _records_of(sc, stream.BytesSource(data))
    for i, st in enumerate(p["internal_states"]):
        want = [msgspec.json.encode(r) for r in st["dspark_info_record"]["records"]]
        assert got[i] == want
        st["dspark_info_record"]["records"] = []
    assert json.loads(sc.skeleton) == p
    if chunk == 200:
        assert all(len(v) >= 3 for v in sc.arrays.values())  # (records longer than a chunk: read further)


def test_scan_pretty_bare_and_irregular_documents():
    """A pretty-printed document and a bare payload are cut too; a repeated key, a truncated document or a
    cut inside a record (the separator inside a nested value) make the scan give up (None)."""
    p = make_server_info(ranks=2, n_steps=5, bs=2, seed=5)
    pretty = json.dumps(p, indent=2).encode()
    sc = stream.scan(stream.BytesSource(pretty), chunk_bytes=64)
    assert sc is not None and sum(n for _, _, n in sc.arrays[1]) == 5
    bare = msgspec.json.encode(p["internal_states"][0]["dspark_info_record"])
    sc = stream.scan(stream.BytesSource(bare), chunk_bytes=64)
    assert sc is not None and sum(n for _, _, n in sc.arrays[None]) == 5
    data = msgspec.json.encode(p)
    assert stream.scan(stream.BytesSource(data[:-40])) is None
    assert stream.scan(stream.BytesSource(b'{"internal_states":[],' + data[1:])) is None
    nested = copy.deepcopy(p)
    nested["internal_states"][0]["dspark_info_record"]["records"][2]["extra"] = [{"a": 1}, {"forward_ct": 3}]
    text = msgspec.json.encode(nested)
    assert stream.scan(stream.BytesSource(text), chunk_bytes=1 << 20) is not None  # (no cut falls inside it)
    # tiny chunks: a cut lands inside that record (the decode check refuses it and reads further)
    whole = ServerInfoIngestor("r").feed_bytes(text)
    tiny = ServerInfoIngestor("r")
    tiny.chunk_bytes = 300
    parts: list = []
    tiny.sink = parts.append
    b = tiny.feed_bytes(text)
    for name in ("steps", "request_steps"):
        streamed = sum(x.n(name) for x in parts) + b.n(name)
        assert streamed == whole.n(name) == 2 * 5 * (1 if name == "steps" else 2)
    assert b.rejects_total() == whole.rejects_total() == 0


def test_scan_cuts_spaced_dumps_of_the_fixtures():
    """``json.dumps``-spaced documents (``}, {"forward_ct": ``, as the SGLang fixtures are saved) are cut
    between records too, not read whole."""
    for name in ("capacc.server_info.json", "compact.server_info.json"):
        src = stream.FileSource(FIX / name)
        sc = stream.scan(src, chunk_bytes=4000)
        doc = json.loads((FIX / name).read_bytes())
        for i, st in enumerate(doc["internal_states"]):
            assert len(sc.arrays[i]) > 5
            got = [json.loads(bytes(x)) for x in stream.ChunkedRecords(src, sc.arrays[i])[:]]
            assert got == st["dspark_info_record"]["records"]


def _store_rows(db: Path) -> dict:
    s = Store(db)
    out = {}
    for t in ("runs", "steps", "request_steps", "gaps", "rejects"):
        sql = {"runs": "SELECT run_id, arm, gamma FROM runs", "rejects": "SELECT * EXCLUDE (ingested_at) FROM rejects"}
        tbl = s.query_arrow(sql.get(t, f"SELECT * FROM {t}"))
        out[t] = sorted(map(repr, tbl.to_pylist()))
    return out


def test_ingest_in_tiny_chunks_stores_what_a_whole_read_stores(tmp_path, monkeypatch):
    """The fixture polls (overlapping rings: duplicates, watermarks carried between polls), a dump with bad
    records (rejected by field, in whichever chunk they fall) and a JSON-lines file of polls, ingested with
    16 MB chunks and with ~1 kB ones: the same rows, rejects and duplicate counts."""
    p = make_server_info(ranks=2, n_steps=30, bs=3, seed=9)
    recs = p["internal_states"][1]["dspark_info_record"]["records"]
    recs[11]["reqs"][1]["correct_drafts"] = 99
    recs[20]["bs"] = -5
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "bad.server_info.json").write_bytes(msgspec.json.encode(p))
    later = copy.deepcopy(p)
    for st in later["internal_states"]:
        rr = st["dspark_info_record"]["records"]
        st["dspark_info_record"]["records"] = rr[10:] + make_records(
            n_steps=5, gamma=7, bs=3, seed=3, first_fct=rr[-1]["forward_ct"] + 1, rid_prefix="z-")
    polls = msgspec.json.encode(p) + b"\n\n" + msgspec.json.encode(later) + b"\n"
    (tmp_path / "in2").mkdir()
    (tmp_path / "in2" / "two.polls.jsonl").write_bytes(polls)
    results = []
    for chunk in (stream.CHUNK_BYTES, 1000):
        monkeypatch.setattr(stream, "CHUNK_BYTES", chunk)
        db = tmp_path / f"s{chunk}.duckdb"
        sums = [ingest_paths([d], Store(db), progress=False)
                for d in (FIX / "capacc.polls.jsonl", tmp_path / "in", tmp_path / "in2")]
        results.append(([(s["tables"], s["rejects"]["count"]) for s in sums], _store_rows(db)))
    assert results[0] == results[1]
    tables, rejects = results[0][0][1]
    assert rejects >= 3 and tables["request_steps"]["written"] == 2 * 30 * 3 - 3 - 1  # (bad req; bs step's 3)
    assert results[0][0][0][0]["steps"]["duplicates_ignored"] > 0


def test_ingest_file_streams_rows_out_in_parts(tmp_path):
    """A dump several chunks long reaches the store through several writer appends (memory: one chunk)."""
    p = make_server_info(ranks=2, n_steps=200, bs=4, seed=2)
    f = tmp_path / "d.server_info.json"
    f.write_bytes(msgspec.json.encode(p))
    ing = ServerInfoIngestor("r", source="file")
    ing.chunk_bytes = 20_000
    parts: list = []
    ing.sink = parts.append
    b = ing.feed_source(stream.FileSource(f))
    assert len(parts) >= 8 and b.n("request_steps") == 0
    assert sum(x.n("request_steps") for x in parts) == 2 * 200 * 4
    assert [r.watermark for r in ing.ranks] == [rr["dspark_info_record"]["records"][-1]["forward_ct"]
                                               for rr in p["internal_states"]]
