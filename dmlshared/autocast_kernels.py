"""CUDA's autocast for the ``privateuseone`` device, as kernels; shared by DirectML and its emulator.

torch-directml 0.2.5 registers no AutocastPrivateUse1 kernel or fallthrough (#454): the first
operator on a DirectML tensor inside ``torch.autocast("privateuseone")`` raises
``NotImplementedError: Could not run 'aten::...' with arguments from the 'AutocastPrivateUse1'
backend``. These kernels are CUDA's autocast (``aten/src/ATen/autocast_mode.cpp``, the
``AutocastCUDA`` registrations): the same operators under the same cast policies --
``lower_precision_fp`` (matmul, conv, linear, bmm, addmm, RNN cells, attention: the region's
dtype), ``fp32`` (pointwise exp/log/pow..., losses, layer/group norm, upsampling),
``fp32_set_opt_dtype`` (softmax, log_softmax, sum, prod, cumsum, vector/matrix norms: an unset
``dtype=`` becomes float32), ``fp32_append_dtype`` (``norm``), ``promote`` (addcmul, index_put,
scatter_add...: the widest input dtype) and the banned ``binary_cross_entropy`` -- plus a
fallthrough for every other operator, and the RNN entry points cast as cuDNN's RNN is on CUDA
(:data:`RNN_LIKE_CUDNN`). An operator is registered only where the installed torch
registers it for ``AutocastCUDA``, so each torch gets its own CUDA list. Casts follow C++'s
``cached_cast``: floating-point ``privateuseone`` tensors other than float64 are cast, and
float32 leaf tensors that require grad (weights) are cast once per region where the caller
clears the cache at the region's end (:func:`enable_cache`; dmlshim's AMP patch does).

dmlshim's AMP patch holds them on DirectML (real or emulated: float16 regions, and float32 ones
that cast float16 inputs up), and the emulator holds them when its ``autocast`` gap is off.
Plain torch only: neither side's module (see tests/test_import_boundaries.py). Registrations
exist while anyone holds them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import torch

DEVICE = "privateuseone"

# CUDA's policy tables (torch 2.4 to 2.14; each torch registers its own subset, see _enable).
LOWER_PRECISION_FP = (
    "_convolution.deprecated", "_convolution", "conv1d", "conv2d", "conv3d", "conv_tbc",
    "conv_transpose1d", "conv_transpose2d.input", "conv_transpose3d.input", "convolution",
    "prelu", "addmm", "addmv", "addr", "matmul", "einsum", "mm", "mv", "linalg_vecdot", "linear",
    "addbmm", "baddbmm", "bmm", "chain_matmul", "linalg_multi_dot", "_thnn_fused_lstm_cell",
    "_thnn_fused_gru_cell", "lstm_cell", "gru_cell", "rnn_tanh_cell", "rnn_relu_cell",
    "_scaled_dot_product_flash_attention", "scaled_dot_product_attention",
)
FP32 = (
    "acos", "asin", "cosh", "erfinv", "exp", "expm1", "log", "log10", "log2", "log1p",
    "reciprocal", "rsqrt", "sinh", "tan", "pow.Tensor_Scalar", "pow.Tensor_Tensor", "pow.Scalar",
    "softplus", "layer_norm", "native_layer_norm", "rms_norm", "group_norm", "frobenius_norm.dim",
    "nuclear_norm", "nuclear_norm.dim", "cosine_similarity", "poisson_nll_loss",
    "cosine_embedding_loss", "nll_loss", "nll_loss2d", "hinge_embedding_loss", "kl_div",
    "l1_loss", "smooth_l1_loss", "huber_loss", "mse_loss", "margin_ranking_loss",
    "multilabel_margin_loss", "soft_margin_loss", "triplet_margin_loss", "multi_margin_loss",
    "binary_cross_entropy_with_logits", "dist", "pdist", "cdist", "renorm", "logsumexp",
    "upsample_nearest1d", "_upsample_nearest_exact1d", "upsample_nearest2d",
    "_upsample_nearest_exact2d", "upsample_nearest3d", "_upsample_nearest_exact3d",
    "upsample_linear1d", "upsample_bilinear2d", "_upsample_bilinear2d_aa",
    "upsample_trilinear3d", "upsample_bicubic2d", "_upsample_bicubic2d_aa",
    # registered beside the header's lists in torch 2.14 (a matrix function: float32, as the
    # CPU's autocast has it)
    "linalg_matrix_sqrth",
)
FP32_SET_OPT_DTYPE = (
    "prod", "prod.dim_int", "prod.dim_Dimname", "softmax.int", "softmax.Dimname",
    "log_softmax.int", "log_softmax.Dimname", "cumprod", "cumprod.dimname", "cumsum",
    "cumsum.dimname", "linalg_vector_norm", "linalg_matrix_norm", "linalg_matrix_norm.str_ord",
    "sum", "sum.dim_IntList", "sum.dim_DimnameList",
)
# overload without a dtype -> the overload CUDA redispatches to with dtype=float32 appended
FP32_APPEND_DTYPE = {
    "norm.Scalar": "norm.ScalarOpt_dtype",
    "norm.ScalarOpt_dim": "norm.ScalarOpt_dim_dtype",
    "norm.names_ScalarOpt_dim": "norm.names_ScalarOpt_dim_dtype",
}
PROMOTE = (
    "addcdiv", "addcmul", "atan2", "bilinear", "cross", "dot", "vdot", "grid_sampler",
    "index_put", "tensordot", "scatter_add",
)
BANNED = ("binary_cross_entropy",)
# On CUDA, nn.LSTM/GRU/RNN reach cuDNN's _cudnn_rnn, whose autocast kernel casts input, states
# and weights to float16 once. On privateuseone they take the composite path, whose cells see
# transposed weight views (C++'s cache skips views): cast per time step, each copy kept for
# backward. Casting at the composite's entry does what _cudnn_rnn does (registered where this
# torch has the _cudnn_rnn autocast kernel).
RNN_LIKE_CUDNN = ("lstm.input", "lstm.data", "gru.input", "gru.data", "rnn_tanh.input",
                  "rnn_tanh.data", "rnn_relu.input", "rnn_relu.data")
# AutocastCUDA registrations for operators only CUDA tensors reach (cuDNN)
CUDA_BACKEND_ONLY = ("_cudnn_rnn", "cudnn_convolution", "cudnn_convolution_transpose")

BCE_BANNED_MESSAGE = (
    "torch.nn.functional.binary_cross_entropy and torch.nn.BCELoss are unsafe to autocast.\n"
    "Many models use a sigmoid layer right before the binary cross entropy layer.\n"
    "In this case, combine the two layers using torch.nn.functional.binary_cross_entropy_with_logits\n"
    "or torch.nn.BCEWithLogitsLoss.  binary_cross_entropy_with_logits and BCEWithLogits are\n"
    "safe to autocast.")

_EXCLUDE = torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1)
_F32 = torch.float32
_F64 = torch.float64
_fallthrough_lib: Optional[Any] = None
_kernel_lib: Optional[Any] = None
_holders: Set[str] = set()
_registered: Tuple[str, ...] = ()
# cached_cast's cache: id(weight) -> (weight, its _version, the cast). Strong references (no
# weakref: torch.utils.swap_tensors refuses tensors that have one); cleared at the end of each
# outermost region by whoever turned it on, as torch clears its own C++ cache.
_cache: Dict[int, Tuple[torch.Tensor, int, torch.Tensor]] = {}
_caching = False


def _eligible(value: Any) -> bool:
    return (isinstance(value, torch.Tensor) and value.is_floating_point()
            and value.device.type == DEVICE and value.dtype is not _F64)


def _to(value: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    # Tensor.to(dtype) is aten::to.dtype -> _to_copy; calling _to_copy skips Python wrappers
    # that Tensor.to may carry.
    return torch.ops.aten._to_copy.default(value, dtype=dtype)


def _cached_cast(value: Any, dtype: torch.dtype, lower: torch.dtype) -> Any:
    """C++'s ``cached_cast`` for one argument (a tensor, or anything else: returned as is)."""
    if not _eligible(value) or value.dtype is dtype:
        return value
    if (_caching and dtype is lower and value.dtype is _F32 and value.requires_grad
            and value.is_leaf and not value._is_view() and torch.is_autocast_cache_enabled()
            and torch.is_grad_enabled()):
        # Weights are cast once per region. Not under no_grad (a cast made there has no
        # history; torch >= 2.5 does not hand such a cast to a later grad-mode use either).
        hit = _cache.get(id(value))
        if hit is not None and hit[0] is value and hit[1] == value._version:
            return hit[2]
        cast = _to(value, dtype)
        _cache[id(value)] = (value, value._version, cast)
        return cast
    return _to(value, dtype)


