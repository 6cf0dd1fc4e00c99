"""Guards of the arithmetic operators, all input fixes above autograd (the wheel's own kernel runs
behind them): mul_bool (#686, #737), rsub_number, sub_empty, inplace_alias (sub_ and the
``out=`` forms of add and sub).
"""

from __future__ import annotations

import functools

import torch

from dmlshim import current
from dmlshim.kernels.guards.passthrough import EXCLUDE, INCLUDE, NOT_HERE, OTHER

Tensor = torch.Tensor

# -- float tensor * bool tensor gives bool (#686, #737) --------------------------------------
# Above autograd: the bool operand becomes the float dtype (Tensor.to's C original, not the
# shim's wrapper), then the wheel's own mul. One Python frame per call and nothing else for
# the inputs the wheel gets right. A wrapped-number operand (x * 2.0, 2.0 * x) arrives as a
# Python number: nothing to fix then.

_MUL = torch._C._VariableFunctions.mul
_MUL_ = torch._C.TensorBase.mul_
_TO = torch._C.TensorBase.to
_COPY_ = torch._C.TensorBase.copy_
_BOOL = torch.bool
_F32 = torch.float32


def mul_tensor(self, other) -> Tensor:
    try:
        a, b = self.dtype, other.dtype
    except AttributeError:  # a Python number
        pass
    else:
        if (a is _BOOL) is not (b is _BOOL) and (a.is_floating_point or b.is_floating_point):
            if (shim := current.session) is not None:
                shim.events.notes["guard.mul_bool"] += 1
            if a is _BOOL:
                self = _TO(self, b)
            else:
                other = _TO(other, a)
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return _MUL(self, other)


def mul__tensor(self: Tensor, other) -> Tensor:
    try:
        b = other.dtype
    except AttributeError:  # a Python number
        pass
    else:
        if b is _BOOL and self.dtype.is_floating_point:
            if (shim := current.session) is not None:
                shim.events.notes["guard.mul_bool"] += 1
            other = _TO(other, self.dtype)
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return _MUL_(self, other)


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
        if (shim := current.session) is not None:
            shim.events.notes["guard.rsub_number"] += 1
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            scaled = _NEG(self) if alpha == 1 else _MUL(self, -alpha)
            return _ADD(scaled, other)
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
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
        if (shim := current.session) is not None:
            shim.events.notes["guard.sub_empty"] += 1
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return _ADD(self, _negated(other, alpha))
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return _SUB(self, other, alpha=alpha)


def sub__tensor(self: Tensor, other, alpha=1) -> Tensor:
    # in place, the wheel's binary kernels (add_, mul_, sub_) all give an empty self the shape
    # (0, 0): an empty self has nothing to compute, and stays as it is
    if self.numel() == 0 and self.dtype is not _BOOL:
        if (shim := current.session) is not None:
            shim.events.notes["guard.sub_empty"] += 1
        return self
    # (inplace_alias, below: the same kernel, as the dispatcher has one per op and key)
    if self.dtype is _F32 and isinstance(other, Tensor) and not other.is_cpu \
            and (other is self or other._version == self._version):
        return _written_through_a_copy(self, _SUB, self, other, alpha)
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
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
# wheel's own kernel. sub_ is on this path above. add_ is wrong only with an alpha, and is not
# guarded: a kernel for add_.Tensor would be a Python frame on every add_ (``out += identity``
# of every residual block, the foreach ops' per-tensor add_, gradient accumulation), and a
# wrapper of the method Tensor.add_ one on every Python call (BatchNorm's
# ``num_batches_tracked.add_(1)`` in every layer): ``x.sub_(y, alpha=a)`` is the guarded form
# of ``x.add_(y, alpha=-a)`` (docs/known-directml-bugs.md).

OVERLAP_MESSAGE = ("unsupported operation: some elements of the input tensor and the written-to "
                   "tensor refer to a single memory location. Please clone() the tensor before "
                   "performing the operation.")


def _written_through_a_copy(written: Tensor, op, self: Tensor, other: Tensor, alpha) -> Tensor:
    if (shim := current.session) is not None:
        shim.events.notes["guard.inplace_alias"] += 1
    if other.shape != written.shape and (other._base is not None or written._base is not None) \
            and (other if other._base is None else other._base) \
            is (written if written._base is None else written._base):
        # a view of the same tensor, of another shape: torch's partial-overlap error (an equal
        # shape may be the same elements or not: the wheel's views do not say where they start)
        raise RuntimeError(OVERLAP_MESSAGE)
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return _COPY_(written, op(self, other, alpha=alpha))


def _out_form(self: Tensor, other, *, alpha=1, out: Tensor, op) -> Tensor:
    if out.dtype is _F32 and isinstance(other, Tensor) and not other.is_cpu \
            and (other is out or other._version == out._version) \
            and out.shape == torch.broadcast_shapes(self.shape, other.shape):
        return _written_through_a_copy(out, op, self, other, alpha)
    # distinct operands: the wheel's out= kernel, reached as the caller's own call reaches it
    # (unboxed, through torch's C function; never boxed, where it returns dangling tensors)
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return op(self, other, alpha=alpha, out=out)


add_out = functools.partial(_out_form, op=_ADD)
sub_out = functools.partial(_out_form, op=_SUB)
