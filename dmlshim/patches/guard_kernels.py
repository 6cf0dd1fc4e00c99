"""Device kernels that replace or fix torch-directml 0.2.5 kernels giving wrong results.

All of them were observed on the real wheel (``../shared/reference/directml-facts.md``); the
emulator reproduces each under the gap of the same name (or, for what was seen on the software
adapter only, under an opt-in ``bug-*`` switch: those guards are right with and without the bug).
:mod:`dmlshim.patches.guards` registers them (``torch.library``) for the key
:data:`KERNEL_KEYS` names, in two kinds:

* **Input fixes, on ``AutogradPrivateUse1``** (above autograd): where the wheel's kernel is
  right for part of the inputs (or for all, once they are fixed: float × bool, a negative
  ``ignore_index``, negative ``flip`` dims), the kernel fixes the inputs and hands them to the
  wheel's own kernel through torch's autograd kernel for the op: with ``AutogradPrivateUse1``
  excluded and ``AutogradOther`` included in the thread's dispatch keys (see
  :data:`_NOT_HERE`), the call reaches the autograd kernel torch registers for every backend,
  which records the derivative formula and goes on to the wheel's kernel as any call does.
  Where the result must be computed otherwise (reflect padding of unequal sides, the 2-D
  ``nll_loss`` forward with reduction none, ``unique`` counts), it is built from functional ops
  above autograd, which then records their derivatives. The wheel's own C++ kernels, which call
  other ops below autograd (its batch norm, dropout and attention multiply by wrapped-number
  scalars), never pass through Python here.
* **Replacements, on ``PrivateUse1``** (below autograd: PyTorch's derivative formula stays in
  force): ``eye``, bilinear interpolation and ``logsumexp``, computed from functional ops the
  wheel gets right, never calling the wheel's kernel for the op itself.

The wheel's rules every kernel here follows (the emulator enforces them): it accepts every
argument form the dispatcher hands it (a wrapped-number scalar arrives as a Python number: ``x
* 2.0``, ``2.0 * x``); it never calls an ``out=`` overload of the wheel (its ``out=`` kernels
return dangling tensors to a boxed caller: heap corruption; ``nll_loss_forward.output`` aborts
the process) and calls the wheel's in-place kernels through torch's C functions (unboxed: a
boxed call of its ``masked_fill_`` loses the write); each dimension it passes is non-negative
(``flip`` with a negative dim segfaults in the wheel); each output is allocated at its final
shape by a functional op; no scatter updates part of a dimension and none accumulates
(``scatter_add`` raises on the software adapter). A kernel is one Python frame on the paths
every call takes: no helpers there, no factory call that dmlshim's device rule wraps
(``aten.*`` overloads instead of ``torch.empty``/``torch.arange``).
"""

from __future__ import annotations

import functools
from typing import Dict, List, Optional, Sequence, Tuple

import torch

from dmlshim import events

Tensor = torch.Tensor
aten = torch.ops.aten

# Inside ``with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):`` a call of a device op skips the
# kernels registered for AutogradPrivateUse1 (these) and AutocastPrivateUse1 (already run for
# this call) and reaches torch's autograd kernel through AutogradOther (the same generated
# kernel as AutogradPrivateUse1's): the derivative is recorded, and the op goes on below
# autograd to the wheel's kernel. Torch's C functions (``torch._C._VariableFunctions``,
# ``torch._C._nn``, ``TensorBase`` methods) make the call unboxed and accept numbers where the
# dispatcher does; ops without one are called boxed through ``OpOverload._op``, functional ones
# only.
_EXCLUDE = torch._C._ExcludeDispatchKeyGuard
_INCLUDE = torch._C._IncludeDispatchKeyGuard
_NOT_HERE = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradPrivateUse1)
             | torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1))
_OTHER = torch._C.DispatchKey.AutogradOther
AUTOGRAD_KEY = "AutogradPrivateUse1"
# torch.arange's C function (unboxed, below autograd): a boxed aten.arange.* call above
# autograd gets the wheel's empty out= tensor back (its arange.start_out returns a new tensor
# and leaves the one it was handed; autograd's out= layer returns the one it was handed)
_ARANGE = torch._C._VariableFunctions.arange


# -- eye (#431): eye.out / eye.m_out fall back and come back empty ---------------------------


def eye_m(n: int, m: int, *, dtype=None, layout=None, device=None,  # noqa: ARG001
          pin_memory=None) -> Tensor:  # noqa: ARG001
    # The functional forms hand eye.out an empty tensor it cannot resize: build it at (n, m).
    events.note("guard.eye")
    rows = _ARANGE(0, n, 1, dtype=torch.int64, device=device)
    cols = _ARANGE(0, m, 1, dtype=torch.int64, device=device)
    value = torch.eq(rows.unsqueeze(1), cols.unsqueeze(0))
    return value.to(dtype if dtype is not None else torch.get_default_dtype())


def eye(n: int, *, dtype=None, layout=None, device=None, pin_memory=None) -> Tensor:
    return eye_m(n, n, dtype=dtype, device=device)


def eye_m_out(n: int, m: int, *, out: Tensor) -> Tensor:
    return _eye_into(out, n, m)


def eye_out(n: int, *, out: Tensor) -> Tensor:
    return _eye_into(out, n, n)


