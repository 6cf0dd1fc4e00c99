"""Autocast on the emulated device.

torch-directml 0.2.5 on torch 2.4.1 (checked against the real package): the device module
has ``get_amp_supported_dtype() -> [float16]``, so ``torch.autocast("privateuseone")`` is
accepted (bfloat16 warns and disables itself). Entering it turns on the AutocastPrivateUse1
dispatch key, for which neither PyTorch nor torch-directml registers a kernel or a
fallthrough: the first operator on a DirectML tensor inside the region raises
``NotImplementedError: Could not run 'aten::...' with arguments from the
'AutocastPrivateUse1' backend``. (#454's "device_type must be 'cuda' or 'cpu'" was the
torch 1.13 era.) With the ``autocast`` switch on the emulator registers nothing, so the same
happens.

With the switch off the emulator registers a fallthrough for AutocastPrivateUse1 and CUDA-like
cast policies for common ops (float16/the autocast dtype for matmul/conv/linear, float32 for
losses, softmax and normalisations); everything else runs in the input dtype.

The same kernels serve dmlshim's float32 autocast regions on real and emulated DirectML
(``dmlshim.patches.amp``: the region's autocast dtype is float32, so eligible ops cast their
float16 inputs up). Registrations are shared: they exist while anyone holds them
(:func:`hold` / :func:`release`).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Set

import torch

from dmlshim.emulator._state import state

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


def sync() -> None:
    """Make the emulator's hold on the registrations match the ``autocast`` switch."""
    if state.autocast:
        release("emulator")
    else:
        hold("emulator")


def install() -> None:
    sync()
