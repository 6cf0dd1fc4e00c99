"""Gradient sanity at each optimizer's first step: parameters it holds that got no gradient.

A parameter an optimizer steps, that requires grad, whose ``.grad`` is None (or all zeros) at
the optimizer's first ``step()`` will not train: a ``.detach()`` by mistake, a branch the loss
never uses, or a DirectML op that returned zero gradients (microsoft/DirectML#404, #739).
Frozen parameters (``requires_grad=False``) and parameters no optimizer holds are not looked at.

Names come from the modules that own the parameters, found where the script holds them: the
local and global variables of the frames that called ``optimizer.step()`` (``model.head``),
else every live ``nn.Module`` (named by class, ``Net.head``). Where all the parameters below a
module are affected, the module is named instead of each parameter.
"""

from __future__ import annotations

import gc
import warnings
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import torch

from dmlshim import events
from dmlshim.check.results import GradientVerdict


def inspect_optimizer(optimizer: Any, frame: Optional[Any]) -> Optional[GradientVerdict]:
    """The verdict for ``optimizer`` now (None when every parameter it steps has a gradient)."""
    held: Dict[int, torch.Tensor] = {}
    none: Set[int] = set()
    zero: Set[int] = set()
    for group in optimizer.param_groups:
        for p in group.get("params", ()):
            if not isinstance(p, torch.Tensor) or not p.requires_grad or id(p) in held:
                continue
            held[id(p)] = p
            g = p.grad
            if g is None:
                none.add(id(p))
            elif g.layout is torch.strided and g.numel() and not bool(g.detach().ne(0).any()):
                zero.add(id(p))
    if not none and not zero:
        return None
    roots = _frame_roots(frame)
    covered = {id(p) for _, m in roots for p in m.parameters()}
    if not (none | zero) <= covered:
        roots += _live_roots({id(m) for _, m in roots})
    verdict = GradientVerdict(type(optimizer).__name__)
    verdict.none, verdict.none_count = _units(none, held, roots), len(none)
    verdict.zero, verdict.zero_count = _units(zero, held, roots), len(zero)
    return verdict


def _frame_roots(frame: Optional[Any]) -> List[Tuple[str, torch.nn.Module]]:
    """(variable name, module) for the modules the script's frames hold, innermost frame first,
    without those inside another one found."""
    found: List[Tuple[str, torch.nn.Module]] = []
    seen: Set[int] = set()
    while frame is not None:
        if events.is_user_file(frame.f_code.co_filename):
            scopes = [frame.f_locals]
            if frame.f_back is None or frame.f_globals is not frame.f_back.f_globals:
                scopes.append(frame.f_globals)
            for scope in scopes:
                for name, value in list(scope.items()):
                    if isinstance(value, torch.nn.Module) and id(value) not in seen:
                        seen.add(id(value))
                        found.append((name, value))
        frame = frame.f_back
    below = {id(c) for _, m in found for _, c in m.named_modules() if c is not m}
    return [(n, m) for n, m in found if id(m) not in below]


def _live_roots(known: Set[int]) -> List[Tuple[str, torch.nn.Module]]:
    """Every other live top-level module, named by its class (the model may live elsewhere)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on lazy/deprecated module objects warns
        modules = [o for o in gc.get_objects() if isinstance(o, torch.nn.Module)]
    below: Set[int] = set()
    for m in modules:
        below.update(id(c) for _, c in m.named_modules() if c is not m)
    return [(type(m).__name__, m) for m in modules if id(m) not in below and id(m) not in known]


def _units(ids: Set[int], held: Dict[int, torch.Tensor],
           roots: Iterable[Tuple[str, torch.nn.Module]]) -> List[str]:
    """The fewest names covering ``ids``: a module when every optimizer-held parameter below it
    is in ``ids`` (the outermost such module), else the parameter itself."""
    if not ids:
        return []
    names: Dict[int, str] = {}
    modules: List[str] = []
    for root_name, root in roots:
        for path, module in root.named_modules(prefix=root_name):
            mine = [id(p) for p in module.parameters() if id(p) in held]
            if mine and all(i in ids for i in mine):
                modules.append(path)
        for pname, p in root.named_parameters(prefix=root_name):
            if id(p) in ids:
                names.setdefault(id(p), pname)
    outermost = [m for m in modules if not any(m.startswith(o + ".") for o in modules)]
    out = list(dict.fromkeys(outermost))
    for pname in names.values():
        if not any(pname.startswith(m + ".") for m in out):
            out.append(pname)
    missing = len(ids - set(names))
    if missing:
        out.append(f"{missing} parameter(s) that no module holds (an optimizer left on old "
                   "parameters?)")
    return out
