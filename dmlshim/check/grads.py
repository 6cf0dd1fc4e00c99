"""Gradient sanity over each optimizer's first steps: parameters it holds that never got one.

A parameter an optimizer steps, that requires grad, whose ``.grad`` is None (or all zeros) at
the end of every one of the optimizer's first :data:`WINDOW` steps did not train in them: a
``.detach()`` by mistake, a branch the loss never uses, or a DirectML op that returned zero
gradients (microsoft/DirectML#404, #739). Frozen parameters (``requires_grad=False``) and
parameters no optimizer holds are not looked at.

Judged at the *end* of each step (after the optimizer's own ``step()`` ran, so after the
backward a closure runs inside it: Lightning's ``optimizer.step(closure)``), and over several
steps, never the first alone: a zero-initialised last BatchNorm of each residual block
(torchvision's ``zero_init_residual``, timm's ResNets), LoRA's zero B matrix or ControlNet's
zero convolutions give the layers before them an all-zero gradient at the first step only.
The parameters named are exactly those the steps leave unchanged: Adam, SGD and their kin do
not move a parameter whose gradient is None, nor one whose gradient is all zero unless its
group has weight decay (then the decay moves it, and it is not named).

Cost: one pass over the parameters at the end of the first step (a parameter with a nonzero
gradient is cleared and never looked at again); later steps look only at those not yet cleared.

Names come from the modules that own the parameters, found where the script holds them: the
local and global variables of the frames that called ``optimizer.step()`` (``model.head``),
else every live ``nn.Module`` (named by class, ``Net.head``). Where all the parameters below a
module are affected, the module is named instead of each parameter.
"""

from __future__ import annotations

import gc
import warnings
import weakref
from typing import Any, Dict, Iterable, List, Optional, Set, Tuple

import torch

from dmlshim import current, events
from dmlshim.check.results import GradientVerdict
from dmlshim.rebind import registry

# Steps of each optimizer over which a parameter must get a nonzero gradient once. Two steps
# clear a zero-initialised residual branch; three leave room for a second zero layer behind it.
WINDOW = 3


class Watch:
    """One optimizer's first steps: which parameters have not had a nonzero gradient yet."""

    def __init__(self, optimizer: Any) -> None:
        self.optimizer_name = type(optimizer).__name__
        self.steps = 0
        # optimizer-held parameters requiring grad, weakly: a watch whose optimizer is dropped
        # before its window closes (a step that ran out of memory) keeps no parameter alive
        self.held: Dict[int, weakref.ref[torch.Tensor]] = {}
        # parameters whose group decays them: any gradient that is not None moves them (the
        # step adds the decay to it, or applies it apart), an all-zero one included
        self.decayed: Set[int] = set()
        for group in optimizer.param_groups:
            decays = bool(group.get("weight_decay", 0))
            for p in group.get("params", ()):
                if isinstance(p, torch.Tensor) and p.requires_grad:
                    self.held.setdefault(id(p), weakref.ref(p))
                    if decays:
                        self.decayed.add(id(p))
        self.suspects: Set[int] = set(self.held)  # no nonzero gradient at any step end yet
        self.never: Set[int] = set(self.held)  # .grad None at every step end so far
        self.verdict: Optional[GradientVerdict] = None  # as of the last step with suspects

    @property
    def done(self) -> bool:
        return not self.suspects or self.steps >= WINDOW

    def after_step(self, frame: Optional[Any]) -> None:
        """The end of one step of the optimizer: clear every suspect that has a gradient."""
        self.steps += 1
        for i in list(self.suspects):
            p = self.held[i]()
            if p is None:  # the parameter is gone: nothing left to report
                self.suspects.discard(i)
                continue
            g = p.grad
            if g is None:
                continue
            self.never.discard(i)
            if i in self.decayed or g.layout is not torch.strided or not g.numel() \
                    or bool(g.detach().ne(0).any()):
                self.suspects.discard(i)
        self.verdict = self._verdict(frame) if self.suspects else None

    def _verdict(self, frame: Optional[Any]) -> GradientVerdict:
        none = self.suspects & self.never
        zero = self.suspects - none
        roots = _frame_roots(frame)
        covered = {id(p) for _, m in roots for p in m.parameters()}
        if not self.suspects <= covered:
            roots += _live_roots({id(m) for _, m in roots})
        replaced = _replaced(none, self.held)
        verdict = GradientVerdict(self.optimizer_name, steps=self.steps)
        verdict.none, verdict.none_count = _units(none, self.held, roots, replaced), len(none)
        verdict.zero, verdict.zero_count = _units(zero, self.held, roots), len(zero)
        verdict.replaced_count = len(replaced)
        shim = current.session
        if shim is not None:
            verdict.policy = str(shim.config.optimizer)
        return verdict


def _replaced(ids: Set[int], held: Dict[int, Any]) -> Set[int]:
    """Those of ``ids`` a conversion replaced (the rebind registry recorded them)."""
    replaced = registry.current().replaced
    return {i for i in ids if (p := held[i]()) is not None and p in replaced}


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
           roots: Iterable[Tuple[str, torch.nn.Module]],
           replaced: Set[int] = frozenset()) -> List[str]:
    """The fewest names covering ``ids``: a module when every optimizer-held parameter below it
    is in ``ids`` (the outermost such module), else the parameter itself. Parameters no module
    holds are counted (``replaced``: those a conversion replaced)."""
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
    missing = ids - set(names)
    if missing and missing <= replaced:
        out.append(f"{len(missing)} parameter(s) that no module holds any more")
    elif missing:
        out.append(f"{len(missing)} parameter(s) that no module holds (an optimizer left on old "
                   "parameters?)")
    return out
