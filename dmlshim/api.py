"""install() / uninstall(): the public switch, idempotent, exact to undo."""

from __future__ import annotations

import importlib
import logging
import sys
import threading
from dataclasses import dataclass
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
    "dmlshim.patches.oom",
    "dmlshim.patches.data",
    "dmlshim.patches.optim",
    "dmlshim.patches.optim_flags",
    "dmlshim.patches.amp",
    "dmlshim.patches.serialization",
    "dmlshim.patches.storage",
    "dmlshim.patches.compile",
    "dmlshim.patches.float64",
    "dmlshim.patches.bf16",
    "dmlshim.patches.layout",
    "dmlshim.patches.decompose",
    "dmlshim.patches.vision_ops",
    "dmlshim.patches.guards",
    "dmlshim.patches.inference",
    "dmlshim.patches.distributed",
    "dmlshim.patches.processes",
    "dmlshim.patches.check",
    "dmlshim.patches.diagnostics",
)

#: What uninstall() cannot undo: (owner, attribute, why). Everything else install() changes on
#: torch comes back as the very same object (tests/test_uninstall.py compares every attribute).
#: Submodules that install() imports stay imported (a new module attribute of their parent).
PERMANENT = (
    ("torch", "privateuseone", "emulated-dml: the PrivateUse1 backend's device module; torch "
     "cannot unregister a backend once registered"),
)

@dataclass
class Shim:
    """One installation: built by install(), dropped by uninstall().

    ``patches`` is None for an inert target (real CUDA found by ``auto``: nothing installed).
    """

    target: Target
    config: _config.Config
    patches: Optional[PatchSet] = None
    # torch.Generator as it was before install() routed it for the emulator (None: not routed)
    generator_before: Optional[type] = None

    @property
    def capabilities(self) -> Any:
        from dmlshim import capabilities

        return capabilities.of(self.target, self.config)


_lock = threading.RLock()
_shim: Optional[Shim] = None


def __getattr__(name: str) -> Any:
    # `api._patches` (read by tests and tools): the installed PatchSet, or None
    if name == "_patches":
        return _shim.patches if _shim is not None else None
    raise AttributeError(name)


def session() -> Optional[Shim]:
    """The installation in force (None when not installed)."""
    return _shim


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
    global _shim
    from dmlshim import config as cfgmod

    with _lock:
        cfg = _config if _config is not None else cfgmod.load(options, source="install()")
        if _shim is not None and _shim.patches is not None and _same_options(_shim.config, cfg):
            return _shim.target
        if _shim is not None and _shim.patches is not None:
            uninstall()
        _setup_logging(cfg.log)
        from dmlshim import devicemap, events, target

        tgt = target.resolve(cfg.device)
        cfgmod.set_current(cfg)
        events.configure(trace=cfg.log in ("info", "debug") or bool(cfg.report))
        if tgt.inert:
            _shim = Shim(tgt, cfg)
            log.info("%s", tgt.reason)
            return tgt
        generator_before = None
        if tgt.kind == "emulated-dml":
            import torch

            from dmlshim import dtensor_import, emulator
            from dmlshim.emulator import _compat

            before = torch.Generator
            emulator.register(tgt.count, cfg.emulator_switches())  # routes torch.Generator
            if torch.Generator is not before:
                generator_before = before
            _compat.fix_parameter_instancecheck()
            dtensor_import.install()  # the weights_only allow-list stays torch's
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
        _shim = Shim(tgt, cfg, patches, generator_before)
        log.info("target %s (%s); patches: %s", tgt.kind, tgt.reason, ", ".join(names))
        return tgt


def uninstall() -> None:
    """Remove every patch; every patched attribute is the original object again."""
    global _shim
    from dmlshim import config as cfgmod
    from dmlshim import devicemap

    with _lock:
        if _shim is not None and _shim.patches is not None:
            _shim.patches.uninstall()
        if _shim is not None and _shim.generator_before is not None:
            import torch

            torch.Generator = _shim.generator_before  # type: ignore[misc]
        _shim = None
        from dmlshim import dtensor_import

        dtensor_import.uninstall()
        devicemap.deactivate()
        cfgmod.set_current(None)


def is_installed() -> bool:
    return _shim is not None and _shim.patches is not None


def current_target() -> Optional[Target]:
    return _shim.target if _shim is not None else None


def installed_patches() -> List[str]:
    if _shim is None or _shim.patches is None:
        return []
    return [p.name for p in _shim.patches.patches if p.installed]


__all__ = ["PERMANENT", "Shim", "session", "install", "uninstall", "is_installed", "current_target", "get_original",
           "TargetError", "installed_patches"]
