"""What the shim did: counts per API always, call sites only when someone will read them.

Patches call :func:`redirected` when they change a call. Counting is one dict update; finding
the call site (a frame walk) happens only when ``DMLSHIM_LOG`` is ``info``/``debug`` or a report
was asked for, and each call site is logged once, at info level::

    dmlshim: train.py:42: Tensor.cuda() -> cpu [redirected]
    dmlshim: train.py:57: torch.cuda.graph_pool_handle() -> error [unsupported]

that is ``file:line: <the call as written> -> <what it became> [<tag>]``; the file is shown
relative to the working directory when it lies below it. Tags (:data:`TAGS`): *redirected* (a
CUDA device argument now names the target), *emulated* (answered by dmlshim instead of CUDA),
*unsupported* (no equivalent: the call raised an error that says what to do), *dropped* (a
CUDA-only request, e.g. pinned memory, turned into a no-op).

Besides call sites: :func:`note` counts named events (``optimizer.rebind``, ``guard.ce_none``;
the exit summary groups them by the part before the first dot), :func:`attention` records
something the user should look at (the exit summary is then shown at the default log level
too), and :func:`fallback` counts ops that ran on the CPU instead of the device
(``dmlshim.patches.diagnostics`` feeds it).

The records belong to the installation (:class:`EventLog`, held by ``api.Shim``): they go
with uninstall(), a forked child starts a clean log, and with nothing installed a record goes
nowhere.
"""

from __future__ import annotations

import importlib.util
import logging
import os
import sys
import threading
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Dict, List, Optional, Tuple

from dmlshim import current as _current

log = logging.getLogger("dmlshim")

TAGS = ("redirected", "emulated", "unsupported", "dropped")

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
# the emulator's frames stand in for the wheel's C++, and the kernels it shares with dmlshim
# (dmlshared) are never the script's either: never a call site
_EMULATOR_DIR = os.path.join(os.path.dirname(_PKG_DIR.rstrip(os.sep)), "emulated_dml") + os.sep
_SHARED_DIR = os.path.join(os.path.dirname(_PKG_DIR.rstrip(os.sep)), "dmlshared") + os.sep


def _package_dir(name: str) -> Tuple[str, ...]:
    """The folder of the installed package ``name``, found without importing it."""
    try:
        spec = importlib.util.find_spec(name)
    except (ImportError, ValueError):
        return ()
    if spec is None or not spec.submodule_search_locations:
        return ()
    return (os.path.join(os.path.abspath(list(spec.submodule_search_locations)[0]), ""),)


# Frames under these folders are dmlshim's, the emulator's, torch's or wrapt's, never the user's.
_SKIP_PREFIXES: Tuple[str, ...] = (_PKG_DIR, _EMULATOR_DIR, _SHARED_DIR) \
    + _package_dir("torch") + _package_dir("wrapt")


@dataclass
class CallSite:
    file: str  # absolute path (or "<stdin>", "<string>", "<unknown>")
    line: int
    api: str  # e.g. "Tensor.cuda", "torch.zeros", "torch.cuda.synchronize"
    original: str  # the argument the script passed, as text ("" when there was none)
    became: str  # what the shim made of it, as text
    tag: str  # one of TAGS
    count: int = 1  # calls seen at this site
    call: str = ""  # the call as shown in the log, e.g. "Tensor.cuda('cuda:0')"

    def as_dict(self) -> dict:
        return asdict(self)

    def where(self, cwd: Optional[str] = None) -> str:
        return f"{display_path(self.file, cwd)}:{self.line}"

    def log_line(self, cwd: Optional[str] = None) -> str:
        return f"{self.where(cwd)}: {self.call} -> {self.became} [{self.tag}]"


class EventLog:
    """The records of one installation (``api.Shim.events``); dropped by uninstall()."""

    def __init__(self, trace: bool = False) -> None:
        self.trace = trace  # record call sites (a frame walk per new call)
        self.api_counts: Counter = Counter()  # "Tensor.cuda" -> calls changed
        self.api_tags: Dict[str, str] = {}  # "Tensor.cuda" -> its tag
        self.tag_counts: Counter = Counter()
        self.notes: Counter = Counter()  # free-form: "optimizer.rebind", "guard.ce_none", ...
        self.cpu_fallbacks: Counter = Counter()  # "aten::lerp.Scalar_out" -> times seen
        self.attention: Dict[str, str] = {}  # key -> message, in the order first reported
        self.sites: Dict[Tuple[str, int, str], CallSite] = {}
        self.lock = threading.Lock()

    def reset(self) -> None:
        for records in (self.api_counts, self.api_tags, self.tag_counts, self.notes,
                        self.cpu_fallbacks, self.attention, self.sites):
            records.clear()

    def after_fork(self) -> None:
        """A forked child starts with empty records (and a lock no other thread can be holding:
        a DataLoader worker or hogwild process may fork while another thread records)."""
        self.lock = threading.Lock()
        self.reset()

    def summary_dict(self) -> Dict[str, object]:
        return {
            "api_counts": dict(self.api_counts),
            "api_tags": dict(self.api_tags),
            "tag_counts": dict(self.tag_counts),
            "notes": dict(self.notes),
            "call_sites": [s.as_dict() for s in self.sites.values()],
            "cpu_fallbacks": dict(self.cpu_fallbacks),
            "attention": list(self.attention.values()),
        }

    def has_activity(self) -> bool:
        return bool(self.api_counts or self.notes or self.cpu_fallbacks or self.attention)


# what tests and tools read as module attributes (events.api_counts...): the current log's
_LOG_ATTRIBUTES = ("api_counts", "api_tags", "tag_counts", "notes", "cpu_fallbacks")


