"""An emulated DirectML device: torch-directml 0.2.5's ``privateuseone:N`` on the CPU.

``register()`` adds a PrivateUse1 backend named ``privateuseone`` (the name torch-directml
keeps) whose tensors report ``device.type == "privateuseone"`` and index N, carry the
PrivateUse1 dispatch key, and keep their data in CPU tensors. Every operator runs the CPU
kernel, so results are bit-identical to the CPU wherever PyTorch takes the same code path
for both devices. This lets dmlshim be tested in-process on machines without DirectML.

What is always faithful (not switchable)
    * Parameters are replaced, not updated in place, by ``model.to(dev)`` / ``model.cpu()``:
      PrivateUse1 tensors are not shallow-copy compatible with CPU ones (c10 TensorImpl's
      dense allow-list), so an optimizer built before ``.to(dev)`` keeps stepping dead
      tensors. (Not a traceable wrapper subclass: no ``__tensor_flatten__``.)
    * PyTorch's device-dependent paths: optimizers default to ``foreach`` (the tensor type
      is added to ``torch.optim``'s foreach-capable types); dropout uses ``native_dropout``;
      LSTM uses ``_thnn_fused_lstm_cell``; convolution/BatchNorm/etc. are the CPU kernels.
    * Mixing a device tensor with a non-scalar CPU tensor (or another adapter's tensor)
      raises "Expected all tensors to be on the same device, ...", as on CUDA.
    * Random numbers come from the CPU default generator, as with torch-directml.

Fidelity switches (``register(switches=...)`` / ``set_switches``); every gap (``GAPS``) is on
by default, ``bug-bn-stats`` is opt-in (``bug-ce-none`` and ``bug-mul-bool`` are accepted as the
old names of ``nll-none-backward`` and ``mul-bool``):

================  ==============================================================================
``fallback``      Operators torch-directml 0.2.5 has no kernel for run on the CPU, are counted
                  (``fallback_counts()``) and warn with the exact text of torch-directml
                  (how often: ``fallback-warn-once``). Which operators: see ``_fallback.py`` (the table
                  of reported ops with their issue numbers and what 0.2.5 does) and
                  ``_policy.py`` (the model of the dispatcher: 0.2.5's real kernel list,
                  structured out= routing, PyTorch's composites). E.g. Adam reports
                  ``aten::lerp.Scalar_out`` (#675), LSTM ``aten::_thnn_fused_lstm_cell`` and then
                  raises NotImplementedError (#654, #677: no CPU kernel either), group norm
                  backward ``aten::native_group_norm_backward`` (#678). Off: no counting,
                  no warning, and the ops without a CPU kernel (the fused LSTM cell) work.
``float64``       Creating or computing a float64 tensor on the device raises
                  ``RuntimeError("The GPU device does not support Double (Float64)
                  operations!")`` (#430, #438, #699), as on adapters without float64. This
                  includes printing a floating-point tensor, which converts to double on the
                  device (#430, #396); ``.item()``, ``.tolist()``, ``.cpu()`` work.
``autocast``      torch-directml 0.2.5 on torch 2.4.1: ``torch.autocast("privateuseone")`` is
                  accepted (float16 is its one "supported" dtype; bfloat16 warns and disables
                  itself), then the first operator on a device tensor inside the region raises
                  ``NotImplementedError: Could not run 'aten::...' with arguments from the
                  'AutocastPrivateUse1' backend`` (no kernel or fallthrough is registered for that
                  key by torch or torch-directml; #454's "must be 'cuda' or 'cpu'" was torch
                  1.13's answer). Off: autocast works like CUDA's (float16 matmul/conv/linear,
                  float32 losses/softmax/norms, everything else passes through).
``generator``     torch-directml 0.2.5: ``torch.Generator(device="privateuseone")`` returns a
                  CPU generator (``g.device.type == "cpu"``; older releases raised, #374;
                  seeding "the device" has no effect of its own, #587). Off: the generator
                  reports ``privateuseone:N``.
``storage``       Device tensors have no storage, as torch-directml's OpaqueTensorImpls:
                  ``untyped_storage()``/``storage()`` raise ``NotImplementedError: Cannot access
                  storage of OpaqueTensorImpl``, C++ storage reads (DDP's Reducer) raise the same
                  message, ``torch._C._has_storage`` is False. Needs the C++ guard extension.
``inference-mode`` Inside ``torch.inference_mode()`` every op on a device tensor made outside
                  the region raises "Cannot set version_counter for inference tensor".
``bfloat16``      A bfloat16 tensor reaching the device prints torch-directml's
                  ``dml_util.cc:118 Invalid or unsupported data type BFloat16`` and aborts.
``fallback-warn-once``  the fallback warning fires once per process in total (one
                  ``TORCH_WARN_ONCE`` site for every op), every time under
                  ``torch.set_warn_always(True)``; off: once per operator.
``eye``           ``torch.eye`` on the device comes back with shape ``(0,)`` (#431).
``mul-bool``      float tensor times bool tensor gives bool, any order, ``*=`` too (#686, #737).
``nll-none-backward``  ``nll_loss``/``cross_entropy(reduction="none")`` backward uses
                  ``grad_output[0]`` for every row (#739, #740).
``masked-fill-uint8``  ``masked_fill`` accepts a uint8 mask (#702).
``reflect-pad``   ``F.pad(mode="reflect")`` swaps the height and width padding.
``channels-last`` ``.to(memory_format=torch.channels_last)`` is refused.
``layer-norm-nobias``  the layer-norm backward without a bias raises the wheel's errors.
``bug-bn-stats``  BatchNorm running statistics are not updated in training (#362; opt-in, not
                  reproduced by 0.2.5).
================  ==============================================================================

The wrong results are modelled in ``_ops.py``; all were observed on the real wheel. Not
reproduced: copies between two adapters giving zeros (#443), float64 computed at float32
precision on adapters that accept it (#398), ``tensor.new()`` (#400), checkpoint location tags
(#196, #466): emulated tensors are saved as CPU data plus the device string.

Autograd needs a PrivateUse1 device guard, and PyTorch's autograd engine sizes its device
queues once, at the first backward() of the process: register the emulator (or call
:func:`install_device_guard`) before any backward() runs, else backward() on the device fails
with an INTERNAL ASSERT about ``device_ready_queues_`` (:func:`autograd_ready` tells). The
guard is a small C++ one (``_guard.cpp``), built once with ``torch.utils.cpp_extension`` (g++
and ninja; cached in the torch extensions directory, ``TORCH_EXTENSIONS_DIR``) on every torch:
torch < 2.5 has no Python guard, and PyTorch's private Python guard on newer torch reports one
device, so backward() would work on ``privateuseone:0`` only. Without a compiler on torch >= 2.5
the Python guard is used, and ``register(count > 1)`` refuses.

Kernel hook: a kernel registered for the ``PrivateUse1`` dispatch key through
``torch.library`` (or with :func:`register_device_kernel`) runs instead of the emulator's
CPU path and is never counted as a fallback, as a registered kernel takes the operator off
torch-directml's CPU fallback. Register the name the op reaches the device with (e.g.
``"lerp.Scalar"`` and ``"lerp_.Scalar"``) or the out= variant that torch-directml names in its
warning (``"lerp.Scalar_out"``): the functional and in-place forms of structured ops route
through their out= kernel, as in PyTorch.
"""

