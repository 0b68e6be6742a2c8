"""What another engine's counts identify, and those figures, with their definitions.

Why: vLLM and TensorRT-LLM record no windows, confidences per block or ceilings, so acceptscope's
estimators (tail, utilization, held-out calibration, cost audit) have nothing to run on; what their
counts *do* determine is computed here, exactly, and every figure says what it is and what is not known.

Definitions (the same on every engine, so runs compare): a *draft* is one (request, verify step) that
carried draft tokens; ``accepted`` counts accepted draft tokens, bonus excluded;
``mean_acceptance_length = 1 + accepted / drafts`` (bonus included, vLLM's and TensorRT-LLM's AL);
``draft_acceptance_rate = accepted / draft tokens verified``; ``per_position_acceptance[k]`` = drafts that
accepted 0-based position k / all drafts (vLLM's and TensorRT-LLM's denominator; acceptscope's exporter
also serves the conditional one, over drafts that verified k); ``accepted_histogram[a]`` = drafts that
accepted exactly a tokens.
"""

from __future__ import annotations

import json
from typing import Any

import pandas as pd

from acceptscope.ingest.engines import trim_bounds
from acceptscope.ingest.engines.aiperf import SOURCE_VERSION as AIPERF_SOURCE
from acceptscope.ingest.engines.records import ENGINE_COUNTS, ENGINE_REQUEST_COUNTS
from acceptscope.ingest.engines.trtllm import SOURCE_VERSION as TRTLLM_SOURCE
from acceptscope.ingest.engines.trtllm_dspark import SOURCE_VERSION as DSPARK_SOURCE
from acceptscope.ingest.engines.vllm import SOURCE_VERSION as VLLM_SOURCE
from acceptscope.ingest.engines.vllm_requests import SOURCE_VERSION as VLLM_REQUESTS_SOURCE
from acceptscope.runs_table import read_runs

DEFINITIONS = ("draft: one (request, verify step) with draft tokens; accepted: accepted draft tokens, bonus excluded; "
               "mean_acceptance_length = 1 + accepted / drafts (bonus included); draft_acceptance_rate = accepted / "
               "draft tokens verified; fixed_gamma_rate = accepted / (gamma x drafts) (SGLang's spec_accept_rate); "
               "per_position_acceptance[k] = drafts that accepted 0-based position k / all drafts; "
               "per_position_given_verified[k] = the same / drafts whose window reached k; accepted_histogram[a] = "
               "drafts that accepted exactly a drafts; trim loss = accepted drafts lost to trimming per scored "
               "request-step (bonus excluded; = mean uncapped accepted drafts - mean accepted drafts; "
               "acceptscope.ingest.engines.trim_bounds); submitted_trim_ratio = 1 - tokens submitted to the target "
               "/ tokens a no-trim step submits (bonus included: TensorRT-LLM's trim_ratio, compute saved, not "
               "acceptance lost); trim_regret_rate = trimmed request-steps that accepted their whole window / "
               "trimmed request-steps")
COUNTED_ENGINES = ("vllm", "tensorrt-llm", "aiperf")  # runs whose figures come from engine_counts, not the estimators
NOT_IDENTIFIED = {
    "vllm": ["the uncapped ceiling, utilization and any counterfactual tail: no windows or block outcomes are "
             "recorded, only totals", "calibration: no confidences", "per-request and per-workload figures: the "
             "counters are server totals", "the cost model: no step times"],
    "tensorrt-llm": ["the uncapped ceiling and utilization: the verify width is not recorded, and a position "
                     "trimmed by confidence_threshold is counted as rejected, so per-position acceptance is a lower "
                     "bound of the untrimmed one", "the cost model: no step times",
                     "held-out calibration and STS: only binned counts (bin centres, not mean confidences)"],
    "vllm-per-request": ["the uncapped ceiling, utilization and any counterfactual tail: a step records how many "
                         "drafts were proposed and accepted, not what a trimmed position would have done",
                         "calibration: no confidences", "the cost model: no step times"],
    "tensorrt-llm-dspark": ["per-position acceptance and the accepted-draft histogram: the summary holds totals",
                            "the trim loss under compact, except as a bound (its regret count and the smallest window "
                            "bound it; trimmed positions are never scored)", "calibration and the cost model"],
    "aiperf": ["per-position acceptance and the accepted-draft histogram: a record holds per-request totals "
               "(AIPerf pools the histogram into profile_export_aiperf.json)", "the draft length k (gamma is a "
               "lower bound)", "the ceiling, utilization, calibration and cost model"],
}


