"""How many steps of each recently seen rid an ingestor has numbered: ``step_index``'s memory, bounded.

Numbering a rid's steps needs the count of its steps so far. Kept for every rid of a stream, that count
grows without end: an SGLang server at batch 256 starts ~700 requests a second (25k request-steps/s at
~35 steps a request), and a dict entry per rid is ~140 bytes: 150 MB per 40M request-steps measured
(an ingest's peak went from 575 MB at 10M to 729 MB at 50M), gigabytes a day for the live poller.

SGLang's rids are unique per request, and a request's steps come close together: it decodes in
consecutive steps until it finishes, and a retracted request is re-scheduled when memory frees. So a
rid unseen for a long stretch of traffic has finished. :class:`RidStepCounts` keeps two generations
of at most ``capacity`` rids each: a lookup checks the current generation, then the previous one;
a write goes to the current one, and when it fills up the previous one is dropped. A rid is remembered
for at least ``capacity`` other rids after its last step (default 2**18: ~9M request-steps of such
traffic, minutes of a busy server); one that comes back later starts its ``step_index`` at 0 again.

    >>> counts = RidStepCounts(capacity=2)
    >>> counts.set("a", 3); counts.get("a")
    3
    >>> counts.set("b", 1); counts.set("c", 1)   # "a" and "b" move to the previous generation
    >>> counts.get("a"), len(counts)
    (3, 3)
    >>> counts.set("d", 1)   # "a" unseen for 3 other rids, "b" for 2: both forgotten
    >>> counts.get("a"), counts.get("c")
    (0, 1)
"""

from __future__ import annotations

from typing import Iterable, Sequence

import numpy as np

CAPACITY = 1 << 18  # rids per generation: at most two generations (~75 MB of dict entries) are held


class RidStepCounts:
    """Steps numbered so far per rid, for the rids seen within the last ``capacity`` others (see the module)."""

    def __init__(self, capacity: int = CAPACITY):
        if capacity < 1:
            raise ValueError(f"capacity must be at least 1, got {capacity}")
        self.capacity = capacity
        self._current: dict[str, int] = {}
        self._previous: dict[str, int] = {}

    def __len__(self) -> int:
        """Entries held (a rid in both generations counts twice): at most ``2 * capacity`` plus one batch."""
        return len(self._current) + len(self._previous)

    def get(self, rid: str) -> int:
        """The steps of ``rid`` numbered so far (0 for a rid not seen, or forgotten)."""
        n = self._current.get(rid)
        return self._previous.get(rid, 0) if n is None else n

    def get_many(self, rids: Sequence[str]) -> np.ndarray:
        """:meth:`get` of each of ``rids`` (distinct), as int64."""
        cur, prev = self._current.get, self._previous.get
        return np.fromiter((prev(u, 0) if (n := cur(u)) is None else n for u in rids), dtype=np.int64,
                           count=len(rids))

    def set(self, rid: str, n: int) -> None:
        """Record that ``rid`` has ``n`` steps numbered."""
        self._current[rid] = n
        if len(self._current) >= self.capacity:
            self._rotate()

    def set_many(self, rids: Iterable[str], counts: Iterable[int]) -> None:
        """:meth:`set` for pairs of ``rids`` and ``counts`` (Python ints: no numpy scalar kept per rid)."""
        self._current.update(zip(rids, counts))
        if len(self._current) >= self.capacity:
            self._rotate()

    def clear(self) -> None:
        """Forget every rid (a restarted server numbers its requests afresh)."""
        self._current = {}
        self._previous = {}

    def _rotate(self) -> None:
        self._previous, self._current = self._current, {}
