"""Prometheus exporter of acceptscope's derived live metrics (loopback only).

Why: SGLang exports only interval means (``sglang:spec_accept_length`` ...);
it has no ceiling, utilization, calibration or cost-model error (reference
§6.3). This exporter computes those from the telemetry store over a recent
window and serves them on ``127.0.0.1:<port>/metrics`` so a Grafana board can
plot them beside SGLang's gauges.

Quantities (per run; window = the last ``window_rows`` request-steps), all in
accept-length units (accepted drafts + 1 bonus):

* ``acceptscope_realized_accept_length``: mean ``acc_len``.
* ``acceptscope_ceiling_accept_length{bound="point|lo|hi"}``: the uncapped
  accept length. cap-accept/static: exact per row (``ceiling + 1``); point is
  the mean and lo/hi a 95% normal interval of the mean. compact: per row the
  identification bound ``[cl+1, gamma+1]`` when the whole window was accepted
  and drafts were trimmed (else exact ``cl+1``); point imputes the trimmed tail
  from the row's own recorded confidence (expected extra accepts
  ``sum_j prod_{i=w..j} c_i``); lo/hi are the means of the bounds.
* compact runs also get ``method="hazard"``: the estimators package's
  ``TailEstimator`` fit on a truth-bearing run of the same gamma (cap-accept of
  the same audit group first) and applied to the compact window, with its
  bootstrap 95% interval. ``method`` is ``exact`` (cap-accept/static),
  ``bounds`` (compact identification bounds) or ``hazard``.
* ``acceptscope_utilization{bound=..., method=...}``: realized / ceiling (lo uses
  the hi ceiling and vice versa).
* ``acceptscope_in_window_accept_rate``: sum(correct_drafts) / sum(window),
  the rate SGLang's fixed-gamma ``spec_accept_rate`` understates.
* ``acceptscope_calibration_ece{position}``: ECE (15 equal-width bins) of the
  recorded survival against the uncensored label ``k < ceiling`` (cap-accept
  only; compact labels are censored at the window).
* ``acceptscope_cost_model_error_ms{vs}``: mean |predicted_step_ms - actual|
  for actual = ``step_cpu_ms`` (what the SPS table is fit on) and
  ``step_gpu_ms`` (what SGLang's online check uses); ``..._rel`` the median
  relative error.
* counts: steps, request-steps, requests, gaps by kind, rejects.

When the store cannot be read (e.g. a writer holds the lock past the retry
budget) the last good values are served and ``acceptscope_exporter_errors_total``
counts the failure.
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any, Iterable, Sequence

import numpy as np
import pandas as pd
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from acceptscope.store import Store
from acceptscope.estimators.calibration_metrics import ece
from acceptscope.estimators.tail import TailEstimator

ECE_BINS = 15


def _mean_ci(x: np.ndarray) -> tuple[float, float, float]:
    n = len(x)
    if n == 0:
        return (math.nan, math.nan, math.nan)
    m = float(x.mean())
    if n < 2:
        return (m, m, m)
    h = 1.96 * float(x.std(ddof=1)) / math.sqrt(n)
    return (m, m - h, m + h)


def _imputed_tail(conf: Any, w: int, gamma: int) -> float:
    """Expected extra accepted drafts past the window from the row's own confidences."""
    if conf is None or w >= gamma:
        return 0.0
    c = np.asarray(conf, dtype=float)[w:gamma]
    if c.size == 0 or not np.isfinite(c).all():
        return 0.0
    return float(np.cumprod(c).sum())


def _util(r: float, point: float, lo: float, hi: float) -> dict[str, float]:
    return {
        "point": r / point if point else math.nan,
        "lo": r / hi if hi else math.nan,
        "hi": min(1.0, r / lo) if lo else math.nan,
    }


