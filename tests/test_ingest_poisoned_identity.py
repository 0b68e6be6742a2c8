"""Run identity survives a poisoned value elsewhere in the dump (issue 30, item 3): a NaN confidence, a NaN
``predicted_step_ms`` or a lone surrogate in a rid costs its record, never the launch fields (no second run
filed under the file's name, no rows stored twice)."""

from __future__ import annotations

import msgspec
import pytest

from acceptscope.ingest import ingest_paths
from acceptscope.ingest.identity import identity_of_file
from acceptscope.ingest.synth import make_server_info
from acceptscope.store import Store


def _dump() -> dict:
    return make_server_info(ranks=1, n_steps=20, bs=2, gamma=4, seed=5)


def _poisoned(kind: str) -> bytes:
    d = _dump()
    rec = d["internal_states"][0]["dspark_info_record"]["records"][3]
    marker = 0.123456789
    if kind == "nan predicted_step_ms":
        rec["predicted_step_ms"] = marker
    elif kind == "nan confidence":
        req = rec["reqs"][0]
        key = next(k for k in req if "conf" in k)
        req[key] = [marker, *req[key][1:]] if isinstance(req[key], list) else marker
    else:
        rec["reqs"][0]["rid"] = "SURROGATE"
        return msgspec.json.encode(d).replace(b'"SURROGATE"', b'"a\\ud800b"')
    return msgspec.json.encode(d).replace(b"0.123456789", b"NaN")


@pytest.mark.parametrize("kind", ["nan confidence", "nan predicted_step_ms", "lone surrogate in a rid"])
def test_poisoned_value_keeps_the_run(tmp_path, kind):
    clean = tmp_path / "clean.json"
    clean.write_bytes(msgspec.json.encode(_dump()))
    bad = tmp_path / "capacc.json"  # (the file name the poisoned dump was filed under)
    bad.write_bytes(_poisoned(kind))
    assert identity_of_file(bad).run_id() == identity_of_file(clean).run_id()
    alone = Store(tmp_path / "alone.duckdb")
    s = ingest_paths([bad], alone, progress=False)
    assert s["runs"] == [identity_of_file(clean).run_id()]
    assert alone.counts()["steps"] >= 19  # at most the poisoned record is rejected (by field), never the dump
    store = Store(tmp_path / "s.duckdb")
    ingest_paths([clean], store, progress=False)
    n = store.counts()
    s = ingest_paths([bad], store, progress=False)
    assert s["runs"] == [identity_of_file(clean).run_id()]
    assert store.counts()["steps"] == n["steps"] and store.counts()["request_steps"] == n["request_steps"]
    assert store.query_df("SELECT count(*) AS n FROM runs")["n"].iloc[0] == 1
