"""Ingest SGLang 0.5.23 DSpark artifacts into the acceptscope store.

Parsers translate (never compute statistics) each artifact into the schema
tables, reject the smallest invalid unit with file/line/field, and keep every
valid sibling:

=====================  ==========================================  ============================
artifact               module                                      tables
=====================  ==========================================  ============================
/server_info dumps     :mod:`acceptscope.ingest.server_info`       runs, steps, request_steps, gaps
estimator JSONL        :mod:`acceptscope.ingest.estimator_jsonl`   estimator_rows/_gather/_eos
STS shards ``.pt``     :mod:`acceptscope.ingest.sts_shards`        sts_samples
STS calibration JSON   :mod:`acceptscope.ingest.sts_table`         sts_tables
SPS tables (both)      :mod:`acceptscope.ingest.sps`               sps_tables
SPS profiler outputs   :mod:`acceptscope.ingest.sps_profile`       sps_profile_*
client responses       :mod:`acceptscope.ingest.meta_info`         requests
=====================  ==========================================  ============================

:func:`ingest_paths` walks files and directories, sniffs each file's kind
(:mod:`acceptscope.ingest.detect`) and writes everything to a Store.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import platform
import re
import stat
import time
from collections import Counter
from contextlib import nullcontext
from pathlib import Path
from typing import Any, Callable, ContextManager, Iterable, Mapping, Optional, Protocol, Sequence

import pyarrow as pa
from rich.markup import escape
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from acceptscope.console import console
from acceptscope.ingest import epochs, stream
from acceptscope.ingest import sts_shards as sts  # noqa: F401  (``from acceptscope.ingest import sts``)
from acceptscope.ingest.batch import ArrowRows, IngestBatch
from acceptscope.ingest.detect import detect
from acceptscope.ingest.engines import ENGINE_KINDS, engine_ingest_batch
from acceptscope.ingest.estimator_jsonl import parse_estimator_jsonl
from acceptscope.ingest.identity import assign_runs, check_run_id
from acceptscope.ingest.kinds import LAST, NAMES, ORDER, SERVER_SIDE
from acceptscope.ingest.links import link_run_tables
from acceptscope.ingest.meta_info import parse_responses
from acceptscope.ingest.rejects import format_reject, make_reject
from acceptscope.ingest.server_info import ServerInfoIngestor
from acceptscope.ingest.sps import parse_sps_table
from acceptscope.ingest.sps_profile import ingest_profile_file
from acceptscope.ingest.sts_table import parse_sts_table
from acceptscope.store_lock import usable_cpus

__all__ = ["ingest_paths", "ingest_file", "IngestBatch", "ArrowRows", "detect", "format_reject", "iter_files",
           "tune_allocator_for_bulk_ingest"]



def tune_allocator_for_bulk_ingest() -> bool:
    """Process-wide allocator settings for a short-lived bulk-ingest process; True when applied.

    Call it only from a process that exists to ingest and then exit (the ``acceptscope
    ingest`` command does; nothing calls it on import). It fixes glibc's mmap threshold at
    32 MiB and its trim threshold at 512 MiB, so the parse's many 1-30 MB numpy/bytes
    temporaries reuse freed heap memory instead of each mapping fresh zeroed pages and
    unmapping them again; and it moves Arrow's allocations onto that same tuned heap
    (``pyarrow.system_memory_pool``): Arrow's default pool (mimalloc) hands freed pages back to the
    kernel and faults them in again for the next batch, which cost ~0.7-0.9 s of kernel time at
    1M request-steps. The price: up to 512 MiB of freed memory stays with the process until it
    exits, which is why a long-lived process (the live poller, a notebook) must not call it.

    Measured (one pinned core, CPU seconds): glibc thresholds, 204,800 request-steps: ~101k ->
    ~87k minor page faults, 0.05-0.08 s less CPU in each of four side-by-side pairs; Arrow's pool,
    1M request-steps, three alternating runs each: kernel time 1.57-1.77 s -> 0.87-0.95 s, CPU
    5.20-5.59 s -> 4.51-4.67 s (user time unchanged). A no-op (False) off glibc.
    """
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        m_trim_threshold, m_mmap_threshold = -1, -3  # <malloc.h>
        ok = libc.mallopt(m_mmap_threshold, 32 * 1024 * 1024) == 1
        ok = libc.mallopt(m_trim_threshold, 512 * 1024 * 1024) == 1 and ok
    except (OSError, AttributeError):
        return False
    if ok:  # (buffers already allocated stay with the pool that made them)
        pa.set_memory_pool(pa.system_memory_pool())
    return bool(ok)


def iter_files(paths: Iterable[str | Path]) -> list[Path]:
    """Files under ``paths`` (directories recursed, hidden entries skipped), sorted, de-duplicated.

    Symlinked directories are followed (each real directory once, so a link loop ends); a path
    named explicitly is kept whatever it is, for :func:`ingest_paths` to refuse when it is not a
    regular file (a FIFO, a device).
    """
    out: list[Path] = []
    for p in paths:
        p = Path(p)
        if p.is_dir():
            out.extend(_walk(p))
        else:
            out.append(p)
    seen: set[Path] = set()
    uniq = []
    for f in out:
        if f not in seen:
            seen.add(f)
            uniq.append(f)
    return uniq


def _walk(root: Path) -> list[Path]:
    """Entries of ``root`` that are not directories, recursively, following directory symlinks once."""
    found: list[Path] = []
    visited: set[str] = set()
    for d, dirs, files in os.walk(root, followlinks=True):
        real = os.path.realpath(d)
        if real in visited:  # a symlink loop, or a second link to a directory already walked
            dirs[:] = []
            continue
        visited.add(real)
        dirs[:] = sorted(x for x in dirs if not x.startswith("."))
        found.extend(Path(d) / f for f in files if not f.startswith("."))
    return sorted(found)


def not_regular(path: Path) -> Optional[str]:
    """Why ``path`` cannot be read as an artifact (missing, a FIFO, a device, ...), or None for a regular file.

    ``stat`` follows symlinks and never blocks, unlike ``open`` on a FIFO.
    """
    try:
        mode = os.stat(path).st_mode
    except OSError as e:
        return f"could not read: {type(e).__name__}: {e}"
    if stat.S_ISREG(mode):
        return None
    what = ("a FIFO" if stat.S_ISFIFO(mode) else "a character device" if stat.S_ISCHR(mode) else
            "a block device" if stat.S_ISBLK(mode) else "a socket" if stat.S_ISSOCK(mode) else
            "a directory" if stat.S_ISDIR(mode) else "a special file")
    via = " (through a symlink)" if Path(path).is_symlink() else ""
    return f"not a regular file: {what}{via}; refused"


_WHITESPACE = b" \t\n\r\x0b\x0c"  # what bytes.strip() strips
def ingest_server_info_file(path: Path, ingestor, source: Optional[str] = None) -> IngestBatch:
    """One saved /server_info response (JSON) or successive polls (JSON lines) into ``ingestor``,
    read a chunk of records at a time (:mod:`acceptscope.ingest.stream`)."""
    path = Path(path)
    src = source or str(path)
    lines, first = stream.first_document(path)
    if not lines:
        return ingestor.feed_source(first, source=src, line=1)  # (the scan run identity made is reused)
    batch = IngestBatch()
    for i, a, b in stream.iter_lines(path):
        doc = stream.FileSource(path, a, b)
        if b - a < (1 << 20) and not doc.read_all().strip(_WHITESPACE):
            continue
        batch.merge(ingestor.feed_source(doc, source=src, line=i))
    return batch


class IngestStore(Protocol):
    """What :func:`ingest_paths` needs of a store (:class:`acceptscope.store.Store` is one): typed here
    instead of probed with ``hasattr``, so a store that lacks a method fails at the call, by name."""

    path: Path
    read_only: bool

    def connect(self, read_only: bool = False) -> ContextManager[Any]: ...
    def snapshot(self) -> ContextManager[Any]: ...
    def query_arrow(self, sql: str, params: Sequence[Any] | None = None) -> pa.Table: ...
    def query_df(self, sql: str, params: Sequence[Any] | None = None) -> Any: ...
    def writer(self, **kwargs: Any) -> Any: ...
    def created_empty(self) -> bool: ...
    def mark_complete(self, run_ids: Any) -> None: ...
    def update_run(self, run_id: str, values: Mapping[str, Any]) -> int: ...


class _Context:
    """Per-ingest state: one ServerInfoIngestor per run, the gamma/arm of every run."""

    def __init__(self, store: Optional[IngestStore], sink: Optional[Callable[[IngestBatch], None]] = None):
        self.store = store
        self.sink = sink  # where server dumps hand their rows a chunk at a time (None: kept in the file's batch)
        self.ingestors: dict[str, Any] = {}
        self.gamma: dict[str, int] = {}
        self.arm: dict[str, str] = {}
        self.stored: set[str] = set()  # runs the store already holds: only these are resumed
        self.epoch_of: dict[str, dict[float, int]] = {}  # run -> its incarnations' epochs (epochs.place)
        if store is not None:
            # a writable store answers on a read-write connection (the read-only query nests in it): a
            # read-only open would start this process's attach host, a second DuckDB instance (~0.03 CPU-s)
            writable = not store.read_only
            if writable and store.created_empty():
                return  # a file this Store just created, written by no one since: no run yet, no open needed
            try:
                with store.connect() if writable else nullcontext():
                    runs = store.query_arrow("SELECT run_id, arm, gamma FROM runs").to_pylist()  # (no pandas)
                for r in runs:
                    self.gamma[r["run_id"]] = int(r["gamma"])
                    self.arm[r["run_id"]] = r["arm"]
                    self.stored.add(r["run_id"])
            except Exception:  # noqa: BLE001 - an empty or foreign store simply has no runs yet
                pass

    def server_info_ingestor(self, run_id: str):
        ing = self.ingestors.get(run_id)
        if ing is None:
            ing = self.ingestors[run_id] = ServerInfoIngestor(
                run_id, source="file", expected_gamma=self.gamma.get(run_id), expected_arm=self.arm.get(run_id))
            ing.epoch_of = dict(self.epoch_of.get(run_id, {}))
            if self.store is not None and run_id in self.stored:
                ing.resume(self.store)  # later polls of a run ingested before: keep its rank slots/epoch
        return ing

    def place_epochs(self, plan: Any) -> None:
        """Under the runs' ingest locks: each run's incarnations in startup order (:mod:`~acceptscope.ingest.epochs`)."""
        starts: dict[str, list[float]] = {}
        for f, t in plan.startup.items():
            starts.setdefault(plan.run_of[f], []).append(t)
        if not starts or not _writable(self.store):
            return
        if self.store.created_empty():  # a file this ingest made, still empty: no stored incarnation to order
            for rid, ts in starts.items():
                self.epoch_of[rid] = epochs.new_map(ts)
            return
        with self.store.connect() as con:
            for rid, ts in starts.items():
                self.epoch_of[rid] = epochs.place(con, rid, ts)

    def record_epochs(self) -> None:
        if not _writable(self.store):
            return
        with self.store.connect() as con:
            for rid, ing in self.ingestors.items():
                if ing.epoch_of:
                    epochs.record(con, rid, ing.epoch_of)

    def learn(self, run_id: str) -> None:
        ing = self.ingestors.get(run_id)
        if ing is not None and ing.gamma is not None:
            self.gamma[run_id] = ing.gamma
            if ing.arm:
                self.arm[run_id] = ing.arm


def _writable(store: Optional[IngestStore]) -> bool:
    return store is not None and not store.read_only


def _lock_path(store: Optional[IngestStore]) -> Optional[Path]:
    """The database file whose ingest lock a writing ingest takes (None: nothing to lock)."""
    return Path(store.path) if store is not None and _writable(store) else None


def _read_server_info(path: Path, kind: str, run_id: str, ctx: _Context) -> IngestBatch:
    ing = ctx.server_info_ingestor(run_id)
    ing.sink = ctx.sink
    try:
        b = ingest_server_info_file(path, ing)
    finally:
        ing.sink = None
    ctx.learn(run_id)
    return b


def _text_reader(parse: Callable[..., IngestBatch], gamma: bool) -> Callable[[Path, str, str, _Context], IngestBatch]:
    def read(path: Path, kind: str, run_id: str, ctx: _Context) -> IngestBatch:
        extra = {"gamma": ctx.gamma.get(run_id)} if gamma else {}
        return parse(path.read_bytes(), source=str(path), run_id=run_id, **extra)
    return read


# one reader per kind of the registry (acceptscope.ingest.kinds): (path, kind, run id, context) -> batch
_READERS: dict[str, Callable[[Path, str, str, _Context], IngestBatch]] = {
    "server_info": _read_server_info,
    "estimator_jsonl": _text_reader(parse_estimator_jsonl, gamma=True),
    "sts_shard": lambda path, kind, rid, ctx: sts.ingest_sts_shard(path, run_id=rid, gamma=ctx.gamma.get(rid)),
    "sts_table": _text_reader(parse_sts_table, gamma=True),
    "sps_table": _text_reader(parse_sps_table, gamma=False),
    "sps_profile_records": lambda path, kind, rid, ctx: ingest_profile_file(path, kind, run_id=rid),
    "sps_profile_rounds": lambda path, kind, rid, ctx: ingest_profile_file(path, kind, run_id=rid),
    "sps_profile_manifest": lambda path, kind, rid, ctx: ingest_profile_file(path, kind, run_id=rid),
    "responses": _text_reader(parse_responses, gamma=False),
    **{k: (lambda path, kind, rid, ctx: engine_ingest_batch(path, kind, rid, ctx.store)) for k in ENGINE_KINDS},
}
if set(_READERS) != set(NAMES):  # pragma: no cover - a kind added to the registry without its reader
    raise ImportError(f"ingest kinds without a reader: {sorted(set(NAMES) - set(_READERS))}; "
                      f"readers of no kind: {sorted(set(_READERS) - set(NAMES))}")


def readers_of_kinds() -> dict[str, Callable[[Path, str, str, _Context], IngestBatch]]:
    """The reader of every kind of the registry (a copy)."""
    return dict(_READERS)


def ingest_file(path: Path, kind: str, run_id: str, ctx: Optional[_Context] = None) -> IngestBatch:
    """Parse one file of a known kind (no store write)."""
    read = _READERS.get(kind)
    if read is not None:
        return read(Path(path), kind, run_id, ctx or _Context(None))
    b = IngestBatch()
    b.reject(make_reject(str(path), 0, "$", f"unrecognised artifact (kind {kind!r}); see acceptscope.ingest.detect",
                         None, run_id))
    return b


_NUM = re.compile(r"(?<![A-Za-z_])-?\d+(\.\d+)?(e-?\d+)?")


def reason_family(reason: str) -> str:
    """A reject reason with its numbers and quoted values blanked, for 'top reasons' tallies."""
    r = re.sub(r"'[^']*'", "'…'", reason)
    return _NUM.sub("N", r)


def _plain(text: str) -> str:
    """A file name shown in the progress bar: rich markup escaped, control characters dropped."""
    return escape("".join(c if c.isprintable() else "?" for c in text))


def _detect_safe(f: Path) -> str:
    try:
        return detect(f)
    except OSError:
        return "unknown"  # (ingest_file reads it again and reports why it cannot)


def _bulk_writer(store: IngestStore) -> Any:
    """The store's writer, flushing by size only: a bulk ingest has no reader waiting on latency, and
    every flush opens the file, probes the keys and checkpoints (at the default 1 s interval a 200k
    request-step dump took ~10 flushes and ~1.5 CPU-s more than one). The bounds keep memory flat:
    at most ~2 x 160 MB of buffered Arrow rows whatever the dump's size. With one usable CPU the flushes
    run in the parsing thread (no flush thread: on one CPU it cannot overlap the parse and costs ~9% more
    CPU, measured at 1M request-steps); with more, a flush thread writes while the next chunk is parsed
    (~10% less wall time on 2 CPUs)."""
    return store.writer(flush_interval_s=3600.0, max_buffer_rows=400_000, max_buffer_bytes=160 << 20,
                        background=usable_cpus() > 1)


def _plan(paths: Iterable[str | Path], run_id: Optional[str]) -> dict:
    """The files of an ingest, their kinds and runs, in the order they are read: server dumps in start
    order per run (epochs in order), then the rest by kind."""
    files = iter_files(paths)
    refused = {f: why for f in files if (why := not_regular(f)) is not None}
    kinds = [(f, "refused" if f in refused else _detect_safe(f)) for f in files]
    plan = assign_runs([(f, k) for f, k in kinds if k not in ("skip", "empty")], run_id)
    todo = sorted(((f, k) for f, k in kinds if k not in ("skip", "empty")),
                  key=lambda fk: (ORDER.get(fk[1], LAST), plan.run_of[fk[0]] if fk[1] == "server_info" else "",
                                  plan.startup.get(fk[0], 0.0), str(fk[0])))
    return {"todo": todo, "plan": plan, "refused": refused,
            "skipped": [str(f) for f, k in kinds if k == "skip"], "empty": [str(f) for f, k in kinds if k == "empty"],
            "runs": sorted({plan.run_of[f] for f, k in todo if k in ("server_info",) + SERVER_SIDE}),
            "server_runs": sorted({plan.run_of[f] for f, k in todo if k == "server_info"})}


def _read_one(f: Path, kind: str, rid: str, ctx: _Context, refused: dict) -> IngestBatch:
    """One file's batch; a file that cannot be read or parsed costs itself, never the later ones."""
    batch = IngestBatch()
    if kind == "refused":
        batch.reject(make_reject(str(f), 0, "$", refused[f], None, rid))
        return batch
    try:
        return ingest_file(f, kind, rid, ctx)
    except (OSError, MemoryError) as e:  # unreadable file: report it, go on with the others
        batch.reject(make_reject(str(f), 0, "$", f"could not read: {type(e).__name__}: {e}", None, rid))
    except Exception as e:  # noqa: BLE001 - a parser bug must cost this file, never the later ones
        batch.reject(make_reject(str(f), 0, "$", f"parser failed: {type(e).__name__}: {e}", None, rid))
    return batch


