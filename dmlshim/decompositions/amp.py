"""GradScaler's unscale step: ``_amp_foreach_non_finite_check_and_unscale_`` (``scaler.unscale_``
and ``scaler.step``), on every step of float16 training with a scaler on the device.

For each gradient: multiply in place by ``inv_scale``, and set ``found_inf`` to 1 where any
element is NaN or infinite (CUDA's kernel does both in one pass; here ``isnan``/``isinf``,
``logical_or``, ``any`` and ``maximum`` into ``found_inf``, all on the device: no host read).
"""

from __future__ import annotations

from typing import List

import torch

from dmlshim.decompositions import Decomposition

Tensor = torch.Tensor


def amp_foreach_non_finite_check_and_unscale_(self: List[Tensor], found_inf: Tensor,
                                              inv_scale: Tensor) -> None:
    flags = []
    for grad in self:
        flags.append(torch.logical_or(torch.isnan(grad), torch.isinf(grad)).any().reshape(1))
        grad.mul_(inv_scale)
    if flags:
        seen = torch.cat(flags).any().to(found_inf.dtype)
        found_inf.copy_(torch.maximum(found_inf, seen))


DECOMPOSITIONS = (
    Decomposition("aten::_amp_foreach_non_finite_check_and_unscale_", (), "mixed precision "
                  "(`GradScaler.unscale_`/`step`)", "`isnan`, `isinf`, `logical_or`, `any`, "
                  "`mul_`, `maximum`", amp_foreach_non_finite_check_and_unscale_),
)
