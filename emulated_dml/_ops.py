"""Operators the emulator implements itself: device transfers, and torch-directml's wrong results.

Device transfers cannot simply run on the CPU elems (one side is a plain CPU tensor, or the
target adapter differs; ``_copy_from``, reached with the Python key excluded, is a PrivateUse1
kernel in ``_backend.py``). The other handlers reproduce what the real torch-directml
0.2.5.dev240914 wheel does where it differs from the CPU (observed on the wheel; all decided on
its host side, so the same on every adapter), each under its switch, so that dmlshim's guards
can be tested against them:

* ``eye`` (#431): ``torch.eye(n)`` / ``torch.eye(n, m)`` fall back (``aten::eye.out`` /
  ``aten::eye.m_out``) and come back with shape ``(0,)``.
* ``mul-bool`` (#686, #737): a float tensor times a bool tensor, in either order and in place
  (``x * m``, ``m * x``, ``torch.mul(x, m)``, ``x *= m``), gives a bool tensor (the in-place
  form changes the tensor's dtype to bool).
* ``nll-none-backward`` (#739, #740): the backward of ``nll_loss`` / ``cross_entropy`` with
  ``reduction="none"`` uses ``grad_output[0]`` for every row: right for a uniform upstream
  gradient, all zero when ``grad_output[0] == 0``.
* ``masked-fill-uint8`` (#702): ``masked_fill`` accepts a uint8 mask (the CPU raises).
* ``masked-fill-mode``: under a TorchDispatchMode, ``masked_fill_`` (Scalar and Tensor) returns
  a new tensor and leaves ``self`` as it was (see ``_under_dispatch_mode``).
* ``reflect-pad``: ``F.pad(mode="reflect")`` on 2-D planes swaps the padding of height and width.
* ``channels-last``: ``.to(memory_format=torch.channels_last)`` (and ``_3d``) is refused.
* ``layer-norm-nobias``: the layer-norm backward without a bias fails (see ``_layer_norm_bwd``).
* ``flip-negative-dims``: ``flip`` with a negative dim raises (the wheel's ``flip_dml_helper``
  segfaults on it).
* ``bn-mixed-backward``: the batch-norm backward of a float16 (or bfloat16) input with float32
  weights (CUDA autocast's form) raises the wheel's ``Unknown error -2147024809`` (E_INVALIDARG);
  the forward works, and so does the backward in one dtype.
* ``gather-scatter-negative-dim``: ``gather`` with a negative dim gives wrong values (modelled:
  the index read in reverse along that dim), ``scatter``/``scatter_add`` with one raise the
  partial-update error (the wheel compares the unwrapped dim with the index's dims).
* ``rsub-float-number``: ``1.0 - x`` (rsub with a float number, which arrives as a CPU
  float64 wrapped scalar) raises the float64 message; an int number or a tensor works.
* ``split-empty``: ``split``/``chunk`` of an empty tensor raises ``Unknown error -2147024809``.
* ``non-blocking-to-host``: ``x.to("cpu", non_blocking=True)`` of a device tensor returns before
  the copy is done: the host tensor reads as garbage (modelled: NaN, or -1 for integers; the
  wheel's late write then corrupts the heap, which is not modelled).
* ``sub-empty``: ``a - b`` with an empty operand gives every dim size 0 ((0, 1) - (0, 1) is
  (0, 0)); the wheel's in-place binary kernels (add_, mul_, sub_) give an empty tensor that
  shape too (not modelled).
* ``gather-empty``: ``gather`` with an empty index raises ``Unknown error -2147024809``.
* ``slice-empty``: an empty slice that starts past 0 (``x[:, 8:]`` of 8 columns) raises (the
  wheel segfaults on it); at the front (``x[:, :0]``) it works.
* ``cat-empty``: ``torch.cat`` with an empty operand (``(3, 0)`` beside ``(3, 4)``) raises
  ``Unknown error -2147024809``.
* ``inplace-alias``: a float32 in-place or ``out=`` add/sub whose ``other`` shares memory with
  the tensor written drops alpha and the sign: self is copied into it, then other added (``x -=
  x`` gives 2x, ``torch.sub(y, x, out=x)`` 2y; ``x.sub_(x[0])``, which torch refuses, x + x[0]).
* ``readback-gil`` lives in ``_guard.cpp`` (a C++ kernel just below autograd, where the GIL can
  be seen and where a kernel registered above autograd has already run): a device tensor read
  back as one number with the GIL held raises (on the wheel it can deadlock: torch's argument
  parser reads ``torch.zeros(n, t.max())``'s size so).
* ``bug-bn-stats`` (#362, opt-in: not reproduced by 0.2.5): BatchNorm running statistics are not
  updated in training.

Always, as the wheel's C++ kernels do: training-mode batch norm, dropout and its backward
multiply on the device by a wrapped-number scalar (``aten::mul.Tensor``), so a Python kernel
registered for ``mul.Tensor`` on PrivateUse1 receives that operand as a Python float
(:func:`_times_scalar`).
"""

