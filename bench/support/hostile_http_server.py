"""A loopback HTTP server that misbehaves on purpose (raw sockets: it writes whatever bytes it likes).

Modes, per request path or for every request:

* ``ok``: 200 with ``body`` (the good payload);
* ``slow-body``: 200, a Content-Length, then one byte every ``drip_s`` seconds, forever;
* ``endless-headers``: a status line, then one header line every ``drip_s`` seconds, forever;
* ``huge``: 200 without Content-Length, then megabytes of JSON-looking bytes as fast as the client reads;
* ``huge-declared``: 200 declaring a 2 GiB Content-Length, then a trickle;
* ``redirect``: 302 to ``/elsewhere``;
* ``gzip-bomb``: 200 with ``Content-Encoding: gzip``: about 1 MB on the wire that decodes to 1 GiB;
* ``poison``: 200 with ``body`` in which one value was made poisonous (the caller passes that body).

``plan`` maps a path to a list of modes taken in order (the last repeats), so a server can answer
the first requests well and turn hostile afterwards. Every connection thread ends when the server
is closed.
"""

from __future__ import annotations

import socket
import socketserver
import threading
import time
import zlib

_BOMB: dict[int, bytes] = {}


def gzip_bomb(size: int = 1 << 30) -> bytes:
    """``size`` zero bytes, gzip-compressed (~1 MB per GiB; made once per size, in pieces)."""
    if size not in _BOMB:
        c = zlib.compressobj(9, zlib.DEFLATED, 31)
        piece = bytes(1 << 20)
        parts = [c.compress(piece) for _ in range(size >> 20)]
        _BOMB[size] = b"".join(parts) + c.flush()
    return _BOMB[size]


class HostileServer:
    def __init__(self, plan: dict[str, list[str]], body: bytes = b"{}", drip_s: float = 0.05,
                 default: str = "slow-body"):
        self.plan = {k: list(v) for k, v in plan.items()}
        self.body = body
        self.drip_s = drip_s
        self.default = default
        self.hits: dict[str, int] = {}
        self._closing = threading.Event()
        self._lock = threading.Lock()
        outer = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self):  # noqa: D401
                try:
                    outer._serve(self.request)
                except OSError:
                    pass

        class Server(socketserver.ThreadingTCPServer):
            daemon_threads = True
            allow_reuse_address = True

        self._srv = Server(("127.0.0.1", 0), Handler)
        self.port = self._srv.server_address[1]
        self.url = f"http://127.0.0.1:{self.port}"
        self._thread = threading.Thread(target=self._srv.serve_forever, daemon=True)

    def __enter__(self) -> "HostileServer":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._closing.set()
        self._srv.shutdown()
        self._srv.server_close()

    def _mode(self, path: str) -> str:
        with self._lock:
            n = self.hits.get(path, 0)
            self.hits[path] = n + 1
        modes = self.plan.get(path)
        if not modes:
            return self.default
        return modes[min(n, len(modes) - 1)]

    def _serve(self, sock: socket.socket) -> None:
        sock.settimeout(5)
        req = b""
        while b"\r\n\r\n" not in req:
            got = sock.recv(65536)
            if not got:
                return
            req += got
        path = req.split(b" ", 2)[1].decode()
        mode = self._mode(path)
        drip = self.drip_s
        if mode in ("ok", "poison"):
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n"
                         b"Connection: close\r\n\r\n" % len(self.body) + self.body)
        elif mode == "gzip-bomb":
            bomb = gzip_bomb()
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Encoding: gzip\r\n"
                         b"Content-Length: %d\r\nConnection: close\r\n\r\n" % len(bomb) + bomb)
        elif mode == "redirect":
            sock.sendall(b"HTTP/1.1 302 Found\r\nLocation: /elsewhere\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
        elif mode == "slow-body":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 1000000\r\n\r\n{")
            self._drip(sock, b" ", drip)
        elif mode == "endless-headers":
            sock.sendall(b"HTTP/1.1 200 OK\r\n")
            i = 0
            while not self._closing.is_set():
                sock.sendall(b"X-Slow-%d: 1\r\n" % (i % 50))  # (few distinct names: under http.client's 100)
                i += 1
                time.sleep(drip)
        elif mode == "huge":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n[")
            block = b"1," * (1 << 19)
            while not self._closing.is_set():
                sock.sendall(block)
        elif mode == "huge-declared":
            sock.sendall(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 2147483648\r\n\r\n[")
            self._drip(sock, b"1,", drip)
        else:  # pragma: no cover
            raise ValueError(mode)

    def _drip(self, sock: socket.socket, piece: bytes, drip: float) -> None:
        while not self._closing.is_set():
            sock.sendall(piece)
            time.sleep(drip)


def poisoned(text: str, key: str, value: str, count: int = 1) -> bytes:
    """``text`` with the first ``count`` values of ``"key": <number>`` replaced by ``value``."""
    import re

    return re.sub(r'("%s":\s*)(-?[0-9.]+)' % key, lambda m: m.group(1) + value, text, count=count).encode()

