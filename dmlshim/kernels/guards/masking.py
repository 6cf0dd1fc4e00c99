"""Guard masked_fill_uint8 (#702): ``masked_fill`` accepts a uint8 mask on the wheel; input fixes
above autograd.
"""

from __future__ import annotations

import torch

from dmlshim import current
from dmlshim.kernels.guards.passthrough import EXCLUDE, INCLUDE, NOT_HERE, OTHER

Tensor = torch.Tensor
_TO = torch._C.TensorBase.to
_BOOL = torch.bool

# -- masked_fill accepts a uint8 mask (#702) -------------------------------------------------

MASK_MESSAGE = "masked_fill_ only supports boolean masks, but got mask with dtype {}"
_DTYPE_NAMES = {torch.uint8: "unsigned char", torch.int8: "signed char", torch.int16: "short",
                torch.int32: "int", torch.int64: "long int", torch.float32: "float",
                torch.float16: "c10::Half", torch.bfloat16: "c10::BFloat16"}


def _check_mask(mask: Tensor) -> None:
    if mask.dtype is not torch.bool:  # the CPU's (and CUDA's) check, word for word
        if (shim := current.session) is not None:
            shim.events.notes["guard.masked_fill_uint8"] += 1
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
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
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