def _has_table(store: Any, table) -> bool:
    """Whether the store holds an engine table (created by the first ingest that writes it)."""
    q = store.query_df("SELECT count(*) n FROM duckdb_tables() WHERE table_name = ?", [table.name])
    return bool(int(q.n.iat[0]))


def _counts(store: Any, run_id: str) -> pd.DataFrame:
    if not _has_table(store, ENGINE_COUNTS):  # (e.g. a store holding only vLLM's per-request records)
        return pd.DataFrame(columns=["source", "rank", "metric", "position", "bin", "value"])
    return store.query_df(f"SELECT source, rank, metric, position, bin, value FROM {ENGINE_COUNTS.name} "
                          "WHERE run_id = ?", [run_id])


def _from_histogram(h: list[int], K: int) -> dict:
    drafts = sum(h)
    accepted = sum(a * n for a, n in enumerate(h))
    per_pos = [sum(h[a] for a in range(k + 1, K + 1)) for k in range(K)]
    return {"drafts": drafts, "draft_tokens": drafts * K, "accepted": accepted, "accepted_per_pos": per_pos,
            "accepted_histogram": list(h)}


def _from_per_position(d: int, t: int, a: int, per_pos: list[int]) -> tuple[dict, list[str]]:
    """vLLM's counters. Acceptance is a prefix (``observe_draft`` counts positions 0..accepted-1), so the
    per-position counts give the exact histogram: drafts accepting exactly a = c[a-1] - c[a]."""
    notes = []
    c = [d] + per_pos + [0]
    h = [c[i] - c[i + 1] for i in range(len(per_pos) + 1)]
    if any(x < 0 for x in h):
        notes.append("per-position counts are not non-increasing from num_drafts: the histogram is not identified")
        h = None
    if sum(per_pos) != a:
        notes.append(f"sum of per-position counts ({sum(per_pos)}) differs from num_accepted_tokens ({a})")
    return {"drafts": d, "draft_tokens": t, "accepted": a, "accepted_per_pos": per_pos, "accepted_histogram": h}, notes


def _vllm_per_request(store: Any, run_id: str, K: int) -> tuple[dict, list[str]]:
    """vLLM's per-request records: totals and histograms from ``requests``; with ``detailed`` arrays, what each
    step verified, so acceptance given verified is exact (acceptance is a prefix of the proposed drafts)."""
    q = store.query_df("SELECT rid, spec_verify_ct s, spec_num_correct_drafts a, spec_num_proposed_drafts p, "
                       "spec_correct_drafts_histogram h FROM requests WHERE run_id = ?", [run_id])
    h = [0] * (K + 1)
    for row in q.h:
        for j, n in enumerate(list(row) if row is not None else []):
            h[j] += int(n)
    c = _from_histogram(h, K)
    c.update(draft_tokens=int(q.p.sum()), requests=len(q))
    ok = q[q.s > 0]
    c["per_request_mean_acceptance_length"] = float((1 + ok.a / ok.s).mean()) if len(ok) else None
    c["per_request_acceptance_length"] = {str(r): 1 + a / s for r, a, s in ok[["rid", "a", "s"]].itertuples(index=False)}
    notes = []
    st = _request_counts(store, run_id, ("step_drafted",))
    if len(st):
        d = st.value.to_numpy()
        covered = st.rid.nunique()
        c["verified_per_pos"] = [int((d > k).sum()) for k in range(K)] if covered == len(q) else None
        if covered != len(q):
            notes.append(f"{len(q) - covered} of {len(q)} requests carry no per-step arrays (summary level): "
                         "acceptance given verified is not identified for the run")
    elif c["draft_tokens"] == c["drafts"] * K:
        c["verified_per_pos"] = [c["drafts"]] * K
    else:
        c["verified_per_pos"] = None
        notes.append("summary level with varied draft lengths: per-position acceptance over all steps only")
    return c, notes


