"""Per-target answers the emulated ``torch.cuda`` API needs: sync, memory, names.

CPU: memory figures are the process's resident memory (there is no device allocator to ask).
emulated-dml: the emulator's own counters of live device storages.
dml: torch_directml's ``gpu_memory`` (used memory per adapter) where it exists.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, Optional, Tuple

from dmlshim import capabilities, devicemap


def _peaks() -> Dict[int, int]:
    """Peaks of memory_allocated kept here per ordinal (the installation's; none without)."""
    from dmlshim import api

    shim = api.session()
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


_RSS_GRAIN = 4 * 2**20


def _rss_bytes() -> int:
    """Resident memory, rounded down to 4 MiB: the pages a print or a small Python object adds
    between two calls would otherwise make "peak after reset" exceed the previous peak."""
    return _rss_exact() // _RSS_GRAIN * _RSS_GRAIN


def _rss_exact() -> int:
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def _meminfo() -> Tuple[int, int]:
    """(available, total) bytes of system memory."""
    try:
        info = {}
        with open("/proc/meminfo", encoding="ascii") as fh:
            for line in fh:
                key, _, rest = line.partition(":")
                info[key] = int(rest.split()[0]) * 1024
        return info.get("MemAvailable", info["MemFree"]), info["MemTotal"]
    except (OSError, KeyError, ValueError):
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
        return total, total


def process_memory() -> int:
    return _rss_bytes()


def synchronize(index: int) -> None:
    capabilities.current().synchronize(index)


def memory_allocated(index: int) -> int:
    value = capabilities.current().memory_allocated(index)
    peaks = _peaks()
    if value > peaks.get(index, 0):
        peaks[index] = value
    return value


def max_memory_allocated(index: int) -> int:
    peak = capabilities.current().max_memory_allocated(index)
    if peak is not None:
        return peak
    current = memory_allocated(index)
    return max(current, _peaks().get(index, 0))


def reset_peak(index: int) -> None:
    capabilities.current().reset_peak(index)
    _peaks()[index] = 0
    memory_allocated(index)


def mem_get_info(index: int) -> Tuple[int, int]:
    free, total = _meminfo()
    used = capabilities.current().used_device_memory(index)
    if used is not None:
        return max(total - used, 0), total
    return free, total


def total_memory(index: int) -> int:
    return _meminfo()[1]


def device_name(index: int) -> str:
    t = devicemap.target()
    return t.device_name(index) if t is not None else "cpu"


def processor_count(index: int) -> int:
    return capabilities.current().processor_count(index)


def empty_cache() -> None:
    capabilities.current().empty_cache()


def has_bf16() -> bool:
    return capabilities.current().has_bf16()  # DirectML has no bfloat16 (#688)


def float64_supported(index: Optional[int] = None) -> bool:
    return capabilities.current().has_float64(devicemap.current_index() if index is None
                                              else index)