from __future__ import annotations

import sys

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from dmlshared import lstm_cell
from emulated_dml import _fallback
from emulated_dml._state import check_index, state
from emulated_dml._tensor import (
    BUGS,
    CPU_IMPLS,
    F64_MESSAGE,
    SPECIALS,
    EmuTensor,
    check_float64,
    check_memory_format,
    finish,
    run_on_cpu,
    sync_metadata,
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
        check_memory_format(kwargs.get("memory_format"))
        return wrap(func(elem, **kwargs), index)
    out = func(elem, device=device, **kwargs)
    if kwargs.get("non_blocking") and state.non_blocking_to_host:
        # the wheel hands the host tensor back before its copy is done
        out = out.fill_(float("nan") if out.is_floating_point() or out.is_complex() else -1)
    return out


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


# --- torch-directml 0.2.5's wrong results (switches) --------------------------------------


def _arg(cargs, ckwargs, pos: int, name: str, default=None):
    return cargs[pos] if len(cargs) > pos else ckwargs.get(name, default)


def _unignore(cargs, ckwargs, self_pos: int, target_pos: int, ignore_pos: int) -> None:
    # bug-nll-ignore: a negative ignore_index is not ignored where it is a valid negative
    # class index (-100 with >= 100 classes, -1 always): the target is read as index + C.
    self = cargs[self_pos]
    classes = self.shape[1] if self.dim() > 1 else self.shape[0]
    ignore = _arg(cargs, ckwargs, ignore_pos, "ignore_index", -100)
    if ignore < 0 and ignore + classes >= 0:
        target = cargs[target_pos]
        cargs[target_pos] = torch.where(target == ignore, target + classes, target)


def _nll_forward_bug(func, plan, args, kwargs):
    # (self, target, weight, reduction, ignore_index[, output, total_weight])
    cargs, ckwargs, index, _ = unwrap(plan, args, kwargs)
    if state.bug_nll_ignore:
        _unignore(cargs, ckwargs, 0, 1, 4)
    result = func(*cargs, **ckwargs)
    if (state.bug_ce_2d_none and "nll_loss2d" in plan.name
            and _arg(cargs, ckwargs, 3, "reduction", 1) == 0 and result[0].dim() >= 2):
        # bug-ce-2d-none: the per-pixel losses come back in transposed (W, H) order
        loss = result[0]
        loss.copy_(loss.transpose(-1, -2).contiguous().reshape(loss.shape))
    return finish(plan, args, kwargs, result, index)


def _nll_backward_gap(func, plan, args, kwargs):
    # (grad_output, self, target, weight, reduction, ignore_index, total_weight[, grad_input])
    cargs, ckwargs, index, _ = unwrap(plan, args, kwargs)
    if state.bug_nll_ignore:
        _unignore(cargs, ckwargs, 1, 2, 5)
    reduction = cargs[4] if len(cargs) > 4 else ckwargs.get("reduction", 1)
    if reduction == 0 and state.nll_none_backward:
        # Reduction::None: every row gets grad_output's first element
        grad_output = cargs[0]
        cargs[0] = grad_output.reshape(-1)[:1].reshape([1] * grad_output.dim()) \
            .expand_as(grad_output) if grad_output.numel() else grad_output
    return finish(plan, args, kwargs, func(*cargs, **ckwargs), index)


def _mul_bool_gap(func, plan, args, kwargs):
    a, b = args[0], args[1]
    a_dtype, b_dtype = getattr(a, "dtype", None), getattr(b, "dtype", None)
    mixed = (b_dtype is torch.bool and a_dtype is not None and a_dtype.is_floating_point) or (
        a_dtype is torch.bool and b_dtype is not None and b_dtype.is_floating_point)
    if not mixed:
        return run_on_cpu(func, plan, args, kwargs)
    cargs, _, index, _ = unwrap(plan, args, kwargs)
    result = (cargs[0] * cargs[1]).to(torch.bool)
    if func.name() == "aten::mul.Tensor":
        return wrap(result, index)
    # In place / out=: the tensor itself becomes bool, as on torch-directml 0.2.5.
    target = args[0] if func.name() == "aten::mul_.Tensor" else kwargs["out"]
    EmuTensor.data.fset(target, wrap(result, index))
    return target


def _eye_gap(func, plan, args, kwargs):
    # eye.out / eye.m_out fall back and the result comes back empty (#431).
    if state.fallback:
        _fallback.record(plan.fallback_name or plan.name)
    out = kwargs["out"]
    if type(out) is EmuTensor:
        out._elem.resize_(0)
        sync_metadata(out)
    return out


def _masked_fill_gap(func, plan, args, kwargs):
    mask = args[1]
    if state.masked_fill_uint8 and getattr(mask, "dtype", None) is torch.uint8:
        # accepted, as a bool mask (#702)
        args = (args[0], wrap(mask._elem.bool(), mask._index) if type(mask) is EmuTensor
                else mask.bool()) + tuple(args[2:])
    if state.masked_fill_mode and _under_dispatch_mode():
        cargs, ckwargs, index, _ = unwrap(plan, args, kwargs)
        return wrap(cargs[0].masked_fill(*cargs[1:], **ckwargs), index)  # self stays as it was
    return run_on_cpu(func, plan, args, kwargs)


def _under_dispatch_mode() -> bool:
    """Whether Python code running under a TorchDispatchMode called this op: the innermost
    ``__torch_dispatch__`` frame above is a mode's (its handler, where the mode is popped while
    it runs), not a device tensor's (an op a device kernel, e.g. a composite, calls itself)."""
    frame = sys._getframe(3)  # above this, _masked_fill_gap and EmuTensor.__torch_dispatch__
    while frame is not None:
        if frame.f_code.co_name == "__torch_dispatch__":
            return isinstance(frame.f_locals.get("self"), TorchDispatchMode)
        frame = frame.f_back
    return False


def _reflect_pad_gap(func, plan, args, kwargs):
    padding = list(args[1]) if len(args) > 1 else list(kwargs["padding"])
    if len(padding) == 4 and padding[:2] != padding[2:]:  # height and width swapped
        padding = padding[2:] + padding[:2]
        if len(args) > 1:
            args = (args[0], padding) + tuple(args[2:])
        else:
            kwargs = dict(kwargs, padding=padding)
    return run_on_cpu(func, plan, args, kwargs)


def _reflect_pad_backward_gap(func, plan, args, kwargs):
    # (grad_output, self, padding): the backward swaps the padding like the forward; a
    # gradient of the right (unswapped) padded size then hits DirectML's scatter check.
    padding = list(args[2]) if len(args) > 2 else list(kwargs["padding"])
    if len(padding) == 4 and padding[:2] != padding[2:]:
        grad, inp = args[0], args[1]
        swapped = [inp.shape[-2] + padding[0] + padding[1], inp.shape[-1] + padding[2] + padding[3]]
        if list(grad.shape[-2:]) != swapped:
            raise RuntimeError(SCATTER_PARTIAL_MESSAGE)
        padding = padding[2:] + padding[:2]
        if len(args) > 2:
            args = (args[0], args[1], padding) + tuple(args[3:])
        else:
            kwargs = dict(kwargs, padding=padding)
    return run_on_cpu(func, plan, args, kwargs)


LAYER_NORM_DEVICE_REMOVED = "Unknown error -2005270523"  # 0x887A0005 DXGI_ERROR_DEVICE_REMOVED
LAYER_NORM_NO_DEVICE = "tensor does not have a device"
LAYER_NORM_GRAPH = ("DirectML graph compilation failed (native_layer_norm_backward with a weight, "
                    "no bias and an input that needs no gradient)")


def _layer_norm_bwd_gap(func, plan, args, kwargs):
    # (grad_out, input, normalized_shape, mean, rstd, weight, bias, output_mask): without a
    # bias the wheel fails in three ways; with one it works.
    weight = args[5] if len(args) > 5 else kwargs.get("weight")
    bias = args[6] if len(args) > 6 else kwargs.get("bias")
    mask = args[7] if len(args) > 7 else kwargs.get("output_mask")
    if bias is None:
        if weight is None:
            raise RuntimeError(LAYER_NORM_NO_DEVICE)
        if mask is not None and mask[0]:
            raise RuntimeError(LAYER_NORM_DEVICE_REMOVED)
        raise RuntimeError(LAYER_NORM_GRAPH)
    return run_on_cpu(func, plan, args, kwargs)


_ARANGE = torch._C._VariableFunctions.arange


def _plane_offsets(x: torch.Tensor, out_shape) -> torch.Tensor:
    """(n * C + c) * H * W for each output element of a pooling of ``x`` (CPU tensor)."""
    planes = x.numel() // max(x.shape[-2] * x.shape[-1], 1)
    # torch's C function: torch.arange may be a shim's wrapper, whose frame is not the wheel's
    base = _ARANGE(planes, dtype=torch.int64) * (x.shape[-2] * x.shape[-1])
    return base.reshape(list(out_shape[:-2]) + [1, 1])


def _maxpool_flat_gap(func, plan, args, kwargs):
    # The wheel's indices count over the whole input tensor, not per (H, W) plane as torch's:
    # the per-plane index plus (n * C + c) * H * W (49, 50, 57, 59 where the CPU has 1, 2, 9, 11).
    cargs, ckwargs, index, _ = unwrap(plan, args, kwargs)
    values, indices = func(*cargs, **ckwargs)
    indices.add_(_plane_offsets(cargs[0], indices.shape))
    return finish(plan, args, kwargs, (values, indices), index)


def _maxpool_flat_backward_gap(func, plan, args, kwargs):
    # (grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, indices): the
    # wheel's backward reads the indices as offsets into the whole input (its own convention),
    # so per-plane indices send every gradient to the first plane.
    cargs, ckwargs, index, _ = unwrap(plan, args, kwargs)
    grad_output, inp = cargs[0], cargs[1]
    idx = cargs[7] if len(cargs) > 7 else ckwargs["indices"]
    flat = torch.zeros(inp.numel(), dtype=grad_output.dtype)
    flat.index_add_(0, idx.reshape(-1), grad_output.reshape(-1))
    result = flat.reshape(inp.shape)
    out = ckwargs.get("grad_input")
    if out is not None:  # the .grad_input overload writes its out= tensor
        out.copy_(result)
        return finish(plan, args, kwargs, out, index)
    return wrap(result, index)


def _resize_gap(func, plan, args, kwargs):
    # torch-directml's resize_ restrides (12 elements to (3, 4) works) but does not reallocate:
    # another element count raises its shape check (from 0 elements: "tensor a (0) ... b (4)").
    self, size = args[0], list(args[1] if len(args) > 1 else kwargs["size"])
    count = 1
    for n in size:
        count *= n
    if count != self.numel():
        from emulated_dml._tensor import size_mismatch_message

        raise RuntimeError(size_mismatch_message(self.shape, size))
    return run_on_cpu(func, plan, args, kwargs)


UNIQUE_COUNTS_MESSAGE = "Return counts not implemented for unique operator for DirectML."
UNIQUE_INVERSE_MESSAGE = "Return inverse not implemented for unique operator for DirectML."


def _unique_gap(func, plan, args, kwargs):
    # _unique2(self, sorted=True, return_inverse=False, return_counts=False): the wheel raises
    # for the counts first, then for the inverse (seen on the real wheel)
    inverse = args[2] if len(args) > 2 else kwargs.get("return_inverse", False)
    counts = args[3] if len(args) > 3 else kwargs.get("return_counts", False)
    if counts:
        raise RuntimeError(UNIQUE_COUNTS_MESSAGE)
    if inverse:
        raise RuntimeError(UNIQUE_INVERSE_MESSAGE)
    return run_on_cpu(func, plan, args, kwargs)


SCATTER_PARTIAL_MESSAGE = (
    "DirectML scatter doesn't allow partially modified dimensions. Please update the dimension "
    "so that the indices and input only differ in the provided dimension.")
# the wheel's E_INVALIDARG (scatter_add on the software adapter, split and gather of empties)
INVALID_ARG_MESSAGE = "Unknown error -2147024809"


def _scatter_gap(func, plan, args, kwargs):
    # scatter*/scatter_add*(self, dim, index, src|value[, reduce]): every overload so
    self = args[0]
    dim = args[1] if len(args) > 1 else kwargs["dim"]
    index = args[2] if len(args) > 2 else kwargs["index"]
    if state.gather_scatter_negative_dim and dim < 0:
        raise RuntimeError(SCATTER_PARTIAL_MESSAGE)
    if state.scatter_partial and self.dim() and index.dim() == self.dim():
        dim %= self.dim()
        if any(index.shape[d] != self.shape[d] for d in range(self.dim()) if d != dim):
            raise RuntimeError(SCATTER_PARTIAL_MESSAGE)
    if state.bug_scatter_add and "scatter_add" in plan.name:
        raise RuntimeError(INVALID_ARG_MESSAGE)
    return run_on_cpu(func, plan, args, kwargs)


def _split_gap(func, plan, args, kwargs):
    if args[0].numel() == 0:
        raise RuntimeError(INVALID_ARG_MESSAGE)
    return run_on_cpu(func, plan, args, kwargs)


def _cat_empty_gap(func, plan, args, kwargs):
    tensors = args[0] if args else kwargs["tensors"]
    if any(t.numel() == 0 for t in tensors):
        raise RuntimeError(INVALID_ARG_MESSAGE)
    return run_on_cpu(func, plan, args, kwargs)


SLICE_MESSAGE = (
    "an empty slice starting at {start} of a dimension of size {size}: torch-directml 0.2.5 "
    "segfaults on it (its view points past the tensor; dmlshim emulator, gap slice-empty)")


def _slice_gap(func, plan, args, kwargs):
    # slice(self, dim=0, start=None, end=None, step=1)
    names = ("self", "dim", "start", "end", "step")
    bound = dict(zip(names, args), **kwargs)
    self, start, end = bound["self"], bound.get("start"), bound.get("end")
    if start:
        size = self.shape[bound.get("dim", 0)]
        s = start + size if start < 0 else start
        e = size if end is None else (end + size if end < 0 else end)
        if s > 0 and (s >= size or e <= s):
            raise RuntimeError(SLICE_MESSAGE.format(start=start, size=size))
    return run_on_cpu(func, plan, args, kwargs)


def _sub_empty_gap(func, plan, args, kwargs):
    out = run_on_cpu(func, plan, args, kwargs)
    other = args[1] if len(args) > 1 else kwargs.get("other")
    if out.numel() == 0 or (isinstance(other, torch.Tensor) and other.numel() == 0):
        return wrap(torch.empty([0] * out.dim(), dtype=out.dtype), out._index)
    return out


def _inplace_alias_gap(func, plan, args, kwargs):
    # add_/sub_(self, other, alpha) and add.out/sub.out(self, other, alpha, out): float32,
    # ``other`` sharing memory with the tensor written: that tensor gets self + other
    written = kwargs["out"] if "out" in kwargs else args[0]
    other = args[1] if len(args) > 1 else kwargs.get("other")
    if written.dtype is torch.float32 and isinstance(other, EmuTensor) \
            and isinstance(written, EmuTensor) and _same_memory(written, other):
        # as the wheel does it: self copied into the tensor written, then other (read after the
        # copy) added, alpha and the sign dropped: x - x gives 2x in place, and
        # ``torch.sub(y, x, out=x)`` gives 2y
        if written is not args[0]:
            written._elem.copy_(args[0]._elem)
        written._elem.copy_(written._elem + other._elem)
        return written
    return run_on_cpu(func, plan, args, kwargs)


def _same_memory(a: EmuTensor, b: EmuTensor) -> bool:
    return a._elem.untyped_storage().data_ptr() == b._elem.untyped_storage().data_ptr()


def _rsub_gap(func, plan, args, kwargs):
    # rsub(self, other, alpha): a float number (or its float64 wrapped scalar) is refused
    other = args[1] if len(args) > 1 else kwargs["other"]
    if isinstance(other, float) or (type(other) is torch.Tensor and other.dim() == 0
                                    and other.dtype is torch.float64):
        raise RuntimeError(F64_MESSAGE)
    return run_on_cpu(func, plan, args, kwargs)


def _gather_gap(func, plan, args, kwargs):
    # gather(self, dim, index[, sparse_grad]) with a negative dim: a wrong result of the right
    # shape (the wheel's values are not modelled; any wrong result shows a missing guard)
    dim = args[1] if len(args) > 1 else kwargs["dim"]
    index = args[2] if len(args) > 2 else kwargs["index"]
    if state.gather_empty and index.numel() == 0:
        raise RuntimeError(INVALID_ARG_MESSAGE)
    if dim < 0 and state.gather_scatter_negative_dim:
        flipped = wrap(index._elem.flip([index.dim() - 1]), index._index)
        if len(args) > 2:
            args = tuple(args[:2]) + (flipped,) + tuple(args[3:])
        else:
            kwargs = dict(kwargs, index=flipped)
    return run_on_cpu(func, plan, args, kwargs)


def _bilinear_bug(func, plan, args, kwargs):
    # bug-bilinear: upsample_bilinear2d (and its backward) compute with align_corners flipped.
    pos = 3 if "backward" in plan.name else 2
    if len(args) > pos:
        args = tuple(args[:pos]) + (not args[pos],) + tuple(args[pos + 1:])
    else:
        kwargs = dict(kwargs, align_corners=not kwargs["align_corners"])
    return run_on_cpu(func, plan, args, kwargs)


# A boxed call takes a Python number for mul's Tensor operand and makes it a wrapped number,
# as the wheel's C++ kernels pass their scalars: the dispatcher hands it to a Python kernel
# registered for the device as a Python number again (facts file, "Host-side crashes").
_mul_boxed = aten.mul.Tensor._op


def _times_scalar(t: torch.Tensor, scale: float) -> torch.Tensor:
    """``t * scale`` on the device, as the wheel's C++ kernels multiply (below autograd)."""
    return _mul_boxed(t, scale)


def _native_dropout(func, plan, args, kwargs):
    # (input, p, train): the CPU kernel's mask (the same random numbers), and its
    # input * mask * (1 / (1 - p)) with the last product on the device by a wrapped scalar
    cargs, ckwargs, index, _ = unwrap(plan, args, kwargs)
    out, mask = func(*cargs, **ckwargs)
    p = _arg(cargs, ckwargs, 1, "p")
    train = _arg(cargs, ckwargs, 2, "train")
    if cargs[0].numel() == 0 or train is False or not cargs[0].is_floating_point():
        return wrap(out, index), wrap(mask, index)
    scale = 0.0 if 1.0 - p == 0 else 1.0 / (1.0 - p)
    return _times_scalar(wrap(cargs[0].mul(mask), index), scale), wrap(mask, index)


def _native_dropout_backward(func, plan, args, kwargs):
    # (grad_output, mask, scale): grad_output * mask * scale, the last product on the device
    cargs, ckwargs, index, _ = unwrap(plan, args, kwargs)
    scale = _arg(cargs, ckwargs, 2, "scale")
    if len(cargs) > 2:
        cargs[2] = 1.0
    else:
        ckwargs = dict(ckwargs, scale=1.0)
    return _times_scalar(wrap(func(*cargs, **ckwargs), index), scale)


def _native_batch_norm(func, plan, args, kwargs):
    # (input, weight, bias, running_mean, running_var, training, momentum, eps): in training
    # the wheel's kernel multiplies by a wrapped scalar on the device; here the saved mean by
    # 1.0, which leaves it as the CPU's
    if state.bug_bn_stats:
        out = _bn_stats_bug(func, plan, args, kwargs)
    else:
        out = run_on_cpu(func, plan, args, kwargs)
    training = args[5] if len(args) > 5 else kwargs.get("training", False)
    if training and type(out[1]) is EmuTensor and out[1].numel():
        out = (out[0], _times_scalar(out[1], 1.0)) + tuple(out[2:])
    return out


FLIP_MESSAGE = (
    "flip with a negative dimension ({dims}): torch-directml 0.2.5's flip_dml_helper does not "
    "wrap negative dims and segfaults; pass them non-negative (dim % x.dim()). "
    "(dmlshim emulator, gap flip-negative-dims)")


def _flip_gap(func, plan, args, kwargs):
    dims = args[1] if len(args) > 1 else kwargs["dims"]
    if any(d < 0 for d in dims):
        raise RuntimeError(FLIP_MESSAGE.format(dims=list(dims)))
    return run_on_cpu(func, plan, args, kwargs)


BN_MIXED_MESSAGE = (
    "Unknown error -2147024809 (native_batch_norm_backward of a {} input with {} weights: "
    "torch-directml 0.2.5 refuses the mixed dtypes; dmlshim emulator, gap bn-mixed-backward)")


def _bn_mixed_backward_gap(func, plan, args, kwargs):
    # (grad_out, input, weight, running_mean, running_var, save_mean, save_invstd, train, eps,
    # output_mask): a weight in another dtype than the input's is refused
    x = args[1] if len(args) > 1 else kwargs["input"]
    weight = args[2] if len(args) > 2 else kwargs.get("weight")
    if weight is not None and weight.dtype != x.dtype:
        raise RuntimeError(BN_MIXED_MESSAGE.format(x.dtype, weight.dtype))
    return run_on_cpu(func, plan, args, kwargs)


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
    "aten::native_dropout": _native_dropout,
    "aten::native_dropout_backward": _native_dropout_backward,
    "aten::native_batch_norm": _native_batch_norm,
})