def hazard_ceiling(truth_rows: pd.DataFrame, rows: pd.DataFrame, gamma: int) -> dict[str, float]:
    """Mean ceiling (accept-length units) of ``rows`` by the estimators package's TailEstimator."""
    res = TailEstimator().fit(truth_rows, gamma=gamma).estimate(rows, gamma=gamma)
    agg = res.aggregate(level=0.95, n_boot=200).iloc[0]
    return {"point": float(agg["mean_ceiling"]) + 1.0, "lo": float(agg["lo"]) + 1.0, "hi": float(agg["hi"]) + 1.0}


def run_metrics(rs: pd.DataFrame, arm: str, gamma: int) -> dict[str, Any]:
    """Derived metrics of one run's recent request-steps (see module doc)."""
    out: dict[str, Any] = {"request_steps_window": len(rs)}
    if rs.empty:
        return out
    acc = rs["acc_len"].to_numpy(dtype=float)
    cl = rs["correct_drafts"].to_numpy(dtype=float)
    w = rs["window"].to_numpy(dtype=float)
    out["realized"] = float(acc.mean())
    out["in_window_accept_rate"] = float(cl.sum() / w.sum()) if w.sum() > 0 else math.nan
    if arm in ("cap-accept", "static") and rs["ceiling"].notna().any():
        ceil = rs["ceiling"].dropna().to_numpy(dtype=float) + 1.0
        point, lo, hi = _mean_ci(ceil)
    else:
        opened = (cl == w) & (w < gamma)
        lo_rows = cl + 1.0
        hi_rows = np.where(opened, gamma + 1.0, cl + 1.0)
        tail = np.array([_imputed_tail(c, int(wi), gamma) if o else 0.0
                         for c, wi, o in zip(rs["confidence"], w, opened)])
        point, lo, hi = float((lo_rows + tail).mean()), float(lo_rows.mean()), float(hi_rows.mean())
    method = "exact" if arm in ("cap-accept", "static") and rs["ceiling"].notna().any() else "bounds"
    out["ceiling"] = {method: {"point": point, "lo": lo, "hi": hi}}
    out["utilization"] = {method: _util(out["realized"], point, lo, hi)}
    if arm == "cap-accept" and rs["survival"].notna().any():
        sub = rs[rs["survival"].notna() & rs["ceiling"].notna()]
        surv = np.stack([np.asarray(s, dtype=float)[:gamma] for s in sub["survival"]])
        ceil = sub["ceiling"].to_numpy(dtype=int)
        lab = (np.arange(gamma)[None, :] < ceil[:, None]).astype(float)
        out["ece"] = {k: ece(surv[:, k], lab[:, k], ECE_BINS) for k in range(gamma)}
        out["ece_all"] = ece(surv.ravel(), lab.ravel(), ECE_BINS)
    return out


def cost_metrics(steps: pd.DataFrame) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for col in ("step_cpu_ms", "step_gpu_ms"):
        if col not in steps:
            continue
        m = steps["predicted_step_ms"].notna() & steps[col].notna() & (steps[col] > 0)
        if m.any():
            pred, act = steps.loc[m, "predicted_step_ms"].to_numpy(float), steps.loc[m, col].to_numpy(float)
            out[col] = {"mae_ms": float(np.abs(pred - act).mean()),
                        "median_rel": float(np.median(np.abs(pred - act) / act)), "n": int(m.sum())}
    return out


