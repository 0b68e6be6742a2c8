"""TelemetryWriter: producers, batching, flush semantics, backpressure, error surfacing, stats."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from acceptscope.store import Store
from acceptscope.writer import TelemetryWriter, WriterError
from bench.support import synthetic as H


# every guarantee below holds with the flush thread and without it (flushes committed by the appending thread)
both_modes = pytest.mark.parametrize("background", [True, False], ids=["flush-thread", "inline"])


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "w.duckdb")


@both_modes
def test_many_producers_mixed_inputs_all_rows_once(store: Store, background: bool) -> None:
    producers, per = 4, 12

    def produce(w: TelemetryWriter, p: int) -> None:
        for k in range(per):
            fct = (p * per + k) * 10
            rows = H.steps(10, start_forward_ct=fct)
            kind = k % 3
            w.append("steps", rows if kind == 0 else pd.DataFrame(rows) if kind == 1 else pa.Table.from_pylist(rows))
            w.append("request_steps", H.request_steps(80, start_forward_ct=fct, seed=k))

    with store.writer(flush_interval_s=0.05, background=background) as w:
        threads = [threading.Thread(target=produce, args=(w, p)) for p in range(producers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    st = w.stats()
    n = producers * per
    assert st["rows_offered"] == {"steps": 10 * n, "request_steps": 80 * n}
    assert st["rows_inserted"] == st["rows_offered"]
    assert 1 <= st["flushes"] <= 2 * n  # batched: never more flushes than appends
    assert store.counts()["steps"] == 10 * n and store.counts()["request_steps"] == 80 * n
    assert st["buffered_rows"] == 0


def test_background_flush_without_explicit_flush(store: Store) -> None:
    w = store.writer(flush_interval_s=0.1)
    try:
        w.append("steps", H.steps(5))
        deadline = time.monotonic() + 10
        while store.counts()["steps"] < 5 and time.monotonic() < deadline:
            time.sleep(0.02)
        assert store.counts()["steps"] == 5  # the flush thread committed it on its own
        assert w.stats()["flushes"] == 1
        assert 0.1 <= w.stats()["max_flush_latency_s"] < 10
    finally:
        w.close()


@both_modes
def test_flush_commits_everything_appended_before(store: Store, background: bool) -> None:
    with store.writer(flush_interval_s=60, background=background) as w:  # the timer never fires during the test
        w.append("steps", H.steps(7))
        w.flush()
        assert store.counts()["steps"] == 7
        w.flush()  # nothing new: returns at once
        w.append("steps", H.steps(3, start_forward_ct=7))
        assert store.counts()["steps"] == 7
    assert store.counts()["steps"] == 10  # close flushed the rest


@both_modes
def test_one_flush_is_one_transaction_across_tables(store: Store, background: bool) -> None:
    with store.writer(flush_interval_s=60, background=background) as w:
        w.append("runs", [H.run_row()])
        w.append("steps", H.steps(4))
        w.append("request_steps", H.request_steps(16))
        w.flush()
        assert w.stats()["flushes"] == 1
    c = store.counts("run-a")
    assert (c["runs"], c["steps"], c["request_steps"]) == (1, 4, 16)


@both_modes
def test_backpressure_bounds_the_buffer(store: Store, background: bool) -> None:
    with store.writer(flush_interval_s=60, max_buffer_rows=500, background=background) as w:
        for k in range(12):
            w.append("request_steps", H.request_steps(200, start_forward_ct=25 * k, seed=k))
            assert w.stats()["buffered_rows"] <= 500 + 200
        st = w.stats()
    assert st["flushes"] >= 3  # the bound forced flushes although the timer never fired
    assert store.counts()["request_steps"] == 2400


@both_modes
def test_backpressure_by_bytes(store: Store, background: bool) -> None:
    one = H.request_steps(100)
    with store.writer(flush_interval_s=60, max_buffer_bytes=3 * one.nbytes, background=background) as w:
        for k in range(10):
            w.append("request_steps", H.request_steps(100, start_forward_ct=13 * k, seed=k))
        assert w.stats()["max_buffered_bytes"] <= 5 * one.nbytes
        assert w.stats()["flushes"] >= 2


def test_flush_thread_error_surfaces_and_rows_are_kept(tmp_path: Path) -> None:
    store = Store(tmp_path / "e.duckdb", lock_timeout_s=0.3)
    blocker = duckdb.connect(str(store.path), read_only=True)  # the writer cannot open read-write
    try:
        w = store.writer(flush_interval_s=0.05)
        w.append("steps", H.steps(6))
        with pytest.raises(WriterError, match="TimeoutError") as exc:
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.05)
                w.append("steps", H.steps(1, start_forward_ct=100))
        assert isinstance(exc.value.__cause__, TimeoutError)
        with pytest.raises(WriterError):
            w.flush()
        with pytest.raises(WriterError):
            w.close()
        failed = w.failed
        assert failed["steps"].num_rows >= 6
    finally:
        blocker.close()
    # the caller can retry the kept rows: nothing was lost
    with store.writer() as w2:
        w2.append("steps", failed["steps"])
    assert store.counts()["steps"] == failed["steps"].num_rows


def test_bad_input_raises_in_producer_and_writer_keeps_working(store: Store) -> None:
    with store.writer(flush_interval_s=60) as w:
        with pytest.raises(ValueError, match="unknown column"):
            w.append("steps", [{"run_id": "r", "rank": 0, "epoch": 0, "forward_ct": 1, "oops": 1}])
        with pytest.raises(KeyError):
            w.append("nope", [])
        assert w.append("steps", []) == 0
        w.append("steps", H.steps(2))
    assert store.counts()["steps"] == 2
    with pytest.raises(WriterError, match="closed"):
        w.append("steps", H.steps(1))
    w.close()  # idempotent


def test_reingest_through_writer_is_idempotent(store: Store) -> None:
    data = H.request_steps(3000, seed=5)
    for _ in range(2):
        with store.writer(flush_interval_s=0.05) as w:
            for i in range(0, 3000, 500):
                w.append("request_steps", data.slice(i, 500))
    assert w.stats()["rows_inserted"]["request_steps"] == 0
    assert store.counts()["request_steps"] == 3000


def test_invalid_settings() -> None:
    with pytest.raises(ValueError):
        TelemetryWriter.__init__(object.__new__(TelemetryWriter), None, flush_interval_s=0)  # type: ignore[arg-type]


@both_modes
def test_append_many_is_validated_and_flushed_as_one_unit(store: Store, background: bool) -> None:
    with store.writer(flush_interval_s=60, background=background) as w:
        with pytest.raises(ValueError, match="unknown column"):
            w.append_many({"steps": H.steps(2), "request_steps": [{"bogus": 1}]})
        assert w.stats()["buffered_rows"] == 0  # the valid part was not buffered either
        got = w.append_many({"steps": H.steps(3), "request_steps": H.request_steps(24), "gaps": []})
        assert got == {"steps": 3, "request_steps": 24, "gaps": 0}
        w.flush()
        assert w.stats()["flushes"] == 1
    assert (store.counts()["steps"], store.counts()["request_steps"]) == (3, 24)


@both_modes
def test_close_then_shares_the_last_flush_connection(store: Store, monkeypatch: pytest.MonkeyPatch,
                                                     background: bool) -> None:
    """close(then=...): the buffered rows and the caller's closing writes go through ONE open of the file."""
    from acceptscope import store_lock

    opens: list[bool] = []
    real = store_lock.connect_file
    monkeypatch.setattr(store_lock, "connect_file", lambda *a, **k: opens.append(True) or real(*a, **k))
    w = store.writer(flush_interval_s=3600, background=background)
    w.append("runs", [H.run_row()])
    w.append("steps", H.steps(5))
    seen: dict = {}
    w.close(then=lambda: seen.update(store.counts()))  # nested: reads on the writer's connection
    assert seen["steps"] == 5 and seen["runs"] == 1  # then() ran after the last flush, inside it
    assert len(opens) == 1
    assert w.stats()["rows_inserted"] == {"runs": 1, "steps": 5}
    w.close(then=lambda: seen.update(again=True))  # closed: idempotent, then() not run twice
    assert "again" not in seen
    assert store.counts()["steps"] == 5


