"""Guards of the normalisations: layer_norm_nobias and bn_mixed_backward (input fixes above
autograd), and bn_stats (#362: a wrapper of ``F.batch_norm``, on the emulator's opt-in switch
only).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence, Tuple

import torch

from dmlshim import current, events
from dmlshim.kernels.guards.passthrough import EXCLUDE, INCLUDE, NOT_HERE, OTHER

Tensor = torch.Tensor
aten = torch.ops.aten
_TO = torch._C.TensorBase.to

# -- layer norm backward without a bias fails --------------------------------------------------

_LAYER_NORM_BACKWARD = aten.native_layer_norm_backward.default._op  # functional


def native_layer_norm_backward(grad_out: Tensor, input: Tensor,  # noqa: A002 - aten's names
                               normalized_shape: Sequence[int], mean: Tensor, rstd: Tensor,
                               weight: Optional[Tensor], bias: Optional[Tensor],
                               output_mask: Sequence[bool]
                               ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(grad_input, grad_weight, grad_bias), each only where ``output_mask`` asks for it.

    Above autograd. With a weight and a bias the wheel's own kernel is right and runs;
    otherwise the closed form, with x̂ = (x - mean) * rstd over the normalized dims and g = dy *
    weight: dx = rstd * (g - mean(g) - x̂ * mean(g * x̂)), dweight = Σ dy * x̂ and dbias = Σ dy
    over the other dims.
    """
    if weight is not None and bias is not None:
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return _LAYER_NORM_BACKWARD(grad_out, input, normalized_shape, mean, rstd, weight,
                                        bias, output_mask)
    if (shim := current.session) is not None:
        shim.events.notes["guard.layer_norm_nobias"] += 1
    mask = [bool(m) for m in output_mask]
    k = len(normalized_shape)
    axis = input.dim() - k
    dims = list(range(axis, input.dim()))
    batch = list(range(axis))
    stat_shape = list(input.shape[:axis]) + [1] * k
    xhat = (input - mean.reshape(stat_shape)) * rstd.reshape(stat_shape)
    grad_input = grad_weight = grad_bias = None
    if mask[0]:
        g = grad_out * weight if weight is not None else grad_out
        mean_g = g.mean(dims, keepdim=True)
        mean_gx = (g * xhat).mean(dims, keepdim=True)
        grad_input = ((g - mean_g - xhat * mean_gx) * rstd.reshape(stat_shape)).to(input.dtype)
    if mask[1] and weight is not None:
        prod = grad_out * xhat
        grad_weight = (prod.sum(batch) if batch else prod).to(weight.dtype)
    if mask[2] and bias is not None:
        grad_bias = (grad_out.sum(batch) if batch else grad_out).to(bias.dtype)
    return grad_input, grad_weight, grad_bias


# -- batch norm backward with a float16 input and float32 weights: E_INVALIDARG ---------------
# The form CUDA autocast makes (batch norm runs in the input's dtype with the module's float32
# parameters): the wheel's forward takes it, its backward raises "Unknown error -2147024809"
# (train and eval; all-float16 and all-float32 work). Above autograd: the backward's half
# inputs go to the wheel's own kernel in the weight's dtype, and grad_input comes back in the
# input's (what CUDA's kernel computes in: float32 accumulation).

_BN_BACKWARD = aten.native_batch_norm_backward.default._op  # functional


def native_batch_norm_backward(grad_out: Tensor, input: Tensor,  # noqa: A002 - aten's names
                               weight: Optional[Tensor], running_mean: Optional[Tensor],
                               running_var: Optional[Tensor], save_mean: Optional[Tensor],
                               save_invstd: Optional[Tensor], train: bool, eps: float,
                               output_mask: Sequence[bool]
                               ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    if weight is None or weight.dtype is input.dtype:
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return _BN_BACKWARD(grad_out, input, weight, running_mean, running_var, save_mean,
                                save_invstd, train, eps, output_mask)
    if (shim := current.session) is not None:
        shim.events.notes["guard.bn_mixed_backward"] += 1
    dtype = weight.dtype
    if save_mean is not None and save_mean.dtype is not dtype:
        save_mean = _TO(save_mean, dtype)
    if save_invstd is not None and save_invstd.dtype is not dtype:
        save_invstd = _TO(save_invstd, dtype)
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        grad_input, grad_weight, grad_bias = _BN_BACKWARD(
            _TO(grad_out, dtype), _TO(input, dtype), weight, running_mean, running_var,
            save_mean, save_invstd, train, eps, output_mask)
    if grad_input is not None:
        grad_input = _TO(grad_input, input.dtype)
    return grad_input, grad_weight, grad_bias


# -- BatchNorm running statistics not updated in training (#362) ------------------------------
# Reported for older releases; 0.2.5 updates them, so the guard runs only on the emulator's
# opt-in bug-bn-stats switch (on real DirectML it would only cost time). A wrapper of
# ``F.batch_norm``: it normalizes with the batch statistics and updates
# ``running_mean``/``running_var`` itself, with the momentum the module passes (cumulative
# averaging included).

_BN_PARAMS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum",
              "eps")


def batch_norm_stats_wrapper(device_type: str) -> Callable[..., Any]:
    """The wrapper of ``torch.nn.functional.batch_norm`` on ``device_type`` tensors."""

    def wrapper(wrapped, instance, args, kwargs):
        b = dict(zip(_BN_PARAMS, args))
        b.update(kwargs)
        x, rm, rv = b["input"], b["running_mean"], b["running_var"]
        if not b.get("training", False) or rm is None or rv is None \
                or x.device.type != device_type:
            return wrapped(*args, **kwargs)
        momentum = b.get("momentum", 0.1)
        out = wrapped(x, None, None, b.get("weight"), b.get("bias"), True, momentum,
                      b.get("eps", 1e-5))
        if (shim := current.session) is not None:
            shim.events.notes["guard.bn_stats"] += 1
        events.redirected("F.batch_norm", "running stats", "updated by dmlshim (#362)",
                          tag="emulated")
        with torch.no_grad():
            dims = [0] + list(range(2, x.dim()))
            xd = x.detach()
            mean = xd.mean(dims).to(rm.dtype)
            var = xd.var(dims, unbiased=True).to(rv.dtype)
            rm.mul_(1.0 - momentum).add_(mean, alpha=momentum)
            rv.mul_(1.0 - momentum).add_(var, alpha=momentum)
        return out

    return wrapper
