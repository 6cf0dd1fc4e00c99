"""What a decomposition is, and the helpers the kernels of every area share (the area modules
import this, the package imports the areas)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Tuple

import torch


@dataclass(frozen=True)
class Decomposition:
    """One operator computed on the device instead of torch-directml's CPU fallback."""

    op: str  # schema name with overload, as torch-directml's warning names it: "aten::x.out"
    issues: Tuple[int, ...]  # microsoft/DirectML issue numbers (empty: not reported there)
    area: str  # the training path it sits on, for the table of docs/cpu-fallbacks.md
    replaced_by: str  # what computes it instead (ops torch-directml implements)
    kernel: Callable
    # register when this operator falls back, rather than ``op`` itself: a ``_foreach_*``
    # operator has a composite that loops over it (one kernel call per step, not per tensor)
    when: str = ""

    @property
    def name(self) -> str:
        """The name ``torch.library`` registers: ``"x.out"``."""
        return self.op.split("::", 1)[1]


def write_out(out: torch.Tensor, value: torch.Tensor) -> torch.Tensor:
    """``out.copy_(value)``; returns ``out``.

    torch-directml cannot resize a device tensor (``resize_`` keeps the element count, its
    ``out=`` kernels leave a wrongly sized output as it was): PyTorch's functional forms hand
    these kernels an output of the final shape, and a caller's ``out=`` of another shape is
    refused here with what to do, instead of the silently empty result the wheel would give.
    """
    if out.shape != value.shape:
        raise RuntimeError(
            f"dmlshim: an out= tensor of shape {list(out.shape)} for a result of shape "
            f"{list(value.shape)} on DirectML, which cannot resize device tensors; pass an "
            "out= tensor of the result's shape (or call the function without out=)")
    return out.copy_(value)


def reduce_loss(loss: torch.Tensor, reduction: int) -> torch.Tensor:
    """at::Reduction: 0 none, 1 mean, 2 sum."""
    if reduction == 1:
        return loss.mean()
    if reduction == 2:
        return loss.sum()
    return loss