@both_modes
def test_close_then_not_run_when_the_last_flush_fails(tmp_path: Path, background: bool) -> None:
    store = Store(tmp_path / "f.duckdb", lock_timeout_s=0.3)
    w = store.writer(flush_interval_s=3600, background=background)
    w.append("steps", H.steps(4))
    blocker = duckdb.connect(str(store.path), read_only=True)  # the closing thread cannot open read-write
    ran: list[bool] = []
    try:
        with pytest.raises(WriterError, match="TimeoutError") as exc:
            w.close(then=lambda: ran.append(True))
        assert isinstance(exc.value.__cause__, TimeoutError)
        with pytest.raises(WriterError):
            w.close()  # the failure stays
    finally:
        blocker.close()
    assert not ran
    assert w.failed["steps"].num_rows == 4  # kept for a retry, as a failed background flush keeps them
    assert store.counts()["steps"] == 0


def test_inline_writer_commits_a_due_flush_in_the_appending_thread(store: Store) -> None:
    """background=False: no flush thread; the append that finds the bound reached, or the interval passed
    since the oldest buffered append, commits the buffer before it returns."""
    before = set(threading.enumerate())
    w = store.writer(flush_interval_s=0.2, max_buffer_rows=100, background=False)
    try:
        assert w._thread is None and set(threading.enumerate()) <= before  # (another test's writer may still run)
        w.append("steps", H.steps(60))
        assert store.counts()["steps"] == 0 and w.stats()["buffered_rows"] == 60  # neither bound nor interval
        w.append("steps", H.steps(60, start_forward_ct=60))  # 120 > 100 rows: committed by this append
        assert store.counts()["steps"] == 120 and w.stats()["buffered_rows"] == 0
        w.append("steps", H.steps(5, start_forward_ct=120))
        time.sleep(0.3)
        assert store.counts()["steps"] == 120  # nothing runs between appends
        w.append("steps", H.steps(5, start_forward_ct=125))  # the oldest buffered append is past the interval
        assert store.counts()["steps"] == 130
        assert w.stats()["flushes"] == 2
    finally:
        w.close()


