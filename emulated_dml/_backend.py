"""One-time hookup of the emulator into PyTorch's PrivateUse1 machinery.

* factory kernels for PrivateUse1 through ``torch.library`` (``empty.memory_format`` and
  ``empty_strided``: every factory and every CPU -> device copy starts there);
* a device module ``torch.privateuseone`` shaped like torch-directml's ``PrivateUse1Module``;
* a device guard: PyTorch's private Python hooks on torch >= 2.5, a tiny C++ extension
  (``_guard.cpp``, built once into the torch extensions cache) on torch < 2.5;
* the emulated tensor type added to the optimizers' foreach-capable types, so that
  ``torch.optim`` takes the foreach path on the device as it does on real DirectML;
* ``torch.Generator`` routed for ``privateuseone`` devices (see ``_generator.py``).

The backend keeps the name ``privateuseone`` (torch-directml does not rename it), so
``torch.utils.rename_privateuse1_backend`` is never called.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import sys
from typing import Any, Optional

import torch

from emulated_dml import _memory, _tensor
from emulated_dml._state import EmulatorError, check_index, state
from emulated_dml._tensor import (
    F64_MESSAGE,
    EmuTensor,
    check_float64,
    check_memory_format,
    sync_metadata,
    wrap,
)

_CPU = torch.device("cpu")
_C_EMPTY = torch._C._VariableFunctions.empty
_C_EMPTY_STRIDED = torch._C._VariableFunctions.empty_strided
_lib: Optional[Any] = None
_cpp_guard: Optional[Any] = None
_guard_kind = ""
_installed = False


def full_dtype(fill_value) -> torch.dtype:
    """The dtype torch's ``full`` infers from a fill value given without one."""
    if isinstance(fill_value, bool):
        return torch.bool
    if isinstance(fill_value, int):
        return torch.int64
    if isinstance(fill_value, complex):
        return torch.complex128 if torch.get_default_dtype() is torch.float64 \
            else torch.complex64
    return torch.get_default_dtype()


def _full(size, fill_value, *, dtype=None, layout=None, device=None, pin_memory=None):
    # torch-directml has a full kernel of its own, which infers no dtype from a float fill value
    # given without one (a float64 tensor: refused): gap full-float. An int or bool fill value,
    # or a dtype, works.
    if dtype is None:
        if state.full_float and isinstance(fill_value, float):
            raise RuntimeError(F64_MESSAGE)
        dtype = full_dtype(fill_value)
    out = _empty_memory_format(size, dtype=dtype, layout=layout, device=device,
                               pin_memory=pin_memory)
    return out.fill_(fill_value)


def _empty_memory_format(size, *, dtype=None, layout=None, device=None, pin_memory=None,
                         memory_format=None):
    index = check_index(device.index if device is not None else None)
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    check_float64(dtype)
    check_memory_format(memory_format)
    # device=cpu explicitly: a torch.device(...) context or set_default_device must not send
    # this inner allocation back to the emulator.
    # torch's C function, as the wheel's C++ would: never a Python wrapper of torch.empty.
    elem = _C_EMPTY(size, dtype=dtype, device=_CPU,
                    memory_format=memory_format or torch.contiguous_format)
    return wrap(elem, index)


def _empty_strided(size, stride, *, dtype=None, layout=None, device=None, pin_memory=None):
    index = check_index(device.index if device is not None else None)
    dtype = dtype if dtype is not None else torch.get_default_dtype()
    check_float64(dtype)
    return wrap(_C_EMPTY_STRIDED(size, stride, dtype=dtype, device=_CPU), index)


def _copy_from(self, dst, non_blocking=False):
    # Reached with the Python dispatch key excluded, e.g. torch.tensor(data, device=...),
    # which builds the tensor on the CPU and copies it over inside an exclusion guard.
    src = self._elem if isinstance(self, EmuTensor) else self
    if isinstance(dst, EmuTensor):
        dst._elem.copy_(src, non_blocking)
    else:
        dst.copy_(src, non_blocking)
    return dst