def _eye_into(out: Tensor, n: int, m: int) -> Tensor:
    if list(out.shape) != [n, m]:
        raise RuntimeError(
            f"torch.eye(out=...): the out= tensor has shape {list(out.shape)}, and DirectML "
            f"cannot resize a device tensor; pass one of shape [{n}, {m}] (or call torch.eye "
            "without out=)")
    return out.copy_(eye_m(n, m, dtype=out.dtype, device=out.device))


# -- float tensor * bool tensor gives bool (#686, #737) --------------------------------------
# Above autograd: the bool operand becomes the float dtype (Tensor.to's C original, not the
# shim's wrapper), then the wheel's own mul. One Python frame per call and nothing else for
# the inputs the wheel gets right. A wrapped-number operand (x * 2.0, 2.0 * x) arrives as a
# Python number: nothing to fix then.

_MUL = torch._C._VariableFunctions.mul
_MUL_ = torch._C.TensorBase.mul_
_TO = torch._C.TensorBase.to
_BOOL = torch.bool
_F32 = torch.float32


def mul_tensor(self, other) -> Tensor:
    try:
        a, b = self.dtype, other.dtype
    except AttributeError:  # a Python number
        pass
    else:
        if (a is _BOOL) is not (b is _BOOL) and (a.is_floating_point or b.is_floating_point):
            events.note("guard.mul_bool")
            if a is _BOOL:
                self = _TO(self, b)
            else:
                other = _TO(other, a)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _MUL(self, other)


def mul__tensor(self: Tensor, other) -> Tensor:
    try:
        b = other.dtype
    except AttributeError:  # a Python number
        pass
    else:
        if b is _BOOL and self.dtype.is_floating_point:
            events.note("guard.mul_bool")
            other = _TO(other, self.dtype)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _MUL_(self, other)


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
        events.note("guard.nll")
        target = torch.where(torch.eq(target, ignore_index), classes, target)  # 2 launches
        ignore_index = classes
    if reduction != 0 or op is _NLL:
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            return op(self, target, weight, reduction, ignore_index)
    # the 2-D forward with reduction none: -weight[t] * x[n, t, h, w], 0 where ignored, from
    # a one-hot selection along the classes (autograd records where and sum: no scatter)
    events.note("guard.nll")
    ignored = torch.eq(target, ignore_index)
    safe = torch.where(ignored, 0, target)
    zero = aten.zeros.default([], dtype=self.dtype, device=self.device)
    ids = _ARANGE(0, classes, 1, dtype=target.dtype, device=self.device)
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
        events.note("guard.nll")
        target = torch.where(torch.eq(target, ignore_index), classes, target)  # 2 launches
        ignore_index = classes
    if reduction != 0:
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            return op(grad_output, self, target, weight, reduction, ignore_index, total_weight)
    events.note("guard.nll_none")
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
    ids = _ARANGE(0, x.shape[1], 1, dtype=t.dtype, device=x.device)
    onehot = torch.eq(ids.reshape([1, -1] + [1] * (x.dim() - 2)), safe.unsqueeze(1))
    grad = torch.where(onehot, g.unsqueeze(1), zero)
    return grad.squeeze(0) if self.dim() == 1 else grad


# (partials, so that the kernel the dispatcher calls is one Python frame)
nll_loss_forward = functools.partial(_nll_forward, op=_NLL)
nll_loss2d_forward = functools.partial(_nll_forward, op=_NLL2D)
nll_loss_backward = functools.partial(_nll_backward, op=_NLL_BACKWARD)
nll_loss2d_backward = functools.partial(_nll_backward, op=_NLL2D_BACKWARD)


# -- masked_fill accepts a uint8 mask (#702) -------------------------------------------------

