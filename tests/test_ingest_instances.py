"""One ingest, few DuckDB instance starts: each open of the store file costs ~0.05 CPU-s (bench/ingest.py)."""

from __future__ import annotations

import json
from pathlib import Path

import duckdb
import pytest

from acceptscope import store_lock
from acceptscope.ingest import ingest_paths
from acceptscope.ingest.synth import make_server_info
from acceptscope.store import Store


@pytest.fixture
def opens(monkeypatch: pytest.MonkeyPatch) -> list[bool]:
    """Every read-write or read-only open of a store file in this process (the real open runs)."""
    seen: list[bool] = []
    real = store_lock.connect_file
    monkeypatch.setattr(store_lock, "connect_file", lambda *a, **k: seen.append(True) or real(*a, **k))
    return seen


def _dump(path: Path, seed: int = 1) -> Path:
    path.write_text(json.dumps(make_server_info(ranks=2, n_steps=20, bs=4, gamma=7, mode="cap-accept", seed=seed)))
    return path


def test_created_empty_until_anything_writes(tmp_path: Path) -> None:
    s = Store(tmp_path / "s.duckdb")
    assert s.created_empty()
    s.counts()  # a read changes nothing
    assert s.created_empty()
    con = duckdb.connect(str(s.path))  # another writer (as another process would)
    con.execute("INSERT INTO store_meta VALUES ('x', 'y')")
    con.close()
    assert not s.created_empty()
    assert not Store(s.path).created_empty()  # an existing file: unknown without a look


def test_fresh_store_ingest_opens_the_file_once(tmp_path: Path, opens: list[bool]) -> None:
    dump = _dump(tmp_path / "a.server_info.json")
    store = Store(tmp_path / "s.duckdb")
    opens.clear()
    s = ingest_paths([dump], store, run_id="r", progress=False)
    assert s["tables"]["request_steps"]["written"] == 2 * 20 * 4
    assert len(opens) == 1  # no run lookup on a file it created; the last flush and the closing writes share one
    assert store.counts()["request_steps"] == 2 * 20 * 4
    assert store.query_arrow("SELECT completed_at IS NOT NULL AS done FROM runs").column("done").to_pylist() == [True]


def test_stored_runs_are_still_looked_up(tmp_path: Path, opens: list[bool]) -> None:
    """A store that holds runs: the lookup opens it, and the run's gamma is checked against the next dump."""
    store = Store(tmp_path / "s.duckdb")
    ingest_paths([_dump(tmp_path / "a.server_info.json")], store, run_id="r", progress=False)
    other = tmp_path / "b"
    other.mkdir()
    bad = make_server_info(ranks=2, n_steps=5, bs=4, gamma=5, mode="cap-accept", seed=2)
    (other / "b.server_info.json").write_text(json.dumps(bad))
    opens.clear()
    s = ingest_paths([other], store, run_id="r", progress=False)
    # the run lookup, the epochs' placement under the run's ingest lock (startup order against the stored
    # incarnations), the run's resume (rank slots, epoch), the last flush + closing writes
    assert len(opens) == 4
    assert s["rejects"]["count"] >= 1 and "gamma" in " ".join(s["rejects"]["messages"])