def _copy_from_and_resize(self, dst):
    target = dst._elem if isinstance(dst, EmuTensor) else dst
    target.resize_(self.shape)
    if isinstance(dst, EmuTensor):
        sync_metadata(dst)
    return _copy_from(self, dst)


class DeviceModule:
    """``torch.privateuseone``: torch-directml 0.2.5's ``PrivateUse1Module`` API, emulated."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def is_initialized() -> bool:
        return True

    @staticmethod
    def device_count() -> int:
        return state.count

    @staticmethod
    def device_name(device_id: int) -> str:
        if 0 <= device_id < state.count:
            return f"dmlshim emulated DirectML adapter {device_id} (CPU)"
        return ""

    @staticmethod
    def default_device() -> int:
        return 0

    @staticmethod
    def current_device() -> int:
        return current_device()

    @staticmethod
    def device(device_id: Optional[int] = None) -> torch.device:
        if device_id is None:
            device_id = 0
        if not 0 <= device_id < state.count:
            raise Exception(  # torch-directml raises a bare Exception here
                f"Invalid device_id argument supplied {device_id}. device_id must be in range "
                f"[0, {state.count})."
            )
        return state.devices[device_id]

    @staticmethod
    def has_float64_support(device_id: int = 0) -> bool:
        return not state.float64

    @staticmethod
    def gpu_memory(device_id: int = 0, mb_per_tile: int = 1) -> list:
        return [_memory.allocated(device_id) / (1024 * 1024)]

    @staticmethod
    def is_autocast_enabled() -> bool:
        return False

    @staticmethod
    def get_autocast_dtype() -> torch.dtype:
        return torch.float16

    @staticmethod
    def set_autocast_enabled(enable: bool) -> None:
        pass

    @staticmethod
    def set_autocast_dtype(dtype: torch.dtype) -> None:
        pass

    @staticmethod
    def get_amp_supported_dtype() -> list:
        return [torch.float16]

    @staticmethod
    def _is_in_bad_fork() -> bool:
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        # torch-directml draws random numbers from the CPU generator and seeds it here.
        torch.default_generator.manual_seed(seed)

    @staticmethod
    def synchronize(device: Any = None) -> None:
        pass


def current_device() -> int:
    if _cpp_guard is not None:
        return int(_cpp_guard.current_device())
    return state.current_index


def _torch_version() -> tuple:
    return tuple(int(p) for p in torch.__version__.split("+")[0].split(".")[:2])


def _build_cpp_guard() -> Any:
    if shutil.which(os.environ.get("CXX", "g++")) is None and shutil.which("c++") is None:
        raise EmulatorError(
            f"dmlshim emulator: torch {torch.__version__} has no Python device guard for "
            "PrivateUse1, so the emulator builds a small C++ one (once, with "
            "torch.utils.cpp_extension), but no C++ compiler (g++) was found. Install g++ and "
            "ninja (pip install ninja), or use torch >= 2.5."
        )
    from torch.utils import cpp_extension

    source = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_guard.cpp")
    try:
        # The name carries the torch version and the source's hash: both CI lanes and other
        # checkouts share the torch extensions cache (py311_cpu), and one name would make them
        # rebuild on every switch and load each other's module.
        with open(source, "rb") as f:
            code = f.read()
        digest = hashlib.sha1(code).hexdigest()[:10]
        version = re.sub(r"\W", "_", torch.__version__)
        name = f"dmlshim_emulator_guard_{version}_{digest}"
        build_dir, stable_source = _build_place(cpp_extension, name, code)
        if build_dir is not None and \
                not os.path.exists(os.path.join(build_dir, name + _EXTENSION_SUFFIX)):
            # the first emulated-dml run of a torch version: a compile that takes a while
            import logging

            logging.getLogger("dmlshim").warning(
                "emulated-dml: building the emulator's C++ device guard for torch %s (once per "
                "torch version; it takes half a minute or so)", torch.__version__)
        return cpp_extension.load(name=name, sources=[stable_source or source],
                                  build_directory=build_dir, extra_cflags=["-O1"], verbose=False)
    except Exception as err:  # compiler errors, missing ninja, ...
        raise EmulatorError(
            f"dmlshim emulator: building the PrivateUse1 device guard for torch "
            f"{torch.__version__} failed ({type(err).__name__}: {err}). It needs g++ and ninja "
            f"(pip install ninja)."
        ) from err


_EXTENSION_SUFFIX = ".pyd" if sys.platform == "win32" else ".so"


def _build_place(cpp_extension: Any, name: str, code: bytes) -> tuple:
    """(torch's build folder for ``name``, a copy of the source there); None for what is not
    known or cannot be written.

    ninja rebuilds when the compile command changes, and the command names the source's path:
    checkouts (or virtualenvs) sharing the extensions cache would rebuild the guard for each
    other on every switch. A copy inside the build folder, whose name carries the source's hash,
    gives every checkout the same command, so the guard builds once per torch version."""
    where = getattr(cpp_extension, "_get_build_directory", None)  # torch's private helper
    if where is None:
        return None, None  # torch picks the folder; the package's file is the source
    build_dir = where(name, False)
    copy = os.path.join(build_dir, "_guard.cpp")
    try:
        with open(copy, "rb") as f:
            if f.read() == code:
                return build_dir, copy  # untouched: ninja sees the same input and command
    except OSError:
        pass
    try:
        tmp = f"{copy}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(code)
        os.replace(tmp, copy)  # atomic: a concurrent build reads a whole file
    except OSError:
        return build_dir, None  # a read-only cache folder: build from the package's file
    return build_dir, copy


def _install_python_guard() -> bool:
    """PyTorch's private Python device guard (torch >= 2.5); False if this torch lacks it."""
    try:
        from torch.utils.backend_registration import _DummyDeviceGuard

        register_guard = torch._C._acc.register_python_privateuseone_device_guard
    except (AttributeError, ImportError):
        return False
    register_guard(_DummyDeviceGuard())
    return True


def _install_python_hooks() -> None:
    # The rest of torch.utils.backend_registration._setup_privateuseone_for_python_backend,
    # minus generate_methods_for_privateuse1_backend (torch-directml adds no Tensor/Module
    # methods). The "rename" keeps the name: it only marks the PrivateUse1 backend as
    # registered, without which torch >= 2.5 finds no accelerator and backward() fails
    # ("Cannot access accelerator device when none is available").
    try:
        from torch.utils.backend_registration import _DummyPrivateUse1Hook

        register_hook = torch._C._acc.register_python_privateuseone_hook
    except (AttributeError, ImportError):
        return
    torch._C._rename_privateuse1_backend("privateuseone")
    register_hook(_DummyPrivateUse1Hook())


def _allow_foreach() -> None:
    # torch.optim defaults to foreach only when type(p) is in this private list; real
    # DirectML parameters are plain Tensors/Parameters and qualify (#604, #626).
    for modname in ("torch.optim.optimizer", "torch.utils._foreach_utils"):
        try:
            module = __import__(modname, fromlist=["_foreach_supported_types"])
            types = module._foreach_supported_types
            if EmuTensor not in types:
                types.append(EmuTensor)
        except (ImportError, AttributeError):
            pass


def install_device_guard(cpp: Optional[bool] = None, as_wheel: bool = False) -> str:
    """Register the PrivateUse1 device guard only (once); return "cpp" or "python".

    ``cpp=None``: the C++ guard (``_guard.cpp``, 8 adapters or more) on every torch; on
    torch >= 2.5 without a working compiler, PyTorch's Python guard instead, which reports a
    single device whose index is always 0 (backward() then works on ``privateuseone:0`` only,
    so ``register(count > 1)`` refuses), and lets an operator that raises inside backward()
    take the process down (``PythonDeviceGuard``'s noexcept ``exchangeStream`` calls into
    Python while the error is pending: std::terminate), where torch-directml and the C++
    guard raise the error to the caller. ``cpp=True`` insists on the C++ guard (an error
    when it cannot be built); ``cpp=False`` takes the Python one where torch has it.
    """
    global _cpp_guard, _guard_kind
    if _guard_kind:
        return _guard_kind
    if "torch_directml" in sys.modules and not as_wheel:
        raise EmulatorError("dmlshim emulator: torch_directml is imported; it has its own device "
                            "guard, the emulator's must not replace it")
    python_ok = _torch_version() >= (2, 5) and hasattr(getattr(torch._C, "_acc", None),
                                                        "register_python_privateuseone_device_guard")
    if cpp is False and python_ok and _install_python_guard():
        _guard_kind = "python"
        return _guard_kind
    try:
        _cpp_guard = _build_cpp_guard()
    except EmulatorError as err:
        if cpp or not python_ok or not _install_python_guard():
            raise
        import logging

        logging.getLogger("dmlshim").info(
            "%s; using PyTorch's Python device guard: backward() works on privateuseone:0 only",
            err)
        _guard_kind = "python"
        return _guard_kind
    _guard_kind = "cpp"
    return _guard_kind


def autograd_ready() -> bool:
    """Whether backward() works on ``privateuseone:0`` in this process.

    The autograd engine sizes its per-device queues once, at the first backward() of the
    process, from the device guards registered then; a process that ran a backward before the
    emulator's guard existed can never run one on the emulated device.
    """
    try:
        with torch.inference_mode(False), torch.enable_grad():
            x = wrap(torch.ones(1), 0).requires_grad_()
            (x * 2).sum().backward()
    except RuntimeError as err:
        if "device_ready_queues_" in str(err):
            return False
        raise
    return True


def _check_guard_covers(count: int) -> None:
    if count > 1 and _guard_kind == "python":
        raise EmulatorError(
            f"dmlshim emulator: {count} emulated adapters need the emulator's C++ device guard "
            "(PyTorch's Python guard knows one device: backward() on privateuseone:1 would hit "
            "an autograd INTERNAL ASSERT), and it could not be built: install g++ and ninja "
            "(pip install ninja), or use emulated-dml with one adapter"
        )


def install(device_module: Optional[type] = None) -> None:
    """Hook the emulator into PyTorch (once per process); ``device_module`` replaces
    :class:`DeviceModule` as ``torch.privateuseone`` (the stand-in wheel's)."""
    global _lib, _installed
    if _installed:
        if _cpp_guard is not None:
            _cpp_guard.set_device_count(state.count)
        _check_guard_covers(state.count)
        return
    if torch._C._get_privateuse1_backend_name() != "privateuseone":
        raise EmulatorError(
            "dmlshim emulator: the PrivateUse1 backend was renamed to "
            f"{torch._C._get_privateuse1_backend_name()!r}; torch-directml and the emulator "
            "need it to stay 'privateuseone'"
        )
    if hasattr(torch, "privateuseone"):
        raise EmulatorError(
            f"dmlshim emulator: another PrivateUse1 backend module is registered "
            f"({torch.privateuseone!r}); the emulator cannot register beside it"
        )
    install_device_guard(as_wheel=device_module is not None)
    if _cpp_guard is not None:
        _cpp_guard.set_device_count(state.count)
    _check_guard_covers(state.count)
    _install_python_hooks()
    torch._register_device_module("privateuseone", device_module or DeviceModule)
    _lib = torch.library.Library("aten", "IMPL")  # kept alive for the process
    _lib.impl("empty.memory_format", _empty_memory_format, "PrivateUse1")
    _lib.impl("empty_strided", _empty_strided, "PrivateUse1")
    # the wheel has a full kernel of its own (gap full-float), registered from C++: so is this
    # one (torch.library.Library.impl would refuse a guard's Python kernel over it)
    _lib.m.impl("full", "PrivateUse1", _full, False)
    _lib.impl("_copy_from", _copy_from, "PrivateUse1")
    _lib.impl("_copy_from_and_resize", _copy_from_and_resize, "PrivateUse1")
    _allow_foreach()
    if _cpp_guard is not None:  # the storage gap needs it (without: storage stays accessible)
        _tensor.refuse_storage = _cpp_guard.refuse_storage
        _tensor.set_metadata = _cpp_guard.set_metadata
    from emulated_dml import _generator, _ops  # noqa: F401 - _ops fills the op tables

    _generator.install()
    _installed = True