class DerivedMetrics:
    """Reads the store and computes per-run derived metrics (cached for ``refresh_s``)."""

    def __init__(self, db: str, run_ids: Sequence[str] | None = None, *, window_rows: int = 20_000, refresh_s: float = 2.0):
        self.db = db
        self.run_ids = list(run_ids) if run_ids else None
        self.window_rows = window_rows
        self.refresh_s = refresh_s
        self.errors = 0
        self.last_error: str | None = None
        self._cache: dict[str, Any] = {}
        self._truth: dict[str, tuple[float, pd.DataFrame]] = {}
        self.refit_s = 30.0
        self._at = 0.0
        self._lock = threading.Lock()

    def _compute(self) -> dict[str, Any]:
        store = Store(self.db, read_only=True, lock_timeout_s=5.0)  # a reader never creates tables
        runs = store.query_df("SELECT run_id, arm, gamma, audit_group FROM runs")
        all_runs = runs
        if self.run_ids:
            runs = runs[runs["run_id"].isin(self.run_ids)]
        ids = runs["run_id"].tolist()
        res: dict[str, Any] = {"runs": {}}
        if not ids:
            return res
        rs = store.query_df(
            """SELECT * EXCLUDE (rn) FROM (
                 SELECT *, row_number() OVER (PARTITION BY run_id ORDER BY epoch DESC, forward_ct DESC) AS rn
                 FROM request_steps WHERE run_id IN (SELECT UNNEST(?))) WHERE rn <= ?""",
            [ids, self.window_rows],
        )
        steps = store.query_df(
            """SELECT run_id, predicted_step_ms, step_cpu_ms, step_gpu_ms FROM (
                 SELECT *, row_number() OVER (PARTITION BY run_id ORDER BY epoch DESC, forward_ct DESC) AS rn
                 FROM steps WHERE run_id IN (SELECT UNNEST(?))) WHERE rn <= ?""",
            [ids, self.window_rows],
        )
        counts = store.query_df(
            """SELECT r.run_id,
                 (SELECT count(*) FROM steps s WHERE s.run_id = r.run_id) AS steps,
                 (SELECT count(*) FROM request_steps q WHERE q.run_id = r.run_id) AS request_steps,
                 (SELECT count(*) FROM requests q WHERE q.run_id = r.run_id) AS requests,
                 (SELECT count(*) FROM rejects q WHERE q.run_id = r.run_id) AS rejects
               FROM runs r WHERE r.run_id IN (SELECT UNNEST(?))""",
            [ids],
        ).set_index("run_id")
        gaps = store.query_df("SELECT run_id, kind, count(*) AS n FROM gaps WHERE run_id IN (SELECT UNNEST(?)) GROUP BY ALL", [ids])
        for run_id, arm, gamma, group in runs.itertuples(index=False):
            mine = rs[rs["run_id"] == run_id]
            m = run_metrics(mine, arm, int(gamma))
            if arm == "compact" and len(mine):
                self._add_hazard(store, m, mine, all_runs, run_id, int(gamma), group)
            m["arm"] = arm
            m["cost"] = cost_metrics(steps[steps["run_id"] == run_id])
            m["counts"] = counts.loc[run_id].to_dict() if run_id in counts.index else {}
            m["gaps"] = {k: int(n) for k, n in gaps[gaps["run_id"] == run_id][["kind", "n"]].itertuples(index=False)}
            res["runs"][run_id] = m
        return res

    def _add_hazard(self, store, m, rows, runs, run_id, gamma, group) -> None:
        truth = runs[(runs["gamma"] == gamma) & runs["arm"].isin(["cap-accept", "static"]) & (runs["run_id"] != run_id)]
        if truth.empty:
            return
        same = truth[truth["audit_group"] == group] if group is not None else truth.iloc[0:0]
        src = (same if len(same) else truth).sort_values("arm").iloc[0]["run_id"]
        try:
            cached = self._truth.get(src)
            if cached is None or time.monotonic() - cached[0] > self.refit_s:
                t = store.query_df(
                    """SELECT * EXCLUDE (rn) FROM (SELECT *, row_number() OVER (ORDER BY epoch DESC, forward_ct DESC) AS rn
                       FROM request_steps WHERE run_id = ? AND ceiling IS NOT NULL) WHERE rn <= ?""", [src, self.window_rows])
                cached = self._truth[src] = (time.monotonic(), t)
            c = hazard_ceiling(cached[1], rows, gamma)
        except Exception as e:  # noqa: BLE001 - the simple quantities still stand
            m.setdefault("notes", []).append(f"hazard estimate unavailable: {type(e).__name__}: {e}")
            return
        m["ceiling"]["hazard"] = c
        m["utilization"]["hazard"] = _util(m["realized"], c["point"], c["lo"], c["hi"])
        m["hazard_truth_run"] = src

    def get(self) -> dict[str, Any]:
        with self._lock:
            if time.monotonic() - self._at >= self.refresh_s or not self._cache:
                try:
                    self._cache = self._compute()
                except Exception as e:  # noqa: BLE001 - serve the last good values
                    self.errors += 1
                    self.last_error = f"{type(e).__name__}: {e}"
                self._at = time.monotonic()
            return self._cache


