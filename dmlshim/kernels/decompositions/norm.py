"""Normalisation: the GroupNorm backward (#678), and weight normalisation
(``torch.nn.utils.weight_norm`` / ``parametrizations.weight_norm``: ``_weight_norm`` calls the
fused ``_weight_norm_interface`` for dim 0 or the last dim, which falls back every step, forward
and backward). With n = ||v|| over every dim but ``dim`` (``linalg_vector_norm``, keepdim):
w = v * (g / n); the backward (the CPU kernel's formula): with s = Σ grad_w * v over the same
dims, grad_v = (g / n) * (grad_w - v * s / n²) and grad_g = s / n. Dropout backward needs nothing: torch-directml
0.2.5 has ``native_dropout_backward`` (#630 was 0.2.4), and so it is left to its kernel.
"""

from __future__ import annotations

from typing import List, Optional, Tuple

import torch

from dmlshim.kernels.decompositions.base import Decomposition

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


def _norm_dims(v: Tensor, dim: int) -> List[int]:
    dim = dim % max(v.dim(), 1)
    return [d for d in range(v.dim()) if d != dim]


def weight_norm_interface(v: Tensor, g: Tensor, dim: int = 0) -> Tuple[Tensor, Tensor]:
    # the norm in float32 for half input, as the CPU kernel keeps it
    norm_dtype = torch.float32 if v.dtype in (torch.float16, torch.bfloat16) else g.dtype
    norm = torch.linalg.vector_norm(v.to(norm_dtype), 2, _norm_dims(v, dim), keepdim=True)
    norm = norm.reshape(g.shape)
    w = v * (g.to(norm_dtype) / norm).to(v.dtype)
    return w.contiguous(), norm


def weight_norm_interface_backward(grad_w: Tensor, saved_v: Tensor, saved_g: Tensor,
                                   saved_norms: Tensor, dim: int) -> Tuple[Tensor, Tensor]:
    dims = _norm_dims(saved_v, dim)
    shape = [1 if d in dims else saved_v.size(d) for d in range(saved_v.dim())]
    acc = saved_norms.dtype
    v, gw = saved_v.to(acc), grad_w.to(acc)
    norm = saved_norms.reshape(shape)
    g = saved_g.to(acc).reshape(shape)
    s = (gw * v).sum(dims, keepdim=True)
    grad_v = (g / norm) * (gw - v * (s / (norm * norm)))
    grad_g = s / norm
    return grad_v.to(saved_v.dtype), grad_g.reshape(saved_g.shape).to(saved_g.dtype)


DECOMPOSITIONS = (
    Decomposition("aten::native_group_norm_backward", (678,), "normalisation (`nn.GroupNorm`)",
                  "the closed-form gradient from `sub`, `mul`, `mean`, `sum` over (N, G, C/G·HxW) "
                  "views", native_group_norm_backward),
    Decomposition("aten::_weight_norm_interface", (), "weight normalisation "
                  "(`nn.utils.weight_norm`, `parametrizations.weight_norm`)",
                  "`linalg_vector_norm` over the other dims, `div`, `mul`", weight_norm_interface),
    Decomposition("aten::_weight_norm_interface_backward", (), "weight normalisation backward",
                  "the CPU kernel's closed form from `mul`, `sum`, `div`, `sub`",
                  weight_norm_interface_backward),
)