def ingest_paths(
    paths: Iterable[str | Path],
    store: Optional[IngestStore],
    run_id: Optional[str] = None,
    progress: bool = True,
    *,
    temperature: Optional[float] = None,
    on_file: Optional[Callable[[Path, str, IngestBatch], None]] = None,
) -> dict:
    """Ingest files/directories into ``store``; returns a summary dict.

    ``run_id``: the run of every artifact; default: the server that wrote them
    (:mod:`acceptscope.ingest.identity`). ``temperature``: the sampling temperature of all
    traffic in these dumps (SGLang's dumps carry none; 0 makes greedy blocks exact).
    After the files, the STS / SPS tables the servers name are linked to their runs
    (:mod:`acceptscope.ingest.links`). Writes through ``store.writer()``; ``store`` None parses
    without writing (the summary counts what was offered). ``progress``: a rich progress bar on stderr.
    The runs whose server dumps it reads are locked for the whole call (:mod:`~acceptscope.ingest.epochs`):
    a concurrent ingest of another incarnation waits, and every incarnation gets its epoch in startup order.
    """
    if run_id is not None:
        check_run_id(run_id)
    p = _plan(paths, run_id)
    note = lambda rid: console.print(epochs.wait_message(rid), markup=False, highlight=False)  # noqa: E731
    with epochs.run_locks(_lock_path(store), p["server_runs"], wait_note=note):
        return _ingest_planned(p, store, progress, temperature, on_file)


