"""Scripts that already carry the DirectML workaround: a new optimizer every epoch.

The widely shared advice is to build the optimizer inside the epoch loop. On DirectML without
dmlshim that avoids the stall, but every re-creation throws away momentum buffers / Adam moments,
and an LR scheduler built on the first optimizer keeps adjusting an optimizer nobody steps.

Under ``rebind`` a new optimizer that re-creates a live one the way the workaround does
*continues* it, so the run trains like the same script with the optimizer built once. Anything
else is a deliberate new optimizer (a fine-tuning stage, a restart) and starts fresh, as on CUDA:

* it must have the same class, parameters (same groups, same order) and constructor arguments
  (``lr`` aside: a new ``lr`` each epoch is a hand-made schedule);
* it must be built at the same call site (the same chain of user frames, so a helper called
  from two places is two sites) as the live one, or the live one must never have stepped (the
  optimizer built before the loop and replaced by the loop's first re-creation, its scheduler
  with it); an optimizer that has trained, replaced from another line, is left alone;
* it shares the predecessor's per-parameter state (the same dicts: nothing is copied);
* per group, each hyperparameter the script passed unchanged (same value as the predecessor's
  constructor got) takes the predecessor's current value -- the value a scheduler set -- and
  keys a scheduler added (``initial_lr``, ``max_lr``, ...) are carried over; a value the script
  changed on purpose (a hand-made LR schedule) is kept;
* LR schedulers driving the predecessor follow the new optimizer when its learning rates were
  carried over.

One warning per call site says the workaround is unnecessary and what it costs without dmlshim.
"""

from __future__ import annotations

import functools
import logging
import weakref
from typing import Any, Optional

import torch

from dmlshim import events
from dmlshim.rebind import registry
from dmlshim.rebind.registry import OptimizerInfo

log = logging.getLogger("dmlshim")

_MISSING = object()


class RecreatedOptimizerWarning(UserWarning):
    """An optimizer was re-created over the parameters of a live one (the DirectML workaround)."""


def _same_value(a: Any, b: Any) -> bool:
    if a is b:
        return True
    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            return False
        try:
            return a.shape == b.shape and bool(torch.equal(a.detach().cpu(), b.detach().cpu()))
        except Exception:
            return False
    try:
        return bool(a == b)
    except Exception:
        return False


def _same_params(a: torch.optim.Optimizer, b: torch.optim.Optimizer) -> bool:
    ga, gb = a.param_groups, b.param_groups
    if len(ga) != len(gb):
        return False
    for x, y in zip(ga, gb):
        px, py = x["params"], y["params"]
        if len(px) != len(py) or any(p is not q for p, q in zip(px, py)):
            return False
    return True


def _same_settings(a: OptimizerInfo, b: OptimizerInfo) -> bool:
    """Same constructor hyperparameters, the learning rate aside (re-creating an optimizer with
    a new ``lr`` each epoch is a hand-made schedule; anything else makes it another optimizer)."""
    if len(a.ctor_groups) != len(b.ctor_groups):
        return False
    for ga, gb in zip(a.ctor_groups, b.ctor_groups):
        if set(ga) != set(gb):
            return False
        if any(k != "lr" and not _same_value(ga[k], gb[k]) for k in ga):
            return False
    return True


def _has_stepped(opt: torch.optim.Optimizer) -> bool:
    """Whether ``opt`` has taken a step: it has per-parameter state (momentum, Adam moments,
    step counts), or an LR scheduler saw its step() (``_opt_called``, set by torch's
    scheduler) or has stepped itself."""
    if opt.state or getattr(opt, "_opt_called", False):
        return True
    # a scheduler's own constructor steps it to last_epoch 0
    return any(getattr(s, "optimizer", None) is opt and getattr(s, "last_epoch", 0) > 0
               for s in registry.current().live_schedulers())


def _continues(old: torch.optim.Optimizer, old_info: OptimizerInfo,
               new_info: OptimizerInfo) -> bool:
    """The workaround's re-creation (same call site), or the loop's first re-creation of an
    optimizer built before the loop that never stepped."""
    same_site = bool(new_info.site) and old_info.site == new_info.site
    return same_site or not _has_stepped(old)