# -- argument slots: where an operator's schema has Tensor, Tensor? and Tensor[] arguments ----

Slot = Tuple[int, str, bool]  # (position, name, is a list of tensors)


def _tensor_slots(schema: Any) -> Tuple[Slot, ...]:
    slots: List[Slot] = []
    tensor = torch._C.TensorType.get()
    for i, arg in enumerate(schema.arguments):
        t = arg.type
        kind = t.kind()
        if kind == "OptionalType":
            t, kind = t.getElementType(), t.getElementType().kind()
        if t.isSubtypeOf(tensor):
            slots.append((i, arg.name, False))
        elif kind == "ListType" and t.getElementType().isSubtypeOf(tensor):
            # Tensor[] (cat-like lists); Tensor?[] (index_put's indices) is not cast, as in C++
            slots.append((i, arg.name, True))
    return tuple(slots)


def _map_slots(slots: Tuple[Slot, ...], args: tuple, kwargs: Dict[str, Any],
               fn: Callable[[Any], Any]) -> Tuple[tuple, Dict[str, Any]]:
    new_args = list(args)
    for pos, name, is_list in slots:
        if pos < len(new_args):
            v = new_args[pos]
            new_args[pos] = [fn(x) for x in v] if is_list and v is not None else fn(v)
        elif name in kwargs:
            v = kwargs[name]
            kwargs[name] = [fn(x) for x in v] if is_list and v is not None else fn(v)
    return tuple(new_args), kwargs


