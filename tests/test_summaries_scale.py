"""The big-run paths of the summaries: sampling inference from DuckDB-side totals, step bins, request
pages, and the version-2 -> 3 upgrade (step bins added to an existing file)."""

from __future__ import annotations

import shutil
from pathlib import Path

import duckdb
import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from acceptscope import audit_sampling, schema, summaries
from acceptscope.reader import Reader
from acceptscope.store import Store
from bench.support import synthetic as H
from tests.test_summaries import RUNS, _copy, _messy, _requests, template  # noqa: F401  (the module-scoped filled store)
from tests._close import assert_close


@pytest.fixture
def filled(template, tmp_path: Path) -> Store:  # noqa: F811
    return _copy(template[False], tmp_path / "s.duckdb")


def test_inference_columns_equal_the_per_request_frame(filled: Store) -> None:
    r = Reader(filled.path)
    df = audit_sampling.per_request(r, "run-a", "run-b")
    cols = r.summary(summaries.per_request_columns, "run-a", "run-b", True)
    for got, c in zip(cols, ("w", "a", "x", "y")):
        assert_close(got, df[c].to_numpy(float))
    unordered = r.summary(summaries.per_request_columns, "run-a", "run-b")
    assert_close(np.sort(unordered[0]), np.sort(cols[0]))
    mom = audit_sampling.moments_of(*cols)
    assert 20 <= mom.m < mom.n_requests  # a sampled audit, with regression
    # infer_runs (few audited requests: the exact bootstrap) is infer on the frame
    assert_close(audit_sampling.infer_runs(r, "run-a", "run-b", n_boot=300).to_dict(),
                 audit_sampling.infer(df, n_boot=300).to_dict())


def test_moment_path_gives_the_same_points(filled: Store, monkeypatch) -> None:
    r = Reader(filled.path)
    exact = audit_sampling.infer_runs(r, "run-a", "run-b", n_boot=2000)
    monkeypatch.setattr(audit_sampling, "EXACT_BOOT_MAX", 1)  # as if thousands of requests were audited
    normal = audit_sampling.infer_runs(r, "run-a", "run-b", n_boot=2000)
    for name in ("ceiling", "ceiling_difference", "ceiling_direct", "ceiling_regression", "utilization"):
        e, n = getattr(exact, name), getattr(normal, name)
        assert n.estimate == pytest.approx(e.estimate, rel=1e-12), name
        assert n.lo < n.estimate < n.hi, name


def _population(n: int, seed: int) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    df = pd.DataFrame({"w": rng.integers(1, 60, n).astype(float), "a": rng.uniform(1.5, 4, n)})
    tail = rng.gamma(0.6, 0.8, n)
    df["x"] = df["a"] + 0.7 * tail + rng.normal(0, 0.2, n).clip(-0.5)
    df["y"] = df["a"] + tail
    return df


def test_normal_limit_bootstrap_matches_exact_resampling_at_thousands_of_requests(monkeypatch) -> None:
    """The normal-limit replicates (above EXACT_BOOT_MAX audited requests) give the exact bootstrap's
    interval ends to a few percent of the interval's width."""
    df = _population(12_000, 1)
    df.loc[np.random.default_rng(2).random(len(df)) > 0.3, "y"] = np.nan  # about 3,600 audited
    assert df["y"].notna().sum() > audit_sampling.EXACT_BOOT_MAX
    b = audit_sampling.infer(df, n_boot=2000, seed=6)  # normal limit
    monkeypatch.setattr(audit_sampling, "EXACT_BOOT_MAX", 10**9)
    a = audit_sampling.infer(df, n_boot=2000, seed=5)  # exact resampling
    for name in ("ceiling_regression", "ceiling_difference", "ceiling_ratio", "ceiling_direct"):
        e, n = getattr(a, name), getattr(b, name)
        assert n.estimate == e.estimate, name
        width = e.hi - e.lo
        assert width > 0
        assert abs(n.lo - e.lo) < 0.1 * width and abs(n.hi - e.hi) < 0.1 * width, (name, e, n)