def _request_counts(store: Any, run_id: str, metrics: tuple[str, ...]) -> pd.DataFrame:
    if not _has_table(store, ENGINE_REQUEST_COUNTS):  # (no file with per-step arrays was ingested into this store)
        return pd.DataFrame(columns=["rid", "metric", "position", "value"])
    marks = ", ".join("?" * len(metrics))
    return store.query_df(f"SELECT rid, metric, position, value FROM {ENGINE_REQUEST_COUNTS.name} "
                          f"WHERE run_id = ? AND metric IN ({marks}) ORDER BY rid, position", [run_id, *metrics])


def engine_figures(store: Any, run_id: str) -> dict:
    """The figures one engine run's counts identify, summed over its ranks (see the module docstring)."""
    run = read_runs(store.query_df, [run_id], ["engine", "gamma", "arm", "config_json"])
    if run.empty:
        raise KeyError(f"no run {run_id!r}")
    engine, K, arm = str(run.engine.iat[0]), int(run.gamma.iat[0]), str(run.arm.iat[0])
    cfg = json.loads(run.config_json.iat[0] or "{}") or {}
    fmt = cfg.get("format")
    df = _counts(store, run_id) if engine in ("vllm", "tensorrt-llm") else pd.DataFrame(
        columns=["source", "rank", "metric", "position", "bin", "value"])
    # the counters are cumulative: two dumps of one server (sources) hold the later one's counts as the
    # larger, so a cell is its largest value over the sources, then the ranks (DP engines) are summed
    tot = df.groupby(["rank", "metric", "position", "bin"])["value"].max().groupby(["metric", "position", "bin"]).sum()
    get = lambda m, p=-1, b=-1: int(tot.get((m, p, b), 0))  # noqa: E731
    notes: list[str] = []
    kind = engine
    if engine == "vllm" and fmt == "vllm-per-request-metrics":
        kind, source = "vllm-per-request", VLLM_REQUESTS_SOURCE
        c, notes = _vllm_per_request(store, run_id, K)
        identifies = ["per-request acceptance length and accepted-draft histogram", "per-position acceptance over "
                      "all steps (exact: acceptance is a prefix)", "mean acceptance length", "draft acceptance rate"]
        if c.get("verified_per_pos") is not None:
            identifies.append("per-position acceptance given verified: each step's effective proposal "
                              "(per_step_drafted) is recorded, and the target verifies every proposed draft")
            notes.append("given verified reads per_step_drafted as the drafts the target verified (vLLM's doc: the "
                         "effective proposal length, structured-output-invalidated drafts removed); the doc does not "
                         "say how adaptive verification's trimmed drafts are counted")
    elif engine == "vllm":
        c, notes = _from_per_position(get("num_drafts"), get("num_draft_tokens"), get("num_accepted_tokens"),
                                      [get("accepted_per_pos", k) for k in range(K)])
        identifies = ["per-position acceptance over all drafts", "the accepted-draft histogram (exact: acceptance is a "
                      "prefix)", "mean acceptance length", "draft acceptance rate"]
        source = VLLM_SOURCE
        if arm == "compact":
            notes.append("draft tokens < drafts x positions: windows varied, so a position's count mixes trimmed "
                         "(never verified) with rejected drafts; acceptance given verified is not identified")
    elif engine == "tensorrt-llm":
        c, identifies, source, kind = _trtllm(df, K, arm, get, notes, "lower bound" in str(cfg.get("gamma", "")))
    elif engine == "aiperf":
        q = store.query_df("SELECT spec_verify_ct s, spec_num_correct_drafts a, spec_num_proposed_drafts p "
                           "FROM requests WHERE run_id = ?", [run_id])
        c = {"drafts": int(q.s.sum()), "draft_tokens": int(q.p.sum()), "accepted": int(q.a.sum()),
             "accepted_per_pos": [], "accepted_histogram": None, "requests": len(q)}
        ok = q[q.s > 0]
        c["per_request_mean_acceptance_length"] = float((1 + ok.a / ok.s).mean()) if len(ok) else None
        identifies = ["per-request verify steps, accepted and proposed draft tokens", "mean acceptance length "
                      "(token-weighted, and AIPerf's per-request mean)", "draft acceptance rate"]
        source = AIPERF_SOURCE
    else:
        raise ValueError(f"run {run_id!r} is an {engine!r} run: its figures come from the estimators")
    d = c["drafts"]
    figures = {
        **c,
        "mean_acceptance_length": 1 + c["accepted"] / d if d else None,
        "draft_acceptance_rate": c["accepted"] / c["draft_tokens"] if c["draft_tokens"] else None,
        "per_position_acceptance": [x / d for x in c["accepted_per_pos"]] if d and c["accepted_per_pos"] else None,
    }
    ver = c.get("verified_per_pos")
    if ver and c["accepted_per_pos"]:
        figures["per_position_given_verified"] = [a / v if v else None for a, v in zip(c["accepted_per_pos"], ver)]
    return {"run_id": run_id, "engine": engine, "gamma": K, "format_source": source, "identifies": identifies,
            "not_identified": NOT_IDENTIFIED[kind], "notes": notes, "figures": figures,
            "definitions": DEFINITIONS}


