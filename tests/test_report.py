"""The HTML report from a real small audit: one self-contained file with every section."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.report import SECTIONS, _tail_by_workload, write_report
from tests.test_audit import build_audit_db

# sections that must carry at least one figure on an audit with compact + cap-accept + static
FIGURE_SECTIONS = ("calibration", "survival", "windows", "utilization", "tail", "cost")


class _Collect(HTMLParser):
    """Section ids, figures per section, and every external reference (script src, link href...)."""

    def __init__(self) -> None:
        super().__init__()
        self.sections: list[str] = []
        self.figures: dict[str, int] = {}
        self.external: list[str] = []
        self.scripts = 0
        self.plotly_divs = 0
        self._section: str | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "section":
            self._section = a.get("id")
            self.sections.append(self._section)
        if tag == "figure" and "plot" in (a.get("class") or ""):
            self.figures[self._section] = self.figures.get(self._section, 0) + 1
        if tag == "div" and "plotly-graph-div" in (a.get("class") or ""):
            self.plotly_divs += 1
        if tag == "script":
            self.scripts += 1
        for attr in ("src", "href"):
            v = a.get(attr) or ""
            if tag in ("script", "link", "img", "iframe") and v.lower().startswith(("http:", "https:", "//")):
                self.external.append(f"{tag} {attr}={v}")


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    return build_audit_db(tmp_path_factory)


@pytest.fixture(scope="module")
def report(audit, tmp_path_factory):
    db, _ = audit
    out = tmp_path_factory.mktemp("report") / "report.html"
    res = write_report(db, out)
    return out, res


def test_report_is_self_contained_html_with_every_section(report):
    out, res = report
    text = out.read_text(encoding="utf-8")
    p = _Collect()
    p.feed(text)
    p.close()
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    assert p.sections == list(SECTIONS)
    for s in FIGURE_SECTIONS:
        assert p.figures.get(s, 0) >= 1, f"section {s} has no figure"
    assert p.plotly_divs == res.figures >= len(FIGURE_SECTIONS)
    assert p.external == [], p.external
    # plotly.js is inlined exactly once (no CDN), and every figure calls it
    assert text.count("Plotly.newPlot") >= res.figures
    head, body = text.split("</head>", 1)
    assert head.count("* plotly.js v") == 1 and "* plotly.js v" not in body


def test_report_summary_says_what_is_healthy_and_what_is_wrong(report, audit):
    out, res = report
    _, summary = audit
    text = out.read_text(encoding="utf-8")
    summary_html = text[text.index("id='summary'"):text.index("id='runs'")]
    areas = {f.area for f in res.findings}
    assert {"parity", "utilization", "tail"} <= areas
    assert "audit parity holds" in summary_html
    # numbers in the verdict are the measured ones
    u = res.headline["utilization"]["estimate"]
    assert f"{u:.1%}" in summary_html
    assert res.parity["pairs"] == summary["parity"]["pairs"]
    # the ECE table is there, with one row per draft position
    gamma = summary["runs"]["cap-accept"]["gamma"]
    calib = text[text.index("id='calibration'"):text.index("id='survival'")]
    assert "ECE table" in calib and calib.count("<tr>") >= gamma


def test_report_plots_say_what_tables_say(report):
    """Positions 1..gamma on every plot (as in the ECE table and the findings), reliability axes titled,
    and the utilization figures and headline name their arm."""
    out, res = report
    text = out.read_text(encoding="utf-8")
    positions = sorted({int(k) for k in re.findall(r'"text":"position (\d+)"', text)})
    assert positions and positions[0] == 1 and 0 not in positions
    assert '"title":{"text":"observed rate"}' in text and '"title":{"text":"predicted survival"}' in text
    assert res.headline["utilization"]["arm"] == "compact"
    assert "this audit (cap-accept) utilization" in text  # the regime figure's utilization is cap-accept's
    assert "bars: realized accept length per arm" in text
    assert "data version" not in text


def test_report_cli_json_and_errors(audit, tmp_path):
    db, summary = audit
    out = tmp_path / "r.html"
    r = CliRunner().invoke(app, ["report", "--db", str(db), "--out", str(out), "--json", "--no-estimators",
                                 "--run", summary["runs"]["compact"]["run_id"],
                                 "--run", summary["runs"]["cap-accept"]["run_id"]])
    assert r.exit_code == 0, r.output
    d = json.loads(r.stdout[r.stdout.index("{"):])
    assert Path(d["path"]) == out and out.stat().st_size > 100_000
    assert len(d["run_ids"]) == 2 and d["parity"]["ok"]
    r = CliRunner().invoke(app, ["report", "--db", str(db), "--out", str(out), "--run", "nope"])
    assert r.exit_code == 2 and "unknown run id" in " ".join(r.output.split())  # rich wraps at any width
    r = CliRunner().invoke(app, ["report", "--db", str(tmp_path / "missing.duckdb")])
    assert r.exit_code == 2
    import duckdb

    from acceptscope.store import Store

    duckdb.connect(str(tmp_path / "foreign.duckdb")).close()  # a DuckDB file that is not telemetry
    r = CliRunner().invoke(app, ["report", "--db", str(tmp_path / "foreign.duckdb"), "--out", str(out)])
    assert r.exit_code == 2 and "not an acceptscope telemetry database" in " ".join(r.output.split())
    Store(tmp_path / "empty.duckdb")  # telemetry schema, no runs yet
    r = CliRunner().invoke(app, ["report", "--db", str(tmp_path / "empty.duckdb"), "--out", str(out)])
    assert r.exit_code == 3 and "holds no runs" in r.output


def test_regime_and_curve_sections_show_the_audit_next_to_the_blog(audit, report):
    """The audit fitted STS on its calibration split, served on the GPU cost profile, ran the curve, and the
    report puts per-workload windows next to the blog's and the compact-vs-static curve."""
    from acceptscope.figures import regime as R
    from acceptscope.reader import Reader

    db, s = audit
    out, res = report
    assert s["calibration"]["samples"] > 0 and len(s["calibration"]["temperatures"]) == 7
    runs = Reader(db).runs().set_index("run_id")
    assert runs.loc[f"{s['audit_group']}-compact", "sts_hash"] == runs.loc[f"{s['audit_group']}-cap-accept", "sts_hash"]
    assert runs.loc[f"{s['audit_group']}-compact", "sts_hash"] is not None
    curve = Reader(db).throughput_curve(f"{s['audit_group']}/curve")
    assert set(curve["arm"]) == {"compact", "static"} and (curve["tokens_per_s"] > 0).all()
    assert set(curve["workload"]) == {"math", "poetry"}  # the high- and the low-accept workload of `mixed`
    r = R.curve_ratios(curve)
    assert len(r) == 2 and r["ratio"].notna().all()
    assert r.columns.name is None and "<th>arm</th>" not in r.to_html(index=False)  # no empty pivot-label column
    p = _Collect()
    p.feed(out.read_text(encoding="utf-8"))
    assert p.figures.get("regime", 0) >= 1 and p.figures.get("curve", 0) >= 1
    text = out.read_text(encoding="utf-8")
    assert "gsm8k" in text and "arena-hard" in text and "Cost profile" in text
    cmp = res.headline["regime"]
    assert {c["workload"] for c in cmp} == {"math", "code", "chat", "poetry"}
    assert next(c for c in cmp if c["workload"] == "poetry")["blog_mean_window"] == pytest.approx(2.91)


