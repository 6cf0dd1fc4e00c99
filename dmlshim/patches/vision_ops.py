"""torchvision's operators on a DirectML device: the autograd layer torchvision lacks for the
device (:mod:`dmlshim.kernels.vision` says why), registered once torchvision is imported.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dmlshim.kernels.vision import KEY as _KEY
from dmlshim.kernels.vision import NO_GRAD_OPS, below_autograd
from dmlshim.patching import Patch


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
            lib.impl(op, below_autograd(op), _KEY)
        self._lib = lib