def _slot_values(slots: Tuple[Slot, ...], args: tuple, kwargs: Dict[str, Any]) -> List[Any]:
    out: List[Any] = []
    for pos, name, is_list in slots:
        v = args[pos] if pos < len(args) else kwargs.get(name)
        if is_list and v is not None:
            out.extend(v)
        else:
            out.append(v)
    return out


# -- the policies ---------------------------------------------------------------------------

def _lower_precision_fp(op: Any) -> Callable:
    slots = _tensor_slots(op._schema)

    def kernel(*args, **kwargs):
        lower = torch.get_autocast_dtype(DEVICE)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            args, kwargs = _map_slots(slots, args, kwargs,
                                      lambda v: _cached_cast(v, lower, lower))
            return op(*args, **kwargs)

    return kernel


def _fp32(op: Any) -> Callable:
    slots = _tensor_slots(op._schema)

    def kernel(*args, **kwargs):
        lower = torch.get_autocast_dtype(DEVICE)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            args, kwargs = _map_slots(slots, args, kwargs, lambda v: _cached_cast(v, _F32, lower))
            return op(*args, **kwargs)

    return kernel


def _fp32_set_opt_dtype(op: Any) -> Callable:
    names = [a.name for a in op._schema.arguments]
    pos = names.index("dtype")

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            # if the first argument is eligible, an unset dtype becomes float32 (inputs are not
            # cast: the kernel computes in the output dtype); else the call is left alone
            if _eligible(args[0]):
                if pos < len(args):
                    if args[pos] is None:
                        args = args[:pos] + (_F32,) + args[pos + 1:]
                elif kwargs.get("dtype") is None:
                    kwargs["dtype"] = _F32
            return op(*args, **kwargs)

    return kernel


def _fp32_append_dtype(op: Any, target: Any) -> Callable:
    arguments = op._schema.arguments

    def kernel(*args, **kwargs):
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            full = list(args)
            for arg in arguments[len(args):]:
                full.append(kwargs[arg.name] if arg.name in kwargs else arg.default_value)
            out_type = _F32 if _eligible(full[0]) else full[0].dtype
            return target(*full, dtype=out_type)

    return kernel