def test_tail_by_workload_intervals_are_keyed_by_request():
    """The tail table's bootstrap is estimators.bootstrap's keyed one: the same intervals in any row
    order, covering the point estimates, and a workload of one request still gets a finite interval."""
    rng = np.random.default_rng(5)
    n = 400
    pr = pd.DataFrame({"workload": np.where(np.arange(n) < 399, "chat", "solo"), "prompt_index": np.arange(n) % 97,
                       "seed": np.arange(n) // 97, "w": rng.integers(1, 40, n).astype(float),
                       "x": rng.uniform(2, 4, n)})
    pr["y"] = pr.x + rng.uniform(0, 1.5, n)
    t = _tail_by_workload(pr, n_boot=300).set_index("workload")
    shuffled = _tail_by_workload(pr.sample(frac=1, random_state=2), n_boot=300).set_index("workload")
    cols = ["truth", "truth_lo", "truth_hi", "conf_only", "conf_lo", "conf_hi"]
    np.testing.assert_allclose(t[cols].to_numpy(float), shuffled[cols].to_numpy(float), rtol=1e-12)
    chat = t.loc["chat"]
    assert chat.conf_lo < chat.conf_only < chat.conf_hi and chat.truth_lo < chat.truth < chat.truth_hi
    assert not chat.truth_in_interval  # y = x + U(0, 1.5): the confidence-only interval misses the truth
    assert t.loc["solo", "requests"] == 1 and np.isfinite(t.loc["solo", ["conf_lo", "conf_hi"]].to_numpy(float)).all()