MASK_MESSAGE = "masked_fill_ only supports boolean masks, but got mask with dtype {}"
_DTYPE_NAMES = {torch.uint8: "unsigned char", torch.int8: "signed char", torch.int16: "short",
                torch.int32: "int", torch.int64: "long int", torch.float32: "float",
                torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16"}


def _check_mask(mask: Tensor) -> None:
    if mask.dtype is not torch.bool:  # the CPU's (and CUDA's) check, word for word
        events.note("guard.masked_fill_uint8")
        raise RuntimeError(MASK_MESSAGE.format(_DTYPE_NAMES.get(mask.dtype, str(mask.dtype))))


# Above autograd: a non-bool mask is refused with the CPU's error; a bool one fills through
# where, copied into self. Not the wheel's masked_fill_: it rebinds the tensor it was handed
# instead of writing into it, which only an unboxed caller sees (a Python kernel is a boxed
# one: a C++ caller of this kernel, such as the mask conversion of scaled_dot_product_attention,
# would get its tensor back unfilled; the same as under a TorchDispatchMode, facts file).
# Callers below autograd (C++ composites such as Tensor.masked_fill) still reach the wheel's.
_WHERE = torch._C._VariableFunctions.where
_COPY_ = torch._C.TensorBase.copy_
# Tensor.masked_fill (functional): the wheel's composite (a clone filled by its masked_fill_,
# all in C++), after the mask check
_MASKED_FILL = torch._C.TensorBase.masked_fill


def masked_fill(self: Tensor, mask: Tensor, value) -> Tensor:
    if mask.dtype is not _BOOL:
        _check_mask(mask)
    if isinstance(value, Tensor) and value.device != self.device:
        # a CPU 0-dim value, as CUDA takes it (the wheel's kernel asserts: "unbox expects Dml
        # at::Tensor as inputs")
        value = _TO(value, device=self.device)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _MASKED_FILL(self, mask, value)


def _check_shape(self: Tensor, mask: Tensor) -> None:
    # masked_fill_ refuses a mask that broadcasts to a larger shape than self's (the CPU's check)
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
    return _COPY_(self, _WHERE(mask, value, self))


def masked_fill__tensor(self: Tensor, mask: Tensor, value: Tensor) -> Tensor:
    if mask.dtype is not _BOOL:
        _check_mask(mask)
    ms, ss = mask.shape, self.shape
    if ms != ss and (len(ms) > len(ss) or ms != ss[len(ss) - len(ms):]):
        _check_shape(self, mask)
    if value.device != self.device:  # a CPU 0-dim value (where would broadcast it too)
        value = _TO(value, device=self.device)
    return _COPY_(self, _WHERE(mask, value, self))


# -- F.pad(mode="reflect") swaps the height and width padding (forward and backward) ---------
# Above autograd: equal sides (nothing to swap) or cropping go to the wheel's own kernel;
# unequal ones are built from narrow, flip and cat (autograd records those), with the dims
# non-negative (the wheel's flip segfaults on a negative one).

_REFLECTION_PAD2D = torch._C._nn.reflection_pad2d
_REFLECTION_PAD2D_BACKWARD = aten.reflection_pad2d_backward.default._op  # functional


def reflection_pad2d(self: Tensor, padding: Sequence[int]) -> Tensor:
    left, right, top, bottom = (int(p) for p in padding)
    if min(left, right, top, bottom) < 0 or (left, right) == (top, bottom):
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            return _REFLECTION_PAD2D(self, padding)
    w, h = self.dim() - 1, self.dim() - 2
    for (a, b), dim in (((left, right), w), ((top, bottom), h)):
        if a >= self.shape[dim] or b >= self.shape[dim]:
            raise RuntimeError(
                f"Argument #4: Padding size should be less than the corresponding input "
                f"dimension, but got: padding ({a}, {b}) at dimension {dim} of input "
                f"{list(self.shape)}")
    events.note("guard.reflect_pad")
    x = self
    for dim, before, after in ((w, left, right), (h, top, bottom)):
        n = x.shape[dim]
        parts: List[Tensor] = [x]
        if before:
            parts.insert(0, x.narrow(dim, 1, before).flip([dim]))
        if after:
            parts.append(x.narrow(dim, n - 1 - after, after).flip([dim]))
        x = torch.cat(parts, dim) if len(parts) > 1 else x
    return x


def reflection_pad2d_backward(grad_output: Tensor, self: Tensor,
                              padding: Sequence[int]) -> Tensor:
    """The transpose of the reflection: the centre plus each border, flipped and added onto
    the rows (columns) it copied, placed with ``constant_pad_nd`` (no scatter)."""
    left, right, top, bottom = (int(p) for p in padding)
    if min(left, right, top, bottom) < 0 or (left, right) == (top, bottom):
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            return _REFLECTION_PAD2D_BACKWARD(grad_output, self, padding)
    events.note("guard.reflect_pad")
    g = grad_output
    w, h = g.dim() - 1, g.dim() - 2
    for dim, before, after, n in ((w, left, right, self.shape[-1]),
                                  (h, top, bottom, self.shape[-2])):
        lead = [] if dim == w else [0, 0]
        value = g.narrow(dim, before, n)
        if before:
            part = g.narrow(dim, 0, before).flip([dim])
            value = value + aten.constant_pad_nd.default(part, lead + [1, n - 1 - before])
        if after:
            part = g.narrow(dim, before + n, after).flip([dim])
            value = value + aten.constant_pad_nd.default(part, lead + [n - 1 - after, 1])
        g = value
    return g


# -- max_pool2d_with_indices: indices flattened over the whole tensor -----------------------
# The wheel's indices are offsets into the whole input ((n * C + c) * H * W added to torch's
# per-plane index); its own backward reads them so, F.max_unpool2d (a CPU fallback) and the
# check mode's CPU kernels do not. Above autograd: the wheel's kernel runs (autograd keeps its
# indices for the wheel's backward), and the caller gets torch's per-plane indices.

_MAX_POOL2D = torch._C._nn.max_pool2d_with_indices


def max_pool2d_with_indices(self: Tensor, kernel_size: Sequence[int], stride: Sequence[int] = (),
                            padding: Sequence[int] = (0,), dilation: Sequence[int] = (1,),
                            ceil_mode: bool = False) -> Tuple[Tensor, Tensor]:
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        out, indices = _MAX_POOL2D(self, kernel_size, stride, padding, dilation, ceil_mode)
    # (right for per-plane indices too)
    return out, torch.remainder(indices, self.shape[-2] * self.shape[-1])


# -- bilinear interpolation (software adapter: wrong forward and backward) ------------------


def _source(in_size: int, out_size: int, align_corners: bool, scale: Optional[float],
            device) -> Tuple[Tensor, Tensor, Tensor]:
    """torch's linear source indices i0, i1 and weight of i1 (area_pixel_compute_source_index)."""
    dst = _ARANGE(0, out_size, 1, dtype=torch.float32, device=device)
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
    cols = _ARANGE(0, in_size, 1, dtype=torch.int64, device=device).unsqueeze(0)
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
    wd, hd = x.dim() - 1, x.dim() - 2  # (dims passed to the wheel non-negative)
    x = x.index_select(wd, c0) * (1 - cw).to(x.dtype) + x.index_select(wd, c1) * cw.to(x.dtype)
    r0, r1, rw = _source(h, oh, align_corners, scales_h, self.device)
    rw = rw.to(x.dtype).unsqueeze(1)
    x = x.index_select(hd, r0) * (1 - rw) + x.index_select(hd, r1) * rw
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


# -- torch.unique(return_counts=True) and (return_inverse=True) raise ------------------------
# Above autograd (unique has no gradient): without either the wheel's own kernel; with one,
# CUDA's algorithm from kernels the wheel has.

_UNIQUE2 = torch._C._VariableFunctions._unique2


def unique2(self: Tensor, sorted: bool = True, return_inverse: bool = False,  # noqa: A002
            return_counts: bool = False) -> Tuple[Tensor, Tensor, Tensor]:
    """Stable sort, mark where the value changes, masked_select the firsts; inverse = cumsum
    of the marks put back in input order (index_put_ of a permutation), counts = distances
    between the marks' positions (nonzero)."""
    if not return_counts and not return_inverse:
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            return _UNIQUE2(self, sorted, return_inverse, return_counts)
    events.note("guard.unique")
    flat = self.reshape(-1)
    n = flat.numel()
    long = dict(dtype=torch.int64, device=self.device)
    values, perm = torch.sort(flat, dim=0, stable=True)
    first = aten.ones.default([n], dtype=torch.bool, device=self.device)
    if n > 1:
        first = torch.cat([first[:1], torch.ne(values[1:], values[:-1])])
    out = torch.masked_select(values, first)
    inverse = aten.zeros.default([0], **long)
    if return_inverse:
        ids = torch.cumsum(first.to(torch.int64), 0) - 1
        inverse = aten.zeros.default([n], **long).index_put_((perm,), ids)
        inverse = inverse.reshape(self.shape)
    if not return_counts:
        return out, inverse, aten.zeros.default([0], **long)
    starts = torch.nonzero(first).reshape(-1)
    ends = torch.cat([starts[1:], aten.full.default([1], n, **long)])
    return out, inverse, torch.sub(ends, starts)


# -- a read back of one number with the GIL held deadlocks ------------------------------------
# torch reads a device tensor given where a number goes (``torch.zeros(b, counts.max(), n)``,
# ``torch.full(size, t)``, ``torch.arange(t)``: YOLOv8's assigner) with ``item()`` while it
# holds the GIL. The wheel's read back waits on a fence its event thread signals once it has
# run the completions queued before it, and a completion that drops the last reference to a
# tensor Python has already let go of (torch then keeps the tensor's Python object alive from
# C++) takes the GIL to free it: neither thread moves again. Above autograd, the copy to the
# host goes through Tensor.to's C binding, which waits with the GIL released; ``Tensor.item()``
# itself releases it too, so that path only gains this frame.


def local_scalar_dense(self: Tensor):
    # not counted in the exit summary's "guards applied": every read back of a number takes it
    return _ITEM(_TO(self, "cpu"))


# -- torch.cat with an empty operand raises E_INVALIDARG --------------------------------------
# (ultralytics' NMS: ``torch.cat((box, conf, j, mask), 1)`` with a zero-width mask when the
# model has no mask outputs.) Above autograd: the empty operands are left out after torch's
# checks of them, and the wheel's own cat gets the others; the result has the dtype of all of
# them. Every call pays one frame (the loop), as the multiplication guard does.

_CAT = torch._C._VariableFunctions.cat


def cat(tensors: List[Tensor], dim: int = 0) -> Tensor:
    for t in tensors:
        if t.numel() == 0:
            break
    else:
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            return _CAT(tensors, dim)
    return _cat_without_empties(tensors, dim)


def _cat_without_empties(tensors: List[Tensor], dim: int) -> Tensor:
    events.note("guard.cat_empty")
    dtype = tensors[0].dtype
    for t in tensors[1:]:
        dtype = torch.promote_types(dtype, t.dtype)
    # torch skips 1-D empty tensors (its legacy form) in any dim; the others must fit, with the
    # CPU's and CUDA's messages (torch's meta kernel words them otherwise)
    shaped = [(i, t) for i, t in enumerate(tensors) if t.dim() != 1 or t.shape[0] != 0]
    if not shaped:
        return aten.empty.memory_format([0], dtype=dtype, device=tensors[0].device)
    ref = shaped[0][1]
    d = _wrap_dim(dim, ref.dim())
    for i, t in shaped[1:]:
        if t.dim() != ref.dim():
            raise RuntimeError("Tensors must have same number of dimensions: got "
                               f"{ref.dim()} and {t.dim()}")
        for k in range(ref.dim()):
            if k != d and t.shape[k] != ref.shape[k]:
                raise RuntimeError(
                    f"Sizes of tensors must match except in dimension {d}. Expected size "
                    f"{ref.shape[k]} but got size {t.shape[k]} for tensor number {i} in the "
                    "list.")
    keep = [t for _, t in shaped if t.numel() != 0]
    if not keep:
        size = list(ref.shape)
        size[d] = sum(t.shape[d] for _, t in shaped)
        return aten.empty.memory_format(size, dtype=dtype, device=ref.device)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        out = _CAT(keep, d)
    return out if out.dtype == dtype else _TO(out, dtype)


# -- an empty slice that starts past 0 segfaults --------------------------------------------
# (``x[:, 6:]`` of an ``(n, 6)`` tensor: ultralytics' validation, a detection model's "extra"
# columns.) The wheel's view of it points past the tensor's end; the same empty slice taken at
# the front (``x[:, 0:0]``, what the guard hands the wheel's kernel instead) works. Above
# autograd: the wheel's own slice (through torch's autograd kernel) for every call, the bounds
# checked inline: one frame per slice of a device tensor.

_SLICE = aten.slice.Tensor._op  # boxed: torch has no C function for slice


def slice_tensor(self: Tensor, dim: int = 0, start=None, end=None, step: int = 1) -> Tensor:
    if start is not None and start != 0 and -self.dim() <= dim < self.dim():
        size = self.shape[dim]
        s = start + size if start < 0 else start
        e = size if end is None else (end + size if end < 0 else end)
        if s > 0 and (s >= size or e <= s):  # empty, past the front
            events.note("guard.slice_empty")
            start, end = 0, 0
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _SLICE(self, dim, start, end, step)


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
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            return _LAYER_NORM_BACKWARD(grad_out, input, normalized_shape, mean, rstd, weight,
                                        bias, output_mask)
    events.note("guard.layer_norm_nobias")
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


# -- logsumexp: PyTorch's composite hands sum.out an empty result, which the wheel's out=
# kernels do not resize (facts file: add(out=empty(0)) comes back empty), then adds the
# maxima into it: "The size of tensor a (0) must match ...". The same formula from functional
# ops, each of which allocates its result at its final shape (below autograd: logsumexp's
# derivative formula stays).


def logsumexp(self: Tensor, dim, keepdim: bool = False) -> Tensor:
    events.note("guard.logsumexp")
    rank = max(self.dim(), 1)
    dims = [d % rank for d in (dim if isinstance(dim, (list, tuple)) else [dim])]
    if self.numel() == 0:
        return torch.log(torch.sum(torch.exp(self), dims, keepdim))
    x = self if self.is_floating_point() else self.to(torch.get_default_dtype())
    maxes = torch.amax(x, dims, True)
    # infinite maxima (all -inf, or an inf) are taken as 0, as PyTorch's kernel does
    maxes = torch.where(torch.isinf(maxes), torch.zeros_like(maxes), maxes)
    out = torch.log(torch.sum(torch.exp(torch.sub(x, maxes)), dims, True))
    out = torch.add(out, maxes)
    return out if keepdim else out.squeeze(dims)


# -- flip with a negative dim segfaults in the wheel (torch_dml::flip_dml_helper) -------------
# Above autograd: the dims made non-negative, then the wheel's own flip (torchvision's hflip
# and vflip call flip(-1) and flip(-2) on device tensors).

_FLIP = torch._C._VariableFunctions.flip


def _wrap_dim(dim: int, rank: int) -> int:
    """``dim`` made non-negative as torch does it, or torch's IndexError (the wheel gets no
    dim it could crash on)."""
    size = max(rank, 1)
    if not -size <= dim < size:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-size}, "
                         f"{size - 1}], but got {dim})")
    return dim % size


