"""Live capture of SGLang arms: launch or attach, drive traffic, poll, tail, stream into the store.

Why one orchestrator: a capture is several concurrent producers (the
``/server_info`` poller, the estimator-JSONL and STS-shard tailers, the
Prometheus scraper, the traffic driver) that must share one bounded path into
one DuckDB file and stop together, with one summary of what was captured and
what was lost (gaps, rejects, restarts). :class:`LiveCapture` runs one arm;
:func:`run_sglang_audit` runs the compact and cap-accept arms on the same
traffic into one database (the function ``acceptscope audit --engine sglang``
calls).

Shard numbering: SGLang restarts STS shard numbers at 0 in a new process and
overwrites the old files, so a shard read in tailer generation ``g`` is stored
as ``shard = g * STS_GENERATION_STRIDE + k``.
"""

from __future__ import annotations

import json
import threading
import time
import uuid
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field, replace
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Sequence


from acceptscope.ingest.estimator_jsonl import parse_estimator_jsonl
from acceptscope.ingest.identity import check_run_id
from acceptscope.ingest.rejects import make_reject
from acceptscope.ingest.server_info import RING_CAPACITY, ServerInfoIngestor, run_row_from_server_info
from acceptscope.ingest.sts_shards import load_shard, parse_sts_shard
from acceptscope.live.driver import DriveConfig, DriveResult, Driver, Prompt, check_target
from acceptscope.live.http import FetchError, fetch
from acceptscope.live.launcher import ServerProcess
from acceptscope.live.poller import ServerInfoPoller
from acceptscope.live.prometheus_scrape import MetricsScraper
from acceptscope.live.sink import StoreSink
from acceptscope.live.tailer import JsonlTailer, StsShardTailer
from acceptscope.store import Store

STS_GENERATION_STRIDE = 100_000


class CaptureError(RuntimeError):
    """The server cannot be captured as asked (wrong mode, no DSpark, unreachable)."""


@dataclass
class CaptureConfig:
    """How to capture one arm of a server that is (already) running at ``base_url``."""

    base_url: str
    arm: str | None = None  # expected verify mode; None = take the server's
    run_id: str | None = None
    audit_group: str | None = None
    poll_interval_s: float = 1.0
    clear: str = "never"  # never | every | threshold
    clear_threshold_records: int = 50_000
    ring_capacity: int | None = None  # None: SGLang's 200_000
    estimator_path: str | None = None
    sts_stem: str | None = None
    tail_interval_s: float = 1.0
    scrape_metrics: bool = True
    metrics_interval_s: float = 5.0
    duration_s: float | None = None  # capture-only mode: how long to watch (with traffic: until it ends)
    loopback_only: bool = False
    sink_max_batches: int = 64
    http_timeout_s: float = 60.0  # total deadline of one request (connect, headers and body)
    max_response_bytes: int = 1 << 30  # larger /server_info bodies are refused (one failed poll each)
    launch: dict | None = None  # the ArmSpec config when we launched the server

    def __post_init__(self) -> None:
        if self.run_id is not None:
            check_run_id(self.run_id)  # (ValueError in one line: the CLI exits 2 before any file is made)


@dataclass
class CaptureSummary:
    run_id: str
    arm: str
    base_url: str
    gamma: int | None
    polls: dict
    sink: dict
    tail: dict
    metrics: dict
    drive: dict | None
    gaps: dict
    rejects: int
    wall_s: float
    warnings: list = field(default_factory=list)

    def as_dict(self) -> dict:
        return asdict(self)


def _new_run_id(arm: str) -> str:
    return f"sglang-{arm}-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%S')}-{uuid.uuid4().hex[:6]}"


class _EstimatorLines:
    """Incremental adapter over the ingest package's whole-file estimator parser.

    ``parse_estimator_jsonl`` numbers lines from 1 within the bytes it is given;
    new lines arrive in chunks, so each chunk is rebuilt contiguously (blank lines
    kept as gaps) and its line numbers are shifted back to file line numbers.
    """

    def __init__(self, run_id: str, source: str, gamma: int | None):
        self.run_id, self.source, self.gamma = run_id, source, gamma

    def feed_lines(self, lines: list[tuple[int, str]]):
        first = lines[0][0]
        buf: list[str] = []
        nxt = first
        for n, text in lines:
            buf.extend([""] * (n - nxt))
            buf.append(text)
            nxt = n + 1
        batch = parse_estimator_jsonl("\n".join(buf).encode(), source=self.source, run_id=self.run_id, gamma=self.gamma)
        shift = first - 1
        if shift:
            for r in batch.tables.get("estimator_rows", []):
                r["source_line"] += shift
            for r in batch.tables.get("rejects", []):
                if r["line"]:
                    r["line"] += shift
        return batch


