"""PrivateUse1 kernels that replace torch-directml 0.2.5 kernels giving wrong results.

Each kernel is registered for the ``PrivateUse1`` dispatch key (below autograd, so PyTorch's
derivative formulas stay in force) by :mod:`dmlshim.patches.guards`, and computes its operator
from operators the wheel gets right. A kernel registered for an operator replaces the wheel's
own kernel for it, which it can then no longer call: where the wheel's result is right for part
of the inputs, the kernel calls a sibling overload the wheel also implements (the ``out=`` one)
instead, never the operator it implements (that would call itself).

All of them were observed on the real wheel (``../shared/reference/directml-facts.md``); the
emulator reproduces each under the gap of the same name.
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from dmlshim import events

Tensor = torch.Tensor
aten = torch.ops.aten


def _device_of(a, b) -> torch.device:
    for t in (a, b):
        if isinstance(t, Tensor) and t.device.type != "cpu":
            return t.device
    return a.device


# -- eye (#431): eye.out / eye.m_out fall back and come back empty ---------------------------


def eye_m_out(n: int, m: int, *, out: Tensor) -> Tensor:
    events.note("guard.eye")
    out.resize_((n, m))
    out.zero_()
    out.diagonal().fill_(1)
    return out


def eye_out(n: int, *, out: Tensor) -> Tensor:
    return eye_m_out(n, n, out=out)


# -- float tensor * bool tensor gives bool (#686, #737) --------------------------------------
# One Python frame per call and nothing else for the inputs the wheel gets right: the check is
# inline, and the call goes to PyTorch's own structured composite for the overload (the kernel
# PrivateUse1 would run without this registration: it allocates the result at its final shape
# and calls the wheel's mul.out), through the C entry point OpOverload._op_dk. Only a
# float/bool pair pays more: the bool operand is converted first (Tensor.to's C original,
# not the shim's wrapper).

_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional
_MUL = aten.mul.Tensor._op_dk
_MUL_ = aten.mul_.Tensor._op_dk
_TO = torch._C.TensorBase.to
_BOOL = torch.bool


def _float_bool(a, b) -> bool:
    da, db = getattr(a, "dtype", None), getattr(b, "dtype", None)
    return (db is torch.bool and da is not None and da.is_floating_point) or (
        da is torch.bool and db is not None and db.is_floating_point)


def mul_tensor(self: Tensor, other: Tensor) -> Tensor:
    a, b = self.dtype, other.dtype
    if (a is _BOOL) is not (b is _BOOL) and (a.is_floating_point or b.is_floating_point):
        events.note("guard.mul_bool")
        if a is _BOOL:
            self = _TO(self, b)
        else:
            other = _TO(other, a)
    return _MUL(_COMPOSITE, self, other)


def mul__tensor(self: Tensor, other: Tensor) -> Tensor:
    # the composite in-place kernel checks the broadcast shape against self (no resize)
    b = other.dtype
    if b is _BOOL and self.dtype.is_floating_point:
        events.note("guard.mul_bool")
        other = _TO(other, self.dtype)
    return _MUL_(_COMPOSITE, self, other)


# -- nll_loss(reduction="none") backward uses grad_output[0] for every row (#739, #740) -------


def _nll_none_grad(grad_output: Tensor, self: Tensor, target: Tensor, weight: Optional[Tensor],
                   ignore_index: int) -> Tensor:
    """d/dself of nll_loss(self, target, weight, reduction="none") times grad_output."""
    events.note("guard.nll_none")
    unbatched = self.dim() == 1
    if unbatched:
        self, target, grad_output = self.unsqueeze(0), target.unsqueeze(0), grad_output.unsqueeze(0)
    ignored = target == ignore_index
    safe = torch.where(ignored, torch.zeros_like(target), target)
    g = -grad_output
    if weight is not None:
        g = g * weight[safe]
    g = torch.where(ignored, torch.zeros_like(g), g)
    grad = torch.zeros_like(self)
    grad.scatter_(1, safe.unsqueeze(1), g.unsqueeze(1).to(grad.dtype))
    return grad.squeeze(0) if unbatched else grad


def nll_loss_backward(grad_output: Tensor, self: Tensor, target: Tensor, weight: Optional[Tensor],
                      reduction: int, ignore_index: int, total_weight: Tensor) -> Tensor:
    if reduction == 0:
        return _nll_none_grad(grad_output, self, target, weight, ignore_index)
    return aten.nll_loss_backward.grad_input(grad_output, self, target, weight, reduction,
                                             ignore_index, total_weight,
                                             grad_input=torch.empty_like(self))


def nll_loss2d_backward(grad_output: Tensor, self: Tensor, target: Tensor,
                        weight: Optional[Tensor], reduction: int, ignore_index: int,
                        total_weight: Tensor) -> Tensor:
    if reduction == 0:
        return _nll_none_grad(grad_output, self, target, weight, ignore_index)
    return aten.nll_loss2d_backward.grad_input(grad_output, self, target, weight, reduction,
                                               ignore_index, total_weight,
                                               grad_input=torch.empty_like(self))


# -- masked_fill accepts a uint8 mask (#702) -------------------------------------------------

MASK_MESSAGE = "masked_fill_ only supports boolean masks, but got mask with dtype {}"
_DTYPE_NAMES = {torch.uint8: "unsigned char", torch.int8: "signed char", torch.int16: "short",
                torch.int32: "int", torch.int64: "long int", torch.float32: "float",
                torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16"}


def _check_mask(mask: Tensor) -> None:
    if mask.dtype is not torch.bool:  # the CPU's (and CUDA's) check, word for word
        events.note("guard.masked_fill_uint8")
        raise RuntimeError(MASK_MESSAGE.format(_DTYPE_NAMES.get(mask.dtype, str(mask.dtype))))


# Registering masked_fill_ replaces the wheel's own kernel, so the fill is the wheel's
# where.self_out written into self: one launch, as the wheel's masked_fill_ is. Its 0-dim fill
# tensor is kept per (value, dtype, device): after the first call, no allocation either.
_where = torch._C._VariableFunctions.where
_full = torch._C._VariableFunctions.full
_FILLS: dict = {}
_FILLS_MAX = 256
_inference = torch.is_inference_mode_enabled


def _check_shape(self: Tensor, mask: Tensor) -> None:
    # where(out=self) would resize self to a larger broadcast shape; masked_fill_ refuses it
    ms, ss = mask.shape, self.shape
    if len(ms) > len(ss):
        raise RuntimeError(f"masked_fill_: the mask of shape {list(ms)} has more dimensions "
                           f"than the tensor of shape {list(ss)}")
    off = len(ss) - len(ms)
    for i in range(len(ms)):
        if ms[i] != ss[off + i] and ms[i] != 1:
            raise RuntimeError(f"The size of tensor a ({ss[off + i]}) must match the size of "
                               f"tensor b ({ms[i]}) at non-singleton dimension {off + i}")


def masked_fill__scalar(self: Tensor, mask: Tensor, value) -> Tensor:
    if mask.dtype is not _BOOL:
        _check_mask(mask)
    ms, ss = mask.shape, self.shape
    if ms != ss and (len(ms) > len(ss) or ms != ss[len(ss) - len(ms):]):
        _check_shape(self, mask)  # a mask broadcast with size-1 dims (or a wrong one)
    # an inference tensor and a normal one are not interchangeable on the wheel
    key = (value, value.__class__, self.dtype, self.device, _inference())
    fill = _FILLS.get(key)
    if fill is None:
        if len(_FILLS) >= _FILLS_MAX:
            _FILLS.clear()
        fill = _FILLS[key] = _full((), value, dtype=self.dtype, device=self.device)
    return _where(mask, fill, self, out=self)


def masked_fill__tensor(self: Tensor, mask: Tensor, value: Tensor) -> Tensor:
    if mask.dtype is not _BOOL:
        _check_mask(mask)
    if value.dim() != 0:
        raise RuntimeError("masked_fill_ only supports a 0-dimensional value tensor, but got "
                           f"tensor with {value.dim()} dimension(s).")
    ms, ss = mask.shape, self.shape
    if ms != ss and (len(ms) > len(ss) or ms != ss[len(ss) - len(ms):]):
        _check_shape(self, mask)
    fill = value if value.dtype is self.dtype and value.device == self.device \
        else _TO(value, device=self.device, dtype=self.dtype)
    return _where(mask, fill, self, out=self)


# -- F.pad(mode="reflect") swaps the height and width padding --------------------------------


def _reflect(x: Tensor, dim: int, before: int, after: int) -> Tensor:
    n = x.shape[dim]
    parts: List[Tensor] = []
    if before:
        parts.append(x.narrow(dim, 1, before).flip(dim))
    parts.append(x)
    if after:
        parts.append(x.narrow(dim, n - 1 - after, after).flip(dim))
    return torch.cat(parts, dim) if len(parts) > 1 else x


def reflection_pad2d(self: Tensor, padding: Sequence[int]) -> Tensor:
    left, right, top, bottom = (int(p) for p in padding)
    if min(left, right, top, bottom) < 0 or (left, right) == (top, bottom):
        # nothing to swap (or cropping): the wheel's own out= kernel is right here
        out = torch.empty(0, dtype=self.dtype, device=self.device)
        return aten.reflection_pad2d.out(self, [left, right, top, bottom], out=out)
    height, width = self.shape[-2], self.shape[-1]
    for (a, b), size, dim in (((left, right), width, self.dim() - 1),
                              ((top, bottom), height, self.dim() - 2)):
        if a >= size or b >= size:
            raise RuntimeError(
                f"Argument #4: Padding size should be less than the corresponding input "
                f"dimension, but got: padding ({a}, {b}) at dimension {dim} of input "
                f"{list(self.shape)}")
    events.note("guard.reflect_pad")
    return _reflect(_reflect(self, self.dim() - 1, left, right), self.dim() - 2, top, bottom)


# -- layer norm backward without a bias fails --------------------------------------------------


def native_layer_norm_backward(grad_out: Tensor, input: Tensor,  # noqa: A002 - aten's names
                               normalized_shape: Sequence[int], mean: Tensor, rstd: Tensor,
                               weight: Optional[Tensor], bias: Optional[Tensor],
                               output_mask: Sequence[bool]
                               ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(grad_input, grad_weight, grad_bias), each only where ``output_mask`` asks for it.

    With a weight and a bias the wheel's own kernel (its out= overload) is right and is used,
    all three gradients computed; otherwise the closed form, with x̂ = (x - mean) * rstd over
    the normalized dims and g = dy * weight: dx = rstd * (g - mean(g) - x̂ * mean(g * x̂)),
    dweight = Σ dy * x̂ and dbias = Σ dy over the other dims.
    """
    mask = [bool(m) for m in output_mask]
    if weight is not None and bias is not None:
        outs = [torch.empty(0, dtype=t.dtype, device=t.device) for t in (input, weight, bias)]
        got = aten.native_layer_norm_backward.out(grad_out, input, normalized_shape, mean, rstd,
                                                  weight, bias, [True, True, True],
                                                  out0=outs[0], out1=outs[1], out2=outs[2])
        return tuple(t if m else None for t, m in zip(got, mask))  # type: ignore[return-value]
    events.note("guard.layer_norm_nobias")
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