def predecessor(new: torch.optim.Optimizer,
                new_info: OptimizerInfo) -> Optional[torch.optim.Optimizer]:
    """The newest live optimizer that ``new`` re-creates (see the module docstring)."""
    best = None
    best_info: Optional[OptimizerInfo] = None
    for opt, info in list(registry.current().optimizers.items()):
        if opt is new or type(opt) is not type(new):
            continue
        if best_info is not None and info.seq < best_info.seq:
            continue
        if _same_params(opt, new) and _same_settings(info, new_info):
            best, best_info = opt, info
    if best is None or best_info is None or not _continues(best, best_info, new_info):
        return None
    return best


def continue_from(new: torch.optim.Optimizer, old: torch.optim.Optimizer,
                  new_info: OptimizerInfo) -> bool:
    """Make ``new`` carry on where ``old`` is. Returns whether its learning rates followed."""
    old_info = registry.current().info(old)
    old_ctor = old_info.ctor_groups if old_info is not None else []
    lr_followed = True
    for i, (g_new, g_old) in enumerate(zip(new.param_groups, old.param_groups)):
        ctor_new = new_info.ctor_groups[i] if i < len(new_info.ctor_groups) else {}
        ctor_old = old_ctor[i] if i < len(old_ctor) else {}
        for key, current in g_old.items():
            if key == "params":
                continue
            if key not in ctor_new:
                g_new.setdefault(key, current)  # added by a scheduler (initial_lr, max_lr, ...)
            elif _same_value(ctor_new[key], ctor_old.get(key, _MISSING)):
                g_new[key] = current
            elif key == "lr":
                lr_followed = False
    # Share the per-parameter state dicts: one copy of the momentum/moments, stepped by `new`.
    for group in new.param_groups:
        for p in group["params"]:
            if p in old.state:
                new.state[p] = old.state[p]
    return lr_followed


def _track_step_for_scheduler(opt: torch.optim.Optimizer, old: torch.optim.Optimizer) -> None:
    """What ``LRScheduler.__init__`` does to its optimizer: mark ``step`` so the scheduler can
    check it was called (without it, torch warns that ``optimizer.step()`` was overridden)."""
    if hasattr(opt.step, "_wrapped_by_lr_sched"):
        return
    func = getattr(opt.step, "__func__", None)
    if func is None:
        return
    opt_ref = weakref.ref(opt)

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        o = opt_ref()
        o._opt_called = True  # type: ignore[union-attr]
        return func.__get__(o, o.__class__)(*args, **kwargs)

    wrapper._wrapped_by_lr_sched = True  # type: ignore[attr-defined]
    opt.step = wrapper  # type: ignore[method-assign]
    if getattr(old, "_opt_called", False):
        opt._opt_called = True  # type: ignore[attr-defined]


def move_schedulers(new: torch.optim.Optimizer, old: torch.optim.Optimizer) -> int:
    moved = 0
    for sched in registry.current().live_schedulers():
        if getattr(sched, "optimizer", None) is old:
            sched.optimizer = new
            if isinstance(sched, torch.optim.lr_scheduler.LRScheduler) and \
                    not isinstance(sched, torch.optim.lr_scheduler.ReduceLROnPlateau):
                _track_step_for_scheduler(new, old)
            moved += 1
    return moved


def on_new_optimizer(new: torch.optim.Optimizer, info: OptimizerInfo) -> Optional[str]:
    """Called right after an optimizer is built (``rebind`` only). Returns the warning text if
    the optimizer re-creates a live one, else None."""
    old = predecessor(new, info)
    if old is None:
        return None
    lr_followed = continue_from(new, old, info)
    moved = move_schedulers(new, old) if lr_followed else 0
    events.note("optimizer.recreated")
    name = type(new).__name__
    log.debug("%s re-created over the parameters of a live one: state carried over, "
              "%d scheduler(s) moved", name, moved)
    what = ("the momentum buffers / Adam moments and the LR schedule were carried over"
            if moved else "the momentum buffers / Adam moments were carried over")
    return (f"dmlshim: a new {name} was created over the same parameters as an existing one "
            f"(the 're-create the optimizer every epoch' DirectML workaround). With dmlshim it is "
            f"unnecessary: optimizers stay bound to the model's parameters. Without dmlshim this "
            f"pattern throws away the optimizer state at every re-creation and leaves an LR "
            f"scheduler built on the first optimizer driving an optimizer nobody steps; here "
            f"{what}, so training goes on as with one optimizer. Build the optimizer once, "
            f"before the loop (to reset its state on purpose, call optimizer.state.clear()).")

