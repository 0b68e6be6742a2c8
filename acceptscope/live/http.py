"""The one HTTP client of acceptscope: every request (polls, ``/generate``, the OpenAI API, readiness,
SPS profiling, metrics scrapes) has a total deadline, a body cap and a decompressed-size cap.

Why not ``requests``: its ``timeout`` bounds each socket read, not the request, so a server that
trickles a body (or headers) forever holds the caller forever (and interpreter exit waited on the
worker thread blocked in ``r.content`` after ``--max-seconds``); ``r.content`` reads a body of any
size whole, and decompresses it whole (a 1 MB gzip body expanding to 1 GB peaked at 3.3 GB).
:func:`fetch` runs one request over :mod:`http.client` with a watchdog that shuts the socket down at
the deadline (so a read blocked in the header phase ends too: no thread outlives the deadline or
``until``), reads the body in pieces against ``max_bytes`` (a declared ``Content-Length`` above it is
refused before reading), decompresses a gzip/deflate body (it asks for none; a server may send one
anyway) a piece at a time against the same cap, and never follows a redirect. Every error is a
:class:`FetchError`.
"""

from __future__ import annotations

import http.client
import json as _json
import socket
import threading
import time
import zlib
from dataclasses import dataclass
from typing import Any, Optional
from urllib.parse import urlsplit

DEFAULT_MAX_BYTES = 1 << 30  # 1 GiB: a full 200k-record ring of 8 DP ranks is ~1 GB of JSON
_CHUNK = 1 << 20


class FetchError(Exception):
    """The request did not produce a usable response."""


class FetchConnectionError(FetchError, ConnectionError):
    """The server could not be reached (refused, unknown host)."""


class DeadlineExceeded(FetchError, TimeoutError):
    """The whole request (connect, headers, body) took longer than its deadline."""


class ResponseTooLarge(FetchError):
    """The body is (or declares itself) larger than the cap."""


class Redirected(FetchError):
    """The server answered with a redirect; it is reported, not followed."""


class HTTPStatusError(FetchError):
    """An HTTP status >= 400."""


class _Body:
    """A response body read against a cap on its decoded size (gzip / deflate decoded a piece at a time)."""

    def __init__(self, what: str, encoding: str, max_bytes: int):
        self.what, self.max_bytes, self.n = what, max_bytes, 0
        enc = (encoding or "identity").strip().lower()
        if enc in ("identity", ""):
            self.dec = None
        elif enc in ("gzip", "x-gzip", "deflate"):
            self.dec = zlib.decompressobj(47)  # gzip or zlib header, detected
        else:
            raise FetchError(f"{what}: Content-Encoding {encoding!r} is not supported")
        self.chunks: list[bytes] = []

    def _keep(self, data: bytes) -> None:
        self.n += len(data)
        if self.n > self.max_bytes:
            raise ResponseTooLarge(f"{self.what}: body over the {self.max_bytes:,}-byte cap (read {self.n:,} bytes "
                                   "so far, decoded; raise it with --max-response-mb)")
        self.chunks.append(data)

    def feed(self, chunk: bytes) -> None:
        if self.dec is None:
            return self._keep(chunk)
        data = chunk
        while data:
            out = self.dec.decompress(data, self.max_bytes - self.n + 1)  # never more than the cap allows
            self._keep(out)
            data = self.dec.unconsumed_tail

    def content(self) -> bytes:
        if self.dec is not None:
            self._keep(self.dec.flush(self.max_bytes - self.n + 1))
        return b"".join(self.chunks)


@dataclass
class Response:
    status: int
    content: bytes
    headers: dict

    def json(self) -> Any:
        return _json.loads(self.content)

    @property
    def text(self) -> str:
        return self.content.decode("utf-8", errors="replace")


def fetch(url: str, *, method: str = "GET", json: Any = None, deadline_s: float = 60.0,
          max_bytes: int = DEFAULT_MAX_BYTES, until: Optional[float] = None) -> Response:
    """``method url`` within ``deadline_s`` seconds in all (and before monotonic time ``until``,
    when given), reading at most ``max_bytes`` of body (decoded). Raises a :class:`FetchError` subclass
    (:class:`FetchConnectionError` when the server cannot be reached)."""
    t0 = time.monotonic()
    end = t0 + max(deadline_s, 0.0)
    if until is not None:
        end = min(end, until)
    budget = end - t0
    if budget <= 0:
        raise DeadlineExceeded(f"{method} {url}: no time left before the deadline")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise FetchError(f"{url}: only http:// and https:// URLs are fetched")
    cls = http.client.HTTPSConnection if parts.scheme == "https" else http.client.HTTPConnection
    conn = cls(parts.hostname, parts.port, timeout=budget)
    fired = threading.Event()

    def abort() -> None:  # the watchdog: a read blocked anywhere in the request returns at once
        fired.set()
        sock = conn.sock
        if sock is not None:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass

    dog = threading.Timer(budget, abort)
    dog.daemon = True
    dog.start()
    what = f"{method} {url}"
    try:
        body = None if json is None else _json.dumps(json).encode()
        headers = {"Accept-Encoding": "identity", "Connection": "close"}
        if body is not None:
            headers["Content-Type"] = "application/json"
        path = parts.path or "/"
        if parts.query:
            path += "?" + parts.query
        try:
            conn.request(method, path, body=body, headers=headers)
            resp = conn.getresponse()
        except (ConnectionRefusedError, socket.gaierror) as e:
            raise FetchConnectionError(f"{what}: {type(e).__name__}: {e}") from None
        if 300 <= resp.status < 400:
            raise Redirected(f"{what}: HTTP {resp.status} redirect to {resp.getheader('Location')!r}, not followed "
                             "(give the server's own URL)")
        declared = resp.getheader("Content-Length")
        if declared is not None and declared.strip().isdigit() and int(declared) > max_bytes:
            raise ResponseTooLarge(f"{what}: body of {int(declared):,} bytes declared, over the "
                                   f"{max_bytes:,}-byte cap (raise it with --max-response-mb)")
        out = _Body(what, resp.getheader("Content-Encoding") or "", max_bytes)
        n = 0
        while True:
            left = end - time.monotonic()
            if left <= 0 or fired.is_set():
                raise DeadlineExceeded(f"{what}: body not complete after {budget:.1f}s ({n:,} bytes read)")
            if conn.sock is not None:
                conn.sock.settimeout(left)
            chunk = resp.read1(_CHUNK)
            if not chunk:
                break
            n += len(chunk)
            out.feed(chunk)
        if fired.is_set():
            raise DeadlineExceeded(f"{what}: body not complete after {budget:.1f}s ({n:,} bytes read)")
        if resp.status >= 400:
            raise HTTPStatusError(f"{what}: HTTP {resp.status} {resp.reason}")
        return Response(resp.status, out.content(), dict(resp.getheaders()))
    except FetchError:
        raise
    except (OSError, http.client.HTTPException, ValueError, zlib.error) as e:
        if fired.is_set() or isinstance(e, (socket.timeout, TimeoutError)):
            raise DeadlineExceeded(f"{what}: no complete response within {budget:.1f}s") from None
        raise FetchError(f"{what}: {type(e).__name__}: {e}") from None
    finally:
        dog.cancel()
        conn.close()
