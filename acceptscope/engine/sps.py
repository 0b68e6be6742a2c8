"""SPS (steps-per-second) cost tables in both SGLang 0.5.23 formats.

* 1-D diagonal table: ``{"sample_batch_tokens":[int...],"sample_steps_per_sec":[float...],
  "max_batch_tokens":int}``; ``lookup(B)`` is a floor step function (clamped at both ends).
* Additive table: ``{"bias_seconds":f,"bs_probes":[int...],"alpha_seconds":[...],
  "m_probes":[int...],"theta_seconds":[...]}``; ``step_time(N, M) = bias + interp(alpha, N)
  + interp(theta, N + M)`` with linear interpolation clamped at both ends.

Byte conventions follow SGLang's msgspec encoder: compact JSON, fields in declaration order,
probes written as JSON ints (msgspec is strict about int fields). SGLang's loader picks the
additive decoder iff the raw text contains ``"bias_seconds"``; :func:`write_sps` refuses to
write a 1-D table whose text would contain that substring.
"""

from __future__ import annotations

import bisect
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Union

import msgspec

ADDITIVE_MARKER = '"bias_seconds"'


def _strictly_increasing(xs: list[int]) -> bool:
    return all(a < b for a, b in zip(xs, xs[1:]))


@dataclass(frozen=True)
class SpsTable1D:
    """Diagonal table: steps/sec sampled at total verify-batch token counts."""

    sample_batch_tokens: list[int]
    sample_steps_per_sec: list[float]
    max_batch_tokens: int

    kind = "diagonal"

    def __post_init__(self) -> None:
        if not self.sample_batch_tokens:
            raise ValueError("1-D SPS table needs at least one probe")
        if not _strictly_increasing(self.sample_batch_tokens):
            raise ValueError(f"sample_batch_tokens must be strictly increasing, got {self.sample_batch_tokens}")
        if len(self.sample_batch_tokens) != len(self.sample_steps_per_sec):
            raise ValueError("sample_batch_tokens and sample_steps_per_sec differ in length")
        if self.max_batch_tokens < self.sample_batch_tokens[-1]:
            raise ValueError("max_batch_tokens must be >= the largest probe")

    @property
    def uninitialized(self) -> bool:
        """SGLang treats a table with <= 1 probe as 'no table' (verify-all)."""
        return len(self.sample_batch_tokens) <= 1

    def lookup(self, batch_tokens: int) -> float:
        i = bisect.bisect_right(self.sample_batch_tokens, batch_tokens) - 1
        i = max(0, min(i, len(self.sample_batch_tokens) - 1))
        return self.sample_steps_per_sec[i]

    def step_seconds(self, num_reqs: int, budget: int) -> float:
        sps = self.lookup(num_reqs + budget)
        return 1.0 / sps if sps > 0 else float("inf")

    def to_json(self) -> str:
        return msgspec.json.encode(
            {
                "sample_batch_tokens": [int(x) for x in self.sample_batch_tokens],
                "sample_steps_per_sec": [float(x) for x in self.sample_steps_per_sec],
                "max_batch_tokens": int(self.max_batch_tokens),
            }
        ).decode("utf-8")


def interp_clamped(xs: list[int], ys: list[float], x: float) -> float:
    if x <= xs[0]:
        return ys[0]
    if x >= xs[-1]:
        return ys[-1]
    hi = bisect.bisect_right(xs, x)
    lo = hi - 1
    return ys[lo] + (x - xs[lo]) / (xs[hi] - xs[lo]) * (ys[hi] - ys[lo])


