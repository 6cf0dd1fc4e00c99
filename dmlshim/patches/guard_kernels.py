"""PrivateUse1 kernels that replace torch-directml 0.2.5 kernels giving wrong results.

Each kernel is registered for the ``PrivateUse1`` dispatch key (below autograd, so PyTorch's
derivative formulas stay in force) by :mod:`dmlshim.patches.guards`, and computes its operator
from operators the wheel gets right. A kernel registered for an operator replaces the wheel's
own kernel for it, which it can then no longer call: where the wheel's result is right for part
of the inputs, the kernel calls a sibling overload the wheel also implements (the ``out=`` one)
instead, never the operator it implements (that would call itself).

All of them were observed on the real wheel (``../shared/reference/directml-facts.md``); the
emulator reproduces each under the gap of the same name (or, for what was seen on the software
adapter only, under an opt-in ``bug-*`` switch: those guards are right with and without the bug).

The wheel's rules every kernel here follows (the emulator enforces them): each output is
allocated at its final shape (its ``out=`` kernels do not resize an empty output, ``resize_``
of a device tensor cannot change its element count); no scatter updates part of a dimension
and none accumulates (``scatter_add`` raises on the software adapter); the wheel's own kernel
(an ``out=`` sibling) is called wherever its result is right. A kernel is one Python frame: no
helpers on the paths every call takes, no factory call that dmlshim's device rule wraps
(``aten.*`` overloads instead of ``torch.empty``/``torch.arange``).
"""

from __future__ import annotations

import functools
from typing import List, Optional, Sequence, Tuple

import torch

from dmlshim import events

Tensor = torch.Tensor
aten = torch.ops.aten


# -- eye (#431): eye.out / eye.m_out fall back and come back empty ---------------------------


def eye_m(n: int, m: int, *, dtype=None, layout=None, device=None,  # noqa: ARG001
          pin_memory=None) -> Tensor:  # noqa: ARG001
    # The functional forms hand eye.out an empty tensor it cannot resize: build it at (n, m).
    events.note("guard.eye")
    rows = aten.arange.start_step(0, n, 1, dtype=torch.int64, device=device)
    cols = aten.arange.start_step(0, m, 1, dtype=torch.int64, device=device)
    value = torch.eq(rows.unsqueeze(1), cols.unsqueeze(0))
    return value.to(dtype if dtype is not None else torch.get_default_dtype())


def eye(n: int, *, dtype=None, layout=None, device=None, pin_memory=None) -> Tensor:
    return eye_m(n, n, dtype=dtype, device=device)


def eye_m_out(n: int, m: int, *, out: Tensor) -> Tensor:
    if list(out.shape) != [n, m]:
        raise RuntimeError(
            f"torch.eye(out=...): the out= tensor has shape {list(out.shape)}, and DirectML "
            f"cannot resize a device tensor; pass one of shape [{n}, {m}] (or call torch.eye "
            "without out=)")
    return out.copy_(eye_m(n, m, dtype=out.dtype, device=out.device))


def eye_out(n: int, *, out: Tensor) -> Tensor:
    return eye_m_out(n, n, out=out)


# -- float tensor * bool tensor gives bool (#686, #737) --------------------------------------
# One Python frame per call and nothing else for the inputs the wheel gets right: the check is
# inline, and the call goes to the wheel's mul.out with the result allocated at its final shape
# (torch's C functions: no shim wrapper). The in-place form goes to PyTorch's own structured
# composite (it checks the broadcast shape against self and allocates nothing), through the C
# entry point OpOverload._op_dk. Only a float/bool pair pays more: the bool operand is
# converted first (Tensor.to's C original, not the shim's wrapper).

_COMPOSITE = torch._C.DispatchKey.CompositeExplicitAutogradNonFunctional
_EMPTY = torch._C._VariableFunctions.empty
_MUL_OUT = torch._C._VariableFunctions.mul
_RESULT_TYPE = torch._C._VariableFunctions.result_type
_INFER_SIZE = torch._C._infer_size
_MUL_ = aten.mul_.Tensor._op_dk
_TO = torch._C.TensorBase.to
_BOOL = torch.bool


