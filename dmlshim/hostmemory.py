"""The host's memory figures: what stands in for device memory where there is no allocator to
ask (the CPU target) and for the device's size where the wheel reports none."""

from __future__ import annotations

import os
import sys
from typing import Tuple

_RSS_GRAIN = 4 * 2**20


def _rss_bytes() -> int:
    """Resident memory, rounded down to 4 MiB: the pages a print or a small Python object adds
    between two calls would otherwise make "peak after reset" exceed the previous peak."""
    return _rss_exact() // _RSS_GRAIN * _RSS_GRAIN


def _rss_exact() -> int:
    if sys.platform == "win32":
        return _windows_process_memory()
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


# Windows has neither /proc, os.sysconf nor the resource module: its own calls, through ctypes.

def _windows_process_memory() -> int:
    """The process's working set (GetProcessMemoryInfo), Windows' resident memory."""
    import ctypes
    from ctypes import wintypes

    class Counters(ctypes.Structure):
        _fields_ = [("cb", wintypes.DWORD), ("PageFaultCount", wintypes.DWORD)] + [
            (name, ctypes.c_size_t) for name in (
                "PeakWorkingSetSize", "WorkingSetSize", "QuotaPeakPagedPoolUsage",
                "QuotaPagedPoolUsage", "QuotaPeakNonPagedPoolUsage", "QuotaNonPagedPoolUsage",
                "PagefileUsage", "PeakPagefileUsage")]

    counters = Counters()
    counters.cb = ctypes.sizeof(Counters)
    psapi = ctypes.WinDLL("psapi")  # type: ignore[attr-defined]
    kernel32 = ctypes.WinDLL("kernel32")  # type: ignore[attr-defined]
    kernel32.GetCurrentProcess.restype = wintypes.HANDLE
    psapi.GetProcessMemoryInfo.argtypes = [wintypes.HANDLE, ctypes.POINTER(Counters),
                                           wintypes.DWORD]
    if not psapi.GetProcessMemoryInfo(kernel32.GetCurrentProcess(), ctypes.byref(counters),
                                      counters.cb):
        raise OSError(ctypes.get_last_error(), "GetProcessMemoryInfo failed")
    return int(counters.WorkingSetSize)


def _windows_meminfo() -> Tuple[int, int]:
    """(available, total) physical memory (GlobalMemoryStatusEx)."""
    import ctypes
    from ctypes import wintypes

    class Status(ctypes.Structure):
        _fields_ = [("dwLength", wintypes.DWORD), ("dwMemoryLoad", wintypes.DWORD)] + [
            (name, ctypes.c_ulonglong) for name in (
                "ullTotalPhys", "ullAvailPhys", "ullTotalPageFile", "ullAvailPageFile",
                "ullTotalVirtual", "ullAvailVirtual", "ullAvailExtendedVirtual")]

    status = Status()
    status.dwLength = ctypes.sizeof(Status)
    if not ctypes.WinDLL("kernel32").GlobalMemoryStatusEx(ctypes.byref(status)):  # type: ignore
        raise OSError(ctypes.get_last_error(), "GlobalMemoryStatusEx failed")
    return int(status.ullAvailPhys), int(status.ullTotalPhys)


def meminfo() -> Tuple[int, int]:
    """(available, total) bytes of system memory."""
    if sys.platform == "win32":
        return _windows_meminfo()
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
    """Resident memory of this process, in 4 MiB steps."""
    return _rss_bytes()
