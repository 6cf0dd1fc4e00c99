"""torchvision's custom operators on a DirectML device where torch has no autograd layer for them.

torchvision registers ``torchvision::nms`` for CPU, CUDA and a few autograd keys, not for
``AutogradPrivateUse1``, and torch 2.4.1 (what torch-directml pins) has no autograd fallback for
that key either: ``nms`` on DirectML tensors raises "Could not run 'torchvision::nms' with
arguments from the 'AutogradPrivateUse1' backend" before torch-directml's CPU fallback can run
it. ultralytics' validation (and every detector's post-processing) calls it. The kernel below is
the missing autograd layer: nms has no gradient, so it only steps below autograd, where the
wheel's CPU fallback (or the emulator's) runs the operator as it runs any other.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dmlshim.patching import Patch

# torchvision operators without a derivative that scripts run on device tensors
NO_GRAD_OPS = ("nms",)
_KEY = "AutogradPrivateUse1"


def _below_autograd(op_name: str):
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(torch.ops.torchvision, op_name)(*args, **kwargs)

    return kernel


class VisionOpsPatch(Patch):
    name = "vision_ops"

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config) -> None:
        self._lib: Optional[torch.library.Library] = None
        self.on_undo(self._remove)  # also arms the import hook: this patch waits for torchvision
        self.when_imported("torchvision", self._register)

    def _remove(self) -> None:
        lib, self._lib = self._lib, None
        if lib is not None:
            lib._destroy()

    def _register(self, _module: Any = None) -> None:
        if not self.installed or self._lib is not None:
            return
        missing = [op for op in NO_GRAD_OPS
                   if hasattr(torch.ops.torchvision, op)
                   and not torch._C._dispatch_has_kernel_for_dispatch_key(f"torchvision::{op}", _KEY)]
        if not missing:
            return
        lib = torch.library.Library("torchvision", "IMPL")  # noqa: TOR901 - destroyed at undo
        for op in missing:
            lib.impl(op, _below_autograd(op), _KEY)
        self._lib = lib
