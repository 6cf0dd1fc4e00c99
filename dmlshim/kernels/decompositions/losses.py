"""``binary_cross_entropy`` (#411): ``nn.BCELoss`` / ``F.binary_cross_entropy``, a common loss
(GAN discriminators, VAE reconstructions, multi-label heads), forward and backward; and
``huber_loss`` (``nn.HuberLoss``; ``nn.SmoothL1Loss`` has torch-directml kernels).

The formulas are the CPU kernel's (aten/src/ATen/native/Loss.cpp): log terms clamped at -100,
the gradient's denominator at 1e-12. The CPU kernel rejects inputs outside [0, 1]; so does this
one, at the price of one scalar read from the device per call (CUDA asserts on the device).
"""

from __future__ import annotations

from typing import Optional

import torch

from dmlshim.kernels.decompositions.base import Decomposition, reduce_loss, write_out

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


def huber_loss(self: Tensor, target: Tensor, reduction: int = _REDUCTION_MEAN,
               delta: float = 1.0) -> Tensor:
    # The CPU kernel: 0.5 z^2 where |z| < delta, else delta (|z| - 0.5 delta)
    z = torch.abs(self - target)
    loss = torch.where(torch.lt(z, delta), z * z * 0.5, (z - 0.5 * delta) * delta)
    return reduce_loss(loss, reduction)


def huber_loss_backward_out(grad_output: Tensor, self: Tensor, target: Tensor, reduction: int,
                            delta: float, *, grad_input: Tensor) -> Tensor:
    # The CPU kernel's gradient: z, clamped to [-delta, delta], times grad (divided by numel
    # for the mean)
    grad = torch.clamp(self - target, -delta, delta) * grad_output
    if reduction == _REDUCTION_MEAN:
        grad = grad / self.numel()
    return write_out(grad_input, grad)


DECOMPOSITIONS = (
    Decomposition("aten::binary_cross_entropy", (411,), "losses (`nn.BCELoss`)",
                  "the CPU kernel's formula from `log`, `log1p`, `clamp_min`, `mul`, `sub`, "
                  "`mean`/`sum`", binary_cross_entropy),
    Decomposition("aten::binary_cross_entropy_backward", (411,), "losses backward",
                  "the CPU kernel's formula from element-wise ops", binary_cross_entropy_backward),
    Decomposition("aten::huber_loss", (), "losses (`nn.HuberLoss`, `F.huber_loss`)",
                  "`sub`, `abs`, `lt`, `mul`, `where`, `mean`/`sum`", huber_loss),
    Decomposition("aten::huber_loss_backward.out", (), "losses backward (Huber)",
                  "`sub`, `clamp`, `mul`, `div`", huber_loss_backward_out),
)
