"""The CPU fallback of torch-directml: which operators take it, the warning, the counters.

How the emulator decides (``_policy.py``) mirrors PyTorch's dispatcher with torch-directml
0.2.5 loaded: an operator runs "on the device" when torch-directml 0.2.5 registers a
PrivateUse1 kernel for it (``_dml_ops.DML_KERNELS_0_2_5``, read from the real package) or for
its out= variant (structured operators: the functional and in-place forms route through the
out= kernel), decomposes when PyTorch has a composite kernel for it, and otherwise lands in
the boxed CPU fallback, which counts and warns here. (The same rule holds for every operator,
reported or not: e.g. ``aten::std.correction`` and ``aten::isneginf.out`` fall back too.)

REPORTED_FALLBACKS lists the operators users reported in microsoft/DirectML issues, with
what the emulator does for each on torch-directml 0.2.5. Several reports are from older
releases and no longer fall back in 0.2.5; the emulator follows 0.2.5:

* the ``aten::_foreach_*`` ops (#604, #626, torch-directml 0.2.2-0.2.4 on torch 2.3) have a
  CompositeExplicitAutograd kernel since torch 2.4, which loops over the per-tensor op.
  Optimizers still take the foreach path on the device, and the per-tensor op is what falls
  back: Adam/AdamW/NAdam report ``aten::lerp.Scalar_out`` every step (#675, reported on
  0.2.5), SGD and the ``_foreach_mul_/_add_/...`` ops run on the device.
* ``aten::multinomial`` (#372), ``aten::native_dropout_backward`` (#630, 0.2.4) and
  ``aten::std_mean.correction`` (#536) have kernels in 0.2.5.
"""

from __future__ import annotations

import sys
import warnings
from dataclasses import dataclass
from typing import Dict, List, Tuple

import torch

from emulated_dml._state import state

WARNING_TEXT = (
    "The operator '{op}' is not currently supported on the DML backend and will fall back to "
    "run on the CPU. This may have performance implications."
)


@dataclass(frozen=True)
class ReportedOp:
    name: str  # the name torch-directml prints (schema name with overload)
    issues: Tuple[int, ...]  # microsoft/DirectML issue numbers
    falls_back_in_0_2_5: bool
    note: str = ""


REPORTED_FALLBACKS: Tuple[ReportedOp, ...] = (
    ReportedOp("aten::_foreach_lerp_.Scalar", (604,), False,
               "composite since torch 2.4: per-tensor aten::lerp_.Scalar -> lerp.Scalar_out falls back"),
    ReportedOp("aten::_foreach_add_.List", (604,), False,
               "composite since torch 2.4: per-tensor add_ runs on the device"),
    ReportedOp("aten::_foreach_mul_.Scalar", (626,), False,
               "composite since torch 2.4: per-tensor mul_ runs on the device"),
    ReportedOp("aten::lerp.Scalar_out", (675,), True,
               "lerp.Scalar and lerp_.Scalar route through it (structured op)"),
    ReportedOp("aten::native_dropout_backward", (630,), False, "kernel added by 0.2.5"),
    ReportedOp("aten::native_group_norm_backward", (678,), True),
    ReportedOp("aten::_thnn_fused_lstm_cell", (654, 677), True,
               "no CPU kernel either: the fallback raises NotImplementedError (LSTM on the device)"),
    ReportedOp("aten::binary_cross_entropy", (411,), True),
    ReportedOp("aten::multinomial", (372,), False, "kernel in 0.2.5"),
    ReportedOp("aten::normal.Tensor_Tensor", (405,), True),
    ReportedOp("aten::cumprod.out", (437,), True, "cumprod and cumprod_ route through it"),
    ReportedOp("aten::eye.m_out", (431,), True,
               "torch.eye(n, m, device=...) comes back empty (gap 'eye'; torch.eye(n) under "
               "aten::eye.out)"),
    ReportedOp("aten::_linalg_solve_ex.result", (431,), True, "torch.linalg.solve"),
    ReportedOp("aten::std_mean.correction", (536,), False, "kernel in 0.2.5"),
    ReportedOp("aten::count_nonzero.dim_IntList", (665,), True,
               "count_nonzero without dim decomposes into it"),
    ReportedOp("aten::upsample_nearest1d.out", (718,), True,
               "F.interpolate(mode='nearest') on 3-D input"),
    ReportedOp("aten::_embedding_bag", (724,), True, "nn.EmbeddingBag"),
)

_counts: Dict[str, int] = {}
_warned: set = set()
# op -> [bytes copied to the host, bytes copied back to the device], summed over its calls
_bytes: Dict[str, List[int]] = {}
_warned_once = False  # the single TORCH_WARN_ONCE site of torch-directml has fired


def counts() -> Dict[str, int]:
    return dict(_counts)


def bytes_moved() -> Dict[str, Tuple[int, int]]:
    """``{op: (to_host, to_device)}``: bytes the fallbacks copied, since the last reset."""
    return {op: (v[0], v[1]) for op, v in _bytes.items()}


def reset_counts() -> None:
    _counts.clear()
    _bytes.clear()


def record_bytes(op_name: str, to_host: int, to_device: int) -> None:
    """Add one fallback call's copies: every device tensor argument to the host (as
    torch-directml's boxed fallback does), every result and written argument back."""
    entry = _bytes.setdefault(op_name, [0, 0])
    entry[0] += to_host
    entry[1] += to_device


def rearm_warnings() -> None:
    """Let the fallback warning fire again (torch-directml warns once per process in total)."""
    global _warned_once
    _warned.clear()
    _warned_once = False


def _caller_stacklevel() -> int:
    # Point the warning at the innermost Python frame outside the emulator, as PyTorch does
    # for TORCH_WARN in C++ kernels (torch-directml's warnings show e.g. torch/optim/adam.py).
    frame = sys._getframe(2)
    level = 2
    while frame is not None:
        # torch._ops is the OpOverload call/redispatch machinery the emulator goes through.
        if not frame.f_globals.get("__name__", "").startswith(("emulated_dml", "torch._ops")):
            return level
        frame = frame.f_back
        level += 1
    return 2


def _should_warn(op_name: str) -> bool:
    # torch-directml warns from one TORCH_WARN_ONCE site (dml_cpu_fallback.cpp:15) for every
    # operator: once per process in total, or every time under torch.set_warn_always(True),
    # which does not use up the "once". Without the gap: once per operator.
    global _warned_once
    if torch.is_warn_always_enabled():
        return True
    if state.fallback_warn_once:
        if _warned_once:
            return False
        _warned_once = True
        return True
    if op_name in _warned:
        return False
    _warned.add(op_name)
    return True


def record(op_name: str) -> None:
    """Count one CPU fallback of ``op_name`` and warn like torch-directml (see _should_warn)."""
    _counts[op_name] = _counts.get(op_name, 0) + 1
    if _should_warn(op_name):
        warnings.warn(WARNING_TEXT.format(op=op_name), UserWarning, stacklevel=_caller_stacklevel())