def _parse_sts_shard(run_id: str, path: Path, shard: int, gamma: int | None):
    return parse_sts_shard(load_shard(path), source=str(path), run_id=run_id, shard=shard, gamma=gamma)


class _Tail:
    """Estimator JSONL + STS shard tailing into the sink, on a background thread."""

    def __init__(self, run_id: str, sink: StoreSink, estimator_path: str | None, sts_stem: str | None, interval_s: float,
                 gamma: int | None = None):
        self.run_id = run_id
        self.gamma = gamma
        self.sink = sink
        self.interval_s = interval_s
        self.est = JsonlTailer(estimator_path) if estimator_path else None
        self.sts = StsShardTailer(sts_stem) if sts_stem else None
        self._est_parsers: dict[int, Any] = {}
        self.stats = {"estimator_lines": 0, "estimator_rows": 0, "estimator_generations": 0, "sts_shards": 0,
                      "sts_rows": 0, "events": [], "errors": []}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._events_seen = 0
        self._sts_events_seen = 0
        self._sts_tries: dict[tuple[int, int], int] = {}

    def poll(self, final: bool = False) -> None:
        if self.est is not None:
            lines = self.est.poll()
            for ev in self.est.events[self._events_seen:]:
                self.stats["events"].append(f"{ev.kind}: {ev.path}: {ev.detail}")
                self.sink.put({"gaps": [{
                    "run_id": self.run_id, "rank": 0, "epoch": self.est.generation,
                    "from_forward_ct": 0, "to_forward_ct": 0, "kind": "restart",
                    "detail": f"estimator JSONL {ev.kind} ({ev.detail}); file restarted with the server",
                }]})
            self._events_seen = len(self.est.events)
            if lines:
                gen = self.est.generation
                parser = self._est_parsers.get(gen)
                if parser is None:
                    parser = self._est_parsers[gen] = _EstimatorLines(
                        self.run_id, str(self.est.path) + (f"#gen{gen}" if gen else ""), self.gamma)
                    self.stats["estimator_generations"] = len(self._est_parsers)
                batch = parser.feed_lines(lines)
                self.stats["estimator_lines"] += len(lines)
                self.stats["estimator_rows"] += batch.n("estimator_rows")
                self.sink.put(dict(batch.tables))
        if self.sts is not None:
            for k, gen, path in self.sts.poll(settle=not final):
                try:
                    batch = _parse_sts_shard(self.run_id, path, gen * STS_GENERATION_STRIDE + k, self.gamma)
                except Exception as e:  # noqa: BLE001 - torch.load of a half-written file: retry, then reject
                    tries = self._sts_tries[(gen, k)] = self._sts_tries.get((gen, k), 0) + 1
                    if tries < 3:
                        continue
                    self.sink.put({"rejects": [make_reject(str(path), 0, "$", f"unreadable STS shard: {e}", None, self.run_id)]})
                    self.sts.mark_done(k)
                    self.stats["errors"].append(f"{path}: {e}")
                    continue
                self.sts.mark_done(k)
                self.stats["sts_shards"] += 1
                self.stats["sts_rows"] += batch.n("sts_samples")
                self.sink.put(dict(batch.tables))
            for ev in self.sts.events[self._sts_events_seen:]:
                self.stats["events"].append(f"{ev.kind}: {ev.path}: {ev.detail}")
            self._sts_events_seen = len(self.sts.events)

    def start(self) -> "_Tail":
        def loop():
            while not self._stop.is_set():
                try:
                    self.poll()
                except Exception as e:  # noqa: BLE001 - reported in the summary
                    self.stats["errors"].append(f"{type(e).__name__}: {e}")
                self._stop.wait(self.interval_s)

        self._thread = threading.Thread(target=loop, name="live-tail", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=30)
        try:
            self.poll(final=True)  # pick up what was flushed last
        except Exception as e:  # noqa: BLE001
            self.stats["errors"].append(f"{type(e).__name__}: {e}")