def flip(self: Tensor, dims: Sequence[int]) -> Tensor:
    rank = self.dim()
    for d in dims:
        if d < 0 or d >= rank:
            dims = [_wrap_dim(d, rank) for d in dims]
            break
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _FLIP(self, dims)


# -- number - tensor: "does not support Double" -----------------------------------------------
# ``1.0 - x`` (Tensor.__rsub__; diffusion schedules, IoU losses) reaches rsub with the number
# as a CPU float64 wrapped scalar, which the wheel's kernel refuses ("The GPU device does not
# support Double (Float64) operations!"); an int number or a tensor works. Above autograd:
# other - alpha * self as -self + other (bit for bit the same), the number staying a number
# (torch's promotion: a float number with an integer tensor gives the default float dtype).

_NEG = torch._C._VariableFunctions.neg
_ADD = torch._C._VariableFunctions.add
_RSUB = torch._C._VariableFunctions.rsub
_ITEM = torch._C.TensorBase.item


def rsub_tensor(self: Tensor, other, alpha=1) -> Tensor:
    if type(other) is Tensor and other.dim() == 0 and other.dtype is torch.float64 \
            and other.device.type == "cpu":
        other = _ITEM(other)  # the wrapped scalar of a Python float
    if isinstance(other, float) and self.dtype is not _BOOL:
        events.note("guard.rsub_number")
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            scaled = _NEG(self) if alpha == 1 else _MUL(self, -alpha)
            return _ADD(scaled, other)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _RSUB(self, other, alpha=alpha)


