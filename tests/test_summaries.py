"""Writer-maintained summaries: counted once per inserted row, equal to the raw aggregation, and
stores without them (schema version 1, or rows appended past the store) still answer the same."""

from __future__ import annotations

import shutil
import subprocess
import sys
import tracemalloc
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from acceptscope import audit_sampling, batch_summaries, schema, summaries
from acceptscope.store import Store
from acceptscope.writer import TelemetryWriter
from acceptscope.figures import tables as figures
from acceptscope.reader import Reader
from bench.support import synthetic as H
from tests._close import assert_close

RUNS = ["run-a", "run-b"]


def _requests(rs: pa.Table) -> list[dict]:
    df = rs.select(["run_id", "rid", "workload"]).to_pandas().drop_duplicates(["run_id", "rid"])
    return [dict(run_id=r.run_id, rid=r.rid, workload=r.workload, prompt_index=i, seed=7)
            for i, r in enumerate(df.itertuples(index=False))]


def _fill(store: Store) -> None:
    """Two runs written in overlapping pieces (every row offered two or three times), one through the writer."""
    a = H.request_steps(3000, run_id="run-a", seed=1)
    b = H.request_steps(2000, run_id="run-b", seed=2)
    store.append({"runs": [H.run_row("run-a", "compact"), H.run_row("run-b", "cap-accept")],
                  "steps": H.steps(400, run_id="run-a") + H.steps(250, run_id="run-b"),
                  "requests": _requests(a) + _requests(b)})
    store.append({"request_steps": a.slice(0, 2000)})
    store.append({"request_steps": a.slice(1000, 2000), "steps": H.steps(400, run_id="run-a")})
    with TelemetryWriter(store, flush_interval_s=60) as w:
        w.append("request_steps", b)
        w.append("request_steps", b.slice(500, 800))
        w.append("request_steps", a)


def _panels(r: Reader) -> dict[str, pd.DataFrame]:
    return {
        "run_summary": r.run_summary(RUNS),
        "window_distribution": r.window_distribution(RUNS),
        "position_acceptance": r.position_acceptance(RUNS),
        "utilization_by_workload": r.utilization_by_workload(RUNS),
        "regime_by_workload": r.regime_by_workload(RUNS),
        "requests": r.requests("run-b"),
        "reliability_bins": figures.reliability_bins(r, ["run-b"]),
        "reliability_bins_8": figures.reliability_bins(r, ["run-b"], 8),
        "per_request": audit_sampling.per_request(r, "run-a", "run-b"),
        # the dashboard's workload filter reads the summaries too (they are kept per workload)
        "run_summary_w": r.run_summary(RUNS, workloads=[H.WORKLOADS[0]]),
        "position_acceptance_w": r.position_acceptance(RUNS, workloads=H.WORKLOADS[:2]),
        "reliability_bins_w": figures.reliability_bins(r, ["run-b"], workloads=[H.WORKLOADS[1]]),
        "step_costs_binned": r.step_costs(RUNS, 3),  # 250-400 steps: read from the step bins
    }


def _same(a: dict[str, pd.DataFrame], b: dict[str, pd.DataFrame]) -> None:
    for name in a:
        assert len(a[name]) > 0, name
        pd.testing.assert_frame_equal(a[name].reset_index(drop=True), b[name].reset_index(drop=True),
                                      check_dtype=False, rtol=1e-9, obj=name)


@pytest.fixture(scope="module")
def template(tmp_path_factory) -> dict[bool, Path]:
    """One filled store per dedupe design, built once; tests work on copies."""
    out = {}
    for pk in (False, True):
        s = Store(tmp_path_factory.mktemp("tpl") / "s.duckdb", primary_keys=pk)
        _fill(s)
        out[pk] = s.path
    return out


def _copy(src: Path, dst: Path) -> Store:
    shutil.copy(src, dst)
    return Store(dst, read_only=True)


@pytest.fixture
def filled(template, tmp_path: Path) -> Store:
    return _copy(template[False], tmp_path / "s.duckdb")


