"""``binary_cross_entropy`` (#411): ``nn.BCELoss`` / ``F.binary_cross_entropy``, a common loss
(GAN discriminators, VAE reconstructions, multi-label heads), forward and backward.

The formulas are the CPU kernel's (aten/src/ATen/native/Loss.cpp): log terms clamped at -100,
the gradient's denominator at 1e-12. The CPU kernel rejects inputs outside [0, 1]; so does this
one, at the price of one scalar read from the device per call (CUDA asserts on the device).
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlshim.decompositions import Decomposition, reduce_loss

Tensor = torch.Tensor
_EPSILON = 1e-12
_REDUCTION_MEAN = 1


def _check_probabilities(x: Tensor) -> None:
    if bool(torch.logical_or(torch.lt(x, 0), torch.gt(x, 1)).any().item()):
        raise RuntimeError("all elements of input should be between 0 and 1")


def binary_cross_entropy(self: Tensor, target: Tensor, weight: Optional[Tensor] = None,
                         reduction: int = _REDUCTION_MEAN) -> Tensor:
    _check_probabilities(self)
    log_x = torch.log(self).clamp_min(-100)
    log_1mx = torch.log1p(-self).clamp_min(-100)
    loss = (target - 1) * log_1mx - target * log_x
    if weight is not None:
        loss = loss * weight
    return reduce_loss(loss, reduction)


def binary_cross_entropy_backward(grad_output: Tensor, self: Tensor, target: Tensor,
                                  weight: Optional[Tensor] = None,
                                  reduction: int = _REDUCTION_MEAN) -> Tensor:
    grad = grad_output * (self - target) / ((1 - self) * self).clamp_min(_EPSILON)
    if weight is not None:
        grad = grad * weight
    if reduction == _REDUCTION_MEAN:
        grad = grad / self.numel()
    return grad


DECOMPOSITIONS = (
    Decomposition("aten::binary_cross_entropy", (411,), "losses (`nn.BCELoss`)",
                  "the CPU kernel's formula from `log`, `log1p`, `clamp_min`, `mul`, `sub`, "
                  "`mean`/`sum`", binary_cross_entropy),
    Decomposition("aten::binary_cross_entropy_backward", (411,), "losses backward",
                  "the CPU kernel's formula from element-wise ops", binary_cross_entropy_backward),
)
