"""Poll a live SGLang server's ``/server_info`` info dump into the store.

Why this shape: SGLang keeps DSpark decode-step records only in an in-memory
ring per DP rank (``deque(maxlen=200_000)``), exported whole on every
``GET /server_info`` with no cursor and no rank id (reference §2.2). So:

* every poll hands the full payload to the ingest package's
  ``ServerInfoIngestor`` (owned by the ingest helper), which keeps per-rank
  ``forward_ct`` watermarks, dedupes, fingerprints the arrival-ordered rank
  slots, detects overflow/restart and emits ``gaps`` and ``rejects`` rows;
* the poller may clear the ring (``POST /set_internal_state
  {"server_args": {"dspark_clear_info_records": true}}``) *immediately after*
  a GET, which bounds the payload size; records appended between that GET and
  the clear are lost: on the next poll the ingestor no longer finds its
  watermark record and the ring starts past ``watermark + 1``, so it records a
  ``clear-loss`` gap for that rank (a jump may also be prefill passes:
  "possible" loss, never invented rows);
* rows go to a bounded sink (backpressure: the poll loop waits when the
  writer is behind), so memory stays bounded whatever the server produces;
* a server that stops answering is counted (``down_polls``); when it answers
  again with another ``startup_time`` the ingestor sees the restart;
* the server behind the URL is pinned by its launch fields at the first good poll
  (:mod:`acceptscope.ingest.identity`): a poll from a server with other launch fields (a swap, two
  servers alternating behind one address) is refused with one reject row, never ingested as a
  restart of this run, and its ring is never cleared (``identity_changes``);
* every request has a total deadline (``timeout_s``, and never past ``until``: the
  capture's hard stop) and a body-size cap (``max_bytes``) through
  :func:`acceptscope.live.http.fetch`: a server that trickles a body or headers, or
  sends gigabytes, costs one failed poll, counted and named in ``last_error``.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

import msgspec

from acceptscope.ingest.identity import ServerIdentity, identity_from_bytes
from acceptscope.ingest.rejects import make_reject
from acceptscope.ingest.server_info import ServerInfoIngestor
from acceptscope.live.http import DEFAULT_MAX_BYTES, DeadlineExceeded, FetchError, Redirected, ResponseTooLarge, fetch

CLEAR_BODY = {"server_args": {"dspark_clear_info_records": True}}


class _DumpShape(msgspec.Struct):
    records: Optional[list[msgspec.Raw]] = None


class _StateShape(msgspec.Struct):
    dspark_info_record: Optional[_DumpShape] = None


class _TopShape(msgspec.Struct):
    internal_states: Optional[list[_StateShape]] = None


_shape = msgspec.json.Decoder(_TopShape)


def ring_sizes(body: bytes) -> list[int] | None:
    """Records per DP rank in a /server_info body, without decoding the records (None: not that shape)."""
    try:
        top = _shape.decode(body)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    if top.internal_states is None:
        return None
    return [len(st.dspark_info_record.records or []) if st.dspark_info_record else 0 for st in top.internal_states]


@dataclass
class PollStats:
    polls: int = 0
    errors: int = 0
    down_polls: int = 0
    clears: int = 0
    clear_failures: int = 0
    payload_bytes: int = 0
    max_payload_bytes: int = 0
    records_in_payload: int = 0
    rows: dict = field(default_factory=dict)
    gaps: dict = field(default_factory=dict)
    rejects: int = 0
    last_latency_s: float = 0.0
    last_error: str | None = None
    ranks_seen: int = 0
    last_clear_poll: int | None = None
    identity_changes: int = 0

    def as_dict(self) -> dict:
        return dict(self.__dict__)


class ServerInfoPoller:
    """Poll loop for one server; feeds an ingestor and a sink (``sink(tables)``)."""

    def __init__(
        self,
        base_url: str,
        run_id: str,
        sink: Callable[[dict[str, Any]], None],
        *,
        interval_s: float = 1.0,
        clear: str = "never",  # never | every | threshold
        clear_threshold_records: int = 50_000,
        timeout_s: float = 60.0,
        ingestor: Any = None,
        max_polls: int | None = None,
        drop_tables: tuple[str, ...] = (),
        max_bytes: int = DEFAULT_MAX_BYTES,
        until: float | None = None,
    ):
        if clear not in ("never", "every", "threshold"):
            raise ValueError(f"clear must be never|every|threshold, got {clear!r}")
        self.base_url = base_url.rstrip("/")
        self.url = self.base_url + "/server_info"
        self.run_id = run_id
        self.sink = sink
        self.interval_s = interval_s
        self.clear = clear
        self.clear_threshold_records = clear_threshold_records
        self.timeout_s = timeout_s
        self.max_polls = max_polls
        self.drop_tables = frozenset(drop_tables)
        self.max_bytes = max_bytes
        self.until = until  # monotonic hard stop: no request runs past it
        self.ingestor = ingestor if ingestor is not None else ServerInfoIngestor(run_id, self.url)
        self.stats = PollStats()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._observers: list[Callable[[Any], None]] = []
        self.identity: Optional[ServerIdentity] = None  # the server this run captures (first good poll)

    def observe(self, fn: Callable[[Any], None]) -> None:
        """Call ``fn(batch)`` after every ingested poll (session uses it for run metadata)."""
        self._observers.append(fn)

    # -- one poll -------------------------------------------------------------
    def poll_once(self) -> Any:
        """GET, ingest, optionally clear, hand rows to the sink. Returns the IngestBatch (or None if down)."""
        poll_no = self.stats.polls + self.stats.down_polls + 1
        t0 = time.monotonic()
        try:
            body = fetch(self.url, deadline_s=self.timeout_s, max_bytes=self.max_bytes, until=self.until).content
        except FetchError as e:
            self.stats.down_polls += 1
            self.stats.last_error = f"{type(e).__name__}: {e}"
            if isinstance(e, (ResponseTooLarge, Redirected, DeadlineExceeded)):  # the server answered, badly
                self.stats.rejects += 1
                self.sink({"rejects": [make_reject(self.url, poll_no, "$", f"poll refused: {type(e).__name__}: {e}",
                                                   None, self.run_id)]})
            return None
        self.stats.last_latency_s = time.monotonic() - t0
        self.stats.polls += 1
        self.stats.payload_bytes += len(body)
        self.stats.max_payload_bytes = max(self.stats.max_payload_bytes, len(body))
        refused = self._identity_refusal(body)
        if refused is not None:  # another server answers at this address: not this run's records
            self.stats.identity_changes += 1
            self.stats.rejects += 1
            self.stats.last_error = refused
            self.sink({"rejects": [make_reject(self.url, poll_no, "$", refused, None, self.run_id)]})
            return None
        sizes = ring_sizes(body)  # cheap: records stay undecoded
        n_records = max(sizes) if sizes else 0
        if sizes is not None:
            self.stats.ranks_seen = max(self.stats.ranks_seen, len(sizes))
            self.stats.records_in_payload = n_records
        # Clear right after the GET (before parsing) to keep the loss window short.
        cleared = False
        if self.clear == "every" or (self.clear == "threshold" and n_records >= self.clear_threshold_records):
            cleared = self._clear()
        # typed fast path of the ingest package (decodes only records past the watermarks)
        batch = self.ingestor.feed_bytes(body, source=self.url, line=poll_no)
        tables = {k: v for k, v in batch.tables.items() if k not in self.drop_tables}
        if cleared:
            self.stats.last_clear_poll = poll_no
        for name, rows in tables.items():
            if rows is not None and len(rows):
                self.stats.rows[name] = self.stats.rows.get(name, 0) + len(rows)
        for g in tables.get("gaps") or []:
            self.stats.gaps[g["kind"]] = self.stats.gaps.get(g["kind"], 0) + 1
        self.stats.rejects += len(tables.get("rejects") or [])
        self.sink(tables)
        for fn in self._observers:
            fn(batch)
        return batch

    def _identity_refusal(self, body: bytes) -> Optional[str]:
        """Why this poll is another server's (None: it is this run's server, or carries no launch fields)."""
        ident = identity_from_bytes(body)  # (the records are skipped, not decoded)
        if ident is None or not ident.args:
            return None  # unreadable or bare: the ingestor rejects what it cannot read, by field
        if self.identity is None:
            self.identity = ident
            return None
        old = self.identity
        if ident.server_key == old.server_key and (ident.mode is None or old.mode is None or ident.mode == old.mode):
            return None
        diff = [f"{k} {old.fields.get(k)!r} -> {ident.fields.get(k)!r}"
                for k in sorted(set(old.fields) | set(ident.fields)) if old.fields.get(k) != ident.fields.get(k)]
        if ident.mode != old.mode:
            diff.append(f"mode {old.mode!r} -> {ident.mode!r}")
        what = "; ".join(diff[:4]) + (f"; +{len(diff) - 4} more" if len(diff) > 4 else "")
        return (f"server identity changed behind {self.base_url} ({what[:300]}): poll refused, not stored as a restart "
                "of this run (capture that server with its own attach)")

    def _clear(self) -> bool:
        try:
            out = fetch(self.base_url + "/set_internal_state", method="POST", json=CLEAR_BODY,
                        deadline_s=self.timeout_s, max_bytes=1 << 20, until=self.until).json()
        except (FetchError, ValueError) as e:
            self.stats.clear_failures += 1
            self.stats.last_error = f"clear failed: {type(e).__name__}: {e}"
            return False
        ok = all(bool(x.get("updated")) if isinstance(x, dict) else bool(x) for x in (out if isinstance(out, list) else [out]))
        if ok:
            self.stats.clears += 1
        else:
            self.stats.clear_failures += 1
            self.stats.last_error = f"clear rejected by server: {out}"
        return ok

    # -- loop -------------------------------------------------------------
    def run(self, deadline: float | None = None) -> None:
        while not self._stop.is_set():
            t0 = time.monotonic()
            try:
                self.poll_once()
            except Exception as e:  # noqa: BLE001 - keep polling; the error is reported
                self.stats.errors += 1
                self.stats.last_error = f"{type(e).__name__}: {e}"
                if self.stats.errors > 20 and self.stats.errors > self.stats.polls:
                    raise
            if self.max_polls is not None and self.stats.polls >= self.max_polls:
                break
            if deadline is not None and time.monotonic() >= deadline:
                break
            if self.until is not None and time.monotonic() >= self.until:
                break
            self._stop.wait(max(0.0, self.interval_s - (time.monotonic() - t0)))

    def start(self, deadline: float | None = None) -> "ServerInfoPoller":
        self._thread = threading.Thread(target=self._run_safe, args=(deadline,), name="server-info-poll", daemon=True)
        self._thread.start()
        return self

    def _run_safe(self, deadline):
        try:
            self.run(deadline)
        except Exception as e:  # noqa: BLE001
            self.stats.last_error = f"poller stopped: {type(e).__name__}: {e}"

    def stop(self, final_poll: bool = True) -> None:
        """Stop the loop; by default take one last poll so the tail of the ring is captured."""
        self._stop.set()
        if self._thread is not None:
            wait = self.timeout_s + 5
            if self.until is not None:
                wait = min(wait, max(self.until - time.monotonic(), 0.0) + 2.0)
            self._thread.join(timeout=wait)
        if final_poll and (self.until is None or time.monotonic() < self.until):
            try:
                self.poll_once()
            except Exception as e:  # noqa: BLE001
                self.stats.errors += 1
                self.stats.last_error = f"final poll: {type(e).__name__}: {e}"
