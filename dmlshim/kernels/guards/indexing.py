"""Guards of the indexing operators, all input fixes above autograd: gather_scatter_dims (a negative
dim; gather with an empty index), scatter_add (as ``index_put_`` with accumulate) and
unique_counts.
"""

from __future__ import annotations

import functools
from typing import List, Optional, Tuple

import torch

from dmlshim import current
from dmlshim.kernels.guards.passthrough import ARANGE, EXCLUDE, INCLUDE, NOT_HERE, OTHER, wrap_dim

Tensor = torch.Tensor
aten = torch.ops.aten
_NARROW = torch._C.TensorBase.narrow
_TO = torch._C.TensorBase.to

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
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return _UNIQUE2(self, sorted, return_inverse, return_counts)
    if (shim := current.session) is not None:
        shim.events.notes["guard.unique"] += 1
    flat = self.reshape(-1)
    n = flat.numel()
    long = dict(dtype=torch.int64, device=self.device)
    values, perm = torch.sort(flat, dim=0, stable=True)
    if n == 0:  # nothing to mark: the empty answers (no empty operand reaches the wheel below)
        inverse = aten.zeros.default(list(self.shape) if return_inverse else [0], **long)
        return values, inverse, aten.zeros.default([0], **long)
    # Every operand below is non-empty (n > 0; starts[1:] is taken only past one value), so the
    # wheel's own kernels run with the guards skipped: the empty-operand guards (slice, cat,
    # sub) are not needed, nor their frames
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        first = aten.ones.default([n], dtype=torch.bool, device=self.device)
        if n > 1:
            first = torch.cat([first[:1], torch.ne(values[1:], values[:-1])])
        out = torch.masked_select(values, first)
        inverse = aten.zeros.default([0], **long)
        if return_inverse:
            ids = torch.sub(torch.cumsum(_TO(first, torch.int64), 0), 1)
            inverse = aten.zeros.default([n], **long).index_put_((perm,), ids)
            inverse = inverse.reshape(self.shape)
        if not return_counts:
            return out, inverse, aten.zeros.default([0], **long)
        starts = torch.nonzero(first).reshape(-1)
        ends = aten.full.default([1], n, **long)
        if starts.shape[0] > 1:
            ends = torch.cat([starts[1:], ends])
        return out, inverse, torch.sub(ends, starts)


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
        rank = self.dim()
        dim = dim + rank if dim >= -rank else wrap_dim(dim, rank)
    if index.numel() == 0 and self.dim() == index.dim():
        # the wheel raises E_INVALIDARG on an empty index (YOLOv8's DFL loss on a batch
        # without matches): the empty result as a view of self, so autograd gives self a
        # zero gradient as gather's would
        if (shim := current.session) is not None:
            shim.events.notes["guard.gather_empty"] += 1
        return _RESHAPE(_NARROW(_RESHAPE(self, [-1]), 0, 0, 0), list(index.shape))
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return _GATHER(self, dim, index, sparse_grad=sparse_grad)


def _scatter(self: Tensor, dim: int, index: Tensor, src, *, reduce: Optional[str] = None,
             op) -> Tensor:
    # scatter(_).src, .value, .reduce, .value_reduce (src a tensor or a number)
    if dim < 0:
        rank = self.dim()
        dim = dim + rank if dim >= -rank else wrap_dim(dim, rank)
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        if reduce is None:
            return op(self, dim, index, src)
        return op(self, dim, index, src, reduce=reduce)


scatter = functools.partial(_scatter, op=_SCATTER)
scatter_ = functools.partial(_scatter, op=_SCATTER_)


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


def _scatter_add(self: Tensor, dim: int, index: Tensor, src: Tensor, *, ops) -> Tensor:
    wheels, index_put = ops  # (scatter_add, index_put) or their in-place forms
    rank = self.dim()
    if rank == 0 or index.dim() != rank or src.dim() != rank or src.dtype is not self.dtype \
            or index.dtype is not torch.int64:
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return wheels(self, dim, index, src)
    if not 0 <= dim < rank:  # made non-negative inline; wrap_dim raises torch's error
        dim = dim + rank if -rank <= dim < 0 else wrap_dim(dim, rank)
    if (shim := current.session) is not None:
        shim.events.notes["guard.scatter_add"] += 1
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
        indices.append(ARANGE(0, shape[k], 1, dtype=torch.int64,
                               device=index.device).reshape(view))
    if src.shape != shape:
        for k in range(rank):
            if src.shape[k] != shape[k]:
                src = src.narrow(k, 0, shape[k])
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        return index_put(self, indices, src, True)


scatter_add = functools.partial(_scatter_add, ops=(_SCATTER_ADD, _INDEX_PUT))
scatter_add_ = functools.partial(_scatter_add, ops=(_SCATTER_ADD_, _INDEX_PUT_))
