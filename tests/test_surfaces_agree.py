"""Every surface shows the glossary's figures with the same numbers (issue 31): on ONE real audit database
(``tests.test_audit.build_audit_db``: the ``acceptscope audit`` command on the reference engine), each figure of
:mod:`acceptscope.glossary` is read from the audit command's output, ``estimate`` (its table and ``--json``),
``report --json`` and the report's HTML, the dashboard (streamlit AppTest), the notebook (executed) and the
Prometheus exporter's ``/metrics`` text, and compared with the one function of the glossary applied to the
estimators' own results (``estimators.run_all``), the audited sample (``audit_sampling.infer_runs``) or the store.

Tolerance: a printed number agrees when it is the reference rounded to the digits shown (half a unit of its
last digit, plus 1e-9); a JSON or metrics number within 1e-9. A surface that computed a figure its own way
(another bootstrap, another definition, per step for per block) fails here.
"""

from __future__ import annotations

import json
import os
import re
import sys
from html.parser import HTMLParser
from pathlib import Path

import pytest
from typer.testing import CliRunner

from acceptscope import audit_sampling, estimators, glossary
from acceptscope.cli import app
from acceptscope.reader import Reader
from acceptscope.store import Store
from tests.test_audit import build_audit_db

REPO = Path(__file__).resolve().parents[1]
NUM = re.compile(r"-?\d+(?:\.\d+)?%?")
EXACT = 1e-9


def _number(text: str) -> tuple[float, float]:
    """A printed number and the tolerance its digits allow (``92.6%`` -> 0.926 within 0.0005)."""
    pct = text.endswith("%")
    t = text.rstrip("%")
    digits = len(t.split(".")[1]) if "." in t else 0
    scale = 100.0 if pct else 1.0
    return float(t) / scale, 0.5 * 10 ** -digits / scale + EXACT


def _printed(text: str) -> list[tuple[float, float]]:
    """Every number of a cell like ``92.6% [92.5%, 93.1%]`` (estimate, lo, hi in order)."""
    return [_number(m) for m in NUM.findall(text.replace("–", ""))]


def _agree(shown: str, v: glossary.Value, what: str) -> None:
    want = [x for x in (v.estimate, v.lo, v.hi) if x is not None]
    got = _printed(shown)
    assert len(got) == len(want), (what, shown, v)
    for (g, tol), w in zip(got, want):
        assert g == pytest.approx(w, abs=tol), (what, shown, v)


def _agree_json(d: dict, v: glossary.Value, what: str) -> None:
    for k in ("estimate", "lo", "hi"):
        w = getattr(v, k)
        assert (d.get(k) is None) == (w is None), (what, k, d, v)
        if w is not None:
            assert d[k] == pytest.approx(w, abs=EXACT), (what, k, d, v)


# ----------------------------------------------------------------------------------------------
# the database and the reference values (the glossary's functions on the estimators' own results)
# ----------------------------------------------------------------------------------------------
# The main job's shape, small: 48 requests in one batch of the H200 profile, so the production arm trims and
# loses tail (utilization < 1: the realized accept length, the ceiling and their intervals all differ; the
# suite's shared audit of 16 requests loses none, where a surface showing the ceiling as realized would pass).
TRIMMING_AUDIT = ["--workload", "math,chat,poetry", "--requests", "48", "--max-new-tokens", "24",
                  "--calibration-requests", "8", "--curve-batches", ""]


