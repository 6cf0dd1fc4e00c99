"""Optimizers and LR schedulers stay bound to the live Parameters (``DMLSHIM_OPTIMIZER``;
the stall and the policies are in docs/training-stall.md).

Mechanism: a remap, not ``torch.utils.swap_tensors``
----------------------------------------------------
``set_swap_module_params_on_conversion(True)`` keeps Parameter identity by swapping the tensors'
contents, but ``swap_tensors`` refuses any tensor that has a weakref ("Cannot swap t1 because it
has weakref associated with it": ``torch.compile``'s guards and ``torch.utils.weak`` users hold
them) and, per its documentation, tensors whose ``use_count`` a C++ holder raised (autograd
saved tensors, RNN flat weights on some backends); a failure half-way through a model leaves it
half converted. It would leave optimizer state on the old device anyway, and it is untested on
torch-directml 0.2.5's tensors. The remap works whatever made the new Parameters (DirectML,
the overwrite flag, another PrivateUse1 backend, ``assign=True``): ``Module._apply`` and
``Module.load_state_dict`` are wrapped at their *outermost* call only; before it we list the
module tree's ``(module, name) -> Parameter`` slots, after it any slot holding another object
gives the old->new map, applied to every tracked optimizer. Optimizers are tracked from
``Optimizer.__init__`` (and, once at install, by a ``gc`` scan for those built earlier).

Nothing runs per step or per op: the hooks are conversions, ``load_state_dict``, optimizer and
scheduler construction, and the epoch-boundary events (DataLoader pass start, scheduler step,
``train()`` after ``eval()``). The scheduler-step hook, which a per-batch scheduler would run
every step, is armed only while it has something to do (a conversion replaced Parameters since
the last audit, or ``reset``).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Tuple

import torch
import torch.utils.data

from dmlshim.config import OptimizerPolicy
from dmlshim.patching import Owns, Patch, Reentry, ThreadStack, get_original
from dmlshim.rebind import boundaries, registry, remap, workaround
from dmlshim.rebind.registry import SCHEDULER_TYPES


def _replace_fn(args: Tuple[Any, ...], kwargs: Dict[str, Any],
                make: Callable[[Any], Any]) -> Tuple[Tuple[Any, ...], Dict[str, Any]]:
    """``Module._apply(fn, recurse=True)`` with ``fn`` replaced by ``make(fn)``."""
    if args:
        return (make(args[0]),) + tuple(args[1:]), kwargs
    if "fn" in kwargs:
        kwargs = dict(kwargs)
        kwargs["fn"] = make(kwargs["fn"])
    return args, kwargs


def scheduler_classes_with_step() -> Tuple[type, ...]:
    """torch's scheduler classes that define their own ``step`` (and so need their own hook)."""
    import torch.optim.lr_scheduler as lrs

    found = []
    for value in vars(lrs).values():
        if isinstance(value, type) and issubclass(value, SCHEDULER_TYPES) \
                and "step" in vars(value):
            found.append(value)
    return tuple(found)


class HookedLookup:
    """A method that runs ``before(instance)`` when it is looked up on an instance and then
    hands out the original bound method.

    Used for ``scheduler.step``: torch warns from there with ``stacklevel=2`` ("Detected call of
    `lr_scheduler.step()` before `optimizer.step()`", the ``epoch`` deprecation), and a wrapper
    frame would move those warnings from the user's line onto dmlshim's. Here the call itself
    is made by the caller's frame. (Runs on lookup, so ``SequentialLR`` stepping its children
    looks up their ``step`` too: a boundary seen twice at once, which changes nothing.)
    """

    def __init__(self, func: Callable[..., Any], before: Callable[[Any], None]) -> None:
        self.__wrapped__ = func
        self._before = before
        self.__doc__ = getattr(func, "__doc__", None)
        self.__name__ = getattr(func, "__name__", "step")

    def __get__(self, instance: Any, owner: Any = None) -> Any:
        if instance is None:
            return self.__wrapped__
        self._before(instance)
        return self.__wrapped__.__get__(instance, owner)