# -- sub of empty tensors: the wrong shape ----------------------------------------------------
# (0, 1) - (0, 1) gives (0, 0) on the wheel, in place too, and so does add with an alpha
# (YOLOv8's CIoU on a batch without matches: the indexing after it then fails). Above autograd:
# with an empty operand, self + (-alpha * other) through neg/mul and add without alpha (the
# same numbers; those keep the shape); any other call goes to the wheel's own sub.

_SUB = torch._C._VariableFunctions.sub
_SUB_ = torch._C.TensorBase.sub_


def _negated(other, alpha):
    if type(other) is not Tensor:
        return -alpha * other
    return _NEG(other) if alpha == 1 else _MUL(other, -alpha)


def sub_tensor(self: Tensor, other, alpha=1) -> Tensor:
    if (self.numel() == 0 or (type(other) is Tensor and other.numel() == 0)) \
            and self.dtype is not _BOOL:
        events.note("guard.sub_empty")
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            return _ADD(self, _negated(other, alpha))
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _SUB(self, other, alpha=alpha)


def sub__tensor(self: Tensor, other, alpha=1) -> Tensor:
    # in place, the wheel's binary kernels (add_, mul_, sub_) all give an empty self the shape
    # (0, 0): an empty self has nothing to compute, and stays as it is
    if self.numel() == 0 and self.dtype is not _BOOL:
        events.note("guard.sub_empty")
        return self
    # (inplace_alias, below: the same kernel, as the dispatcher has one per op and key)
    if self.dtype is _F32 and isinstance(other, Tensor) and not other.is_cpu \
            and (other is self or other._version == self._version):
        return _written_through_a_copy(self, _SUB, self, other, alpha)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _SUB_(self, other, alpha=alpha)