def mul_tensor(self: Tensor, other: Tensor) -> Tensor:
    a, b = self.dtype, other.dtype
    if (a is _BOOL) is not (b is _BOOL) and (a.is_floating_point or b.is_floating_point):
        events.note("guard.mul_bool")
        if a is _BOOL:
            self = _TO(self, b)
        else:
            other = _TO(other, a)
    # the output allocated contiguous at its final shape (the wheel's out= kernels do not
    # resize; a structured composite would follow a channels-last input's layout, which the
    # wheel refuses to allocate), through torch's C functions: no shim frame
    device = other.device if self.device.type == "cpu" else self.device
    # (result_type is an operator call: only where the dtypes differ)
    dtype = self.dtype if self.dtype is other.dtype else _RESULT_TYPE(self, other)
    out = _EMPTY(_INFER_SIZE(self.shape, other.shape), dtype=dtype, device=device)
    return _MUL_OUT(self, other, out=out)


def mul__tensor(self: Tensor, other: Tensor) -> Tensor:
    # the composite in-place kernel checks the broadcast shape against self (no resize)
    b = other.dtype
    if b is _BOOL and self.dtype.is_floating_point:
        events.note("guard.mul_bool")
        other = _TO(other, self.dtype)
    return _MUL_(_COMPOSITE, self, other)


# -- nll_loss / cross_entropy ---------------------------------------------------------------
# The wheel: the backward with reduction="none" uses grad_output[0] for every row (#739, #740);
# seen on the software adapter: a negative ignore_index is not ignored (-100 with >= 100
# classes, -1 with any), and the 2-D forward with reduction="none" is wrong. Where any of these
# can apply: an ignore_index < 0 that reads as a class (-100 with 100 classes or more, as a
# language model's vocabulary; -1 always) is remapped to class C for the wheel's own out=
# kernels, any other goes to them as it is; reduction "none" backward and the 2-D "none" forward are
# computed here from gather / eq / where / sum, ignored targets read as class 0, weighted 0.


def _nll_forward(self: Tensor, target: Tensor, weight: Optional[Tensor], reduction: int,
                 ignore_index: int, op) -> Tuple[Tensor, Tensor]:
    classes = self.shape[1] if self.dim() > 1 else self.shape[0]
    # a negative index goes wrong where it reads as a class (ignore_index + C >= 0: -100 with
    # 100 classes or more, -1 always); below that the wheel's kernel is right and runs as it is
    aliased = ignore_index < 0 and ignore_index + classes >= 0
    if aliased and (reduction != 0 or op is _NLL_OUT):
        # the ignored targets read as class C, ignore_index C: the wheel's kernel ignores a
        # non-negative index right, and its result is the CPU kernel's, bit for bit
        events.note("guard.nll")
        target = torch.where(torch.eq(target, ignore_index), classes, target)  # 2 launches
        ignore_index, aliased = classes, False
    if not aliased and (reduction != 0 or op is _NLL_OUT):
        return op(self, target, weight, reduction, ignore_index,
                  output=aten.empty.memory_format(target.shape if reduction == 0 else (),
                                                  dtype=self.dtype, device=self.device),
                  total_weight=aten.empty.memory_format((), dtype=self.dtype,
                                                        device=self.device))
    # (aten overloads and where() only: no device-rule wrapper, no mul guard, one frame)
    events.note("guard.nll")
    x = self.unsqueeze(0) if self.dim() == 1 else self
    t = target.unsqueeze(0) if self.dim() == 1 else target
    ignored = torch.eq(t, ignore_index)
    safe = torch.where(ignored, aten.zeros_like.default(t), t)
    picked = torch.neg(torch.gather(x, 1, safe.unsqueeze(1)).squeeze(1))
    zero = aten.zeros.default([], dtype=x.dtype, device=x.device)
    if weight is None:
        w = torch.where(ignored, zero, aten.ones.default([], dtype=x.dtype, device=x.device))
    else:
        w = torch.where(ignored, zero,
                        weight.index_select(0, safe.reshape(-1)).reshape(safe.shape))
    loss = aten.mul.out(picked, w, out=aten.empty.memory_format(picked.shape, dtype=x.dtype,
                                                                 device=x.device))
    total = w.sum()
    if reduction == 0:
        return (loss.squeeze(0) if self.dim() == 1 else loss), aten.zeros_like.default(total)
    if reduction == 2:
        return loss.sum(), total
    return torch.div(loss.sum(), total), total


