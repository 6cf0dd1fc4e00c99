"""Which Parameters a conversion replaced, tying tied ones again, and pointing optimizers at the
new objects.

A *slot* is ``(module, name)``: ``module._parameters[name]``. Before a conversion we list every
slot of the module tree with its Parameter; afterwards a slot holding another object means its
Parameter was replaced. Tied weights are one Parameter in several slots; ``Module._apply``
converts each slot on its own, so without help they come out as separate copies.
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Mapping, Optional, Tuple

import torch

from dmlshim import events
from dmlshim.rebind import registry

log = logging.getLogger("dmlshim")

ParamSlot = Tuple[torch.nn.Module, str, torch.Tensor]
#: id(old Parameter) -> (old, new); the old object is held so its id cannot be reused meanwhile
Replacements = Dict[int, Tuple[torch.Tensor, torch.Tensor]]


def parameter_slots(root: torch.nn.Module) -> List[ParamSlot]:
    """Every ``(module, name, Parameter)`` of ``root``'s tree, tied Parameters once per slot."""
    slots: List[ParamSlot] = []
    for module in root.modules():
        for name, param in module._parameters.items():
            if param is not None:
                slots.append((module, name, param))
    return slots


def tied_tensors(slots: List[ParamSlot]) -> List[torch.Tensor]:
    """Parameters that sit in more than one slot, and their gradients."""
    seen: Dict[int, int] = {}
    for _, _, param in slots:
        seen[id(param)] = seen.get(id(param), 0) + 1
    out: List[torch.Tensor] = []
    done = set()
    for _, _, param in slots:
        if seen[id(param)] > 1 and id(param) not in done:
            done.add(id(param))
            out.append(param)
            if param.grad is not None:
                out.append(param.grad)
    return out


