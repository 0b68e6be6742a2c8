"""The one temperature rule (acceptscope.domain.temperature), applied where the data is written.

A request-step's temperature is its own, else its request's, else its run's, else unknown (NULL). These
tests write SGLang-like runs (no temperature on the request-steps) through the real store, in several
orders, and check the stored column against the rule computed here with pandas; a file from before schema
version 8 (NULLs the old readers filled at read time) is filled once on its first read-write open and then
estimates exactly as a file whose request-steps carried those temperatures from the start.
"""

from __future__ import annotations

import json

import duckdb
import numpy as np
import pandas as pd
import pytest

from acceptscope import schema
from acceptscope.estimators import run_all, to_jsonable
from acceptscope.estimators.frame import BlockFrame
from acceptscope.estimators.synthetic import simulate
from acceptscope.export import export_parquet, read_export
from acceptscope.store import Store
from tests._close import assert_close

RUN_T = 0.6  # the run's temperature (acceptscope ingest --temperature) of run "t-run"; "u-run" has none


def _sglang_like(run_id: str, seed: int, run_t: float | None, own_out: set | None = None) -> tuple[dict, pd.Series]:
    """A simulated run whose request-steps carry no temperature except three requests' own (an engine
    row), nine requests with a request record's temperature, the rest only the run's (or nothing).
    Returns the tables and the temperature the rule gives each request-step (NaN: unknown); ``own_out``
    gets the rids that keep their own."""
    t = dict(simulate(n_requests=30, seed=seed, run_id=run_id).tables)
    rs = t["request_steps"].copy()
    rids = sorted(rs.rid.unique())
    own, by_request = set(rids[:3]), set(rids[3:12])
    if own_out is not None:
        own_out.update(own)
    truth = rs.groupby("rid").temperature.first()  # the simulated serving temperature of each request
    want = np.where(rs.rid.isin(own | by_request), rs.rid.map(truth), np.nan if run_t is None else run_t)
    rs["temperature"] = np.where(rs.rid.isin(own), rs.temperature, np.nan)
    req = t["requests"].copy()
    req["temperature"] = np.where(req.rid.isin(by_request), req.rid.map(truth), np.nan)
    t["request_steps"], t["requests"] = rs, req
    t["runs"] = t["runs"].assign(temperature=run_t)
    key = rs[["rank", "epoch", "forward_ct", "rid"]].assign(want=want)
    return t, key.set_index(["rank", "epoch", "forward_ct", "rid"])["want"]


def _stored(path, run_id: str) -> pd.Series:
    """The stored column, read with DuckDB directly (no acceptscope reader in between)."""
    con = duckdb.connect(str(path), read_only=True)
    try:
        d = con.execute("SELECT rank, epoch, forward_ct, rid, temperature FROM request_steps WHERE run_id = ?",
                        [run_id]).df()
    finally:
        con.close()
    return d.set_index(["rank", "epoch", "forward_ct", "rid"])["temperature"].astype(float)


def _check(path, run_id: str, want: pd.Series) -> None:
    got = _stored(path, run_id).reindex(want.index)
    assert_close(got.to_numpy(), want.to_numpy(float), where=f"{run_id} temperatures")


@pytest.mark.parametrize("order", ["one write", "steps first", "requests first", "run temperature last"])
def test_every_write_order_stores_what_the_rule_gives(tmp_path, order):
    """In one write or in separate ones (live capture stores request-steps before their request records;
    ingest --temperature sets the run's after its rows): the stored temperatures are the rule's."""
    t, want = _sglang_like("t-run", 4, RUN_T)
    u, want_u = _sglang_like("u-run", 5, None)
    st = Store(tmp_path / "w.duckdb")
    if order == "one write":
        st.append(t)
        st.append(u)
    elif order == "steps first":
        st.append({"runs": t["runs"], "steps": t["steps"], "request_steps": t["request_steps"]})
        st.append({"requests": t["requests"]})
        st.append({"runs": u["runs"], "request_steps": u["request_steps"]})
        st.append({"requests": u["requests"]})
    elif order == "requests first":
        st.append({"requests": t["requests"], "runs": t["runs"]})
        st.append({"request_steps": t["request_steps"], "steps": t["steps"]})
        st.append({"requests": u["requests"], "runs": u["runs"], "request_steps": u["request_steps"]})
    else:
        st.append({**t, "runs": t["runs"].assign(temperature=None)})
        assert _stored(st.path, "t-run").isna().sum() > 0  # nothing says yet for the run-only requests
        assert st.update_run("t-run", {"temperature": RUN_T}) == 1
        st.append(u)
    _check(st.path, "t-run", want)
    _check(st.path, "u-run", want_u)
    assert _stored(st.path, "u-run").isna().any()  # unknown stays NULL (a later --temperature can fill it)


