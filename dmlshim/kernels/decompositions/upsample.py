"""1-D nearest upsampling (#718): ``F.interpolate(x, mode="nearest")`` on 3-D input.

torch-directml has the 2-D kernels (``upsample_nearest2d.out`` and its backward), and nearest
upsampling of (N, C, W) is the 2-D one of (N, C, 1, W) with the height left alone: PyTorch
computes the source index of each axis on its own (``nearest_idx`` in UpSample.h, the same
formula for 1-D and 2-D), so the results are the same elements.
"""

from __future__ import annotations

from typing import List, Optional

import torch

from dmlshim.kernels.decompositions.base import Decomposition, write_out

Tensor = torch.Tensor
aten = torch.ops.aten


def upsample_nearest1d_out(self: Tensor, output_size: List[int], scales: Optional[float] = None,
                           *, out: Tensor) -> Tensor:
    value = aten.upsample_nearest2d(self.unsqueeze(2), [1, int(output_size[0])], None, scales)
    return write_out(out, value.squeeze(2))


def upsample_nearest1d_backward_grad_input(grad_output: Tensor, output_size: List[int],
                                           input_size: List[int], scales: Optional[float] = None,
                                           *, grad_input: Tensor) -> Tensor:
    n, c, width = (int(s) for s in input_size)
    value = aten.upsample_nearest2d_backward(grad_output.unsqueeze(2), [1, int(output_size[0])],
                                             [n, c, 1, width], None, scales)
    return write_out(grad_input, value.squeeze(2))


DECOMPOSITIONS = (
    Decomposition("aten::upsample_nearest1d.out", (718,), "upsampling (`F.interpolate`, "
                  "`nn.Upsample`, 3-D input, mode `nearest`)",
                  "`upsample_nearest2d` on an (N, C, 1, W) view", upsample_nearest1d_out),
    Decomposition("aten::upsample_nearest1d_backward.grad_input", (718,), "upsampling backward",
                  "`upsample_nearest2d_backward` on an (N, C, 1, W) view",
                  upsample_nearest1d_backward_grad_input),
)
