"""What the shim did: counts per API always, call sites only when someone will read them.

Patches call :func:`redirected` when they change a call. Counting is one dict update; finding
the call site (a frame walk) happens only when ``DMLSHIM_LOG`` is ``info``/``debug`` or a report
was asked for, and each call site is logged once.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

log = logging.getLogger("dmlshim")

TAGS = ("redirected", "emulated", "unsupported", "dropped")

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))
_SKIP_PREFIXES: Tuple[str, ...] = (_PKG_DIR,)

api_counts: Counter = Counter()  # "Tensor.cuda" -> calls changed
tag_counts: Counter = Counter()
notes: Counter = Counter()  # free-form counters: "optimizer.rebind", "guard.ce_none", ...
_sites: Dict[Tuple[str, int, str], CallSite] = {}
_lock = threading.Lock()
_trace = False


@dataclass
class CallSite:
    file: str
    line: int
    api: str
    original: str
    became: str
    tag: str
    count: int = 1

    def as_dict(self) -> dict:
        return asdict(self)


def configure(trace: bool) -> None:
    """Turn call-site recording on (info/debug logging, or a report) or off."""
    global _trace, _SKIP_PREFIXES
    _trace = trace
    import torch
    import wrapt

    _SKIP_PREFIXES = (_PKG_DIR, os.path.dirname(torch.__file__), os.path.dirname(wrapt.__file__))


def reset() -> None:
    api_counts.clear()
    tag_counts.clear()
    notes.clear()
    _sites.clear()


def _call_site() -> Tuple[str, int]:
    frame = sys._getframe(2)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not fname.startswith(_SKIP_PREFIXES) and not fname.startswith("<frozen"):
            return fname, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>", 0


def redirected(api: str, original: object = "", became: object = "", tag: str = "redirected") -> None:
    """Record that ``api`` was changed at the caller's call site."""
    api_counts[api] += 1
    tag_counts[tag] += 1
    if not _trace:
        return
    file, line = _call_site()
    key = (file, line, api)
    with _lock:
        site = _sites.get(key)
        if site is not None:
            site.count += 1
            return
        site = CallSite(file, line, api, _short(original), _short(became), tag)
        _sites[key] = site
    log.info("%s:%d: %s(%s) -> %s [%s]", file, line, api, site.original, site.became, tag)


def note(name: str, n: int = 1) -> None:
    notes[name] += n


def call_sites() -> List[CallSite]:
    return list(_sites.values())


def _short(value: object) -> str:
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def summary_dict() -> Dict[str, object]:
    return {
        "api_counts": dict(api_counts),
        "tag_counts": dict(tag_counts),
        "notes": dict(notes),
        "call_sites": [s.as_dict() for s in _sites.values()],
    }


def warn_once_per_site(message: str, category: type = UserWarning, stacklevel: int = 3) -> None:
    """warnings.warn at the user's call site (Python's registry then shows it once per site)."""
    import warnings

    warnings.warn(message, category, stacklevel=stacklevel)


def last_user_frame_info() -> Optional[Tuple[str, int]]:
    f, line = _call_site()
    return None if f == "<unknown>" else (f, line)
