"""An emulated DirectML device: torch-directml 0.2.5's ``privateuseone:N``, computed on the CPU.

A test device and a package of its own: ``import emulated_dml`` installs nothing and imports
nothing of dmlshim; what the two share (the switch names, the fused LSTM cell, CUDA's autocast
kernels) lives in ``dmlshared``, which imports neither. What it reproduces of the real wheel, and the
fidelity switches, are in docs/emulator.md ("Fidelity switches"); each switch's behaviour is
modelled where it acts (``_ops.py`` wrong results, ``_fallback.py``/``_policy.py`` the CPU
fallback and the dispatcher model, ``_tensor.py`` storage/inference-mode/bfloat16).

Ordering constraint for callers: PyTorch's autograd engine sizes its device queues once, at
the first backward() of the process, so :func:`register` (or :func:`install_device_guard`) must
run before any backward(), else backward() on the device fails with an INTERNAL ASSERT about
``device_ready_queues_`` (:func:`autograd_ready` tells).

A kernel registered for ``PrivateUse1`` through ``torch.library`` (or
:func:`register_device_kernel`) runs instead of the emulator's CPU path and is not counted as
a fallback, as on real DirectML; register the name the op reaches the device with (e.g.
``"lerp.Scalar"`` and ``"lerp_.Scalar"``) or the out= variant torch-directml names in its
warning (``"lerp.Scalar_out"``): structured ops route through their out= kernel.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, Iterable, Optional

import torch

from emulated_dml import _compat, _fallback, _memory
from emulated_dml._fallback import REPORTED_FALLBACKS, WARNING_TEXT
from emulated_dml._state import (
    ALL_SWITCHES,
    BUGS,
    GAPS,
    EmulatorError,
    EmulatorIndexError,
    apply_switches,
    check_index,
    parse_switches,
    set_count,
    state,
)
from emulated_dml._tensor import F64_MESSAGE, EmuTensor

__all__ = [
    "EmulatorError", "EmulatorIndexError", "register", "is_registered", "set_switches",
    "install_device_guard", "autograd_ready",
    "switches", "device", "device_count", "synchronize", "memory_allocated",
    "max_memory_allocated", "reset_peak_memory_stats", "fallback_counts", "fallback_bytes",
    "reset_fallback_counts", "is_emulated", "register_device_kernel",
    "unregister_device_kernel", "set_memory_limit", "fix_parameter_instancecheck", "GAPS", "BUGS",
    "ALL_SWITCHES", "REPORTED_FALLBACKS", "WARNING_TEXT", "F64_MESSAGE",
]

# op name -> the Library holding its PrivateUse1 kernel (one per op, so each can be removed).
_kernel_libs: Dict[str, torch.library.Library] = {}


def register(count: int = 1, switches: Iterable[str] = GAPS,
             device_module: Optional[type] = None) -> None:
    """Register ``count`` emulated DirectML adapters (``privateuseone:0`` .. ``count-1``).

    Idempotent: a second call only changes the adapter count and the switches. Raises
    :class:`EmulatorError` if torch_directml is imported in this process (the emulator must
    not register beside the real backend), or if this torch cannot host it.

    ``device_module``: the ``torch.privateuseone`` module to register instead of the
    emulator's own; the stand-in wheel (emulated_dml.wheel) passes torch_directml's, and is
    the one ``torch_directml`` allowed to be imported then.
    """
    if "torch_directml" in sys.modules and device_module is None:
        raise EmulatorError(
            "dmlshim emulator: torch_directml is already imported in this process; the emulated "
            "DirectML device cannot be registered beside the real one (both claim PrivateUse1)"
        )
    names = parse_switches(switches)
    set_count(count)
    _memory.resize(count)
    from emulated_dml import _backend, _generator

    apply_switches(names)
    _backend.install(device_module)
    _generator.install()  # again after dmlshim.uninstall() gave torch.Generator back
    state.registered = True
    _sync_registrations()


def install_device_guard(cpp: Optional[bool] = None) -> str:
    """Install only the emulator's PrivateUse1 device guard; return "cpp" or "python".

    PyTorch's autograd engine creates its per-device queues once, at the first backward() of
    the process, from the device guards registered at that moment: the emulated device can
    run backward() only if its guard existed then. ``register()`` installs it; call this
    earlier (e.g. at the start of a test session) when a backward() may run before the
    emulator is registered. Nothing else is registered (no device module, no kernels).

    ``cpp=None`` builds the small C++ guard (8 adapters or more) on every torch, falling back
    to PyTorch's Python guard on torch >= 2.5 when it cannot be built (one device: backward()
    works on ``privateuseone:0`` only). ``cpp=True`` insists on the C++ guard; ``cpp=False``
    takes the Python one where torch has it.
    Raises EmulatorError if torch_directml is imported or the C++ guard cannot be built.
    """
    from emulated_dml import _backend

    return _backend.install_device_guard(cpp)


def autograd_ready() -> bool:
    """Whether backward() works on ``privateuseone:0`` in this process (needs register()).

    Runs a one-element backward(). Not called by ``register()``: a backward() in the middle of
    an import (``import dmlshim`` installs the shim) can deadlock, because the engine runs the
    emulated device's backward in its device thread, which may need an import lock the
    importing thread holds.
    """
    from emulated_dml import _backend

    if not state.registered:
        return False
    return _backend.autograd_ready()


def is_registered() -> bool:
    return state.registered


def set_switches(switches: Iterable[str]) -> None:
    """Choose which gaps and bugs are reproduced (names in ``ALL_SWITCHES``)."""
    apply_switches(parse_switches(switches))
    _sync_registrations()


def _sync_registrations() -> None:
    from emulated_dml import _backend

    if _backend._cpp_guard is not None:  # the gap lives in the C++ guard (a kernel in C++)
        _backend._cpp_guard.set_readback_gil(state.registered and state.readback_gil)
    if state.registered:
        from dmlshared import autocast_kernels

        # the wheel has no autocast kernels (the gap); without the gap, CUDA-like ones
        if state.autocast:
            autocast_kernels.release("emulator")
        else:
            autocast_kernels.hold("emulator")


def switches() -> frozenset:
    """The switches in force."""
    return state.switches


def device(index: int = 0) -> torch.device:
    """``torch.device("privateuseone", index)``; EmulatorIndexError when out of range."""
    if not isinstance(index, int) or isinstance(index, bool):
        raise TypeError(f"dmlshim emulator: device index must be an int, got {index!r}")
    return state.devices[check_index(index)]


def device_count() -> int:
    return state.count if state.registered else 0


def synchronize(index: Optional[int] = None) -> None:
    """Nothing to wait for: every emulated op has finished when it returns."""
    if index is not None:
        check_index(index)


def memory_allocated(index: Optional[int] = None) -> int:
    """Bytes of live storages on adapter ``index`` (None: all adapters)."""
    return _memory.allocated(None if index is None else check_index(index))


def max_memory_allocated(index: Optional[int] = None) -> int:
    return _memory.max_allocated(None if index is None else check_index(index))


def reset_peak_memory_stats(index: Optional[int] = None) -> None:
    _memory.reset_peak(None if index is None else check_index(index))


def fallback_counts() -> Dict[str, int]:
    """``{"aten::lerp.Scalar_out": 12, ...}``: CPU fallbacks per operator since the last reset."""
    return _fallback.counts()


def fallback_bytes() -> Dict[str, tuple]:
    """``{"aten::x": (to_host, to_device)}``: bytes the CPU fallbacks copied since the last reset
    (each call: its device tensor arguments to the host, its results back)."""
    return _fallback.bytes_moved()


def set_memory_limit(nbytes: Optional[int]) -> None:
    """Live bytes each adapter may hold (None: unlimited); past it a new storage raises
    torch-directml's out-of-memory error."""
    _memory.set_limit(nbytes)


