"""Optimizer updates: ``lerp`` (Adam, AdamW, NAdam, RAdam, Adamax) and ``clamp_min.Tensor``
(``_foreach_maximum_`` of Adam/AdamW with ``amsgrad=True`` and of Adamax); with them the other
tensor-bound clamps (``_foreach_minimum_``, ``torch.clamp(x, min=t, max=t)``).

Since torch 2.4 the ``_foreach_*`` operators have a CompositeExplicitAutograd kernel that loops
over the per-tensor operator, so on torch-directml 0.2.5 the ``_foreach_*`` ops themselves no
longer fall back (#604, #626 were torch 2.3); the per-tensor ops they reach do, when
torch-directml lacks them. ``lerp`` is a structured operator: ``lerp.Scalar``/``lerp_.Scalar``
call ``lerp.Scalar_out``, which is the one to implement (#675).

The optimizers call ``torch._foreach_lerp_(exp_avgs, grads, 1 - beta1)`` once per step for all
parameters: decomposed there, the shim runs one Python frame per step (not one per parameter)
and the work stays the foreach ops' (``_foreach_sub`` + ``_foreach_add_``: two launches per
tensor, where the wheel's fallback copies two tensors to the host and one back).
"""

from __future__ import annotations

import torch

from dmlshim.kernels.decompositions.base import Decomposition, write_out


def lerp_scalar_out(self: torch.Tensor, end: torch.Tensor, weight, *,
                    out: torch.Tensor) -> torch.Tensor:
    # The CPU/CUDA formula: the branch keeps the result exact at weight 0 and weight 1. (The
    # functional ops, then a copy: no out= overload of the wheel.)
    diff = torch.sub(end, self)
    if abs(weight) < 0.5:
        return write_out(out, torch.add(self, diff, alpha=weight))
    return write_out(out, torch.sub(end, diff, alpha=1 - weight))


_foreach_sub = torch._foreach_sub
_foreach_sub_ = torch._foreach_sub_
_foreach_add_ = torch._foreach_add_
_foreach_mul_ = torch._foreach_mul_


def foreach_lerp__scalar(self, end, weight) -> None:
    # lerp.Scalar_out's CPU formula, for all tensors at once (foreach ops: composites over
    # sub/add/mul, which the wheel has). weight < 0.5: self + weight * (end - self).
    if abs(weight) < 0.5:
        _foreach_add_(self, _foreach_sub(end, self), alpha=weight)
        return
    # else end - (end - self) * (1 - weight), in self: (self - end) * (1 - weight) + end
    _foreach_sub_(self, end)
    _foreach_mul_(self, 1 - weight)
    _foreach_add_(self, end)


def lerp_tensor_out(self: torch.Tensor, end: torch.Tensor, weight: torch.Tensor, *,
                    out: torch.Tensor) -> torch.Tensor:
    diff = torch.sub(end, self)
    small = torch.lt(torch.abs(weight), 0.5)
    value = torch.where(small, self + weight * diff, end - diff * (1 - weight))
    return write_out(out, value)


def clamp_min_tensor_out(self: torch.Tensor, min: torch.Tensor, *,  # noqa: A002 - schema name
                         out: torch.Tensor) -> torch.Tensor:
    # clamp_min with a tensor bound is maximum(): same NaN propagation, same type promotion.
    return write_out(out, torch.maximum(self, min))


def clamp_max_tensor_out(self: torch.Tensor, max: torch.Tensor, *,  # noqa: A002 - schema name
                         out: torch.Tensor) -> torch.Tensor:
    return write_out(out, torch.minimum(self, max))


def clamp_tensor_out(self: torch.Tensor, min=None, max=None, *,  # noqa: A002 - schema names
                     out: torch.Tensor) -> torch.Tensor:
    # The CPU order: the lower bound first, then the upper one (max wins where min > max).
    value = self if min is None else torch.maximum(self, min)
    if max is not None:
        value = torch.minimum(value, max)
    return write_out(out, value)


DECOMPOSITIONS = (
    Decomposition("aten::_foreach_lerp_.Scalar", (604, 675), "optimizer step (Adam, AdamW, NAdam, "
                  "RAdam: foreach path, one kernel per step)",
                  "`_foreach_sub` + `_foreach_add_(alpha=weight)` (weight >= 0.5: `_foreach_sub_`,"
                  " `_foreach_mul_`, `_foreach_add_`)", foreach_lerp__scalar,
                  when="aten::lerp.Scalar_out"),
    Decomposition("aten::lerp.Scalar_out", (675,), "optimizer (Adam, AdamW, NAdam, RAdam, Adamax)",
                  "`sub` + `add(alpha=weight)` (or `sub(alpha=1-weight)` for weight >= 0.5, "
                  "the CPU formula)", lerp_scalar_out),
    Decomposition("aten::lerp.Tensor_out", (), "optimizer (tensor weights)",
                  "`sub`, `abs`, `lt`, `mul`, `where`", lerp_tensor_out),
    Decomposition("aten::clamp_min.Tensor_out", (), "optimizer (`amsgrad=True`, Adamax: "
                  "`_foreach_maximum_`)", "`maximum`", clamp_min_tensor_out),
    Decomposition("aten::clamp_max.Tensor_out", (), "element-wise bounds (`_foreach_minimum_`, "
                  "`torch.clamp_max(x, tensor)`)", "`minimum`", clamp_max_tensor_out),
    Decomposition("aten::clamp.Tensor_out", (), "element-wise bounds (`torch.clamp(x, min=tensor,"
                  " max=tensor)`)", "`maximum`, then `minimum`", clamp_tensor_out),
)
