"""Bounded-memory reading of /server_info dumps: the document's skeleton, and its records in chunks.

Why: one /server_info response holds every DP rank's whole ring (200k records each, ~330 bytes per
request-step), and a file of polls holds many; reading a dump whole costs memory in proportion to
it (0.69 GiB per million request-steps before this module). Here a dump is read in two passes:

1. :func:`scan` walks the document once. Outside the ``records`` arrays it tokenizes (small: the
   server args and the payload headers) and copies the bytes into a *skeleton*, the same document
   with every records array emptied, which the caller decodes with its ordinary decoders. Inside a
   records array it cuts the bytes at record boundaries into chunks of about ``chunk_bytes``: a
   candidate cut is a ``}, {"forward_ct"`` separator (``forward_ct`` is the first field SGLang's
   record declares; compact or spaced), and a chunk counts only once ``[`` + its bytes + ``]`` decodes as a JSON array (as
   ``msgspec.Raw`` items, cheap). A chunk that decodes parses exactly as the original text does,
   so a cut can never fall inside a record; where the array ends, msgspec reports trailing
   characters at its closing bracket.
2. The caller decodes one chunk at a time (:class:`ChunkedRecords`), translates it and drops it.

Anything the scan does not expect (a repeated key on the path to a records array, a record that is
not valid JSON, a pretty-printed array without the compact separator that outgrows
``max_record_bytes``, a truncated file) makes :func:`scan` return None: the caller then reads the
document whole and takes its exact path, which names every problem by file, line and field.
"""

from __future__ import annotations

import bisect
import os
import re
from dataclasses import dataclass, field
from typing import Iterator, Optional, Union

import msgspec

__all__ = ["BytesSource", "FileSource", "Scan", "ChunkedRecords", "scan", "iter_lines", "first_document",
           "CHUNK_BYTES"]

CHUNK_BYTES = 16 << 20  # ~50k request-steps of records per chunk
_MAX_TOKEN = 64 << 20  # a skeleton token (a server-arg string, a number) larger than this: take the whole path
_KEY = b'"forward_ct"'  # the first key of every record (SGLang's DecodeStepRecord declares it first)
RAW_LIST = _dec_raw_list = msgspec.json.Decoder(list[msgspec.Raw])  # (server_info's exact path uses it too)
_TRAILING = re.compile(r"trailing characters \(byte (\d+)\)")
_WS = b" \t\n\r"
_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.S)
_SCALAR = re.compile(rb"-?[0-9]+(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true|false|null")


class BytesSource:
    """A document held in memory (a poll body, a line of a small file)."""

    def __init__(self, data: bytes):
        self.data = data
        self.size = len(data)

    def read(self, start: int, end: int) -> bytes:
        return self.data[start:min(end, self.size)]

    def read_array(self, start: int, end: int) -> bytearray:
        return bytearray(self.data[start:min(end, self.size)])

    def read_all(self) -> bytes:
        return self.data


class FileSource:
    """A document that is the byte range [start, end) of a file, read with ``pread`` (no mapping held)."""

    def __init__(self, path: Union[str, os.PathLike], start: int = 0, end: Optional[int] = None):
        self.path = os.fspath(path)
        self.start = start
        self.size = (os.path.getsize(self.path) if end is None else end) - start

    def read(self, start: int, end: int) -> bytes:
        end = min(end, self.size)
        if end <= start:
            return b""
        with open(self.path, "rb") as f:
            return os.pread(f.fileno(), end - start, self.start + start)

    def read_array(self, start: int, end: int) -> bytearray:
        """A mutable copy of [start, end), read straight into it (the caller brackets it in place)."""
        end = min(end, self.size)
        buf = bytearray(max(end - start, 0))
        if buf:
            with open(self.path, "rb") as f:
                got = os.preadv(f.fileno(), [buf], self.start + start)
            del buf[got:]
        return buf

    def read_all(self) -> bytes:
        return self.read(0, self.size)


Source = Union[BytesSource, FileSource]


@dataclass
class Scan:
    """What :func:`scan` found: the skeleton and, per records array, its chunks ``(start, end, count)``.

    ``arrays`` keys: ``None`` for a bare payload's top-level ``records``, ``"top"`` for a top-level
    ``dspark_info_record``, an int ``i`` for ``internal_states[i].dspark_info_record``.
    """

    skeleton: bytes
    arrays: dict = field(default_factory=dict)


class _Unexpected(Exception):
    pass


