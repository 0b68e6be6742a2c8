"""Stored XSS: run ids and workload names are data; none of them may become markup.

The attack of issue 11: SGLang dumps take their default run id from the file name, so a crafted
name (or ``--run-id '<script>alert(1)</script>'``) and a crafted workload name reach the report,
the dashboard and the notebook. A copy of the real audit file gets hostile run ids and workload
names, and every surface is checked for a live tag, attribute or link built from them.
"""

from __future__ import annotations

import re
import shutil
from html.parser import HTMLParser

import duckdb
import pytest

from acceptscope import schema
from acceptscope.report import write_report
from acceptscope.app.panels._ctx import plain
from tests.test_audit import build_audit_db

RUN_XSS = "<script>alert(1)</script>"
RUN_IMG = '"><img src=x onerror=alert(2)>'
WORKLOAD_XSS = "<script>alert(3)</script>"


class _Tags(HTMLParser):
    """Every start tag with its attributes, and the text of each <script>."""

    def __init__(self) -> None:
        super().__init__()
        self.tags: list[tuple[str, dict]] = []
        self.scripts: list[str] = []
        self._in_script = False

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))
        self._in_script = tag == "script"
        if self._in_script:
            self.scripts.append("")

    def handle_endtag(self, tag):
        if tag == "script":
            self._in_script = False

    def handle_data(self, data):
        if self._in_script:
            self.scripts[-1] += data


@pytest.fixture(scope="module")
def hostile_db(tmp_path_factory):
    """The audit file with the cap-accept run renamed RUN_XSS, compact RUN_IMG, one workload WORKLOAD_XSS,
    and cap_trim zeroed on the cap-accept run (so the 'no trimming in <run>' finding quotes it)."""
    db, summary = build_audit_db(tmp_path_factory)
    out = tmp_path_factory.mktemp("hostile") / "hostile.duckdb"
    shutil.copy(db, out)
    ren = {summary["runs"]["cap-accept"]["run_id"]: RUN_XSS, summary["runs"]["compact"]["run_id"]: RUN_IMG}
    con = duckdb.connect(str(out))
    try:
        have = {r[0] for r in con.execute("SELECT table_name FROM information_schema.tables").fetchall()}
        for t in schema.ALL_TABLES:
            if t.name in have and "run_id" in t.names:
                for old, new in ren.items():
                    con.execute(f'UPDATE "{t.name}" SET run_id = ? WHERE run_id = ?', [new, old])
        first = con.execute("SELECT min(workload) FROM requests").fetchone()[0]
        con.execute("UPDATE requests SET workload = ? WHERE workload = ?", [WORKLOAD_XSS, first])
        con.execute("UPDATE request_steps SET cap_trim = 0 WHERE run_id = ?", [RUN_XSS])
    finally:
        con.close()
    return out


def test_report_escapes_run_ids_and_workloads(hostile_db, tmp_path):
    res = write_report(hostile_db, tmp_path / "report.html", n_boot=20)
    text = (tmp_path / "report.html").read_text(encoding="utf-8")
    p = _Tags()
    p.feed(text)
    p.close()
    # the hostile values are shown, as text
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in text
    assert "&lt;script&gt;alert(3)&lt;/script&gt;" in text or "\\u003cscript\\u003ealert(3)" in text
    # ... and never become markup: no img tag, no event-handler attribute, no script outside plotly's own
    assert not [t for t, _ in p.tags if t == "img"]
    assert not [(t, a) for t, a in p.tags for k in a if k.lower().startswith("on")]
    assert len(p.scripts) == 1 + res.figures  # plotly.js once, one newPlot call per figure
    assert not [s for s in p.scripts if "alert(" in s and "\\u003c" not in s]
    assert "<script>alert" not in text and "<img src=x" not in text
    # the finding that quotes the run id is there, in plain text (escaped only in the HTML)
    trim = [f for f in res.findings if f.text.startswith("no trimming in ")]
    assert trim and RUN_XSS in trim[0].text


def test_dashboard_markdown_escapes_run_ids(hostile_db, monkeypatch):
    from streamlit.testing.v1 import AppTest

    from tests.test_dashboard_apptest import APP

    monkeypatch.setenv("ACCEPTSCOPE_DB", str(hostile_db))
    at = AppTest.from_file(APP, default_timeout=120).run()
    assert not at.exception, [e.value for e in at.exception]
    md = [e.value for kind in ("error", "warning", "info", "caption", "markdown") for e in at.get(kind)]
    md += [m.help or "" for m in at.metric]
    assert any(plain(RUN_IMG) in v or plain(RUN_XSS) in v for v in md), md
    # no markdown element carries a hostile value unescaped (every '<' of them backslash-escaped)
    assert not [v for v in md if RUN_XSS in v or RUN_IMG in v or re.search(r"(?<!\\)<(img|script)", v)]


def test_plain_escapes_every_markdown_metacharacter():
    for s in (RUN_XSS, RUN_IMG, "[x](javascript:alert(1))", "$\\frac{1}{2}$", "`code`", "**b** _i_ ~s~ # h"):
        e = plain(s)
        # un-escaping gives the value back, and no metacharacter is left bare
        assert e.replace("\\", "") == s.replace("\\", "")
        assert all(e[i - 1] == "\\" for i, c in enumerate(e) if c in "<>[]()`*_$#~!|" and i > 0)


def test_notebook_tables_escape_cells():
    import pandas as pd

    html = pd.DataFrame({"run_id": [RUN_XSS], "workload": [WORKLOAD_XSS]})._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;alert(1)&lt;/script&gt;" in html


def test_audit_runs_are_marked_complete(tmp_path_factory):
    """`acceptscope audit` (through `run` for each arm) marks every run it finished complete."""
    from acceptscope.store import Store

    db, summary = build_audit_db(tmp_path_factory)
    store = Store(db, read_only=True)
    # the arms, and the audit's calibration and compact-vs-static curve runs: every one finished and marked
    assert {r["run_id"] for r in summary["runs"].values()} <= set(store.runs().run_id)
    assert store.incomplete_runs() == []
