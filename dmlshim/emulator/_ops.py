"""Operators the emulator implements itself: device transfers, and the opt-in DirectML bugs.

Device transfers cannot simply run on the CPU elems (one side is a plain CPU tensor, or the
target adapter differs; ``_copy_from``, reached with the Python key excluded, is a PrivateUse1
kernel in ``_backend.py``). The bugs reproduce torch-directml 0.2.5's wrong results when their
switch is on, so that dmlshim's guards can be tested against them:

* ``bug-ce-none`` (#739, #740): ``cross_entropy(reduction="none")`` gives zero gradients. The
  loss backward (``nll_loss_backward`` / ``nll_loss2d_backward`` with reduction 0) returns 0.
* ``bug-mul-bool`` (#686, #737): ``float_tensor * bool_tensor`` and ``float_tensor *=
  bool_tensor`` give a bool tensor (the in-place form changes the tensor's dtype to bool).
* ``bug-bn-stats`` (#362): BatchNorm running statistics are not updated in training.
"""

from __future__ import annotations

import torch

from dmlshim.emulator import _lstm
from dmlshim.emulator._state import check_index
from dmlshim.emulator._tensor import (
    BUGS,
    CPU_IMPLS,
    SPECIALS,
    EmuTensor,
    check_float64,
    finish,
    run_on_cpu,
    unwrap,
    wrap,
)

aten = torch.ops.aten


def _copy_(func, plan, args, kwargs):
    dst, src = args[0], args[1]
    non_blocking = args[2] if len(args) > 2 else kwargs.get("non_blocking", False)
    if type(dst) is EmuTensor:
        # #443 (dml:0 -> dml:1 copies give zeros) is not reproduced.
        dst._elem.copy_(src._elem if type(src) is EmuTensor else src, non_blocking)
    else:
        dst.copy_(src._elem, non_blocking)
    return dst


def _to_copy(func, plan, args, kwargs):
    src = args[0]
    kwargs = dict(kwargs)
    device = kwargs.pop("device", None)
    elem = src._elem
    if device is not None:
        device = torch.device(device)
    if device is None or device.type == "privateuseone":
        if device is None:
            index = src._index
        else:
            index = check_index(device.index)  # None: the current adapter, as "cuda" means
        dtype = kwargs.get("dtype")
        if dtype is not None:
            check_float64(dtype)
        return wrap(func(elem, **kwargs), index)
    return func(elem, device=device, **kwargs)


def _convolution_overrideable(func, plan, args, kwargs):
    # torch-directml's convolution kernels; reached only if a convolution composite is
    # decomposed on PrivateUse1. The CPU has no "overrideable" kernels: use the real ones.
    cargs, ckwargs, index, _ = unwrap(plan, args, kwargs)
    if func.name() == "aten::convolution_overrideable":
        return wrap(aten.convolution(*cargs, **ckwargs), index)
    # (grad_output, input, weight, stride, padding, dilation, transposed, output_padding,
    #  groups, output_mask): convolution_backward also wants the bias size.
    grad_output, inp, weight = cargs[:3]
    transposed, groups = cargs[6], cargs[8]
    bias_sizes = [weight.shape[1] * groups if transposed else weight.shape[0]]
    out = aten.convolution_backward(grad_output, inp, weight, bias_sizes, *cargs[3:], **ckwargs)
    return tuple(wrap(t, index) if t is not None else None for t in out)


# --- opt-in bugs -------------------------------------------------------------------------


def _nll_backward_bug(func, plan, args, kwargs):
    cargs, ckwargs, index, _ = unwrap(plan, args, kwargs)
    out = func(*cargs, **ckwargs)
    reduction = cargs[4] if len(cargs) > 4 else ckwargs.get("reduction", 1)
    if reduction == 0:  # Reduction::None
        out = torch.zeros_like(out)
    return finish(plan, args, kwargs, out, index)


def _mul_bool_bug(func, plan, args, kwargs):
    a, b = args[0], args[1]
    if not (type(b) is EmuTensor and b.dtype is torch.bool and a.dtype.is_floating_point):
        return run_on_cpu(func, plan, args, kwargs)
    result = (a._elem * b._elem).to(torch.bool)
    if func.name() == "aten::mul.Tensor":
        return wrap(result, a._index)
    # In place: the tensor itself becomes bool, as on torch-directml 0.2.5.
    target = args[0] if func.name() == "aten::mul_.Tensor" else kwargs["out"]
    replacement = wrap(result, a._index)
    EmuTensor.data.fset(target, replacement)
    return target


def _bn_stats_bug(func, plan, args, kwargs):
    # native_batch_norm(input, weight, bias, running_mean, running_var, training, ...):
    # run with copies of the running statistics so the real ones stay as they were.
    args = list(args)
    for pos in (3, 4):  # same positions in native_batch_norm and its newer variants
        if pos < len(args) and type(args[pos]) is EmuTensor:
            args[pos] = wrap(args[pos]._elem.clone(), args[pos]._index)
    return run_on_cpu(func, plan, tuple(args), kwargs)


SPECIALS.update({
    "aten::copy_": _copy_,
    "aten::_to_copy": _to_copy,
    "aten::convolution_overrideable": _convolution_overrideable,
    "aten::convolution_backward_overrideable": _convolution_overrideable,
})

BUGS.update({
    "aten::nll_loss_backward": ("bug_ce_none", _nll_backward_bug),
    "aten::nll_loss2d_backward": ("bug_ce_none", _nll_backward_bug),
    "aten::mul.Tensor": ("bug_mul_bool", _mul_bool_bug),
    "aten::mul_.Tensor": ("bug_mul_bool", _mul_bool_bug),
    "aten::mul.out": ("bug_mul_bool", _mul_bool_bug),
    "aten::native_batch_norm": ("bug_bn_stats", _bn_stats_bug),
    "aten::_native_batch_norm_legit": ("bug_bn_stats", _bn_stats_bug),
    "aten::_batch_norm_with_update": ("bug_bn_stats", _bn_stats_bug),
})

CPU_IMPLS.update(_lstm.CPU_IMPLS)