# -- add/sub written into a tensor that shares the other operand's memory -----------------------
# The wheel's float32 in-place and out= add/sub, when ``other`` shares memory with the tensor
# written (``x -= x``, ``x.sub_(x.detach())``, ``x.add_(x, alpha=-1)``, ``torch.sub(y, x,
# out=x)``), drop alpha and the sign: the written tensor gets self + other (``x -= x`` gives
# 2x: Hugging Face Trainer's ``tr_loss -= tr_loss`` makes every logged loss wrong). Out of
# place, or with distinct operands, it is right; float16 and integers are right. Where torch
# refuses a partial overlap (``x.sub_(x[0])``) the wheel returns numbers.
# A device tensor has no storage to compare, but tensors sharing memory (views, detach, .data)
# share one version counter: equal versions are the cheap test (a fresh pair at version 0
# passes it too, and then pays one copy more, with the right result). There the result is
# computed out of place and copied in (autograd records both); anything else goes to the
# wheel's own kernel. sub_ is on this path above; add_ is wrong only with an alpha, which
# Python code alone passes (Tensor.add_: dmlshim.patches.guards wraps the method, so that
# ``out += identity`` and the add_ calls of foreach ops and gradient accumulation, made with
# alpha 1 and right on the wheel, stay off Python).

OVERLAP_MESSAGE = ("unsupported operation: some elements of the input tensor and the written-to "
                   "tensor refer to a single memory location. Please clone() the tensor before "
                   "performing the operation.")


def _written_through_a_copy(written: Tensor, op, self: Tensor, other: Tensor, alpha) -> Tensor:
    events.note("guard.inplace_alias")
    if other.shape != written.shape and (other._base is not None or written._base is not None) \
            and (other if other._base is None else other._base) \
            is (written if written._base is None else written._base):
        # a view of the same tensor, of another shape: torch's partial-overlap error (an equal
        # shape may be the same elements or not: the wheel's views do not say where they start)
        raise RuntimeError(OVERLAP_MESSAGE)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _COPY_(written, op(self, other, alpha=alpha))


def _out_form(self: Tensor, other, *, alpha=1, out: Tensor, op) -> Tensor:
    if out.dtype is _F32 and isinstance(other, Tensor) and not other.is_cpu \
            and (other is out or other._version == out._version) \
            and out.shape == torch.broadcast_shapes(self.shape, other.shape):
        return _written_through_a_copy(out, op, self, other, alpha)
    # distinct operands: the wheel's out= kernel, reached as the caller's own call reaches it
    # (unboxed, through torch's C function; never boxed, where it returns dangling tensors)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return op(self, other, alpha=alpha, out=out)


add_out = functools.partial(_out_form, op=_ADD)
sub_out = functools.partial(_out_form, op=_SUB)


def add_alias(self: Tensor, other, alpha) -> Tensor:
    """``self.add_(other, alpha=alpha)`` where ``other`` may share ``self``'s memory: the
    result computed out of place and copied in (Tensor.add_'s wrapper calls it)."""
    return _written_through_a_copy(self, _ADD, self, other, alpha)


# -- split / chunk of an empty tensor: E_INVALIDARG ----------------------------------------------
# (YOLOv8's assigner: ``box.chunk(4, -1)`` of a batch without targets). Above autograd: an
# empty tensor is cut with narrow (views, as split's; autograd records them), any other goes
# to the wheel's own split.

_SPLIT = torch._C.TensorBase.split
_SPLIT_WITH_SIZES = torch._C.TensorBase.split_with_sizes
_NARROW = torch._C.TensorBase.narrow


def _empty_split(self: Tensor, sizes: Sequence[int], dim: int) -> List[Tensor]:
    events.note("guard.split_empty")
    parts, start = [], 0
    for size in sizes:
        parts.append(_NARROW(self, dim, start, size))
        start += size
    return parts