def _nll_backward(grad_output: Tensor, self: Tensor, target: Tensor, weight: Optional[Tensor],
                  reduction: int, ignore_index: int, total_weight: Tensor, op) -> Tensor:
    """d/dself of nll_loss(self, target, weight, reduction) times grad_output."""
    classes = self.shape[1] if self.dim() > 1 else self.shape[0]
    aliased = ignore_index < 0 and ignore_index + classes >= 0  # as in the forward
    if reduction != 0 and aliased:
        events.note("guard.nll")
        target = torch.where(torch.eq(target, ignore_index), classes, target)  # 2 launches
        ignore_index, aliased = classes, False
    if reduction != 0 and not aliased:
        return op(grad_output, self, target, weight, reduction, ignore_index, total_weight,
                  # (allocated, not filled: the kernel writes every element, as the
                  # structured functional form's at::empty output shows)
                  grad_input=aten.empty.memory_format(self.shape, dtype=self.dtype,
                                                      device=self.device))
    events.note("guard.nll_none" if reduction == 0 else "guard.nll")
    x = self.unsqueeze(0) if self.dim() == 1 else self
    t = target.unsqueeze(0) if self.dim() == 1 else target
    g = grad_output.unsqueeze(0) if self.dim() == 1 and reduction == 0 else grad_output
    ignored = torch.eq(t, ignore_index)
    safe = torch.where(ignored, aten.zeros_like.default(t), t)
    g = aten._to_copy.default(torch.neg(g), dtype=x.dtype)
    if weight is not None:
        picked = weight.index_select(0, safe.reshape(-1)).reshape(safe.shape)
        g = aten.mul.out(g, picked, out=aten.empty.memory_format(
            safe.shape, dtype=x.dtype, device=x.device))
    if reduction == 1:
        g = torch.div(g, total_weight)
    zero = aten.zeros.default([], dtype=x.dtype, device=x.device)
    g = torch.where(ignored, zero, g)
    # one-hot of the target class along dim 1 (no scatter): (N, C, ...)
    classes = aten.arange.start_step(0, x.shape[1], 1, dtype=t.dtype, device=x.device)
    onehot = torch.eq(classes.reshape([1, -1] + [1] * (x.dim() - 2)), safe.unsqueeze(1))
    grad = torch.where(onehot, g.unsqueeze(1), zero)
    return grad.squeeze(0) if self.dim() == 1 else grad


_NLL_OUT = aten.nll_loss_forward.output
_NLL2D_OUT = aten.nll_loss2d_forward.output
# (partials, so that the kernel the dispatcher calls is one Python frame)
nll_loss_forward = functools.partial(_nll_forward, op=_NLL_OUT)
nll_loss2d_forward = functools.partial(_nll_forward, op=_NLL2D_OUT)
nll_loss_backward = functools.partial(_nll_backward, op=aten.nll_loss_backward.grad_input)
nll_loss2d_backward = functools.partial(_nll_backward, op=aten.nll_loss2d_backward.grad_input)


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
# tensor is kept per (value, dtype, device): after the first call, no allocation either (and
# no Python frame: lru_cache's hit path is C). The guards area clears it at uninstall.
_where = torch._C._VariableFunctions.where
_full = torch._C._VariableFunctions.full
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
    fill = fill_tensor(value, value.__class__, self.dtype, self.device, _inference())
    return _where(mask, fill, self, out=self)


@functools.lru_cache(maxsize=256)
def fill_tensor(value, kind: type, dtype: torch.dtype, device: torch.device,
                inference: bool) -> Tensor:
    """The 0-dim ``value`` on ``device`` (``kind``: its class, as 1, 1.0 and True are equal
    keys; ``inference``: made in inference mode or not, which the wheel tells apart)."""
    return _full((), value, dtype=dtype, device=device)


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


# -- F.pad(mode="reflect") swaps the height and width padding (forward and backward) ---------


def reflection_pad2d(self: Tensor, padding: Sequence[int]) -> Tensor:
    left, right, top, bottom = (int(p) for p in padding)
    height, width = self.shape[-2], self.shape[-1]
    if min(left, right, top, bottom) < 0 or (left, right) == (top, bottom):
        # nothing to swap (or cropping): the wheel's own out= kernel is right here
        out = aten.empty.memory_format(
            list(self.shape[:-2]) + [height + top + bottom, width + left + right],
            dtype=self.dtype, device=self.device)
        return aten.reflection_pad2d.out(self, [left, right, top, bottom], out=out)
    for (a, b), size, dim in (((left, right), width, self.dim() - 1),
                              ((top, bottom), height, self.dim() - 2)):
        if a >= size or b >= size:
            raise RuntimeError(
                f"Argument #4: Padding size should be less than the corresponding input "
                f"dimension, but got: padding ({a}, {b}) at dimension {dim} of input "
                f"{list(self.shape)}")
    events.note("guard.reflect_pad")
    x = self
    for dim, before, after in ((-1, left, right), (-2, top, bottom)):
        n = x.shape[dim]
        parts: List[Tensor] = [x]
        if before:
            parts.insert(0, x.narrow(dim, 1, before).flip(dim))
        if after:
            parts.append(x.narrow(dim, n - 1 - after, after).flip(dim))
        x = torch.cat(parts, dim) if len(parts) > 1 else x
    return x


