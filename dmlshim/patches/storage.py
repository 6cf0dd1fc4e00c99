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

Everything else that reads storage is handled where it enters: ``torch.save``/``torch.load``
(serialization), DataLoader pinning (data: pinning is dropped off CUDA), DDP (distributed).
"""

from __future__ import annotations

import torch

from dmlshim import events
from dmlshim.patching import Patch


class DeviceStoragePatch(Patch):
    name = "storage"

    def applies(self, target) -> bool:
        return target.is_directml

    def _install(self, target, config) -> None:
        device_type = target.device_type

        def share_memory_(wrapped, instance, args, kwargs):
            if instance.device.type == device_type:
                events.redirected("Tensor.share_memory_", "share_memory_()", "no-op",
                                  tag="dropped")
                return instance
            return wrapped(*args, **kwargs)

        def is_shared(wrapped, instance, args, kwargs):
            if instance.device.type == device_type:
                return False
            return wrapped(*args, **kwargs)

        self.wrap(torch.Tensor, "share_memory_", share_memory_)
        self.wrap(torch.Tensor, "is_shared", is_shared)
