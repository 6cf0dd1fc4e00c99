"""Non-contiguous ``memory_format`` bound for a DirectML device is dropped.

torch-directml 0.2.5 refuses ``memory_format=torch.channels_last`` in ``Module.to`` /
``Tensor.to`` ("'memory_format' argument is must be Contiguous for DML tensors"), so a CUDA
script's ``model.to("cuda", memory_format=torch.channels_last)`` (a speed hint on CUDA) gets a
contiguous model instead: the same results. ``x.contiguous(memory_format=...)`` is accepted by
the wheel and left alone. This area contributes the rule to :mod:`dmlshim.conversions`.
It is a guard: ``DMLSHIM_GUARDS=off`` leaves ``memory_format`` to the wheel (which refuses it),
so the wheel's behaviour can be seen raw.
"""

from __future__ import annotations

from typing import Any

import torch

from dmlshim import conversions
from dmlshim.patching import Patch


class LayoutPatch(Patch):
    name = "layout"

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config: Any) -> None:
        if config.guards != "on":
            return
        device_type = caps.device_type

        def lands_on(dev: torch.device) -> bool:
            return dev.type == device_type

        # the entry point records the dropped format in the call's one event (DMLSHIM_LOG=info
        # logs each call site once)
        self.on_undo(conversions.set_memory_format_rule(conversions.MemoryFormatRule(lands_on)))