from __future__ import annotations

import sys
from typing import Callable, Dict, Iterable, Optional

import torch

from dmlshim.emulator import _fallback, _memory
from dmlshim.emulator._fallback import REPORTED_FALLBACKS, WARNING_TEXT
from dmlshim.emulator._state import (
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
from dmlshim.emulator._tensor import F64_MESSAGE, EmuTensor

__all__ = [
    "EmulatorError", "EmulatorIndexError", "register", "is_registered", "set_switches",
    "install_device_guard", "autograd_ready",
    "switches", "device", "device_count", "synchronize", "memory_allocated",
    "max_memory_allocated", "reset_peak_memory_stats", "fallback_counts", "fallback_bytes",
    "reset_fallback_counts", "is_emulated", "register_device_kernel",
    "unregister_device_kernel", "GAPS", "BUGS",
    "ALL_SWITCHES", "REPORTED_FALLBACKS", "WARNING_TEXT", "F64_MESSAGE",
]

# op name -> the Library holding its PrivateUse1 kernel (one per op, so each can be removed).
_kernel_libs: Dict[str, torch.library.Library] = {}


def register(count: int = 1, switches: Iterable[str] = GAPS) -> None:
    """Register ``count`` emulated DirectML adapters (``privateuseone:0`` .. ``count-1``).

    Idempotent: a second call only changes the adapter count and the switches. Raises
    :class:`EmulatorError` if torch_directml is imported in this process (the emulator must
    not register beside the real backend), or if this torch cannot host it.
    """
    if "torch_directml" in sys.modules:
        raise EmulatorError(
            "dmlshim emulator: torch_directml is already imported in this process; the emulated "
            "DirectML device cannot be registered beside the real one (both claim PrivateUse1)"
        )
    names = parse_switches(switches)
    set_count(count)
    _memory.resize(count)
    from dmlshim.emulator import _backend, _generator

    apply_switches(names)
    _backend.install()
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
    from dmlshim.emulator import _backend

    return _backend.install_device_guard(cpp)


def autograd_ready() -> bool:
    """Whether backward() works on ``privateuseone:0`` in this process (needs register()).

    Runs a one-element backward(). Not called by ``register()``: a backward() in the middle of
    an import (``import dmlshim`` installs the shim) can deadlock, because the engine runs the
    emulated device's backward in its device thread, which may need an import lock the
    importing thread holds.
    """
    from dmlshim.emulator import _backend

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
    if state.registered:
        from dmlshim.emulator import _autocast

        _autocast.sync()


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