def fetch_server_info(base_url: str, timeout_s: float = 60.0, *, max_bytes: int = 1 << 30,
                      until: float | None = None) -> dict:
    try:
        info = fetch(base_url.rstrip("/") + "/server_info", deadline_s=timeout_s, max_bytes=max_bytes,
                     until=until).json()
    except (FetchError, ValueError, RecursionError) as e:
        raise CaptureError(f"{base_url}/server_info: {type(e).__name__}: {e}") from None
    if not isinstance(info, dict):
        raise CaptureError(f"{base_url}/server_info: expected a JSON object, got {type(info).__name__}")
    return info


def describe_server(info: dict) -> dict:
    """Mode, gamma, ranks and components of a DSpark server from its /server_info."""
    states = info.get("internal_states") or []
    dumps = [s.get("dspark_info_record") for s in states if isinstance(s, dict) and s.get("dspark_info_record")]
    vndt = info.get("speculative_num_draft_tokens")
    gamma = dumps[0].get("gamma") if dumps else (vndt - 1 if isinstance(vndt, int) else None)
    return {
        "algorithm": info.get("speculative_algorithm"),
        "mode": dumps[0].get("mode") if dumps else None,
        "gamma": gamma,
        "ranks": len(states),
        "components": dumps[0].get("components") if dumps else [],
        "has_dump": bool(dumps),
        "startup_time": info.get("startup_time"),
        "version": info.get("version"),
    }