@pytest.fixture(scope="module")
def ref(tmp_path_factory):
    db, summary = build_audit_db(tmp_path_factory, "surfaces-agree", TRIMMING_AUDIT)
    runs = {arm: r["run_id"] for arm, r in summary["runs"].items()}
    store = Store(db, read_only=True)
    figs = {rid: glossary.run_figures(estimators.to_jsonable(estimators.run_all(store, rid)))
            for rid in (runs["compact"], runs["cap-accept"])}
    inf = audit_sampling.infer_runs(Reader(db), runs["compact"], runs["cap-accept"])
    figs[runs["compact"]].update(glossary.audited_figures(inf))
    per_step = {rid: glossary.accept_length_per_step(store, rid) for rid in runs.values()}
    f = figs[runs["compact"]]
    assert f["utilization"].estimate < 0.99 and f["realized_accept_length"].estimate < f["ceiling_tokens"].estimate - 0.05
    out = (db.parent / "audit_output.txt").read_text()
    return {"db": db, "summary": summary, "runs": runs, "figs": figs, "per_step": per_step, "output": out,
            "group": summary["audit_group"]}


def _cli(*args: str) -> str:
    r = CliRunner().invoke(app, list(args))
    assert r.exit_code == 0, r.output[-3000:]
    return r.stdout


def _blocks(text: str, ids) -> dict[str, dict[str, str]]:
    """``print_run_table``'s cells per run id, whichever layout the width chose (one row per run, or one
    block of ``label  value`` lines per run)."""
    lines = text.splitlines()
    out: dict[str, dict[str, str]] = {}
    header = next((ln for ln in lines if ln.lstrip().startswith("┃") and "run" in ln), None)
    if header is not None:  # the wide table
        cols = [c.strip() for c in header.strip().strip("┃").split("┃")]
        for ln in lines:
            cells = [c.strip() for c in ln.strip().strip("│").split("│")]
            if ln.lstrip().startswith("│") and cells and cells[0] in ids:
                out[cells[0]] = dict(zip(cols, cells))
        return out
    cur = None
    for ln in lines:
        if ln.strip() in ids:
            cur = out.setdefault(ln.strip(), {})
        elif cur is not None and ln.startswith("  ") and re.search(r"\S\s{2,}\S", ln):
            label, value = re.split(r"\s{2,}", ln.strip(), maxsplit=1)
            cur[label] = value
    return out


# ----------------------------------------------------------------------------------------------
# the surfaces
# ----------------------------------------------------------------------------------------------
def test_the_glossary_names_one_function_per_figure():
    for key, f in glossary.FIGURES.items():
        assert f.label and f.unit and f.definition, key
        assert key == "accept_length_per_step" or key in glossary.FUNCTIONS, key
        assert f.interval is None or f.interval in glossary.INTERVALS
    labels = [f.label for f in glossary.FIGURES.values()]
    assert len(set(labels)) == len(labels)  # figures that differ on purpose never share a label
    doc = (REPO / "docs" / "glossary.md").read_text(encoding="utf-8")  # the page users read says the same
    for key, f in glossary.FIGURES.items():
        assert f"| {f.label} | {f.unit} | {f.definition} |" in doc and f"`glossary.{key}`" in doc, key
    for i in glossary.INTERVALS.values():
        assert f"**{i.label}**: {i.definition}." in doc


def test_audit_command_output(ref):
    L = glossary.FIGURES
    cells = _blocks(ref["output"], set(ref["runs"].values()))
    assert set(cells) == set(ref["runs"].values()), ref["output"][-3000:]
    for rid, c in cells.items():
        _agree(c[L["accept_length_per_step"].label], ref["per_step"][rid], f"audit table {rid} per step")
        for key in ("realized_accept_length", "window"):
            if rid in ref["figs"]:
                _agree(c[L[key].label], ref["figs"][rid][key], f"audit table {rid} {key}")
    compact = ref["runs"]["compact"]
    shown = 0
    for key in ("ceiling_drafts", "ceiling_tokens", "utilization", "trimmed", "audited_ceiling_tokens",
                "audited_utilization"):
        m = re.search(rf"^compact {re.escape(L[key].label)}: (.*?)(?: \(9|$)", ref["output"], re.M)
        assert m, (key, ref["output"][-2000:])
        _agree(m.group(1), ref["figs"][compact][key], f"audit line {key}")
        shown += 1
    assert shown == 6
    # the audit's JSON carries the report's figures
    for rid, figs in ref["summary"]["report"]["headline"]["figures"].items():
        for key, d in figs.items():
            _agree_json(d, ref["figs"][rid][key], f"audit --json {rid} {key}")


