"""Which epoch an incarnation of a server is: epochs in ``startup_time`` order, whatever order or
how many processes ingest the dumps.

Why: two ``acceptscope ingest`` processes, one per incarnation of one server, each resumed the run
before the other had written anything and both numbered their incarnation epoch 0; the key
``(run_id, rank, epoch, forward_ct)`` then merged them (rows dropped as duplicates, request-steps of
one incarnation pointing at the other's step headers). And sequential ingests numbered epochs in
ingest order, not start order.

The rule: a process that ingests server dumps holds a per-run lock (an ``fcntl`` byte-range lock in
``<db>.ingest.lock``, one byte per run) from placing its incarnations until its last row and the
run's epoch map are committed. Under it, :func:`place` reads the map stored in the run's
``config_json`` (``"epochs": [[startup_time, epoch], ...]``) and puts every new ``startup_time``
in its place; when an older incarnation arrives after newer ones, the stored epochs after it move
up by one in a single UPDATE per table (every row of one epoch moves together; nothing is re-pointed
to another incarnation). Epochs without a known ``startup_time`` (a restart seen only as
``forward_ct`` going backwards) travel with the incarnation before them.
"""

from __future__ import annotations

import fcntl
import json
import os
import time
import zlib
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator, Optional, Sequence

from acceptscope import schema

__all__ = ["run_locks", "place", "stored_map", "record", "LOCK_SUFFIX"]

LOCK_SUFFIX = ".ingest.lock"
_SLOTS = (1 << 31) - 1  # byte offsets a run's lock may take (a collision only serialises two runs)


def _slot(run_id: str) -> int:
    return zlib.crc32(run_id.encode("utf-8", "surrogatepass")) % _SLOTS


@contextmanager
def run_locks(db_path: Optional[Path], run_ids: Sequence[str], wait_note: Any = None) -> Iterator[None]:
    """Hold the ingest lock of each run (sorted: two processes never wait on each other in a cycle).

    ``db_path`` None (no store): nothing to lock. ``wait_note(run_id)`` is called once when another
    process holds a run's lock and this one starts waiting for it."""
    if db_path is None or not run_ids:
        yield
        return
    fd = os.open(str(db_path) + LOCK_SUFFIX, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        for rid in sorted(set(run_ids)):
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, _slot(rid))
            except OSError:
                if wait_note is not None:
                    wait_note(rid)
                fcntl.lockf(fd, fcntl.LOCK_EX, 1, _slot(rid))
        yield
    finally:
        os.close(fd)  # closing the descriptor releases every lock this process holds on the file


def _epoch_tables() -> list[schema.Table]:
    tables = [*schema.ALL_TABLES, *schema.SUMMARY_TABLES]
    return [t for t in tables if {"run_id", "epoch"} <= {c.name for c in t.columns}]


def stored_map(con: Any, run_id: str) -> tuple[dict[float, int], list[int]]:
    """The run's stored ``{startup_time: epoch}`` and the epochs its ``steps`` hold (sorted)."""
    have = [int(r[0]) for r in con.execute(
        "SELECT DISTINCT epoch FROM steps WHERE run_id = ? ORDER BY epoch", [run_id]).fetchall()]
    row = con.execute("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
    try:
        cfg = json.loads(row[0]) if row and row[0] else {}
    except (TypeError, ValueError):
        cfg = {}
    out: dict[float, int] = {}
    for pair in cfg.get("epochs") or []:
        try:
            out[float(pair[0])] = int(pair[1])
        except (TypeError, ValueError, IndexError):
            continue
    if not out and have and isinstance(cfg.get("startup_time"), (int, float)):
        out[float(cfg["startup_time"])] = have[0]  # a run stored before the map: its first incarnation
    return out, have


def _order(known: dict[float, int], have: list[int], new: Sequence[float]) -> tuple[dict[int, int], dict[float, int]]:
    """Renumbering of the stored epochs and the epochs of ``new`` startup times, in startup order."""
    by_epoch = {e: s for s, e in known.items()}
    blocks: list[list] = []  # [startup or None, [epochs...]]; unknown epochs ride with the block before them
    for e in sorted(set(have) | set(by_epoch)):
        if e in by_epoch or not blocks:
            blocks.append([by_epoch.get(e), [e]])
        else:
            blocks[-1][1].append(e)
    blocks.extend([s, []] for s in new if s not in known)
    lead = [b for b in blocks if b[0] is None]
    rest = sorted((b for b in blocks if b[0] is not None), key=lambda b: b[0])
    remap: dict[int, int] = {}
    mapping: dict[float, int] = {}
    n = 0
    for s, eps in lead + rest:
        if s is not None:
            mapping[s] = n
        for e in eps or [None]:
            if e is not None and e != n:
                remap[e] = n
            n += 1
    return remap, mapping


def place(con: Any, run_id: str, startups: Sequence[float]) -> dict[float, int]:
    """Every stored and new incarnation of ``run_id`` -> its epoch; moves stored rows when one must.

    Call under :func:`run_locks`, on a read-write connection."""
    known, have = stored_map(con, run_id)
    remap, mapping = _order(known, have, sorted(set(startups)))
    if remap:
        case = " ".join(f"WHEN {int(a)} THEN {int(b)}" for a, b in remap.items())
        con.execute("BEGIN TRANSACTION")
        try:
            for t in _epoch_tables():
                con.execute(f'UPDATE "{t.name}" SET epoch = CASE epoch {case} END '
                            f"WHERE run_id = ? AND epoch IN ({', '.join(str(int(a)) for a in remap)})", [run_id])
            _write_map(con, run_id, mapping)
            con.execute("COMMIT")
        except BaseException:
            con.execute("ROLLBACK")
            raise
    return mapping


def new_map(startups: Sequence[float]) -> dict[float, int]:
    """The epochs of a run with nothing stored yet: its incarnations in startup order (what :func:`place`
    gives on an empty file, without opening it)."""
    return _order({}, [], sorted(set(startups)))[1]


def _write_map(con: Any, run_id: str, mapping: dict[float, int]) -> None:
    row = con.execute("SELECT config_json FROM runs WHERE run_id = ?", [run_id]).fetchone()
    if row is None:
        return
    try:
        cfg = json.loads(row[0]) if row[0] else {}
    except (TypeError, ValueError):
        cfg = {}
    cfg["epochs"] = sorted([s, e] for s, e in mapping.items())
    con.execute("UPDATE runs SET config_json = ? WHERE run_id = ?", [json.dumps(cfg, sort_keys=True), run_id])


def record(con: Any, run_id: str, mapping: dict[float, int]) -> None:
    """Store the run's epoch map (merged with what is stored; the later word wins) in ``config_json``."""
    known, _ = stored_map(con, run_id)
    known.update(mapping)
    _write_map(con, run_id, known)


def wait_message(run_id: str) -> str:
    return (f"{time.strftime('%H:%M:%S')} another ingest holds run {run_id}: waiting for it to finish "
            "(epochs are placed in startup order)")