class LiveCapture:
    """Capture one arm of a running server into a store (shared sink allowed)."""

    def __init__(self, store: Store, cfg: CaptureConfig, *, sink: StoreSink | None = None):
        self.store = store
        self.cfg = cfg
        self.base_url = check_target(cfg.base_url, cfg.loopback_only)
        self._own_sink = sink is None
        self.sink = sink or StoreSink(store, max_batches=cfg.sink_max_batches)
        self.run_id = cfg.run_id
        self.poller: ServerInfoPoller | None = None
        self.tail: _Tail | None = None
        self.scraper: MetricsScraper | None = None
        self.server: dict = {}
        self.warnings: list[str] = []
        self.drive_result: DriveResult | None = None
        self._t0 = 0.0
        self.until: float | None = None

    def start(self) -> "LiveCapture":
        cfg = self.cfg
        self._t0 = time.monotonic()
        # --duration is a hard stop: no request, poll or scrape runs past it (plus a short grace for the last poll)
        self.until = None if not cfg.duration_s else self._t0 + cfg.duration_s + min(5.0, 0.25 * cfg.duration_s)
        info = fetch_server_info(self.base_url, cfg.http_timeout_s, max_bytes=cfg.max_response_bytes,
                                 until=self.until)
        self.server = describe_server(info)
        if self.server["algorithm"] != "DSPARK":
            raise CaptureError(f"{self.base_url}: speculative_algorithm is {self.server['algorithm']!r}, not 'DSPARK'")
        if not self.server["has_dump"]:
            raise CaptureError(
                f"{self.base_url}: no dspark_info_record in /server_info; launch with SGLANG_DSPARK_DEBUG_DUMP="
                "core,reqs,step_cpu_time (the info dump is off by default)"
            )
        mode = self.server["mode"]
        if cfg.arm and mode != cfg.arm:
            raise CaptureError(f"{self.base_url}: server runs SGLANG_RAGGED_VERIFY_MODE={mode!r} but arm {cfg.arm!r} was asked")
        if "reqs" not in (self.server["components"] or []):
            self.warnings.append("info dump lacks the 'reqs' component: no request_steps rows")
        self.run_id = self.run_id or _new_run_id(mode)
        run_row = run_row_from_server_info(self.run_id, info, source="live", audit_group=cfg.audit_group)
        config = json.loads(run_row["config_json"])
        config["capture"] = {k: v for k, v in asdict(cfg).items() if k != "launch"}
        if cfg.launch:
            config["launch"] = cfg.launch
        run_row["config_json"] = json.dumps(config, sort_keys=True, default=str)
        self.sink.put({"runs": [run_row]})
        ingestor = ServerInfoIngestor(self.run_id, "live", ring_capacity=cfg.ring_capacity or RING_CAPACITY,
                                      expected_gamma=self.server["gamma"], expected_arm=mode)
        self.poller = ServerInfoPoller(
            self.base_url, self.run_id, self.sink.put, interval_s=cfg.poll_interval_s, clear=cfg.clear,
            clear_threshold_records=cfg.clear_threshold_records, timeout_s=cfg.http_timeout_s, ingestor=ingestor,
            drop_tables=("runs",), max_bytes=cfg.max_response_bytes, until=self.until,
        ).start()
        if cfg.estimator_path or cfg.sts_stem:
            self.tail = _Tail(self.run_id, self.sink, cfg.estimator_path, cfg.sts_stem, cfg.tail_interval_s,
                              gamma=self.server["gamma"]).start()
        if cfg.scrape_metrics:
            self.scraper = MetricsScraper(self.base_url, until=self.until).start(cfg.metrics_interval_s)
        return self

    def drive(self, prompts: Sequence[Prompt], drive: DriveConfig) -> DriveResult:
        """Send traffic (same prompts/seeds for every arm); request rows stream into the sink."""
        self.until = None  # with traffic the capture lasts as long as the traffic: no duration stop
        for part in (self.poller, self.scraper):
            if part is not None:
                part.until = None
        drive = replace(drive, run_id=self.run_id, base_url=self.base_url,  # rows belong to this capture's run
                        loopback_only=drive.loopback_only or self.cfg.loopback_only)
        self.drive_result = Driver(drive, on_rows=lambda rows: self.sink.put({"requests": rows}),
                                   on_rejects=lambda rows: self.sink.put({"rejects": rows})).run(prompts)
        return self.drive_result

    def wait(self) -> None:
        """Block until the configured duration has passed (attach without traffic)."""
        if self.cfg.duration_s:
            remaining = self._t0 + self.cfg.duration_s - time.monotonic()
            if remaining > 0:
                time.sleep(remaining)

    def stop(self) -> CaptureSummary:
        if self.scraper is not None:
            self.scraper.scrape()
            self.scraper.stop()
        if self.poller is not None:
            self.poller.stop(final_poll=True)
        if self.tail is not None:
            self.tail.stop()
        if self._own_sink:
            self.sink.close()
        else:
            self.sink.flush()
        if self.run_id:
            try:
                self.store.mark_complete(self.run_id)
            except Exception as e:  # noqa: BLE001 - the capture is stored; only the mark is missing
                self.warnings.append(f"run not marked complete: {type(e).__name__}: {e}")
        ps = self.poller.stats if self.poller else None
        if ps and ps.last_error:
            self.warnings.append(f"poller: {ps.last_error}")
        metrics = {}
        if self.scraper is not None:
            metrics = {
                "scrapes": self.scraper.scrapes,
                "errors": self.scraper.errors,
                "latest": {f"{s.name}{dict(s.labels)}": s.value for s in self.scraper.latest().values()},
            }
        return CaptureSummary(
            run_id=self.run_id or "",
            arm=self.server.get("mode") or "",
            base_url=self.base_url,
            gamma=self.server.get("gamma"),
            polls=ps.as_dict() if ps else {},
            sink=self.sink.stats() | {"shared_with_other_arms": not self._own_sink},
            tail=self.tail.stats if self.tail else {},
            metrics=metrics,
            drive=self.drive_result.summary() if self.drive_result else None,
            gaps=dict(ps.gaps) if ps else {},
            rejects=ps.rejects if ps else 0,
            wall_s=round(time.monotonic() - self._t0, 3),
            warnings=list(self.warnings),
        )

    def __enter__(self) -> "LiveCapture":
        return self.start()

    def __exit__(self, *exc) -> None:
        if self.poller is not None and not self.poller._stop.is_set():
            self.stop()


def capture(
    store: Store,
    cfg: CaptureConfig,
    prompts: Sequence[Prompt] | None = None,
    drive: DriveConfig | None = None,
    *,
    sink: StoreSink | None = None,
) -> CaptureSummary:
    """Attach, optionally drive traffic, poll/tail until done, and return the summary."""
    cap = LiveCapture(store, cfg, sink=sink).start()
    try:
        if prompts is not None and drive is not None:
            cap.drive(prompts, drive)
        else:
            cap.wait()
    finally:
        summary = cap.stop()
    return summary


# ---------------------------------------------------------------------------
# the two-arm audit
# ---------------------------------------------------------------------------
@dataclass
class AuditResult:
    audit_group: str
    db: str
    arms: dict[str, CaptureSummary]
    servers: dict[str, dict] = field(default_factory=dict)

    @property
    def run_ids(self) -> dict[str, str]:
        return {arm: s.run_id for arm, s in self.arms.items()}

    def as_dict(self) -> dict:
        return {"audit_group": self.audit_group, "db": self.db, "run_ids": self.run_ids,
                "arms": {a: s.as_dict() for a, s in self.arms.items()}, "servers": self.servers}


