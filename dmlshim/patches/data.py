"""DataLoader: ``pin_memory=True`` / ``pin_memory_device="cuda"`` become no-ops off CUDA.

Page-locked memory only speeds up host-to-CUDA copies. torch itself warns and ignores
``pin_memory`` without an accelerator; on DirectML it would try to pin for ``privateuseone``.
"""

from __future__ import annotations

import torch.utils.data

from dmlshim import devicemap, events
from dmlshim.patching import Owns, Patch


class DataLoaderPatch(Patch):
    name = "data"
    owns = (Owns("torch.utils.data.DataLoader", ("__init__",)),)

    def applies(self, caps) -> bool:
        return caps.redirects

    def _install(self, caps, config) -> None:
        def init(wrapped, instance, args, kwargs):
            if kwargs.get("pin_memory"):
                kwargs["pin_memory"] = False
                events.redirected("DataLoader(pin_memory=True)", True, False, tag="dropped")
            dev = kwargs.get("pin_memory_device")
            if dev and devicemap.is_cuda_device(dev):
                kwargs["pin_memory_device"] = ""
                events.redirected("DataLoader(pin_memory_device)", dev, "", tag="dropped")
            return wrapped(*args, **kwargs)

        self.wrap(torch.utils.data.DataLoader, "__init__", init)