@dataclass(frozen=True)
class SpsTableAdditive:
    """Additive table: constant + request-count cost + total-verify-token cost (seconds)."""

    bias_seconds: float
    bs_probes: list[int]
    alpha_seconds: list[float]
    m_probes: list[int]
    theta_seconds: list[float]

    kind = "additive"
    uninitialized = False

    def __post_init__(self) -> None:
        for name, probes, vals in (("bs", self.bs_probes, self.alpha_seconds), ("m", self.m_probes, self.theta_seconds)):
            if not probes:
                raise ValueError(f"additive SPS table needs {name}_probes")
            if not _strictly_increasing(probes):
                raise ValueError(f"{name}_probes must be strictly increasing, got {probes}")
            if len(probes) != len(vals):
                raise ValueError(f"{name}_probes and its values differ in length")
        if not self.bias_seconds > 0:
            raise ValueError(f"bias_seconds must be > 0, got {self.bias_seconds}")

    def step_seconds(self, num_reqs: int, budget: int) -> float:
        return (
            self.bias_seconds
            + interp_clamped(self.bs_probes, self.alpha_seconds, float(num_reqs))
            + interp_clamped(self.m_probes, self.theta_seconds, float(num_reqs + budget))
        )

    def to_json(self) -> str:
        return msgspec.json.encode(
            {
                "bias_seconds": float(self.bias_seconds),
                "bs_probes": [int(x) for x in self.bs_probes],
                "alpha_seconds": [float(x) for x in self.alpha_seconds],
                "m_probes": [int(x) for x in self.m_probes],
                "theta_seconds": [float(x) for x in self.theta_seconds],
            }
        ).decode("utf-8")


SpsTable = Union[SpsTable1D, SpsTableAdditive]


def uninitialized_table(max_batch_tokens: int) -> SpsTable1D:
    """What SGLang builds when no table is given: one probe, verify-all."""
    return SpsTable1D([1], [1.0], int(max_batch_tokens))


def _field_error(source: str, field: str, msg: str) -> ValueError:
    return ValueError(f"{source}: line 1: field {field}: {msg}")


def _int_list(obj: dict, key: str, source: str) -> list[int]:
    v = obj.get(key)
    if not isinstance(v, list) or not all(isinstance(x, int) and not isinstance(x, bool) for x in v):
        raise _field_error(source, key, f"expected a list of JSON integers, got {v!r}")
    return v


def _float_list(obj: dict, key: str, source: str) -> list[float]:
    v = obj.get(key)
    if not isinstance(v, list) or not all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in v):
        raise _field_error(source, key, f"expected a list of numbers, got {v!r}")
    return [float(x) for x in v]


def parse_sps(text: str, source: str = "<string>") -> SpsTable:
    """Parse either format, choosing it by SGLang's rule (substring ``"bias_seconds"``)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: line {e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise _field_error(source, "<root>", "expected a JSON object")
    try:
        if ADDITIVE_MARKER in text:
            bias = obj.get("bias_seconds")
            if not isinstance(bias, (int, float)) or isinstance(bias, bool):
                raise _field_error(source, "bias_seconds", f"expected a number, got {bias!r}")
            return SpsTableAdditive(
                float(bias),
                _int_list(obj, "bs_probes", source),
                _float_list(obj, "alpha_seconds", source),
                _int_list(obj, "m_probes", source),
                _float_list(obj, "theta_seconds", source),
            )
        mbt = obj.get("max_batch_tokens")
        if not isinstance(mbt, int) or isinstance(mbt, bool):
            raise _field_error(source, "max_batch_tokens", f"expected a JSON integer, got {mbt!r}")
        return SpsTable1D(
            _int_list(obj, "sample_batch_tokens", source), _float_list(obj, "sample_steps_per_sec", source), mbt
        )
    except ValueError as e:
        if str(e).startswith(source):
            raise
        raise ValueError(f"{source}: line 1: {e}") from None


def load_sps(path: str | Path) -> SpsTable:
    p = Path(path)
    return parse_sps(p.read_text(encoding="utf-8"), str(p))


def write_sps(table: SpsTable, path: str | Path) -> str:
    """Write in SGLang's byte convention; returns the sha256 of the bytes written."""
    text = table.to_json()
    if isinstance(table, SpsTable1D) and ADDITIVE_MARKER in text:  # pragma: no cover - impossible by construction
        raise ValueError("a 1-D SPS file must never contain the substring \"bias_seconds\"")
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    Path(path).write_text(text, encoding="utf-8")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def table_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
