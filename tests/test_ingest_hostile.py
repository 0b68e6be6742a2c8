"""Hostile ingest inputs (issue 11): one bad value never costs a file, a special file never hangs.

Each case poisons one value of a real SGLang-produced artifact, ingests it *before* a clean copy of
another artifact in the same call, and checks: no exception, the poisoned record alone is rejected
(named by file, line and field), every other row of that file and every row of the later file is
stored.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

from acceptscope.ingest import ingest_paths
from acceptscope.ingest.batch import REJECT_CAP
from acceptscope.store import Store
from bench.support.poison_values import replace_site, value_sites

FX = Path(__file__).resolve().parents[1] / "fixtures" / "sglang"
POISONS = {"2**63": str(2**63), "2**70": str(2**70), "\\ud800": '"\\ud800"', "deep": "[" * 5000 + "]" * 5000}
# (fixture, key poisoned, the unit that must be lost: table -> rows)
CASES = [
    ("capacc.estimator.jsonl", "fct", {"estimator_rows": 1, "estimator_gather": 1}),
    ("capacc.server_info.json", "prefix_len", {"request_steps": 1}),
    ("capacc.generate.json", "prompt_tokens", {"requests": 1}),
    ("capacc.openai.jsonl", "prompt_tokens", {"requests": 1}),
    ("spsprof.records.jsonl", "forward_ct", {"sps_profile_records": 1}),
    ("spsprof.rounds.jsonl", "batch_tokens", {"sps_profile_rounds": 1}),
]
LATER = FX / "compact.server_info.json"  # ingested after the poisoned file, in the same call


def _ingest(tmp_path: Path, files: list[Path]) -> tuple[dict, dict]:
    store = Store(tmp_path / "x.duckdb")
    summary = ingest_paths(files, store, progress=False)
    counts = {k: v for k, v in store.counts().items() if v}
    return summary, counts


@pytest.fixture(scope="module")
def baseline(tmp_path_factory):
    out = {}
    for name, _, _ in CASES:
        d = tmp_path_factory.mktemp("base")
        _, counts = _ingest(d, [FX / name, LATER])
        out[name] = counts
    return out


@pytest.mark.parametrize("poison", list(POISONS))
@pytest.mark.parametrize("name,key,lost", CASES, ids=[c[0] for c in CASES])
def test_one_poisoned_value_costs_one_record(tmp_path, baseline, name, key, lost, poison):
    text = (FX / name).read_text()
    site = next(m for m in value_sites(text) if m.group(1).startswith(f'"{key}"'))
    bad = tmp_path / name
    bad.write_text(replace_site(text, site, POISONS[poison]))
    summary, counts = _ingest(tmp_path, [bad, LATER])
    want = dict(baseline[name])
    for table, n in lost.items():
        want[table] = want.get(table, 0) - n
    want = {k: v for k, v in want.items() if v}
    want["rejects"] = want.get("rejects", 0) + counts.get("rejects", 0) - baseline[name].get("rejects", 0)
    assert counts == want  # every other row of the poisoned file, and all of the later file
    rejects = [m for m in summary["rejects"]["messages"] if m.startswith(str(bad))]
    assert rejects, summary["rejects"]
    line = text[: site.start()].count("\n") + 1 if name.endswith(".jsonl") else 1
    assert any(m.startswith(f"{bad}:{line}: ") and key in m or "nested" in m for m in rejects), rejects


def test_one_bad_line_among_estimator_lines_keeps_the_rest(tmp_path):
    """issue 11: one bad line among 294 estimator lines: 0 kept. Now 293 lines' rows are kept."""
    lines = (FX / "capacc.estimator.jsonl").read_text().splitlines()
    bad = lines[:]
    bad[100] = bad[100].replace('"fct": ', f'"fct": {2**63}, "x": ', 1)
    f = tmp_path / "run.estimator.jsonl"
    f.write_text("\n".join(bad) + "\n")
    summary, counts = _ingest(tmp_path, [f])
    assert summary["rejects"]["count"] == 1
    assert summary["rejects"]["messages"][0].startswith(f"{f}:101: fct: integer 9223372036854775808 outside int64")
    good = tmp_path / "good"
    good.mkdir()
    (good / "run.estimator.jsonl").write_text("\n".join(lines) + "\n")
    _, full = _ingest(good, [good / "run.estimator.jsonl"])
    assert counts["estimator_rows"] == full["estimator_rows"] - 1


