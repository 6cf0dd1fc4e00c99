"""Normalisation: the GroupNorm backward (#678). Dropout backward needs nothing: torch-directml
0.2.5 has ``native_dropout_backward`` (#630 was 0.2.4), and so it is left to its kernel.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from dmlshim.decompositions import Decomposition

Tensor = torch.Tensor


def native_group_norm_backward(grad_out: Tensor, input: Tensor, mean: Tensor, rstd: Tensor,  # noqa: A002
                               weight: Optional[Tensor], N: int, C: int, HxW: int, group: int,
                               output_mask: List[bool]
                               ) -> Tuple[Optional[Tensor], Optional[Tensor], Optional[Tensor]]:
    """(grad_input, grad_weight, grad_bias), each only where ``output_mask`` asks for it.

    With x̂ = (x - mean) * rstd over each (sample, group) and g = dy * weight:
    dx = rstd * (g - mean(g) - x̂ * mean(g * x̂)), dweight = Σ dy * x̂, dbias = Σ dy
    (sums over the batch and the spatial positions of each channel).
    """
    N, C, HxW, group = int(N), int(C), int(HxW), int(group)
    per_group = (C // group) * HxW
    x = input.reshape(N, group, per_group)
    r = rstd.reshape(N, group, 1)
    xhat = (x - mean.reshape(N, group, 1)) * r
    dy = grad_out.reshape(N, C, HxW)
    grad_input = grad_weight = grad_bias = None
    if output_mask[0]:
        g = dy if weight is None else dy * weight.reshape(1, C, 1)
        g = g.reshape(N, group, per_group)
        mean_g = g.mean(dim=2, keepdim=True)
        mean_gx = (g * xhat).mean(dim=2, keepdim=True)
        grad_input = ((g - mean_g - xhat * mean_gx) * r).reshape(input.shape).to(input.dtype)
    # (mean/rstd may be float32 for half input: autograd wants each gradient in its input's dtype)
    param_dtype = weight.dtype if weight is not None else input.dtype
    if output_mask[1]:
        grad_weight = (dy * xhat.reshape(N, C, HxW)).sum(dim=(0, 2)).to(param_dtype)
    if output_mask[2]:
        grad_bias = dy.sum(dim=(0, 2)).to(param_dtype)
    return grad_input, grad_weight, grad_bias


DECOMPOSITIONS = (
    Decomposition("aten::native_group_norm_backward", (678,), "normalisation (`nn.GroupNorm`)",
                  "the closed-form gradient from `sub`, `mul`, `mean`, `sum` over (N, G, C/G·HxW) "
                  "views", native_group_norm_backward),
)
