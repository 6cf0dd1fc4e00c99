"""``torch.normal`` with tensor mean and/or std (#405): the reparametrisation of VAEs and
noise with a per-element scale.

The CPU kernel (``normal_impl_`` in aten/src/ATen/native/DistributionTemplates.h) fills the
output with ``normal_(0, 1)`` from the generator, then multiplies by std and adds the mean;
this does the same with the device's ``normal_`` (which torch-directml has), so with the same
generator state it draws the same numbers as the CPU. The output takes the dtype of the tensor
argument (``mean`` for ``Tensor_Tensor``), like the CPU kernel, and a negative std raises as
there (one scalar read per call, which CUDA makes too).
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlshim.kernels.decompositions.base import Decomposition

Tensor = torch.Tensor


def _check_std(std: Tensor) -> None:
    # CPU and CUDA check this too (CHECK_NORMAL_TENSOR_STD): one scalar read per call.
    if std.numel() and bool(torch.lt(std.min(), 0).item()):
        raise RuntimeError("normal expects all elements of std >= 0.0")


def _standard_normal(shape, like: Tensor, generator: Optional[torch.Generator]) -> Tensor:
    out = torch.empty(shape, dtype=like.dtype, device=like.device)
    return out.normal_(0.0, 1.0, generator=generator)


def normal_tensor_tensor(mean: Tensor, std: Tensor, *,
                         generator: Optional[torch.Generator] = None) -> Tensor:
    _check_std(std)
    shape = torch.broadcast_shapes(mean.shape, std.shape)
    return _standard_normal(shape, mean, generator).mul_(std).add_(mean)


def normal_tensor_float(mean: Tensor, std: float = 1.0, *,
                        generator: Optional[torch.Generator] = None) -> Tensor:
    if std < 0:
        raise RuntimeError(f"normal expects std >= 0.0, but found std {std}")
    return _standard_normal(mean.shape, mean, generator).mul_(std).add_(mean)


def normal_float_tensor(mean: float, std: Tensor, *,
                        generator: Optional[torch.Generator] = None) -> Tensor:
    _check_std(std)
    return _standard_normal(std.shape, std, generator).mul_(std).add_(mean)


DECOMPOSITIONS = (
    Decomposition("aten::normal.Tensor_Tensor", (405,), "sampling (`torch.normal(mean, std)`: VAE "
                  "reparametrisation)", "`normal_(0, 1)` on the device, `mul_(std)`, `add_(mean)` "
                  "(the CPU kernel's order: same numbers from the same generator)",
                  normal_tensor_tensor),
    Decomposition("aten::normal.Tensor_float", (405,), "sampling (`torch.normal(mean_tensor, s)`)",
                  "as `normal.Tensor_Tensor`", normal_tensor_float),
    Decomposition("aten::normal.float_Tensor", (405,), "sampling (`torch.normal(m, std_tensor)`)",
                  "as `normal.Tensor_Tensor`", normal_float_tensor),
)