def test_inline_commit_error_raises_from_append_and_rows_are_kept(tmp_path: Path) -> None:
    store = Store(tmp_path / "i.duckdb", lock_timeout_s=0.3)
    w = store.writer(flush_interval_s=3600, max_buffer_rows=10, background=False)
    w.append("steps", H.steps(6))
    blocker = duckdb.connect(str(store.path), read_only=True)
    try:
        with pytest.raises(WriterError, match="TimeoutError") as exc:
            w.append("steps", H.steps(6, start_forward_ct=6))  # over the bound: this append commits, and fails
        assert isinstance(exc.value.__cause__, TimeoutError)
        with pytest.raises(WriterError):
            w.append("steps", H.steps(1, start_forward_ct=50))  # sticky
        with pytest.raises(WriterError):
            w.close()
    finally:
        blocker.close()
    assert w.failed["steps"].num_rows == 12
    with store.writer(background=False) as w2:
        w2.append("steps", w.failed["steps"])
    assert store.counts()["steps"] == 12


@pytest.mark.parametrize("cpus", [1, 2])
def test_bulk_ingest_writes_inline_on_one_cpu(store: Store, monkeypatch: pytest.MonkeyPatch, cpus: int) -> None:
    """A dump's ingest on one usable CPU commits in the parsing thread (a flush thread would only add
    switches there); with more it keeps the flush thread, which overlaps the parse."""
    import acceptscope.ingest as ingest

    monkeypatch.setattr(ingest, "usable_cpus", lambda: cpus)
    w = ingest._bulk_writer(store)
    try:
        assert (w._thread is None) == (cpus == 1)
        w.append("steps", H.steps(3))
    finally:
        w.close()
    assert store.counts()["steps"] == 3


def test_a_dump_ingested_through_the_inline_writer_equals_the_flush_thread_one(tmp_path: Path,
                                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """The same dump, several flushes each way: every stored table and every summary is the same
    whether the flushes ran in a flush thread or in the parsing thread."""
    import json

    import acceptscope.ingest as ingest
    from acceptscope import schema
    from acceptscope.ingest import stream
    from acceptscope.ingest.synth import make_server_info

    dump = tmp_path / "server_info.json"
    dump.write_text(json.dumps(make_server_info(ranks=2, n_steps=150, bs=8, gamma=6, mode="cap-accept", seed=5)))
    monkeypatch.setattr(stream, "CHUNK_BYTES", 32 << 10)  # chunks of records small enough for several flushes
    tables = {}
    for background in (True, False):
        writers: list[TelemetryWriter] = []
        monkeypatch.setattr(ingest, "_bulk_writer", lambda s, b=background: writers.append(s.writer(
            flush_interval_s=3600, max_buffer_rows=500, background=b)) or writers[-1])
        store = Store(tmp_path / f"{background}.duckdb")
        got = ingest.ingest_paths([dump], store, run_id="r", progress=False)
        assert got["tables"]["request_steps"]["written"] == 2 * 150 * 8
        assert writers[0].stats()["flushes"] >= 3
        with store.snapshot() as con:
            tables[background] = {
                t.name: con.execute(f"SELECT * FROM {t.name} ORDER BY ALL").fetchall()
                for t in (*schema.ALL_TABLES, *schema.SUMMARY_TABLES) if t.name != "runs"}
    assert tables[True]["sum_cells"] and tables[True]["sum_requests"]
    for name in tables[True]:  # (float sums to the last bits: DuckDB's threads add the steps' bins in any order)
        a, b = tables[True][name], tables[False][name]
        assert len(a) == len(b), name
        for x, y in zip(a, b):
            assert [v if not isinstance(v, float) else pytest.approx(v, rel=1e-12, nan_ok=True) for v in x] == list(y), name
