"""Sequential Temperature Scaling as SGLang 0.5.23 applies it: ``c_k = sigmoid(z_k / T_k)``.

The JSON file format is SGLang's ``DSparkStsCalibration`` (msgspec, ``omit_defaults``):
``{"temperatures":[...],"dataset":"...","num_samples":N,"ece_before":[...],"ece_after":[...]}``.
Unknown keys are ignored on load (as SGLang does), defaults are omitted on write, and a
table whose length differs from gamma is refused with SGLang's "refit" hint.

:func:`sts_problem` is the one statement of what SGLang refuses in a table; the engine, ingest
(``acceptscope.ingest.sts_table``) and ``calibrate``'s output check all call it. The table model is
torch-free (ingest and the estimators use it without the ``[engine]`` extra); applying it to the
confidence head's logits is torch and lives in ``acceptscope.engine.sts_torch``.
"""

from __future__ import annotations

import hashlib
import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import msgspec

from acceptscope.domain.sps import describe_number
from acceptscope.outputs import atomic_write


def sts_problem(temperatures: Any, gamma: int | None = None) -> tuple[str, str] | None:
    """(field, reason) of the first thing SGLang 0.5.23 refuses in a table's temperatures, else None.

    SGLang requires a non-empty list of finite T > 0, one per draft position (its length is gamma).
    """
    if not isinstance(temperatures, list) or not temperatures:
        return "temperatures", "required: a non-empty list of positive floats"
    for k, t in enumerate(temperatures):
        if isinstance(t, bool) or not isinstance(t, (int, float)) or not math.isfinite(t) or t <= 0:
            return f"temperatures[{k}]", f"{describe_number(t)} (must be a finite T > 0)"
    if gamma is not None and len(temperatures) != gamma:
        return "temperatures", (f"gamma mismatch: {len(temperatures)} temperatures != run gamma {gamma}; "
                                f"refit the table for gamma={gamma}")
    return None


@dataclass(frozen=True)
class StsTable:
    temperatures: list[float]
    dataset: str = ""
    num_samples: int = 0
    ece_before: list[float] = field(default_factory=list)
    ece_after: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        problem = sts_problem(list(self.temperatures))
        if problem:
            raise ValueError(f"STS table: field {problem[0]}: {problem[1]}")

    def to_json(self) -> str:
        """SGLang byte convention: compact separators, fields equal to their default omitted."""
        out: dict = {"temperatures": [float(t) for t in self.temperatures]}
        if self.dataset:
            out["dataset"] = self.dataset
        if self.num_samples:
            out["num_samples"] = int(self.num_samples)
        if self.ece_before:
            out["ece_before"] = [float(x) for x in self.ece_before]
        if self.ece_after:
            out["ece_after"] = [float(x) for x in self.ece_after]
        return msgspec.json.encode(out).decode("utf-8")

    def check_gamma(self, gamma: int, source: str = "STS table") -> None:
        problem = sts_problem(list(self.temperatures), gamma)
        if problem:
            raise ValueError(f"{source}: field {problem[0]}: {problem[1]}")


def identity(gamma: int) -> StsTable:
    """No calibration: T_k = 1 (raw sigmoid)."""
    return StsTable(temperatures=[1.0] * gamma)


def parse_sts(text: str, source: str = "<string>") -> StsTable:
    try:
        obj = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"{source}: line {e.lineno}: invalid JSON: {e.msg}") from None
    if not isinstance(obj, dict):
        raise ValueError(f"{source}: line 1: field <root>: expected a JSON object")
    temps = obj.get("temperatures")
    problem = sts_problem(temps)
    if problem:
        raise ValueError(f"{source}: line 1: field {problem[0]}: {problem[1]}")
    try:
        return StsTable(
            temperatures=[float(t) for t in temps],
            dataset=str(obj.get("dataset", "")),
            num_samples=int(obj.get("num_samples", 0)),
            ece_before=[float(x) for x in obj.get("ece_before", [])],
            ece_after=[float(x) for x in obj.get("ece_after", [])],
        )
    except (TypeError, ValueError) as e:
        raise ValueError(f"{source}: line 1: {e}") from None


def load_sts(path: str | Path) -> StsTable:
    p = Path(path)
    return parse_sts(p.read_text(encoding="utf-8"), str(p))


def write_sts(table: StsTable, path: str | Path) -> str:
    """Write the table; returns the sha256 of the bytes written."""
    text = table.to_json()
    atomic_write(path, text)  # a kill or a full disk leaves the old table whole
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()