@pytest.mark.parametrize("pk", [False, True], ids=["antijoin", "primary-key"])
def test_summaries_count_each_inserted_row_once_and_match_pandas(template, tmp_path: Path, pk: bool) -> None:
    filled = _copy(template[pk], tmp_path / "s.duckdb")
    raw = filled.read_table("request_steps")
    assert len(raw) == 5000  # every row was offered 2-3 times; the store kept one of each
    with filled.snapshot() as con:
        assert summaries.stale_runs(con) == set()
        n = dict(con.execute("SELECT run_id, sum(n) FROM sum_cells GROUP BY run_id").fetchall())
        n_req = con.execute("SELECT count(*) FROM sum_requests").fetchone()[0]
        n_steps = dict(con.execute("SELECT run_id, n FROM sum_steps").fetchall())
    assert n == {"run-a": 3000, "run-b": 2000}
    assert n_req == raw.groupby(["run_id", "rid", "workload"]).ngroups  # kept per workload too
    assert n_steps == {"run-a": 400, "run-b": 250}

    r = Reader(filled.path)
    win = r.window_distribution(RUNS)
    want = raw.groupby(["run_id", "workload", "window"]).size().reset_index(name="blocks")
    got = win[["run_id", "workload", "window", "blocks"]].sort_values(["run_id", "workload", "window"])
    assert got.astype({"window": int, "blocks": int}).reset_index(drop=True).equals(
        want.astype({"window": int, "blocks": int}).reset_index(drop=True))
    s = r.run_summary(RUNS).set_index("run_id")
    for run, g in raw.groupby("run_id"):
        assert s.loc[run, "blocks"] == len(g)
        assert s.loc[run, "requests_seen"] == g["rid"].nunique()
        assert s.loc[run, "mean_acc_len"] == pytest.approx(g["acc_len"].mean())
        assert s.loc[run, "utilization"] == pytest.approx(g["acc_len"].sum() / (g["ceiling"] + 1).sum())
        assert s.loc[run, "steps"] == {"run-a": 400, "run-b": 250}[run]
    pos = r.position_acceptance(["run-b"]).set_index("k")
    surv = np.stack(raw.loc[raw["run_id"] == "run-b", "survival"].to_numpy())
    ceil = raw.loc[raw["run_id"] == "run-b", "ceiling"].to_numpy()
    for k in (1, 4, 7):
        assert pos.loc[k, "mean_survival"] == pytest.approx(surv[:, k - 1].mean(), rel=1e-6)
        assert pos.loc[k, "empirical_survival"] == pytest.approx((ceil >= k).mean())


def test_store_without_summaries_answers_the_same_and_rebuilds_on_open(filled: Store, tmp_path: Path) -> None:
    """A file from before schema version 2 (no summary tables): readers aggregate the raw tables;
    the first read-write open builds the summaries."""
    fresh = _panels(Reader(filled.path))
    old = tmp_path / "v1.duckdb"
    shutil.copy(filled.path, old)
    con = duckdb.connect(str(old))
    for t in (schema.STORE_META, *schema.SUMMARY_TABLES):
        con.execute(f"DROP TABLE {t.name}")
    con.close()
    with Store(old, read_only=True).snapshot() as c:
        assert summaries.schema_version(c) == 1
        assert summaries.stale_runs(c) == set(RUNS)
    _same(fresh, _panels(Reader(old)))
    s = Store(old)
    assert s.rebuilt_summaries == RUNS
    with s.snapshot() as c:
        assert summaries.schema_version(c) == schema.SCHEMA_VERSION
        assert summaries.stale_runs(c) == set()
    _same(fresh, _panels(Reader(old)))
    assert Store(old).rebuilt_summaries == []  # once


