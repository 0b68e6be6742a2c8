"""Sequential Temperature Scaling as SGLang 0.5.23 applies it: ``c_k = sigmoid(z_k / T_k)``.

The JSON file format is SGLang's ``DSparkStsCalibration`` (msgspec, ``omit_defaults``):
``{"temperatures":[...],"dataset":"...","num_samples":N,"ece_before":[...],"ece_after":[...]}``.
Unknown keys are ignored on load (as SGLang does), defaults are omitted on write, and a
table whose length differs from gamma is refused with SGLang's "refit" hint.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Sequence

import msgspec
import torch


@dataclass(frozen=True)
class StsTable:
    temperatures: list[float]
    dataset: str = ""
    num_samples: int = 0
    ece_before: list[float] = field(default_factory=list)
    ece_after: list[float] = field(default_factory=list)

    def __post_init__(self) -> None:
        if not self.temperatures:
            raise ValueError("STS table requires at least one temperature")
        bad = [t for t in self.temperatures if not (t > 0)]
        if bad:
            raise ValueError(f"STS temperatures must all be > 0, got {self.temperatures}")

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
        if len(self.temperatures) != gamma:
            raise ValueError(
                f"{source}: has {len(self.temperatures)} temperatures but gamma={gamma}; "
                f"refit the table for gamma={gamma}"
            )

    def tensor(self) -> torch.Tensor:
        return torch.tensor(self.temperatures, dtype=torch.float32)


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
    if not isinstance(temps, list) or not all(isinstance(t, (int, float)) and not isinstance(t, bool) for t in temps):
        raise ValueError(f"{source}: line 1: field temperatures: expected a list of numbers, got {temps!r}")
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
    Path(path).write_text(text, encoding="utf-8")
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def file_sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def calibrate(confidence_logits: torch.Tensor, temperatures: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """c_k = sigmoid(z_k / T_k), computed in float32 like SGLang's confidence head.

    Survival is the cumprod of these: ``estimators.calibration.survival`` is the one survival
    function (numpy); the runner takes ``torch.cumprod`` of this tensor on the device.
    """
    t = torch.as_tensor(temperatures, dtype=torch.float32, device=confidence_logits.device)
    return torch.sigmoid(confidence_logits.float() / t)
