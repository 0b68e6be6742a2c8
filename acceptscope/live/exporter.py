"""Prometheus exporter of acceptscope's figures (loopback only): the estimators' own results, as served.

Why: serving engines export acceptance counters (vLLM) or gauges (SGLang) but no ceiling, utilization,
calibration or cost-model error (reference §6.3). This exporter serves the figures ``acceptscope
estimate --json`` prints, from the same call (:func:`acceptscope.estimators.run_all_runs` with the same
``n_boot``/``seed``, then ``to_jsonable``), so a Grafana panel and ``estimate --json`` agree to the last
digit. It has no estimator of its own.

Scrape cost: the estimate runs in a background thread once per *data version* (the row counts of
the tables a run grows, :meth:`acceptscope.reader.Reader.data_version`); ``/metrics`` formats the last
finished snapshot and never touches the store, so its latency does not grow with the database
(``bench/exporter.py`` measures it over a 10M request-step store).

Names (``docs/prometheus.md`` lists them with their definitions). The counters follow vLLM's
``vllm:spec_decode_*`` family (``vllm/v1/spec_decode/metrics.py``) in our namespace, ``position``
0-based as vLLM's; a draft position trimmed by the planner was never verified, so it is counted as
*unobserved* (``num_verified_per_pos``), never as rejected:

* ``acceptscope_spec_decode_num_drafts_total``: request-steps (blocks) verified;
* ``acceptscope_spec_decode_num_draft_tokens_total``: draft tokens verified (Σ window);
* ``acceptscope_spec_decode_num_accepted_tokens_total``: accepted draft tokens (bonus excluded);
* ``acceptscope_spec_decode_num_accepted_tokens_per_pos_total{position}`` and
  ``acceptscope_spec_decode_num_verified_per_pos_total{position}``;
* ``acceptscope_spec_decode_num_trimmed_tokens_total``: drafted but not verified (gamma − window);
* ``acceptscope_spec_decode_num_drafts_by_window_total{window}``: the window distribution.

Gauges with interval bounds (``bound`` = point | lo | hi; 95% bootstrap intervals of the estimators):
utilization against the estimated ceiling, the ceiling accept length (bonus included), per-position
ECE before/after STS, cost-model error, trim ratio (1 − utilization; TensorRT-LLM's name), and trim
regret (:mod:`acceptscope.estimators.trim_regret`: TensorRT-LLM's rate and the trimmed blocks whose first
trimmed draft would have been accepted, per run and workload). ``acceptscope_run_info`` carries the OpenTelemetry GenAI resource attributes
(``gen_ai.request.model``, ``gen_ai.provider.name``, dots as underscores) for a ``group_left`` join.
"""

from __future__ import annotations

import multiprocessing as mp
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterable, Sequence

from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from acceptscope import glossary
from acceptscope.estimators import run_all_runs, to_jsonable
from acceptscope.ingest.engines import engine_counts_rows
from acceptscope.ingest.engines.identify import COUNTED_ENGINES, engine_figures
from acceptscope.reader import Reader
from acceptscope.store import Store

BOUNDS = (("point", ""), ("lo", "_lo"), ("hi", "_hi"))


@dataclass
class Snapshot:
    """One data version's estimates (``estimate --json``'s dict per run) and window counts."""

    version: tuple = ()
    runs: list = field(default_factory=list)  # dicts: run_id, arm, engine, gamma, target_model
    estimates: dict = field(default_factory=dict)  # run_id -> to_jsonable(results) or {"error": str}
    engines: dict = field(default_factory=dict)  # run_id -> engine_figures() of a vLLM / TensorRT-LLM run
    windows: list = field(default_factory=list)  # (run_id, window, blocks)
    compute_s: float = 0.0
    at: float = 0.0


