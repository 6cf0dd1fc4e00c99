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

# One module per area, installed in this order, removed in reverse. Each module defines one
# Patch subclass; a module that does not exist yet is skipped (areas land one by one).
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
    "dmlshim.patches.decompose",
    "dmlshim.patches.guards",
    "dmlshim.patches.inference",
    "dmlshim.patches.distributed",
    "dmlshim.patches.processes",
    "dmlshim.patches.check",
    "dmlshim.patches.diagnostics",
)

_lock = threading.RLock()
_patches: Optional[PatchSet] = None
_target: Optional[Target] = None
_config_in_force: Optional[_config.Config] = None
# torch.Generator as it was before install() routed it for the emulator (None: not routed by us)
_generator_before: Optional[type] = None


def _load_patches() -> PatchSet:
    found: List[Patch] = []
    for modname in PATCH_MODULES:
        try:
            mod = importlib.import_module(modname)
        except ModuleNotFoundError as err:
            if err.name == modname:
                continue
            raise
        for value in vars(mod).values():
            if isinstance(value, type) and issubclass(value, Patch) and value is not Patch \
                    and value.__module__ == modname:
                found.append(value())
    return PatchSet(found)


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
    global _patches, _target, _config_in_force, _generator_before
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
            import torch

            from dmlshim import emulator
            from dmlshim.emulator import _compat

            before = torch.Generator
            emulator.register(tgt.count, cfg.emulator_switches())  # routes torch.Generator
            if torch.Generator is not before:
                _generator_before = before
            _compat.fix_parameter_instancecheck()
            from dmlshim import dtensor_import

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
        _restore_generator()
        from dmlshim import dtensor_import

        dtensor_import.uninstall()
        devicemap.deactivate()
        cfgmod.set_current(None)


def _restore_generator() -> None:
    global _generator_before
    if _generator_before is not None:
        import torch

        torch.Generator = _generator_before  # type: ignore[misc]
        _generator_before = None


def is_installed() -> bool:
    return _patches is not None


def current_target() -> Optional[Target]:
    return _target


def installed_patches() -> List[str]:
    return [p.name for p in _patches.patches if p.installed] if _patches else []


__all__ = ["install", "uninstall", "is_installed", "current_target", "get_original",
           "TargetError", "installed_patches"]
