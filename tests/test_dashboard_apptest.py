"""The Streamlit dashboard under streamlit.testing (no browser) against a real audit file."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import pytest

from acceptscope import glossary, schema
from acceptscope.app.panels._ctx import plain
from acceptscope.store import Store
from acceptscope.reader import Reader
from tests.test_audit import build_audit_db

APP = str(Path(__file__).resolve().parents[1] / "app" / "dashboard.py")
HEADERS = ["Arm comparison", "Regime vs blog", "Calibration", "Windows", "Utilization", "Estimators", "Cost", "Request drill-down"]


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    return build_audit_db(tmp_path_factory)


@pytest.fixture
def app_test(audit, monkeypatch):
    from streamlit.testing.v1 import AppTest

    db, _ = audit
    monkeypatch.setenv("ACCEPTSCOPE_DB", str(db))
    return AppTest.from_file(APP, default_timeout=90)


def test_page_loads_with_every_panel(app_test, audit):
    _, summary = audit
    at = app_test.run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.error, [e.value for e in at.error]
    assert [h.value for h in at.header] == HEADERS
    # default selection: the newest audit group = all three arms
    assert sorted(at.multiselect(key="runs").value) == sorted(r["run_id"] for r in summary["runs"].values())
    assert len(at.get("plotly_chart")) >= 7
    labels = [m.label for m in at.metric]
    acc, util_label = glossary.FIGURES["realized_accept_length"].label, glossary.FIGURES["audited_utilization"].label
    assert {f"compact {acc}", f"{plain('cap-accept')} {acc}", f"compact {util_label}"} <= set(labels)  # arms: data
    util = next(m for m in at.metric if m.label == f"compact {util_label}")
    assert util.value.endswith("%")


def test_run_picker_and_drilldown(app_test, audit):
    db, summary = audit
    at = app_test.run()
    compact = summary["runs"]["compact"]["run_id"]
    at.multiselect(key="runs").set_value([compact]).run()
    assert not at.exception
    # only compact selected: the arm table has one row and calibration has nothing labelled
    arm_table = at.dataframe[0].value
    assert list(arm_table["run_id"]) == [compact]
    assert any("observed ceiling" in i.value for i in at.info)
    # drill into the longest request of the run
    reqs = Reader(db).requests(compact)
    rid = reqs.sort_values("blocks").iloc[-1]["rid"]
    at.selectbox(key="drill_rid").set_value(rid).run()
    assert not at.exception
    steps = at.dataframe[-1].value  # the drill-down steps table is the last one on the page
    want = Reader(db).request_steps(compact, rid)
    assert len(steps) == len(want) and list(steps["window"]) == list(want["window"])
    assert list(steps["acc_len"]) == list(want["acc_len"])


def test_workload_filter(app_test, audit):
    """The filter reaches every panel: filtered numbers where a panel can split by workload, and a caption
    saying so where it cannot (per-step cost, whole-run estimators, the curve runs)."""
    db, summary = audit
    at = app_test.run()
    wl = at.multiselect(key="workloads")
    assert {"math", "code", "chat", "poetry"} <= set(wl.options)
    wl.set_value(["math"]).run()
    assert not at.exception
    reqs = at.dataframe[-2].value  # the drill-down request row
    assert set(reqs["workload"]) == {"math"}
    ids = [r["run_id"] for r in summary["runs"].values()]
    arm_table = at.dataframe[0].value.set_index("run_id")
    want = Reader(db).run_summary(ids, ["math"]).set_index("run_id")
    assert (arm_table.loc[want.index, "blocks"] == want["blocks"]).all()
    assert want["blocks"].sum() < Reader(db).run_summary(ids)["blocks"].sum()  # really a subset
    captions = [c.value for c in at.caption]
    assert any("workloads: math" in c for c in captions)
    for what in ("Steps (each batches", "The estimators", "The full-traffic inference"):
        assert any(c.startswith(what) and "workload filter does not split" in c for c in captions), what


def test_no_raw_data_version_and_arms_named(app_test):
    """The status line shows a row count, not the change-probe tuple; every utilization names its arm."""
    at = app_test.run()
    captions = [c.value for c in at.caption]
    assert not [c for c in captions if "data version" in c or re.search(r"\(-?\d+, -?\d+", c)], captions
    assert re.fullmatch(r"[\d,]+ rows · read \d\d:\d\d:\d\d", captions[0]), captions[0]
    util_captions = [c for c in captions if c.startswith("window ") and "utilization" in c]  # one per arm
    assert len(util_captions) == 3 and all(any(f"{plain(arm)} utilization" in c for arm in ("compact", "cap-accept", "static"))
                                 for c in util_captions)


def test_live_refresh_sees_new_runs(audit, tmp_path, monkeypatch):
    """A run appended while the page is open appears after the next probe (cache keyed on data version)."""
    from streamlit.testing.v1 import AppTest

    db, summary = audit
    work = tmp_path / "live.duckdb"
    shutil.copy(db, work)
    monkeypatch.setenv("ACCEPTSCOPE_DB", str(work))
    at = AppTest.from_file(APP, default_timeout=90)
    at.run()
    at.toggle(key="live").set_value(True).run()
    assert not at.exception
    before = Reader(work).data_version()
    st = Store(work)
    src = summary["runs"]["compact"]["run_id"]
    st.append({schema.RUNS.name: st.read_table(schema.RUNS.name, src).assign(run_id="late-run", audit_group=None),
               schema.REQUESTS.name: st.read_table(schema.REQUESTS.name, src).assign(run_id="late-run")})
    assert Reader(work).data_version() != before
    at.run()
    assert not at.exception
    assert "production (compact) · late-run" in at.multiselect(key="runs").options  # options are the formatted labels


def test_missing_file_is_a_clear_error(tmp_path, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ACCEPTSCOPE_DB", str(tmp_path / "nope.duckdb"))
    at = AppTest.from_file(APP, default_timeout=60).run()
    assert not at.exception
    assert any("no such database file" in e.value for e in at.error)