def test_rows_appended_past_the_store_make_the_run_stale(filled: Store) -> None:
    fresh = _panels(Reader(filled.path))
    con = duckdb.connect(str(filled.path))
    con.execute("INSERT INTO request_steps SELECT * REPLACE (forward_ct + 100000 AS forward_ct) "
                "FROM request_steps WHERE run_id = 'run-b' AND forward_ct < 10")
    added = con.execute("SELECT count(*) FROM request_steps WHERE forward_ct >= 100000").fetchone()[0]
    con.close()
    assert added > 0
    with filled.snapshot() as c:
        assert summaries.stale_runs(c) == {"run-b"}
    now = _panels(Reader(filled.path))
    s = now["run_summary"].set_index("run_id")
    assert s.loc["run-b", "blocks"] == 2000 + added
    assert s.loc["run-a", "blocks"] == fresh["run_summary"].set_index("run_id").loc["run-a", "blocks"]
    Store(filled.path)  # a read-write open repairs it
    with filled.snapshot() as c:
        assert summaries.stale_runs(c) == set()
    _same(now, _panels(Reader(filled.path)))


def test_a_rebuild_cut_short_leaves_its_runs_stale_until_the_next_open_finishes_it(filled: Store, monkeypatch) -> None:
    """``ensure`` commits the rebuild one summary table at a time (one transaction held every table's new
    rows in memory: a 100M request-step run's ran out of the rebuild's 1 GB). A rebuild that dies between
    those commits leaves its runs marked in store_meta: readers count them stale (and aggregate the raw
    rows: the panels still answer right) until the next read-write open rebuilds them and clears the mark."""
    fresh = _panels(Reader(filled.path))
    con = duckdb.connect(str(filled.path))
    con.execute("INSERT INTO request_steps SELECT * REPLACE (forward_ct + 100000 AS forward_ct) "
                "FROM request_steps WHERE run_id = 'run-b' AND forward_ct < 10")
    con.close()

    def dies(*a, **k):
        raise RuntimeError("killed mid-rebuild")
    with monkeypatch.context() as m:
        m.setattr(summaries.pages, "rebuild_pages", dies)
        with pytest.raises(RuntimeError, match="mid-rebuild"):
            Store(filled.path)
    with filled.snapshot() as c:
        # sum_cells of run-b was rebuilt and committed (its row counts match again), yet run-b stays stale
        assert c.execute("SELECT sum(n) FROM sum_cells WHERE run_id = 'run-b'").fetchone()[0] == \
            c.execute("SELECT count(*) FROM request_steps WHERE run_id = 'run-b'").fetchone()[0]
        assert summaries.stale_runs(c) == {"run-b"}
        assert summaries.stale_runs(c, ["run-a"]) == set()
    got = _panels(Reader(filled.path))
    assert got["run_summary"].set_index("run_id").loc["run-b", "blocks"] > \
        fresh["run_summary"].set_index("run_id").loc["run-b", "blocks"]
    assert Store(filled.path).rebuilt_summaries == ["run-b"]
    with filled.snapshot() as c:
        assert summaries.stale_runs(c) == set()
        assert c.execute("SELECT count(*) FROM store_meta WHERE key = ?", [summaries.REBUILDING]).fetchone()[0] == 0
    _same(got, _panels(Reader(filled.path)))


def test_an_unreadable_rebuild_mark_makes_every_run_stale_until_a_rebuild(filled: Store) -> None:
    """A ``rebuilding_runs`` mark that is not a JSON list of run ids (edited by hand) cannot say which runs
    are half rebuilt: all of them count stale (readers aggregate the raw rows, the panels still answer
    right), and the next read-write open rebuilds them and clears it."""
    fresh = _panels(Reader(filled.path))
    con = duckdb.connect(str(filled.path))
    con.execute("INSERT OR REPLACE INTO store_meta VALUES (?, '{not json')", [summaries.REBUILDING])
    con.close()
    with filled.snapshot() as c:
        assert summaries.stale_runs(c) == set(RUNS)
    _same(fresh, _panels(Reader(filled.path)))
    assert sorted(Store(filled.path).rebuilt_summaries) == sorted(RUNS)
    with filled.snapshot() as c:
        assert summaries.stale_runs(c) == set()


def test_a_newer_schema_version_is_refused(tmp_path: Path) -> None:
    s = Store(tmp_path / "n.duckdb")
    with s.connect() as con:
        con.execute("UPDATE store_meta SET value = '99' WHERE key = 'schema_version'")
    for ro in (False, True):
        with pytest.raises(ValueError, match="schema version 99"):
            Store(s.path, read_only=ro)


