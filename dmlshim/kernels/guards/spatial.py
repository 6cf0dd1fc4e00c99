"""Guards of the spatial operators: reflect_pad and max_pool_indices (input fixes above autograd),
bilinear (a replacement on PrivateUse1; seen on the software adapter).
"""

from __future__ import annotations

from typing import List, Optional, Sequence, Tuple

import torch

from dmlshim import current
from dmlshim.kernels.guards.passthrough import ARANGE, EXCLUDE, INCLUDE, NOT_HERE, OTHER

Tensor = torch.Tensor
aten = torch.ops.aten

# -- F.pad(mode="reflect") swaps the height and width padding (forward and backward) ---------
# Above autograd: equal sides (nothing to swap) or cropping go to the wheel's own kernel;
# unequal ones are built from narrow, flip and cat (autograd records those), with the dims
# non-negative (the wheel's flip segfaults on a negative one).

_REFLECTION_PAD2D = torch._C._nn.reflection_pad2d
_REFLECTION_PAD2D_BACKWARD = aten.reflection_pad2d_backward.default._op  # functional


def reflection_pad2d(self: Tensor, padding: Sequence[int]) -> Tensor:
    left, right, top, bottom = (int(p) for p in padding)
    if min(left, right, top, bottom) < 0 or (left, right) == (top, bottom):
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return _REFLECTION_PAD2D(self, padding)
    w, h = self.dim() - 1, self.dim() - 2
    for (a, b), dim in (((left, right), w), ((top, bottom), h)):
        if a >= self.shape[dim] or b >= self.shape[dim]:
            raise RuntimeError(
                f"Argument #4: Padding size should be less than the corresponding input "
                f"dimension, but got: padding ({a}, {b}) at dimension {dim} of input "
                f"{list(self.shape)}")
    if (shim := current.session) is not None:
        shim.events.notes["guard.reflect_pad"] += 1
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
        with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
            return _REFLECTION_PAD2D_BACKWARD(grad_output, self, padding)
    if (shim := current.session) is not None:
        shim.events.notes["guard.reflect_pad"] += 1
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
    with EXCLUDE(NOT_HERE), INCLUDE(OTHER):
        out, indices = _MAX_POOL2D(self, kernel_size, stride, padding, dilation, ceil_mode)
    # (right for per-plane indices too)
    return out, torch.remainder(indices, self.shape[-2] * self.shape[-1])


# -- bilinear interpolation (software adapter: wrong forward and backward) ------------------


def _source(in_size: int, out_size: int, align_corners: bool, scale: Optional[float],
            device) -> Tuple[Tensor, Tensor, Tensor]:
    """torch's linear source indices i0, i1 and weight of i1 (area_pixel_compute_source_index)."""
    dst = ARANGE(0, out_size, 1, dtype=torch.float32, device=device)
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
    cols = ARANGE(0, in_size, 1, dtype=torch.int64, device=device).unsqueeze(0)
    m = (torch.eq(cols, i0.unsqueeze(1)).to(torch.float32) * (1 - w1).unsqueeze(1)
         + torch.eq(cols, i1.unsqueeze(1)).to(torch.float32) * w1.unsqueeze(1))
    return m.to(dtype)


def upsample_bilinear2d(self: Tensor, output_size: Sequence[int], align_corners: bool,
                        scales_h: Optional[float] = None,
                        scales_w: Optional[float] = None) -> Tensor:
    # the CPU kernel's order: along the width, then the height, gathered with index_select
    if (shim := current.session) is not None:
        shim.events.notes["guard.bilinear"] += 1
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
    if (shim := current.session) is not None:
        shim.events.notes["guard.bilinear"] += 1
    h, w = int(input_size[-2]), int(input_size[-1])
    g = grad_output.float() if grad_output.dtype in (torch.float16, torch.bfloat16) \
        else grad_output
    mh = _matrix(h, int(output_size[0]), align_corners, scales_h, g.device, g.dtype)
    mw = _matrix(w, int(output_size[1]), align_corners, scales_w, g.device, g.dtype)
    return torch.matmul(torch.matmul(mh.t(), g), mw).to(grad_output.dtype)