def fix_parameter_instancecheck() -> None:
    """On torch 2.4, make ``isinstance(t, UninitializedParameter)`` False for emulated parameters
    (as torch 2.5 does), so that DDP takes them; nothing on other torch versions."""
    _compat.fix_parameter_instancecheck()


def reset_fallback_counts() -> None:
    """Zero the counters (warnings stay once per process, like torch-directml's)."""
    _fallback.reset_counts()


def is_emulated(t: torch.Tensor) -> bool:
    return isinstance(t, EmuTensor)


def register_device_kernel(op_name: str, fn: Callable) -> None:
    """Register ``fn`` as the PrivateUse1 kernel of ``op_name`` (e.g. ``"lerp.Scalar_out"``).

    Same effect as ``torch.library.Library("aten", "IMPL").impl(op_name, fn, "PrivateUse1")``,
    which works on real DirectML too: the op then runs ``fn`` (with device tensors) instead of
    the CPU fallback, and is not counted. ``fn`` must not call the same op on device tensors
    (it would call itself). Registering a name again replaces its kernel.
    """
    name = op_name.split("::", 1)[-1]
    unregister_device_kernel(name)
    lib = torch.library.Library("aten", "IMPL")  # lives until unregistered
    lib.impl(name, fn, "PrivateUse1")
    _kernel_libs[name] = lib


def unregister_device_kernel(op_name: str) -> bool:
    """Remove a kernel added by :func:`register_device_kernel`; False if there was none."""
    lib = _kernel_libs.pop(op_name.split("::", 1)[-1], None)
    if lib is None:
        return False
    lib._destroy()
    return True