def test_writer_module_does_not_import_the_store() -> None:
    code = "import sys, acceptscope.writer; print('acceptscope.store' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         cwd=Path(__file__).resolve().parents[1])
    assert out.stdout.strip() == "False"


def test_sampling_inference_allocates_nothing_replicates_by_requests() -> None:
    """Fully audited: no bootstrap at all; sampled: one index row per replicate, never n_boot x n."""
    rng = np.random.default_rng(0)
    n = 20_000
    df = pd.DataFrame({"w": rng.integers(1, 50, n).astype(float), "a": rng.uniform(1, 4, n)})
    df["x"] = df["a"] + rng.uniform(0, 1, n)
    df["y"] = df["a"] + rng.uniform(0, 1, n)
    dense_mb = 500 * n * 8 / 2**20  # what an n_boot x n int64 index matrix would take (76 MB)
    audit_sampling.expanded_alpha(0.025, 10)  # import scipy.stats outside the measurement
    for frame in (df, df.assign(y=np.where(np.arange(n) % 3 == 0, df["y"], np.nan))):
        tracemalloc.start()
        res = audit_sampling.infer(frame, n_boot=500)
        peak = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
        assert res.n_audited == frame["y"].notna().sum()
        assert peak < dense_mb / 20, f"peak {peak:.1f} MB"  # measured: under 1 MB


def test_a_run_id_rewritten_in_place_is_not_read_from_stale_summaries(filled: Store) -> None:
    """Totals still match after an UPDATE of run_id (the hostile-HTML fixture does this): the orphaned
    summaries must not answer for the renamed run."""
    want = filled.read_table("request_steps", "run-b")
    con = duckdb.connect(str(filled.path))
    for t in ("runs", "request_steps", "steps", "requests"):
        con.execute(f"UPDATE {t} SET run_id = 'run-z' WHERE run_id = 'run-b'")
    con.close()
    with filled.snapshot() as c:
        assert summaries.stale_runs(c, ["run-z"]) == {"run-z"}
        assert summaries.stale_runs(c) == {"run-b", "run-z"}
    s = Reader(filled.path).run_summary(["run-z"]).set_index("run_id")
    assert s.loc["run-z", "blocks"] == len(want)
    assert s.loc["run-z", "mean_acc_len"] == pytest.approx(want["acc_len"].mean())
    assert sorted(Store(filled.path).rebuilt_summaries) == ["run-b", "run-z"]  # the orphan rows go too
    with filled.snapshot() as c:
        assert summaries.stale_runs(c) == set()


def test_a_workload_filter_reads_the_summaries_and_counts_only_that_workload(filled) -> None:
    raw = filled.read_table("request_steps")
    w = H.WORKLOADS[0]
    r = Reader(filled.path)
    with filled.snapshot() as con:
        assert summaries.stale_runs(con) == set()  # the filtered answers below come from summary rows
    got = r.run_summary(RUNS, workloads=[w]).set_index("run_id")
    sub = raw[raw["workload"] == w]
    assert got["blocks"].to_dict() == sub.groupby("run_id").size().to_dict()
    assert got["requests_seen"].to_dict() == sub.groupby("run_id")["rid"].nunique().to_dict()
    assert np.allclose(got["mean_window"].to_numpy(float), sub.groupby("run_id")["window"].mean().reindex(got.index))
    pos = r.position_acceptance(["run-a"], workloads=[w])
    k1 = pos.set_index("k").loc[1, "n"]
    assert k1 == int(sub[(sub["run_id"] == "run-a") & sub["survival"].map(lambda v: v is not None and len(v) >= 1)]
                     .shape[0])
    assert len(r.run_summary(RUNS, workloads=["no-such-workload"]).dropna(subset=["blocks"])) == 0


