"""``fused=True`` / ``capturable=True`` in optimizer constructors, on targets that lack them.

* ``capturable=True`` keeps optimizer steps on the device for CUDA-graph capture; torch accepts
  it only for CUDA-like devices (the CPU fails at the first ``step()``), and there are no CUDA
  graphs on DirectML. Dropped on every non-CUDA target.
* ``fused=True`` needs ``_fused_adam_``/``_fused_sgd_``-style kernels on the parameters' device.
  torch-directml has none (they would fall back to the CPU or fail), so it is dropped on DirectML
  (real or emulated). The CPU has fused kernels in this torch, so on the CPU target it is kept
  and a shimmed run computes bit for bit what ``python script.py`` computes on a CPU machine;
  where the installed torch has no CPU fused kernels it is dropped there too.

Each drop is one info line per call site (``DMLSHIM_LOG=info``). Only the constructors of the
``torch.optim`` classes that take these flags are wrapped (subclasses calling
``super().__init__(..., fused=True)`` are covered); ``Optimizer.__init__`` itself belongs to the
rebinding patch, and the foreach choice on DirectML to the decomposition patch.
"""

from __future__ import annotations

import inspect
from typing import Dict, List, Optional, Tuple

import torch

from dmlshim import events
from dmlshim.patching import Owns, Patch

FLAGS = ("fused", "capturable")


def optimizer_classes() -> List[Tuple[type, Tuple[str, ...]]]:
    """(class, flags its own __init__ takes) for each torch.optim class taking fused/capturable."""
    found = []
    for name in sorted(dir(torch.optim)):
        cls = getattr(torch.optim, name)
        if not (isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)):
            continue
        if cls is torch.optim.Optimizer or "__init__" not in vars(cls):
            continue
        params = inspect.signature(cls.__init__).parameters
        flags = tuple(f for f in FLAGS if f in params)
        if flags:
            found.append((cls, flags))
    return found


class OptimFlagsPatch(Patch):
    name = "optim_flags"
    owns = (Owns("torch.optim.Optimizer", ("__init__",), subclasses=True),)

    def applies(self, caps) -> bool:
        return caps.redirects

    def _install(self, caps, config) -> None:
        drop = {"capturable"}
        if not caps.has_fused_optimizers():
            drop.add("fused")
        for cls, flags in optimizer_classes():
            dropped = tuple(f for f in flags if f in drop)
            if dropped:
                self.wrap(cls, "__init__", _dropper(cls, dropped, caps.kind))


def _positions(cls: type, flags: Tuple[str, ...]) -> Dict[str, Optional[int]]:
    """Index of each flag among the positional arguments after ``self`` (None: keyword-only)."""
    params = list(inspect.signature(cls.__init__).parameters.values())[1:]
    out: Dict[str, Optional[int]] = {}
    for flag in flags:
        out[flag] = None
        for i, p in enumerate(params):
            if p.name == flag and p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD:
                out[flag] = i
    return out


def _dropper(cls: type, flags: Tuple[str, ...], kind: str):
    api = f"torch.optim.{cls.__name__}"
    positions = _positions(cls, flags)

    def wrapper(wrapped, instance, args, kwargs):
        for flag in flags:
            pos = positions[flag]
            if pos is not None and len(args) > pos:
                if args[pos]:
                    args = args[:pos] + (False,) + args[pos + 1:]
                    events.redirected(api, f"{flag}=True", f"{flag}=False (not on {kind})",
                                      tag="dropped")
            elif kwargs.get(flag):
                kwargs[flag] = False
                events.redirected(api, f"{flag}=True", f"{flag}=False (not on {kind})",
                                  tag="dropped")
        return wrapped(*args, **kwargs)

    return wrapper
