"""The audit workflow on the real reference engine: arms, parity, sampling inference, CLI.

``audit_db`` (shared with the report, dashboard and notebook tests) is ONE small
real audit produced by the ``acceptscope audit`` command itself, built once per
pytest session.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from acceptscope import audit_sampling, schema
from acceptscope.cli import app
from acceptscope.cli._common import EXIT_FAILURE, EXIT_OK
from acceptscope.parity import check_parity, first_divergence
from acceptscope.store import Store
from acceptscope.reader import Reader

REPO = Path(__file__).resolve().parents[1]
# ACCEPTSCOPE_TEST_MODELS=DIR (holding target/ and drafter/) overrides the fixture models
_MODELS = os.environ.get("ACCEPTSCOPE_TEST_MODELS")
MODEL_ARGS = ["--target", f"{_MODELS}/target", "--drafter", f"{_MODELS}/drafter"] if _MODELS else []
# small enough for 2 CPU cores, big enough for every workload of `mixed` to have several requests
AUDIT_ARGS = ["--workload", "mixed", "--requests", "16", "--max-new-tokens", "24", "--with-static",
              "--no-estimators", "--calibration-requests", "8", "--curve-batches", "2"]


def _engine_ready() -> str | None:
    from acceptscope.domain.locations import DEFAULT_DRAFTER, DEFAULT_TARGET, resolve_model_path

    if _MODELS:
        return None if Path(_MODELS, "target", "config.json").is_file() else f"{_MODELS}/target: no model"
    for label, p in (("target", DEFAULT_TARGET), ("drafter", DEFAULT_DRAFTER)):
        if not (resolve_model_path(p) / "config.json").is_file():
            return f"reference-engine {label} model {p} is not built (run `acceptscope train`)"
    return None


def build_audit_db(tmp_path_factory, name: str = "surfaces-audit", args: list[str] = AUDIT_ARGS) -> tuple[Path, dict]:
    """Run `acceptscope audit --json ARGS` once per session (per ``name``); returns (db path, its JSON summary).
    What the command printed is kept beside it (``audit_output.txt``)."""
    why = _engine_ready()
    if why:
        pytest.skip(why)
    base = tmp_path_factory.getbasetemp() / name
    db, summary = base / "audit.duckdb", base / "summary.json"
    if not summary.exists():
        base.mkdir(parents=True, exist_ok=True)
        res = CliRunner().invoke(app, ["audit", "--db", str(db), "--out", str(base / "report.html"), "--json",
                                       *args, *MODEL_ARGS])
        assert res.exit_code == EXIT_OK, res.output[-4000:]
        (base / "audit_output.txt").write_text(res.stderr)
        summary.write_text(res.stdout[res.stdout.index("{"):])
    return db, json.loads(summary.read_text())


@pytest.fixture(scope="module")
def audit(tmp_path_factory):
    return build_audit_db(tmp_path_factory)


def test_audit_runs_both_arms_into_one_file(audit):
    db, s = audit
    assert set(s["runs"]) == {"compact", "cap-accept", "static"}
    every = Reader(db).runs()
    # the file also holds the STS calibration split and the throughput-curve runs, in sub-groups
    assert set(every["audit_group"]) == {s["audit_group"], f"{s['audit_group']}/calibration",
                                         f"{s['audit_group']}/curve"}
    runs = every[every["audit_group"] == s["audit_group"]]
    assert set(runs["arm"]) == {"compact", "cap-accept", "static"}
    summ = Reader(db).run_summary(list(runs["run_id"])).set_index("arm")
    # the audit arm observes the ceiling, production does not
    assert summ.loc["cap-accept", "ceiling_accept_len"] >= summ.loc["cap-accept", "mean_acc_len"]
    assert np.isnan(summ.loc["compact", "ceiling_accept_len"])
    # static verifies the whole block: the ceiling is what it commits
    assert summ.loc["static", "utilization"] == pytest.approx(1.0)


def test_audit_parity_holds_on_reference_engine(audit):
    db, s = audit
    p = s["parity"]
    assert p["ok"] and s["exit_code"] == EXIT_OK
    assert p["pairs"] == 16 and p["identical"] == 16


def test_full_audit_inference_equals_observed_truth(audit):
    db, s = audit
    inf = s["sampling"]
    assert inf["n_audited"] == inf["n_requests"] == 16
    r = Reader(db)
    ids = {a: x["run_id"] for a, x in s["runs"].items()}
    truth = r.df(f'SELECT sum(ceiling + 1) / count(*) AS c FROM "{schema.REQUEST_STEPS.name}" WHERE run_id = ?',
                 [ids["cap-accept"]])["c"][0]
    # full audit: the estimate is the block-weighted truth (weights are compact's block counts, equal
    # to cap-accept's because both arms ran the same schedule on the same traffic)
    assert inf["method"] == "difference" and inf["ceiling_regression"] is None  # 16 < MIN_REGRESSION_N
    assert inf["ceiling"]["estimate"] == pytest.approx(truth, rel=1e-9)
    assert inf["ceiling"]["lo"] == pytest.approx(inf["ceiling"]["estimate"]) == inf["ceiling"]["hi"]
    assert inf["ceiling_direct"]["estimate"] == pytest.approx(truth, rel=1e-9)


def test_sampled_inference_brackets_the_truth(audit):
    """A 50% request sample of the real audit: the ratio interval contains the full-audit truth."""
    db, s = audit
    ids = {a: x["run_id"] for a, x in s["runs"].items()}
    pr = audit_sampling.per_request(Reader(db), ids["compact"], ids["cap-accept"])
    truth = audit_sampling.infer(pr).ceiling.estimate
    sample = audit_sampling.sample_keys(pr[["workload", "prompt_index", "seed"]], 0.5, seed=3)
    assert len(sample) == 8
    masked = pr.merge(sample.assign(kept=True), how="left")
    masked.loc[masked["kept"].isna(), "y"] = np.nan
    inf = audit_sampling.infer(masked.drop(columns="kept"), n_boot=1000, seed=3)
    assert inf.n_audited == 8 and inf.fraction == pytest.approx(0.5)
    assert inf.method == "difference"  # 8 audited requests: below the regression threshold
    assert inf.realized_accept_len <= inf.ceiling.lo <= inf.ceiling.estimate <= inf.ceiling.hi
    assert inf.ceiling.lo <= truth  # never claims a ceiling above the truth's lower side
    full_tails = int((pr["y"] - pr["a"] > 1e-9).sum())
    if inf.n_with_tail == full_tails:  # the sample saw every request that has a tail
        assert truth <= inf.ceiling.hi
    else:  # a collapsed interval is flagged through n_with_tail
        assert inf.n_with_tail < full_tails
    u = inf.utilization
    assert 0 < u.lo <= u.estimate <= u.hi <= 1.0 + 1e-9


def test_sampled_inference_coverage():
    """Repeated 10% audits of a 240-request population (the estimators' DSpark simulator, whose
    ceiling is known for every request): the reported 95% interval covers the full-traffic truth in
    most replicates and is far narrower than the audited sample alone. (Measured on a real
    240-request reference-engine audit: 90% at 10%, 95% at 25%; see the surfaces report.)"""
    import pandas as pd
    from acceptscope.estimators.synthetic import simulate

    rs = simulate(n_requests=240, seed=2).tables["request_steps"]
    g = rs.assign(x=1 + rs["survival"].map(lambda v: float(np.sum(v))), y=rs["ceiling"] + 1).groupby("rid")
    pop = pd.DataFrame({"w": g.size(), "a": g["acc_len"].mean(), "x": g["x"].mean(), "y": g["y"].mean()})
    pop = pop.reset_index(drop=True).assign(workload="sim", seed=0)
    pop["prompt_index"] = np.arange(len(pop))
    truth = audit_sampling.infer(pop).ceiling.estimate
    keys = pop[["workload", "prompt_index", "seed"]]
    hits, widths, direct_widths, reps = 0, [], [], 60
    for rep in range(reps):
        sample = audit_sampling.sample_keys(keys, 0.1, seed=rep)
        masked = pop.merge(sample.assign(kept=True), how="left")
        masked.loc[masked["kept"].isna(), "y"] = np.nan
        inf = audit_sampling.infer(masked.drop(columns="kept"), n_boot=300, seed=rep)
        assert inf.n_audited == 24 and inf.method == "regression"
        hits += inf.ceiling.lo <= truth <= inf.ceiling.hi
        widths.append(inf.ceiling.hi - inf.ceiling.lo)
        direct_widths.append(inf.ceiling_direct.hi - inf.ceiling_direct.lo)
    assert hits / reps >= 0.85, hits / reps
    assert np.mean(widths) < 0.5 * np.mean(direct_widths)


def sampled_audit(db: Path, temperature: str, requests: int = 8, max_new_tokens: int = 16):
    """`acceptscope audit --audit-fraction 0.5` of math and chat on the reference engine (sample seed 7, no STS,
    no curve, no estimators): the CLI result (skips when the fixture models are not built)."""
    why = _engine_ready()
    if why:
        pytest.skip(why)
    return CliRunner().invoke(app, ["audit", "--db", str(db), "--no-report", "--json", "--workload", "math,chat",
                                    "--requests", str(requests), "--max-new-tokens", str(max_new_tokens),
                                    "--audit-fraction", "0.5", "--temperature", temperature, "--sample-seed", "7",
                                    "--no-estimators", "--curve-batches", "", "--sts", "none", *MODEL_ARGS])


@pytest.mark.parametrize("temperature", ["0", "1.0"])
def test_sampled_audit_cli(tmp_path, temperature):
    """`--audit-fraction` serves a seeded sample in the audit arm (replaying production's windows,
    so parity holds under sampling too) and reports intervals."""
    db = tmp_path / "sampled.duckdb"
    res = sampled_audit(db, temperature)
    assert res.exit_code == EXIT_OK, res.output
    s = json.loads(res.stdout[res.stdout.index("{"):])
    assert s["runs"]["compact"]["requests"] == 8 and s["runs"]["cap-accept"]["requests"] == 4
    assert s["parity"]["sampled"] and s["parity"]["pairs"] == 4 and s["parity"]["ok"]
    inf = s["sampling"]
    assert inf["n_audited"] == 4 and inf["n_requests"] == 8
    c = inf["ceiling"]
    assert c["lo"] <= c["estimate"] <= c["hi"]
    # the sampled requests are the seeded sample of the compact run's requests
    r = Reader(db)
    keys = audit_sampling.keys_of(r, s["runs"]["compact"]["run_id"])
    want = audit_sampling.sample_keys(keys, 0.5, 7)
    got = audit_sampling.keys_of(r, s["runs"]["cap-accept"]["run_id"])
    assert sorted(map(tuple, want.values.tolist())) == sorted(map(tuple, got.values.tolist()))


def test_first_divergence():
    assert first_divergence([1, 2, 3], [1, 2, 3]) is None
    assert first_divergence([1, 2, 3], [1, 9, 3]) == 1
    assert first_divergence([1, 2], [1, 2, 3]) == 2
    assert first_divergence(None, []) is None


def _tamper(db: Path, src_run: str, new_run: str, flip_at: int | None, window_shift: bool) -> str:
    """Copy a real run under a new id, flipping one committed token and/or one block's window."""
    st = Store(db)
    runs = st.read_table(schema.RUNS.name, src_run).assign(run_id=new_run)
    req = st.read_table(schema.REQUESTS.name, src_run).assign(run_id=new_run)
    rs = st.read_table(schema.REQUEST_STEPS.name, src_run).assign(run_id=new_run)
    victim = req.sort_values("completion_tokens").iloc[-1]["rid"]
    if flip_at is not None:
        i = req.index[req["rid"] == victim][0]
        toks = list(req.at[i, "output_tokens"])
        toks[flip_at] = toks[flip_at] + 1
        req.at[i, "output_tokens"] = toks
    if window_shift:
        first = rs[rs["rid"] == victim].sort_values("forward_ct").index[0]
        rs.loc[first, "window"] = rs.loc[first, "window"] + 1
    st.append({schema.RUNS.name: runs, schema.REQUESTS.name: req, schema.REQUEST_STEPS.name: rs})
    return victim


