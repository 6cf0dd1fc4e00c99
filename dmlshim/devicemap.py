"""The one rule: is this argument a CUDA device, and what does it become?

Every patch that sees a device argument asks :func:`map_device`. Only values that *mean* a CUDA
device are rewritten: the strings ``"cuda"`` and ``"cuda:N"``, ``torch.device("cuda"[, N])``,
and (where torch reads them so, e.g. ``x.to(0)``, ``x.cuda(1)``) plain ints. A string that merely
contains "cuda" (a file path) is never touched.

``torch.device("cuda")`` itself is left alone at construction: a script's ``device.type ==
"cuda"`` checks take the branch they take on a CUDA machine, and the device object turns into
the target only where it enters torch (factories, ``.to``, ``.cuda``, ``torch.load``, ...).
"""

from __future__ import annotations

import os
import re
from typing import Any, List, Optional

import torch

from dmlshim.target import Target

_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")
_DEVICE_CLS = torch.device

_target: Optional[Target] = None
_devices: List[torch.device] = []  # target device for each CUDA ordinal
_current = 0  # the ordinal `torch.cuda.set_device` chose ("cuda" with no index means this one)
_wrap_ordinals = False  # multi-process launches: ordinal N -> adapter N % count


class DeviceMapError(RuntimeError):
    pass


def activate(target: Target) -> None:
    global _target, _devices, _current
    _target = target
    _current = target.index
    if target.kind == "cpu":
        _devices = [torch.device("cpu")]
    elif target.kind in ("dml", "emulated-dml"):
        _devices = [torch.device("privateuseone", i) for i in range(target.count)]
    else:
        _devices = []
    global _wrap_ordinals
    # torchrun and friends give each rank LOCAL_RANK; `cuda:{local_rank}` must still find an
    # adapter when there are more ranks than adapters (several ranks then share one).
    _wrap_ordinals = "LOCAL_RANK" in os.environ


def deactivate() -> None:
    global _target, _devices, _current
    _target, _devices, _current = None, [], 0


def target() -> Optional[Target]:
    return _target


def set_wrap_ordinals(on: bool) -> None:
    global _wrap_ordinals
    _wrap_ordinals = on


def current_index() -> int:
    return _current


def set_current_index(index: int) -> None:
    global _current
    check_index(index)
    _current = _resolve_index(index)


def _resolve_index(index: int) -> int:
    if _target is None:
        return index
    n = len(_devices)
    if _target.kind == "cpu":
        return 0
    if 0 <= index < n:
        return index
    if _wrap_ordinals and index >= 0 and n:
        return index % n
    return index


def check_index(index: int) -> None:
    if _target is None or not _target.redirects:
        return
    if _target.kind == "cpu" or _wrap_ordinals:
        if index < 0:
            raise DeviceMapError(f"dmlshim: invalid CUDA device ordinal {index}")
        return
    n = len(_devices)
    if not 0 <= index < n:
        raise DeviceMapError(
            f"dmlshim: cuda:{index} requested but this machine has {n} DirectML adapter(s) "
            f"(cuda:0..cuda:{n - 1}); use a lower index or set DMLSHIM_DEVICE=dml:N")


def device_for(index: Optional[int]) -> torch.device:
    """The target device standing in for CUDA ordinal ``index`` (None: the current one)."""
    if index is None:
        return _devices[_current]
    check_index(index)
    return _devices[_resolve_index(index)]


def cuda_index(arg: Any, int_is_cuda: bool = False) -> Optional[int] | bool:
    """``False`` if ``arg`` is not a CUDA device; else its ordinal (None when unspecified)."""
    cls = arg.__class__
    if cls is str:
        if not arg.startswith("cuda"):
            return False
        m = _CUDA_RE.match(arg)
        if m is None:
            return False
        return int(m.group(1)) if m.group(1) is not None else None
    if cls is _DEVICE_CLS:
        return arg.index if arg.type == "cuda" else False
    if int_is_cuda and cls is int:
        return arg
    return False


def maybe_cuda(arg: Any) -> bool:
    """A cheap first test (inlined by hot wrappers): could ``arg`` denote a CUDA device?"""
    cls = arg.__class__
    return (cls is str and arg.startswith("cuda")) or (cls is _DEVICE_CLS and arg.type == "cuda") \
        or cls is int


def is_cuda_device(arg: Any, int_is_cuda: bool = False) -> bool:
    return cuda_index(arg, int_is_cuda) is not False


def map_device(arg: Any, int_is_cuda: bool = False) -> Any:
    """``arg`` rewritten to the target device if it denotes a CUDA device, else ``arg`` itself."""
    if not _devices:  # inactive, or the target is real CUDA
        return arg
    cls = arg.__class__
    if cls is str:
        if arg == "cuda":  # the common case, answered without further calls
            return _devices[_current]
        if not arg.startswith("cuda"):
            return arg
    elif cls is _DEVICE_CLS:
        if arg.type != "cuda":
            return arg
        if arg.index is None:
            return _devices[_current]
    elif not (int_is_cuda and cls is int):
        return arg
    index = cuda_index(arg, int_is_cuda)
    if index is False:
        return arg
    return device_for(index)  # type: ignore[arg-type]


def is_target_device(dev: torch.device) -> bool:
    """Whether a tensor on ``dev`` is "on the GPU" from the script's point of view."""
    if _target is None:
        return dev.type == "cuda"
    if not _devices:
        return dev.type == "cuda"
    return dev.type == _devices[0].type


def as_cuda(dev: torch.device) -> torch.device:
    """The CUDA device a target device stands for (``privateuseone:1`` -> ``cuda:1``)."""
    if _target is None or not _devices or dev.type != _devices[0].type:
        return dev
    return torch.device("cuda", dev.index if dev.index is not None else _current)
