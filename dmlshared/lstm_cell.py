"""The fused LSTM cell (``aten::_thnn_fused_lstm_cell`` and its backward), in plain torch ops.

PyTorch's LSTM takes ``_thnn_fused_lstm_cell`` for CUDA, XPU and PrivateUse1 tensors (``LSTMCell``
in aten/src/ATen/native/RNN.cpp), and only CUDA implements it: torch-directml sends it to its CPU
fallback, which has no kernel and raises NotImplementedError (#654, #677). These are CUDA's
forward and backward (aten/src/ATen/native/cuda/RNN.cu), products grouped as its kernel groups
them. dmlshim registers them for DirectML (``dmlshim.kernels.decompositions.rnn``); the emulator
runs them where its ``fallback`` gap is off, as if DirectML had the kernel. Results equal the
CPU's LSTM up to rounding: the fused path adds the biases after the matmuls and sums the
weights' and biases' gradients per time step, where the CPU groups them otherwise.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

Tensor = torch.Tensor


def fused_lstm_cell(input_gates: Tensor, hidden_gates: Tensor, cx: Tensor,
                    input_bias: Optional[Tensor] = None,
                    hidden_bias: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """(hy, cy, workspace): the workspace holds the activated gates i, f, g, o (CUDA's layout),
    which :func:`fused_lstm_cell_backward_impl` reads."""
    gates = input_gates + hidden_gates
    if input_bias is not None:
        gates = gates + input_bias
    if hidden_bias is not None:
        gates = gates + hidden_bias
    i, f, g, o = gates.chunk(4, 1)
    i, f, g, o = i.sigmoid(), f.sigmoid(), g.tanh(), o.sigmoid()
    cy = f * cx + i * g
    hy = o * cy.tanh()
    return hy, cy, torch.cat([i, f, g, o], 1)


def fused_lstm_cell_backward_impl(grad_hy: Optional[Tensor], grad_cy: Optional[Tensor],
                                  cx: Tensor, cy: Tensor, workspace: Tensor, has_bias: bool
                                  ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(grad of the gates, grad of cx, grad of the bias or None). An undefined gradient of hy or
    cy counts as zero, as in CUDA's kernel (torch never calls it without either)."""
    if grad_hy is None and grad_cy is None:
        return None, None, None
    i, f, g, o = workspace.chunk(4, 1)
    tanh_cy = cy.tanh()
    if grad_hy is None:
        grad_c = grad_cy
        grad_o = torch.zeros_like(o)
    else:
        grad_c = grad_hy * o * (1 - tanh_cy * tanh_cy)
        if grad_cy is not None:
            grad_c = grad_c + grad_cy
        grad_o = grad_hy * tanh_cy * ((1 - o) * o)
    grad_i = grad_c * g * ((1 - i) * i)
    grad_f = grad_c * cx * ((1 - f) * f)
    grad_g = grad_c * i * (1 - g * g)
    grad_gates = torch.cat([grad_i, grad_f, grad_g, grad_o], 1)
    grad_cx = grad_c * f
    grad_bias = grad_gates.sum(0) if has_bias else None
    return grad_gates, grad_cx, grad_bias