class RebindHooks:
    """The wrappers of one :class:`OptimizerRebindPatch` installation and the state they share.

    Each ``wrapper(wrapped, instance, args, kwargs)`` method is what ``Patch.wrap`` hands wrapt
    (a bound method: one frame per call, as a function would be). The state: the policy, the
    session's optimizer and scheduler registry, the modules being converted (outermost call's),
    the re-entry markers, and the scheduler-step hooks with whether the classes hold them now.
    """

    def __init__(self, policy: OptimizerPolicy, tracked: registry.Registry) -> None:
        self.policy = policy
        self.tracked = tracked  # the session's registry: it goes with uninstall()
        self.converting = ThreadStack()  # ids of the modules being converted (outermost call's)
        self.loading, self.training, self.scheduler_init_running = Reentry(), Reentry(), Reentry()
        self.step_hooks = {cls: HookedLookup(vars(cls)["step"], self.before_scheduler_step)
                           for cls in scheduler_classes_with_step()}
        self.armed = True  # the classes hold the hooks from install until the first sync

    def after(self, slots: Any, retie: str, api: str) -> None:
        """Rebind the tracked optimizers to the Parameters that replaced ``slots``' ones."""
        off = self.policy is OptimizerPolicy.OFF
        mapping = remap.collect_replacements(slots, "never" if off else retie, api)
        if mapping and not off:
            remap.rebind_all(mapping, self.tracked.live_optimizers(), api)

    # -- conversions ------------------------------------------------------------------------
    def module_apply(self, wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                     kwargs: Dict[str, Any]) -> Any:
        # Only the outermost call of a tree: _apply recurses into the children (and
        # RNNBase._apply calls super()). A module outside the tree being converted (a custom
        # _apply converting some other model) gets its own outermost treatment.
        covered = self.converting.top
        if not isinstance(instance, torch.nn.Module) or \
                (covered is not None and id(instance) in covered):
            return wrapped(*args, **kwargs)
        slots = remap.parameter_slots(instance)
        if self.policy is not OptimizerPolicy.OFF:
            tied = remap.tied_tensors(slots)
            if tied:
                args, kwargs = _replace_fn(args, kwargs,
                                           lambda fn: remap.memoize_for(tied, fn))
        try:
            with self.converting.pushed({id(m) for m in instance.modules()} | (covered or set())):
                return wrapped(*args, **kwargs)
        finally:
            self.after(slots, "always", "optimizer rebind after Module.to/cuda/cpu")
            self.sync_scheduler_hooks()

    def module_load_state_dict(self, wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                               kwargs: Dict[str, Any]) -> Any:
        if self.loading.active or not isinstance(instance, torch.nn.Module):
            return wrapped(*args, **kwargs)
        slots = remap.parameter_slots(instance)
        try:
            with self.loading:
                return wrapped(*args, **kwargs)
        finally:
            self.after(slots, "if_aliased", "optimizer rebind after Module.load_state_dict")
            self.sync_scheduler_hooks()

    # -- optimizers ---------------------------------------------------------------------------
    def optimizer_init(self, wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                       kwargs: Dict[str, Any]) -> Any:
        result = wrapped(*args, **kwargs)
        info = self.tracked.track_optimizer(instance, boundaries.user_site())
        if self.policy is not OptimizerPolicy.OFF:
            # built over a list of parameters taken before a conversion replaced them
            mapping = remap.mapping_from_registry(instance)
            if mapping:
                remap.rebind_all(mapping, [instance], "optimizer built over replaced parameters")
        if self.policy is OptimizerPolicy.REBIND:
            message = workaround.on_new_optimizer(instance, info)
            if message:
                boundaries.warn_at_user_site(message, workaround.RecreatedOptimizerWarning)
        return result

    # -- LR schedulers ------------------------------------------------------------------------
    def scheduler_init(self, wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                       kwargs: Dict[str, Any]) -> Any:
        with self.scheduler_init_running:
            result = wrapped(*args, **kwargs)
        self.tracked.track_scheduler(instance)
        return result

    def before_scheduler_step(self, instance: Any) -> None:
        # the first step() that __init__ makes is not a boundary
        if not self.scheduler_init_running.active:
            boundaries.on_scheduler_step(instance, self.policy)
            self.sync_scheduler_hooks()

    def sync_scheduler_hooks(self) -> None:
        # Schedulers are often stepped every batch. Under rebind/off a scheduler step only
        # runs the audit, which has nothing to do until a conversion replaced Parameters:
        # until then the classes hold torch's own `step` (no shim frame per step).
        want = self.policy is OptimizerPolicy.RESET or self.tracked.replaced_since_audit > 0
        if want is self.armed:
            return
        self.armed = want
        for cls, hook in self.step_hooks.items():
            cls.step = hook if want else hook.__wrapped__

    # -- epoch boundaries ---------------------------------------------------------------------
    def loader_iter(self, wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                    kwargs: Dict[str, Any]) -> Any:
        boundaries.on_loader_iter(instance, self.policy)
        self.sync_scheduler_hooks()
        iterator = wrapped(*args, **kwargs)
        boundaries.remember_iterator(instance, iterator)
        return iterator

    def module_train(self, wrapped: Callable[..., Any], instance: Any, args: Tuple[Any, ...],
                     kwargs: Dict[str, Any]) -> Any:
        if self.training.active or not isinstance(instance, torch.nn.Module):
            return wrapped(*args, **kwargs)
        mode = args[0] if args else kwargs.get("mode", True)
        was_eval = not instance.training
        with self.training:
            result = wrapped(*args, **kwargs)
        if mode and was_eval:
            boundaries.on_train_after_eval(self.policy)
            self.sync_scheduler_hooks()
        return result


