"""The Prometheus exporter on the main job's kind of database (a real `acceptscope audit` of the reference
engine), scraped over loopback HTTP: every family is served, every figure equals `estimate --json`, and
the counters equal the request-steps counted in SQL."""

from __future__ import annotations

import json
import shutil
import time

import pytest
import requests
from typer.testing import CliRunner

from acceptscope import glossary
from acceptscope.cli import app
from acceptscope.estimators.synthetic import simulate
from acceptscope.live.exporter import MetricsExporter
from acceptscope.live.prometheus_scrape import parse_metrics
from acceptscope.store import Store
from tests.test_audit import build_audit_db

FAMILIES = {  # every family the exporter serves (docs/prometheus.md)
    "acceptscope_spec_decode_num_drafts_total", "acceptscope_spec_decode_num_draft_tokens_total",
    "acceptscope_spec_decode_num_accepted_tokens_total", "acceptscope_spec_decode_num_accepted_tokens_per_pos_total",
    "acceptscope_spec_decode_num_verified_per_pos_total", "acceptscope_spec_decode_num_trimmed_tokens_total",
    "acceptscope_spec_decode_num_drafts_by_window_total", "acceptscope_spec_decode_num_trimmed_drafts_total",
    "acceptscope_run_info", "acceptscope_realized_accept_length", "acceptscope_ceiling_accept_length",
    "acceptscope_utilization", "acceptscope_in_window_accept_rate", "acceptscope_spec_accept_rate",
    "acceptscope_calibration_ece", "acceptscope_cost_model_error_ms", "acceptscope_cost_model_rel_error",
    "acceptscope_trim_regret_rate", "acceptscope_trim_regret_first_accepted_rate", "acceptscope_trim_ratio", "acceptscope_planner_accepted_drafts_lost",
    "acceptscope_estimate_error", "acceptscope_exporter_errors_total", "acceptscope_exporter_up_to_date",
    "acceptscope_exporter_compute_seconds",
}


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    db, _ = build_audit_db(tmp_path_factory)
    r = CliRunner().invoke(app, ["estimate", "--db", str(db), "--json"])
    assert r.exit_code == 0, r.output[-2000:]
    return db, json.loads(r.stdout[r.stdout.index("{"):])


def scrape(url: str) -> dict:
    r = requests.get(url, timeout=10)
    r.raise_for_status()
    return {(s.name, s.labels): s.value for s in parse_metrics(r.text, prefix="acceptscope_")}


def one(m: dict, name: str, **labels) -> float:
    hits = [v for (n, lab), v in m.items() if n == name and all(dict(lab).get(k) == x for k, x in labels.items())]
    assert len(hits) == 1, (name, labels, hits)
    return hits[0]


@pytest.fixture(scope="module")
def served(audit):
    db, _ = audit
    with MetricsExporter(str(db), 0, refresh_s=0.2) as ex:
        assert ex.source.wait_ready(300), ex.source.last_error
        yield scrape(ex.url)


def test_every_family_is_served_on_an_audit_database(served):
    names = {n for n, _ in served}
    assert FAMILIES <= names, sorted(FAMILIES - names)
    assert one(served, "acceptscope_exporter_errors_total") == 0
    assert one(served, "acceptscope_exporter_up_to_date") == 1


def test_figures_equal_estimate_json(audit, served):
    db, est = audit
    checked = 0
    for rid, e in est.items():
        failed = "error" in e
        assert one(served, "acceptscope_estimate_error", run_id=rid) == (1.0 if failed else 0.0)
        if failed:
            continue
        for g in e["utilization"]["by_group"]:
            for b, key in (("point", "utilization"), ("lo", "util_lo"), ("hi", "util_hi")):
                if g.get(key) is not None:
                    v = one(served, "acceptscope_utilization", run_id=rid, group_by=g["by"], group=str(g["group"]), bound=b)
                    assert v == pytest.approx(g[key], abs=1e-9)
                    checked += 1
        c = glossary.ceiling_tokens(e)  # the glossary's one function per figure
        for b, want in (("point", c.estimate), ("lo", c.lo), ("hi", c.hi)):
            if want is not None:
                assert one(served, "acceptscope_ceiling_accept_length", run_id=rid, bound=b) == pytest.approx(want, abs=1e-9)
        run = [g for g in e["utilization"]["by_group"] if g["by"] == "run"][0]  # committed tokens per block
        assert one(served, "acceptscope_realized_accept_length", run_id=rid) == pytest.approx(
            run["committed"] / run["n"], abs=1e-9)
        for m in (e.get("calibration") or {}).get("metrics", []):
            v = one(served, "acceptscope_calibration_ece", run_id=rid, method=m["method"], stage=m["stage"],
                    position=str(m["position"]), bound="point")
            assert v == pytest.approx(m["ece"], abs=1e-9)
            checked += 1
        assert one(served, "acceptscope_cost_model_error_ms", run_id=rid, split="held_out", stat="mae") == pytest.approx(
            e["cost"]["held_out"]["mae_ms"], abs=1e-9)
        for g in (e.get("trim_regret") or {}).get("by_group", []):  # static runs trim nothing: skipped
            for b, suf in (("point", "_rate"), ("lo", "_lo"), ("hi", "_hi")):
                for name, key in (("trim_regret_rate", "trim_regret"), ("trim_regret_first_accepted_rate", "first_accepted")):
                    v = one(served, f"acceptscope_{name}", run_id=rid, group_by=g["by"], group=str(g["group"]), bound=b)
                    assert v == pytest.approx(g[key + suf], abs=1e-9)
                    checked += 1
            if g["by"] == "run":  # TensorRT-LLM's point rate is the trim counters' (one definition)
                assert g["trim_regret_rate"] == pytest.approx(e["bracket"]["trim"]["trim_regret_rate"], abs=1e-9)
        run = [g for g in e["utilization"]["by_group"] if g["by"] == "run"][0]
        assert one(served, "acceptscope_trim_ratio", run_id=rid, bound="lo") == pytest.approx(1 - run["util_hi"], abs=1e-9)
        for p in e["utilization"]["by_position"]:
            assert one(served, "acceptscope_spec_decode_num_accepted_tokens_per_pos_total", run_id=rid,
                       position=str(p["position"])) == p["accepted"]
            assert one(served, "acceptscope_spec_decode_num_verified_per_pos_total", run_id=rid,
                       position=str(p["position"])) == p["verified"]
    assert checked > 20
    assert any("calibration" in e for e in est.values())  # an audit has a run with held-out calibration


