"""Guards of the shape and view operators: split_empty, cat_empty, slice_empty, flip_dims (input
fixes above autograd), and view_replay (a setting of autograd's).
"""

from __future__ import annotations

from typing import Callable, List, Sequence

import torch

from dmlshim import current
from dmlshim.kernels.guards.passthrough import EXCLUDE, INCLUDE, NOT_HERE, OTHER, wrap_dim

Tensor = torch.Tensor
aten = torch.ops.aten
_TO = torch._C.TensorBase.to

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
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return _CAT(tensors, dim)
    # an empty operand (GPT-2's first KV-cache update every step): still this one frame
    if (shim := current.session) is not None:
        shim.events.notes["guard.cat_empty"] += 1
    dtype = tensors[0].dtype
    # torch skips 1-D empty tensors (its legacy form) in any dim; the others must fit, with the
    # CPU's and CUDA's messages (torch's meta kernel words them otherwise)
    ref, rank, d, keep, extent = None, 0, 0, [], 0
    for i, t in enumerate(tensors):
        dtype = torch.promote_types(dtype, t.dtype)
        if t.dim() == 1 and t.shape[0] == 0:
            continue
        if ref is None:
            ref, rank = t, t.dim()
            d = dim + rank if -rank <= dim < 0 else dim
            if not 0 <= d < rank:
                d = wrap_dim(dim, rank)  # torch's IndexError
        elif t.dim() != rank:
            raise RuntimeError("Tensors must have same number of dimensions: got "
                               f"{rank} and {t.dim()}")
        elif t.shape[:d] != ref.shape[:d] or t.shape[d + 1:] != ref.shape[d + 1:]:
            _raise_cat_sizes(ref, t, d, i)
        extent += t.shape[d]
        if t.numel() != 0:
            keep.append(t)
    if ref is None:
        return aten.empty.memory_format([0], dtype=dtype, device=tensors[0].device)
    if not keep:
        size = list(ref.shape)
        size[d] = extent
        return aten.empty.memory_format(size, dtype=dtype, device=ref.device)
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        out = _CAT(keep, d)
    return out if out.dtype == dtype else _TO(out, dtype)


def _raise_cat_sizes(ref: Tensor, t: Tensor, d: int, i: int) -> None:
    for k in range(ref.dim()):
        if k != d and t.shape[k] != ref.shape[k]:
            raise RuntimeError(
                f"Sizes of tensors must match except in dimension {d}. Expected size "
                f"{ref.shape[k]} but got size {t.shape[k]} for tensor number {i} in the "
                "list.")


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
            if (shim := current.session) is not None:
                shim.events.notes["guard.slice_empty"] += 1
            start, end = 0, 0
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return _SLICE(self, dim, start, end, step)


# -- flip with a negative dim segfaults in the wheel (torch_dml::flip_dml_helper) -------------
# Above autograd: the dims made non-negative, then the wheel's own flip (torchvision's hflip
# and vflip call flip(-1) and flip(-2) on device tensors).

_FLIP = torch._C._VariableFunctions.flip


def flip(self: Tensor, dims: Sequence[int]) -> Tensor:
    rank = self.dim()
    for d in dims:
        if d < 0 or d >= rank:
            dims = [wrap_dim(d, rank) for d in dims]
            break
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return _FLIP(self, dims)


# -- split / chunk of an empty tensor: E_INVALIDARG ----------------------------------------------
# (YOLOv8's assigner: ``box.chunk(4, -1)`` of a batch without targets). Above autograd: an
# empty tensor is cut with narrow (views, as split's; autograd records them), any other goes
# to the wheel's own split.

_SPLIT = torch._C.TensorBase.split
_SPLIT_WITH_SIZES = torch._C.TensorBase.split_with_sizes
_NARROW = torch._C.TensorBase.narrow


def split_tensor(self: Tensor, split_size, dim: int = 0) -> List[Tensor]:
    if self.numel() == 0:
        rank = self.dim()
        if not 0 <= dim < rank:  # made non-negative inline; wrap_dim raises torch's error
            dim = dim + rank if -rank <= dim < 0 else wrap_dim(dim, rank)
        if (shim := current.session) is not None:
            shim.events.notes["guard.split_empty"] += 1
        n, step = self.shape[dim], int(split_size)
        if step <= 0 or not n:
            return [_NARROW(self, dim, 0, n)]
        parts = []
        for start in range(0, n, step):
            parts.append(_NARROW(self, dim, start, min(step, n - start)))
        return parts
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return _SPLIT(self, split_size, dim)


def split_with_sizes(self: Tensor, split_sizes: Sequence[int], dim: int = 0) -> List[Tensor]:
    if self.numel() == 0:
        rank = self.dim()
        if not 0 <= dim < rank:  # made non-negative inline; wrap_dim raises torch's error
            dim = dim + rank if -rank <= dim < 0 else wrap_dim(dim, rank)
        if sum(split_sizes) == self.shape[dim]:
            if (shim := current.session) is not None:
                shim.events.notes["guard.split_empty"] += 1
            parts, start = [], 0
            for size in split_sizes:
                parts.append(_NARROW(self, dim, start, size))
                start += size
            return parts
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return _SPLIT_WITH_SIZES(self, split_sizes, dim)


# -- the backward of a write into a view reads the wrong gradient -----------------------------
# The wheel's views report storage offset 0, and autograd's CopySlices (the backward of writing
# into a view: ``loss[1] = ...``, ``loss[0] *= gain``: YOLOv8's loss) reads the gradient of the
# view at that offset in a fresh tensor: element 0's, not the view's. With view replay autograd
# records each view's op and replays it there instead (torch's own switch, used by AOTAutograd;
# thread-local: the installing thread's, where scripts train). No Python on the hot path.


def replay_views() -> Callable[[], None]:
    """Turn autograd's view replay on; returns what restores the setting found."""
    previous = torch._C._is_view_replay_enabled()
    torch._C._set_view_replay_enabled(True)
    return lambda: torch._C._set_view_replay_enabled(previous)
