"""Scrape SGLang's Prometheus ``/metrics`` (``sglang:spec_*``) during a live run.

Why: SGLang's gauges (``spec_accept_length``, ``spec_cap_length``,
``spec_block_accept_length`` ...) are interval means the server computes every
``decode_log_interval``; keeping a few of them next to acceptscope's own
estimates lets the exporter and the report put both side by side. The scrape
history stays in memory (a bounded deque): it is a convenience view, not
telemetry of record, so no schema table is added for it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families

from acceptscope.live.http import FetchError, fetch

SPEC_PREFIX = "sglang:spec_"


@dataclass(frozen=True)
class Sample:
    t: float  # unix seconds of the scrape
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str, default: str | None = None) -> str | None:
        return dict(self.labels).get(key, default)


def parse_metrics(text: str, prefix: str = SPEC_PREFIX, t: float | None = None) -> list[Sample]:
    """Samples whose name starts with ``prefix`` from a Prometheus text exposition."""
    t = time.time() if t is None else t
    out = []
    for fam in text_string_to_metric_families(text):
        for s in fam.samples:
            if s.name.startswith(prefix) and not s.name.endswith("_created"):
                out.append(Sample(t, s.name, tuple(sorted(s.labels.items())), float(s.value)))
    return out


class MetricsScraper:
    """Scrape ``base_url/metrics`` on demand or on a background interval; keep a bounded history."""

    def __init__(self, base_url: str, *, history: int = 10_000, timeout_s: float = 5.0, prefix: str = SPEC_PREFIX,
                 until: float | None = None):
        self.url = base_url.rstrip("/") + "/metrics"
        self.prefix = prefix
        self.timeout_s = timeout_s
        self.history: deque[Sample] = deque(maxlen=history)
        self.errors = 0
        self.scrapes = 0
        self.last_error: str | None = None
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.until = until  # monotonic hard stop: no scrape runs past it

    def scrape(self) -> list[Sample]:
        try:
            r = fetch(self.url, deadline_s=self.timeout_s, max_bytes=64 << 20, until=self.until)
            samples = parse_metrics(r.text, self.prefix)
        except (FetchError, ValueError) as e:
            self.errors += 1
            self.last_error = f"{type(e).__name__}: {e}"
            return []
        with self._lock:
            self.history.extend(samples)
            self.scrapes += 1
        return samples

    def latest(self) -> dict[tuple[str, tuple], Sample]:
        """Most recent sample per (name, labels)."""
        with self._lock:
            out: dict[tuple[str, tuple], Sample] = {}
            for s in self.history:
                out[(s.name, s.labels)] = s
            return out

    def start(self, interval_s: float = 5.0) -> "MetricsScraper":
        def loop():
            while not self._stop.is_set():
                self.scrape()
                self._stop.wait(interval_s)

        self._thread = threading.Thread(target=loop, name="metrics-scrape", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        if self._thread:
            self._thread.join(timeout=5)
