"""``torch.Generator(device="privateuseone[:N]")`` as torch-directml 0.2.5 answers it.

torch-directml 0.2.5 registers a PrivateUse1 generator that is a CPU generator: the call
succeeds and the generator reports ``device(type='cpu')`` (checked against the real package on
torch 2.4.1). Older releases raised "Device type PRIVATEUSEONE is not supported for
torch.Generator() api." (#374); seeding "the device" has no effect of its own (#587): random
ops on the device draw from the CPU generator. The ``generator`` switch:

* on (torch-directml 0.2.5): a CPU generator comes back, ``g.device.type == "cpu"``;
* off (a backend with device generators): a generator that reports ``privateuseone:N``;
  it is backed by a CPU generator, which the emulator's CPU kernels accept.

PyTorch's own ``torch.Generator`` cannot create either without a C++ backend on every torch
version, so ``torch.Generator`` is replaced by a subclass whose ``isinstance`` checks accept
every generator; ``torch._C.Generator`` is left alone.
"""

from __future__ import annotations

import torch

from emulated_dml._state import check_index, state

_ORIGINAL = torch._C.Generator


class _DeviceGenerator(_ORIGINAL):
    """A CPU generator that reports the emulated device it was created for."""

    _emulated_device: torch.device

    @property
    def device(self) -> torch.device:  # type: ignore[override]
        return self._emulated_device


class _GeneratorMeta(type(_ORIGINAL)):  # torch >= 2.6 gives Generator its own metaclass
    def __instancecheck__(cls, obj) -> bool:
        return isinstance(obj, _ORIGINAL)

    def __subclasscheck__(cls, sub) -> bool:
        return issubclass(sub, _ORIGINAL)


class Generator(_ORIGINAL, metaclass=_GeneratorMeta):
    __doc__ = _ORIGINAL.__doc__

    def __new__(cls, device="cpu"):
        target = torch.device(device) if isinstance(device, (str, int, torch.device)) else None
        if target is None or target.type != "privateuseone":
            return _ORIGINAL(device)
        index = check_index(target.index)
        if state.generator:
            return _ORIGINAL("cpu")
        gen = _DeviceGenerator("cpu")
        gen._emulated_device = state.devices[index]
        return gen


def install() -> None:
    if torch.Generator is _ORIGINAL:
        Generator.__module__ = "torch"
        Generator.__qualname__ = "Generator"
        torch.Generator = Generator
