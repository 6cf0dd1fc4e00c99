"""Per-target answers the emulated ``torch.cuda`` API needs: sync, memory, names.

CPU: memory figures are the process's resident memory (there is no device allocator to ask).
emulated-dml: the emulator's own counters of live device storages.
dml: torch_directml's ``gpu_memory`` (used memory per adapter) where it exists.
"""

from __future__ import annotations

from typing import Dict, Optional, Tuple

from dmlshim import current, devicemap, hostmemory
from dmlshim.capabilities import Capabilities


def _caps() -> Capabilities:
    """The installed target's capabilities (the CPU's when nothing is installed)."""
    shim = current.session
    return shim.capabilities if shim is not None else Capabilities(None, None)


def _peaks() -> Dict[int, int]:
    """Peaks of memory_allocated kept here per ordinal (the installation's; none without)."""
    shim = current.session
    return shim.memory_peaks if shim is not None else {}


def _index(device) -> int:
    """CUDA-style device argument (None, int, "cuda:1", torch.device) -> ordinal."""
    if device is None:
        return devicemap.current_index()
    if isinstance(device, int):
        devicemap.check_index(device)
        return device
    idx = devicemap.cuda_index(device)
    if idx is False:
        import torch

        dev = torch.device(device)
        return dev.index if dev.index is not None else devicemap.current_index()
    return devicemap.current_index() if idx is None else idx  # type: ignore[return-value]


def synchronize(index: int) -> None:
    m = devicemap.active()
    _caps().synchronize(m.resolve(index) if m is not None else index)


def memory_allocated(index: int) -> int:
    value = _caps().memory_allocated(index)
    peaks = _peaks()
    if value > peaks.get(index, 0):
        peaks[index] = value
    return value


def max_memory_allocated(index: int) -> int:
    peak = _caps().max_memory_allocated(index)
    if peak is not None:
        return peak
    current = memory_allocated(index)
    return max(current, _peaks().get(index, 0))


def reset_peak(index: int) -> None:
    _caps().reset_peak(index)
    _peaks()[index] = 0
    memory_allocated(index)


def mem_get_info(index: int) -> Tuple[int, int]:
    free, total = hostmemory.meminfo()
    used = _caps().used_device_memory(index)
    if used is not None:
        return max(total - used, 0), total
    return free, total


def total_memory(index: int) -> int:
    return hostmemory.meminfo()[1]


def device_name(index: int) -> str:
    t = devicemap.target()
    return t.device_name(index) if t is not None else "cpu"


def processor_count(index: int) -> int:
    return _caps().processor_count(index)


def empty_cache() -> None:
    _caps().empty_cache()


def has_bf16() -> bool:
    return _caps().has_bf16()  # DirectML has no bfloat16 (#688)


def float64_supported(index: Optional[int] = None) -> bool:
    return _caps().has_float64(devicemap.current_index() if index is None
                                              else index)
