"""Stand-in for torch-directml's native extension ``torch_directml_native`` (emulated_dml.wheel).

Device calls go through the stand-in's ``libdirectml.so`` (loaded by ``torch_directml``), which
asks ``libdxcore.so``/``libd3d12.so`` for adapters: a failing HRESULT raises ``RuntimeError:
Unknown error <n>`` as the wheel's does. When the libraries report adapters, :func:`_register`
registers emulated_dml's emulator as the PrivateUse1 device with the wheel's device module.
Emulator switches: ``EMULATED_DML_SWITCHES`` (comma list; default: the emulator's gaps), with
``float64`` set from what the library reports for adapter 0, and the memory limit of each
adapter from the video memory it reports.
"""

import ctypes
import os

import torch

_LIB_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "torch_directml",
                         "libdirectml.so")
_lib = ctypes.CDLL(_LIB_PATH)  # the handle torch.ops.load_library opened
SWITCHES_ENV = "EMULATED_DML_SWITCHES"


def _checked(hr: int) -> int:
    if hr < 0:
        raise RuntimeError(f"Unknown error {hr}")
    return hr


def get_device_count() -> int:
    return _checked(_lib.dml_get_device_count())


def get_device_name(device_id: int) -> str:
    buf = ctypes.create_string_buffer(128)
    n = _checked(_lib.dml_get_device_name(int(device_id), buf, len(buf)))
    return buf.raw[:n].decode("utf-8")  # with the trailing NUL, as the wheel returns it


def get_default_device() -> int:
    return 0


def custom_device(device_id: int):
    return torch.device("privateuseone", int(device_id))


def has_float64_support(device_id: int) -> bool:
    return bool(_checked(_lib.dml_has_float64_support(int(device_id))))


def get_gpu_memory(device_id: int, mb_per_tile: int) -> list:
    get_device_count()
    from emulated_dml import _memory

    return [_memory.allocated(int(device_id)) / (1024 * 1024)]


def disable_tiled_resources(is_disabled: bool) -> None:
    get_device_count()


def _register(module) -> None:
    try:
        count = get_device_count()
    except RuntimeError:
        count = 0  # the stubs: the module is registered, every device call raises
    if count < 1:
        torch._register_device_module("privateuseone", module)
        return
    import emulated_dml
    from emulated_dml import _compat

    raw = os.environ.get(SWITCHES_ENV)
    names = set(emulated_dml.GAPS if raw is None else
                (s.strip() for s in raw.split(",") if s.strip()))
    if has_float64_support(0):
        names.discard("float64")
    else:
        names.add("float64")
    emulated_dml.register(count, names, device_module=module)
    _compat.fix_parameter_instancecheck()
    mib = _checked(_lib.dml_get_adapter_memory_mib(0))
    if mib:  # the adapter's video memory: past it, the wheel's untyped out-of-memory error
        from emulated_dml import _memory

        _memory.set_limit(mib * 1024 * 1024)