def test_counters_equal_the_request_steps(audit, served):
    """The vLLM-shaped counters, recounted from the rows: trimmed positions are unobserved, not rejected."""
    db, est = audit
    q = Store(db, read_only=True).query_df(
        """SELECT q.run_id, count(*) n, sum("window") w, sum(correct_drafts) c, sum(r.gamma - "window") t
           FROM request_steps q JOIN runs r USING (run_id) GROUP BY q.run_id""").set_index("run_id")
    wins = Store(db, read_only=True).query_df(
        'SELECT run_id, "window", count(*) n FROM request_steps GROUP BY ALL')
    ok = [rid for rid, e in est.items() if "error" not in e]
    assert ok
    for rid in ok:
        assert one(served, "acceptscope_spec_decode_num_drafts_total", run_id=rid) == q.loc[rid, "n"]
        assert one(served, "acceptscope_spec_decode_num_draft_tokens_total", run_id=rid) == q.loc[rid, "w"]
        assert one(served, "acceptscope_spec_decode_num_accepted_tokens_total", run_id=rid) == q.loc[rid, "c"]
        assert one(served, "acceptscope_spec_decode_num_trimmed_tokens_total", run_id=rid) == q.loc[rid, "t"]
    for rid, w, n in wins.itertuples(index=False):
        assert one(served, "acceptscope_spec_decode_num_drafts_by_window_total", run_id=rid, window=str(w)) == n
    info = one(served, "acceptscope_run_info", run_id=ok[0])
    labels = [dict(lab) for (n, lab) in served if n == "acceptscope_run_info" and dict(lab)["run_id"] == ok[0]][0]
    assert info == 1 and labels["gen_ai_provider_name"] == labels["engine"] and labels["gen_ai_request_model"]
    models = Store(db, read_only=True).query_df("SELECT run_id, target_model FROM runs").set_index("run_id").target_model
    for n, lab in served:  # a run without a model (a NULL) gets an empty label, never the text "nan"
        if n == "acceptscope_run_info":
            m = models.get(dict(lab)["run_id"])
            assert dict(lab)["gen_ai_request_model"] == ("" if m is None or m != m else str(m))


def test_new_data_makes_a_new_snapshot(audit, tmp_path):
    """A flush that adds rows changes the data version; the next snapshot serves the new run."""
    db = tmp_path / "grow.duckdb"
    shutil.copy(audit[0], db)
    with MetricsExporter(str(db), 0, refresh_s=0.1, n_boot=20) as ex:
        assert ex.source.wait_ready(300), ex.source.last_error
        first = ex.source.get()
        assert "syn-new" not in first.estimates
        Store(db).append(simulate(n_requests=12, seed=3, run_id="syn-new").tables)
        deadline = time.monotonic() + 300
        while ex.source.get() is first and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ex.source.wait_ready(300)
        m = scrape(ex.url)
    assert one(m, "acceptscope_spec_decode_num_drafts_total", run_id="syn-new") > 0
    assert one(m, "acceptscope_exporter_errors_total") == 0


def test_exporter_is_loopback_only_and_survives_a_missing_db(tmp_path):
    with pytest.raises(ValueError, match="loopback"):
        MetricsExporter("x.duckdb", 0, host="0.0.0.0")
    with MetricsExporter(str(tmp_path / "absent.duckdb"), 0, refresh_s=0.05) as ex:
        deadline = time.monotonic() + 10
        while ex.source.errors == 0 and time.monotonic() < deadline:
            time.sleep(0.02)
        m = scrape(ex.url)
    assert one(m, "acceptscope_exporter_errors_total") >= 1  # served, with the failure counted
    assert one(m, "acceptscope_exporter_up_to_date") == 0