def __getattr__(name: str) -> object:
    if name in _LOG_ATTRIBUTES:
        return getattr(current_log(), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def current_log() -> EventLog:
    """The installation's log; with nothing installed, an empty one that records nothing
    anyone reads (the module functions below drop records then)."""
    shim = _current.session
    return shim.events if shim is not None else EventLog()


def tracing() -> bool:
    shim = _current.session
    return shim is not None and shim.events.trace


def reset() -> None:
    current_log().reset()


def _call_site() -> Tuple[str, int]:
    frame = sys._getframe(2)
    while frame is not None:
        fname = frame.f_code.co_filename
        if not fname.startswith(_SKIP_PREFIXES) and not fname.startswith("<frozen"):
            return fname, frame.f_lineno
        frame = frame.f_back  # type: ignore[assignment]
    return "<unknown>", 0


def redirected(api: str, original: object = "", became: object = "", tag: str = "redirected",
               arg: str = "") -> None:
    """Record that ``api`` was changed at the caller's call site.

    ``original``: the argument the script passed that made the difference (a device, ``True``
    for ``pin_memory=True``; ``""`` when the call had none, e.g. ``x.cuda()``); ``became``: what
    it turned into (a device, ``"no-op"``, ``"error"``, an emulated answer); ``arg``: the
    keyword the script passed it as, if any (``"device"``: logged as ``torch.zeros(device='cuda')``).
    """
    shim = _current.session
    if shim is None:
        return
    records = shim.events
    records.api_counts[api] += 1
    records.tag_counts[tag] += 1
    records.api_tags[api] = tag
    if not records.trace:
        return
    file, line = _call_site()
    key = (file, line, api)
    with records.lock:
        site = records.sites.get(key)
        if site is not None:
            site.count += 1
            return
        site = CallSite(file, line, api, _short(original), _short_result(became), tag,
                        call=render_call(api, original, arg))
        records.sites[key] = site
    log.info("%s", site.log_line())


def note(name: str, n: int = 1) -> None:
    shim = _current.session
    if shim is not None:
        shim.events.notes[name] += n


def attention(key: str, message: str) -> None:
    """Something the user should look at (shown in the exit summary even at the default level).

    ``key`` deduplicates (``"optimizer.stale_params"``); the first message for a key is kept.
    """
    shim = _current.session
    if shim is None:
        return
    records = shim.events
    with records.lock:
        records.attention.setdefault(key, message)


def attention_messages() -> List[str]:
    return list(current_log().attention.values())


def fallback(op: str, n: int = 1) -> None:
    """``op`` (``"aten::lerp.Scalar_out"``) ran on the CPU instead of the device ``n`` times."""
    shim = _current.session
    if shim is not None:
        shim.events.cpu_fallbacks[op] += n


def call_sites() -> List[CallSite]:
    return list(current_log().sites.values())


def _short(value: object) -> str:
    if isinstance(value, str) and value == "":
        return ""
    text = repr(value) if isinstance(value, str) else str(value)
    return text if len(text) <= 80 else text[:77] + "..."


def _short_result(value: object) -> str:
    if isinstance(value, str):
        if not value:
            return "''"
        return value if len(value) <= 80 else value[:77] + "..."
    return _short(value)


def _empty(value: object) -> bool:
    return value is None or (isinstance(value, str) and value == "")


def render_call(api: str, original: object, arg: str = "") -> str:
    """The call as the log shows it: ``Tensor.cuda()``, ``torch.zeros(device='cuda')``...

    ``api`` may already carry its argument (``"DataLoader(pin_memory=True)"``) or name it
    (``"DataLoader(pin_memory_device)"``: the value is filled in); ``original`` may be the call
    text itself (``"pin_memory()"``); ``arg`` names the keyword it was passed as.
    """
    if arg and not _empty(original) and not api.endswith(")"):
        return f"{api}({arg}={_short(original)})"
    if api.endswith(")"):
        inner = api[api.index("(") + 1:-1] if "(" in api else ""
        if _empty(original) or "=" in inner or not inner:
            return api
        return f"{api[:-1]}={_short(original)})"
    last = api.rsplit(".", 1)[-1]
    if isinstance(original, str) and original.startswith(last + "("):
        return api[: len(api) - len(last)] + original
    if isinstance(original, str) and original == "":
        return f"{api}()"
    return f"{api}({_short(original)})"


def display_path(file: str, cwd: Optional[str] = None) -> str:
    """``file`` relative to the working directory when it lies below it, else as it is."""
    try:
        cwd = cwd or os.getcwd()
    except OSError:
        return file
    if file.startswith(cwd.rstrip(os.sep) + os.sep):
        return file[len(cwd.rstrip(os.sep)) + 1:]
    return file


def summary_dict() -> Dict[str, object]:
    return current_log().summary_dict()


def has_activity() -> bool:
    """Whether anything at all was recorded (child processes write a report only then)."""
    return current_log().has_activity()


def warn_at_user_site(message: str, category: type = UserWarning) -> None:
    """``warnings.warn`` attributed to the first frame outside dmlshim, torch and wrapt.

    Python's warning registry then shows each message once per user call site.
    """
    import warnings

    frame = sys._getframe(1)
    level = 2
    while frame is not None and frame.f_code.co_filename.startswith(_SKIP_PREFIXES + ("<frozen",)):
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    warnings.warn(message, category, stacklevel=level)


def last_user_frame_info() -> Optional[Tuple[str, int]]:
    f, line = _call_site()
    return None if f == "<unknown>" else (f, line)


def is_user_file(filename: str) -> bool:
    """Whether a frame of ``filename`` is the user's (not dmlshim's, torch's or wrapt's): the
    same test :func:`warn_at_user_site` and call-site recording apply to live frames."""
    return not filename.startswith(_SKIP_PREFIXES + ("<frozen",))
