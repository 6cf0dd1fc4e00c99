"""Kernel formulas shared by the emulator and the decompositions, written with torch ops only.

This module imports nothing of dmlshim, so the emulator (which must not depend on the product)
and the product's decompositions can both use one definition.
"""

from __future__ import annotations

from typing import Optional, Tuple

import torch

Tensor = torch.Tensor


def fused_lstm_cell(input_gates: Tensor, hidden_gates: Tensor, cx: Tensor,
                    input_bias: Optional[Tensor] = None,
                    hidden_bias: Optional[Tensor] = None) -> Tuple[Tensor, Tensor, Tensor]:
    """``aten::_thnn_fused_lstm_cell``: CUDA's formula (aten/src/ATen/native/cuda/RNN.cu)."""
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