# guard name -> (issues, what it fixes, {aten overload: kernel})
KERNEL_GUARDS = {
    "eye": ("microsoft/DirectML#431", "torch.eye on the device comes back empty",
            {"eye.out": eye_out, "eye.m_out": eye_m_out}),
    "mul_bool": ("microsoft/DirectML#686, #737", "float tensor * bool tensor gives bool",
                 {"mul.Tensor": mul_tensor, "mul_.Tensor": mul__tensor}),
    "nll_none": ("microsoft/DirectML#739, #740",
                 "nll_loss/cross_entropy(reduction='none') backward uses grad_output[0]",
                 {"nll_loss_backward": nll_loss_backward,
                  "nll_loss2d_backward": nll_loss2d_backward}),
    "masked_fill_uint8": ("microsoft/DirectML#702", "masked_fill accepts a uint8 mask",
                          {"masked_fill_.Scalar": masked_fill__scalar,
                           "masked_fill_.Tensor": masked_fill__tensor}),
    "reflect_pad": ("not reported", "reflect padding swaps the height and width padding",
                    {"reflection_pad2d": reflection_pad2d}),
    "layer_norm_nobias": ("not reported", "layer-norm backward without a bias fails",
                          {"native_layer_norm_backward": native_layer_norm_backward}),
}
