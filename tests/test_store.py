"""Store: schema, input coercion, idempotent appends (both dedupe designs), readers, probes."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import duckdb
import pandas as pd
import pyarrow as pa
import pytest

from acceptscope import schema
from acceptscope.store import Store, as_arrow
from bench.support import synthetic as H
from tests._close import assert_close

KEY = list(schema.REQUEST_STEPS.key)


@pytest.fixture(params=[False, True], ids=["antijoin", "primary-key"])
def any_store(request, tmp_path: Path) -> Store:
    """Both dedupe designs, for the tests about idempotency and transactions."""
    return Store(tmp_path / "t.duckdb", primary_keys=request.param)


@pytest.fixture
def store(tmp_path: Path) -> Store:
    return Store(tmp_path / "t.duckdb")


def _sorted(t: pa.Table, keys=KEY) -> pa.Table:
    return t.sort_by([(k, "ascending") for k in keys])


def test_creates_every_table_and_detects_layout(tmp_path: Path) -> None:
    s = Store(tmp_path / "a.duckdb")
    assert set(s.counts()) == set(schema.TABLES)
    assert s.primary_keys is False
    pk = Store(tmp_path / "b.duckdb", primary_keys=True)
    assert pk.primary_keys is True
    # an existing file keeps the layout it was created with
    assert Store(tmp_path / "b.duckdb", primary_keys=False).primary_keys is True
    assert Store(tmp_path / "a.duckdb", primary_keys=True).primary_keys is False


def test_arrow_roundtrip_is_exact(any_store: Store) -> None:
    store = any_store
    data = H.request_steps(2000, seed=3)
    assert store.append({"request_steps": data}) == {"request_steps": 2000}
    got = store.read_arrow("request_steps", "run-a")
    assert got.schema == schema.REQUEST_STEPS.arrow_schema
    assert_close(_sorted(got), _sorted(data))


def test_reingest_inserts_nothing_and_partial_overlap_inserts_only_new(any_store: Store) -> None:
    store = any_store
    data = H.request_steps(6_000, seed=1)
    assert store.write_arrow({"request_steps": data}) == {"request_steps": 6_000}
    assert store.write_arrow({"request_steps": data}) == {"request_steps": 0}
    # overlap spanning old and new keys, plus duplicates inside the batch itself
    more = H.request_steps(8_000, seed=1)  # same first 6k rows, 2k new ones
    batch = pa.concat_tables([more.slice(5_000), more.slice(7_000)])
    assert store.write_arrow({"request_steps": batch}) == {"request_steps": 2_000}
    assert store.counts()["request_steps"] == 8_000
    distinct = store.query_df(
        f"SELECT count(*) AS n FROM (SELECT DISTINCT {', '.join(KEY)} FROM request_steps)"
    )["n"][0]
    assert distinct == 8_000


def test_dedupe_prunes_by_key_range_without_missing_old_keys(any_store: Store) -> None:
    store = any_store
    # old rows far apart in forward_ct; a batch whose range covers an old key in the middle
    store.append({"steps": H.steps(10, start_forward_ct=0) + H.steps(10, start_forward_ct=5000)})
    batch = H.steps(1, start_forward_ct=5003) + H.steps(1, start_forward_ct=9000) + H.steps(1, start_forward_ct=2)
    assert store.write_arrow({"steps": as_arrow(schema.STEPS, batch)}) == {"steps": 1}
    assert store.counts()["steps"] == 21


def test_string_keys_with_quotes_are_safe(any_store: Store) -> None:
    store = any_store
    rows = [H.run_row("o'brien; DROP TABLE runs --"), H.run_row("plain")]
    store.append({"runs": rows})
    store.append({"runs": rows})
    assert sorted(store.runs()["run_id"]) == sorted(r["run_id"] for r in rows)


def test_dict_dataframe_and_recordbatch_inputs(store: Store) -> None:
    rows = H.steps(50)
    store.append({"steps": rows[:20]})
    store.append({"steps": pd.DataFrame(rows[20:40])})
    store.append({"steps": pa.RecordBatch.from_pylist(rows[40:])})
    df = store.read_table("steps", "run-a")
    assert len(df) == 50
    assert sorted(df["forward_ct"]) == list(range(50))
    assert df.set_index("forward_ct").loc[7, "step_gpu_ms"] == pytest.approx(10.0)
    # a DataFrame read back (numpy-array list columns, tz timestamps) re-appends as duplicates only
    store.append({"runs": [dict(H.run_row(), started_at=pd.Timestamp("2026-01-01", tz="UTC"))]})
    store.append({"request_steps": H.request_steps(300)})
    for name in ("runs", "request_steps"):
        back = store.read_table(name)
        assert store.write_arrow({name: as_arrow(schema.table(name), back)}) == {name: 0}
        assert store.read_arrow(name).num_rows == len(back)


def test_bad_input_names_table_column_and_row(store: Store) -> None:
    with pytest.raises(ValueError, match=r"steps.*unknown column\(s\) \['forwardct'\]"):
        store.append({"steps": [{"run_id": "r", "rank": 0, "epoch": 0, "forwardct": 1}]})
    with pytest.raises(ValueError, match=r"'forward_ct' is required but has 1 NULL"):
        store.append({"steps": [{"run_id": "r", "rank": 0, "epoch": 0}]})
    with pytest.raises(ValueError, match=r"column 'bs' row 1 value 'eight'"):
        store.append({"steps": [dict(H.steps(1)[0], bs=8), dict(H.steps(1)[0], bs="eight")]})
    with pytest.raises(ValueError, match=r"DataFrame for table 'steps' has unknown column"):
        store.append({"steps": pd.DataFrame({"nope": [1]})})
    with pytest.raises(KeyError, match="unknown table 'stepz'"):
        store.append({"stepz": []})
    assert store.counts()["steps"] == 0


def test_one_transaction_across_tables(any_store: Store) -> None:
    store = any_store
    with store.connect() as con:  # make the second insert of the flush fail inside DuckDB
        con.execute("DROP TABLE gaps")
    with pytest.raises(duckdb.CatalogException):
        store.append({"runs": [H.run_row("tx")], "steps": H.steps(3),
                      "gaps": [{"run_id": "tx", "rank": 0, "epoch": 0, "from_forward_ct": 1,
                                "to_forward_ct": 5, "kind": "missing"}]})
    assert store.query_df("SELECT count(*) AS n FROM runs")["n"][0] == 0  # rolled back with the failure
    assert store.query_df("SELECT count(*) AS n FROM steps")["n"][0] == 0


def test_counts_probe_and_readers(store: Store) -> None:
    store.append({"runs": [H.run_row("a"), H.run_row("b")], "steps": H.steps(30, run_id="a"),
                  "request_steps": H.request_steps(80, run_id="a")})
    store.append({"steps": [dict(r, epoch=1) for r in H.steps(5, run_id="a")]})
    assert store.counts("a")["steps"] == 35 and store.counts("b")["steps"] == 0
    assert "sts_tables" not in store.counts("a") and store.counts()["runs"] == 2
    probe = store.latest_forward_ct("a")
    assert probe == {"steps": 35, "request_steps": 80, "epoch": 1, "forward_ct": 4}
    assert store.latest_forward_ct("b") == {"steps": 0, "request_steps": 0, "epoch": None, "forward_ct": None}
    assert list(store.read_table("steps", ["a"], columns=["forward_ct"]).columns) == ["forward_ct"]
    with store.snapshot() as con:
        assert con.execute("SELECT count(*) FROM runs").fetchone()[0] == 2
        # nested calls on the same thread reuse the open connection
        assert store.counts()["runs"] == 2
    assert list(store.runs()["run_id"]) == ["a", "b"]


def test_read_only_store(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        Store(tmp_path / "missing.duckdb", read_only=True)
    duckdb.connect(str(tmp_path / "other.duckdb")).close()
    with pytest.raises(ValueError, match="not an acceptscope store"):
        Store(tmp_path / "other.duckdb", read_only=True)
    Store(tmp_path / "s.duckdb").append({"runs": [H.run_row()]})
    ro = Store(tmp_path / "s.duckdb", read_only=True)
    assert ro.counts()["runs"] == 1
    with pytest.raises(PermissionError):
        ro.append({"runs": [H.run_row("x")]})
    with pytest.raises(PermissionError):
        ro.writer()


def test_reader_threads_and_writer_thread_in_one_process(tmp_path: Path) -> None:
    """DuckDB refuses mixed read-only/read-write connections in one process; the store serialises them."""
    s = Store(tmp_path / "t.duckdb")
    errors: list[BaseException] = []
    seen: list[list[int]] = [[], []]
    stop = threading.Event()

    def read(i: int) -> None:
        try:
            while not stop.is_set():
                seen[i].append(s.counts("run-a")["request_steps"])
        except BaseException as e:  # noqa: BLE001
            errors.append(e)

    def reads_at_least(n: int) -> None:  # (a busy single CPU may starve a reader for a while: wait, not race)
        deadline = time.monotonic() + 60
        while min(len(c) for c in seen) < n and not errors and time.monotonic() < deadline:
            time.sleep(0.01)

    readers = [threading.Thread(target=read, args=(i,)) for i in range(2)]
    for r in readers:
        r.start()
    reads_at_least(1)  # both readers are in their loops before the writer starts
    with s.writer(flush_interval_s=0.05) as w:
        for k in range(20):
            w.append("request_steps", H.request_steps(200, start_forward_ct=25 * k, seed=k))
    reads_at_least(2)
    stop.set()
    for r in readers:
        r.join()
    assert errors == []
    assert s.counts()["request_steps"] == 4000
    for counts in seen:
        assert len(counts) >= 2
        assert all(a <= b for a, b in zip(counts, counts[1:])) and counts[-1] <= 4000


def test_arrival_order_is_kept(store: Store) -> None:
    """The default (index-free) design appends surviving rows in arrival order (INSERT OR IGNORE does not)."""
    order = [5, 3, 9, 1, 7, 0, 8, 2, 6, 4]
    store.append({"steps": [H.steps(1, start_forward_ct=k)[0] for k in order[:6]]})
    store.append({"steps": [H.steps(1, start_forward_ct=k)[0] for k in order]})  # 6 dups, 4 new
    assert list(store.read_table("steps")["forward_ct"]) == order


def test_bulk_path_probe_sees_only_rows_inside_the_batch_key_box(store: Store) -> None:
    """The semi-join is skipped exactly when no stored row lies in the batch's key box."""
    from acceptscope.store_dedupe import _key_ranges, _may_collide

    t = schema.REQUEST_STEPS
    first = H.request_steps(800, start_forward_ct=0)
    later = H.request_steps(800, start_forward_ct=1_000)  # forward_ct range past the stored one

    def probe(con, batch) -> bool:
        return _may_collide(con, t, _key_ranges(t, batch, "e"))
    with store.connect() as con:
        assert not probe(con, first)  # empty table
    assert store.write_arrow({"request_steps": first}) == {"request_steps": 800}
    with store.connect() as con:
        assert probe(con, first)
        assert not probe(con, later)
        assert not probe(con, H.request_steps(800, run_id="run-b"))
    assert store.write_arrow({"request_steps": later}) == {"request_steps": 800}
    # a batch past the stored range with repeats inside it: the bulk path still drops them
    more = H.request_steps(400, start_forward_ct=5_000)
    assert store.write_arrow({"request_steps": pa.concat_tables([more, more.slice(100, 50)])}) == {
        "request_steps": 400}
    assert store.write_arrow({"request_steps": pa.concat_tables([first, later, more])}) == {"request_steps": 0}
    n = store.counts()["request_steps"]
    distinct = store.query_df(f"SELECT count(*) AS n FROM (SELECT DISTINCT {', '.join(KEY)} FROM request_steps)")
    assert n == 2_000 == distinct["n"][0]


