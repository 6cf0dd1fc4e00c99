"""Device kernels for the operators torch-directml 0.2.5 runs on the CPU, built from ops it has.

torch-directml sends every operator without a ``PrivateUse1`` kernel to a boxed CPU fallback:
the tensors are copied to the host, the CPU kernel runs, the results are copied back (and for
``_thnn_fused_lstm_cell`` there is no CPU kernel, so LSTM training fails: #654, #677). A kernel
registered for ``PrivateUse1`` through ``torch.library`` takes an operator off that path. Each
module here defines such kernels for one area of common training paths, as
:class:`Decomposition` entries; :func:`register` installs those this process needs.

Rules every kernel follows:

* it is registered for ``PrivateUse1`` only, below autograd: the operators decomposed here are
  backward or optimizer operators, or forward operators whose derivative formula (in PyTorch's
  derivatives.yaml, registered for the Autograd keys) stays in force;
* it follows the wheel's rules (the emulator enforces them): every output allocated at its
  final shape (no ``resize_``, no empty ``out=``), no scatter that updates part of a dimension
  and no ``scatter_add`` (it raises on the software adapter; ``index_put_`` with
  ``accumulate=True`` sums instead);
* it calls only operators torch-directml 0.2.5 implements (its kernel list is in
  ``emulated_dml/_dml_ops.py``) — otherwise the fallback would just move — and never the
  operator it implements (that would call itself);
* it is registered only where the operator really falls back: not where torch-directml (or
  anything else) already registered a ``PrivateUse1`` kernel, which a registration would
  override, and not where this torch has a composite kernel for it (see :func:`falls_back`).
"""

from __future__ import annotations

import logging
from typing import Iterable, List, Optional, Tuple

import torch

from dmlshim.kernels.decompositions.base import Decomposition, reduce_loss, write_out

__all__ = ["Decomposition", "Registration", "all_decompositions", "falls_back", "register",
           "markdown_table", "reduce_loss", "write_out"]

log = logging.getLogger("dmlshim")

DISPATCH_KEY = "PrivateUse1"
_COMPOSITE_KEYS = ("CompositeImplicitAutograd", "CompositeExplicitAutograd",
                   "CompositeExplicitAutogradNonFunctional")


def all_decompositions() -> Tuple[Decomposition, ...]:
    """Every decomposition dmlshim knows, in the order of docs/cpu-fallbacks.md's table."""
    from dmlshim.kernels.decompositions import (
        activations,
        amp,
        embedding_bag,
        linalg,
        losses,
        misc,
        norm,
        optim,
        pooling,
        reductions,
        rnn,
        sampling,
        upsample,
    )

    out: List[Decomposition] = []
    for module in (optim, norm, rnn, embedding_bag, upsample, losses, misc, activations,
                   reductions, pooling, sampling, linalg, amp):
        out.extend(module.DECOMPOSITIONS)
    return tuple(out)


def op_exists(op: str) -> bool:
    try:
        torch._C._dispatch_has_kernel_for_dispatch_key(op, "CPU")
    except RuntimeError:
        return False
    return True


def falls_back(op: str) -> bool:
    """Whether ``op`` reaches torch-directml's CPU fallback in this process.

    True when the operator exists and has neither a ``PrivateUse1`` kernel (torch-directml's,
    or a registration of ours or anyone's) nor a composite kernel that would run on the device
    instead. On the emulator this is the emulator's model for the operators listed here (none
    of them is in torch-directml 0.2.5's kernel list).
    """
    if not op_exists(op):
        return False
    has = torch._C._dispatch_has_kernel_for_dispatch_key
    if has(op, DISPATCH_KEY):
        return False
    return not any(has(op, key) for key in _COMPOSITE_KEYS)


class Registration:
    """The kernels registered by one :func:`register` call; :meth:`remove` takes them all away."""

    def __init__(self, library: Optional[torch.library.Library],
                 decompositions: Tuple[Decomposition, ...]) -> None:
        self.library = library
        self.decompositions = decompositions

    @property
    def ops(self) -> Tuple[str, ...]:
        return tuple(d.op for d in self.decompositions)

    def remove(self) -> None:
        """Unregister every kernel (the operators fall back to the CPU again)."""
        lib, self.library = self.library, None
        if lib is None:
            return
        destroy = getattr(lib, "_destroy", None)  # private on torch 2.4.1 and 2.13 alike
        if destroy is not None:
            destroy()
            return
        # A torch without Library._destroy: drop the C++ registrations by hand and forget the
        # keys torch.library keeps (the emulator reads that set to route operators).
        handle = getattr(lib, "m", None)
        if handle is not None and hasattr(handle, "reset"):
            handle.reset()
        lib.m = None
        impls = getattr(torch.library, "_impls", None)
        if impls is not None:
            impls.difference_update(getattr(lib, "_op_impls", ()))


def register(decompositions: Optional[Iterable[Decomposition]] = None) -> Registration:
    """Register the kernels of ``decompositions`` (default: all) whose operators fall back here."""
    wanted = tuple(all_decompositions() if decompositions is None else decompositions)
    pending = tuple(d for d in wanted if falls_back(d.when or d.op))
    if not pending:
        return Registration(None, ())
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - destroyed by Registration.remove
    done: List[Decomposition] = []
    try:
        for dec in pending:
            lib.impl(dec.name, dec.kernel, DISPATCH_KEY)
            done.append(dec)
    except BaseException:
        Registration(lib, tuple(done)).remove()
        raise
    log.debug("dmlshim: device kernels registered for %s", ", ".join(d.op for d in done))
    return Registration(lib, tuple(done))


def markdown_table(decompositions: Optional[Iterable[Decomposition]] = None) -> str:
    """The table of docs/cpu-fallbacks.md (tools/docs_tables.py writes it): operator, DirectML
    issue, training path, what replaces it."""
    rows = ["| operator (torch-directml 0.2.5 CPU fallback) | DirectML issue | path | "
            "computed on the device from |", "|---|---|---|---|"]
    for dec in all_decompositions() if decompositions is None else decompositions:
        issues = ", ".join(f"#{n}" for n in dec.issues) or "not reported"
        rows.append(f"| `{dec.op}` | {issues} | {dec.area} | {dec.replaced_by} |")
    return "\n".join(rows)
