"""``nn.AdaptiveMaxPool2d`` forward and backward, and the backward of replication padding
(``F.pad(mode="replicate")``, ``nn.ReplicationPad2d``: torch-directml has the forward only).

Adaptive max pooling: output cell (i, j) covers rows floor(i*H/oh) .. ceil((i+1)*H/oh) - 1
(columns alike; windows may overlap). Each window is gathered into a fixed (kh, kw) box with
``index_select`` (a window shorter than the longest repeats its last row, which changes neither
the maximum nor the first position of it), then ``max`` over the box gives the value and the
position, in the CPU kernel's scan order (row-major, first maximum wins). The indices are flat
positions in the (H, W) plane, as the CPU returns them. The backward sums the gradient at
those indices with ``index_put_(accumulate=True)`` over the flattened tensor (no
``scatter_add``: it raises on the software adapter).

Replication-pad backward: the padded tensor repeats the first and last rows (columns), so the
gradient is the centre plus the sums of the borders added onto the edge rows (columns),
placed with ``constant_pad_nd`` (no scatter).
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from dmlshim.kernels.decompositions.base import Decomposition, write_out

Tensor = torch.Tensor
aten = torch.ops.aten
_ARANGE = torch._C._VariableFunctions.arange  # (see dmlshim.kernels.guards.wheel)


def _windows(size: int, out_size: int, device) -> Tuple[Tensor, int]:
    """(out_size, k) row indices of each adaptive window, padded with its last index."""
    starts = [(i * size) // out_size for i in range(out_size)]
    ends = [-(-((i + 1) * size) // out_size) for i in range(out_size)]
    k = max(e - s for s, e in zip(starts, ends))
    rows = [[min(s + t, e - 1) for t in range(k)] for s, e in zip(starts, ends)]
    return torch.tensor(rows, dtype=torch.long, device=device), k


def adaptive_max_pool2d_out(self: Tensor, output_size: Sequence[int], *, out: Tensor,
                            indices: Tensor) -> Tuple[Tensor, Tensor]:
    x = self if self.dim() == 4 else self.unsqueeze(0)
    n, c, h, w = x.shape
    oh, ow = (int(s) for s in output_size)
    rows, kh = _windows(h, oh, x.device)
    cols, kw = _windows(w, ow, x.device)
    box = x.index_select(2, rows.reshape(-1)).reshape(n, c, oh, kh, w)
    box = box.index_select(4, cols.reshape(-1)).reshape(n, c, oh, kh, ow, kw)
    box = box.permute(0, 1, 2, 4, 3, 5).reshape(n, c, oh, ow, kh * kw)
    values, position = torch.max(box, 4)  # (dims passed to the wheel non-negative)
    # position -> (row in window, column in window) -> flat index in the (h, w) plane
    row = rows.reshape(1, 1, oh, 1, kh).expand(n, c, oh, ow, kh)
    col = cols.reshape(1, 1, 1, ow, kw).expand(n, c, oh, ow, kw)
    in_row = torch.div(position, kw, rounding_mode="floor")
    r = torch.gather(row, 4, in_row.unsqueeze(4))
    q = torch.gather(col, 4, (position - in_row * kw).unsqueeze(4))
    index = (r * w + q).squeeze(4)
    if self.dim() == 3:
        values, index = values.squeeze(0), index.squeeze(0)
    write_out(out, values)
    write_out(indices, index)
    return out, indices


def adaptive_max_pool2d_backward_grad_input(grad_output: Tensor, self: Tensor, indices: Tensor,
                                            *, grad_input: Tensor) -> Tensor:
    plane = self.size(-2) * self.size(-1)
    planes = self.numel() // max(plane, 1)
    offsets = _ARANGE(0, planes * plane, plane, dtype=torch.int64,
                                     device=indices.device)
    flat = indices.reshape(planes, -1).long() + offsets.unsqueeze(1)
    value = aten.zeros.default([self.numel()], dtype=grad_output.dtype,
                               device=grad_output.device)
    value.index_put_((flat.reshape(-1),), grad_output.reshape(-1), accumulate=True)
    return write_out(grad_input, value.reshape(self.shape))


def replication_pad2d_backward(grad_output: Tensor, self: Tensor,
                               padding: List[int]) -> Tensor:
    left, right, top, bottom = (int(p) for p in padding)
    g = grad_output
    w, h = g.dim() - 1, g.dim() - 2  # (dims passed to the wheel non-negative)
    for dim, before, after, n in ((w, left, right, self.size(-1)),
                                  (h, top, bottom, self.size(-2))):
        lead = [] if dim == w else [0, 0]
        value = g.narrow(dim, max(before, 0), n + min(before, 0) + min(after, 0))
        if min(before, after) < 0:  # cropping: the cropped part gets no gradient
            value = aten.constant_pad_nd(value, lead + [-min(before, 0), -min(after, 0)])
        if before > 0:
            edge = g.narrow(dim, 0, before).sum(dim, keepdim=True)
            value = value + aten.constant_pad_nd(edge, lead + [0, n - 1])
        if after > 0:
            edge = g.narrow(dim, g.size(dim) - after, after).sum(dim, keepdim=True)
            value = value + aten.constant_pad_nd(edge, lead + [n - 1, 0])
        g = value
    return g


def replication_pad2d_backward_grad_input(grad_output: Tensor, self: Tensor,
                                          padding: List[int], *, grad_input: Tensor) -> Tensor:
    return write_out(grad_input, replication_pad2d_backward(grad_output, self, padding))


DECOMPOSITIONS = (
    Decomposition("aten::adaptive_max_pool2d.out", (), "pooling (`nn.AdaptiveMaxPool2d`)",
                  "`index_select` of each window into a fixed box, `max(dim)`, `gather` of the "
                  "flat indices", adaptive_max_pool2d_out),
    Decomposition("aten::adaptive_max_pool2d_backward.grad_input", (), "pooling backward",
                  "`index_put_(accumulate=True)` at the indices plus each plane's offset",
                  adaptive_max_pool2d_backward_grad_input),
    Decomposition("aten::replication_pad2d_backward", (), "padding backward "
                  "(`F.pad(mode='replicate')`, `nn.ReplicationPad2d`)", "the centre plus the "
                  "border sums on the edge rows and columns (`narrow`, `sum`, "
                  "`constant_pad_nd`)", replication_pad2d_backward),
    Decomposition("aten::replication_pad2d_backward.grad_input", (), "padding backward (out=)",
                  "as `replication_pad2d_backward`", replication_pad2d_backward_grad_input),
)
