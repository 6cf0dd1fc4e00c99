"""bfloat16 bound for a DirectML device: ``DMLSHIM_BF16`` = ``float32`` | ``float16`` | ``error``.

torch-directml 0.2.5 has no bfloat16: a bf16 tensor on the device aborts the process
(``dml_util.cc:118 Invalid or unsupported data type BFloat16``, microsoft/DirectML#688), with no
Python exception to catch. So, unless ``DMLSHIM_GUARDS=off``, a bf16 tensor entering a DirectML device (real or emulated) is
made float32 (default) or float16, one warning per call site, or ``error`` raises a Python
exception naming the call site. ``torch.autocast("cuda", dtype=torch.bfloat16)`` follows the
same policy (:mod:`dmlshim.patches.amp` asks :func:`autocast_dtype`), and
``torch.cuda.is_bf16_supported()`` answers True to the script unless the policy is ``error``.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from dmlshim import conversions, current, events
from dmlshim.config import Bf16Policy
from dmlshim.patching import Patch

BF16 = torch.bfloat16
_AS = {Bf16Policy.FLOAT32: torch.float32, Bf16Policy.FLOAT16: torch.float16}


class Bf16Error(RuntimeError):
    """A bfloat16 tensor was bound for a DirectML device under ``DMLSHIM_BF16=error``."""


def _where() -> str:
    site = events.last_user_frame_info()
    return f"{events.display_path(site[0])}:{site[1]}" if site else "<unknown>"


def _refuse(api: str) -> None:
    raise Bf16Error(
        f"dmlshim: {api} at {_where()}: a bfloat16 tensor bound for the DirectML device, which "
        "has no bfloat16 (torch-directml aborts the process on it, microsoft/DirectML#688); "
        "DMLSHIM_BF16=error refuses it: use float32/float16 there, or set DMLSHIM_BF16=float32 "
        "(default) or float16 to convert")


def _note(api: str, policy: Bf16Policy) -> torch.dtype:
    new = _AS[policy]
    name = str(new).replace("torch.", "")
    # the entry point (or the autocast wrapper) records the call's one event
    events.warn_at_user_site(f"dmlshim: {api}: bfloat16 becomes {name} on the DirectML device, "
                             f"which has no bfloat16 (DMLSHIM_BF16={policy.value})")
    return new


def autocast_dtype(api: str = "torch.autocast") -> Optional[torch.dtype]:
    """The dtype a bf16 autocast region for "cuda" runs in (raises under ``error``): the answer
    of the bf16 rule this area registered; None when there is none (not a DirectML target)."""
    shim = current.session
    rule = shim.rewriters.dtype_rules.get(BF16) if shim is not None else None
    return rule.replace(api) if rule is not None else None


def reports_supported() -> Optional[bool]:
    """What ``torch.cuda.is_bf16_supported()`` tells the script (None: not installed)."""
    shim = current.session
    patch = shim.patch("bf16") if shim is not None else None
    policy = getattr(patch, "policy", None)
    return None if policy is None else policy is not Bf16Policy.ERROR


class Bf16Patch(Patch):
    name = "bf16"

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config: Any) -> None:
        # DMLSHIM_GUARDS=off shows the wheel as it is (a bf16 tensor aborts the process); an
        # adapter with bfloat16 (the emulator without its bfloat16 gap) needs no policy.
        if config.guards == "off" or caps.has_bf16():
            return
        policy = Bf16Policy(config.bf16)
        device_type = caps.device_type

        def lands_on(dev: torch.device) -> bool:
            return dev.type == device_type

        def replace(api: str) -> torch.dtype:
            if policy is Bf16Policy.ERROR:
                _refuse(api)
            return _note(api, policy)

        self.on_undo(conversions.add_dtype_rule(
            conversions.DtypeRule("bf16", BF16, lands_on, replace)))
        self.policy: Optional[Bf16Policy] = policy  # (read while the session is in force)