def memoize_for(tensors: List[torch.Tensor], fn: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``fn`` that converts each of ``tensors`` once and hands back that same result again.

    ``Module._apply`` calls ``fn`` once per slot; for a tied Parameter the second call would
    allocate a second copy on the device. With the memo both slots get views of one tensor,
    which :func:`collect_replacements` then ties again into one Parameter.
    """
    keep = {id(t): t for t in tensors}
    memo: Dict[int, Any] = {}

    def convert(t: Any) -> Any:
        key = id(t)
        if keep.get(key) is t:
            if key not in memo:
                memo[key] = fn(t)
            return memo[key]
        return fn(t)

    return convert


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a is b:
        return True
    try:
        ptr = a.untyped_storage().data_ptr()
        return (ptr != 0 and ptr == b.untyped_storage().data_ptr()
                and a.device == b.device and a.dtype == b.dtype and a.shape == b.shape
                and a.stride() == b.stride() and a.storage_offset() == b.storage_offset())
    except Exception:  # tensors without a plain storage (wrapper subclasses): cannot tell
        return False


def collect_replacements(slots: List[ParamSlot], retie: str = "always",
                         api: str = "Module conversion") -> Replacements:
    """Compare the slots with what they hold now; tie tied Parameters again; record the rest.

    ``retie``: ``"always"`` after ``Module._apply`` (the memo made the copies views of one
    tensor), ``"if_aliased"`` after ``load_state_dict(assign=True)`` (only when the loaded
    tensors are one tensor, as in a checkpoint of a tied model), ``"never"``.
    """
    by_old: Dict[int, List[Tuple[torch.nn.Module, str]]] = {}
    olds: Dict[int, torch.Tensor] = {}
    for module, name, old in slots:
        by_old.setdefault(id(old), []).append((module, name))
        olds[id(old)] = old
    out: Replacements = {}
    for key, places in by_old.items():
        old = olds[key]
        module0, name0 = places[0]
        new = module0._parameters.get(name0)
        if len(places) > 1 and retie != "never":
            _retie(places, new, old, retie)
            new = module0._parameters.get(name0)
        if new is None or new is old:
            continue
        out[key] = (old, new)
        registry.current().record_replaced(old, module0, name0)
    return out


def _retie(places: List[Tuple[torch.nn.Module, str]], first: Optional[torch.Tensor],
           old: torch.Tensor, retie: str) -> None:
    if first is None:
        return
    others = [(m, n, m._parameters.get(n)) for m, n in places[1:]]
    if all(p is first for _, _, p in others):
        return
    if retie == "if_aliased" and not all(p is not None and _same_memory(p, first)
                                         for _, _, p in others):
        names = ", ".join(f"{type(m).__name__}.{n}" for m, n in places)
        log.warning("load_state_dict(assign=True) gave the tied parameters (%s) different "
                    "tensors: they are separate parameters now, as torch leaves them",
                    names)
        return
    for module, name, current in others:
        if current is not first:
            # setattr, not _parameters[...]: modules such as nn.LSTM keep their own list of
            # their weights (_flat_weights) up to date in __setattr__.
            setattr(module, name, first)
    events.note("optimizer.retie")
    log.debug("tied parameters %s kept tied",
              ", ".join(f"{type(m).__name__}.{n}" for m, n in places))


# -- optimizers -------------------------------------------------------------------------------

def _host_step(group: Mapping[str, Any]) -> bool:
    """torch keeps ``state["step"]`` a CPU scalar unless the group is capturable or fused
    (the rule of ``Optimizer._process_value_according_to_param_policy``)."""
    return not (group.get("capturable", False) or group.get("fused", False))


def _follow(value: Any, key: Any, device: torch.device, host_step: bool) -> Any:
    if isinstance(value, torch.Tensor):
        if key == "step" and host_step:
            return value
        if value.device == device:
            return value
        # Device only: a conversion that kept the Parameter object (CUDA) leaves the state's
        # dtype alone too, so model.half() does not turn float32 moments into float16.
        return value.to(device=device)
    if isinstance(value, list):  # LBFGS keeps lists of tensors
        return [_follow(v, None, device, host_step) for v in value]
    if isinstance(value, tuple):
        return tuple(_follow(v, None, device, host_step) for v in value)
    return value


def move_state(per_param: Any, new: torch.Tensor, group: Mapping[str, Any]) -> None:
    """Move one parameter's state (in place) to ``new``'s device. The old tensors are dropped,
    so the state exists once, on the new device."""
    if not isinstance(per_param, dict):
        return
    host = _host_step(group)
    for k in list(per_param):
        per_param[k] = _follow(per_param[k], k, new.device, host)


def rebind_optimizer(optimizer: torch.optim.Optimizer, mapping: Replacements) -> int:
    """Point ``optimizer`` at the new Parameters; carry their state over. Returns how many.

    The ``params`` lists are changed in place: some optimizers keep a reference to them
    (LBFGS's ``_params`` is ``param_groups[0]["params"]``).
    """
    n = 0
    for group in optimizer.param_groups:
        params = group["params"]
        for i, p in enumerate(params):
            hit = mapping.get(id(p))
            if hit is not None and hit[0] is p:
                params[i] = hit[1]
                n += 1
    if n:
        _rekey_state(optimizer, mapping)
    return n


def _rekey_state(optimizer: torch.optim.Optimizer, mapping: Replacements) -> None:
    state = optimizer.state
    if not any(id(k) in mapping and mapping[id(k)][0] is k for k in state):
        return
    group_of = {id(p): g for g in optimizer.param_groups for p in g["params"]}
    items = list(state.items())
    state.clear()  # re-inserted in the same order, so state_dict() numbering does not change
    moved = 0
    for key, value in items:
        hit = mapping.get(id(key))
        if hit is not None and hit[0] is key:
            new = hit[1]
            move_state(value, new, group_of.get(id(new), {}))
            key = new
            moved += 1
        if key not in state:
            state[key] = value
    events.note("optimizer.state_moved", moved)


def rebind_all(mapping: Replacements, optimizers: List[torch.optim.Optimizer],
               api: str) -> int:
    """Rebind every optimizer in ``optimizers``; one event for the conversion's call site."""
    total = rebound = 0
    for opt in optimizers:
        n = rebind_optimizer(opt, mapping)
        if n:
            total += n
            rebound += 1
    if total:
        events.note("optimizer.rebind", total)
        events.redirected(api, f"{total} replaced parameter(s)",
                          f"{rebound} optimizer(s) rebound")
        log.debug("%s replaced %d parameter(s); %d optimizer(s) rebound", api, total, rebound)
    return total


def mapping_from_registry(optimizer: torch.optim.Optimizer) -> Replacements:
    """Replacements for the parameters ``optimizer`` holds that a recorded conversion replaced."""
    out: Replacements = {}
    reg = registry.current()
    if len(reg.replaced) == 0:
        return out
    for group in optimizer.param_groups:
        for p in group["params"]:
            new = reg.successor(p)
            if new is not None:
                out[id(p)] = (p, new)
    return out
