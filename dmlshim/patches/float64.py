"""float64 on DirectML adapters without it: ``DMLSHIM_FLOAT64`` = ``auto`` | ``keep`` | ``float32``.

``auto`` (default) and ``float32``: on an adapter without float64 (``torch_directml.
has_float64_support(i)`` false; the emulator when its ``float64`` gap is on) a double tensor is
made float32 as it enters the device, one warning per call site. ``keep``: double tensors reach
the adapter, which fails ("The GPU device does not support Double (Float64) operations!").
This area only contributes the rule (:class:`dmlshim.conversions.DtypeRule`); the entry points
that run it are :mod:`dmlshim.patches.devices`'. Ops on device tensors that ask for float64
themselves (``x.sum(dtype=torch.float64)``) are not rewritten: that would need a wrapper on
every op.
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from dmlshim import conversions, devicemap, events
from dmlshim.config import Float64Policy
from dmlshim.patching import Patch

log = logging.getLogger("dmlshim")

F64 = torch.float64
F32 = torch.float32


def adapters_without_float64(caps: Any) -> frozenset:
    """Indices of the target's adapters that have no float64."""
    return frozenset(i for i in range(caps.target.count) if not caps.has_float64(i))


class Float64Patch(Patch):
    name = "float64"

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config) -> None:
        lacking = adapters_without_float64(caps)
        if not lacking:
            return
        policy = Float64Policy(config.float64)
        if policy is Float64Policy.KEEP:
            log.info("adapter(s) %s have no float64; DMLSHIM_FLOAT64=keep: double tensors fail "
                     "there (DMLSHIM_FLOAT64=float32 downcasts them)", sorted(lacking))
            return
        device_type = caps.device_type

        def lands_on(dev: torch.device) -> bool:
            if dev.type != device_type:
                return False
            index = dev.index if dev.index is not None else devicemap.current_index()
            return index in lacking

        def replace(api: str) -> torch.dtype:
            # the entry point records the call's one event; the warning is once per call site
            events.warn_at_user_site(
                f"dmlshim: {api}: float64 tensor made float32 on the DirectML device, which has "
                f"no float64 (DMLSHIM_FLOAT64={policy.value})")
            return F32

        self.on_undo(conversions.add_dtype_rule(
            conversions.DtypeRule("float64", F64, lands_on, replace)))