def _promote(op: Any) -> Callable:
    slots = _tensor_slots(op._schema)

    def kernel(*args, **kwargs):
        lower = torch.get_autocast_dtype(DEVICE)
        with torch._C._ExcludeDispatchKeyGuard(_EXCLUDE):
            to = lower
            for v in _slot_values(slots, args, kwargs):
                if _eligible(v):
                    if to is _F32 or v.dtype is _F32:
                        to = _F32
                    elif v.dtype is not lower:
                        raise RuntimeError("Unexpected floating ScalarType in "
                                           "at::autocast::prioritize")
            args, kwargs = _map_slots(slots, args, kwargs, lambda v: _cached_cast(v, to, lower))
            return op(*args, **kwargs)

    return kernel


def _banned(op: Any) -> Callable:  # noqa: ARG001 - same signature as the other builders
    def kernel(*args, **kwargs):
        raise RuntimeError(BCE_BANNED_MESSAGE)

    return kernel


def _op(name: str) -> Any:
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return None if packet is None else getattr(packet, overload or "default", None)


def policies() -> Dict[str, str]:
    """Every operator of CUDA's tables -> its policy name (whether this torch has it or not)."""
    out: Dict[str, str] = {}
    for names, policy in ((LOWER_PRECISION_FP + RNN_LIKE_CUDNN, "lower_precision_fp"),
                          (FP32, "fp32"),
                          (FP32_SET_OPT_DTYPE, "fp32_set_opt_dtype"),
                          (tuple(FP32_APPEND_DTYPE), "fp32_append_dtype"),
                          (PROMOTE, "promote"), (BANNED, "banned")):
        for name in names:
            out[name] = policy
    return out


def cuda_registered(name: str) -> bool:
    """Whether this torch registers a CUDA autocast kernel for ``aten::name``."""
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key("aten::" + name, "AutocastCUDA")
    except RuntimeError:  # no such operator in this torch
        return False


def _enable() -> None:
    global _fallthrough_lib, _kernel_lib, _registered
    _fallthrough_lib = torch.library.Library("_", "IMPL")  # noqa: TOR901 - destroyed by _disable
    _fallthrough_lib.m.fallback_fallthrough("AutocastPrivateUse1")
    _kernel_lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - destroyed by _disable
    done: List[str] = []
    rnn = cuda_registered("_cudnn_rnn")
    for name, policy in policies().items():
        op = _op(name)
        if op is None or not (cuda_registered(name) or (rnn and name in RNN_LIKE_CUDNN)):
            continue
        if policy == "fp32_append_dtype":
            kernel = _fp32_append_dtype(op, _op(FP32_APPEND_DTYPE[name]))
        else:
            kernel = _BUILDERS[policy](op)
        _kernel_lib.impl(name, kernel, "AutocastPrivateUse1")
        done.append(name)
    _registered = tuple(done)


_BUILDERS: Dict[str, Callable[[Any], Callable]] = {
    "lower_precision_fp": _lower_precision_fp, "fp32": _fp32,
    "fp32_set_opt_dtype": _fp32_set_opt_dtype, "promote": _promote, "banned": _banned,
}


def _disable() -> None:
    global _fallthrough_lib, _kernel_lib, _registered
    for lib in (_kernel_lib, _fallthrough_lib):
        if lib is not None:
            lib._destroy()
    _fallthrough_lib = _kernel_lib = None
    _registered = ()
    clear_cache()


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


def registered_ops() -> Tuple[str, ...]:
    """The operators with a kernel here now (``"mm"``, ``"softmax.int"``, ...)."""
    return _registered


def enable_cache(on: bool = True) -> None:
    """Cache weight casts within a region; the caller promises :func:`clear_cache` at the end of
    every outermost region (torch's ``clear_autocast_cache``). Off: every cast is made anew."""
    global _caching
    _caching = on
    clear_cache()


def clear_cache() -> None:
    _cache.clear()
