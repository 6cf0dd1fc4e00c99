"""The fused LSTM cell, for when the ``fallback`` switch is off.

PyTorch's LSTM takes ``aten::_thnn_fused_lstm_cell`` for CUDA, XPU and PrivateUse1 tensors
(``LSTMCell`` in aten/src/ATen/native/RNN.cpp); only CUDA implements it. torch-directml sends
it to its CPU fallback, where it fails (#654, #677), and the emulator reproduces that with the
``fallback`` switch on. With the switch off the emulator behaves as if DirectML had the
kernel: these are CUDA's forward and backward formulas (aten/src/ATen/native/cuda/RNN.cu)
written with CPU tensor ops. Results equal the CPU's LSTM up to rounding, not bit for bit:
the fused path adds the biases after the matmuls and sums weight/bias gradients per time
step, where the CPU path (unfused cell, or oneDNN) groups them differently.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

Tensor = torch.Tensor


# The same formula dmlshim registers for real DirectML (one definition, in a module that imports
# nothing of dmlshim).
from emulated_dml.formulas import fused_lstm_cell  # noqa: E402


def fused_lstm_cell_backward_impl(grad_hy: Optional[Tensor], grad_cy: Optional[Tensor],
                                  cx: Tensor, cy: Tensor, workspace: Tensor,
                                  has_bias: bool) -> Tuple[Tensor, Tensor, Optional[Tensor]]:
    i, f, g, o = workspace.chunk(4, 1)
    grad_hy = torch.zeros_like(cy) if grad_hy is None else grad_hy
    grad_cy = torch.zeros_like(cy) if grad_cy is None else grad_cy
    tanh_cy = cy.tanh()
    grad_o = grad_hy * tanh_cy
    grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy) + grad_cy
    grad_i = grad_c * g * ((1 - i) * i)
    grad_f = grad_c * cx * ((1 - f) * f)
    grad_g = grad_c * i * (1 - g * g)
    grad_o = grad_o * ((1 - o) * o)
    grad_cx = grad_c * f
    grad_gates = torch.cat([grad_i, grad_f, grad_g, grad_o], 1)
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_cx, grad_bias


CPU_IMPLS = {
    "aten::_thnn_fused_lstm_cell": fused_lstm_cell,
    "aten::_thnn_fused_lstm_cell_backward_impl": fused_lstm_cell_backward_impl,
}