def test_parity_classifies_divergences(audit, tmp_path):
    db, s = audit
    work = tmp_path / "tampered.duckdb"
    shutil.copy(db, work)
    compact = s["runs"]["compact"]["run_id"]
    victim = _tamper(work, compact, "t-nondet", flip_at=5, window_shift=False)
    p = check_parity(Reader(work), compact, "t-nondet")
    assert not p.ok and len(p.findings) == 1
    f = p.findings[0]
    assert (f.kind, f.position, f.rid_a) == ("nondeterminism", 5, victim)
    assert f.token_b == f.token_a + 1 and f.windows_a == f.windows_b

    _tamper(work, compact, "t-sched", flip_at=5, window_shift=True)
    f = check_parity(Reader(work), compact, "t-sched").findings[0]
    assert f.kind == "scheduling" and f.windows_a != f.windows_b


def test_parity_broken_exit_code(audit, tmp_path):
    """A report over a tampered pair lists the finding; the audit result maps it to EXIT_FAILURE."""
    from acceptscope.audit import AuditResult
    from acceptscope.report import write_report

    db, s = audit
    work = tmp_path / "tampered.duckdb"
    shutil.copy(db, work)
    compact = s["runs"]["compact"]["run_id"]
    _tamper(work, compact, "t-bad", flip_at=3, window_shift=False)
    p = check_parity(Reader(work), compact, "t-bad")
    assert AuditResult("g", str(work), {}, p).exit_code == EXIT_FAILURE
    rep = write_report(work, tmp_path / "r.html", run_ids=[compact, "t-bad"], parity=p, use_estimators=False)
    assert any(f.level == "bad" and f.area == "parity" for f in rep.findings)
    assert "nondeterminism" in (tmp_path / "r.html").read_text()