def _messy(n: int, run_id: str, seed: int) -> pa.Table:
    """request_steps with NULL lists, NULL and NaN elements, ragged and empty lists, logits shorter or
    longer than the confidences, NULL ceilings/windows/workloads, several ranks: the cases where the
    summaries folded in batch by batch (``summaries.add``) must still equal a rebuild from the raw rows."""
    rng = np.random.default_rng(seed)
    t = H.request_steps(n, run_id=run_id, seed=seed, ranks=3)

    def ragged(col: str, p_null: float, extra: int = 0) -> pa.Array:
        out = []
        for v in t.column(col).to_pylist():
            if rng.random() < p_null:
                out.append(None)
                continue
            w = int(rng.integers(0, len(v) + 1 + extra))
            v = (v + [float(x) for x in rng.uniform(0, 1, extra)])[:w]
            out.append([None if rng.random() < 0.05 else (float("nan") if rng.random() < 0.02 else x) for x in v])
        return pa.array(out, schema.F32_LIST)

    def holes(col: str, p: float) -> pa.Array:
        return pa.array([None if rng.random() < p else x for x in t.column(col).to_pylist()], t.schema.field(col).type)
    keep_full = rng.random(n) < 0.5  # half the rows keep their fixed-width lists
    cols = {}
    for col, extra in (("survival", 0), ("confidence", 0), ("confidence_logit", 2)):
        r = ragged(col, 0.1, extra).to_pylist()
        full = t.column(col).to_pylist()
        cols[col] = pa.array([f if k else x for f, k, x in zip(full, keep_full, r)], schema.F32_LIST)
    for col in cols:
        t = t.set_column(t.schema.get_field_index(col), col, cols[col])
    for col, p in (("ceiling", 0.2), ("window", 0.1), ("correct_drafts", 0.1), ("workload", 0.1)):
        t = t.set_column(t.schema.get_field_index(col), col, holes(col, p))
    return t


def _summary_tables(con) -> dict[str, pd.DataFrame]:
    out = {}
    for t in schema.SUMMARY_TABLES:
        key = list(t.key)
        out[t.name] = con.execute(f"SELECT * FROM {t.name}").df().sort_values(key, ignore_index=True)
    return out


def _assert_add_equals_rebuild(store: Store) -> None:
    with store.snapshot() as con:
        kept = _summary_tables(con)
    con = duckdb.connect(str(store.path))
    try:
        ids = [r[0] for r in con.execute("SELECT DISTINCT run_id FROM request_steps").fetchall()]
        summaries.rebuild(con, ids)
        rebuilt = _summary_tables(con)
    finally:
        con.close()
    for name in kept:
        assert len(rebuilt[name]) > 0, name
        pd.testing.assert_frame_equal(kept[name], rebuilt[name], check_dtype=False, rtol=1e-12, obj=name)


@pytest.mark.parametrize("pk", [False, True], ids=["antijoin", "primary-key"])
def test_summaries_added_per_batch_equal_a_sql_rebuild(template, tmp_path: Path, pk: bool) -> None:
    _copy(template[pk], tmp_path / "s.duckdb")
    _assert_add_equals_rebuild(Store(tmp_path / "s.duckdb", read_only=True))


def test_summaries_of_messy_batches_equal_a_sql_rebuild(tmp_path: Path) -> None:
    s = Store(tmp_path / "m.duckdb")
    a, b = _messy(1500, "run-a", 11), _messy(900, "run-b", 12)
    s.append({"runs": [H.run_row("run-a", "compact"), H.run_row("run-b", "cap-accept")],
              "requests": [{**r, "workload": r["workload"] if isinstance(r["workload"], str) else None}
                           for r in _requests(a) + _requests(b)],
              "steps": H.steps(50, run_id="run-a") + H.steps(30, run_id="run-b")})
    s.append({"request_steps": a.slice(0, 1000)})
    s.append({"request_steps": pa.concat_tables([a.slice(600), b.slice(0, 400)])})
    s.append({"request_steps": b})
    _assert_add_equals_rebuild(s)