def _ingest_planned(p: dict, store: Optional[IngestStore], progress: bool, temperature: Optional[float],
                    on_file: Optional[Callable[[Path, str, IngestBatch], None]]) -> dict:
    todo, plan, refused = p["todo"], p["plan"], p["refused"]
    ctx = _Context(store, sink=lambda part: account(part, final=False))
    ctx.place_epochs(plan)
    for rid, g in plan.gamma.items():
        ctx.gamma.setdefault(rid, g)  # what the server's documents establish, before any one of them is read
    # written rows: the writer counts what its flushes inserted
    offered: Counter = Counter()
    dups: Counter = Counter()
    reasons: Counter = Counter()
    reject_lines: list[str] = []
    rejects_found = rejects_not_stored = 0
    per_file = []
    t0 = time.perf_counter()
    writer = _bulk_writer(store) if store is not None else None
    bar = None
    if progress:
        bar = Progress(TextColumn("[bold]ingest"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                       TextColumn("{task.description}"), console=console, transient=True)
        bar.start()
        task = bar.add_task("", total=len(todo))
    cur: dict = {}  # the file being read: its path, run, row counts so far

    def account(batch: IngestBatch, final: bool) -> None:
        """Count and write rows as they come (a server dump hands them over a chunk at a time)."""
        nonlocal rejects_found, rejects_not_stored
        f, rid = cur["path"], cur["run_id"]
        tables_out = batch.storable(str(f), rid) if store is not None and batch else {}
        for name, n in batch.counts().items():
            offered[name] += n
            cur["rows"][name] = cur["rows"].get(name, 0) + n
        if final:
            rejects_found += batch.rejects_total()
            rejects_not_stored += batch.rejects_dropped
            for name, n in batch.duplicates.items():
                dups[name] += n
            for r in batch.rejects:
                reasons[reason_family(r["reason"])] += 1
                if len(reject_lines) < 1000:
                    reject_lines.append(format_reject(r))
        if tables_out and writer is not None:
            writer.append_many(tables_out)  # a chunk's tables land in one transaction
        if bar is not None and not final:  # a big dump: its request-steps so far, a chunk at a time
            bar.update(task, description=f"{_plain(f.name)}: {cur['rows'].get('request_steps', 0):,} request-steps")

    notes = list(plan.notes)
    runs_here = p["runs"]
    inserted: dict[str, int] = {}

    def closing_writes() -> None:
        """Epoch maps, run marks and table links, then the rows written (each open of the file costs
        ~0.05 CPU-s: the nested connects reuse the caller's connection)."""
        ctx.record_epochs()
        if store is None:
            return
        store.mark_complete([f["run_id"] for f in per_file])  # (reached only when no file aborted the call)
        if not store.read_only:
            run_dirs: dict[str, set] = {}
            for f, k in todo:
                if k == "server_info":
                    run_dirs.setdefault(plan.run_of[f], set()).add(str(f.parent))
            notes.extend(link_run_tables(store, runs_here, run_dirs=run_dirs, temperature=temperature))
        if writer is not None:
            inserted.update(writer.stats()["rows_inserted"])

    closed = False
    try:
        for f, kind in todo:
            rid = plan.run_of[f]
            cur.update(path=f, run_id=rid, rows={})
            if bar is not None:
                bar.update(task, description=_plain(f.name))
            batch = _read_one(f, kind, rid, ctx, refused)
            account(batch, final=True)
            counts = {k: v for k, v in cur["rows"].items() if v}
            per_file.append({"path": str(f), "kind": kind, "run_id": rid, "rows": counts,
                             "rejects": batch.rejects_total(), "duplicates": dict(batch.duplicates)})
            if on_file is not None:
                on_file(f, kind, batch)
            if bar is not None:
                bar.advance(task)
        if writer is not None:  # the last flush and the closing writes on one connection
            writer.close(then=closing_writes)
            closed = True
    finally:
        if writer is not None:
            writer.close()  # (idempotent; on an error above, stops the thread and re-raises its failure)
        if bar is not None:
            bar.stop()
    if not closed:
        with store.connect() if _writable(store) else nullcontext():
            closing_writes()
    tables = {}
    for name in sorted(set(offered) | set(dups)):
        written = inserted.get(name, 0) if store is not None else offered[name]
        tables[name] = {
            "offered": offered[name],
            "written": written,
            "duplicates_ignored": dups[name] + max(offered[name] - written, 0),
        }
    return {
        "files": per_file,
        "runs": runs_here,
        "notes": notes,
        "skipped": p["skipped"],
        "empty": p["empty"],
        "tables": tables,
        "rejects": {"count": rejects_found, "not_stored": rejects_not_stored, "top_reasons": reasons.most_common(5), "messages": reject_lines},
        "seconds": round(time.perf_counter() - t0, 3),
    }