def compute(db: str, run_ids: Sequence[str] | None = None, *, n_boot: int = 200, seed: int = 0) -> Snapshot:
    """Everything the exporter serves for one data version of ``db`` (what ``estimate --json`` computes)."""
    t0 = time.perf_counter()
    reader = Reader(db)
    version = data_version(reader)
    runs = reader.df("SELECT run_id, arm, engine, gamma, target_model FROM runs ORDER BY run_id")
    if run_ids:
        runs = runs[runs["run_id"].isin(list(run_ids))]
    counted = runs["engine"].isin(COUNTED_ENGINES)
    ids = runs.loc[~counted, "run_id"].tolist()
    snap = Snapshot(version=version, runs=runs.to_dict("records"))
    for rid in runs.loc[counted, "run_id"]:  # another engine's counts: what they identify (no estimator runs)
        try:
            snap.engines[rid] = engine_figures(Store(db, read_only=True), rid)
        except Exception as e:  # noqa: BLE001 - one run's failure is that run's, served as estimate_error
            snap.estimates[rid] = {"error": f"{type(e).__name__}: {e}"}
    if ids:
        res = run_all_runs(Store(db, read_only=True), ids, n_boot=n_boot, seed=seed)
        for rid, r in res.items():  # as the estimate command does (acceptscope/cli/estimate.py)
            snap.estimates[rid] = {"error": f"{type(r).__name__}: {r}"} if isinstance(r, Exception) else to_jsonable(r)
        wd = reader.window_distribution(ids)
        if len(wd):
            wd = wd.groupby(["run_id", "window"], as_index=False)["blocks"].sum()
            snap.windows = [(str(a), int(b), int(c)) for a, b, c in wd[["run_id", "window", "blocks"]].itertuples(index=False)]
    snap.compute_s = time.perf_counter() - t0
    snap.at = time.time()
    return snap


def data_version(reader: Reader) -> tuple:
    """What a write changes: the row counts of the tables a run grows, and of other engines' counts."""
    return (*reader.data_version(), reader.summary(engine_counts_rows))


def _child_main(conn, db: str, run_ids: list, n_boot: int, seed: int) -> None:
    """The estimate of one data version, in a child process; sends (True, snapshot) or (False, error)."""
    try:
        conn.send((True, compute(db, run_ids, n_boot=n_boot, seed=seed)))
    except Exception as e:  # noqa: BLE001 - the parent counts it and keeps the last good snapshot
        conn.send((False, f"{type(e).__name__}: {e}"))
    finally:
        conn.close()