def test_requests_seen_counts_distinct_requests_across_batches_and_workloads(tmp_path: Path) -> None:
    """``sum_run_rids`` (requests_seen without a count(DISTINCT) at read time): a request whose blocks
    arrive in several batches counts once; one with blocks under two workloads (messy rows: NULL
    workloads mixed in) counts once per run and once in each workload it has."""
    s = Store(tmp_path / "m.duckdb")
    a, b = _messy(1500, "run-a", 21), _messy(900, "run-b", 22)
    s.append({"runs": [H.run_row("run-a", "compact"), H.run_row("run-b", "cap-accept")]})
    for part in (a.slice(0, 700), pa.concat_tables([a.slice(700), b.slice(0, 300)]), b.slice(300)):
        s.append({"request_steps": part})
    raw = pd.concat([a.to_pandas(), b.to_pandas()], ignore_index=True)
    raw["workload"] = raw["workload"].fillna("?")
    assert (raw.groupby(["run_id", "rid"])["workload"].nunique() > 1).any()  # the case being tested
    r = Reader(s.path)
    got = r.run_summary(["run-a", "run-b"]).set_index("run_id")["requests_seen"].to_dict()
    assert got == raw.groupby("run_id")["rid"].nunique().to_dict()
    w = [x for x in raw["workload"].unique() if x != "?"][:2]
    for sel in ([w[0]], w, [w[0], "?"]):
        sub = raw[raw["workload"].isin(sel)]
        got = r.run_summary(["run-a", "run-b"], workloads=sel).set_index("run_id")["requests_seen"].to_dict()
        assert got == sub.groupby("run_id")["rid"].nunique().to_dict(), sel


def test_reliability_bins_from_the_batch_lists_equal_the_sql() -> None:
    """The numpy form of the reliability summary (``batch_summaries.reliability_rows``, used by ``summaries.add``) gives
    the rows of its SQL definition on messy, multi-chunk batches: keys and counts exactly, ``sum_p`` to
    the last bits (DuckDB's hash aggregate adds partial sums in an order of its own); a confidence outside
    [0, 1] leaves the batch to the SQL."""
    con = duckdb.connect(config={"threads": 1})
    a, b = _messy(1500, "run-a", 21), _messy(700, "run-b", 22)
    batch = pa.concat_tables([a.slice(0, 900), b, a.slice(900)])  # several chunks, two runs
    con.register("v", batch)
    want = con.sql(f"SELECT * FROM ({summaries.agg_sql(schema.SUM_RELIABILITY, 'v')}) ORDER BY ALL").to_arrow_table()
    got = batch_summaries.reliability_rows(con, batch, batch_summaries.Groups(batch), summaries.RELIABILITY_BINS)
    assert got is not None and got.num_rows == want.num_rows > 0
    assert {"after", "before"} <= set(got.column("variant").to_pylist())
    con.register("g", got)
    got = con.sql("SELECT * FROM g ORDER BY run_id, workload, position, variant, bin").to_arrow_table()
    want = want.rename_columns(got.column_names).sort_by([(c, "ascending") for c in got.column_names[:5]])
    for c in got.column_names:
        if c == "sum_p":
            np.testing.assert_allclose(got[c].to_numpy(), want[c].to_numpy(), rtol=1e-12, atol=0)
        else:
            assert_close(got[c].to_pylist(), want[c].to_pylist(), where=c)
    conf = batch.column("confidence").to_pylist()
    i = next(j for j, (c, k) in enumerate(zip(conf, batch.column("ceiling").to_pylist()))
             if c and k is not None and k >= 0 and c[0] is not None and c[0] == c[0])
    conf[i] = [1.5] + conf[i][1:]
    odd = batch.set_column(batch.schema.get_field_index("confidence"), "confidence", pa.array(conf, schema.F32_LIST))
    assert batch_summaries.reliability_rows(con, odd, batch_summaries.Groups(odd), summaries.RELIABILITY_BINS) is None


def _sql_rows(con, t: schema.Table, view: str, **kw) -> pd.DataFrame:
    got = con.sql(f"SELECT * FROM ({summaries.agg_sql(t, view, **kw)})").df()
    got.columns = t.names
    return got.sort_values(list(t.key), ignore_index=True)


def _fixed_width_messy(n: int, run_id: str, seed: int) -> pa.Table:
    """``_messy`` rows with every survival list back to its full width (NULL lists kept, NaN elements
    in place of the NULL ones): the case ``batch_summaries.positions_rows`` takes."""
    t, full = _messy(n, run_id, seed), H.request_steps(n, run_id=run_id, seed=seed, ranks=3)
    rng = np.random.default_rng(seed)
    surv = [None if s is None else [float("nan") if rng.random() < 0.02 else x for x in f]
            for s, f in zip(t.column("survival").to_pylist(), full.column("survival").to_pylist())]
    return t.set_column(t.schema.get_field_index("survival"), "survival", pa.array(surv, schema.F32_LIST))