def _old_file(path) -> dict[str, pd.Series]:
    """A store as a release before schema version 8 left it: the request-steps' NULLs unfilled."""
    st = Store(path)
    wants, own = {}, {}
    for rid, seed, run_t in (("t-run", 4, RUN_T), ("u-run", 5, None)):
        own[rid] = set()
        tables, wants[rid] = _sglang_like(rid, seed, run_t, own[rid])
        st.append(tables)
    con = duckdb.connect(str(path))
    for rid, keep in own.items():
        con.execute("UPDATE request_steps SET temperature = NULL WHERE run_id = ? AND NOT list_contains(?, rid)",
                    [rid, sorted(keep)])
    con.execute(f"UPDATE {schema.STORE_META.name} SET value = '7' WHERE key = 'schema_version'")
    con.close()
    return wants


def test_a_file_from_before_version_8_is_filled_once_and_estimates_the_same(tmp_path):
    """The old readers' rule (coalesce of the row's, the request's and the run's, at read time) is what the
    migration writes; a read-only open before it is refused with the file named (a reader no longer fills);
    after it, estimates equal those of a file whose request-steps carried the temperatures when written."""
    p = tmp_path / "v7.duckdb"
    wants = _old_file(p)
    con = duckdb.connect(str(p), read_only=True)
    n_null, old_reading = con.execute(
        "SELECT count(*) FILTER (WHERE s.temperature IS NULL), "
        "list(coalesce(s.temperature, q.temperature, r.temperature) ORDER BY s.run_id, s.rank, s.epoch, "
        "s.forward_ct, s.rid) FROM request_steps s LEFT JOIN requests q ON s.run_id = q.run_id AND s.rid = q.rid "
        "LEFT JOIN runs r ON s.run_id = r.run_id").fetchall()[0]
    con.close()
    assert n_null > 0
    with pytest.raises(ValueError, match=r"v7\.duckdb.*schema version 8.*read-write open"):
        Store(p, read_only=True)
    Store(p)  # the first read-write open: migrated
    for rid, want in wants.items():
        _check(p, rid, want)
    con = duckdb.connect(str(p), read_only=True)
    assert con.execute(f"SELECT value FROM {schema.STORE_META.name} WHERE key = 'schema_version'").fetchall()[0][0] \
        == str(schema.SCHEMA_VERSION) == "8"
    now = con.execute("SELECT list(temperature ORDER BY run_id, rank, epoch, forward_ct, rid) "
                      "FROM request_steps").fetchall()[0][0]
    con.close()
    assert_close(np.array(now, float), np.array(old_reading, float), where="migrated vs the old read-time rule")

    # a file written with those temperatures on the request-steps themselves (nothing to fill)
    ref = Store(tmp_path / "ref.duckdb")
    for rid, seed, run_t in (("t-run", 4, RUN_T), ("u-run", 5, None)):
        tables, want = _sglang_like(rid, seed, run_t)
        rs = tables["request_steps"]
        tables["request_steps"] = rs.assign(
            temperature=want.reindex(pd.MultiIndex.from_frame(rs[["rank", "epoch", "forward_ct", "rid"]])).to_numpy())
        ref.append(tables)
    migrated = Store(p, read_only=True)
    for rid in ("t-run", "u-run"):
        a, b = (json.loads(json.dumps(to_jsonable(run_all(s, rid, n_boot=30)))) for s in (migrated, ref))
        for j in (a, b):
            j.get("calibration", {}).pop("fit_seconds", None)
        assert_close(a, b, rtol=1e-12, where=rid)


def test_a_file_from_before_version_8_with_nothing_to_fill_still_opens_read_only(tmp_path):
    """Only a file the rule would change is refused: an SGLang dump with no request records and no
    --temperature (every temperature unknown) reads as before."""
    p = tmp_path / "v7.duckdb"
    t, _ = _sglang_like("u-run", 5, None)
    Store(p).append({**t, "requests": t["requests"].assign(temperature=np.nan)})
    con = duckdb.connect(str(p))
    con.execute(f"UPDATE {schema.STORE_META.name} SET value = '7' WHERE key = 'schema_version'")
    con.close()
    assert Store(p, read_only=True).counts()["request_steps"] == len(t["request_steps"])


def test_the_lake_is_exported_filled_and_unknown_reads_as_sampled(tmp_path):
    """An exported lake carries the stored (filled) temperatures, so Spark reads a plain column; an unknown
    temperature reads as sampled at T = 1 with a note, as before the rule moved to the write."""
    st = Store(tmp_path / "s.duckdb")
    t, want = _sglang_like("t-run", 4, RUN_T)
    u, want_u = _sglang_like("u-run", 5, None)
    st.append(t)
    st.append(u)
    export_parquet(st, None, tmp_path / "lake", tables=["request_steps"])
    for rid, w in (("t-run", want), ("u-run", want_u)):
        lake = read_export(tmp_path / "lake", "request_steps", [rid]).to_pandas()
        got = lake.set_index(["rank", "epoch", "forward_ct", "rid"])["temperature"].reindex(w.index)
        assert_close(got.to_numpy(float), w.to_numpy(float), where=f"lake {rid}")
    frame = BlockFrame.from_request_steps(st.read_table("request_steps", "u-run"), gamma=7)
    unknown = np.isnan(want_u.to_numpy(float))
    assert unknown.any() and (frame.temperature == 1.0).sum() >= unknown.sum()
    assert any("temperature missing" in n for n in frame.notes)
