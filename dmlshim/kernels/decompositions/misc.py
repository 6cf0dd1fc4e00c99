"""Small operators met on common paths.

``isneginf``: the ``_safe_softmax`` of torch 2.5+ (the math path of
``F.scaled_dot_product_attention``, which ``nn.MultiheadAttention`` and
``nn.TransformerEncoderLayer`` use on devices without a fused kernel) masks rows that are all
``-inf`` with it, on every attention call; it is structured, so ``isneginf.out`` falls back.
"""

from __future__ import annotations

import torch

from dmlshim.kernels.decompositions.base import Decomposition, write_out

Tensor = torch.Tensor


def isneginf_out(self: Tensor, *, out: Tensor) -> Tensor:
    # Integer and bool tensors never equal -inf: eq gives False there, as isneginf does. (The
    # functional eq, then a copy: no out= overload of the wheel.)
    return write_out(out, torch.eq(self, float("-inf")))


DECOMPOSITIONS = (
    Decomposition("aten::isneginf.out", (), "attention (`_safe_softmax` in "
                  "`scaled_dot_product_attention`'s math path, torch 2.5+; not in 2.4.1)", "`eq(-inf)`",
                  isneginf_out),
)
