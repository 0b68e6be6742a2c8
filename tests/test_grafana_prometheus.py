"""The shipped Grafana dashboard against a real Prometheus server.

Debian's ``prometheus`` (installed by ``.ci/prometheus-deps.sh`` when missing) is started on loopback with
a temporary config that scrapes ``acceptscope live export-metrics`` over a reference-engine audit database
the test writes. Every panel's PromQL (``docs/grafana/acceptscope.json``, ``$run_id`` = all) must return
data, and every value must equal ``acceptscope estimate --json`` (or the request-steps counted in SQL, for
the window distribution) to 1e-9. The panels are then drawn from the query results (plotly + kaleido) to
a PNG; ``ACCEPTSCOPE_GRAFANA_PNG=path`` keeps a copy (``docs/img/grafana-panels.png`` was made so).
"""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import plotly.graph_objects as go
import pytest
import requests
from plotly.subplots import make_subplots

from acceptscope import glossary
from acceptscope.ingest.engines import ingest_engine_files
from acceptscope.ingest.engines.identify import engine_figures
from acceptscope.store import Store
from tests.test_ingest_engines import aiperf_lines, trtllm_snapshot, vllm_dump
from tests.test_live_exporter import audit  # noqa: F401 - the module fixture (audit database, estimate --json)

REPO = Path(__file__).resolve().parents[1]
DASHBOARD = REPO / "docs" / "grafana" / "acceptscope.json"
TOL = 1e-9


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prometheus() -> str:
    exe = shutil.which("prometheus")
    if exe is None:  # install it the way CI does
        r = subprocess.run(["bash", str(REPO / ".ci" / "prometheus-deps.sh")], capture_output=True, text=True, timeout=900)
        exe = shutil.which("prometheus")
        if exe is None:
            pytest.skip(f"prometheus is not installed and .ci/prometheus-deps.sh failed: {r.stderr.strip()[-300:]}")
    return exe