def test_estimate_json_and_table(ref):
    ids = list(ref["figs"])
    out = json.loads(_cli("estimate", "--db", str(ref["db"]), "--json", "--role", "production", "--role", "audit"))
    for rid in ids:  # run_all_runs (several runs, one scan) against run_all
        for key in glossary.RESULT_FIGURES:
            _agree_json(out[rid]["figures"][key], ref["figs"][rid][key], f"estimate --json {rid} {key}")
    r = CliRunner().invoke(app, ["estimate", "--db", str(ref["db"]), "--role", "production", "--role", "audit"])
    assert r.exit_code == 0, r.output[-3000:]
    cells = _blocks(r.stderr, set(ids) | set(out))
    L = glossary.FIGURES
    for rid in ids:
        for key in ("realized_accept_length", "ceiling_drafts", "utilization", "window", "trimmed"):
            _agree(cells[rid][L[key].label], ref["figs"][rid][key], f"estimate table {rid} {key}")


class _Table(HTMLParser):
    """The rows of the first table inside the element with id ``want``."""

    def __init__(self, want: str):
        super().__init__()
        self.want, self.depth, self.rows, self.cell = want, 0, [], None

    def handle_starttag(self, tag, attrs):
        if dict(attrs).get("id") == self.want:
            self.depth = 1
        elif self.depth and tag == "tr":
            self.rows.append([])
        elif self.depth and tag in ("td", "th"):
            self.cell = ""

    def handle_endtag(self, tag):
        if self.depth and tag in ("td", "th") and self.cell is not None:
            self.rows[-1].append(self.cell.strip())
            self.cell = None
        elif self.depth and tag == "table":
            self.depth = 0

    def handle_data(self, data):
        if self.cell is not None:
            self.cell += data


def test_report_json_and_html(ref, tmp_path):
    out = tmp_path / "r.html"
    res = json.loads(_cli("report", "--db", str(ref["db"]), "--audit-group", ref["group"], "--out", str(out),
                          "--json"))
    figs = res["headline"]["figures"]
    assert set(figs) == set(ref["figs"])
    for rid, f in figs.items():
        for key, d in f.items():
            _agree_json(d, ref["figs"][rid][key], f"report --json {rid} {key}")
    u = res["headline"]["utilization"]
    _agree_json(u, ref["figs"][ref["runs"]["compact"]][u["figure"]], "report --json headline utilization")
    p = _Table("glossary-figures")
    p.feed(out.read_text(encoding="utf-8"))
    head, *rows = p.rows
    by_label = {g.label: k for k, g in glossary.FIGURES.items()}
    seen = 0
    for row in rows:
        cells = dict(zip(head, row))
        key = by_label[cells["figure"]]
        for rid in ref["figs"]:
            col = next(c for c in head if c.endswith(f"({rid})"))
            if key in ref["figs"][rid]:
                _agree(cells[col], ref["figs"][rid][key], f"report HTML {rid} {key}")
                seen += 1
    assert seen >= len(glossary.RESULT_FIGURES) * 2 + len(glossary.AUDIT_FIGURES)


