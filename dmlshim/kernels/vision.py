"""torchvision's custom operators on a DirectML device where torch has no autograd layer for them.

torchvision registers ``torchvision::nms`` for CPU, CUDA and a few autograd keys, not for
``AutogradPrivateUse1``, and torch 2.4.1 (what torch-directml pins) has no autograd fallback for
that key either: ``nms`` on DirectML tensors raises "Could not run 'torchvision::nms' with
arguments from the 'AutogradPrivateUse1' backend" before torch-directml's CPU fallback can run
it. ultralytics' validation (and every detector's post-processing) calls it. The kernel below is
the missing autograd layer: nms has no gradient, so it only steps below autograd, where the
wheel's CPU fallback (or the emulator's) runs the operator as it runs any other.
:mod:`dmlshim.patches.vision_ops` registers it once torchvision is imported.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

# torchvision operators without a derivative that scripts run on device tensors
NO_GRAD_OPS = ("nms",)
KEY = "AutogradPrivateUse1"


def below_autograd(op_name: str) -> Callable[..., Any]:
    """The ``AutogradPrivateUse1`` kernel of ``torchvision::op_name``: the op, below autograd."""
    def kernel(*args: Any, **kwargs: Any) -> Any:
        with torch._C._AutoDispatchBelowAutograd():
            return getattr(torch.ops.torchvision, op_name)(*args, **kwargs)

    return kernel
