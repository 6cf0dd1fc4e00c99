"""Index and scan operators: ``index_add`` (graph networks' message passing), ``cumprod``
(#437; diffusion schedules' ``alphas_cumprod``) and ``amin`` (box and range bounds).

``index_add`` is an ``index_put_`` with ``accumulate=True`` along the indexed dimension moved
to the front (not ``scatter_add``, which raises on the software adapter).
``cumprod`` is a Hillis-Steele scan: ceil(log2 n) rounds, each multiplying the running
products by themselves shifted by 1, 2, 4, ... positions (the gap filled with ones by
``constant_pad_nd``): exact for zeros, signs, infinities and NaN, and rounded like a tree of
products rather than the CPU's left-to-right loop (a few ulp apart for long scans).
Its backward (PyTorch's composite ``cumprod_backward``) calls ``cumprod`` again, on the device.
``amin`` is ``min(dim)`` over the reduced dimensions flattened into one.
"""

from __future__ import annotations

from typing import List, Optional, Sequence

import torch

from dmlshim.kernels.decompositions.base import Decomposition, write_out

Tensor = torch.Tensor
aten = torch.ops.aten


def index_add_out(self: Tensor, dim: int, index: Tensor, source: Tensor, *, alpha=1,
                  out: Tensor) -> Tensor:
    base = self if self.dim() else self.reshape(1)
    src = source if source.dim() else source.reshape(1)
    dim = dim % base.dim()
    if alpha != 1:
        src = src * alpha
    value = base.movedim(dim, 0).contiguous()  # a copy: self is not written
    value.index_put_((index.long().reshape(-1),), src.movedim(dim, 0).to(base.dtype),
                     accumulate=True)
    return write_out(out, value.movedim(0, dim).reshape(self.shape))


def cumprod_out(self: Tensor, dim: int, *, dtype: Optional[torch.dtype] = None,
                out: Tensor) -> Tensor:
    x = self.to(out.dtype)
    if x.dim() == 0 or x.numel() == 0:
        return write_out(out, x.clone())
    last = x.dim() - 1  # (dims passed to the wheel non-negative)
    y = x.movedim(dim % x.dim(), last)
    n = y.size(last)
    shift = 1
    while shift < n:
        shifted = aten.constant_pad_nd(y.narrow(last, 0, n - shift), [shift, 0], 1)
        y = y * shifted
        shift *= 2
    return write_out(out, y.movedim(last, dim % x.dim()))


def _reduced(ndim: int, dim: Sequence[int]) -> List[int]:
    if ndim == 0:
        return []
    return sorted({d % ndim for d in dim}) if len(dim) else list(range(ndim))


def amin_out(self: Tensor, dim: Sequence[int] = (), keepdim: bool = False, *,
             out: Tensor) -> Tensor:
    dims = _reduced(self.dim(), dim)
    if not dims:
        return write_out(out, self.clone())
    kept = [d for d in range(self.dim()) if d not in dims]
    moved = self.permute(*kept, *dims)
    flat = moved.reshape(*[self.size(d) for d in kept], -1)
    value = torch.min(flat, flat.dim() - 1).values
    if keepdim:
        shape = [1 if d in dims else self.size(d) for d in range(self.dim())]
        value = value.reshape(shape)
    return write_out(out, value)


DECOMPOSITIONS = (
    Decomposition("aten::index_add.out", (), "graph networks (`index_add_`, `index_add`: "
                  "message passing)", "`index_put_(accumulate=True)` along the indexed dimension "
                  "moved to the front", index_add_out),
    Decomposition("aten::cumprod.out", (437,), "scans (`torch.cumprod`: DDPM's "
                  "`alphas_cumprod`; its backward)", "a log2(n)-round scan of `constant_pad_nd`"
                  " + `mul`", cumprod_out),
    Decomposition("aten::amin.out", (), "reductions (`torch.amin`)", "`min(dim)` over the "
                  "reduced dimensions flattened into one (`permute`, `reshape`)", amin_out),
)