class _Scanner:
    def __init__(self, src: Source, chunk_bytes: int, max_record_bytes: int):
        self.src = src
        self.chunk_bytes = chunk_bytes
        self.max_record_bytes = max_record_bytes
        self.buf = b""
        self.base = 0  # absolute offset of buf[0]
        self.out: list[bytes] = []
        self.copied = 0  # absolute offset up to which the skeleton has been copied
        self.arrays: dict = {}

    # -- buffered access ------------------------------------------------------
    def _window(self, pos: int, need: int = 1) -> tuple[bytes, int]:
        """(buffer, index of ``pos`` in it) holding at least ``need`` bytes from pos (fewer at EOF)."""
        i = pos - self.base
        if i < 0 or i + need > len(self.buf):
            size = max(need, 1 << 20)
            self.buf, self.base = self.src.read(pos, pos + size), pos
            i = 0
        return self.buf, i

    def _skip_ws(self, pos: int) -> int:
        while True:
            buf, i = self._window(pos)
            n = len(buf)
            while i < n and buf[i] in _WS:
                i += 1
            if i < n:
                return self.base + i
            if n == 0 or pos >= self.src.size:
                raise _Unexpected("end of document")
            pos = self.base + i

    def _byte(self, pos: int) -> int:
        buf, i = self._window(pos)
        if i >= len(buf):
            raise _Unexpected("end of document")
        return buf[i]

    def _token(self, rx: re.Pattern, pos: int) -> tuple[bytes, int]:
        need = 4096
        while True:
            buf, i = self._window(pos, need)
            m = rx.match(buf, i)
            complete = m is not None and (m.end() < len(buf) or self.base + len(buf) >= self.src.size)
            if complete:
                return m.group(0), self.base + m.end()
            if need >= _MAX_TOKEN or self.base + len(buf) >= self.src.size:
                raise _Unexpected("token")
            need *= 4

    # -- the document ---------------------------------------------------------
    def value(self, pos: int, path: tuple, depth: int = 0) -> int:
        """Skip (copying) the value at ``pos``; returns the position after it."""
        if depth > 64:
            raise _Unexpected("deep")
        pos = self._skip_ws(pos)
        c = self._byte(pos)
        if c == 0x7B:  # {
            return self._object(pos + 1, path, depth)
        if c == 0x5B:  # [
            return self._array(pos + 1, path, depth)
        if c == 0x22:  # "
            return self._token(_STRING, pos)[1]
        return self._token(_SCALAR, pos)[1]

    def _object(self, pos: int, path: tuple, depth: int) -> int:
        seen: set[bytes] = set()
        pos = self._skip_ws(pos)
        if self._byte(pos) == 0x7D:
            return pos + 1
        while True:
            pos = self._skip_ws(pos)
            if self._byte(pos) != 0x22:
                raise _Unexpected("key")
            key, pos = self._token(_STRING, pos)
            if key in seen:
                raise _Unexpected("repeated key")  # (decoders keep the last one; the whole path sorts it out)
            seen.add(key)
            pos = self._skip_ws(pos)
            if self._byte(pos) != 0x3A:
                raise _Unexpected(":")
            sub = path + (key[1:-1],)
            where = _records_key(sub)
            vpos = self._skip_ws(pos + 1)
            if where is not _NO and self._byte(vpos) == 0x5B:
                pos = self._records(vpos + 1, where)
            else:
                pos = self.value(vpos, sub if len(sub) < 4 else ("",) * 4, depth + 1)
            pos = self._skip_ws(pos)
            c = self._byte(pos)
            if c == 0x7D:
                return pos + 1
            if c != 0x2C:
                raise _Unexpected(",")
            pos += 1

    def _array(self, pos: int, path: tuple, depth: int) -> int:
        pos = self._skip_ws(pos)
        if self._byte(pos) == 0x5D:
            return pos + 1
        k = 0
        while True:
            pos = self.value(pos, path + (k,) if len(path) < 4 else ("",) * 4, depth + 1)
            pos = self._skip_ws(pos)
            c = self._byte(pos)
            if c == 0x5D:
                return pos + 1
            if c != 0x2C:
                raise _Unexpected(",")
            pos += 1
            k += 1

    def _records(self, pos: int, where) -> int:
        """Chunk the records array whose '[' ends just before ``pos``; returns the position after its ']'.

        Each read starts one byte early (the '[' or the ',' before the chunk), which becomes the
        wrapping '[', and the separator's ',' becomes the closing ']': no copy besides the read.
        A candidate cut is a ``}`` ``,`` ``{"forward_ct"`` sequence (whitespace allowed between:
        compact and ``json.dumps``-spaced dumps alike); the decode check makes it a cut.
        """
        self.out.append(self.src.read(self.copied, pos))  # the skeleton keeps '[' ...
        chunks: list[tuple[int, int, int]] = []
        size = self.chunk_bytes
        while True:
            first = self._skip_ws(pos)
            if self._byte(first) == 0x5D and not chunks:
                end = first
                break
            buf = self.src.read_array(pos - 1, pos + size)  # buf[i] is the document's byte pos - 1 + i
            buf[0] = 0x5B
            cut = _last_cut(buf)  # the ',' before the last record that starts in buf
            if cut >= 0:
                buf[cut] = 0x5D
            view = memoryview(buf)[: cut + 1] if cut >= 0 else memoryview(buf)
            try:
                n = len(_dec_raw_list.decode(view))
                if cut < 0:
                    raise _Unexpected("unterminated")
                chunks.append((pos, pos - 1 + cut, n))
                pos += cut  # past the separating ','
                size = self.chunk_bytes
                continue
            except msgspec.DecodeError as e:
                m = _TRAILING.search(str(e))
                if m is None:
                    if pos - 1 + len(buf) < self.src.size and size < self.max_record_bytes:
                        size *= 4  # one record longer than a chunk, or no compact separator: read more
                        continue
                    raise _Unexpected(str(e)) from None
            finally:
                view.release()
            # msgspec names the byte after the first trailing character; the array's ']' is the last
            # non-blank byte before that character
            k = int(m.group(1)) - 2
            while k > 0 and buf[k] in _WS:
                k -= 1
            if k < 1 or buf[k] != 0x5D:
                raise _Unexpected("array end") from None
            n = len(_dec_raw_list.decode(memoryview(buf)[: k + 1]))
            end = pos - 1 + k  # the array's ']'
            if n:
                chunks.append((pos, end, n))
            break
        self.arrays[where] = chunks
        self.copied = end  # ... and its ']'
        return end + 1

    def run(self) -> Scan:
        pos = self._skip_ws(0)
        if self._byte(pos) != 0x7B:
            raise _Unexpected("not an object")
        end = self.value(pos, ())
        if end < self.src.size and self.src.read(end, self.src.size).strip(_WS + b"\x0b\x0c"):
            raise _Unexpected("trailing data")
        self.out.append(self.src.read(self.copied, self.src.size))
        return Scan(b"".join(self.out), self.arrays)