def _trtllm(df: pd.DataFrame, K: int, arm: str, get, notes: list[str],
            k_lower: bool = False) -> tuple[dict, list[str], str, str]:
    """TensorRT-LLM: accept stats (the histogram) and / or DSpark ragged-verify counters (trim figures).
    ``k_lower``: K is only the largest window handed out, so no upper bound of the trim loss is claimed."""
    dspark = trim_bounds.dspark_figures(df, K, arm)
    if dspark is not None and k_lower and dspark.get("trim_loss_bound_hi") is not None and arm == "compact":
        dspark["trim_loss_bound_hi"] = None
        notes.append("K is the largest window handed out (no max_draft_len or planner tiers line), a lower bound: "
                     "the trim loss has no upper bound from these counters")
    has_hist = bool((df.metric == "accepted_draft_hist").any())
    if has_hist or dspark is None:
        c = _from_histogram([get("accepted_draft_hist", a) for a in range(K + 1)], K)
        identifies = ["the accepted-draft histogram", "per-position acceptance over all drafts (exact from the "
                      "histogram)", "mean acceptance length", "per-request steps and accepted drafts"]
        source, kind = TRTLLM_SOURCE, "tensorrt-llm"
        calib = _binned_ece(df, K)
        if calib:
            c["binned_ece"] = calib
            identifies.append("binned calibration per position (TensorRT-LLM's ECE: attempts-weighted |bin centre - "
                              "empirical rate|)")
    else:
        N, (a_lo, a_hi) = dspark["requests_scored"], dspark["accepted"]
        c = {"drafts": N, "accepted": a_lo, "draft_tokens": max(dspark["window_tokens"] - N, 0),
             "accepted_per_pos": [], "accepted_histogram": None}
        if a_lo != a_hi:
            notes.append(f"accepted drafts are {a_lo}..{a_hi} (accept_len is written to 4 decimals); the lower end is "
                         "used for the rates")
        notes.append("draft tokens verified = window_tokens - requests_scored (the bonus row of each scored "
                     "request-step); assumes record_step and record_acceptance saw the same requests")
        identifies, source, kind = [], DSPARK_SOURCE, "tensorrt-llm-dspark"
    if dspark is not None:
        c["dspark"] = dspark
        identifies = identifies + ["steps ragged / uniform / without windows; tokens submitted with no trim, asked "
                                   "for by the windows and delivered (TensorRT-LLM's trim_ratio: compute saved)",
                                   "trim_regret_rate (exact below ~10^4 trimmed request-steps, else an interval)",
                                   "the trim loss: measured under cap-accept, bounded under compact "
                                   "(acceptscope.ingest.engines.trim_bounds)"]
        if has_hist:
            source = f"{TRTLLM_SOURCE}; {DSPARK_SOURCE}"
    return c, identifies, source, kind