def test_rejects_are_capped_per_file_with_a_count_of_the_rest(tmp_path):
    """issue 11: 1M `{}` records wrote 1M reject rows. Past the cap they are counted in one summary row."""
    n = 20_000
    f = tmp_path / "junk.estimator.jsonl"
    f.write_text('{"rid": "a", "fct": 1, "w": 0, "cl": 0, "ct": 0}\n' + "{}\n" * n)
    summary, counts = _ingest(tmp_path, [f])
    assert counts["estimator_rows"] == 1
    assert counts["rejects"] == REJECT_CAP + 1
    assert summary["rejects"]["count"] == n and summary["rejects"]["not_stored"] == n - REJECT_CAP
    store = Store(tmp_path / "x.duckdb", read_only=True)
    (reason,) = store.query_arrow("SELECT reason FROM rejects WHERE reason LIKE '%more rejects%'").column(0).to_pylist()
    assert reason.startswith(f"{n - REJECT_CAP} more rejects not stored")


def _in_thread(fn, timeout_s: float = 20.0):
    out: dict = {}
    t = threading.Thread(target=lambda: out.setdefault("v", fn()), daemon=True)
    t.start()
    t.join(timeout_s)
    assert not t.is_alive(), "ingest hung"
    return out["v"]


@pytest.mark.skipif(not hasattr(os, "mkfifo"), reason="no FIFOs here")
def test_special_files_are_refused_without_hanging(tmp_path):
    fifo = tmp_path / "a.server_info.json"
    os.mkfifo(fifo)
    zero = tmp_path / "b.estimator.jsonl"
    zero.symlink_to("/dev/zero")
    summary = _in_thread(lambda: ingest_paths([fifo, zero, LATER], Store(tmp_path / "x.duckdb"), progress=False))
    msgs = summary["rejects"]["messages"]
    assert any(m.startswith(f"{fifo}:0: $: not a regular file: a FIFO") for m in msgs), msgs
    assert any(m.startswith(f"{zero}:0: $: not a regular file: a character device (through a symlink)")
               for m in msgs), msgs
    assert summary["tables"]["request_steps"]["written"] > 0  # the regular file after them is ingested


def test_symlinked_directories_are_followed(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (real / "capacc.estimator.jsonl").write_bytes((FX / "capacc.estimator.jsonl").read_bytes())
    top = tmp_path / "top"
    top.mkdir()
    (top / "linked").symlink_to(real, target_is_directory=True)
    (top / "loop").symlink_to(top, target_is_directory=True)  # a link loop ends
    summary, counts = _ingest(tmp_path, [top])
    assert counts["estimator_rows"] > 0 and len(summary["files"]) == 1


def test_duplicate_key_with_empty_states_is_reported(tmp_path):
    text = (FX / "capacc.server_info.json").read_text().rstrip()
    f = tmp_path / "dup.server_info.json"
    f.write_text(text[:-1] + ', "internal_states": []}')
    summary, counts = _ingest(tmp_path, [f])
    (msg,) = summary["rejects"]["messages"]
    assert msg.startswith(f"{f}:1: internal_states: empty: ") and "repeats the top-level key" in msg


def test_rejected_step_header_takes_its_request_rows(tmp_path):
    """issue 11: 6 orphan request_steps per rejected step header."""
    text = (FX / "capacc.server_info.json").read_text()
    site = next(m for m in value_sites(text) if m.group(1).startswith('"bs"'))
    f = tmp_path / "r.server_info.json"
    f.write_text(replace_site(text, site, str(2**40)))
    summary, _ = _ingest(tmp_path, [f])
    store = Store(tmp_path / "x.duckdb", read_only=True)
    orphans = store.query_arrow(
        "SELECT count(*) FROM request_steps q ANTI JOIN steps s USING (run_id, rank, epoch, forward_ct)").column(0)
    assert orphans.to_pylist() == [0]
    dropped = [m for m in summary["rejects"]["messages"] if "request row dropped with it" in m]
    assert len(dropped) == 6  # the first record's bs: its 6 request rows, each counted as a reject


def test_undecodable_file_name_gives_a_storable_run_id(tmp_path):
    name = os.fsdecode(b"\xff\xfe.estimator.jsonl")
    f = tmp_path / name
    f.write_bytes((FX / "capacc.estimator.jsonl").read_bytes())
    summary, counts = _ingest(tmp_path, [f])
    assert counts["estimator_rows"] > 0 and summary["files"][0]["run_id"] == "\\udcff\\udcfe"