_NO = object()


def _last_cut(buf: bytearray) -> int:
    """Index of the ',' of the last ``}`` ``,`` ``{"forward_ct"`` in ``buf`` (blanks allowed between), or -1."""
    end = len(buf)
    while True:
        k = buf.rfind(_KEY, 1, end)
        if k < 0:
            return -1
        i = k - 1
        while i > 0 and buf[i] in _WS:
            i -= 1
        if buf[i] == 0x7B:  # {
            i -= 1
            while i > 0 and buf[i] in _WS:
                i -= 1
            if buf[i] == 0x2C:  # ,
                j = i - 1
                while j > 0 and buf[j] in _WS:
                    j -= 1
                if buf[j] == 0x7D:  # }
                    return i
        end = k


def _records_key(path: tuple):
    """The ``Scan.arrays`` key when ``path`` (keys and indices from the top) is a records array, else _NO."""
    if path == (b"records",):
        return None
    if path == (b"dspark_info_record", b"records"):
        return "top"
    if len(path) == 4 and path[0] == b"internal_states" and isinstance(path[1], int) \
            and path[2:] == (b"dspark_info_record", b"records"):
        return path[1]
    return _NO


_SCANS: dict = {}  # the last few file scans: run identity scans a dump, then the ingest reads it


def scan(src: Source, chunk_bytes: int = CHUNK_BYTES, max_record_bytes: int = 256 << 20) -> Optional[Scan]:
    """The skeleton and records chunks of the document in ``src``, or None when it is irregular.

    A file's scan is kept (keyed by path, range, size and change times) for the next call on the
    same range: the identity pass over a dump and its ingest then cost one scan.
    """
    key = None
    if isinstance(src, FileSource):
        try:
            st = os.stat(src.path)
        except OSError:
            return None
        key = (src.path, src.start, src.size, chunk_bytes, st.st_ino, st.st_mtime_ns, st.st_ctime_ns)
        if key in _SCANS:
            return _SCANS[key]
    try:
        got: Optional[Scan] = _Scanner(src, chunk_bytes, max_record_bytes).run()
    except (_Unexpected, msgspec.DecodeError, RecursionError):
        got = None
    if key is not None:
        while len(_SCANS) >= 8:
            _SCANS.pop(next(iter(_SCANS)))
        _SCANS[key] = got
    return got


