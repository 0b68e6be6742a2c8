"""Tail SGLang's side files while a run goes: estimator JSONL and STS shards.

Why: SGLang writes the block-accept estimator JSONL (one file, opened with
``"w"``, so a restart truncates it) and STS shards ``{stem}.{k}.pt`` (``k``
restarts at 0 in a new process, overwriting earlier shards). Waiting for the
run to end loses data on a restart, so both are tailed incrementally:

* :class:`JsonlTailer` reads complete lines past its offset, keeps a partial
  last line until its newline arrives, and detects truncation/replacement
  (size below offset, or a new inode): it then starts a new *generation* at
  offset 0 and reports it, so the caller can record the restart.
* :class:`StsShardTailer` picks up new shards once their size is stable
  between two polls (``torch.save`` is not atomic) and re-reads a shard whose
  size or mtime changed after a restart, under a new generation.

Parsing stays with the ingest package (``acceptscope.ingest``); these classes
only decide *what* is new.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass, field
from pathlib import Path


@dataclass
class TailEvent:
    kind: str  # truncated | replaced | overwritten
    path: str
    detail: str


class JsonlTailer:
    """Incremental reader of one JSONL file that survives truncation on restart."""

    def __init__(self, path: str | os.PathLike, *, max_bytes_per_poll: int = 8 * 1024 * 1024):
        self.path = Path(path)
        self.max_bytes_per_poll = max_bytes_per_poll
        self.offset = 0
        self.line_no = 0  # lines consumed in this generation
        self.generation = 0
        self._inode: int | None = None
        self._partial = b""
        self.events: list[TailEvent] = []

    def poll(self) -> list[tuple[int, str]]:
        """New complete lines as (1-based line number within the generation, text)."""
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return []
        if self._inode is not None and st.st_ino != self._inode:
            self._new_generation("replaced", f"inode {self._inode} -> {st.st_ino}")
        elif st.st_size < self.offset + len(self._partial):
            self._new_generation("truncated", f"size {st.st_size} < read offset {self.offset + len(self._partial)}")
        self._inode = st.st_ino
        start = self.offset + len(self._partial)
        if st.st_size <= start:
            return []
        with self.path.open("rb") as f:
            f.seek(start)
            chunk = f.read(min(st.st_size - start, self.max_bytes_per_poll))
        data = self._partial + chunk
        lines = data.split(b"\n")
        self._partial = lines.pop()  # '' when data ended with a newline
        out = []
        consumed = 0
        for raw in lines:
            consumed += len(raw) + 1
            self.line_no += 1
            text = raw.decode("utf-8", errors="replace").rstrip("\r")
            if text.strip():
                out.append((self.line_no, text))
        self.offset += consumed
        return out

    def _new_generation(self, kind: str, detail: str) -> None:
        self.events.append(TailEvent(kind, str(self.path), f"generation {self.generation} ended after line {self.line_no}: {detail}"))
        self.generation += 1
        self.offset = 0
        self.line_no = 0
        self._partial = b""


_SHARD_RE = re.compile(r"\.(\d+)\.pt$")


@dataclass
class _ShardState:
    size: int
    mtime_ns: int
    done: bool = False
    generation: int = 0


@dataclass
class StsShardTailer:
    """Finds new or rewritten ``{stem}.{k}.pt`` shards."""

    stem: str
    shards: dict[int, _ShardState] = field(default_factory=dict)
    events: list[TailEvent] = field(default_factory=list)
    generation: int = 0

    def _list(self) -> dict[int, Path]:
        stem = Path(self.stem)
        out = {}
        if not stem.parent.exists():
            return out
        for p in stem.parent.glob(stem.name + ".*.pt"):
            m = _SHARD_RE.search(p.name)
            if m and p.name == f"{stem.name}.{m.group(1)}.pt":
                out[int(m.group(1))] = p
        return out

    def poll(self, settle: bool = True) -> list[tuple[int, int, Path]]:
        """Shards ready to read now, as (k, generation, path); ready until ``mark_done``.

        ``settle=False`` (the last poll, after the writer stopped) skips waiting for a
        second look at a new shard's size.
        """
        ready = []
        for k, p in sorted(self._list().items()):
            try:
                st = p.stat()
            except FileNotFoundError:
                continue
            s = self.shards.get(k)
            if s is None:
                s = self.shards[k] = _ShardState(st.st_size, st.st_mtime_ns, generation=self.generation)
                if settle:
                    continue  # wait one poll for the size to settle
            if s.done and (st.st_size != s.size or st.st_mtime_ns != s.mtime_ns):
                # a restarted process rewrites shards 0,1,2,...: the first rewrite starts a new generation
                if any(j >= k and t.generation == self.generation for j, t in self.shards.items() if j != k) or s.generation == self.generation:
                    self.generation += 1
                self.events.append(TailEvent("overwritten", str(p), f"shard {k} rewritten; generation {self.generation}"))
                s = self.shards[k] = _ShardState(st.st_size, st.st_mtime_ns, generation=self.generation)
                if settle:
                    continue
            if not s.done:
                if st.st_size > 0 and (not settle or (st.st_size == s.size and st.st_mtime_ns == s.mtime_ns)):
                    ready.append((k, s.generation, p))
                else:
                    s.size, s.mtime_ns = st.st_size, st.st_mtime_ns
        return ready

    def mark_done(self, k: int) -> None:
        if k in self.shards:
            self.shards[k].done = True
