"""SPS (steps-per-second) cost tables in both SGLang 0.5.23 formats.

* 1-D diagonal table: ``{"sample_batch_tokens":[int...],"sample_steps_per_sec":[float...],
  "max_batch_tokens":int}``; ``lookup(B)`` is a floor step function (clamped at both ends).
* Additive table: ``{"bias_seconds":f,"bs_probes":[int...],"alpha_seconds":[...],
  "m_probes":[int...],"theta_seconds":[...]}``; ``step_time(N, M) = bias + interp(alpha, N)
  + interp(theta, N + M)`` with linear interpolation clamped at both ends.

This is the one SPS table model (the engine's scheduler and clock, the estimators' planner
and cost fit, the ingest of ``sps_tables``) and :func:`sps_problem` the one validator of
SGLang's invariants (numpy and msgspec only, no torch).

Byte conventions follow SGLang's msgspec encoder: compact JSON, fields in declaration order,
probes written as JSON ints (msgspec is strict about int fields). SGLang's loader picks the
additive decoder iff the raw text contains ``"bias_seconds"``; :func:`write_sps` refuses to
write a 1-D table whose text would contain that substring.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Optional, Union

import msgspec
import numpy as np

from acceptscope.outputs import atomic_write

ADDITIVE_MARKER = '"bias_seconds"'


def sps_kind(text: str | bytes) -> str:
    """'additive' or 'diagonal', decided as SGLang 0.5.23's loader decides it (a substring test)."""
    marker = ADDITIVE_MARKER.encode() if isinstance(text, bytes) else ADDITIVE_MARKER
    return "additive" if marker in text else "diagonal"


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_num(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def describe_number(v: Any) -> str:
    """A short reason for a bad number: 'NaN', 'inf', '-inf' or its repr (every reject reason uses it)."""
    if isinstance(v, float) and not math.isfinite(v):
        return "NaN" if math.isnan(v) else ("inf" if v > 0 else "-inf")
    return repr(v)


def _probe_problem(obj: dict, name: str, minimum: int) -> Optional[tuple[str, str]]:
    p = obj.get(name)
    if not isinstance(p, list) or not p:
        return name, "required: a non-empty list of ints"
    for k, v in enumerate(p):
        if not _is_int(v):
            return f"{name}[{k}]", f"expected a JSON int, got {v!r} (SGLang's msgspec decoder is strict)"
        if v < minimum:
            return f"{name}[{k}]", f"{v} < {minimum}"
        if k and v <= p[k - 1]:
            return f"{name}[{k}]", f"{v} <= {p[k - 1]}: probes must be strictly increasing"
    return None


def _value_problem(obj: dict, name: str, n: int, positive: bool) -> Optional[tuple[str, str]]:
    v = obj.get(name)
    if not isinstance(v, list):
        return name, "required: a list of numbers"
    if len(v) != n:
        return name, f"length {len(v)} != number of probes {n}"
    for k, x in enumerate(v):
        if not _is_num(x) or not math.isfinite(x):
            return f"{name}[{k}]", describe_number(x) if _is_num(x) else f"expected a number, got {x!r}"
        if positive and x <= 0:
            return f"{name}[{k}]", f"{x!r} must be > 0"
    return None


def sps_problem(obj: Any, kind: str) -> Optional[tuple[str, str]]:
    """The first ``(field, reason)`` SGLang 0.5.23 would refuse this table for, else None.

    The one validator: :func:`parse_sps`, the table constructors and the ``sps_tables``
    ingest all call it, so a table is accepted by one of them iff by all of them.
    """
    if not isinstance(obj, dict):
        return "$", f"expected an object, got {type(obj).__name__}"
    if kind == "diagonal":
        err = _probe_problem(obj, "sample_batch_tokens", 1)
        if err:
            return err
        probes = obj["sample_batch_tokens"]
        err = _value_problem(obj, "sample_steps_per_sec", len(probes), True)
        if err:
            return err
        mbt = obj.get("max_batch_tokens")
        if not _is_int(mbt):
            return "max_batch_tokens", f"expected a JSON int, got {mbt!r}"
        if mbt < probes[-1]:
            return "max_batch_tokens", f"{mbt} < largest probe {probes[-1]}"
        return None
    bias = obj.get("bias_seconds")
    if not _is_num(bias) or not math.isfinite(bias) or bias <= 0:
        return "bias_seconds", f"{describe_number(bias)}: bias_seconds must be > 0"
    for probes_name, values_name in (("bs_probes", "alpha_seconds"), ("m_probes", "theta_seconds")):
        err = _probe_problem(obj, probes_name, -(2**62))
        if err:
            return err
        err = _value_problem(obj, values_name, len(obj[probes_name]), False)
        if err:
            return err
    return None


def _plain(v: Any) -> Any:
    """numpy scalars (a fit's probes) as the Python numbers JSON would give."""
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v.item() if isinstance(v, np.generic) else v


def _check(table) -> None:
    err = sps_problem({k: _plain(v) for k, v in asdict(table).items()}, table.kind)
    if err:
        raise ValueError(f"{table.kind} SPS table: field {err[0]}: {err[1]}")


def _scalar_or_array(x: np.ndarray):
    return float(x) if x.ndim == 0 else x


@dataclass(frozen=True)
class SpsTable1D:
    """Diagonal table: steps/sec sampled at total verify-batch token counts."""

    sample_batch_tokens: list[int]
    sample_steps_per_sec: list[float]
    max_batch_tokens: int

    kind = "diagonal"

    def __post_init__(self) -> None:
        _check(self)

    @property
    def uninitialized(self) -> bool:
        """SGLang treats a table with <= 1 probe as 'no table' (verify-all)."""
        return len(self.sample_batch_tokens) <= 1

    def lookup(self, batch_tokens):
        """Steps/sec at ``batch_tokens`` (floor step function, clamped; vectorised)."""
        probes = np.asarray(self.sample_batch_tokens, np.float64)
        i = np.clip(np.searchsorted(probes, np.asarray(batch_tokens, np.float64), side="right") - 1, 0, probes.size - 1)
        return _scalar_or_array(np.asarray(self.sample_steps_per_sec, np.float64)[i])

    def step_seconds(self, num_reqs, budget):
        """Step time for ``num_reqs`` requests and ``budget`` extra verify tokens (vectorised)."""
        sps = np.asarray(self.lookup(np.asarray(num_reqs, np.float64) + np.asarray(budget, np.float64)))
        with np.errstate(divide="ignore"):
            return _scalar_or_array(np.where(sps > 0, 1.0 / np.where(sps > 0, sps, 1.0), np.inf))

    def to_json(self) -> str:
        return msgspec.json.encode(
            {
                "sample_batch_tokens": [int(x) for x in self.sample_batch_tokens],
                "sample_steps_per_sec": [float(x) for x in self.sample_steps_per_sec],
                "max_batch_tokens": int(self.max_batch_tokens),
            }
        ).decode("utf-8")


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
        _check(self)

    def step_seconds(self, num_reqs, budget):
        """``bias + interp(alpha, N) + interp(theta, N + M)``, clamped-linear (vectorised)."""
        n = np.asarray(num_reqs, np.float64)
        b = n + np.asarray(budget, np.float64)
        return _scalar_or_array(self.bias_seconds + np.interp(n, self.bs_probes, self.alpha_seconds)
                                + np.interp(b, self.m_probes, self.theta_seconds))

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


def table_from_obj(obj: dict, kind: str) -> SpsTable:
    """A validated table from a decoded JSON object of the given kind."""
    if kind == "additive":
        return SpsTableAdditive(float(obj["bias_seconds"]), list(obj["bs_probes"]),
                                [float(x) for x in obj["alpha_seconds"]], list(obj["m_probes"]),
                                [float(x) for x in obj["theta_seconds"]])
    return SpsTable1D(list(obj["sample_batch_tokens"]), [float(x) for x in obj["sample_steps_per_sec"]],
                      int(obj["max_batch_tokens"]))


def parse_sps(text: str, source: str = "<string>") -> SpsTable:
    """Parse either format, choosing it by SGLang's rule (substring ``"bias_seconds"``)."""
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: line {e.lineno}: invalid JSON: {e.msg}") from None
    kind = sps_kind(text)
    err = sps_problem(obj, kind)
    if err:
        raise ValueError(f"{source}: line 1: field {err[0]}: {kind} SPS table: {err[1]}")
    return table_from_obj(obj, kind)


def load_sps(path: str | Path) -> SpsTable:
    p = Path(path)
    return parse_sps(p.read_text(encoding="utf-8"), str(p))


def write_sps(table: SpsTable, path: str | Path) -> str:
    """Write in SGLang's byte convention; returns the sha256 of the bytes written."""
    text = table.to_json()
    if isinstance(table, SpsTable1D) and ADDITIVE_MARKER in text:  # pragma: no cover - impossible by construction
        raise ValueError("a 1-D SPS file must never contain the substring \"bias_seconds\"")
    atomic_write(path, text)  # a kill or a full disk leaves the old table whole
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def table_hash(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
