"""Autocast kernels for the ``privateuseone`` device, shared by DirectML and its emulator.

torch-directml 0.2.5 registers no AutocastPrivateUse1 kernel or fallthrough (#454): the first
operator on a DirectML tensor inside ``torch.autocast("privateuseone")`` raises
``NotImplementedError: Could not run 'aten::...' with arguments from the 'AutocastPrivateUse1'
backend``. These kernels are CUDA-like cast policies (the autocast dtype for matmul/conv/linear,
float32 for losses, softmax and normalisations, a fallthrough for the rest). dmlshim's AMP patch
holds them on DirectML (its float32 regions cast float16 inputs up), and the emulator holds
them when its ``autocast`` gap is off. Plain torch only: neither side's module (see
tests/test_import_boundaries.py). Registrations exist while anyone holds them.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Set

import torch

LOWER_PRECISION = (
    "mm", "bmm", "addmm", "baddbmm", "addbmm", "addmv", "mv", "matmul", "linear", "einsum",
    "conv1d", "conv2d", "conv3d", "conv_transpose1d", "conv_transpose2d.input",
    "conv_transpose3d.input", "convolution", "prelu", "chain_matmul",
)
FLOAT32 = (
    "softmax.int", "log_softmax.int", "cross_entropy_loss", "nll_loss", "nll_loss2d",
    "mse_loss", "l1_loss", "smooth_l1_loss", "huber_loss", "binary_cross_entropy_with_logits",
    "kl_div", "layer_norm", "group_norm", "exp", "log", "log10", "log2", "log1p", "expm1",
    "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar", "rsqrt", "reciprocal", "cumsum",
    "sum", "prod", "logsumexp", "cosine_similarity", "norm.Scalar", "softplus",
)

_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_fallthrough_lib: Optional[Any] = None
_kernel_lib: Optional[Any] = None
_holders: Set[str] = set()


def _cast(value, dtype: torch.dtype):
    if isinstance(value, torch.Tensor):
        if (value.device.type == "privateuseone" and value.is_floating_point()
                and value.dtype != dtype and value.dtype != torch.float64):
            return value.to(dtype)
        return value
    if isinstance(value, (list, tuple)):
        return type(value)(_cast(v, dtype) for v in value)
    return value


def _kernel(op: Callable, lower: bool) -> Callable:
    def kernel(*args, **kwargs):
        dtype = torch.get_autocast_dtype("privateuseone") if lower else torch.float32
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            args = tuple(_cast(a, dtype) for a in args)
            kwargs = {k: _cast(v, dtype) for k, v in kwargs.items()}
            return op(*args, **kwargs)

    return kernel


def _op(name: str):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return None if packet is None else getattr(packet, overload or "default", None)


def _enable() -> None:
    global _fallthrough_lib, _kernel_lib
    _fallthrough_lib = torch.library.Library("_", "IMPL")
    _fallthrough_lib.m.fallback_fallthrough("AutocastPrivateUse1")
    _kernel_lib = torch.library.Library("aten", "IMPL")
    for names, lower in ((LOWER_PRECISION, True), (FLOAT32, False)):
        for name in names:
            op = _op(name)
            if op is not None:
                _kernel_lib.impl(name, _kernel(op, lower), "AutocastPrivateUse1")


def _disable() -> None:
    global _fallthrough_lib, _kernel_lib
    for lib in (_kernel_lib, _fallthrough_lib):
        if lib is not None:
            lib._destroy()
    _fallthrough_lib = _kernel_lib = None


def hold(holder: str) -> None:
    """Keep the AutocastPrivateUse1 kernels registered while ``holder`` needs them."""
    _holders.add(holder)
    if _fallthrough_lib is None:
        _enable()


def release(holder: str) -> None:
    _holders.discard(holder)
    if not _holders and _fallthrough_lib is not None:
        _disable()


def registered() -> bool:
    return _fallthrough_lib is not None
