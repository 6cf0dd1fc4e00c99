"""Guards nll_none (#739, #740) and nll_ignore (the software adapter): ``nll_loss`` /
``cross_entropy``'s forward and backward, input fixes above autograd.
"""

from __future__ import annotations

import functools
from typing import Optional, Tuple

import torch

from dmlshim import current
from dmlshim.kernels.guards.passthrough import ARANGE, EXCLUDE, INCLUDE, NOT_HERE, OTHER

Tensor = torch.Tensor
aten = torch.ops.aten

# -- nll_loss / cross_entropy ---------------------------------------------------------------
# The wheel: the backward with reduction="none" uses grad_output[0] for every row (#739, #740);
# seen on the software adapter: a negative ignore_index is not ignored (-100 with >= 100
# classes, -1 with any), and the 2-D forward with reduction="none" is wrong. Above autograd:
# an ignore_index < 0 that reads as a class (-100 with 100 classes or more, as a language
# model's vocabulary; -1 always) is remapped to class C (the ignored targets read as C, which
# the wheel ignores right: bit for bit the CPU kernel's result), and the wheel's own kernel
# runs; the 2-D "none" forward is computed from eq / where / sum (its gradient a where: no
# scatter), the "none" backward from eq / where / index_select.

_NLL = aten.nll_loss_forward.default._op  # (no Python binding; functional: safe boxed)
_NLL2D = aten.nll_loss2d_forward.default._op
_NLL_BACKWARD = aten.nll_loss_backward.default._op
_NLL2D_BACKWARD = aten.nll_loss2d_backward.default._op


def _nll_forward(self: Tensor, target: Tensor, weight: Optional[Tensor], reduction: int,
                 ignore_index: int, op) -> Tuple[Tensor, Tensor]:
    classes = self.shape[1] if self.dim() > 1 else self.shape[0]
    if ignore_index < 0 and ignore_index + classes >= 0:
        if (shim := current.session) is not None:
            shim.events.notes["guard.nll"] += 1
        target = torch.where(torch.eq(target, ignore_index), classes, target)  # 2 launches
        ignore_index = classes
    if reduction != 0 or op is _NLL:
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return op(self, target, weight, reduction, ignore_index)
    # the 2-D forward with reduction none: -weight[t] * x[n, t, h, w], 0 where ignored, from
    # a one-hot selection along the classes (autograd records where and sum: no scatter)
    if (shim := current.session) is not None:
        shim.events.notes["guard.nll"] += 1
    ignored = torch.eq(target, ignore_index)
    safe = torch.where(ignored, 0, target)
    zero = aten.zeros.default([], dtype=self.dtype, device=self.device)
    ids = ARANGE(0, classes, 1, dtype=target.dtype, device=self.device)
    onehot = torch.eq(ids.reshape([1, classes] + [1] * (self.dim() - 2)), safe.unsqueeze(1))
    loss = torch.neg(torch.where(onehot, self, zero).sum(1))
    if weight is not None:
        loss = torch.mul(loss, weight.index_select(0, safe.reshape(-1)).reshape(safe.shape))
    return torch.where(ignored, zero, loss), zero


def _nll_backward(grad_output: Tensor, self: Tensor, target: Tensor, weight: Optional[Tensor],
                  reduction: int, ignore_index: int, total_weight: Tensor, op) -> Tensor:
    """d/dself of nll_loss(self, target, weight, reduction) times grad_output."""
    classes = self.shape[1] if self.dim() > 1 else self.shape[0]
    if ignore_index < 0 and ignore_index + classes >= 0:  # as in the forward
        if (shim := current.session) is not None:
            shim.events.notes["guard.nll"] += 1
        target = torch.where(torch.eq(target, ignore_index), classes, target)  # 2 launches
        ignore_index = classes
    if reduction != 0:
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return op(grad_output, self, target, weight, reduction, ignore_index, total_weight)
    if (shim := current.session) is not None:
        shim.events.notes["guard.nll_none"] += 1
    x = self.unsqueeze(0) if self.dim() == 1 else self
    t = target.unsqueeze(0) if self.dim() == 1 else target
    g = grad_output.unsqueeze(0) if self.dim() == 1 else grad_output
    ignored = torch.eq(t, ignore_index)
    safe = torch.where(ignored, 0, t)
    g = aten._to_copy.default(torch.neg(g), dtype=x.dtype)
    if weight is not None:
        g = torch.mul(g, weight.index_select(0, safe.reshape(-1)).reshape(safe.shape))
    zero = aten.zeros.default([], dtype=x.dtype, device=x.device)
    g = torch.where(ignored, zero, g)
    # one-hot of the target class along dim 1 (no scatter): (N, C, ...)
    ids = ARANGE(0, x.shape[1], 1, dtype=t.dtype, device=x.device)
    onehot = torch.eq(ids.reshape([1, -1] + [1] * (x.dim() - 2)), safe.unsqueeze(1))
    grad = torch.where(onehot, g.unsqueeze(1), zero)
    return grad.squeeze(0) if self.dim() == 1 else grad


# (partials, so that the kernel the dispatcher calls is one Python frame)
nll_loss_forward = functools.partial(_nll_forward, op=_NLL)
nll_loss2d_forward = functools.partial(_nll_forward, op=_NLL2D)
nll_loss_backward = functools.partial(_nll_backward, op=_NLL_BACKWARD)
nll_loss2d_backward = functools.partial(_nll_backward, op=_NLL2D_BACKWARD)
