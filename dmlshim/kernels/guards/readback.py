"""Guards of the copies to the host: readback_gil (a kernel above autograd for
``_local_scalar_dense``) and non_blocking_to_host (a policy of ``Tensor.to``).
"""

from __future__ import annotations

from typing import Callable

import torch

from dmlshim import current

Tensor = torch.Tensor
_TO = torch._C.TensorBase.to
_ITEM = torch._C.TensorBase.item

# -- a read back of one number with the GIL held deadlocks ------------------------------------
# torch reads a device tensor given where a number goes (``torch.zeros(b, counts.max(), n)``,
# ``torch.full(size, t)``, ``torch.arange(t)``: YOLOv8's assigner) with ``item()`` while it
# holds the GIL. The wheel's read back waits on a fence its event thread signals once it has
# run the completions queued before it, and a completion that drops the last reference to a
# tensor Python has already let go of (torch then keeps the tensor's Python object alive from
# C++) takes the GIL to free it: neither thread moves again. Above autograd, the copy to the
# host goes through Tensor.to's C binding, which waits with the GIL released; ``Tensor.item()``
# itself releases it too, so that path only gains this frame.


def local_scalar_dense(self: Tensor):
    # not counted in the exit summary's "guards applied": every read back of a number takes it
    return _ITEM(_TO(self, "cpu"))


# -- x.to("cpu", non_blocking=True) of a device tensor returns before the copy is done ----------
# The host tensor reads as garbage, and the late write corrupts the heap (``malloc():
# unaligned tcache chunk detected``: GradScaler.update does it every step). A policy of
# ``Tensor.to`` (dmlshim.conversions; dmlshim.patches.devices owns the entry point): a
# non-blocking copy out of a device tensor blocks (for a copy between device tensors blocking
# changes nothing).


def blocking_copy_to_host(device_type: str) -> Callable[[Tensor], bool]:
    """The policy: whether a ``non_blocking=True`` copy of ``tensor`` must block."""

    def blocking(tensor: Tensor) -> bool:
        if tensor.device.type != device_type:
            return False
        if (shim := current.session) is not None:
            shim.events.notes["guard.non_blocking_to_host"] += 1
        return True

    return blocking