def split_tensor(self: Tensor, split_size, dim: int = 0) -> List[Tensor]:
    if self.numel() == 0:
        dim = _wrap_dim(dim, self.dim())
        n, step = self.shape[dim], int(split_size)
        sizes = [min(step, n - s) for s in range(0, n, step)] if step > 0 and n else [n]
        return _empty_split(self, sizes, dim)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _SPLIT(self, split_size, dim)


def split_with_sizes(self: Tensor, split_sizes: Sequence[int], dim: int = 0) -> List[Tensor]:
    if self.numel() == 0:
        dim = _wrap_dim(dim, self.dim())
        if sum(split_sizes) == self.shape[dim]:
            return _empty_split(self, split_sizes, dim)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _SPLIT_WITH_SIZES(self, split_sizes, dim)


# -- gather and scatter with a negative dim: wrong values (gather) or the partial-update error --
# (scatter, scatter_add: the wheel compares the unwrapped dim with the index's dims). Above
# autograd: the dim made non-negative, then the wheel's own kernel (gather's backward is a
# scatter_add, which the scatter_add guard computes).

_GATHER = torch._C._VariableFunctions.gather
_SCATTER = torch._C._VariableFunctions.scatter
_SCATTER_ = torch._C.TensorBase.scatter_


_RESHAPE = torch._C.TensorBase.reshape


def gather(self: Tensor, dim: int, index: Tensor, *, sparse_grad: bool = False) -> Tensor:
    if dim < 0:
        dim = _wrap_dim(dim, self.dim())
    if index.numel() == 0 and self.dim() == index.dim():
        # the wheel raises E_INVALIDARG on an empty index (YOLOv8's DFL loss on a batch
        # without matches): the empty result as a view of self, so autograd gives self a
        # zero gradient as gather's would
        events.note("guard.gather_empty")
        return _RESHAPE(_NARROW(_RESHAPE(self, [-1]), 0, 0, 0), list(index.shape))
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        return _GATHER(self, dim, index, sparse_grad=sparse_grad)


def _scatter(self: Tensor, dim: int, index: Tensor, src, *, reduce: Optional[str] = None,
             op) -> Tensor:
    # scatter(_).src, .value, .reduce, .value_reduce (src a tensor or a number)
    if dim < 0:
        dim = _wrap_dim(dim, self.dim())
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        if reduce is None:
            return op(self, dim, index, src)
        return op(self, dim, index, src, reduce=reduce)


scatter = functools.partial(_scatter, op=_SCATTER)
scatter_ = functools.partial(_scatter, op=_SCATTER_)


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
        with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
            return _BN_BACKWARD(grad_out, input, weight, running_mean, running_var, save_mean,
                                save_invstd, train, eps, output_mask)
    events.note("guard.bn_mixed_backward")
    dtype = weight.dtype
    if save_mean is not None and save_mean.dtype is not dtype:
        save_mean = _TO(save_mean, dtype)
    if save_invstd is not None and save_invstd.dtype is not dtype:
        save_invstd = _TO(save_invstd, dtype)
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        grad_input, grad_weight, grad_bias = _BN_BACKWARD(
            _TO(grad_out, dtype), _TO(input, dtype), weight, running_mean, running_var,
            save_mean, save_invstd, train, eps, output_mask)
    if grad_input is not None:
        grad_input = _TO(grad_input, input.dtype)
    return grad_input, grad_weight, grad_bias


# -- scatter_add raises (software adapter: partial or not, any dtype) -------------------------
# scatter_add(self, dim, index, src): self[..., index[i], ...] += src[i] along dim. Above
# autograd, built on index_put_ with accumulate (which the wheel computes right, duplicates
# included), the index tuple being index along dim and an arange along every other dim; src
# narrowed to index's extents as scatter_add reads it. Autograd records index_put's derivative.
# Odd forms (a 0-dim self, mixed dtypes) go to the wheel's kernel, which gives torch's error.

_INDEX_PUT = torch._C._VariableFunctions.index_put
_INDEX_PUT_ = torch._C.TensorBase.index_put_
_SCATTER_ADD = torch._C._VariableFunctions.scatter_add
_SCATTER_ADD_ = torch._C.TensorBase.scatter_add_


def _scatter_add_args(self: Tensor, dim: int, index: Tensor, src: Tensor):
    """(index tuple, values) for index_put, or None where the wheel's kernel should decide."""
    rank = self.dim()
    if rank == 0 or index.dim() != rank or src.dim() != rank or src.dtype is not self.dtype \
            or index.dtype is not torch.int64:
        return None
    dim = _wrap_dim(dim, rank)
    events.note("guard.scatter_add")
    shape = index.shape
    indices: List[Tensor] = []
    for k in range(rank):
        if k == dim:
            indices.append(index)
            continue
        if shape[k] > self.shape[k] or shape[k] > src.shape[k]:
            raise RuntimeError(
                f"Expected index {list(shape)} to be smaller than self {list(self.shape)} apart "
                f"from dimension {dim} and to be smaller size than src {list(src.shape)}")
        view = [1] * rank
        view[k] = shape[k]
        indices.append(_ARANGE(0, shape[k], 1, dtype=torch.int64,
                               device=index.device).reshape(view))
    if src.shape != shape:
        for k in range(rank):
            if src.shape[k] != shape[k]:
                src = src.narrow(k, 0, shape[k])
    return indices, src


