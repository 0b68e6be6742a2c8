"""A registered estimator reaches every executor and every surface with no further wiring.

The toy estimator below is the documented example of :mod:`acceptscope.estimators.registry`: its
module (this file), its registration (``@register``) and its figure (``@figure_for``) are all it
takes. It must then appear, with the same value, in ``estimate --json`` (one chunk per run, and the
streamed pass in several chunks), the HTML report and the Spark lake path.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

import duckdb
import plotly.graph_objects as go
import pytest
from typer.testing import CliRunner

from acceptscope.cli import app
from acceptscope.estimators import Skip, register, registered, run_all
from acceptscope.estimators.registry import unregister
from acceptscope.estimators.run_data import to_jsonable
from acceptscope.estimators.stream import run_all_stream
from acceptscope.estimators.synthetic import simulate
from acceptscope.figures import figure_for, figure_of
from acceptscope.store import Store
from tests._close import assert_close


@dataclass
class MeanWindowResult:
    mean_window: float
    n: int

    def to_json(self) -> dict:
        return {"summary": {"mean_window": self.mean_window, "request_steps": self.n}}


class MeanWindow:
    """Mean verify window over a run's request-steps: sums, so every executor can merge it."""

    name = "toy_mean_window"

    def __init__(self, run):
        self.n, self.total = 0, 0.0

    def add(self, chunk) -> None:
        self.n += chunk.frame.n
        self.total += float(chunk.frame.window.sum())

    def merge(self, other) -> None:
        self.n += other.n
        self.total += other.total

    def result(self):
        if not self.n:
            raise Skip("no request-steps")
        return MeanWindowResult(self.total / self.n, self.n)


@figure_for(MeanWindowResult)
def _mean_window_figure(result, **kw):
    return go.Figure(go.Bar(x=["mean window"], y=[result.mean_window]))


@pytest.fixture
def toy():
    register(MeanWindow)
    yield MeanWindow
    unregister(MeanWindow.name)


@pytest.fixture(scope="module")
def db(tmp_path_factory):
    path = tmp_path_factory.mktemp("reg") / "t.duckdb"
    Store(path).append(simulate(n_requests=40, seed=2).tables)
    return path


def _truth(db, run_id: str) -> float:
    with duckdb.connect(str(db), read_only=True) as con:
        return con.execute('SELECT avg("window") FROM request_steps WHERE run_id = ?', [run_id]).fetchone()[0]


def test_registered_estimator_in_memory_and_streamed_equal_the_sql(toy, db):
    assert MeanWindow.name in registered()
    st = Store(db, read_only=True)
    for rid in st.runs().run_id:
        want = _truth(db, rid)
        one = to_jsonable(run_all(st, rid, n_boot=20))
        chunked = to_jsonable(run_all_stream(st, [rid], n_boot=20, chunk_rows=100)[rid])
        assert_close(one[MeanWindow.name]["summary"]["mean_window"], want, rtol=1e-12)
        assert_close(chunked[MeanWindow.name]["summary"]["mean_window"], want, rtol=1e-12)
    assert figure_of(MeanWindowResult(1.0, 1)).data[0].y == pytest.approx((1.0,))


def test_registered_estimator_reaches_the_cli_json_and_the_report(toy, db, tmp_path):
    res = CliRunner().invoke(app, ["estimate", "--db", str(db), "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)
    runs = out["runs"] if "runs" in out else out
    for rid, r in runs.items():
        assert_close(r[MeanWindow.name]["summary"]["mean_window"], _truth(db, rid), rtol=1e-12)
    html = tmp_path / "r.html"
    res = CliRunner().invoke(app, ["report", "--db", str(db), "--out", str(html)])
    assert res.exit_code == 0, res.output
    text = html.read_text()
    assert f"estimators.{MeanWindow.name} on" in text


def test_unregistered_names_are_refused():
    class NoAdd:
        name = "no_add"

    with pytest.raises(TypeError, match="add"):
        register(NoAdd)
