"""``nn.AdaptiveMaxPool2d`` forward and backward, and the backward of replication padding
(``F.pad(mode="replicate")``, ``nn.ReplicationPad2d``: torch-directml has the forward only).

Adaptive max pooling: output cell (i, j) covers rows floor(i*H/oh) .. ceil((i+1)*H/oh) - 1
(columns alike; windows may overlap). Each window is gathered into a fixed (kh, kw) box with
``index_select`` (a window shorter than the longest repeats its last row, which changes neither
the maximum nor the first position of it), then ``max`` over the box gives the value and the
position, in the CPU kernel's scan order (row-major, first maximum wins). The indices are flat
positions in the (H, W) plane, as the CPU returns them. The backward scatter-adds the gradient
at those indices.

Replication-pad backward: the padded tensor is the input gathered at clamped row and column
indices, so the gradient is a ``scatter_add`` of the output gradient along those indices.
"""

from __future__ import annotations

from typing import List, Sequence, Tuple

import torch

from dmlshim.decompositions import Decomposition, write_out

Tensor = torch.Tensor


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
    values, position = torch.max(box, -1)
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
    lead = self.shape[:-2]
    plane = self.size(-2) * self.size(-1)
    grad = grad_output.reshape(*lead, -1)
    value = torch.zeros((*lead, plane), dtype=grad_output.dtype, device=grad_output.device)
    value = value.scatter_add(-1, indices.reshape(*lead, -1).long(), grad)
    return write_out(grad_input, value.reshape(self.shape))


def _clamped(size: int, before: int, after: int, device) -> Tensor:
    return torch.arange(-before, size + after, device=device).clamp(0, size - 1)


def replication_pad2d_backward(grad_output: Tensor, self: Tensor,
                               padding: List[int]) -> Tensor:
    left, right, top, bottom = (int(p) for p in padding)
    h, w = self.size(-2), self.size(-1)
    rows = _clamped(h, top, bottom, grad_output.device)
    cols = _clamped(w, left, right, grad_output.device)
    g = grad_output
    lead = g.shape[:-2]
    shape_h = (*lead, h, g.size(-1))
    idx = rows.reshape(-1, 1).expand(g.shape)
    g = torch.zeros(shape_h, dtype=g.dtype, device=g.device).scatter_add(-2, idx, g)
    idx = cols.reshape(1, -1).expand(g.shape)
    return torch.zeros(self.shape, dtype=g.dtype, device=g.device).scatter_add(-1, idx, g)


def replication_pad2d_backward_grad_input(grad_output: Tensor, self: Tensor,
                                          padding: List[int], *, grad_input: Tensor) -> Tensor:
    return write_out(grad_input, replication_pad2d_backward(grad_output, self, padding))


DECOMPOSITIONS = (
    Decomposition("aten::adaptive_max_pool2d.out", (), "pooling (`nn.AdaptiveMaxPool2d`)",
                  "`index_select` of each window into a fixed box, `max(dim)`, `gather` of the "
                  "flat indices", adaptive_max_pool2d_out),
    Decomposition("aten::adaptive_max_pool2d_backward.grad_input", (), "pooling backward",
                  "`scatter_add` at the indices", adaptive_max_pool2d_backward_grad_input),
    Decomposition("aten::replication_pad2d_backward", (), "padding backward "
                  "(`F.pad(mode='replicate')`, `nn.ReplicationPad2d`)", "two `scatter_add`s "
                  "along clamped row and column indices", replication_pad2d_backward),
    Decomposition("aten::replication_pad2d_backward.grad_input", (), "padding backward (out=)",
                  "as `replication_pad2d_backward`", replication_pad2d_backward_grad_input),
)
