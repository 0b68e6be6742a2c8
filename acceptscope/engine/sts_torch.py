"""STS on the device: the confidence head's ``c_k = sigmoid(z_k / T_k)`` in torch, as SGLang 0.5.23 computes it.

The table model (parse, validate, write) is ``acceptscope.domain.sts``, torch-free; this module is the
engine's use of it.
"""

from __future__ import annotations

from typing import Sequence

import torch

from acceptscope.domain.sts import StsTable


def temperatures_tensor(table: StsTable) -> torch.Tensor:
    """The table's temperatures as the float32 tensor :func:`calibrate` divides by."""
    return torch.tensor(table.temperatures, dtype=torch.float32)


def calibrate(confidence_logits: torch.Tensor, temperatures: torch.Tensor | Sequence[float]) -> torch.Tensor:
    """c_k = sigmoid(z_k / T_k), computed in float32 like SGLang's confidence head.

    Survival is the cumprod of these: ``estimators.calibration.survival`` is the one survival
    function (numpy); the runner takes ``torch.cumprod`` of this tensor on the device.
    """
    t = torch.as_tensor(temperatures, dtype=torch.float32, device=confidence_logits.device)
    return torch.sigmoid(confidence_logits.float() / t)