def _wait(fn, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            v = fn()
            if v:
                return v
        except requests.RequestException:
            pass
        time.sleep(0.25)
    raise AssertionError(f"timed out waiting for {what}")


def _with_engine_runs(db: Path, work: Path) -> tuple[Path, dict]:
    """A copy of the audit with three more runs: its static arm's blocks as vLLM's counters, its compact arm's
    as TensorRT-LLM's accept stats, its cap-accept arm's as AIPerf records (tests/test_ingest_engines.py's
    writers); returns the copy and each engine run's figures."""
    copy = work / "engines.duckdb"
    shutil.copy(db, copy)
    st = Store(copy)
    runs = st.query_df("SELECT run_id, arm, gamma FROM runs WHERE audit_group NOT LIKE '%/%'")
    rows = lambda arm: st.query_df("SELECT * FROM request_steps WHERE run_id = ?",  # noqa: E731
                                   [runs[runs.arm == arm].run_id.iat[0]])
    gamma = int(runs.gamma.iat[0])
    (work / "vllm.prom").write_bytes(vllm_dump(rows("static"), gamma)[0])
    (work / "dflash_accept_stats_rank0.json").write_text(json.dumps(trtllm_snapshot(rows("compact"), gamma)))
    (work / "profile_export.jsonl").write_text("\n".join(json.dumps(x) for x in aiperf_lines(rows("cap-accept"))[0]))
    figs = {}
    for name, rid in (("vllm.prom", "engine-vllm"), ("dflash_accept_stats_rank0.json", "engine-trtllm"),
                      ("profile_export.jsonl", "engine-aiperf")):
        assert not ingest_engine_files(st, [work / name], run_id=rid).rejects
        figs[rid] = engine_figures(st, rid)
    return copy, figs


@pytest.fixture(scope="module")
def prom(audit, tmp_path_factory):  # noqa: F811
    exe = _prometheus()
    _, est = audit
    work = tmp_path_factory.mktemp("prom")
    db, figs = _with_engine_runs(audit[0], work)
    ex_port, prom_port = _free_port(), _free_port()
    cli = Path(sys.executable).with_name("acceptscope")
    exporter = subprocess.Popen([str(cli), "live", "export-metrics", "--db", str(db), "--port", str(ex_port),
                                 "--refresh", "1", "--duration", "900"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    (work / "prometheus.yml").write_text(
        "global: {scrape_interval: 1s, evaluation_interval: 1s}\n"
        f"scrape_configs:\n  - job_name: acceptscope\n    static_configs: [{{targets: ['127.0.0.1:{ex_port}']}}]\n")
    server = subprocess.Popen([exe, f"--config.file={work / 'prometheus.yml'}", f"--storage.tsdb.path={work / 'data'}",
                               f"--web.listen-address=127.0.0.1:{prom_port}"],
                              stdout=subprocess.DEVNULL, stderr=(work / "prometheus.log").open("w"))
    base = f"http://127.0.0.1:{prom_port}"

    def query(expr: str) -> list:
        r = requests.get(f"{base}/api/v1/query", params={"query": expr}, timeout=10)
        r.raise_for_status()
        body = r.json()
        assert body["status"] == "success", body
        return body["data"]["result"]

    try:
        _wait(lambda: query("acceptscope_exporter_up_to_date == 1"), 300, "the exporter's first snapshot in Prometheus")
        time.sleep(2.5)  # one more scrape: every series of that snapshot is in
        yield query, est, figs, db
    finally:
        for p in (server, exporter):
            p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()


def _targets() -> list[tuple[dict, dict]]:
    d = json.loads(DASHBOARD.read_text())
    return [(p, t) for p in d["panels"] for t in p.get("targets", [])]


def _counts_of(est: dict, figs: dict, rid: str) -> dict:
    """A run's shared counts: from estimate --json (SGLang / reference) or its engine figures (other engines)."""
    if rid in figs:
        f, gamma = figs[rid]["figures"], figs[rid]["gamma"]
        full = figs[rid]["engine"] == "vllm" and f["draft_tokens"] == f["drafts"] * gamma
        return {"drafts": f["drafts"], "accepted": f["accepted"], "tokens": f["draft_tokens"],
                "acc_pos": f["accepted_per_pos"], "ver_pos": [f["drafts"]] * gamma if full else None,
                "realized": f["mean_acceptance_length"]}
    e = est[rid]
    run = [g for g in e["utilization"]["by_group"] if g["by"] == "run"][0]
    pos = e["utilization"]["by_position"]
    return {"drafts": run["n"], "accepted": sum(p["accepted"] for p in pos), "tokens": sum(p["verified"] for p in pos),
            "acc_pos": [p["accepted"] for p in pos], "ver_pos": [p["verified"] for p in pos],
            "realized": run["committed"] / run["n"]}  # committed tokens per block (acceptscope.glossary)


def _expected(est: dict, figs: dict, windows, expr: str, lab: dict) -> float:
    """The estimators' (or, for another engine's run, its counts') value of one sample of one panel query."""
    c = _counts_of(est, figs, lab["run_id"])
    if expr.startswith("(1 + acceptscope_spec_decode_num_accepted_tokens_total"):
        return 1 + c["accepted"] / c["drafts"]
    if expr.startswith("(acceptscope_spec_decode_num_accepted_tokens_total"):
        return c["accepted"] / c["tokens"]
    if expr.startswith("(acceptscope_spec_decode_num_accepted_tokens_per_pos_total"):
        return c["acc_pos"][int(lab["position"])] / c["drafts"]
    if "accepted_tokens_per_pos" in expr:
        k = int(lab["position"])
        return c["acc_pos"][k] / c["ver_pos"][k]
    if "by_window" in expr:
        return windows[(lab["run_id"], int(lab["window"]))] / c["drafts"]
    if expr.startswith("acceptscope_realized"):
        return c["realized"]
    if lab["run_id"] in figs and expr.startswith("acceptscope_calibration_ece"):  # TensorRT-LLM's binned ECE
        return figs[lab["run_id"]]["figures"]["binned_ece"][int(lab["position"])]
    e = est[lab["run_id"]]
    run = [g for g in e["utilization"]["by_group"] if g["by"] == "run"][0]
    if expr.startswith("acceptscope_utilization"):
        return run[{"point": "utilization", "lo": "util_lo", "hi": "util_hi"}[lab["bound"]]]
    if expr.startswith("acceptscope_ceiling"):  # the glossary's ceiling in tokens per block (recorded: a point)
        c = glossary.ceiling_tokens(est[lab["run_id"]])
        return {"point": c.estimate, "lo": c.lo, "hi": c.hi}[lab["bound"]]
    if expr.startswith("acceptscope_calibration_ece"):
        return [m for m in e["calibration"]["metrics"] if m["method"] == lab["method"] and m["stage"] == lab["stage"]
                and str(m["position"]) == lab["position"]][0]["ece"]
    if expr.startswith("acceptscope_cost_model_error_ms"):
        return e["cost"][lab["split"]]["mae_ms"]
    if expr.startswith("acceptscope_trim_regret"):  # estimators.trim_regret, its row of the panel's group
        g = [g for g in e["trim_regret"]["by_group"] if g["by"] == lab["group_by"] and str(g["group"]) == lab["group"]][0]
        key = "first_accepted" if expr.startswith("acceptscope_trim_regret_first_accepted") else "trim_regret"
        return g[key + {"point": "_rate", "lo": "_lo", "hi": "_hi"}[lab["bound"]]]
    if expr.startswith("acceptscope_trim_ratio"):
        return {"point": e["bracket"]["trim"]["trim_ratio"], "lo": 1 - run["util_hi"], "hi": 1 - run["util_lo"]}[lab["bound"]]
    raise AssertionError(f"no expected value for {expr}")


def test_dashboard_is_importable_json():
    d = json.loads(DASHBOARD.read_text())
    assert d["uid"] and d["title"] and d["panels"]
    assert {v["name"] for v in d["templating"]["list"]} == {"datasource", "run_id"}
    titles = " ".join(p["title"].lower() for p in d["panels"])
    for need in ("per-position acceptance", "window distribution", "utilization", "ceiling", "ece", "cost-model", "trim regret"):
        assert need in titles, need
    ids = [p["id"] for p in d["panels"]]
    assert len(ids) == len(set(ids))


def test_every_panel_query_returns_the_estimators_values(prom, tmp_path):
    query, est, figs, db = prom
    windows = {(r, int(w)): int(n) for r, w, n in Store(db, read_only=True).query_df(
        'SELECT run_id, "window", count(*) n FROM request_steps GROUP BY ALL').itertuples(index=False)}
    drawn = []
    for panel, target in _targets():
        expr = target["expr"].replace('"$run_id"', '".*"')
        res = query(expr)
        assert res, f"panel {panel['title']!r}: {expr} returned no data"
        n = 0
        for s in res:
            lab = s["metric"]
            if lab.get("run_id") not in figs and "error" in est.get(lab.get("run_id"), {"error": 1}):
                continue
            got = float(s["value"][1])
            want = _expected(est, figs, windows, target["expr"], lab)
            assert abs(got - want) <= TOL, (panel["title"], lab, got, want)
            n += 1
        assert n, f"panel {panel['title']!r}: no sample of an estimated run"
        if panel["id"] > 100:  # the side-by-side row: every engine on the figures it identifies
            need = {"reference", "vllm", "tensorrt-llm"} | ({"aiperf"} if panel["id"] != 103 else set())
            assert need <= {s["metric"].get("engine") for s in res}, panel["title"]
        drawn.append((panel, target, res))
    png = _render(drawn, tmp_path / "grafana-panels.png")
    if png is not None and os.environ.get("ACCEPTSCOPE_GRAFANA_PNG"):
        shutil.copy(png, os.environ["ACCEPTSCOPE_GRAFANA_PNG"])


def _banded(res: list) -> list[tuple[dict, float, dict | None]]:
    """A query's samples as bars: a series with ``bound`` point/lo/hi is one bar at its point with its band
    as an error bar (as the dashboard's band); any other sample is a bar of its own."""
    series: dict = {}
    for s in res:
        lab = dict(s["metric"])
        b = lab.pop("bound", None)
        series.setdefault(tuple(sorted(lab.items())), {})[b] = float(s["value"][1])
    out = []
    for key, v in series.items():
        lab = dict(key)
        if "point" in v and {"lo", "hi"} <= set(v):
            out.append((lab, v["point"], dict(type="data", symmetric=False, array=[v["hi"] - v["point"]],
                                              arrayminus=[v["point"] - v["lo"]], color="white", thickness=1.5)))
        else:
            out += [({**lab, "bound": b} if b else lab, x, None) for b, x in v.items()]
    return out


def _render(drawn, out: Path) -> Path | None:
    """The panels drawn from the Prometheus query results (one subplot a panel), as a PNG."""
    if importlib.util.find_spec("kaleido") is None:  # optional: only the screenshot needs it
        return None
    panels = []
    for panel, target, res in drawn:
        if not panels or panels[-1][0] is not panel:
            panels.append((panel, []))
        panels[-1][1].append((target, res))
    fig = make_subplots(rows=(len(panels) + 1) // 2, cols=2, subplot_titles=[p["title"] for p, _ in panels],
                        vertical_spacing=0.09, horizontal_spacing=0.12)
    for i, (panel, targets) in enumerate(panels):
        row, col = i // 2 + 1, i % 2 + 1
        for target, res in targets:
            for lab, x, err in _banded(res):
                name = target["legendFormat"]
                for k, v in lab.items():
                    name = name.replace("{{" + k + "}}", v)
                name = re.sub(r"audit-\d+-\d+-[0-9a-f]+-", "", name.replace("{{bound}}", "")).strip()  # arm, not stamp
                fig.add_trace(go.Bar(x=[x], y=[name[-48:]], orientation="h", showlegend=False, hovertext=name,
                                     error_x=err), row=row, col=col)
    fig.update_layout(height=420 * ((len(panels) + 1) // 2), width=1600, template="plotly_dark",
                      title="acceptscope Grafana panels: values from Prometheus (instant queries)", font_size=10)
    fig.update_yaxes(tickfont_size=8)
    try:
        fig.write_image(str(out))
    except Exception as e:  # noqa: BLE001 - no browser for kaleido: the queries were still checked
        pytest.skip(f"queries checked; screenshot not drawn: {type(e).__name__}: {e}")
    assert out.stat().st_size > 10_000
    return out