def test_cells_requests_and_positions_from_the_batch_columns_equal_the_sql() -> None:
    """The numpy forms of ``sum_cells``, ``sum_requests`` and ``sum_positions`` (``batch_summaries``, used by
    ``summaries.add``) give the rows of their SQL definitions on a two-run batch with NULL windows, ceilings,
    correct_drafts, workloads and survival lists and NaN survivals: keys and counts exactly, survival sums
    to the last bits. Ragged survival lists (what SGLang never writes) are left to the SQL."""
    con = duckdb.connect(config={"threads": 1})
    batch = pa.concat_tables([_fixed_width_messy(1200, "run-a", 31), _fixed_width_messy(500, "run-b", 32)])
    con.register("v", batch)
    for t, fn, kw in ((schema.SUM_CELLS, batch_summaries.cells_rows, {}),
                      (schema.SUM_REQUESTS, batch_summaries.requests_rows, {}),
                      (schema.SUM_POSITIONS, batch_summaries.positions_rows,
                       {"max_len": summaries.max_list_len(batch, "survival")})):
        got = fn(batch, batch_summaries.Groups(batch))
        assert got is not None and got.num_rows > 0, t.name
        want = _sql_rows(con, t, "v", **kw)
        assert want["run_id"].nunique() == 2 and (want["workload"] == "?").any(), t.name
        got = got.to_pandas().sort_values(list(t.key), ignore_index=True)
        pd.testing.assert_frame_equal(got, want, check_dtype=False, rtol=1e-12, obj=t.name)
    positions = batch_summaries.positions_rows(batch, batch_summaries.Groups(batch)).to_pandas()
    assert positions["sum_s"].isna().any() and (positions["n_emp"] < positions["n"]).any()
    requests = batch_summaries.requests_rows(batch, batch_summaries.Groups(batch)).to_pandas()
    assert requests["sum_x"].isna().any() and (requests["n_x"] < requests["n"]).any()
    ragged = _messy(300, "run-a", 33)
    for fn in (batch_summaries.positions_rows, batch_summaries.requests_rows):
        assert fn(ragged, batch_summaries.Groups(ragged)) is None
    one = _fixed_width_messy(400, "run-a", 34)  # one run: the rid codes are the keys, no group codes
    one = one.set_column(one.schema.get_field_index("workload"), "workload", pa.array(["w"] * 400))
    con.register("one", one)
    got = batch_summaries.requests_rows(one, batch_summaries.Groups(one)).to_pandas()
    pd.testing.assert_frame_equal(got.sort_values(["run_id", "rid", "workload"], ignore_index=True),
                                  _sql_rows(con, schema.SUM_REQUESTS, "one"), check_dtype=False, rtol=1e-12)


def test_a_new_file_starts_at_this_schema_version_and_is_not_migrated(tmp_path: Path) -> None:
    """A new file (no table of ours, a foreign table allowed) gets its schema version with its tables
    (``Store`` skips the migration queries there); appends then keep it current, a reopen rebuilds nothing."""
    other = tmp_path / "other.duckdb"
    con = duckdb.connect(str(other))
    con.execute("CREATE TABLE notes (x INTEGER)")
    con.close()
    for path in (tmp_path / "new.duckdb", other):
        s = Store(path)
        assert s.rebuilt_summaries == []
        with s.snapshot() as c:
            assert summaries.schema_version(c) == schema.SCHEMA_VERSION
            assert summaries.present(c, schema.SUMMARY_TABLES)
        s.append({"runs": [H.run_row("run-a", "compact")], "request_steps": H.request_steps(50, run_id="run-a")})
        again = Store(path)
        assert again.rebuilt_summaries == []
        with again.snapshot() as c:
            assert summaries.stale_runs(c) == set()
            assert c.execute("SELECT sum(n) FROM sum_cells").fetchone()[0] == 50
