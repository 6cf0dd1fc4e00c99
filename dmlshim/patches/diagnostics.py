"""What the shim did, told at exit: a summary on stderr and, with ``DMLSHIM_REPORT``, a JSON file.

Installed last, so it sees every other patch. It

* counts CPU fallbacks. The emulator keeps exact counts (``emulated_dml.fallback_counts()``),
  which the report uses. On real DirectML the counts are what torch-directml's ``UserWarning:
  The operator 'aten::X' is not currently supported on the DML backend and will fall back to
  run on the CPU...`` says, caught where Python shows warnings (``warnings._showwarnmsg``,
  which both ``warnings.warn`` and C code's ``PyErr_WarnEx`` reach). torch-directml warns from
  one ``TORCH_WARN_ONCE`` site for every op (``dml_cpu_fallback.cpp:15``), i.e. once per
  process in total, and nothing else of the wheel tells which op fell back: a C++ warn-once
  site fires again only under ``torch.set_warn_always(True)``. So when the user asked for
  diagnostics (``DMLSHIM_REPORT`` or ``DMLSHIM_LOG=info``/``debug``: the same switch that
  records call sites), the shim turns ``warn_always`` on and appends an ``always`` filter for
  that message to the end of ``warnings.filters`` (a filter the script adds goes first and
  decides: ignored warnings are not counted): every fallback call is counted per op, and the
  user sees one warning line per op (repeats that only the shim's filter let through are
  swallowed). Cost: nothing on a step without a fallback (the flag is read only when a
  warn-once site fires, the filter only when a warning is raised); per fallback call, one
  Python warning and one shim frame, next to the copies to the host and back that the fallback
  itself makes (``benchmarks/README.md``). What else changes while it is on: torch's other
  ``TORCH_WARN_ONCE`` sites fire on every call too, and Python's default filter shows each once
  per Python source line instead of once per process. Without diagnostics the process is left
  as it is and the report says ``counting: "first-warning"``: the first op that fell back;
  ``DMLSHIM_DEVICE=emulated-dml`` counts every op of a script exactly on any machine;
* remembers how the script ended: an exception or Ctrl-C (``sys.excepthook``, which both Python
  and the runner call), ``sys.exit(n)``, or normally;
* at exit (``atexit``: runs after a normal end, an uncaught exception, ``sys.exit`` and
  KeyboardInterrupt alike — not after ``os._exit`` or a kill signal) logs the summary — at
  ``info`` always, at the default ``warning`` level only when something needs attention (CPU
  fallbacks, unsupported CUDA APIs hit, problems patches reported through
  :func:`dmlshim.events.attention`) — and writes the report.

Reports and child processes: the first process that installs with ``report=PATH`` owns
``PATH`` (it exports ``DMLSHIM_REPORT_OWNER=<pid>:<abs path>``, which children inherit). Any
other process with the same report option — a spawned DataLoader worker, a training rank, a
subprocess — writes ``PATH`` with ``.<pid>`` before the extension instead, and only if it
recorded anything; a forked child starts with empty records. So children never overwrite the
parent's report, and workers that did nothing leave no files.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import platform
import re
import sys
import time
import warnings
from typing import Any, Dict, List, Optional

from dmlshim import capabilities, current, events
from dmlshim.exit_status import interrupted_exit_code
from dmlshim.patching import Owns, Patch

log = logging.getLogger("dmlshim")

SCHEMA_VERSION = 1
REPORT_OWNER_ENV = "DMLSHIM_REPORT_OWNER"  # internal: "<pid>:<absolute report path>"
FALLBACK_RE = re.compile(
    r"The operator '([^']+)' is not currently supported on the DML backend and will fall back "
    r"to run on the CPU")
# The shim's warning filter's message pattern (matched at the start of the message).
FALLBACK_FILTER = r"The operator '[^']+' is not currently supported on the DML backend"

# Counters (events.note) that mean a problem, and what the summary says about them. Patches can
# also report problems directly with events.attention(key, message).
ATTENTION_NOTES = {
    "optimizer.stale": ("optimizer(s) kept stepping {n} parameter(s) the model no longer holds "
                        "(DMLSHIM_OPTIMIZER=off), so those weights did not train; unset "
                        "DMLSHIM_OPTIMIZER or build the optimizer after model.to(...)"),
}

# Other patches add a report section of their own name by defining ``report_section()``,
# returning (the section, lines for the "needs attention" block): dmlshim.patches.check.

_PKG_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep


def child_report_path(path: str, pid: int) -> str:
    """``run/report.json`` -> ``run/report.<pid>.json`` (the report of a child process)."""
    root, ext = os.path.splitext(path)
    return f"{root}.{pid}{ext}" if ext else f"{path}.{pid}"


def _caller_file() -> str:
    """File of the code that called the wrapped function (wrapt's own frames skipped)."""
    frame = sys._getframe(2)
    while frame is not None and os.sep + "wrapt" + os.sep in frame.f_code.co_filename:
        frame = frame.f_back  # type: ignore[assignment]
    return frame.f_code.co_filename if frame is not None else ""


def _utc(ts: float) -> str:
    return datetime.datetime.fromtimestamp(ts, datetime.timezone.utc).isoformat(
        timespec="seconds").replace("+00:00", "Z")



def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    if isinstance(code, bool):
        return int(code)
    if isinstance(code, int):
        return code
    return 1  # sys.exit("message") prints the message and exits with 1


class DiagnosticsPatch(Patch):
    name = "diagnostics"
    owns = (Owns("warnings", ("_showwarnmsg", "showwarning")), Owns("sys", ("excepthook", "exit")))

    def applies(self, caps) -> bool:
        return True

    # -- install ----------------------------------------------------------------------------

    def _install(self, caps, config) -> None:
        self._caps, self._config = caps, config
        self._started = time.time()
        self._started_mono = time.monotonic()
        self._reset_outcome()
        self._report_path = os.path.abspath(config.report) if config.report else ""
        self._owner_pid = os.getpid()
        # the emulator counts fallbacks for the process (it is the device): this session's
        # are those after this point
        self._fallback_base = _exact_fallbacks(caps)

        # _showwarnmsg is where both warnings.warn and C code's PyErr_WarnEx end up when a
        # warning is shown; showwarning is the documented fallback (it misses nothing that a
        # replaced showwarning would not miss too).
        if hasattr(warnings, "_showwarnmsg"):
            self.wrap(warnings, "_showwarnmsg", self._on_warning)
        else:  # pragma: no cover - every CPython from 3.6 to 3.14 has it
            self.wrap(warnings, "showwarning", self._on_showwarning)
        self.wrap(sys, "excepthook", self._on_excepthook)
        self.wrap(sys, "exit", self._on_sys_exit)
        # at_exit and after_fork run from the session's process hooks (dmlshim.api)
        if self._report_path:
            self._claim_report()
        self._fallback_filter: Optional[tuple] = None
        self._shown_fallbacks: set = set()
        self._warn_always_set = False
        if caps.directml and self._fallback_base is None and events.tracing():
            self._count_every_fallback()

    def after_fork(self) -> None:
        """A forked child reports what it did itself, from the fork on (the session has
        emptied the event log)."""
        self._reset_outcome()
        self._fallback_base = _exact_fallbacks(self._caps)
        self._started = time.time()
        self._started_mono = time.monotonic()

    def _claim_report(self) -> None:
        """Own the report path unless a parent process already does (see the module doc)."""
        previous = os.environ.get(REPORT_OWNER_ENV)
        pid_text, _, owned_path = (previous or "").partition(":")
        if previous and owned_path == self._report_path and pid_text.isdigit() \
                and int(pid_text) != os.getpid():
            self._owner_pid = int(pid_text)
        else:
            self._set_env(REPORT_OWNER_ENV, f"{os.getpid()}:{self._report_path}")
        # Children resolve a relative DMLSHIM_REPORT against their own working directory;
        # export the absolute path so they recognise the parent's claim.
        if os.environ.get("DMLSHIM_REPORT") == self._config.report:
            self._set_env("DMLSHIM_REPORT", self._report_path)

    def _count_every_fallback(self) -> None:
        """Make torch-directml's once-per-process fallback warning fire, and count, every call."""
        import torch

        previous = torch.is_warn_always_enabled()
        if not previous:
            torch.set_warn_always(True)
            self._warn_always_set = True

            def restore_warn_always() -> None:
                if torch.is_warn_always_enabled():  # still on: the script did not turn it off
                    torch.set_warn_always(False)

            self.on_undo(restore_warn_always)
        # Last in the list: the script's own filters (and any it adds later, which go first)
        # decide before it; without one, Python's default action would show (and let through)
        # each op's warning once per source line.
        warnings.filterwarnings("always", message=FALLBACK_FILTER, category=UserWarning,
                                append=True)
        self._fallback_filter = ours = warnings.filters[-1]

        def remove_filter() -> None:
            if ours in warnings.filters:
                warnings.filters.remove(ours)
                mutated = getattr(warnings, "_filters_mutated", None)  # drops onceregistries
                if mutated is not None:
                    mutated()

        self.on_undo(remove_filter)

    def _decided_by_our_filter(self, msg: Any) -> bool:
        """Whether the first warning filter that matches ``msg`` is the shim's ``always`` one."""
        ours = self._fallback_filter
        if ours is None:
            return False
        text = str(msg.message)
        module = msg.filename or "<unknown>"
        if module[-3:].lower() == ".py":
            module = module[:-3]
        for item in warnings.filters:
            if item is ours:
                return True
            _, pattern, category, mod, lineno = item
            if (pattern is None or pattern.match(text)) and issubclass(msg.category, category) \
                    and (mod is None or mod.match(module)) and (lineno == 0 or lineno == msg.lineno):
                return False
        return False

    def counting(self) -> str:
        """How the report's CPU-fallback counts were made (report_schema.json)."""
        if self._fallback_base is not None:
            return "exact"
        if self._caps.directml:
            import torch

            if not torch.is_warn_always_enabled():
                return "first-warning"
        return "warnings"

    def _set_env(self, name: str, value: str) -> None:
        old = os.environ.get(name)
        os.environ[name] = value

        def restore() -> None:
            if os.environ.get(name) != value:
                return  # changed by someone else since; leave it
            if old is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = old

        self.on_undo(restore)

    def _reset_outcome(self) -> None:
        self._how = "finished"
        self._exit_code: Optional[int] = None
        self._exception: Optional[str] = None

    # -- hooks --------------------------------------------------------------------------------

    def _on_warning(self, wrapped, instance, args, kwargs):
        try:
            msg = args[0] if args else kwargs.get("msg")
            match = FALLBACK_RE.search(str(getattr(msg, "message", "")))
            if match is not None:
                op = match.group(1)
                events.fallback(op)
                if self._fallback_filter is not None and self._decided_by_our_filter(msg):
                    if op in self._shown_fallbacks:
                        return None  # counted; the user has seen this op's line already
                    self._shown_fallbacks.add(op)
        except Exception:  # pragma: no cover - never let bookkeeping break warnings
            log.debug("dmlshim: fallback capture failed", exc_info=True)
        return wrapped(*args, **kwargs)

    def _on_showwarning(self, wrapped, instance, args, kwargs):  # pragma: no cover
        message = args[0] if args else kwargs.get("message")
        match = FALLBACK_RE.search(str(message))
        if match is not None:
            events.fallback(match.group(1))
        return wrapped(*args, **kwargs)

    def _on_excepthook(self, wrapped, instance, args, kwargs):
        etype = args[0] if args else kwargs.get("exctype")
        value = args[1] if len(args) > 1 else kwargs.get("value")
        if isinstance(etype, type) and issubclass(etype, KeyboardInterrupt):
            self._how, self._exit_code = "interrupted", interrupted_exit_code()
            self._exception = "KeyboardInterrupt"
        elif isinstance(etype, type) and not issubclass(etype, SystemExit):
            self._how, self._exit_code = "exception", 1
            try:
                detail = str(value)
            except Exception:  # a broken __str__ must not hide the traceback
                detail = ""
            text = f"{etype.__name__}: {detail}" if detail else etype.__name__
            self._exception = text if len(text) <= 500 else text[:497] + "..."
        return wrapped(*args, **kwargs)

    def _on_sys_exit(self, wrapped, instance, args, kwargs):
        code = _exit_code(args[0] if args else kwargs.get("status"))
        caller = _caller_file()
        if caller.startswith(_PKG_DIR):
            # the runner's own sys.exit(status) after the script: the final exit status
            if self._how == "finished" and code != 0:
                self._how = "exit"  # the script raised SystemExit(n) itself
        elif self._how == "finished" or self._how == "exit":
            self._how = "exit"
        self._exit_code = code
        return wrapped(*args, **kwargs)

    # -- at exit ------------------------------------------------------------------------------

    def at_exit(self) -> None:
        """Interpreter exit (atexit: the session calls it): the summary and the report."""
        if not self.installed:
            return
        try:
            self._finish()
        except Exception:  # pragma: no cover - exit must go on
            log.debug("dmlshim: exit summary failed", exc_info=True)

    def _finish(self) -> None:
        owner = os.getpid() == self._owner_pid
        if not owner and not events.has_activity():
            return  # a worker that did nothing: no summary, no file
        report = self.report()
        written = None
        if self._report_path:
            path = self._report_path if owner else child_report_path(self._report_path, os.getpid())
            written = write_report(report, path)
        lines = summary_lines(report, written)
        level = logging.WARNING if report["attention"] else logging.INFO
        if log.isEnabledFor(level):
            for line in lines:
                log.log(level, "%s", line)

    def report(self) -> Dict[str, Any]:
        """The report as a dict (what ``DMLSHIM_REPORT`` writes; see report_schema.json)."""
        from dmlshim._version import __version__

        caps, config = self._caps, self._config
        target = caps.target
        now = time.time()
        recorded = events.summary_dict()
        fallbacks, _, moved = fallback_counts(caps, self._fallback_base)
        counting = self.counting()
        attention = attention_messages(recorded, fallbacks, counting)
        sections: Dict[str, Any] = {}
        shim = current.session
        for patch in shim.installed() if shim is not None else ():
            section_fn = getattr(patch, "report_section", None)
            if section_fn is not None:
                sections[patch.name], lines = section_fn()
                attention.extend(lines)
        owner = os.getpid() == self._owner_pid
        outcome_code = self._exit_code if self._exit_code is not None else (
            0 if self._how == "finished" else None)
        by_api = {a: {"count": n, "tag": recorded["api_tags"].get(a, "redirected")}
                  for a, n in sorted(recorded["api_counts"].items())}
        return {
            "schema_version": SCHEMA_VERSION,
            "dmlshim_version": __version__,
            "started": _utc(self._started),
            "ended": _utc(now),
            "duration_s": round(time.monotonic() - self._started_mono, 3),
            "process": {
                "pid": os.getpid(),
                "role": "main" if owner else "child",
                "report_owner_pid": self._owner_pid,
                "argv": list(sys.argv),
                "cwd": _cwd(),
            },
            "environment": {
                "python": platform.python_version(),
                "platform": platform.platform(),
                "torch": _torch_version(),
                "torch_directml": _directml_version(),
            },
            "target": {
                "kind": target.kind, "count": target.count, "index": target.index,
                "reason": target.reason, "names": list(target.names),
                "float64": list(target.float64), "inert": target.inert,
            },
            "options": {name: {"value": value, "source": config.sources.get(name, "default")}
                        for name, value in config.values.items()},
            "patches": [p.name for p in shim.installed()] if shim is not None else [],
            "outcome": {"how": self._how, "exit_code": outcome_code,
                        "exception": self._exception},
            "calls": {
                "total": sum(recorded["api_counts"].values()),
                "by_api": by_api,
                "by_tag": dict(sorted(recorded["tag_counts"].items())),
            },
            "call_sites_recorded": events.tracing(),
            "call_sites": [_site_dict(s) for s in recorded["call_sites"]],
            "notes": dict(sorted(recorded["notes"].items())),
            "cpu_fallbacks": {
                "counting": counting,
                "ops": dict(sorted(fallbacks.items(), key=lambda kv: (-kv[1], kv[0]))),
                "total": sum(fallbacks.values()),
                **({"bytes": moved} if moved is not None else {}),
            },
            "attention": attention,
            **sections,
        }


# -- report pieces ----------------------------------------------------------------------------

def _site_dict(site: Dict[str, Any]) -> Dict[str, Any]:
    keys = ("file", "line", "api", "call", "original", "became", "tag", "count")
    return {k: site[k] for k in keys}


def _cwd() -> str:
    try:
        return os.getcwd()
    except OSError:  # pragma: no cover - deleted working directory
        return ""


def _torch_version() -> str:
    import torch

    return str(torch.__version__)


def _directml_version() -> Optional[str]:
    mod = sys.modules.get("torch_directml")
    if mod is not None and getattr(mod, "__version__", None):
        return str(mod.__version__)
    try:
        from importlib.metadata import PackageNotFoundError, version
    except ImportError:  # pragma: no cover
        return None
    try:
        return version("torch-directml")
    except PackageNotFoundError:
        return None


def _exact_fallbacks(caps: capabilities.Capabilities) -> Any:
    """(counts, bytes) of the CPU fallbacks so far, where the target counts them exactly (the
    emulator), else None."""
    try:
        exact = caps.exact_fallback_counts()
        if exact is None:
            return None
        return dict(exact), dict(caps.exact_fallback_bytes())
    except (ImportError, AttributeError):
        return None


def fallback_counts(caps: capabilities.Capabilities, base: Any = None) -> tuple:
    """({op: count}, counting, bytes) — exact counts where the target keeps them (the emulator;
    those after ``base``, an earlier :func:`_exact_fallbacks`) with the bytes they copied
    (``{op: {"to_host": n, "to_device": n}}``), else the warnings seen and None."""
    now = _exact_fallbacks(caps)
    if now is None:
        return dict(events.cpu_fallbacks), "warnings", None
    counts, moved = now
    before_counts, before_moved = base if base is not None else ({}, {})
    ops = {_op_name(op): int(n) - int(before_counts.get(op, 0)) for op, n in counts.items()}
    copied = {}
    for op, (a, b) in sorted(moved.items()):
        a0, b0 = before_moved.get(op, (0, 0))
        if a - a0 or b - b0:
            copied[_op_name(op)] = {"to_host": int(a - a0), "to_device": int(b - b0)}
    return {op: n for op, n in ops.items() if n > 0}, "exact", copied


def _op_name(op: str) -> str:
    return op if "::" in op else "aten::" + op


def attention_messages(recorded: Dict[str, Any], fallbacks: Dict[str, int],
                       counting: str) -> List[str]:
    out: List[str] = []
    if fallbacks:
        names = ", ".join(sorted(fallbacks))
        many = (f"{len(fallbacks)} op(s)" if counting != "first-warning" else
                "op(s) (torch-directml names the first of the process only)")
        out.append(f"{many} ran on the CPU instead of the device: {names}; "
                   "every such call copies its tensors to the host and back (slower, not wrong)")
    unsupported = sorted(a for a, t in recorded["api_tags"].items() if t == "unsupported")
    if unsupported:
        out.append("the script called CUDA APIs that have no equivalent here (they raised): "
                   + ", ".join(unsupported))
    for name, template in ATTENTION_NOTES.items():
        n = recorded["notes"].get(name)
        if n:
            out.append(template.format(n=n))
    out.extend(recorded["attention"])
    return out


def summary_lines(report: Dict[str, Any], written: Optional[str] = None) -> List[str]:
    """The exit summary, one log line each (the handler prefixes ``dmlshim: ``)."""
    t = report["target"]
    lines = [f"summary: target {t['kind']} ({t['reason']}); "
             f"{report['duration_s']:.1f} s; script {_outcome_text(report['outcome'])}"]
    if report["process"]["role"] == "child":
        lines[0] += f" [child process {report['process']['pid']}]"
    calls = report["calls"]
    if calls["total"]:
        sites = len(report["call_sites"])
        where = f" at {sites} call site(s)" if report["call_sites_recorded"] else ""
        lines.append(f"  calls changed: {calls['total']}{where}")
        by_tag: Dict[str, List[str]] = {}
        for api_name, info in calls["by_api"].items():
            by_tag.setdefault(info["tag"], []).append(f"{api_name} x{info['count']}")
        for tag in events.TAGS + tuple(sorted(set(by_tag) - set(events.TAGS))):
            if tag in by_tag:
                lines.append(f"    {tag}: " + ", ".join(by_tag[tag]))
    else:
        lines.append("  calls changed: none")
    groups: Dict[str, List[str]] = {}
    for name, n in report["notes"].items():
        group, _, rest = name.partition(".")
        groups.setdefault(group, []).append(f"{rest or group} x{n}")
    for group in sorted(groups):
        label = {"optimizer": "optimizer", "guard": "guards applied"}.get(group, group)
        lines.append(f"  {label}: " + ", ".join(groups[group]))
    fb = report["cpu_fallbacks"]
    if fb["ops"]:
        if fb["counting"] == "first-warning":
            # torch-directml warns once per process: the first op that fell back
            head = "  CPU fallbacks (torch-directml warns once per process: the first op that " \
                   "fell back; DMLSHIM_REPORT=path or DMLSHIM_LOG=info counts every op and call): "
        elif fb["counting"] == "warnings":
            head = "  CPU fallbacks (calls, from torch-directml's warnings): "
        else:
            head = "  CPU fallbacks (calls): "
        items = [f"{op} x{n}" for op, n in fb["ops"].items()]
        lines.append(head + ", ".join(items))
    for message in report["attention"]:
        lines.append("  needs attention: " + message)
    if written:
        lines.append(f"  report: {written}")
    return lines


def _outcome_text(outcome: Dict[str, Any]) -> str:
    how = outcome["how"]
    if how == "finished":
        return "finished"
    if how == "exit":
        return f"called sys.exit({outcome['exit_code']})"
    if how == "interrupted":
        return "was interrupted (KeyboardInterrupt)"
    return f"raised {outcome['exception']}"


def write_report(report: Dict[str, Any], path: str) -> Optional[str]:
    """Write ``report`` to ``path`` atomically; the path on success, None (and a warning) if not."""
    tmp = f"{path}.tmp{os.getpid()}"
    try:
        with open(tmp, "w", encoding="utf-8") as fh:
            json.dump(report, fh, indent=2, default=str)
            fh.write("\n")
        os.replace(tmp, path)
        return path
    except OSError as err:
        log.warning("could not write the report to %s: %s (check DMLSHIM_REPORT)", path, err)
        try:
            os.unlink(tmp)
        except OSError:
            pass
        return None


def schema_path() -> str:
    """Where the report's JSON schema lives."""
    return os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                        "report_schema.json")
