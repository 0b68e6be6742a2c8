"""Traffic driver: the same prompts, seeds and sampling to every arm, bounded.

Why: the audit compares arms request by request, so each arm must see the
identical prompt list, per-prompt seed and sampling parameters; ``prompt_index``
pairs them in the ``requests`` table. Requests go through SGLang's native
``/generate`` (``meta_info`` carries the spec_* keys) or the OpenAI-compatible
``/v1/chat/completions`` with ``return_spec_tokens_details`` (``sglext``).

Safety bounds: a hard cap on the number of requests and on wall time, only the
configured base URL is ever contacted (no redirects followed), and
``loopback_only`` refuses any non-loopback target (tests always set it).
Responses are translated by the ingest package's ``parse_responses`` (one
validation path for live and saved responses); bad ones become ``rejects``.
"""

from __future__ import annotations

import ipaddress
import socket
import threading
import time
from concurrent.futures import FIRST_COMPLETED, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Sequence
from urllib.parse import urlparse

# the one prompt loader and its Prompt / WorkloadError (re-exported for the live CLI and tests)
from acceptscope.domain.workloads import WORKLOAD_DIR, Prompt, WorkloadError, load_prompts  # noqa: F401
from acceptscope.ingest.meta_info import parse_responses
from acceptscope.live.http import fetch


class TargetRefused(ValueError):
    """The base URL is not allowed (non-loopback under loopback_only, or not http)."""


def check_target(base_url: str, loopback_only: bool) -> str:
    """Normalise and vet the base URL; refuse non-loopback hosts when ``loopback_only``."""
    u = urlparse(base_url)
    if u.scheme not in ("http", "https") or not u.hostname:
        raise TargetRefused(f"base URL {base_url!r} must be http(s)://host:port")
    if loopback_only:
        try:
            addrs = {ai[4][0] for ai in socket.getaddrinfo(u.hostname, u.port or 80)}
        except socket.gaierror:
            raise TargetRefused(f"cannot resolve {u.hostname!r}") from None
        if not addrs or not all(ipaddress.ip_address(a.split("%")[0]).is_loopback for a in addrs):
            raise TargetRefused(f"{base_url}: non-loopback target refused (loopback_only)")
    return base_url.rstrip("/")


@dataclass
class DriveConfig:
    """What to send and the hard bounds."""

    base_url: str
    run_id: str
    api: str = "generate"  # generate | openai
    concurrency: Sequence[int] = (1,)
    max_new_tokens: int = 128
    temperature: float = 0.0
    top_p: float | None = None
    seed: int = 0
    max_requests: int = 1000
    max_seconds: float = 600.0
    request_timeout_s: float = 300.0
    max_response_bytes: int = 64 << 20  # one response's body, decoded (a gzip bomb is refused at the cap)
    loopback_only: bool = False
    ignore_eos: bool = False
    model: str = "default"
    rid_prefix: str | None = None

    def __post_init__(self) -> None:
        if self.api not in ("generate", "openai"):
            raise ValueError(f"api must be 'generate' or 'openai', got {self.api!r}")
        if not self.concurrency or any(int(c) < 1 for c in self.concurrency):
            raise ValueError(f"concurrency levels must be >= 1, got {list(self.concurrency)}")
        if self.max_requests < 1 or self.max_seconds <= 0:
            raise ValueError("max_requests must be >= 1 and max_seconds > 0")


@dataclass
class DriveResult:
    rows: list[dict] = field(default_factory=list)
    rejects: list[dict] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    sent: int = 0
    stopped_by: str = "done"  # done | max_requests | max_seconds
    wall_s: float = 0.0
    per_level: dict[int, dict] = field(default_factory=dict)

    def summary(self) -> dict:
        return {
            "sent": self.sent,
            "ok": len(self.rows),
            "errors": len(self.errors),
            "stopped_by": self.stopped_by,
            "wall_s": round(self.wall_s, 3),
            "per_level": self.per_level,
        }


