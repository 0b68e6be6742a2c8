"""Audit parity: did the production and audit arms commit the same tokens?

Why this matters: the audit arm (cap-accept) verifies the full block but commits
only through the scheduled window, so with the same workload and seeds it must
commit exactly what the production arm (compact) commits. Its ceiling numbers
describe production traffic only if that holds. Requests are paired by
``(workload, prompt_index, seed)``; every divergence is reported per request
with the first divergent token position and a finding kind:

* ``scheduling``     - the two arms verified different windows before (or in)
  the block that committed the divergent token: the schedule differed, so the
  sampled path may legitimately differ (batch composition, RNG consumption).
* ``nondeterminism`` - the windows were identical up to that block (or the
  divergence is in the prefill token) yet the tokens differ: numerics or RNG
  are not reproducible.
* ``length``         - one output is a prefix of the other (different stop).
* ``missing``        - the request exists in one arm only.
* ``unclassified``   - tokens differ but per-block telemetry is missing.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd

from acceptscope import schema
from acceptscope.reader import Reader

KINDS = ("scheduling", "nondeterminism", "length", "missing", "unclassified")
PAIR_KEY = ("workload", "prompt_index", "seed")


@dataclass
class Finding:
    """One request whose arms disagree."""

    kind: str
    workload: str | None
    prompt_index: int | None
    seed: int | None
    rid_a: str | None
    rid_b: str | None
    position: int | None = None  # first divergent index into output_tokens
    token_a: int | None = None
    token_b: int | None = None
    block_a: int | None = None  # block (0-based, in commit order) holding that position, arm A
    block_b: int | None = None
    windows_a: list[int] = field(default_factory=list)  # windows up to that block
    windows_b: list[int] = field(default_factory=list)

    def describe(self) -> str:
        where = f"{self.workload}#{self.prompt_index} seed={self.seed}"
        if self.kind == "missing":
            return f"{where}: present in one arm only (A={self.rid_a}, B={self.rid_b})"
        if self.kind == "length":
            return f"{where}: outputs agree up to token {self.position}, then one arm stops"
        return (f"{where}: first divergent token at position {self.position} "
                f"({self.token_a} vs {self.token_b}), {self.kind}")


@dataclass
class ParityReport:
    run_a: str
    run_b: str
    pairs: int
    identical: int
    findings: list[Finding]
    sampled: bool = False  # B replayed a sample of A's requests
    requests_a: int = 0
    unverifiable: int = 0  # pairs where an arm recorded no output tokens (neither identical nor divergent)

    @property
    def ok(self) -> bool:
        return not self.findings

    def counts(self) -> dict[str, int]:
        return {k: sum(f.kind == k for f in self.findings) for k in KINDS}

    def to_dict(self) -> dict[str, Any]:
        return {
            "run_a": self.run_a, "run_b": self.run_b, "pairs": self.pairs, "identical": self.identical,
            "ok": self.ok, "sampled": self.sampled, "requests_a": self.requests_a,
            "unverifiable": self.unverifiable, "counts": self.counts(),
            "findings": [asdict(f) for f in self.findings],
        }

    def table(self) -> pd.DataFrame:
        cols = [f.name for f in Finding.__dataclass_fields__.values()]
        return pd.DataFrame([asdict(f) for f in self.findings], columns=cols)


def first_divergence(a: Sequence[int] | None, b: Sequence[int] | None) -> int | None:
    """Index of the first differing token, len(shorter) if one is a prefix, None if equal."""
    a = np.asarray([] if a is None else a, dtype=np.int64)
    b = np.asarray([] if b is None else b, dtype=np.int64)
    n = min(len(a), len(b))
    diff = np.flatnonzero(a[:n] != b[:n])
    if diff.size:
        return int(diff[0])
    return None if len(a) == len(b) else n


def _block_of(position: int, n_output: int, acc_lens: np.ndarray) -> int | None:
    """Block holding output token ``position``; -1 for tokens before the first block (prefill)."""
    offset = n_output - int(acc_lens.sum())  # tokens produced outside decode blocks (prefill)
    p = position - offset
    if p < 0:
        return -1
    ends = np.cumsum(acc_lens)
    idx = int(np.searchsorted(ends, p, side="right"))
    return idx if idx < len(acc_lens) else None


def check_parity(reader: Any, run_a: str, run_b: str, *, classify: bool = True,
                 sampled: bool | None = None) -> ParityReport:
    """Pair the requests of two runs and report every divergence.

    ``sampled``: run B (the audit arm) replayed only a sample of run A's requests,
    so A's requests missing from B are expected; B's requests missing from A are
    still findings. ``None`` decides from the counts (B smaller than A).

    ``reader``: a :class:`acceptscope.reader.Reader` or an :class:`acceptscope.store.Store` (same
    ``query_df``).
    """
    q = reader.query_df
    req = schema.REQUESTS.name
    cols = "run_id, rid, workload, prompt_index, seed, output_tokens"
    a = q(f'SELECT {cols} FROM "{req}" WHERE run_id = ?', [run_a])
    b = q(f'SELECT {cols} FROM "{req}" WHERE run_id = ?', [run_b])
    key = list(PAIR_KEY)
    if sampled is None:
        sampled = 0 < len(b) < len(a)
    m = a.merge(b, on=key, how="right" if sampled else "outer", suffixes=("_a", "_b"), indicator="pairing")
    findings: list[Finding] = []
    identical = 0
    unverifiable = 0
    to_classify: list[tuple[Finding, int, int]] = []
    for row in m.itertuples(index=False):
        r = row._asdict()
        base = dict(workload=r["workload"], prompt_index=_int(r["prompt_index"]), seed=_int(r["seed"]),
                    rid_a=_str(r["rid_a"]), rid_b=_str(r["rid_b"]))
        if r["pairing"] != "both":
            findings.append(Finding("missing", **base))
            continue
        ta, tb = r["output_tokens_a"], r["output_tokens_b"]
        if _missing(ta) or _missing(tb):
            unverifiable += 1  # a source that does not record output tokens (e.g. some ingests)
            continue
        pos = first_divergence(ta, tb)
        if pos is None:
            identical += 1
            continue
        na, nb = len(ta if ta is not None else []), len(tb if tb is not None else [])
        if pos >= min(na, nb):
            findings.append(Finding("length", position=pos, **base))
            continue
        f = Finding("unclassified", position=pos, token_a=int(ta[pos]), token_b=int(tb[pos]), **base)
        findings.append(f)
        to_classify.append((f, na, nb))
    if classify and to_classify:
        _classify(q, run_a, run_b, to_classify)
    pairs = int((m["pairing"] == "both").sum())
    return ParityReport(run_a, run_b, pairs, identical, findings, sampled=bool(sampled), requests_a=len(a),
                        unverifiable=unverifiable)


def _classify(q: Any, run_a: str, run_b: str, items: list[tuple[Finding, int, int]]) -> None:
    rs = schema.REQUEST_STEPS.name
    rids_a = [f.rid_a for f, _, _ in items]
    rids_b = [f.rid_b for f, _, _ in items]
    sql = (f'SELECT run_id, rid, "window", acc_len FROM "{rs}" '
           "WHERE run_id = ? AND rid IN (SELECT unnest(?)) ORDER BY rid, epoch, forward_ct")
    sa = {k: g for k, g in q(sql, [run_a, rids_a]).groupby("rid")}
    sb = {k: g for k, g in q(sql, [run_b, rids_b]).groupby("rid")}
    for f, na, nb in items:
        ga, gb = sa.get(f.rid_a), sb.get(f.rid_b)
        if ga is None or gb is None:
            continue  # stays "unclassified": no per-block telemetry
        acc_a, acc_b = ga["acc_len"].to_numpy(np.int64), gb["acc_len"].to_numpy(np.int64)
        f.block_a = _block_of(f.position, na, acc_a)
        f.block_b = _block_of(f.position, nb, acc_b)
        if f.block_a == -1 or f.block_b == -1:
            f.kind = "nondeterminism"  # the prefill token does not depend on the verify schedule
            continue
        if f.block_a is None or f.block_b is None:
            continue
        f.windows_a = [int(x) for x in ga["window"].to_numpy()[: f.block_a + 1]]
        f.windows_b = [int(x) for x in gb["window"].to_numpy()[: f.block_b + 1]]
        f.kind = "nondeterminism" if f.windows_a == f.windows_b else "scheduling"


def _missing(x: Any) -> bool:
    return x is None or (not isinstance(x, (list, tuple, np.ndarray)) and pd.isna(x))


def _int(x: Any) -> int | None:
    return None if x is None or pd.isna(x) else int(x)


def _str(x: Any) -> str | None:
    return None if x is None or pd.isna(x) else str(x)


def check_path(db: str | Path, run_a: str, run_b: str) -> ParityReport:
    """Convenience: parity of two runs in a DuckDB file, read-only."""
    return check_parity(Reader(db), run_a, run_b)