def reflection_pad2d_backward(grad_output: Tensor, self: Tensor,
                              padding: Sequence[int]) -> Tensor:
    """The transpose of the reflection: the centre plus each border, flipped and added onto
    the rows (columns) it copied, placed with ``constant_pad_nd`` (no scatter)."""
    left, right, top, bottom = (int(p) for p in padding)
    if min(left, right, top, bottom) < 0 or (left, right) == (top, bottom):
        return aten.reflection_pad2d_backward.grad_input(
            grad_output, self, [left, right, top, bottom],
            grad_input=aten.zeros_like.default(self))
    events.note("guard.reflect_pad")
    g = grad_output
    for dim, before, after, n in ((-1, left, right, self.shape[-1]),
                                  (-2, top, bottom, self.shape[-2])):
        lead = [] if dim == -1 else [0, 0]
        value = g.narrow(dim, before, n)
        if before:
            part = g.narrow(dim, 0, before).flip(dim)
            value = value + aten.constant_pad_nd(part, lead + [1, n - 1 - before])
        if after:
            part = g.narrow(dim, before + n, after).flip(dim)
            value = value + aten.constant_pad_nd(part, lead + [n - 1 - after, 1])
        g = value
    return g


# -- max_pool2d_with_indices: indices flattened over the whole tensor -----------------------
# The wheel's indices are offsets into the whole input ((n * C + c) * H * W added to torch's
# per-plane index); its own backward reads them so, F.max_unpool2d (a CPU fallback) and the
# check mode's CPU kernels do not. The forward hands torch's per-plane indices out, the
# backward gives the wheel's kernel its own convention back.


def max_pool2d_with_indices(self: Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
                            padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,),
                            ceil_mode: bool = False) -> Tuple[Tensor, Tensor]:
    k = list(kernel_size) * 2 if len(kernel_size) == 1 else list(kernel_size)
    s = list(stride) * 2 if len(stride) == 1 else (list(stride) if len(stride) else k)
    p = list(padding) * 2 if len(padding) == 1 else list(padding)
    d = list(dilation) * 2 if len(dilation) == 1 else list(dilation)
    shape = list(self.shape[:-2])
    for i, size in enumerate(self.shape[-2:]):  # torch's pooling_output_shape
        n = (size + 2 * p[i] - d[i] * (k[i] - 1) - 1 + (s[i] - 1 if ceil_mode else 0)) // s[i] + 1
        if ceil_mode and (n - 1) * s[i] >= size + p[i]:
            n -= 1
        shape.append(n)
    out, indices = aten.max_pool2d_with_indices.out(
        self, k, s, p, d, ceil_mode,
        out=aten.empty.memory_format(shape, dtype=self.dtype, device=self.device),
        indices=aten.empty.memory_format(shape, dtype=torch.int64, device=self.device))
    plane = aten.full.default([], self.shape[-2] * self.shape[-1], dtype=torch.int64,
                              device=self.device)
    return out, torch.remainder(indices, plane)  # (right for per-plane indices too)


def max_pool2d_with_indices_backward(grad_output: Tensor, self: Tensor,
                                     kernel_size: Sequence[int], stride: Sequence[int],
                                     padding: Sequence[int], dilation: Sequence[int],
                                     ceil_mode: bool, indices: Tensor) -> Tensor:
    plane = self.shape[-2] * self.shape[-1]
    offsets = aten.arange.start_step(0, self.numel(), plane, dtype=indices.dtype,
                                     device=indices.device)
    flat = indices + offsets.reshape(list(indices.shape[:-2]) + [1, 1])
    return aten.max_pool2d_with_indices_backward.grad_input(
        grad_output, self, kernel_size, stride, padding, dilation, ceil_mode, flat,
        grad_input=aten.zeros_like.default(self))


# -- bilinear interpolation (software adapter: wrong forward and backward) ------------------


