"""Tensor methods that read a device tensor's storage, for DirectML tensors (which have none).

torch-directml's tensors are ``OpaqueTensorImpl``s (fact 8 of the real wheel): storage access
raises ``NotImplementedError: Cannot access storage of OpaqueTensorImpl``. Two Tensor methods
exist only to look at storage and are called on device tensors by CUDA scripts and libraries:

* ``share_memory_()``: a no-op for CUDA tensors in torch (their memory is shared through CUDA
  IPC); for a DirectML tensor it is a no-op too, returning the tensor, because DirectML memory
  cannot be shared between processes at all. What sharing a DirectML tensor with another process
  does instead is the processes patch's business (a copy arrives; ``module.share_memory()``
  keeps the module in CPU shared memory).
* ``is_shared()``: False for a DirectML tensor (its memory is not shared; CUDA answers True).

``share_memory_`` is wrapped by :mod:`dmlshim.patches.devices` (with the other ``.cuda``-like
paths); this area gives it its policy, :func:`refuses_sharing`. Everything else that reads
storage is handled where it enters: ``torch.save``/``torch.load`` (serialization), DataLoader
pinning (data: pinning is dropped off CUDA), DDP (distributed).
"""

from __future__ import annotations

from typing import Callable

import torch

from dmlshim import conversions
from dmlshim.patching import Owns, Patch


def refuses_sharing(device_type: str) -> Callable[[torch.Tensor], bool]:
    """``Tensor.share_memory_``'s policy (devices.py wraps the method): True for a tensor on
    the DirectML device, whose memory no other process can map; its ``share_memory_()`` is then
    a no-op returning the tensor, as for a CUDA tensor."""

    def refuses(tensor: torch.Tensor) -> bool:
        return tensor.device.type == device_type

    return refuses


class DeviceStoragePatch(Patch):
    name = "storage"
    owns = (Owns("torch.Tensor", ("is_shared",)),)

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config) -> None:
        refuses = refuses_sharing(caps.device_type)
        self.on_undo(conversions.add_policy("Tensor.share_memory_", refuses))

        def is_shared(wrapped, instance, args, kwargs):
            if refuses(instance):  # not shared, and never shareable
                return False
            return wrapped(*args, **kwargs)

        self.wrap(torch.Tensor, "is_shared", is_shared)