def _binned_ece(df: pd.DataFrame, K: int) -> list | None:
    cell = lambda m: (df[df.metric == m].groupby(["rank", "position", "bin"])["value"].max()  # noqa: E731
                      .groupby(["position", "bin"]).sum())
    att = cell("calib_attempts")
    if att.empty:
        return None
    acc = cell("calib_accepted")
    nb = int(df[df.metric == "calib_num_bins"]["value"].max())  # (ranks of one run share it)
    out = []
    for k in range(K):
        num = n = 0
        for (p, b), x in att.items():
            if p == k and x:
                num += x * abs((b + 0.5) / nb - acc.get((p, b), 0) / x)
                n += x
        out.append(num / n if n else None)
    return out


def native_counts(store: Any, run_id: str, gamma: int) -> dict:
    """The same counts for an SGLang or reference-engine run, from its request-steps (draft tokens verified =
    Σ window: a trimmed draft was never verified), with TensorRT-LLM's trim counters computed on them."""
    q = store.query_df('SELECT "window" w, correct_drafts c, ceiling e, count(*) n FROM request_steps WHERE run_id = ? '
                       "GROUP BY ALL", [run_id])
    w, c, n = (q[k].to_numpy().astype(int) for k in ("w", "c", "n"))
    h = [int(n[c == a].sum()) for a in range(gamma + 1)]
    out = _from_histogram(h, gamma)
    out["draft_tokens"] = int((w * n).sum())
    out["verified_per_pos"] = [int(n[w > k].sum()) for k in range(gamma)]
    out["q"] = q
    return out


def compare(store: Any, run_ids: list[str], estimates: dict | None = None) -> pd.DataFrame:
    """Runs of any engines side by side on the figures they share (:data:`DEFINITIONS`); a figure an engine's
    data does not identify is None, never filled in. ``estimates``: ``estimate --json``'s dict per run id (the
    exporter's snapshot holds them); with it, a native run's trim loss interval stands beside the bound
    TensorRT-LLM's counters give on the same request-steps (:mod:`~acceptscope.ingest.engines.trim_bounds`)."""
    runs = read_runs(store.query_df, run_ids, ["run_id", "engine", "gamma", "arm"])
    rows = []
    for rid, engine, gamma, arm in runs.itertuples(index=False):
        trim: dict = dict.fromkeys(trim_bounds.LOSS_COLUMNS)
        if engine in COUNTED_ENGINES:
            c = engine_figures(store, rid)["figures"]
            verified = c.get("verified_per_pos")
            if verified is None and engine == "vllm" and c["accepted_per_pos"] and c["draft_tokens"] == c["drafts"] * gamma:
                verified = [c["drafts"]] * int(gamma)
            ds = c.get("dspark")
            if ds is not None:
                trim.update({k: ds.get(k) for k in trim_bounds.LOSS_COLUMNS if k in ds}, trim_loss_source=(
                    "tensorrt-llm DSparkRaggedStats: measured (cap-accept)" if arm == "cap-accept" else
                    "tensorrt-llm DSparkRaggedStats: model-free bound from its counters"))
        else:
            c = native_counts(store, rid, int(gamma))
            verified = c["verified_per_pos"]
            d = c["drafts"]
            trim.update(trim_bounds.native_trim(c.pop("q"), int(gamma), str(arm)),
                        trim_loss_source="acceptscope request-steps (bound: TensorRT-LLM's counters on the same steps)")
            trim.update(trim_bounds.estimate_loss((estimates or {}).get(rid), c["accepted"] / d if d else None))
        d = c["drafts"]
        rows.append({
            "run_id": rid, "engine": engine, "arm": arm, "gamma": int(gamma), "drafts": d,
            "mean_acceptance_length": 1 + c["accepted"] / d if d else None,
            "draft_acceptance_rate": c["accepted"] / c["draft_tokens"] if c["draft_tokens"] else None,
            "fixed_gamma_rate": c["accepted"] / (gamma * d) if d else None,
            "per_position_acceptance": [x / d for x in c["accepted_per_pos"]] if d and c["accepted_per_pos"] else None,
            "per_position_given_verified": ([a / v if v else None for a, v in zip(c["accepted_per_pos"], verified)]
                                            if verified and c["accepted_per_pos"] else None),
            "accepted_histogram": c.get("accepted_histogram"),
            **trim,
        })
    return pd.DataFrame(rows)