def _source(in_size: int, out_size: int, align_corners: bool, scale: Optional[float],
            device) -> Tuple[Tensor, Tensor, Tensor]:
    """torch's linear source indices i0, i1 and weight of i1 (area_pixel_compute_source_index)."""
    dst = aten.arange.start_step(0, out_size, 1, dtype=torch.float32, device=device)
    if align_corners:
        src = dst * ((in_size - 1) / (out_size - 1) if out_size > 1 else 0.0)
    else:
        ratio = 1.0 / scale if scale is not None and scale > 0 else in_size / out_size
        src = torch.clamp_min((dst + 0.5) * ratio - 0.5, 0.0)
    i0 = torch.clamp_max(torch.floor(src), in_size - 1).to(torch.int64)
    i1 = i0 + torch.lt(i0, in_size - 1).to(torch.int64)
    return i0, i1, src - i0.to(torch.float32)


def _matrix(in_size: int, out_size: int, align_corners: bool, scale: Optional[float],
            device, dtype) -> Tensor:
    """(out_size, in_size): row j holds the two weights of output j (one-hot, no scatter)."""
    i0, i1, w1 = _source(in_size, out_size, align_corners, scale, device)
    cols = aten.arange.start_step(0, in_size, 1, dtype=torch.int64, device=device).unsqueeze(0)
    m = (torch.eq(cols, i0.unsqueeze(1)).to(torch.float32) * (1 - w1).unsqueeze(1)
         + torch.eq(cols, i1.unsqueeze(1)).to(torch.float32) * w1.unsqueeze(1))
    return m.to(dtype)


def upsample_bilinear2d(self: Tensor, output_size: Sequence[int], align_corners: bool,
                        scales_h: Optional[float] = None,
                        scales_w: Optional[float] = None) -> Tensor:
    # the CPU kernel's order: along the width, then the height, gathered with index_select
    events.note("guard.bilinear")
    oh, ow = (int(v) for v in output_size)
    h, w = self.shape[-2], self.shape[-1]
    x = self.float() if self.dtype in (torch.float16, torch.bfloat16) else self
    c0, c1, cw = _source(w, ow, align_corners, scales_w, self.device)
    x = x.index_select(-1, c0) * (1 - cw).to(x.dtype) + x.index_select(-1, c1) * cw.to(x.dtype)
    r0, r1, rw = _source(h, oh, align_corners, scales_h, self.device)
    rw = rw.to(x.dtype).unsqueeze(1)
    x = x.index_select(-2, r0) * (1 - rw) + x.index_select(-2, r1) * rw
    return x.to(self.dtype)


def upsample_bilinear2d_backward(grad_output: Tensor, output_size: Sequence[int],
                                 input_size: Sequence[int], align_corners: bool,
                                 scales_h: Optional[float] = None,
                                 scales_w: Optional[float] = None) -> Tensor:
    # the transpose of the interpolation: M_h^T @ grad @ M_w (matmul, no scatter_add)
    events.note("guard.bilinear")
    h, w = int(input_size[-2]), int(input_size[-1])
    g = grad_output.float() if grad_output.dtype in (torch.float16, torch.bfloat16) \
        else grad_output
    mh = _matrix(h, int(output_size[0]), align_corners, scales_h, g.device, g.dtype)
    mw = _matrix(w, int(output_size[1]), align_corners, scales_w, g.device, g.dtype)
    return torch.matmul(torch.matmul(mh.t(), g), mw).to(grad_output.dtype)


# -- torch.unique(return_counts=True) raises ------------------------------------------------