def run_sglang_audit(
    db: str | Path,
    prompts: Sequence[Prompt],
    *,
    urls: dict[str, str] | None = None,
    specs: Sequence[Any] | None = None,
    drive: DriveConfig | None = None,
    log_dir: str | Path = "acceptscope-logs",
    entry: Sequence[str] | None = None,
    ready_timeout_s: float = 900.0,
    sequential: bool | None = None,
    audit_group: str | None = None,
    capture_defaults: dict | None = None,
    side_files: dict[str, dict] | None = None,
    arm_prompts: dict[str, Sequence[Prompt]] | None = None,
) -> AuditResult:
    """Run compact and cap-accept on the same traffic into one DuckDB.

    Either ``urls`` (``{"compact": URL, "cap-accept": URL}``: attach to running
    servers) or ``specs`` (``launcher.ArmSpec`` pairs, e.g. from
    ``launcher.audit_arms``: launch them; ``entry`` replaces
    ``python -m sglang.launch_server``, for tests). Launched arms run one after
    the other by default (one GPU set); attached arms run in parallel.
    The estimator JSONL / STS stem of a launched arm are tailed automatically;
    for attached arms pass ``side_files={"cap-accept": {"estimator_path": ...,
    "sts_stem": ...}}`` (paths readable from this machine). ``capture_defaults``
    are extra :class:`CaptureConfig` fields for every arm (poll interval, clear
    policy, ...). ``arm_prompts`` overrides the prompt list of some arms (an
    audit sample: a subset of the same prompts, same indices and seeds).
    """
    if (urls is None) == (specs is None):
        raise ValueError("give exactly one of urls= (attach) or specs= (launch)")
    store = Store(db)
    group = audit_group or f"audit-{uuid.uuid4().hex[:10]}"
    base_drive = drive or DriveConfig(base_url="http://127.0.0.1", run_id="")
    defaults = dict(capture_defaults or {})
    result = AuditResult(audit_group=group, db=str(db), arms={})
    sink = StoreSink(store, max_batches=defaults.pop("sink_max_batches", 64))

    def one(arm: str, url: str, launch: dict | None, est: str | None, sts: str | None) -> CaptureSummary:
        files = (side_files or {}).get(arm, {})
        cfg = CaptureConfig(base_url=url, arm=arm, audit_group=group, launch=launch, run_id=f"{group}-{arm}",
                            estimator_path=est or files.get("estimator_path"),
                            sts_stem=sts or files.get("sts_stem"), **defaults)
        d = DriveConfig(**{**asdict(base_drive), "base_url": url, "run_id": ""})
        return capture(store, cfg, (arm_prompts or {}).get(arm, prompts), d, sink=sink)

    try:
        if urls is not None:
            par = True if sequential is None else not sequential
            items = list(urls.items())
            if par and len(items) > 1:
                out: dict[str, Any] = {}

                def worker(a, u):
                    try:
                        out[a] = one(a, u, None, None, None)
                    except BaseException as e:  # noqa: BLE001 - re-raised below
                        out[a] = e

                ts = [threading.Thread(target=worker, args=it) for it in items]
                for t in ts:
                    t.start()
                for t in ts:
                    t.join()
                for a, _ in items:
                    if isinstance(out[a], BaseException):
                        raise out[a]
                    result.arms[a] = out[a]
            else:
                for a, u in items:
                    result.arms[a] = one(a, u, None, None, None)
        else:
            procs = [ServerProcess(s, log_dir, entry=entry) for s in specs]
            if sequential is False:
                with ExitStack() as stack:
                    for p in procs:
                        stack.enter_context(p)
                    for p in procs:
                        result.servers[p.spec.arm] = {"url": p.base_url, "warnings": p.warnings, "log": str(p.stderr_path)}
                        p.wait_ready(ready_timeout_s)
                    for p in procs:
                        result.arms[p.spec.arm] = one(p.spec.arm, p.base_url, p.spec.to_config(), p.spec.estimator_path, p.spec.sts_collect_stem)
            else:
                for p in procs:
                    with p:
                        result.servers[p.spec.arm] = {"url": p.base_url, "warnings": p.warnings, "log": str(p.stderr_path)}
                        p.wait_ready(ready_timeout_s)
                        result.arms[p.spec.arm] = one(p.spec.arm, p.base_url, p.spec.to_config(), p.spec.estimator_path, p.spec.sts_collect_stem)
    finally:
        sink.close()
    return result