_BLANK = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips
_SMALL = 1 << 20


def first_document(path: Union[str, os.PathLike], probe: int = 64 << 20) -> tuple[bool, FileSource]:
    """(whether the file is JSON lines of documents, its first document).

    JSON lines when the first non-blank line is a JSON document on its own and more follows it;
    else the file is one (possibly pretty-printed) document. Reads up to the end of that line only
    (a first line longer than ``probe`` is tested by :func:`scan`, whose result is kept).
    """
    st = os.stat(path)
    key = ("first", os.fspath(path), st.st_size, st.st_ino, st.st_mtime_ns, st.st_ctime_ns, probe)
    if key not in _SCANS:  # (run identity asks, then the ingest: one look for the first newline)
        while len(_SCANS) >= 8:
            _SCANS.pop(next(iter(_SCANS)))
        _SCANS[key] = _first_document(path, st.st_size, probe)
    return _SCANS[key]


def _first_document(path: Union[str, os.PathLike], size: int, probe: int) -> tuple[bool, FileSource]:
    for _, a, b in iter_lines(path):
        head = FileSource(path, a, b)
        if b - a < _SMALL and not head.read_all().strip(_BLANK):
            continue  # (leading blank lines)
        if size - b < _SMALL and not FileSource(path, b, size).read_all().strip(_BLANK):
            return False, FileSource(path, a, size)  # nothing after the first line: one document
        if b - a > probe:
            ok = scan(head) is not None
        else:
            try:
                msgspec.json.decode(head.read_all())
                ok = True
            except (msgspec.DecodeError, msgspec.ValidationError, RecursionError):
                ok = False
        return (True, head) if ok else (False, FileSource(path, a, size))
    return False, FileSource(path, 0, size)


class ChunkedRecords:
    """The records of one state as a sequence of raw items, decoded one chunk at a time (one kept)."""

    def __init__(self, src: Source, chunks: list[tuple[int, int, int]]):
        self.src = src
        self.chunks = chunks
        self.starts = [0]
        for _, _, n in chunks:
            self.starts.append(self.starts[-1] + n)
        self._cached: tuple[int, list] = (-1, [])

    def __len__(self) -> int:
        return self.starts[-1]

    def chunk_json(self, c: int) -> bytearray:
        """Chunk ``c`` as one JSON array: read with the byte before it ('[' or ',') and after it (',' or ']'),
        which become its brackets."""
        a, b, _ = self.chunks[c]
        buf = self.src.read_array(a - 1, b + 1)
        buf[0], buf[-1] = 0x5B, 0x5D
        return buf

    def chunk_items(self, c: int) -> list:
        if self._cached[0] != c:
            self._cached = (c, _dec_raw_list.decode(self.chunk_json(c)))
        return self._cached[1]

    def chunk_of(self, j: int) -> int:
        return bisect.bisect_right(self.starts, j) - 1

    def __getitem__(self, j):
        if isinstance(j, slice):
            return [self[i] for i in range(*j.indices(len(self)))]
        if j < 0:
            j += len(self)
        if not 0 <= j < len(self):
            raise IndexError(j)
        c = self.chunk_of(j)
        return self.chunk_items(c)[j - self.starts[c]]

    def release(self) -> None:
        self._cached = (-1, [])


def iter_lines(path: Union[str, os.PathLike], block: int = 8 << 20) -> Iterator[tuple[int, int, int]]:
    """(line number from 1, start, end) of each line of a file (end excludes the newline), read in blocks."""
    size = os.path.getsize(path)
    start, lineno, pos = 0, 1, 0
    buf = bytearray(min(block, size))  # one buffer read into again and again: a fresh 8 MB bytes per block
    # cost its page faults (~3x the CPU of the copy itself on a one-line 330 MB dump)
    with open(path, "rb") as f:
        while pos < size:
            got = os.preadv(f.fileno(), [buf], pos)
            if got <= 0:
                break
            k = 0
            while True:
                nl = buf.find(b"\n", k, got)
                if nl < 0:
                    break
                yield lineno, start, pos + nl
                lineno += 1
                start = pos + nl + 1
                k = nl + 1
            pos += got
    yield lineno, start, size