def test_audit_rejects_bad_arguments(tmp_path):
    r = CliRunner().invoke(app, ["audit", "--db", str(tmp_path / "x.duckdb"), "--engine", "vllm"])
    assert r.exit_code == 2 and "reference or sglang" in r.output
    r = CliRunner().invoke(app, ["audit", "--db", str(tmp_path / "x.duckdb"), "--audit-fraction", "0"])
    assert r.exit_code == 2


def test_sglang_engine_delegates_to_live(tmp_path):
    """`--engine sglang --urls` attaches to SGLang servers through acceptscope.live (here: the project's
    loopback simulator of SGLang 0.5.23's HTTP formats, two instances that do NOT share an engine)."""
    from tests.fake_sglang_server import FakeConfig, FakeSGLangServer

    db = tmp_path / "sg.duckdb"
    with FakeSGLangServer(FakeConfig(mode="compact", gamma=4, seed=5)) as c, \
            FakeSGLangServer(FakeConfig(mode="cap-accept", gamma=4, seed=5)) as a:
        r = CliRunner().invoke(app, ["audit", "--engine", "sglang", "--urls", f"compact={c.url},cap-accept={a.url}",
                                     "--db", str(db), "--out", str(tmp_path / "sg.html"), "--requests", "6",
                                     "--max-new-tokens", "16", "--json", "--no-estimators"])
    s = json.loads(r.stdout[r.stdout.index("{"):])
    assert r.exit_code == s["exit_code"] in (EXIT_OK, EXIT_FAILURE), r.output
    runs = Reader(db).runs()
    assert set(runs["arm"]) == {"compact", "cap-accept"} and runs["audit_group"].nunique() == 1
    assert s["runs"]["compact"]["run_id"] == f"{s['audit_group']}-compact"
    p = s["parity"]
    assert p["pairs"] == 6 and p["identical"] + len(p["findings"]) == 6
    # two independent simulated servers diverge: every finding names its request and first divergent token
    for f in p["findings"]:
        assert f["kind"] in ("scheduling", "nondeterminism", "length") and f["position"] is not None
    assert (r.exit_code == EXIT_FAILURE) == bool(p["findings"])
    assert (tmp_path / "sg.html").stat().st_size > 100_000