def unique2(self: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
            return_counts: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """CUDA's algorithm from kernels the wheel has: stable sort, mark where the value changes,
    masked_select the firsts; inverse = cumsum of the marks put back in input order
    (index_put_), counts = distances between the marks' positions (nonzero)."""
    flat = self.reshape(-1)
    n = flat.numel()
    long = dict(dtype=torch.int64, device=self.device)
    values, perm = torch.sort(flat, stable=True)
    first = aten.ones.default([n], dtype=torch.bool, device=self.device)
    if n > 1:
        first = torch.cat([first[:1], torch.ne(values[1:], values[:-1])])
    out = torch.masked_select(values, first)
    inverse = aten.empty.memory_format([0], **long)
    counts = aten.empty.memory_format([0], **long)
    if return_inverse:
        events.note("guard.unique")
        ids = torch.cumsum(first.to(torch.int64), 0) - 1
        inverse = aten.empty.memory_format([n], **long).index_put_((perm,), ids)
        inverse = inverse.reshape(self.shape)
    if return_counts:
        events.note("guard.unique")
        starts = torch.nonzero(first).reshape(-1)
        ends = torch.cat([starts[1:], aten.full.default([1], n, **long)])
        counts = ends - starts
    return out, inverse, counts


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
        # the wheel's own kernel, each output allocated at its final shape (it does not resize)
        got = aten.native_layer_norm_backward.out(
            grad_out, input, normalized_shape, mean, rstd, weight, bias, mask,
            out0=aten.empty_like.default(input), out1=aten.empty_like.default(weight),
            out2=aten.empty_like.default(bias))
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


# -- logsumexp: PyTorch's composite hands sum.out an empty result, which the wheel's out=
# kernels do not resize (facts file: add(out=empty(0)) comes back empty), then adds the
# maxima into it: "The size of tensor a (0) must match ...". The same formula from functional
# ops, each of which allocates its result at its final shape.


def logsumexp(self: Tensor, dim, keepdim: bool = False) -> Tensor:
    events.note("guard.logsumexp")
    if self.numel() == 0:
        return torch.log(torch.sum(torch.exp(self), dim, keepdim))
    dims = list(dim) if isinstance(dim, (list, tuple)) else [dim]
    x = self if self.is_floating_point() else self.to(torch.get_default_dtype())
    maxes = torch.amax(x, dims, True)
    # infinite maxima (all -inf, or an inf) are taken as 0, as PyTorch's kernel does
    maxes = torch.where(torch.isinf(maxes), torch.zeros_like(maxes), maxes)
    out = torch.log(torch.sum(torch.exp(torch.sub(x, maxes)), dims, True))
    out = torch.add(out, maxes)
    return out if keepdim else out.squeeze(dims)


# guard name -> (issues, what it fixes, {aten overload: kernel})
KERNEL_GUARDS = {
    "eye": ("microsoft/DirectML#431", "torch.eye on the device comes back empty",
            {"eye": eye, "eye.m": eye_m, "eye.out": eye_out, "eye.m_out": eye_m_out}),
    "mul_bool": ("microsoft/DirectML#686, #737", "float tensor * bool tensor gives bool",
                 {"mul.Tensor": mul_tensor, "mul_.Tensor": mul__tensor}),
    "nll_none": ("microsoft/DirectML#739, #740",
                 "nll_loss/cross_entropy(reduction='none') backward uses grad_output[0]",
                 {"nll_loss_backward": nll_loss_backward,
                  "nll_loss2d_backward": nll_loss2d_backward}),
    "nll_ignore": ("software adapter", "cross_entropy/nll_loss with a negative ignore_index "
                   "does not ignore (>= 100 classes; -1 always); 2-D reduction='none' forward "
                   "wrong", {"nll_loss_forward": nll_loss_forward,
                             "nll_loss2d_forward": nll_loss2d_forward}),
    "masked_fill_uint8": ("microsoft/DirectML#702", "masked_fill accepts a uint8 mask",
                          {"masked_fill_.Scalar": masked_fill__scalar,
                           "masked_fill_.Tensor": masked_fill__tensor}),
    "reflect_pad": ("not reported", "reflect padding swaps the height and width padding "
                    "(and its backward then raises DirectML's partial-scatter error)",
                    {"reflection_pad2d": reflection_pad2d,
                     "reflection_pad2d_backward": reflection_pad2d_backward}),
    "max_pool_indices": ("not reported", "max_pool2d_with_indices returns indices flattened "
                         "over the whole tensor (F.max_unpool2d fails on them)",
                         {"max_pool2d_with_indices": max_pool2d_with_indices,
                          "max_pool2d_with_indices_backward": max_pool2d_with_indices_backward}),
    "bilinear": ("software adapter", "bilinear interpolate forward and backward wrong",
                 {"upsample_bilinear2d": upsample_bilinear2d,
                  "upsample_bilinear2d_backward": upsample_bilinear2d_backward}),
    "unique_counts": ("not reported", "torch.unique(return_counts=True) raises",
                      {"_unique2": unique2}),
    "layer_norm_nobias": ("not reported", "layer-norm backward without a bias fails",
                          {"native_layer_norm_backward": native_layer_norm_backward}),
    "logsumexp": ("not reported", "torch.logsumexp's composite hands the wheel's sum.out an "
                  "empty result it does not resize", {"logsumexp": logsumexp}),
}