def test_dashboard(ref, monkeypatch):
    from streamlit.testing.v1 import AppTest

    monkeypatch.setenv("ACCEPTSCOPE_DB", str(ref["db"]))
    at = AppTest.from_file(str(REPO / "app" / "dashboard.py"), default_timeout=180).run()
    assert not at.exception, [e.value for e in at.exception]
    L, compact = glossary.FIGURES, ref["runs"]["compact"]
    f = ref["figs"][compact]
    metrics = {m.label: m.value for m in at.metric}
    _agree(metrics[f"compact {L['realized_accept_length'].label}"], f["realized_accept_length"], "dashboard card")
    _agree(metrics[f"compact {L['audited_utilization'].label}"], glossary.Value(f["audited_utilization"].estimate),
           "dashboard utilization panel")
    _agree(metrics[L["audited_ceiling_tokens"].label], glossary.Value(f["audited_ceiling_tokens"].estimate),
           "dashboard ceiling")
    card = next(c.value for c in at.caption if c.value.startswith(L["window"].label)
                and f"compact {L['audited_utilization'].label}" in c.value)  # the panel's figure, not n/a
    _agree(card.split(L["audited_utilization"].label)[1].split("·")[0], glossary.Value(f["audited_utilization"].estimate),
           "dashboard compact card")
    _agree(card.split("·")[0].split(L["window"].label)[1], f["window"], "dashboard compact card window")
    table = next(d.value for d in at.dataframe if list(d.value.columns[:2]) == ["figure", "value"])
    by_label = {g.label: k for k, g in glossary.FIGURES.items()}
    for label, shown in zip(table["figure"], table["value"]):  # the Estimators panel's run: compact (first)
        _agree(shown, f[by_label[label]], f"dashboard estimators {label}")
    assert len(table) == len(glossary.RESULT_FIGURES)


def test_notebook(ref, monkeypatch):
    import nbformat
    from nbclient import NotebookClient

    monkeypatch.setenv("ACCEPTSCOPE_NOTEBOOK_DB", str(ref["db"]))
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}")
    nb = nbformat.read(REPO / "notebooks" / "analysis.ipynb", as_version=4)
    NotebookClient(nb, timeout=180, kernel_name="python3",
                   resources={"metadata": {"path": str(REPO / "notebooks")}}).execute()
    text = "\n".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                     if o.output_type == "stream")
    got = json.loads(re.search(r"^glossary figures: (.*)$", text, re.M).group(1))
    rid = got.pop("run_id")
    assert rid == ref["runs"]["compact"]
    assert set(got) == set(ref["figs"][rid])
    for key, d in got.items():
        _agree_json(d, ref["figs"][rid][key], f"notebook {key}")


# the exporter's gauges and the figure each serves (acceptscope/live/exporter.py)
EXPORTED = {
    "realized_accept_length": ("acceptscope_realized_accept_length", {}),
    "ceiling_tokens": ("acceptscope_ceiling_accept_length", {"bound": None}),
    "utilization": ("acceptscope_utilization", {"group_by": "run", "bound": None}),
}


@pytest.fixture(scope="module")
def metrics(ref):
    import requests

    from acceptscope.live.exporter import MetricsExporter
    from acceptscope.live.prometheus_scrape import parse_metrics

    with MetricsExporter(str(ref["db"]), 0, refresh_s=0.2) as ex:
        assert ex.source.wait_ready(300), ex.source.last_error
        r = requests.get(ex.url, timeout=10)
        r.raise_for_status()
    return {(s.name, s.labels): s.value for s in parse_metrics(r.text, prefix="acceptscope_")}


@pytest.mark.parametrize("key,arm", [
    ("realized_accept_length", "compact"), ("realized_accept_length", "cap-accept"),
    ("ceiling_tokens", "compact"), ("ceiling_tokens", "cap-accept"),
    ("utilization", "compact"), ("utilization", "cap-accept")])
def test_exporter(ref, metrics, key, arm):
    name, labels = EXPORTED[key]
    rid = ref["runs"][arm]
    v = ref["figs"][rid][key]
    for bound, want in (("point", v.estimate), ("lo", v.lo), ("hi", v.hi)):
        lab = {k: (bound if x is None else x) for k, x in labels.items()}
        if "group_by" in lab:
            lab["group"] = rid
        if want is None or ("bound" not in lab and bound != "point"):
            continue
        hits = [val for (n, ls), val in metrics.items() if n == name and dict(ls).get("run_id") == rid
                and all(dict(ls).get(k) == x for k, x in lab.items())]
        assert len(hits) == 1, (name, rid, lab, hits)
        assert hits[0] == pytest.approx(want, abs=EXACT), (key, rid, bound)
