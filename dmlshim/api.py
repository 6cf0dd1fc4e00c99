"""install() / uninstall(): the public switch, idempotent, exact to undo."""

from __future__ import annotations

import atexit
import importlib
import logging
import os
import sys
import threading
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Dict, List, Optional

from dmlshim import config as _config
from dmlshim import current
from dmlshim.patching import Patch, PatchSet
from dmlshim.patching import get_original as get_original  # re-export
from dmlshim.target import Target, TargetError

if TYPE_CHECKING:
    from dmlshim.childenv import ChildEnvironment

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
    "dmlshim.patches.clip",
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
#: torch comes back as the very same object (tests/test_uninstall.py compares every attribute),
#: and every record of the installation goes with its :class:`Shim`. Submodules that install()
#: imports stay imported (a new module attribute of their parent).
PERMANENT = (
    ("torch", "privateuseone", "emulated-dml: the PrivateUse1 backend's device module; torch "
     "cannot unregister a backend once registered"),
    ("os", "register_at_fork", "one after-fork hook per process (api._after_fork_in_child), "
     "registered when dmlshim.api is imported; os cannot unregister it, and with no session it "
     "does nothing"),
    ("atexit", "register", "one exit hook per process (api._at_exit), registered when "
     "dmlshim.api is imported; with no session it does nothing"),
    ("wrapt", "register_post_import_hook", "one post-import hook per process and module name a "
     "patch waited for (patching._run_waiting; wrapt cannot unregister one); with no session, "
     "or nothing waiting in it, it does nothing"),
)


@dataclass
class Shim:
    """One installation: built by install(), dropped by uninstall().

    It holds every record the shim keeps (:data:`dmlshim.current.session` points at it while
    it is in force), so uninstall() leaves nothing behind but :data:`PERMANENT` and the
    originals of the patched attributes. ``patches`` and ``devices`` are None for an inert
    target (real CUDA found by ``auto``: nothing installed; with a report asked for,
    ``patches`` holds the diagnostics patch alone).
    """

    target: Target
    config: _config.Config
    capabilities: Any  # dmlshim.capabilities.Capabilities: what the target can do (the one)
    events: Any  # dmlshim.events.EventLog: what the shim changed, for the log and the report
    devices: Any = None  # dmlshim.devicemap.DeviceMap: CUDA ordinals -> target devices
    rebind: Any = None  # dmlshim.rebind.registry.Registry: optimizers, schedulers, loaders
    # dmlshim.conversions.Rewriters: the dtype/memory-format rules and area policies the
    # device-argument wrappers apply (registered by the areas while they install)
    rewriters: Any = None
    # code object of a caller of a patched function -> whether it is torch's (patching's memo)
    torch_callers: Dict[Any, bool] = field(default_factory=dict)
    patches: Optional[PatchSet] = None
    # the environment children inherit (set by the processes patch while it is installed)
    child_environment: Optional[ChildEnvironment] = None
    # torch.Generator as it was before install() routed it for the emulator (None: not routed)
    generator_before: Optional[type] = None
    dtensor_guard: Any = None  # dmlshim.dtensor_import.AllowListGuard on sys.meta_path
    # peak of memory_allocated per ordinal, where the target keeps none itself (the CPU)
    memory_peaks: Dict[int, int] = field(default_factory=dict)
    # module name -> callbacks of patches waiting for its import (Patch.when_imported)
    import_waits: Dict[str, List[Any]] = field(default_factory=dict)

    def installed(self) -> List[Patch]:
        """The patches that changed something, in install order."""
        return [p for p in self.patches.patches if p.installed] if self.patches else []

    def patch(self, name: str) -> Optional[Patch]:
        """The installed patch called ``name`` (None if it is not installed)."""
        for p in self.installed():
            if p.name == name:
                return p
        return None

    def after_fork(self) -> None:
        """In a forked child: fresh records, then each installed patch's ``after_fork``."""
        self.events.after_fork()
        for patch in self.installed():
            hook = getattr(patch, "after_fork", None)
            if hook is not None:
                hook()

    def at_exit(self) -> None:
        """At interpreter exit: each installed patch's ``at_exit`` (the diagnostics summary)."""
        for patch in reversed(self.installed()):
            hook = getattr(patch, "at_exit", None)
            if hook is not None:
                hook()


_lock = threading.RLock()


def _after_fork_in_child() -> None:
    shim = current.session
    if shim is not None:
        shim.after_fork()


