"""torch APIs that take a device argument and that dmlshim leaves alone on purpose, with why.

tests/test_coverage.py enumerates the installed torch's public functions, methods and classes
that take ``device``, ``device_type``, ``devices`` or ``map_location`` (torch.*,
torch.Tensor.*, torch.nn.Module.*, torch.nn.functional.*, torch.fft/sparse/special/linalg/
nested/random.*) and fails for each one that is

* not wrapped by an installed patch (``dmlshim.patching.is_patched(owner, name)``, or for a
  class, its ``__init__``/``__new__``),
* not routed through a patched entry point (:data:`ROUTED`),
* and not listed here in :data:`IGNORED`.

So when a torch release adds a device-taking API, the test names it and someone decides: patch
it, or write down here why a CUDA script passing ``"cuda"`` to it needs nothing from the shim.
An entry that a patch wraps after all makes the test fail too (the list must stay true).
Entries for APIs the installed torch does not have are allowed (older/newer torch versions).

``torch.cuda.*`` is covered separately: every name of ``torch.cuda.__all__`` must be in exactly
one table of :mod:`dmlshim.patches.cuda_api` (emulated, unsupported or accepted).
"""

from __future__ import annotations

from typing import Dict

_OTHER_BACKEND = ("moves to another accelerator (XPU/IPU/MTIA); an int or device there is that "
                  "backend's ordinal, never a CUDA device, so a CUDA script has nothing here to "
                  "redirect")
_LEGACY_STORAGE = ("legacy typed storage classes: creating a storage directly on 'cuda' is "
                   "deprecated torch API that training scripts do not use; the tensors and "
                   "conversions they do use are redirected")
_AUTOCAST_STATE = ("autocast state for device_type='cuda' is kept by torch itself, without CUDA; "
                   "torch.autocast('cuda') regions are rewritten by dmlshim.patches.amp, these "
                   "queries and setters work unchanged")
_DEVICE_OBJECT = ("torch.device('cuda') is deliberately left alone (see dmlshim/devicemap.py): "
                  "the script's device.type == 'cuda' checks take their CUDA branch, and the "
                  "device becomes the target where it enters torch (factories, .to, .cuda)")
_GENERIC_STREAMS = ("device-generic streams/events (torch >= 2.5) are rare in training scripts, "
                    "which use torch.cuda.Stream/Event (emulated by dmlshim.patches.cuda_api); "
                    "torch raises its own clear error for 'cuda' here")

IGNORED: Dict[str, str] = {
    # another backend's own conversion methods
    "torch.Tensor.xpu": _OTHER_BACKEND,
    "torch.Tensor.ipu": _OTHER_BACKEND,
    "torch.Tensor.mtia": _OTHER_BACKEND,
    "torch.Tensor.hpu": _OTHER_BACKEND,
    "torch.nn.Module.xpu": _OTHER_BACKEND,
    "torch.nn.Module.ipu": _OTHER_BACKEND,
    "torch.nn.Module.mtia": _OTHER_BACKEND,
    "torch.nn.Module.hpu": _OTHER_BACKEND,
    # torch.device itself
    "torch.device": _DEVICE_OBJECT,
    "torch.nested.Device": _DEVICE_OBJECT + " (torch.nested.Device is an alias of torch.device)",
    # storages
    **{f"torch.{name}": _LEGACY_STORAGE for name in (
        "Storage", "TypedStorage", "UntypedStorage", "BFloat16Storage", "BoolStorage",
        "ByteStorage", "CharStorage", "ComplexDoubleStorage", "ComplexFloatStorage",
        "DoubleStorage", "FloatStorage", "HalfStorage", "IntStorage", "LongStorage",
        "QInt32Storage", "QInt8Storage", "QUInt2x4Storage", "QUInt4x2Storage", "QUInt8Storage",
        "ShortStorage")},
    # autocast state (torch.autocast and GradScaler themselves are patched by amp)
    "torch.get_autocast_dtype": _AUTOCAST_STATE,
    "torch.set_autocast_dtype": _AUTOCAST_STATE,
    "torch.is_autocast_enabled": _AUTOCAST_STATE,
    "torch.set_autocast_enabled": _AUTOCAST_STATE,
    "torch.is_autocast_available": _AUTOCAST_STATE,
    "torch.get_autocast_gpu_dtype": _AUTOCAST_STATE,
    # generic accelerator API
    "torch.Stream": _GENERIC_STREAMS,
    "torch.Event": _GENERIC_STREAMS,
    "torch.get_device_module": ("get_device_module('cuda') returns the torch.cuda module, whose "
                                "public names dmlshim.patches.cuda_api answers for the script"),
    # RNG
    "torch.random.fork_rng": (
        "always forks the CPU generator, which is the one DirectML and the CPU target draw device "
        "random numbers from; its device_type='cuda' branch runs inside torch, where "
        "torch.cuda.device_count() keeps its true answer (0), so no CUDA state is touched"),
    # pinned memory query
    "torch.Tensor.is_pinned": (
        "asks whether host memory is page-locked; pin_memory() is a no-op off CUDA "
        "(dmlshim.patches.devices), so torch's own answer (False) is the truth"),
    # TorchScript / RPC internals
    "torch.import_ir_module": ("TorchScript's internal loader behind torch.jit.load; scripts call "
                               "torch.jit.load / torch.load"),
    "torch.import_ir_module_from_buffer": ("TorchScript's internal loader behind torch.jit.load; "
                                           "scripts call torch.jit.load / torch.load"),
    "torch.Future": ("torch.futures.Future for RPC: its devices list only serves CUDA stream "
                     "synchronisation of RPC results; dmlshim does not emulate CUDA RPC"),
}

# API -> the patched entry point ("module.attr" or "module.Class.attr") every call of it goes
# through, for APIs that are handled without being wrapped themselves.
ROUTED: Dict[str, str] = {}