def _scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor, *, ops) -> Tensor:
    fixed = _scatter_add_args(self, dim, index, src)
    wheels, index_put = ops  # (scatter_add, index_put) or their in-place forms
    with _EXCLUDE(_NOT_HERE), _INCLUDE(_OTHER):
        if fixed is None:
            return wheels(self, dim, index, src)
        return index_put(self, fixed[0], fixed[1], True)


scatter_add = functools.partial(_scatter_add, ops=(_SCATTER_ADD, _INDEX_PUT))
scatter_add_ = functools.partial(_scatter_add, ops=(_SCATTER_ADD_, _INDEX_PUT_))


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
                           "masked_fill_.Tensor": masked_fill__tensor,
                           "masked_fill.Scalar": masked_fill, "masked_fill.Tensor": masked_fill}),
    "reflect_pad": ("not reported", "reflect padding swaps the height and width padding "
                    "(and its backward then raises DirectML's partial-scatter error)",
                    {"reflection_pad2d": reflection_pad2d,
                     "reflection_pad2d_backward": reflection_pad2d_backward}),
    "max_pool_indices": ("not reported", "max_pool2d_with_indices returns indices flattened "
                         "over the whole tensor (F.max_unpool2d fails on them)",
                         {"max_pool2d_with_indices": max_pool2d_with_indices}),
    "bilinear": ("software adapter", "bilinear interpolate forward and backward wrong",
                 {"upsample_bilinear2d": upsample_bilinear2d,
                  "upsample_bilinear2d_backward": upsample_bilinear2d_backward}),
    "unique_counts": ("not reported", "torch.unique(return_counts=True) and "
                      "(return_inverse=True) raise",
                      {"_unique2": unique2}),
    "readback_gil": ("not reported", "a read back of one number with the GIL held (a device "
                     "tensor as a size or a number: torch.zeros(n, t.max())) deadlocks",
                     {"_local_scalar_dense": local_scalar_dense}),
    "slice_empty": ("not reported", "an empty slice that starts past 0 (x[:, n:] of n "
                    "columns) segfaults", {"slice.Tensor": slice_tensor}),
    "cat_empty": ("not reported", "torch.cat with an empty operand raises E_INVALIDARG",
                  {"cat": cat}),
    "layer_norm_nobias": ("not reported", "layer-norm backward without a bias fails",
                          {"native_layer_norm_backward": native_layer_norm_backward}),
    "logsumexp": ("not reported", "torch.logsumexp's composite hands the wheel's sum.out an "
                  "empty result it does not resize", {"logsumexp": logsumexp}),
    "flip_dims": ("not reported", "flip with a negative dim segfaults (flip_dml_helper)",
                  {"flip": flip}),
    "bn_mixed_backward": ("not reported", "batch-norm backward of a float16 input with float32 "
                          "weights (CUDA autocast's form) raises E_INVALIDARG",
                          {"native_batch_norm_backward": native_batch_norm_backward}),
    "rsub_number": ("not reported", "number - tensor (rsub with a float number) raises "
                    "'does not support Double'", {"rsub.Tensor": rsub_tensor,
                                                   "rsub.Scalar": rsub_tensor}),
    "sub_empty": ("not reported", "sub of empty tensors gives the wrong shape ((0, 1) - (0, 1) "
                  "is (0, 0))", {"sub.Tensor": sub_tensor, "sub_.Tensor": sub__tensor}),
    "inplace_alias": ("not reported", "float32 add/sub written into a tensor that shares "
                      "memory with the other operand drop alpha and the sign (x -= x gives 2x)",
                      {"sub_.Tensor": sub__tensor, "add.out": add_out, "sub.out": sub_out}),
    "split_empty": ("not reported", "split/chunk of an empty tensor raises E_INVALIDARG",
                    {"split.Tensor": split_tensor, "split_with_sizes": split_with_sizes}),
    "gather_scatter_dims": ("not reported", "gather with a negative dim gives wrong values; "
                            "scatter with one raises the partial-update error",
                            {"gather": gather, **{f"scatter{i}.{o}": (scatter_ if i else scatter)
                                                  for i in ("", "_") for o in
                                                  ("src", "value", "reduce", "value_reduce")}}),
    "scatter_add": ("software adapter", "scatter_add raises (E_INVALIDARG, or the partial-"
                    "update error)", {"scatter_add": scatter_add, "scatter_add_": scatter_add_}),
}

# guard name -> the dispatch key its kernels are registered for: input fixes above autograd
# (the wheel's own kernel runs behind them), replacements on PrivateUse1 (see the docstring)
KERNEL_KEYS: Dict[str, str] = {
    name: AUTOGRAD_KEY for name in ("mul_bool", "nll_none", "nll_ignore", "masked_fill_uint8",
                                    "reflect_pad", "max_pool_indices", "unique_counts",
                                    "layer_norm_nobias", "flip_dims", "bn_mixed_backward",
                                    "scatter_add", "gather_scatter_dims", "rsub_number",
                                    "split_empty", "sub_empty", "readback_gil", "cat_empty",
                                    "slice_empty", "inplace_alias")}
KERNEL_KEYS.update({name: "PrivateUse1" for name in ("eye", "bilinear", "logsumexp")})
