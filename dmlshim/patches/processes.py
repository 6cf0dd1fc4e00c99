"""Child processes carry the shim: DataLoader workers, multiprocessing, mp.spawn, subprocesses.

* **spawn / forkserver / subprocess** children start a fresh interpreter. While the shim is
  installed, ``os.environ`` holds the options in force (``DMLSHIM_*``), ``DMLSHIM_BOOTSTRAP=1``
  and dmlshim/bootstrap first on ``PYTHONPATH``; the bootstrap's ``sitecustomize`` installs the
  shim in the child when the child imports torch (the coverage.py / opentelemetry-instrument
  mechanism). ``uninstall()`` puts those variables back, so processes started afterwards (or by
  anything outside the shimmed tree) see the environment they would have seen without dmlshim.
* **fork** children inherit the patched interpreter as it is; the only state to repair is a
  lock another thread might have held at the moment of the fork.
* ``torch.multiprocessing.spawn``/``start_processes`` launch one process per "GPU" and the
  children call ``torch.cuda.set_device(rank)``: the children map CUDA ordinal N to adapter
  N % count, as torchrun's ``LOCAL_RANK`` launches do (see devicemap).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from typing import Dict, List, Optional

from dmlshim import devicemap, events
from dmlshim.bootstrap import BOOTSTRAP_DIR, SWITCH_ENV
from dmlshim.patching import Patch

log = logging.getLogger("dmlshim")

# internal (not an option): "1" in children of torch.multiprocessing.spawn/start_processes
WRAP_ORDINALS_ENV = "DMLSHIM_WRAP_ORDINALS"
# The JSON report belongs to the process that asked for it: children would overwrite it.
CHILD_OVERRIDES = {"DMLSHIM_REPORT": ""}


def _split_path(value: Optional[str]) -> List[str]:
    return [p for p in (value or "").split(os.pathsep) if p]


def child_environment(config) -> Dict[str, str]:
    """The variables a child needs to carry the shim with ``config``'s options."""
    env = dict(config.as_env())
    env.update(CHILD_OVERRIDES)
    env[SWITCH_ENV] = "1"
    return env


class _EnvironmentExport:
    """Set variables in ``os.environ`` and put back exactly what was there before.

    A variable the program itself changed after the export is left as the program set it.
    """

    def __init__(self) -> None:
        self._saved: Dict[str, Optional[str]] = {}
        self._set: Dict[str, str] = {}
        self._path_added = False

    def apply(self, values: Dict[str, str]) -> None:
        for key, value in values.items():
            self._saved[key] = os.environ.get(key)
            self._set[key] = value
            os.environ[key] = value
        entries = _split_path(os.environ.get("PYTHONPATH"))
        if BOOTSTRAP_DIR not in entries:
            os.environ["PYTHONPATH"] = os.pathsep.join([BOOTSTRAP_DIR] + entries)
            self._path_added = True

    def restore(self) -> None:
        for key, value in self._set.items():
            if os.environ.get(key) != value:
                continue  # changed by the program since: its value, not ours
            old = self._saved[key]
            if old is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = old
        if self._path_added:
            entries = _split_path(os.environ.get("PYTHONPATH"))
            if BOOTSTRAP_DIR in entries:
                entries.remove(BOOTSTRAP_DIR)
            if entries:
                os.environ["PYTHONPATH"] = os.pathsep.join(entries)
            else:
                os.environ.pop("PYTHONPATH", None)
        self._saved.clear()
        self._set.clear()
        self._path_added = False


# -- fork ---------------------------------------------------------------------------------

_fork_handler_registered = False


def _after_fork_in_child() -> None:
    # A thread of the parent may have held the events lock while the main thread forked (a
    # DataLoader fork worker, a hogwild process); the child would wait on it forever.
    events._lock = threading.Lock()


def _register_fork_handler() -> None:
    # os.register_at_fork cannot be undone; the handler is harmless when the shim is off.
    global _fork_handler_registered
    if not _fork_handler_registered and hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
        _fork_handler_registered = True


class ProcessesPatch(Patch):
    name = "processes"

    def applies(self, target) -> bool:
        return target.redirects

    def _install(self, target, config) -> None:
        export = _EnvironmentExport()
        export.apply(child_environment(config))
        self.on_undo(export.restore)
        if os.environ.get(WRAP_ORDINALS_ENV) == "1":
            devicemap.set_wrap_ordinals(True)
        _register_fork_handler()
        self._install_spawn_launcher()

    # -- torch.multiprocessing.spawn / start_processes -------------------------------------
    def _install_spawn_launcher(self) -> None:
        import torch.multiprocessing  # noqa: F401 - makes the spawn submodule importable

        spawn_mod = sys.modules["torch.multiprocessing.spawn"]

        def start_processes(wrapped, instance, args, kwargs):
            # One process per "GPU": each child calls torch.cuda.set_device(rank), so ordinal N
            # must find adapter N % count. Spawned children learn it from the environment,
            # forked ones inherit the flag.
            saved_env = os.environ.get(WRAP_ORDINALS_ENV)
            saved_flag = devicemap._wrap_ordinals
            os.environ[WRAP_ORDINALS_ENV] = "1"
            devicemap.set_wrap_ordinals(True)
            events.note("processes.spawn_launch")
            try:
                return wrapped(*args, **kwargs)
            finally:
                devicemap.set_wrap_ordinals(saved_flag)
                if saved_env is None:
                    os.environ.pop(WRAP_ORDINALS_ENV, None)
                else:
                    os.environ[WRAP_ORDINALS_ENV] = saved_env

        self.wrap(spawn_mod, "start_processes", start_processes)
        if getattr(torch.multiprocessing, "start_processes", None) is not None:
            self.wrap(torch.multiprocessing, "start_processes", start_processes)