class DerivedMetrics:
    """Keeps the latest :class:`Snapshot`: a background thread recomputes it when the data version changes.

    ``isolate``: estimate in a child process (the default). Why: in-process, the estimate holds the
    interpreter lock for seconds at a time, and /metrics p95 rose from 13 ms to 158 ms while a 10M
    request-step store was re-estimated (bench/exporter.py); the child is stopped with the exporter."""

    def __init__(self, db: str, run_ids: Sequence[str] | None = None, *, refresh_s: float = 2.0,
                 n_boot: int = 200, seed: int = 0, isolate: bool = True):
        self.db, self.run_ids, self.refresh_s, self.n_boot, self.seed = db, list(run_ids or []), refresh_s, n_boot, seed
        self.isolate = isolate
        self._child: Any = None
        self.errors = 0
        self.last_error: str | None = None
        self.seen_version: tuple | None = None  # the version last probed
        self.snapshot = Snapshot()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def refresh(self, force: bool = False) -> bool:
        """Probe the data version; recompute when it changed (or ``force``). True when a new snapshot was made."""
        try:
            v = data_version(Reader(self.db))
            self.seen_version = v
            if v == self.snapshot.version and self.snapshot.at and not force:
                return False
            snap = self._compute_isolated() if self.isolate else compute(self.db, self.run_ids, n_boot=self.n_boot,
                                                                          seed=self.seed)
            if snap is None:  # stopped meanwhile
                return False
        except Exception as e:  # noqa: BLE001 - keep serving the last good snapshot, count the failure
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return False
        with self._lock:
            self.snapshot = snap
        return True

    def _compute_isolated(self) -> Snapshot | None:
        ctx = mp.get_context("spawn")  # (a fork would copy the HTTP server's threads' locks)
        recv, send = ctx.Pipe(duplex=False)
        child = self._child = ctx.Process(target=_child_main, args=(send, self.db, self.run_ids, self.n_boot, self.seed),
                                          name="acceptscope-exporter-estimate", daemon=True)
        child.start()
        send.close()
        try:
            while not recv.poll(0.2):
                if self._stop.is_set():
                    return None
                if not child.is_alive() and not recv.poll(0):
                    raise RuntimeError(f"the estimate process ended with exit code {child.exitcode} and no result")
            ok, payload = recv.recv()
        finally:
            recv.close()
            if self._stop.is_set():
                child.terminate()
            child.join(timeout=5)
            if child.is_alive():
                child.terminate()
                child.join(timeout=5)
        if not ok:
            raise RuntimeError(payload)
        return payload

    @property
    def up_to_date(self) -> bool:
        return bool(self.snapshot.at) and self.snapshot.version == self.seen_version

    def get(self) -> Snapshot:
        with self._lock:
            return self.snapshot

    def start(self) -> None:
        def loop() -> None:
            while not self._stop.is_set():
                self.refresh()
                self._stop.wait(self.refresh_s)

        self._thread = threading.Thread(target=loop, name="acceptscope-exporter-refresh", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)

    def wait_ready(self, timeout_s: float = 600.0) -> bool:
        """Block until a snapshot of the current data version is served (tests, benches)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.up_to_date:
                return True
            time.sleep(0.05)
        return False


def _by_run_row(est: dict) -> dict | None:
    rows = [g for g in (est.get("utilization") or {}).get("by_group") or [] if g.get("by") == "run"]
    return rows[0] if rows else None


def _put(fam, labels: list[str], v: Any) -> None:
    if v is not None:
        fam.add_metric(labels, float(v))


def families(snap: Snapshot) -> list:
    """The metric families of one snapshot (see the module docstring for each name)."""
    R = ["run_id"]
    C = lambda n, h, extra=(): CounterMetricFamily(f"acceptscope_spec_decode_{n}", h, labels=R + list(extra))  # noqa: E731
    G = lambda n, h, extra=(): GaugeMetricFamily(f"acceptscope_{n}", h, labels=R + list(extra))  # noqa: E731
    drafts = C("num_drafts", "Request-steps (draft blocks) verified.")
    draft_tok = C("num_draft_tokens", "Draft tokens verified (sum of windows; trimmed drafts are not counted).")
    acc_tok = C("num_accepted_tokens", "Accepted draft tokens (bonus token excluded).")
    acc_pos = C("num_accepted_tokens_per_pos", "Accepted draft tokens per 0-based draft position.", ["position"])
    ver_pos = C("num_verified_per_pos", "Blocks whose window reached the 0-based draft position (trimmed: unobserved).", ["position"])
    trimmed = C("num_trimmed_tokens", "Drafted tokens the planner did not verify (gamma - window).")
    by_window = C("num_drafts_by_window", "Blocks verified per window (verified draft tokens).", ["window"])
    info = G("run_info", "Run attributes; gen_ai_* are the OpenTelemetry GenAI resource attributes.",
             ["arm", "engine", "gamma", "gen_ai_request_model", "gen_ai_provider_name"])
    realized = G("realized_accept_length", "Mean committed tokens per block (accepted drafts + 1 bonus).")
    ceiling = G("ceiling_accept_length", "Uncapped (full-gamma verify) accept length, bonus included: recorded (a point) "
                "where the run recorded it, else the tail estimate with its interval.", ["bound"])
    util = G("utilization", "Committed / ceiling tokens, 95% bootstrap interval.", ["group_by", "group", "bound"])
    iw_rate = G("in_window_accept_rate", "Accepted / verified draft tokens.")
    sg_rate = G("spec_accept_rate", "Accepted drafts / (gamma x blocks): SGLang's fixed-gamma rate.")
    ece = G("calibration_ece", "ECE (15 equal-width bins) of the confidence head per 0-based position, before/after STS.",
            ["method", "stage", "position", "bound"])
    cost_ms = G("cost_model_error_ms", "SPS cost-model error of the step time (ms).", ["split", "stat"])
    cost_rel = G("cost_model_rel_error", "SPS cost-model relative error of the step time.", ["split", "stat"])
    regret = G("trim_regret_rate", "Trimmed blocks that accepted their whole window / trimmed blocks (TensorRT-LLM's "
               "rate), 95% request-clustered bootstrap interval.", ["group_by", "group", "bound"])
    first_acc = G("trim_regret_first_accepted_rate", "Trimmed blocks whose first trimmed draft would have been accepted "
                  "/ trimmed blocks; hi includes the blocks whose first outcome is unknown.", ["group_by", "group", "bound"])
    trim_ratio = G("trim_ratio", "1 - delivered / ceiling tokens; lo/hi from the utilization interval.", ["bound"])
    trimmed_blocks = C("num_trimmed_drafts", "Blocks whose window the planner trimmed below gamma.")
    lost = G("planner_accepted_drafts_lost", "Drafts the ceiling says would have been accepted, lost to trimming.")
    est_err = G("estimate_error", "1 when the estimators could not estimate this run (see estimate --json).")
    gammas = {}
    for r in snap.runs:
        rid = str(r["run_id"])
        gammas[rid] = int(r["gamma"])
        model = r.get("target_model")
        model = "" if model is None or (isinstance(model, float) and model != model) else str(model)  # NULL: no label value
        info.add_metric([rid, str(r["arm"]), str(r["engine"]), str(r["gamma"]), model, str(r["engine"])], 1.0)
    for rid, est in snap.estimates.items():
        lv = [rid]
        est_err.add_metric(lv, 1.0 if "error" in est else 0.0)
        if "error" in est:
            continue
        run = _by_run_row(est)
        pos = (est.get("utilization") or {}).get("by_position") or []
        if run is not None:
            drafts.add_metric(lv, float(run["n"]))
            _put(iw_rate, lv, run.get("in_window_accept_rate"))
            _put(sg_rate, lv, run.get("spec_accept_rate"))
            if pos:
                verified = sum(int(p["verified"]) for p in pos)
                draft_tok.add_metric(lv, float(verified))
                acc_tok.add_metric(lv, float(sum(int(p["accepted"]) for p in pos)))
                if rid in gammas:
                    trimmed.add_metric(lv, float(gammas[rid] * int(run["n"]) - verified))
        for p in pos:
            acc_pos.add_metric(lv + [str(p["position"])], float(p["accepted"]))
            ver_pos.add_metric(lv + [str(p["position"])], float(p["verified"]))
        for g in (est.get("utilization") or {}).get("by_group") or []:
            for b, suf in BOUNDS:
                _put(util, lv + [str(g["by"]), str(g["group"]), b], g.get("utilization" if not suf else "util" + suf))
        # the glossary's one function per figure: committed tokens per block; the ceiling in tokens per block
        # (the recorded one, a point, where the run recorded it; else the estimate and its model interval)
        _put(realized, lv, glossary.realized_accept_length(est).estimate)
        c = glossary.ceiling_tokens(est)
        for b, v in (("point", c.estimate), ("lo", c.lo), ("hi", c.hi)):
            _put(ceiling, lv + [b], v)
        for m in (est.get("calibration") or {}).get("metrics") or []:
            for b, suf in BOUNDS:
                _put(ece, lv + [str(m["method"]), str(m["stage"]), str(m["position"]), b], m.get("ece" + suf))
        for m in (est.get("calibration") or {}).get("summary") or []:
            _put(ece, lv + [str(m["method"]), str(m["stage"]), "all", "point"], m.get("ece"))
        cost = est.get("cost") or {}
        for split in ("in_sample", "held_out", "baseline"):
            s = cost.get(split) or {}
            _put(cost_ms, lv + [split, "mae"], s.get("mae_ms"))
            _put(cost_ms, lv + [split, "bias"], s.get("bias_ms"))
            _put(cost_rel, lv + [split, "median"], s.get("median_rel_err"))
            _put(cost_rel, lv + [split, "mean"], s.get("mean_rel_err"))
        trim = (est.get("bracket") or {}).get("trim") or {}
        for g in (est.get("trim_regret") or {}).get("by_group") or []:  # estimators.trim_regret
            for b, suf in BOUNDS:
                _put(regret, lv + [str(g["by"]), str(g["group"]), b], g["trim_regret" + (suf or "_rate")])
                _put(first_acc, lv + [str(g["by"]), str(g["group"]), b], g["first_accepted" + (suf or "_rate")])
        _put(trimmed_blocks, lv, trim.get("trimmed_request_steps"))
        if trim.get("trim_ratio") is not None:
            trim_ratio.add_metric(lv + ["point"], float(trim["trim_ratio"]))
            if run is not None and run.get("util_lo") is not None and run.get("util_hi") is not None:
                trim_ratio.add_metric(lv + ["lo"], 1.0 - float(run["util_hi"]))
                trim_ratio.add_metric(lv + ["hi"], 1.0 - float(run["util_lo"]))
        _put(lost, lv, ((est.get("planner") or {}).get("summary") or {}).get("accepted_drafts_lost"))
    for rid, e in snap.engines.items():
        lv = [rid]
        est_err.add_metric(lv, 0.0)
        f = e["figures"]
        drafts.add_metric(lv, float(f["drafts"]))
        draft_tok.add_metric(lv, float(f["draft_tokens"]))
        acc_tok.add_metric(lv, float(f["accepted"]))
        for k, v in enumerate(f["accepted_per_pos"] or []):
            acc_pos.add_metric(lv + [str(k)], float(v))
            if e["engine"] == "vllm" and f["draft_tokens"] == f["drafts"] * e["gamma"]:  # every draft verified in full
                ver_pos.add_metric(lv + [str(k)], float(f["drafts"]))
        _put(realized, lv, f["mean_acceptance_length"])
        _put(iw_rate, lv, f["draft_acceptance_rate"])
        for k, v in enumerate(f.get("binned_ece") or []):
            _put(ece, lv + ["binned-bin-centre", "before", str(k), "point"], v)
    for rid, w, n in snap.windows:
        by_window.add_metric([rid, str(w)], float(n))
    return [drafts, draft_tok, acc_tok, acc_pos, ver_pos, trimmed, by_window, trimmed_blocks, info, realized, ceiling,
            util, iw_rate, sg_rate, ece, cost_ms, cost_rel, regret, first_acc, trim_ratio, lost, est_err]


def health(snap: Snapshot, errors: int, up_to_date: bool) -> list:
    """The exporter's own state, read at every scrape."""
    errs = CounterMetricFamily("acceptscope_exporter_errors", "Failed store reads or estimates (last good snapshot served).")
    errs.add_metric([], float(errors))
    fresh = GaugeMetricFamily("acceptscope_exporter_up_to_date", "1 when the served snapshot is of the data version last seen.")
    fresh.add_metric([], 1.0 if up_to_date else 0.0)
    took = GaugeMetricFamily("acceptscope_exporter_compute_seconds", "Seconds the served snapshot took to compute.")
    took.add_metric([], snap.compute_s)
    return [errs, fresh, took]


