"""Which DP rank a state of a /server_info document is: watermarks, fingerprints and the matching.

SGLang lists ``internal_states`` in arrival order, without a rank id. Each state is matched to the
rank whose watermark record it still holds (same content fingerprint), else to the rank it continues
(the rids of its first record overlap the rank's last ones), else the server restarted.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

import msgspec
import numpy as np

from acceptscope.ingest.server_info_records import ReqDetail, State, StepRecord

__all__ = ["Rank", "Seen", "fingerprint", "fp", "rids_of", "record_fp", "match_states"]


class Seen:
    """forward_cts of a state's records translated so far (fast chunks as sorted arrays, exact ones in a set)."""

    def __init__(self) -> None:
        self.arrays: list[np.ndarray] = []
        self.set: set[int] = set()
        self.max = -1

    def add_sorted(self, f: np.ndarray) -> None:
        if len(f):
            self.arrays.append(f)
            self.max = max(self.max, int(f[-1]))

    def add(self, x: int) -> None:
        self.set.add(x)
        self.max = max(self.max, x)

    def __contains__(self, x: int) -> bool:
        if x in self.set:
            return True
        for f in self.arrays:
            i = int(np.searchsorted(f, x))
            if i < len(f) and f[i] == x:
                return True
        return False


def fingerprint(h: StepRecord, reqs: Optional[list[ReqDetail]]) -> tuple:
    """Content fingerprint of one record: tells 'the same record' from 'same forward_ct, new server'."""
    rq = frozenset((r.rid if r.rid is not None else f"pool:{r.req_pool_index}", r.req_pool_index, r.prefix_len,
                    r.bonus_token) for r in reqs if r is not None) if reqs else frozenset()
    return fp(h.forward_ct, h.bs, h.num_verify_tokens, h.budget, h.step_cpu_ms, rq)


def fp(fct, bs, nvt, budget, step_cpu_ms, rq) -> tuple:
    # order-free (the store keeps no row order within a step) and built from stored columns only
    return (int(fct), int(bs), int(nvt), budget, step_cpu_ms, rq)


def rids_of(reqs: Optional[list[ReqDetail]]) -> frozenset:
    if not reqs:
        return frozenset()
    return frozenset(r.rid if r.rid is not None else f"pool:{r.req_pool_index}" for r in reqs if r is not None)


@dataclass
class Rank:
    slot: int
    watermark: int = -1
    last_fp: Optional[tuple] = None
    last_rids: frozenset = frozenset()


def record_fp(s: State, j: int) -> Optional[tuple]:
    """The fingerprint of record j of a state, or None when it does not decode."""
    try:
        h = s.header(j)
    except (msgspec.DecodeError, msgspec.ValidationError):
        return None
    return fingerprint(h, s.reqs_or_none(j))


def match_states(ranks: list[Rank], states: list[State], same_server: bool = False) -> tuple[dict[int, Rank], bool]:
    """Assign each state to the rank it continues; report a restart when one cannot be.

    ``same_server`` (the payload's ``startup_time`` is the known one): a state older than
    every watermark is a replayed earlier poll, not a restart; its records are duplicates.
    """
    assignment: dict[int, Rank] = {}
    free = list(ranks)
    pending = []
    # 1) strong: the state still holds the rank's watermark record, unchanged
    for s in states:
        hit = None
        for r in free:
            if r.watermark < 0:
                continue
            j = s.find_fct(r.watermark)
            if j is not None and record_fp(s, j) == r.last_fp:
                hit = r
                break
        if hit is not None:
            assignment[id(s)] = hit
            free.remove(hit)
        else:
            pending.append(s)
    # 2) continuation after a clear/overflow: every record newer than the watermark; rid overlap
    restart = False
    for s in pending:
        first = s.first_fct()
        cands = [r for r in free if first is None or first > r.watermark]
        if not cands and same_server and s.records:
            last = s.safe_fct(len(s.records) - 1)  # an older snapshot replayed: all duplicates
            cands = sorted((r for r in free if last is not None and last <= r.watermark), key=lambda r: r.slot)
        if not cands:
            restart = True  # forward_ct went backwards (or same ct, different content)
            break
        if len(cands) > 1 and first is not None:
            j0 = next(j for j in range(len(s.records)) if s.safe_fct(j) == first)
            rids = rids_of(s.reqs_or_none(j0))
            cands.sort(key=lambda r: (-len(rids & r.last_rids), r.slot))
        assignment[id(s)] = cands[0]
        free.remove(cands[0])
    return assignment, restart

