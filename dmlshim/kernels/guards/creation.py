"""Guards eye (#431): ``torch.eye`` on the device comes back empty (``eye.out`` / ``eye.m_out``
fall back, with an output they cannot resize); and full_float: ``torch.full(size, 1.5,
device=...)`` without a dtype raises "does not support Double" (the wheel's own ``full`` kernel
infers no dtype from a float fill value). Replacements on PrivateUse1: eye built from ``arange``
and ``eq`` (PyTorch's derivative formula stays in force); full as torch's composite does it, the
dtype inferred as torch infers it, then ``empty`` and ``fill_`` (both right on the wheel).
"""

from __future__ import annotations

import torch

from dmlshim import current
from dmlshim.kernels.guards.passthrough import ARANGE

Tensor = torch.Tensor
aten = torch.ops.aten
_FILL_ = torch._C.TensorBase.fill_
_BOOL, _INT64 = torch.bool, torch.int64


def full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None) -> Tensor:
    if dtype is None:  # torch's inference (infer_full_dtype), which the wheel's kernel skips
        if isinstance(fill_value, bool):
            dtype = _BOOL
        elif isinstance(fill_value, int):
            dtype = _INT64
        else:
            if (shim := current.session) is not None:
                shim.events.notes["guard.full_float"] += 1
            dtype = torch.get_default_dtype()
            if isinstance(fill_value, complex):
                dtype = torch.complex128 if dtype is torch.float64 else torch.complex64
    return _FILL_(aten.empty.memory_format(size, dtype=dtype, layout=layout, device=device,
                                           pin_memory=pin_memory), fill_value)


def eye_m(n: int, m: int, *, dtype=None, layout=None, device=None,  # noqa: ARG001
          pin_memory=None) -> Tensor:  # noqa: ARG001
    # The functional forms hand eye.out an empty tensor it cannot resize: build it at (n, m).
    if (shim := current.session) is not None:
        shim.events.notes["guard.eye"] += 1
    rows = ARANGE(0, n, 1, dtype=torch.int64, device=device)
    cols = ARANGE(0, m, 1, dtype=torch.int64, device=device)
    value = torch.eq(rows.unsqueeze(1), cols.unsqueeze(0))
    return value.to(dtype if dtype is not None else torch.get_default_dtype())


def eye(n: int, *, dtype=None, layout=None, device=None, pin_memory=None) -> Tensor:
    return eye_m(n, n, dtype=dtype, device=device)


def eye_m_out(n: int, m: int, *, out: Tensor) -> Tensor:
    return _eye_into(out, n, m)


def eye_out(n: int, *, out: Tensor) -> Tensor:
    return _eye_into(out, n, n)


def _eye_into(out: Tensor, n: int, m: int) -> Tensor:
    if list(out.shape) != [n, m]:
        raise RuntimeError(
            f"torch.eye(out=...): the out= tensor has shape {list(out.shape)}, and DirectML "
            f"cannot resize a device tensor; pass one of shape [{n}, {m}] (or call torch.eye "
            "without out=)")
    return out.copy_(eye_m(n, m, dtype=out.dtype, device=out.device))