def _at_exit() -> None:
    shim = current.session
    if shim is not None:
        shim.at_exit()


# Once per process (see PERMANENT): a module is imported once.
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(_at_exit)


def __getattr__(name: str) -> Any:
    # `api._patches` (read by tests and tools): the installed PatchSet, or None
    if name == "_patches":
        shim = current.session
        return shim.patches if shim is not None else None
    raise AttributeError(name)


def session() -> Optional[Shim]:
    """The installation in force (None when not installed; during install() the one being
    built, so patches see it while they install)."""
    return current.session


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
    # the "dmlshim" logger is logging's (process-wide by design): each install sets its level
    logger = logging.getLogger("dmlshim")
    logger.setLevel(getattr(logging, level.upper()))
    if not any(getattr(h, "_dmlshim", False) for h in logger.handlers):
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("dmlshim: %(message)s"))
        handler._dmlshim = True  # type: ignore[attr-defined]
        logger.addHandler(handler)
        logger.propagate = False


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
    from dmlshim import config as cfgmod

    with _lock:
        cfg = _config if _config is not None else cfgmod.load(options, source="install()")
        old = current.session
        if old is not None and old.patches is not None and _same_options(old.config, cfg):
            return old.target
        if old is not None:
            uninstall()
        _setup_logging(cfg.log)
        from dmlshim import capabilities, conversions, events, target

        tgt = target.resolve(cfg.device)
        caps = capabilities.of(tgt, cfg)
        shim = Shim(tgt, cfg, caps, events.EventLog(
            trace=cfg.log in ("info", "debug") or bool(cfg.report)),
            rewriters=conversions.Rewriters())
        current.switch(shim)
        if tgt.inert:
            log.info("%s", tgt.reason)
            if cfg.report:
                _report_only(shim)
            return tgt
        try:
            _activate(shim)
            patches = _load_patches()
            names = patches.install(caps, cfg)
        except BaseException:
            _deactivate(shim)
            current.switch(None)
            raise
        shim.patches = patches
        log.info("target %s (%s); patches: %s", tgt.kind, tgt.reason, ", ".join(names))
        return tgt


def _report_only(shim: Shim) -> None:
    """An inert target (real CUDA) with a report asked for: the diagnostics patch alone, so the
    report says what happened (target cuda, inert, why) and how the script ended; nothing the
    script calls is redirected."""
    from dmlshim.patches.diagnostics import DiagnosticsPatch

    patches = PatchSet([DiagnosticsPatch()])
    patches.install(shim.capabilities, shim.config)
    shim.patches = patches


def _activate(shim: Shim) -> None:
    """The session's state outside the patches: the device, its map, the rebind registry."""
    from dmlshim import devicemap
    from dmlshim.rebind.registry import Registry

    if shim.capabilities.emulated:
        import torch

        from dmlshim import dtensor_import

        before = torch.Generator
        shim.capabilities.register_device()  # routes Generator
        if torch.Generator is not before:
            shim.generator_before = before
        shim.dtensor_guard = dtensor_import.install()  # the weights_only allow-list stays torch's
    elif shim.capabilities.needs_torch_directml:
        from dmlshim import target

        target.import_torch_directml()
    shim.devices = devicemap.DeviceMap(shim.capabilities)
    shim.rebind = Registry()


def _deactivate(shim: Shim) -> None:
    if shim.generator_before is not None:
        import torch

        torch.Generator = shim.generator_before  # type: ignore[misc]
        shim.generator_before = None
    if shim.dtensor_guard is not None:
        shim.dtensor_guard.remove()
        shim.dtensor_guard = None


def uninstall() -> None:
    """Remove every patch; every patched attribute is the original object again, and the
    installation's records (events, device map, rebind registry) are dropped."""
    with _lock:
        shim = current.session
        if shim is None:
            return
        try:
            if shim.patches is not None:
                shim.patches.uninstall()  # undo steps still see the session
        finally:
            current.switch(None)
            _deactivate(shim)


def is_installed() -> bool:
    shim = current.session
    # an inert target installs nothing (its report, if asked for, is not the shim)
    return shim is not None and shim.patches is not None and not shim.target.inert


def current_target() -> Optional[Target]:
    shim = current.session
    return shim.target if shim is not None else None


def installed_patches() -> List[str]:
    shim = current.session
    return [p.name for p in shim.installed()] if shim is not None else []


__all__ = ["PERMANENT", "Shim", "session", "install", "uninstall", "is_installed",
           "current_target", "get_original", "TargetError", "installed_patches"]
