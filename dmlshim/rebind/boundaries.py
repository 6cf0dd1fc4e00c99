"""Epoch boundaries, seen from hooks that fire once per pass (never once per step or op).

Hooks: a DataLoader pass starting (``iter(loader)``), an LR scheduler stepping, and
``model.train()`` after ``model.eval()``. Every hook runs the *audit* (free unless a conversion
replaced Parameters since the last one): an optimizer still holding replaced Parameters is
rebound (``rebind``/``reset``) or reported once (``off``).

``reset`` also clears optimizer state, but only at *epoch-like* boundaries: events that happen
while no DataLoader pass is half-way through. A validation loader run in the middle of an epoch,
or a per-batch scheduler step (OneCycleLR, or any scheduler stepped inside the batch loop), is
not the end of an epoch and must not wipe the momentum.
"""

from __future__ import annotations

import logging
import sys
import warnings
import weakref
from typing import Any, Tuple

import torch

from dmlshim import events
from dmlshim.config import OptimizerPolicy
from dmlshim.rebind import registry, remap

log = logging.getLogger("dmlshim")

# Schedulers that are stepped once per batch by design: their steps never end an epoch.
PER_BATCH_SCHEDULERS: Tuple[type, ...] = (torch.optim.lr_scheduler.OneCycleLR,
                                          torch.optim.lr_scheduler.CyclicLR)


class StaleOptimizerWarning(UserWarning):
    """An optimizer is stepping Parameters that a conversion replaced (the stall)."""


def warn_at_user_site(message: str, category: type = UserWarning) -> None:
    """``warnings.warn_explicit`` at the first frame outside torch/dmlshim, once per site."""
    site = events.last_user_frame_info()
    file, line = site if site is not None else ("<unknown>", 0)
    key = (file, line, category.__name__)
    warned = registry.current().warned_sites
    if key in warned:
        return
    warned.add(key)
    warnings.warn_explicit(message, category, file, line)


def user_site() -> str:
    """Where user code is building something: every user frame on the stack, innermost first
    (``file:line<file:line<...``), so a helper called from two places makes two sites.
    Runs when an optimizer is built, never per step."""
    frame = sys._getframe(1)
    skip = events._SKIP_PREFIXES
    sites = []
    while frame is not None:
        fname = frame.f_code.co_filename
        if not fname.startswith(skip) and not fname.startswith("<frozen"):
            sites.append(f"{fname}:{frame.f_lineno}")
        frame = frame.f_back  # type: ignore[assignment]
    return "<".join(sites)


def innermost(site: str) -> str:
    """``file:line`` of the user code itself, from a :func:`user_site` string."""
    return site.split("<", 1)[0]


# -- DataLoader passes ------------------------------------------------------------------------

def _in_progress(it: Any) -> bool:
    yielded = getattr(it, "_num_yielded", 0)
    if not yielded:
        return False
    try:
        return yielded < len(it)
    except TypeError:  # IterableDataset without __len__: started, end unknown
        return True


def pass_in_progress(exclude: Any = None) -> bool:
    """Whether some DataLoader's latest pass has started and not reached its end."""
    for loader, ref in list(registry.current().loaders.items()):
        if loader is exclude:
            continue
        it = ref()
        if it is not None and _in_progress(it):
            return True
    return False


def remember_iterator(loader: Any, iterator: Any) -> None:
    try:
        registry.current().loaders[loader] = weakref.ref(iterator)
    except TypeError:  # an iterator type without weakref support: ignore it
        pass


# -- events -----------------------------------------------------------------------------------

def on_loader_iter(loader: Any, policy: str) -> None:
    audit(policy)
    # A new pass over `loader` ends its previous one, whatever state that was left in.
    if policy is OptimizerPolicy.RESET and not pass_in_progress(exclude=loader):
        reset_state()


def on_scheduler_step(scheduler: Any, policy: str) -> None:
    audit(policy)
    if policy is OptimizerPolicy.RESET and not isinstance(scheduler, PER_BATCH_SCHEDULERS) \
            and not pass_in_progress():
        reset_state()


def on_train_after_eval(policy: str) -> None:
    audit(policy)
    if policy is OptimizerPolicy.RESET and not pass_in_progress():
        reset_state()


# -- what happens there -----------------------------------------------------------------------

def audit(policy: str) -> int:
    """Rebind (rebind/reset) or report (off) optimizers holding replaced Parameters."""
    reg = registry.current()
    if reg.replaced_since_audit == 0:
        return 0
    reg.replaced_since_audit = 0
    found = 0
    for opt in reg.live_optimizers():
        mapping = remap.mapping_from_registry(opt)
        if not mapping:
            continue
        found += len(mapping)
        if policy is OptimizerPolicy.OFF:
            report_stale(opt, len(mapping))
        else:
            remap.rebind_all(mapping, [opt], "optimizer audit")
    return found


def report_stale(opt: torch.optim.Optimizer, n: int) -> None:
    info = registry.current().info(opt)
    if info is None or info.reported_stale:
        return
    info.reported_stale = True
    events.note("optimizer.stale", n)
    built = f" (built at {innermost(info.site)})" if info.site else ""
    warn_at_user_site(
        f"dmlshim: {type(opt).__name__}{built} is updating {n} parameter(s) the model no longer "
        f"holds: a conversion replaced them with new Parameter objects (on DirectML every "
        f"model.to()/.cuda()/.cpu() between the CPU and the adapter does, and so does "
        f"load_state_dict(assign=True)), so this optimizer steps dead copies and the loss will "
        f"not improve. DMLSHIM_OPTIMIZER=off leaves it so: unset it (the default, rebind, keeps "
        f"optimizers bound to the live parameters), or build the optimizer after the last "
        f"model.to(...) / load_state_dict(...).",
        StaleOptimizerWarning)


def reset_state() -> int:
    """The ``reset`` policy: clear every optimizer's state, keep its param groups (and LR)."""
    n = 0
    for opt in registry.current().live_optimizers():
        if opt.state:
            opt.state.clear()
            n += 1
    if n:
        events.note("optimizer.reset", n)
        log.debug("epoch boundary: state of %d optimizer(s) cleared (DMLSHIM_OPTIMIZER=reset)", n)
    return n