BUGS.update({
    "aten::nll_loss_backward": ("nll_backward_any", _nll_backward_gap),
    "aten::nll_loss_backward.grad_input": ("nll_backward_any", _nll_backward_gap),
    "aten::nll_loss2d_backward": ("nll_backward_any", _nll_backward_gap),
    "aten::nll_loss2d_backward.grad_input": ("nll_backward_any", _nll_backward_gap),
    "aten::nll_loss_forward": ("nll_forward_any", _nll_forward_bug),
    "aten::nll_loss_forward.output": ("nll_forward_any", _nll_forward_bug),
    "aten::nll_loss2d_forward": ("nll_forward_any", _nll_forward_bug),
    "aten::nll_loss2d_forward.output": ("nll_forward_any", _nll_forward_bug),
    "aten::mul.Tensor": ("mul_bool", _mul_bool_gap),
    "aten::mul_.Tensor": ("mul_bool", _mul_bool_gap),
    "aten::mul.out": ("mul_bool", _mul_bool_gap),
    "aten::eye.out": ("eye", _eye_gap),
    "aten::eye.m_out": ("eye", _eye_gap),
    "aten::masked_fill_.Scalar": ("masked_fill_any", _masked_fill_gap),
    "aten::masked_fill_.Tensor": ("masked_fill_any", _masked_fill_gap),
    "aten::reflection_pad2d": ("reflect_pad", _reflect_pad_gap),
    "aten::reflection_pad2d.out": ("reflect_pad", _reflect_pad_gap),
    "aten::reflection_pad2d_backward": ("reflect_pad", _reflect_pad_backward_gap),
    "aten::reflection_pad2d_backward.grad_input": ("reflect_pad", _reflect_pad_backward_gap),
    "aten::native_layer_norm_backward": ("layer_norm_nobias", _layer_norm_bwd_gap),
    "aten::native_layer_norm_backward.out": ("layer_norm_nobias", _layer_norm_bwd_gap),
    "aten::max_pool2d_with_indices": ("maxpool_flat_indices", _maxpool_flat_gap),
    "aten::max_pool2d_with_indices.out": ("maxpool_flat_indices", _maxpool_flat_gap),
    "aten::max_pool2d_with_indices_backward": ("maxpool_flat_indices",
                                               _maxpool_flat_backward_gap),
    "aten::max_pool2d_with_indices_backward.grad_input": ("maxpool_flat_indices",
                                                          _maxpool_flat_backward_gap),
    "aten::resize_": ("resize", _resize_gap),
    "aten::_unique2": ("unique_counts", _unique_gap),
    "aten::_unique2.out": ("unique_counts", _unique_gap),
    "aten::flip": ("flip_negative_dims", _flip_gap),
    "aten::flip.out": ("flip_negative_dims", _flip_gap),
    "aten::sub.Tensor": ("sub_empty", _sub_empty_gap),
    "aten::add_.Tensor": ("inplace_alias", _inplace_alias_gap),
    "aten::sub_.Tensor": ("inplace_alias", _inplace_alias_gap),
    "aten::add.out": ("inplace_alias", _inplace_alias_gap),
    "aten::sub.out": ("inplace_alias", _inplace_alias_gap),
    "aten::slice.Tensor": ("slice_empty", _slice_gap),
    "aten::cat": ("cat_empty", _cat_empty_gap),
    "aten::cat.out": ("cat_empty", _cat_empty_gap),
    "aten::split.Tensor": ("split_empty", _split_gap),
    "aten::split_with_sizes": ("split_empty", _split_gap),
    "aten::rsub.Tensor": ("rsub_float_number", _rsub_gap),
    "aten::rsub.Scalar": ("rsub_float_number", _rsub_gap),
    "aten::gather": ("gather_any", _gather_gap),
    "aten::gather.out": ("gather_any", _gather_gap),
    "aten::native_batch_norm_backward": ("bn_mixed_backward", _bn_mixed_backward_gap),
    "aten::native_batch_norm_backward.out": ("bn_mixed_backward", _bn_mixed_backward_gap),
    "aten::_native_batch_norm_legit": ("bug_bn_stats", _bn_stats_bug),
    "aten::_batch_norm_with_update": ("bug_bn_stats", _bn_stats_bug),
})

BUGS.update({
    f"aten::{op}": ("scatter_any", _scatter_gap)
    for op in ("scatter.src", "scatter.value", "scatter.reduce", "scatter.value_reduce",
               "scatter_.src", "scatter_.value", "scatter_.reduce", "scatter_.value_reduce",
               "scatter.src_out", "scatter.value_out", "scatter.reduce_out",
               "scatter.value_reduce_out", "scatter_add", "scatter_add_", "scatter_add.out")
})
BUGS.update({
    f"aten::{op}": ("bug_bilinear", _bilinear_bug)
    for op in ("upsample_bilinear2d", "upsample_bilinear2d.out", "upsample_bilinear2d_backward",
               "upsample_bilinear2d_backward.grad_input")
})

# The fused LSTM cell where the ``fallback`` gap is off: as if DirectML had CUDA's kernel (the gap
# on: its CPU fallback, which has none and raises NotImplementedError, as the wheel's does)
CPU_IMPLS.update({
    "aten::_thnn_fused_lstm_cell": lstm_cell.fused_lstm_cell,
    "aten::_thnn_fused_lstm_cell_backward_impl": lstm_cell.fused_lstm_cell_backward_impl,
})
