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
    try:
        with open("/proc/self/statm", encoding="ascii") as fh:
            return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, AttributeError):
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak if sys.platform == "darwin" else peak * 1024


def meminfo() -> Tuple[int, int]:
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
    """Resident memory of this process, in 4 MiB steps."""
    return _rss_bytes()