class _Collector:
    """Formats the latest snapshot; the families are built once per snapshot, not per scrape."""

    def __init__(self, src: DerivedMetrics):
        self.src = src
        self._built: tuple[Any, list] | None = None

    def collect(self) -> Iterable:
        snap = self.src.get()
        if self._built is None or self._built[0] is not snap:
            self._built = (snap, families(snap))
        yield from self._built[1]
        yield from health(snap, self.src.errors, self.src.up_to_date)


class MetricsExporter:
    """Serve the estimators' figures on ``http://127.0.0.1:<port>/metrics``."""

    def __init__(self, db: str, port: int, *, host: str = "127.0.0.1", run_ids: Sequence[str] | None = None,
                 refresh_s: float = 2.0, n_boot: int = 200, seed: int = 0, isolate: bool = True):
        if host not in ("127.0.0.1", "localhost", "::1"):
            raise ValueError(f"the exporter binds to loopback only (got {host!r}); put a proxy in front to publish it")
        self.source = DerivedMetrics(db, run_ids, refresh_s=refresh_s, n_boot=n_boot, seed=seed, isolate=isolate)
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(self.source))
        self.host, self.port = host, port
        self._server = None
        self._thread = None

    def start(self) -> "MetricsExporter":
        self._server, self._thread = start_http_server(self.port, addr=self.host, registry=self.registry)
        self.port = self._server.server_address[1]
        self.source.start()
        return self

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}/metrics"

    def stop(self) -> None:
        self.source.stop()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._thread.join(timeout=5)
            self._server = None

    def __enter__(self) -> "MetricsExporter":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
