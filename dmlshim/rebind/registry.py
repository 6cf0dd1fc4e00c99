"""What the rebind machinery tracks. Everything is held weakly: tracking never keeps a model,
an optimizer or a dead Parameter alive.

Tensors compare element-wise, so nothing here is keyed by ``==``: tensors, optimizers and
loaders go into :class:`torch.utils.weak.WeakIdKeyDictionary` (keyed by identity).
"""

from __future__ import annotations

import gc
import itertools
import weakref
from dataclasses import dataclass, field
from typing import Any, Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch.utils.weak import WeakIdKeyDictionary

from dmlshim import current as current_session
from dmlshim import events

Optimizer = torch.optim.Optimizer
# ReduceLROnPlateau did not always subclass LRScheduler (and never calls its __init__).
SCHEDULER_TYPES: Tuple[type, ...] = (torch.optim.lr_scheduler.LRScheduler,
                                     torch.optim.lr_scheduler.ReduceLROnPlateau)


@dataclass
class OptimizerInfo:
    seq: int  # creation order: the newest optimizer over some parameters wins
    ctor_groups: List[Dict[str, Any]]  # hyperparameters as the constructor left them
    # "file:line<file:line..." of the user frames that built it, innermost first ("" if found by
    # the gc scan); see boundaries.user_site
    site: str = ""
    reported_stale: bool = False  # the `off` policy reports a stale optimizer once


@dataclass
class Slot:
    """Where a replaced Parameter lived: its successor is whatever that slot holds now."""

    module: weakref.ReferenceType[torch.nn.Module]
    name: str

    def current(self) -> Optional[torch.Tensor]:
        module = self.module()
        if module is None:
            return None
        return module._parameters.get(self.name)


def hyperparameters(optimizer: Optimizer) -> List[Dict[str, Any]]:
    """A shallow copy of each param group without its ``params``."""
    return [{k: v for k, v in group.items() if k != "params"} for group in optimizer.param_groups]


@dataclass
class Registry:
    optimizers: WeakIdKeyDictionary = field(default_factory=WeakIdKeyDictionary)
    schedulers: WeakIdKeyDictionary = field(default_factory=WeakIdKeyDictionary)
    # old Parameter -> Slot; an entry disappears with the old Parameter itself
    replaced: WeakIdKeyDictionary = field(default_factory=WeakIdKeyDictionary)
    # DataLoader -> weakref to its latest iterator (see boundaries.pass_in_progress)
    loaders: WeakIdKeyDictionary = field(default_factory=WeakIdKeyDictionary)
    # replacements recorded since the last audit: the audit is free while this is 0
    replaced_since_audit: int = 0
    # (file, line, warning class) of the user call sites warned about (once per site)
    warned_sites: Set[Tuple[str, int, str]] = field(default_factory=set)
    _seq: Iterator[int] = field(default_factory=itertools.count)

    # -- optimizers ------------------------------------------------------------------------
    def track_optimizer(self, optimizer: Optimizer, site: str = "") -> OptimizerInfo:
        info = self.optimizers.get(optimizer)
        if info is None:
            info = OptimizerInfo(next(self._seq), hyperparameters(optimizer), site)
            self.optimizers[optimizer] = info
        return info

    def info(self, optimizer: Optimizer) -> Optional[OptimizerInfo]:
        return self.optimizers.get(optimizer)

    def live_optimizers(self) -> List[Optimizer]:
        """Tracked optimizers, oldest first."""
        items = [(info.seq, opt) for opt, info in list(self.optimizers.items())]
        items.sort(key=lambda pair: pair[0])
        return [opt for _, opt in items]

    # -- schedulers ------------------------------------------------------------------------
    def track_scheduler(self, scheduler: Any) -> None:
        self.schedulers[scheduler] = True

    def live_schedulers(self) -> List[Any]:
        return [s for s, _ in list(self.schedulers.items())]

    # -- replaced parameters ---------------------------------------------------------------
    def record_replaced(self, old: torch.Tensor, module: torch.nn.Module, name: str) -> None:
        self.replaced[old] = Slot(weakref.ref(module), name)
        self.replaced_since_audit += 1

    def successor(self, old: torch.Tensor) -> Optional[torch.Tensor]:
        """The Parameter now standing where ``old`` stood, if a conversion replaced ``old``."""
        slot = self.replaced.get(old)
        if slot is None:
            return None
        new = slot.current()
        return None if new is None or new is old else new

    # -- discovery -------------------------------------------------------------------------
    def discover_existing(self) -> Tuple[int, int]:
        """Track optimizers and schedulers created before dmlshim was installed (one gc scan)."""
        n_opt = n_sched = 0
        if not _any_optimizer_created():
            return 0, 0  # `import dmlshim` / the runner: nothing to find, skip the ~50 ms scan
        for obj in gc.get_objects():
            # type(), not isinstance(): isinstance reads __class__, which some objects compute
            # (and warn about, e.g. torch.distributed.reduce_op)
            kind = type(obj)
            is_opt = issubclass(kind, Optimizer)
            is_sched = not is_opt and issubclass(kind, SCHEDULER_TYPES)
            if is_opt:
                if obj not in self.optimizers:
                    self.track_optimizer(obj)
                    n_opt += 1
            elif is_sched:
                if obj not in self.schedulers:
                    self.track_scheduler(obj)
                    n_sched += 1
        if n_opt or n_sched:
            events.note("optimizer.found_at_install", n_opt)
        return n_opt, n_sched



def _any_optimizer_created() -> bool:
    """Whether any Optimizer was ever built in this process, without a gc scan.

    ``Optimizer.__init__`` hooks its class's ``step`` once, marking it ``hooked``; a class
    whose step carries the mark has had an instance (a mark inherited from a parent only
    errs towards scanning).
    """
    stack = [Optimizer]
    while stack:
        cls = stack.pop()
        if getattr(getattr(cls, "step", None), "hooked", False):
            return True
        stack.extend(cls.__subclasses__())
    return False


def current() -> Registry:
    """The installation's registry (``api.Shim.rebind``); an empty throwaway one when nothing
    is installed, so nothing outlives uninstall()."""
    shim = current_session.session
    found = shim.rebind if shim is not None else None
    return found if found is not None else Registry()
