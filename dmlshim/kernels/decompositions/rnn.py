"""LSTM and GRU cells (#654, #677).

PyTorch's ``nn.LSTM``/``nn.LSTMCell`` and ``nn.GRU``/``nn.GRUCell`` call the fused cells
``_thnn_fused_lstm_cell``/``_thnn_fused_gru_cell`` for CUDA, XPU and PrivateUse1 tensors
(``LSTMCell``/``GRUCell`` in aten/src/ATen/native/RNN.cpp), and only CUDA implements them:
on torch-directml the CPU fallback finds no CPU kernel and raises NotImplementedError, so
recurrent models cannot train at all. These kernels are CUDA's formulas (RNN.cu) written with
element-wise device ops: the GRU's here, the LSTM's in :mod:`dmlshared.lstm_cell` (the emulator
runs the same two where its ``fallback`` gap is off). The forward returns CUDA's workspace layout (activated gates; for the
GRU also hx and the hidden n-gate), which the backward kernels here read; with
``create_graph=True`` PyTorch uses its differentiable composite backward instead, which
recomputes from the inputs.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

from dmlshared.lstm_cell import fused_lstm_cell, fused_lstm_cell_backward_impl
from dmlshim.kernels.decompositions.base import Decomposition

Tensor = torch.Tensor


def fused_gru_cell(input_gates: Tensor, hidden_gates: Tensor, hx: Tensor,
                   input_bias: Optional[Tensor] = None,
                   hidden_bias: Optional[Tensor] = None) -> Tuple[Tensor, Tensor]:
    if input_bias is not None:
        input_gates = input_gates + input_bias
    if hidden_bias is not None:
        hidden_gates = hidden_gates + hidden_bias
    ir, iz, in_ = input_gates.chunk(3, 1)
    hr, hz, hn = hidden_gates.chunk(3, 1)
    r = (ir + hr).sigmoid()
    z = (iz + hz).sigmoid()
    n = (in_ + r * hn).tanh()
    hy = n + z * (hx - n)
    return hy, torch.cat([r, z, n, hx, hn], 1)


def fused_gru_cell_backward(grad_hy: Tensor, workspace: Tensor, has_bias: bool
                            ) -> Tuple[Tensor, Tensor, Tensor, Optional[Tensor], Optional[Tensor]]:
    r, z, n, hx, hn = workspace.chunk(5, 1)
    grad_hx = grad_hy * z
    grad_z = grad_hy * (hx - n) * (1 - z) * z
    grad_n = grad_hy * (1 - z) * (1 - n * n)
    grad_r = grad_n * hn * (1 - r) * r
    grad_input_gates = torch.cat([grad_r, grad_z, grad_n], 1)
    grad_hidden_gates = torch.cat([grad_r, grad_z, grad_n * r], 1)
    if not has_bias:
        return grad_input_gates, grad_hidden_gates, grad_hx, None, None
    return (grad_input_gates, grad_hidden_gates, grad_hx, grad_input_gates.sum(0),
            grad_hidden_gates.sum(0))


DECOMPOSITIONS = (
    Decomposition("aten::_thnn_fused_lstm_cell", (654, 677), "LSTM (`nn.LSTM`, `nn.LSTMCell`)",
                  "CUDA's fused-cell formula from `add`, `sigmoid`, `tanh`, `mul`, `cat` (the "
                  "fallback has no CPU kernel and raises NotImplementedError)", fused_lstm_cell),
    Decomposition("aten::_thnn_fused_lstm_cell_backward_impl", (654, 677), "LSTM backward",
                  "CUDA's fused-cell gradient from element-wise ops, `cat`, `sum`",
                  fused_lstm_cell_backward_impl),
    Decomposition("aten::_thnn_fused_gru_cell", (), "GRU (`nn.GRU`, `nn.GRUCell`)",
                  "CUDA's fused-cell formula from element-wise ops and `cat` (same failure as "
                  "the LSTM: no CPU kernel)", fused_gru_cell),
    Decomposition("aten::_thnn_fused_gru_cell_backward", (), "GRU backward",
                  "CUDA's fused-cell gradient from element-wise ops, `cat`, `sum`",
                  fused_gru_cell_backward),
)