class Driver:
    """Send one prompt list at each concurrency level; return ``requests`` rows.

    ``on_rows`` (optional) receives rows as they complete, for streaming into the store.
    """

    def __init__(self, cfg: DriveConfig, on_rows: Callable[[list[dict]], None] | None = None,
                 on_rejects: Callable[[list[dict]], None] | None = None):
        self.cfg = cfg
        self.base_url = check_target(cfg.base_url, cfg.loopback_only)
        self.on_rows = on_rows
        self.on_rejects = on_rejects
        self._stop = threading.Event()
        self._until: float | None = None  # monotonic hard stop of the run: no request outlives --max-seconds

    def stop(self) -> None:
        self._stop.set()

    def _rid(self, level: int, p: Prompt) -> str:
        prefix = self.cfg.rid_prefix or self.cfg.run_id
        return f"{prefix}-c{level}-{p.workload}-{p.prompt_index}"

    def _sampling(self, seed: int) -> dict:
        sp: dict[str, Any] = {"temperature": self.cfg.temperature, "max_new_tokens": self.cfg.max_new_tokens, "sampling_seed": seed}
        if self.cfg.top_p is not None:
            sp["top_p"] = self.cfg.top_p
        if self.cfg.ignore_eos:
            sp["ignore_eos"] = True
        return sp

    def send_one(self, level: int, p: Prompt) -> tuple[list[dict], list[dict]]:
        """One request; returns (requests rows, rejects rows) as translated by the ingest package."""
        cfg = self.cfg
        rid = self._rid(level, p)
        seed = cfg.seed + p.prompt_index
        t0 = time.monotonic()
        if cfg.api == "generate":
            path = "/generate"
            body = {"text": p.text, "sampling_params": self._sampling(seed), "rid": rid, "stream": False}
        else:
            path = "/v1/chat/completions"
            body = {
                "model": cfg.model,
                "messages": [{"role": "user", "content": p.text}],
                "max_tokens": cfg.max_new_tokens,
                "temperature": cfg.temperature,
                "seed": seed,
                "rid": rid,
                "return_spec_tokens_details": True,
                "return_token_ids": True,
            }
            if cfg.top_p is not None:
                body["top_p"] = cfg.top_p
        r = fetch(self.base_url + path, method="POST", json=body, deadline_s=cfg.request_timeout_s,
                  max_bytes=cfg.max_response_bytes, until=self._until)  # raises on HTTP >= 400
        latency = time.monotonic() - t0
        batch = parse_responses(r.content, source=f"{self.base_url}{path}#{rid}", run_id=cfg.run_id, workload=p.workload)
        rows = batch.rows("requests")
        for row in rows:
            row.update(prompt_index=p.prompt_index, seed=seed, temperature=cfg.temperature, latency_s=latency)
            if row.get("output_tokens") is None and cfg.api == "openai":
                choice = ((r.json().get("choices") or [{}])[0]) or {}
                row["output_tokens"] = choice.get("response_token_ids")
        return rows, batch.rows("rejects")

    def run(self, prompts: Iterable[Prompt]) -> DriveResult:
        prompts = list(prompts)
        res = DriveResult()
        t_start = time.monotonic()
        deadline = t_start + self.cfg.max_seconds
        self._until = deadline
        for level in self.cfg.concurrency:
            level = int(level)
            lt0 = time.monotonic()
            n_ok = n_err = 0
            toks = 0
            pool = ThreadPoolExecutor(max_workers=level, thread_name_prefix=f"drive-c{level}")
            try:
                pending = set()
                it = iter(prompts)
                exhausted = False
                while True:
                    while not exhausted and len(pending) < level:
                        if res.sent >= self.cfg.max_requests:
                            res.stopped_by = "max_requests"
                            exhausted = True
                            break
                        if time.monotonic() >= deadline or self._stop.is_set():
                            res.stopped_by = "max_seconds" if not self._stop.is_set() else "stopped"
                            exhausted = True
                            break
                        p = next(it, None)
                        if p is None:
                            exhausted = True
                            break
                        pending.add(pool.submit(self.send_one, level, p))
                        res.sent += 1
                    if not pending:
                        break
                    done, pending = wait(pending, timeout=max(0.05, deadline - time.monotonic()), return_when=FIRST_COMPLETED)
                    if not done and time.monotonic() >= deadline:
                        res.stopped_by = "max_seconds"
                        for f in pending:
                            f.cancel()
                        res.errors.append(f"{len(pending)} request(s) still running at the time cap")
                        break
                    batch, rejects = [], []
                    for f in done:
                        try:
                            rows, rej = f.result()
                        except Exception as e:  # noqa: BLE001 - recorded, run continues
                            n_err += 1
                            res.errors.append(f"{type(e).__name__}: {e}")
                            continue
                        if rej:
                            n_err += 1
                            rejects.extend(rej)
                        n_ok += bool(rows)
                        toks += sum(r.get("completion_tokens") or 0 for r in rows)
                        batch.extend(rows)
                    if batch:
                        res.rows.extend(batch)
                        if self.on_rows:
                            self.on_rows(batch)
                    if rejects:
                        res.rejects.extend(rejects)
                        res.errors.extend(f"{r['source']}:{r['line']}: {r['field']}: {r['reason']}" for r in rejects)
                        if self.on_rejects:
                            self.on_rejects(rejects)
            finally:
                # never wait past the caps for requests still in flight
                pool.shutdown(wait=res.stopped_by == "done", cancel_futures=True)
            wall = time.monotonic() - lt0
            res.per_level[level] = {"ok": n_ok, "errors": n_err, "wall_s": round(wall, 3), "tokens_per_s": round(toks / wall, 2) if wall > 0 else None}
            if res.stopped_by != "done":
                break
        res.wall_s = time.monotonic() - t_start
        return res
