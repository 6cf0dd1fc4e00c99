"""How a guard above autograd hands its call to the wheel's own kernel, and the helpers every
guard family shares.

Inside ``with EXCLUDE(NOT_HERE), INCLUDE(OTHER):`` a call of a device op skips the kernels
registered for AutogradPrivateUse1 (the guards) and AutocastPrivateUse1 (already run for this
call) and reaches torch's autograd kernel through AutogradOther (the same generated kernel as
AutogradPrivateUse1's): the derivative is recorded, and the op goes on below autograd to the
wheel's kernel. Torch's C functions (``torch._C._VariableFunctions``, ``torch._C._nn``,
``TensorBase`` methods) make the call unboxed and accept numbers where the dispatcher does; ops
without one are called boxed through ``OpOverload._op``, functional ones only.

A guard costs one Python frame per call, firing or not: it counts what it did inline
(``if (shim := current.session) is not None: shim.events.notes[name] += 1``, what
``events.note`` does), makes a dim non-negative inline, and builds its lists with loops
(a comprehension is a frame of its own on Python < 3.12); a helper is called only to raise.
"""

from __future__ import annotations

import torch

EXCLUDE = torch._C._ExcludeDispatchKeyGuard
INCLUDE = torch._C._IncludeDispatchKeyGuard
NOT_HERE = (torch._C.DispatchKeySet(torch._C.DispatchKey.AutogradPrivateUse1)
            | torch._C.DispatchKeySet(torch._C.DispatchKey.AutocastPrivateUse1))
OTHER = torch._C.DispatchKey.AutogradOther
# the keys the two kinds of kernel guards are registered for (see dmlshim.kernels)
INPUT_FIX_KEY = "AutogradPrivateUse1"
REPLACEMENT_KEY = "PrivateUse1"
# torch.arange's C function (unboxed, below autograd): a boxed aten.arange.* call above
# autograd gets the wheel's empty out= tensor back (its arange.start_out returns a new tensor
# and leaves the one it was handed; autograd's out= layer returns the one it was handed)
ARANGE = torch._C._VariableFunctions.arange


def wrap_dim(dim: int, rank: int) -> int:
    """``dim`` made non-negative as torch does it, or torch's IndexError (the wheel gets no
    dim it could crash on)."""
    size = max(rank, 1)
    if not -size <= dim < size:
        raise IndexError(f"Dimension out of range (expected to be in range of [{-size}, "
                         f"{size - 1}], but got {dim})")
    return dim % size