def _bins_expected(steps: pd.DataFrame, max_rows: int) -> pd.DataFrame:
    """The binned step rows, by pandas from the raw steps."""
    out = []
    for run, g in steps.groupby("run_id"):
        b = g["forward_ct"] // schema.STEP_BIN
        nb = g.assign(b=b).groupby(["rank", "epoch", "b"]).ngroups
        k = -(-nb // max_rows)
        grp = g.assign(c=b // k).groupby(["rank", "epoch", "c"])
        out.append(pd.DataFrame({"run_id": run, "step_gpu_ms": grp["step_gpu_ms"].mean(),
                                 "wall_time_s": grp["wall_time_s"].max(), "steps": grp.size()}).reset_index(drop=True))
    return pd.concat(out, ignore_index=True)


def test_step_bins_count_each_step_once_and_long_runs_read_means(filled: Store) -> None:
    raw = filled.read_table("steps")
    assert len(raw) == 650  # run-a's steps were offered twice
    r = Reader(filled.path)
    got = r.step_costs(RUNS, 5)
    assert got.groupby("run_id")["steps"].sum().to_dict() == {"run-a": 400, "run-b": 250}
    assert got.groupby("run_id").size().max() <= 5 * 2  # at most max_rows per (rank): 2 ranks
    want = _bins_expected(raw, 5)
    pd.testing.assert_frame_equal(got[["run_id", "step_gpu_ms", "wall_time_s", "steps"]].reset_index(drop=True),
                                  want, check_dtype=False, rtol=1e-12)
    # short runs and means=False stay real steps
    assert (r.step_costs(RUNS, 1000)["steps"] == 1).all() and len(r.step_costs(RUNS, 1000)) == 650
    sampled = r.step_costs(RUNS, 100, means=False)
    assert (sampled["steps"] == 1).all() and 0 < len(sampled) <= 2 * 100
    assert set(sampled["forward_ct"]) <= set(raw["forward_ct"])


def _as_older_version(filled: Store, tmp_path: Path, version: int, missing: schema.Table) -> Path:
    """A copy of ``filled`` as a file of schema ``version`` wrote it: without the summary table that
    version lacked."""
    old = tmp_path / f"v{version}.duckdb"
    shutil.copy(filled.path, old)
    con = duckdb.connect(str(old))
    con.execute(f"DROP TABLE {missing.name}")
    con.execute(f"UPDATE store_meta SET value = '{version}' WHERE key = 'schema_version'")
    con.close()
    return old


def test_version_2_file_reads_step_bins_from_raw_and_gets_them_on_a_read_write_open(filled: Store,
                                                                                      tmp_path: Path) -> None:
    want = Reader(filled.path).step_costs(RUNS, 5)
    old = _as_older_version(filled, tmp_path, 2, schema.SUM_STEP_BINS)
    with Store(old, read_only=True).snapshot() as c:
        assert summaries.schema_version(c) == 2
        assert summaries.stale_runs(c) == set()  # the version-2 summaries still answer
    pd.testing.assert_frame_equal(Reader(old).step_costs(RUNS, 5), want)
    s = Store(old)
    assert s.rebuilt_summaries == RUNS
    with s.snapshot() as c:
        assert summaries.schema_version(c) == schema.SCHEMA_VERSION
        assert c.execute("SELECT sum(n) FROM sum_step_bins").fetchone()[0] == 650
    pd.testing.assert_frame_equal(Reader(old).step_costs(RUNS, 5), want)
    assert Store(old).rebuilt_summaries == []


def test_version_3_file_counts_requests_from_raw_and_gets_sum_run_rids_on_a_read_write_open(
        filled: Store, tmp_path: Path) -> None:
    want = Reader(filled.path).run_summary(RUNS)
    want_w = Reader(filled.path).run_summary(RUNS, ["chat", "math"])
    assert want["requests_seen"].min() > 0
    old = _as_older_version(filled, tmp_path, 3, schema.SUM_RUN_RIDS)
    with Store(old, read_only=True).snapshot() as c:
        assert summaries.schema_version(c) == 3
        assert summaries.stale_runs(c) == set()  # the version-3 summaries still answer
    pd.testing.assert_frame_equal(Reader(old).run_summary(RUNS), want)  # requests_seen from the raw rows
    s = Store(old)
    assert s.rebuilt_summaries == RUNS
    with s.snapshot() as c:
        assert summaries.schema_version(c) == schema.SCHEMA_VERSION
        assert c.execute("SELECT sum(n) FROM sum_run_rids WHERE scope = 1").fetchone()[0] == \
            want["requests_seen"].sum()
    pd.testing.assert_frame_equal(Reader(old).run_summary(RUNS), want)
    pd.testing.assert_frame_equal(Reader(old).run_summary(RUNS, ["chat", "math"]), want_w)
    assert Store(old).rebuilt_summaries == []


def test_request_pages_partition_the_run(filled: Store) -> None:
    r = Reader(filled.path)
    n = r.request_count("run-b")
    whole = r.requests("run-b", n)
    assert len(whole) == n > 10
    pages = pd.concat([r.requests("run-b", 7, o) for o in range(0, n, 7)], ignore_index=True)
    pd.testing.assert_frame_equal(pages, whole)
    assert whole["blocks"].sum() == len(filled.read_table("request_steps", "run-b"))


def _keys_reference(rs: pd.DataFrame, req: pd.DataFrame, c: str, a: str) -> pd.DataFrame:
    """per_request by pandas from the raw rows (the join the key summaries make as rows are written)."""
    rs = rs.assign(c1=rs["ceiling"] + 1, x=1 + rs["survival"].map(lambda v: float(np.sum(v)) if v is not None else np.nan))
    j = rs.merge(req[["run_id", "rid", "workload", "prompt_index", "seed"]].rename(columns={"workload": "wl"}),
                 on=["run_id", "rid"])
    key = ["wl", "prompt_index", "seed"]
    cj, aj = j[j["run_id"] == c], j[(j["run_id"] == a) & j["ceiling"].notna()].dropna(subset=key)
    w = cj.groupby(key, dropna=False).agg(w=("rid", "size"), a=("acc_len", "mean"), x=("x", "mean"))
    y = aj.groupby(key).agg(y=("c1", "mean"), audit_blocks=("c1", "size"))
    out = w.join(y, how="left").reset_index().rename(columns={"wl": "workload"})
    return out.sort_values(["workload", "prompt_index", "seed"], ignore_index=True)


@pytest.mark.parametrize("order", ["requests-first", "blocks-first", "interleaved"])
def test_request_keys_equal_the_join_whichever_rows_come_first(tmp_path: Path, order: str) -> None:
    a = H.request_steps(1600, run_id="c", seed=3)
    b = H.request_steps(1200, run_id="p", seed=4)

    def reqs(rs, skip_seed_every=0):
        df = rs.select(["run_id", "rid", "workload"]).to_pandas().drop_duplicates(["run_id", "rid"])
        return [dict(run_id=r.run_id, rid=r.rid, workload=r.workload, prompt_index=i % 50,
                     seed=None if skip_seed_every and i % skip_seed_every == 0 else 7)
                for i, r in enumerate(df.itertuples(index=False))]

    qa, qb = reqs(a, 9), reqs(b)
    s = Store(tmp_path / "k.duckdb")
    s.append({"runs": [{**H.run_row("c", "compact")}, {**H.run_row("p", "cap-accept")}]})
    pieces = {
        "requests-first": [{"requests": qa + qb}, {"request_steps": a}, {"request_steps": b}],
        "blocks-first": [{"request_steps": a.slice(0, 900)}, {"request_steps": b}, {"requests": qa + qb},
                         {"request_steps": a}],
        "interleaved": [{"request_steps": a.slice(0, 700), "requests": qa[:30]}, {"requests": qa + qb[:10]},
                        {"request_steps": b.slice(0, 600)}, {"request_steps": a, "requests": qb},
                        {"request_steps": b}],
    }[order]
    for p in pieces:
        s.append(p)
    r = Reader(s.path)
    got = audit_sampling.per_request(r, "c", "p")
    want = _keys_reference(s.read_table("request_steps"), s.read_table("requests"), "c", "p")
    assert got["seed"].isna().any() and got["y"].notna().any()
    cols = ["workload", "prompt_index", "seed", "w", "a", "x", "y", "audit_blocks"]
    num = {c: float for c in cols[1:]}
    pd.testing.assert_frame_equal(got[cols].astype(num), want[cols].astype(num), rtol=1e-6)  # survival is float32
    with s.snapshot() as con:
        assert summaries.stale_runs(con) == set()
    # a requests row appended past the store makes its run stale (and it is answered from raw rows)
    con = duckdb.connect(str(s.path))
    con.execute("INSERT INTO requests (run_id, rid, workload, prompt_index, seed) VALUES ('p', 'extra', 'chat', 999, 7)")
    con.close()
    with s.snapshot() as con:
        assert summaries.stale_runs(con) == {"p"}
    pd.testing.assert_frame_equal(audit_sampling.per_request(Reader(s.path), "c", "p"), got)


# --- schema version 5: sum_key_pairs (sampling inference from one table, no join of the two runs' keys) ---
def _flat(x, prefix=""):
    out = {}
    for k, v in (x.to_dict() if hasattr(x, "to_dict") else x).items():
        out.update(_flat(v, f"{prefix}{k}.") if isinstance(v, dict) else {f"{prefix}{k}": v})
    return out


def _join_path(r: Reader, c: str, a: str, monkeypatch, **kw):
    """infer_runs as it answers without the pair table (the two runs' request keys joined)."""
    with monkeypatch.context() as m:
        m.setattr(summaries, "pair_totals", lambda *_: None)
        return audit_sampling.infer_runs(r, c, a, **kw)


def _assert_pair_path_equals_join(path: Path, c: str, a: str, monkeypatch, kept: bool = True, **kw) -> None:
    r = Reader(path)
    assert (r.summary(summaries.pair_totals, c, a) is not None) == kept
    got, want = _flat(audit_sampling.infer_runs(r, c, a, **kw)), _flat(_join_path(r, c, a, monkeypatch, **kw))
    assert got.keys() == want.keys()
    for k, v in want.items():
        assert got[k] == (pytest.approx(v, rel=1e-9, abs=1e-12, nan_ok=True) if isinstance(v, float) else v), k


@pytest.mark.parametrize("exact_max", [audit_sampling.EXACT_BOOT_MAX, 1], ids=["exact-bootstrap", "normal-limit"])
def test_pair_table_inference_equals_the_join(filled: Store, monkeypatch, exact_max: int) -> None:
    monkeypatch.setattr(audit_sampling, "EXACT_BOOT_MAX", exact_max)
    tot = Reader(filled.path).summary(summaries.pair_totals, "run-a", "run-b")
    assert 20 <= tot["m"] < tot["n_requests"] and len(tot["rows"][0]) == tot["m"]  # a sampled audit: rows come along
    _assert_pair_path_equals_join(filled.path, "run-a", "run-b", monkeypatch, n_boot=500)


def _pair_store(path: Path, rs_c, rs_a, group: str | None = "g", req_workload_nulls: bool = False) -> Store:
    """A compact run ``c`` and an audit run ``p`` with the same request keys, written in interleaved pieces
    (requests rows before and after their blocks)."""
    def reqs(rs):
        out = _requests(rs)
        if req_workload_nulls:
            out = [{**q, "workload": q["workload"] if isinstance(q["workload"], str) else None} for q in out]
        return out
    s = Store(path)
    s.append({"runs": [{**H.run_row("c", "compact"), "audit_group": group},
                       {**H.run_row("p", "cap-accept"), "audit_group": group}]})
    qc, qa = reqs(rs_c), reqs(rs_a)
    s.append({"request_steps": rs_c.slice(0, 500), "requests": qc[: len(qc) // 2]})
    s.append({"request_steps": rs_a.slice(0, 700), "requests": qa})
    s.append({"requests": qc, "request_steps": pa.concat_tables([rs_c, rs_a.slice(300)])})
    return s


def test_pair_table_with_every_request_audited_and_with_messy_rows(tmp_path: Path, monkeypatch) -> None:
    rs = H.request_steps(1200, run_id="c", seed=5)
    s = _pair_store(tmp_path / "all.duckdb", rs, _as_run(rs, "p"))
    tot = Reader(s.path).summary(summaries.pair_totals, "c", "p")
    assert tot["m"] == tot["n_requests"] > 10 and tot["rows"] is None  # every key audited: one row of totals
    _assert_pair_path_equals_join(s.path, "c", "p", monkeypatch)
    # NULL workloads, ceilings, windows, ragged lists; some NaN survivals make x NaN: the join answers
    messy = _messy(1500, "c", 31)
    m = _pair_store(tmp_path / "messy.duckdb", messy, _as_run(messy, "p"), group=None, req_workload_nulls=True)
    _assert_pair_path_equals_join(m.path, "c", "p", monkeypatch, kept=False, n_boot=300)
    with duckdb.connect(str(m.path)) as con:  # the same rows without the NaN elements: the pair table answers
        assert con.execute("SELECT count(*) FROM sum_pairs").fetchone()[0] == 1
        con.execute("UPDATE request_steps SET survival = list_transform(survival, lambda v: CASE WHEN isnan(v) THEN 0.5 "
                    "ELSE v END)")
        summaries.rebuild(con, ["c", "p"])
    _assert_pair_path_equals_join(m.path, "c", "p", monkeypatch, n_boot=300)


def test_pairs_follow_the_runs_table_and_a_version_4_file_upgrades(filled: Store, tmp_path: Path,
                                                                     monkeypatch) -> None:
    want = _flat(audit_sampling.infer_runs(Reader(filled.path), "run-a", "run-b", n_boot=300))
    # version 4 (no pair tables): read-only it joins, the first read-write open builds the pair
    old = tmp_path / "v4.duckdb"
    shutil.copy(filled.path, old)
    with duckdb.connect(str(old)) as con:
        con.execute("DROP TABLE sum_key_pairs")
        con.execute("DROP TABLE sum_pairs")
        con.execute("UPDATE store_meta SET value = '4' WHERE key = 'schema_version'")
    with Store(old, read_only=True).snapshot() as c:
        assert summaries.stale_runs(c) == set()  # its other summaries still answer
    _assert_pair_path_equals_join(old, "run-a", "run-b", monkeypatch, kept=False, n_boot=300)
    assert Store(old).rebuilt_summaries == RUNS
    _assert_pair_path_equals_join(old, "run-a", "run-b", monkeypatch, n_boot=300)
    assert _flat(audit_sampling.infer_runs(Reader(old), "run-a", "run-b", n_boot=300)) == pytest.approx(want)
    assert Store(old).rebuilt_summaries == []
    # a group with more arm combinations than MAX_PAIRS_PER_GROUP: the next write drops the pair
    s = Store(old)
    s.append({"runs": [H.run_row(f"x{i}", arm) for i, arm in enumerate(["compact", "compact", "cap-accept",
                                                                            "cap-accept"])]})
    s.append({"requests": [dict(run_id="run-a", rid="late", workload="chat", prompt_index=999, seed=7)]})
    _assert_pair_path_equals_join(old, "run-a", "run-b", monkeypatch, kept=False, n_boot=300)
    # runs rows written after the data: the pair is built, from every key, on the runs' next write
    late = Store(tmp_path / "late.duckdb")
    rs = H.request_steps(600, run_id="c", seed=9)
    late.append({"request_steps": rs, "requests": _requests(rs)})
    late.append({"request_steps": _as_run(rs, "p"), "requests": [{**q, "run_id": "p"} for q in _requests(rs)]})
    late.append({"runs": [H.run_row("c", "compact"), H.run_row("p", "cap-accept")]})
    _assert_pair_path_equals_join(late.path, "c", "p", monkeypatch, kept=False)
    late.append({"requests": [dict(run_id="c", rid="late", workload="chat", prompt_index=999, seed=7)]})
    _assert_pair_path_equals_join(late.path, "c", "p", monkeypatch)


def _as_run(rs: pa.Table, run_id: str) -> pa.Table:
    i = rs.schema.get_field_index("run_id")
    return rs.set_column(i, rs.schema.field(i), pa.array([run_id] * rs.num_rows, pa.string()))


# --- schema version 6: sum_request_page (a page of requests from sorted rows plus those added since) ---
def _page_paths(r: Reader, run: str, limit: int, offset: int, monkeypatch) -> tuple[pd.DataFrame, ...]:
    """requests() by the page table, by the path before it (top-N over requests + sum_requests), and from
    the raw rows (every run stale)."""
    assert r.summary(summaries.page_of_requests, run, limit, offset) is not None  # the page table answers
    new = r.requests(run, limit, offset)
    with monkeypatch.context() as m:
        m.setattr(summaries.pages, "page_of_requests", lambda *_: None)
        old = r.requests(run, limit, offset)
        m.setattr(summaries.freshness, "stale_runs", lambda con, ids=None: set(ids or []))
        raw = r.requests(run, limit, offset)
    return new, old, raw


def _assert_pages_equal(path: Path, run: str, monkeypatch, step: int = 7) -> int:
    r = Reader(path)
    n = r.request_count(run)
    for limit, offset in [(1000, 0), (n + 5, 0), (3, n - 2), (5, n + 3), *((step, o) for o in range(0, n, step))]:
        new, old, raw = _page_paths(r, run, limit, offset, monkeypatch)
        pd.testing.assert_frame_equal(new, old, obj=f"page {limit}@{offset}")
        pd.testing.assert_frame_equal(new, raw, obj=f"raw page {limit}@{offset}")
    return n


def _page_state(path: Path, run: str) -> tuple[int, int]:
    with Store(path, read_only=True).snapshot() as con:
        return summaries.page_tails(con, [run])[run]


def test_request_page_table_equals_the_top_n_on_messy_rows_with_ties(tmp_path: Path, monkeypatch) -> None:
    """Requests with NULL workloads and prompt indices and many ties in (workload, prompt_index), requests
    without blocks, blocks without a requests row, rows arriving in either order over many appends, and
    sorts after some of them (small thresholds): every page equals the top-N path's and the raw rows'."""
    monkeypatch.setattr(summaries.pages, "PAGE_TAIL_MIN", 9)
    monkeypatch.setattr(summaries.pages, "PAGE_TAIL_SHARE", 3)
    rng = np.random.default_rng(11)
    n = 260
    rids = [f"q{int(x)}" for x in rng.permutation(10 * n)[:n]]  # ids out of any order
    reqs = [dict(run_id="p", rid=rid, workload=[None, "chat", "math", "chat"][i % 4],
                 prompt_index=None if i % 11 == 0 else int(rng.integers(0, 5)), seed=i,
                 temperature=None if i % 5 == 0 else 0.7, completion_tokens=int(rng.integers(1, 99)),
                 finish_reason=["stop", None][i % 9 == 0], latency_s=float(rng.random()))
            for i, rid in enumerate(rids)]
    rs = _messy(2400, "p", 5)
    with_blocks = rids[40:] + ["orphan-1", "orphan-2"]  # 40 requests without blocks, two blocks without a request
    rs = rs.set_column(rs.schema.get_field_index("rid"), "rid",
                       pa.array([with_blocks[int(i)] for i in rng.integers(0, len(with_blocks), rs.num_rows)]))
    s = Store(tmp_path / "p.duckdb")
    s.append({"runs": [H.run_row("p", "cap-accept")]})
    for k in range(8):  # requests in 8 pieces, blocks in 8; in alternating order
        q, b = reqs[k::8], rs.slice(k * 300, 300)
        for piece in ([{"requests": q}, {"request_steps": b}] if k % 2 else [{"request_steps": b}, {"requests": q}]):
            s.append(piece)
    n_base, tail = _page_state(s.path, "p")
    assert 0 < n_base < n and 0 < tail  # sorted rows and rows added since, both read
    with s.snapshot() as con:  # and sorted rows whose blocks grew since (their sums from sum_request_page)
        assert con.execute("SELECT count(*) FROM sum_request_page WHERE pos IS NOT NULL AND grown").fetchone()[0]
    assert _assert_pages_equal(s.path, "p", monkeypatch) == n
    # every request sorted (a rebuild), and a fresh run's page from unsorted rows only
    with duckdb.connect(str(s.path)) as con:
        summaries.rebuild(con, ["p"])
    assert _page_state(s.path, "p") == (n, 0)
    _assert_pages_equal(s.path, "p", monkeypatch, step=31)


def test_request_page_table_on_the_fixture_store_and_a_version_5_file(filled: Store, tmp_path: Path,
                                                                      monkeypatch) -> None:
    """The fixture's runs sorted and not; a version-5 file (no page table) read-only answers by the top-N,
    and its first read-write open builds the page rows."""
    want = {run: Reader(filled.path).requests(run, 10_000) for run in RUNS}
    with duckdb.connect(str(filled.path)) as con:
        summaries.sort_pages(con, ["run-a"], force=True)
    assert _page_state(filled.path, "run-a")[1] == 0 and _page_state(filled.path, "run-b")[0] == 0
    for run in RUNS:
        _assert_pages_equal(filled.path, run, monkeypatch, step=5)
    v5 = tmp_path / "v5.duckdb"
    shutil.copy(filled.path, v5)
    with duckdb.connect(str(v5)) as con:
        for t in summaries.PAGE_TABLES:
            con.execute(f"DROP TABLE {t.name}")
        con.execute("UPDATE store_meta SET value = '5' WHERE key = 'schema_version'")
    with Store(v5, read_only=True).snapshot() as con:
        assert not summaries.stale_runs(con) and summaries.page_of_requests(con, "run-a", 5, 0) is None
    for run in RUNS:
        pd.testing.assert_frame_equal(Reader(v5).requests(run, 10_000), want[run])
    Store(v5)  # the upgrade
    with Store(v5, read_only=True).snapshot() as con:
        assert summaries.schema_version(con) == schema.SCHEMA_VERSION
    for run in RUNS:
        _assert_pages_equal(v5, run, monkeypatch, step=9)
        pd.testing.assert_frame_equal(Reader(v5).requests(run, 10_000), want[run])
