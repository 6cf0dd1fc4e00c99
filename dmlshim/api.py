"""install() / uninstall(): the public switch, idempotent, exact to undo."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from typing import Any, List, Optional

from dmlshim import config as _config
from dmlshim.patching import Patch, PatchSet
from dmlshim.patching import get_original as get_original  # re-export
from dmlshim.target import Target, TargetError

log = logging.getLogger("dmlshim")

# One module per area, installed in this order, removed in reverse. Each module defines exactly
# one Patch subclass; a module that cannot be imported is an error (a rename must not make an
# area vanish silently).
PATCH_MODULES = (
    "dmlshim.patches.devices",
    "dmlshim.patches.cuda_api",
    "dmlshim.patches.data",
    "dmlshim.patches.optim",
    "dmlshim.patches.optim_flags",
    "dmlshim.patches.amp",
    "dmlshim.patches.serialization",
    "dmlshim.patches.compile",
    "dmlshim.patches.float64",
    "dmlshim.patches.bf16",
    "dmlshim.patches.layout",
    "dmlshim.patches.decompose",
    "dmlshim.patches.guards",
    "dmlshim.patches.distributed",
    "dmlshim.patches.processes",
    "dmlshim.patches.diagnostics",
)

#: What uninstall() cannot undo: (owner, attribute, why). Everything else install() changes on
#: torch comes back as the very same object (tests/test_uninstall.py compares every attribute).
#: Submodules that install() imports stay imported (a new module attribute of their parent).
PERMANENT = (
    ("torch", "privateuseone", "emulated-dml: the PrivateUse1 backend's device module; torch "
     "cannot unregister a backend once registered"),
    ("torch", "Generator", "emulated-dml: the emulator's generator routing, registered with the "
     "PrivateUse1 backend (torch-directml refuses device generators)"),
)

_lock = threading.RLock()
_patches: Optional[PatchSet] = None
_target: Optional[Target] = None
_config_in_force: Optional[_config.Config] = None


def patch_classes() -> List[type]:
    """The Patch subclass of each module of :data:`PATCH_MODULES`, in order."""
    classes: List[type] = []
    for modname in PATCH_MODULES:
        mod = importlib.import_module(modname)
        found = [value for value in vars(mod).values()
                 if isinstance(value, type) and issubclass(value, Patch) and value is not Patch
                 and value.__module__ == modname]
        if len(found) != 1:
            raise ImportError(f"dmlshim: {modname} must define exactly one Patch subclass, "
                              f"found {[c.__name__ for c in found]}")
        classes.append(found[0])
    return classes


def _load_patches() -> PatchSet:
    return PatchSet([cls() for cls in patch_classes()])


def _setup_logging(level: str) -> None:
    log.setLevel(getattr(logging, level.upper()))
    if not any(getattr(h, "_dmlshim", False) for h in log.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("dmlshim: %(message)s"))
        handler._dmlshim = True  # type: ignore[attr-defined]
        log.addHandler(handler)
        log.propagate = False


def _same_options(a: _config.Config, b: _config.Config) -> bool:
    # `disable` only decides whether `import dmlshim` installs; an explicit install() ignores
    # it (and the processes patch exports disable=0 for children, changing the environment).
    return {k: v for k, v in a.values.items() if k != "disable"} == \
        {k: v for k, v in b.values.items() if k != "disable"}


def install(_config: Optional[_config.Config] = None, **options: Any) -> Target:
    """Install every patch for the target chosen by the options; returns the Target.

    Options are the names of :data:`dmlshim.config.OPTIONS` (``device="cpu"``,
    ``optimizer="rebind"``, ...); they override the environment. Calling install again with
    the same options does nothing; with other options it reinstalls.
    """
    global _patches, _target, _config_in_force
    from dmlshim import config as cfgmod

    with _lock:
        cfg = _config if _config is not None else cfgmod.load(options, source="install()")
        if _patches is not None and _config_in_force is not None \
                and _same_options(_config_in_force, cfg):
            return _target  # type: ignore[return-value]
        if _patches is not None:
            uninstall()
        _setup_logging(cfg.log)
        from dmlshim import devicemap, events, target

        tgt = target.resolve(cfg.device)
        cfgmod.set_current(cfg)
        events.configure(trace=cfg.log in ("info", "debug") or bool(cfg.report))
        if tgt.inert:
            _target, _config_in_force = tgt, cfg
            log.info("%s", tgt.reason)
            return tgt
        if tgt.kind == "emulated-dml":
            from dmlshim import emulator
            from dmlshim.emulator import _compat

            emulator.register(tgt.count, cfg.emulator_switches())
            _compat.fix_parameter_instancecheck()
        elif tgt.kind == "dml":
            target.import_torch_directml()
        devicemap.activate(tgt)
        patches = _load_patches()
        try:
            names = patches.install(tgt, cfg)
        except BaseException:
            devicemap.deactivate()
            cfgmod.set_current(None)
            raise
        _patches, _target, _config_in_force = patches, tgt, cfg
        log.info("target %s (%s); patches: %s", tgt.kind, tgt.reason, ", ".join(names))
        return tgt


def uninstall() -> None:
    """Remove every patch; every patched attribute is the original object again."""
    global _patches, _target, _config_in_force
    from dmlshim import config as cfgmod
    from dmlshim import devicemap

    with _lock:
        if _patches is not None:
            _patches.uninstall()
        _patches = None
        _target = _config_in_force = None
        devicemap.deactivate()
        cfgmod.set_current(None)


def is_installed() -> bool:
    return _patches is not None


def current_target() -> Optional[Target]:
    return _target


def installed_patches() -> List[str]:
    return [p.name for p in _patches.patches if p.installed] if _patches else []


__all__ = ["PERMANENT", "install", "uninstall", "is_installed", "current_target", "get_original",
           "TargetError", "installed_patches"]
