"""GradScaler's two operators, which torch-directml 0.2.5 runs on the CPU (facts file).

* ``_amp_foreach_non_finite_check_and_unscale_`` (``scaler.unscale_`` and ``scaler.step``, every
  step of float16 training; dmlshim's scaler keeps its scale on the host, the gradients are on
  the device): for each gradient, multiply in place by ``inv_scale``, and set ``found_inf`` to 1
  where any element is NaN or infinite (CUDA's kernel does both in one pass; here
  ``isnan``/``isinf``, ``logical_or``, ``any`` and ``maximum`` into ``found_inf``).
* ``_amp_update_scale_`` (``scaler.update``) for a scale that lives on the device (a scaler
  built for ``"privateuseone"`` itself): CUDA's branchy scalar update written as ``where``
  selections, so it needs no host read. Products are float32 ones: equal to torch's (which
  multiplies in double and rounds) for the default factors (powers of two) and within one
  float32 rounding otherwise.

Everything stays on the device: no host read, no CPU round trip.
"""

from __future__ import annotations

from typing import List

import torch

from dmlshim.kernels.decompositions.base import Decomposition

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


def amp_update_scale_(self: Tensor, growth_tracker: Tensor, found_inf: Tensor,
                      scale_growth_factor: float, scale_backoff_factor: float,
                      growth_interval: int) -> Tensor:
    # torch (AmpKernels): if found_inf: scale *= backoff, tracker = 0; else tracker + 1 reaching
    # the interval grows the scale (only to a finite value) and resets the tracker.
    inf = found_inf.ne(0)
    successful = growth_tracker + 1
    grow = torch.logical_and(torch.logical_not(inf), successful.eq(growth_interval))
    grown = self * scale_growth_factor
    finite = torch.logical_not(torch.logical_or(torch.isnan(grown), torch.isinf(grown)))
    kept = torch.where(torch.logical_and(grow, finite), grown, self)
    new_scale = torch.where(inf, self * scale_backoff_factor, kept)
    keep_count = torch.logical_not(torch.logical_or(inf, grow)).to(successful.dtype)
    self.copy_(new_scale)
    growth_tracker.copy_(successful * keep_count)
    return self


DECOMPOSITIONS = (
    Decomposition("aten::_amp_foreach_non_finite_check_and_unscale_", (), "mixed precision "
                  "(`GradScaler.unscale_`/`step`)", "`isnan`, `isinf`, `logical_or`, `any`, "
                  "`mul_`, `maximum`", amp_foreach_non_finite_check_and_unscale_),
    Decomposition("aten::_amp_update_scale_", (), "mixed precision (`GradScaler.update` with "
                  "the scale on the device)", "`ne`, `eq`, `add`, `mul`, `isnan`, `isinf`, "
                  "`logical_*`, `where`, `copy_`", amp_update_scale_),
)