class _Collector:
    def __init__(self, src: DerivedMetrics):
        self.src = src

    def collect(self) -> Iterable:
        data = self.src.get().get("runs", {})
        L = ["run_id", "arm"]
        realized = GaugeMetricFamily("acceptscope_realized_accept_length", "Mean committed tokens per request-step (window).", labels=L)
        ceiling = GaugeMetricFamily("acceptscope_ceiling_accept_length", "Uncapped accept length (full-gamma verify), point and interval.", labels=L + ["method", "bound"])
        util = GaugeMetricFamily("acceptscope_utilization", "Realized / ceiling accept length, point and interval.", labels=L + ["method", "bound"])
        rate = GaugeMetricFamily("acceptscope_in_window_accept_rate", "sum(correct_drafts)/sum(window) (window).", labels=L)
        ece = GaugeMetricFamily("acceptscope_calibration_ece", "ECE of recorded survival vs uncensored accept label, per draft position (cap-accept).", labels=L + ["position"])
        cost = GaugeMetricFamily("acceptscope_cost_model_error_ms", "Mean |predicted_step_ms - actual| of the SPS planner.", labels=L + ["vs"])
        cost_rel = GaugeMetricFamily("acceptscope_cost_model_error_rel", "Median relative error of predicted_step_ms.", labels=L + ["vs"])
        rows = GaugeMetricFamily("acceptscope_rows", "Rows captured per table.", labels=L + ["table"])
        gaps = GaugeMetricFamily("acceptscope_gaps", "Detected telemetry gaps by kind.", labels=L + ["kind"])
        for run_id, m in data.items():
            lv = [run_id, str(m.get("arm"))]
            if "realized" in m:
                realized.add_metric(lv, m["realized"])
                rate.add_metric(lv, m["in_window_accept_rate"])
                for meth, bounds in m["ceiling"].items():
                    for b, v in bounds.items():
                        ceiling.add_metric(lv + [meth, b], v)
                for meth, bounds in m["utilization"].items():
                    for b, v in bounds.items():
                        util.add_metric(lv + [meth, b], v)
            for k, v in (m.get("ece") or {}).items():
                ece.add_metric(lv + [str(k)], v)
            if "ece_all" in m:
                ece.add_metric(lv + ["all"], m["ece_all"])
            for vs, c in (m.get("cost") or {}).items():
                cost.add_metric(lv + [vs], c["mae_ms"])
                cost_rel.add_metric(lv + [vs], c["median_rel"])
            for t, n in (m.get("counts") or {}).items():
                rows.add_metric(lv + [t], float(n))
            for kind, n in (m.get("gaps") or {}).items():
                gaps.add_metric(lv + [kind], float(n))
        errs = CounterMetricFamily("acceptscope_exporter_errors", "Failed store reads (last good values served).")
        errs.add_metric([], float(self.src.errors))
        yield from (realized, ceiling, util, rate, ece, cost, cost_rel, rows, gaps, errs)


class MetricsExporter:
    """Serve derived metrics on ``http://127.0.0.1:<port>/metrics``."""

    def __init__(self, db: str, port: int, *, host: str = "127.0.0.1", run_ids: Sequence[str] | None = None,
                 window_rows: int = 20_000, refresh_s: float = 2.0):
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the exporter binds to loopback only (got {host!r}); put a proxy in front to publish it")
        self.source = DerivedMetrics(db, run_ids, window_rows=window_rows, refresh_s=refresh_s)
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self.source))
        self.host, self.port = host, port
        self._server = None
        self._thread = None

    def start(self) -> "MetricsExporter":
        self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = self._server.server_address[1]
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> "MetricsExporter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
