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

from dmlshim import current as _current
from dmlshim.config import INTERNAL_BY_NAME
from dmlshim.target import Target

WRAP_ORDINALS_ENV = INTERNAL_BY_NAME["wrap_ordinals"].env
_CUDA_RE = re.compile(r"^cuda(?::(\d+))?$")
_DEVICE_CLS = torch.device


class DeviceMapError(RuntimeError):
    pass


class DeviceMap:
    """The CUDA ordinals of one installation (``api.Shim.devices``) and the device each means."""

    def __init__(self, capabilities: Any) -> None:
        target: Target = capabilities.target
        self.target = target
        self.current = target.index  # the ordinal "cuda" (no index) means: set_device's choice
        # the CPU is one device whatever ordinal the script names
        self.one_device = bool(capabilities.redirects_to_cpu)
        device_type = capabilities.device_type
        if not capabilities.redirects:
            self.devices: List[torch.device] = []  # real CUDA: nothing is rewritten
        elif self.one_device:
            self.devices = [torch.device(device_type)]
        else:
            self.devices = [torch.device(device_type, i) for i in range(target.count)]
        # Multi-process launches: ordinal N -> adapter N % count. torchrun gives each rank
        # LOCAL_RANK, and `cuda:{local_rank}` must still find an adapter when there are more
        # ranks than adapters; mp.spawn children learn it from the launcher's variable.
        self.wrap_ordinals = "LOCAL_RANK" in os.environ or os.environ.get(WRAP_ORDINALS_ENV) == "1"

    def resolve(self, index: int) -> int:
        n = len(self.devices)
        if self.one_device:
            return 0
        if 0 <= index < n:
            return index
        if self.wrap_ordinals and index >= 0 and n:
            return index % n
        return index

    def check(self, index: int) -> None:
        if not self.devices:  # real CUDA: nothing is rewritten
            return
        if self.one_device or self.wrap_ordinals:
            if index < 0:
                raise DeviceMapError(f"dmlshim: invalid CUDA device ordinal {index}")
            return
        n = len(self.devices)
        if not 0 <= index < n:
            raise DeviceMapError(
                f"dmlshim: cuda:{index} requested but this machine has {n} DirectML adapter(s) "
                f"(cuda:0..cuda:{n - 1}); use a lower index or set DMLSHIM_DEVICE=dml:N")

    def device_for(self, index: Optional[int]) -> torch.device:
        if index is None:
            return self.devices[self.current]
        self.check(index)
        return self.devices[self.resolve(index)]

    def set_current(self, index: int) -> None:
        self.check(index)
        self.current = self.resolve(index)


# The functions below are the front doors every patch calls: they read the session's map
# (``api.Shim.devices``; None when nothing is installed or the target is inert) through the
# session pointer directly, adding no frame to an entry point's path.


def active() -> Optional[DeviceMap]:
    shim = _current.session
    return shim.devices if shim is not None else None


def target() -> Optional[Target]:
    m = active()
    return m.target if m is not None else None


def set_wrap_ordinals(on: bool) -> None:
    m = active()
    if m is not None:
        m.wrap_ordinals = on


def current_index() -> int:
    m = active()
    return m.current if m is not None else 0


def set_current_index(index: int) -> None:
    m = active()
    if m is not None:
        m.set_current(index)


def check_index(index: int) -> None:
    m = active()
    if m is not None:
        m.check(index)


def device_for(index: Optional[int]) -> torch.device:
    """The target device standing in for CUDA ordinal ``index`` (None: the current one)."""
    m = active()
    if m is None:
        raise DeviceMapError("dmlshim: no CUDA device map: dmlshim is not installed")
    if index is None:
        return m.devices[m.current]
    return m.device_for(index)


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
    shim = _current.session
    m = shim.devices if shim is not None else None
    if m is None or not m.devices:  # inactive, or the target is real CUDA
        return arg
    cls = arg.__class__
    if cls is str:
        if arg == "cuda":  # the common case, answered without further calls
            return m.devices[m.current]
        if not arg.startswith("cuda"):
            return arg
    elif cls is _DEVICE_CLS:
        if arg.type != "cuda":
            return arg
        if arg.index is None:
            return m.devices[m.current]
    elif not (int_is_cuda and cls is int):
        return arg
    index = cuda_index(arg, int_is_cuda)
    if index is False:
        return arg
    return m.device_for(index)  # type: ignore[arg-type]


def is_target_device(dev: torch.device) -> bool:
    """Whether a tensor on ``dev`` is "on the GPU" from the script's point of view."""
    shim = _current.session
    m = shim.devices if shim is not None else None
    if m is None or not m.devices:
        return dev.type == "cuda"
    return dev.type == m.devices[0].type


def as_cuda(dev: torch.device) -> torch.device:
    """The CUDA device a target device stands for (``privateuseone:1`` -> ``cuda:1``)."""
    m = active()
    if m is None or not m.devices or dev.type != m.devices[0].type:
        return dev
    return torch.device("cuda", dev.index if dev.index is not None else m.current)
