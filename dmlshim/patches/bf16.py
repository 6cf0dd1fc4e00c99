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

from dmlshim import capabilities, conversions, events
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


_policy: Optional[Bf16Policy] = None  # while installed


def autocast_dtype(api: str = "torch.autocast") -> Optional[torch.dtype]:
    """The dtype a bf16 autocast region for "cuda" runs in (raises under ``error``); None when
    this area is not installed (not a DirectML target)."""
    if _policy is None:
        return None
    if _policy is Bf16Policy.ERROR:
        _refuse(api)
    return _note(api, _policy)


def reports_supported() -> Optional[bool]:
    """What ``torch.cuda.is_bf16_supported()`` tells the script (None: not installed)."""
    return None if _policy is None else _policy is not Bf16Policy.ERROR


class Bf16Patch(Patch):
    name = "bf16"

    def applies(self, target) -> bool:
        return target.is_directml

    def _install(self, target, config: Any) -> None:
        global _policy
        # DMLSHIM_GUARDS=off shows the wheel as it is (a bf16 tensor aborts the process); an
        # adapter with bfloat16 (the emulator without its bfloat16 gap) needs no policy.
        if config.guards == "off" or capabilities.of(target, config).has_bf16():
            return
        policy = Bf16Policy(config.bf16)
        device_type = target.device_type

        def lands_on(dev: torch.device) -> bool:
            return dev.type == device_type

        def replace(api: str) -> torch.dtype:
            if policy is Bf16Policy.ERROR:
                _refuse(api)
            return _note(api, policy)

        self.on_undo(conversions.add_dtype_rule(
            conversions.DtypeRule("bf16", BF16, lands_on, replace)))
        _policy = policy

        def forget() -> None:
            global _policy
            _policy = None

        self.on_undo(forget)