def test_dedupe_batch_packed_keys_and_group_by_fallback_agree() -> None:
    """The packed-int64 uniqueness check and the Arrow group-by keep the same (first) rows."""
    from acceptscope.store_dedupe import _packed_keys, dedupe_batch

    t = schema.REQUEST_STEPS
    data = H.request_steps(600, seed=4)
    assert dedupe_batch(t, data) is data  # unique keys: returned as is
    dup = pa.concat_tables([data.slice(0, 300), data.slice(100, 50), data.slice(300)])
    got = dedupe_batch(t, dup)
    assert_close(got, data)
    # keys too wide to pack (forward_ct spanning int64) fall back to the group-by, same result
    wide = data.set_column(t.names.index("forward_ct"), "forward_ct",
                           pa.array([0, 2**62] * 300, pa.int64()))
    assert _packed_keys(t, wide.select(KEY)) is None
    wide_dup = pa.concat_tables([wide, wide.slice(10, 5)])
    assert dedupe_batch(t, wide_dup).num_rows == dedupe_batch(t, wide).num_rows
    # distinct keys never pack to one value: (rank, forward_ct) = (0, 1) vs (1, 0)
    two = H.request_steps(2, seed=5)
    two = two.set_column(t.names.index("rank"), "rank", pa.array([0, 1], pa.int32()))
    two = two.set_column(t.names.index("forward_ct"), "forward_ct", pa.array([1, 0], pa.int64()))
    two = two.set_column(t.names.index("rid"), "rid", pa.array(["x", "x"]))
    packed = _packed_keys(t, two.select(KEY))
    assert packed is not None and packed[0] != packed[1]
    assert dedupe_batch(t, two) is two