class OptimizerRebindPatch(Patch):
    name = "optim"
    owns = (Owns("torch.nn.Module", ("_apply", "load_state_dict", "train")),
            Owns("torch.optim.Optimizer", ("__init__", "_accelerator_graph_capture_health_check",
                                           "_cuda_graph_capture_health_check")),
            Owns("torch.optim.lr_scheduler.LRScheduler", ("__init__", "step")),
            Owns("torch.optim.lr_scheduler.LRScheduler", ("__init__", "step"), subclasses=True),
            Owns("torch.optim.lr_scheduler.ReduceLROnPlateau", ("__init__", "step")),
            Owns("torch.utils.data.DataLoader", ("__iter__",)))

    def applies(self, caps) -> bool:
        # Parameters get replaced wherever a PrivateUse1 backend, the overwrite flag or
        # assign=True is involved, so every target that is not inert gets the hooks.
        return True

    def _install(self, caps, config) -> None:
        hooks = RebindHooks(OptimizerPolicy(config.optimizer), registry.current())
        self.wrap(torch.nn.Module, "_apply", hooks.module_apply)
        self.wrap(torch.nn.Module, "load_state_dict", hooks.module_load_state_dict)
        self.wrap(torch.optim.Optimizer, "__init__", hooks.optimizer_init)
        for cls in dict.fromkeys(SCHEDULER_TYPES):
            self.wrap(cls, "__init__", hooks.scheduler_init)
        for cls, hook in hooks.step_hooks.items():
            self.replace(cls, "step", hook)
        self.wrap(torch.utils.data.DataLoader, "__iter__", hooks.loader_iter)
        self.wrap(torch.nn.Module, "train", hooks.module_train)

        hooks.tracked.discover_existing()
        hooks.sync_scheduler_hooks()
        self._install_capture_check(caps)

    def _install_capture_check(self, caps) -> None:
        """torch asks ``torch.accelerator`` (>= 2.6) or ``torch.cuda`` (2.4) in every
        ``Optimizer.step`` whether a CUDA/XPU graph is being captured. On a target that
        redirects CUDA, torch's own answer is known at install: the accelerator torch sees is
        not CUDA/XPU (or there is none), and the check returns. So the check becomes a C-level
        no-op (``NoneType()``) instead of wrapper frames per step deciding the caller is torch."""
        cls = torch.optim.Optimizer
        if not caps.redirects:
            return
        if "_accelerator_graph_capture_health_check" in vars(cls):
            name = "_accelerator_graph_capture_health_check"
            current = get_original(torch.accelerator, "current_accelerator")
            try:
                accelerator = current(check_available=True)
            except TypeError:  # pragma: no cover - torch without the keyword
                accelerator = current()
            if accelerator is not None and accelerator.type in ("cuda", "xpu"):
                return  # e.g. DMLSHIM_DEVICE=cpu on a CUDA machine: torch's check stays
        elif "_cuda_graph_capture_health_check" in vars(cls):  # torch 2.4
            name = "_cuda_graph_capture_health_check"
            if get_original(torch.cuda, "is_available")():
                return
        else:  # pragma: no cover - a torch without the check
            return
        self.replace(cls, name, staticmethod(type(None)))
