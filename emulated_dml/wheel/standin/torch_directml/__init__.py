"""Stand-in for torch-directml 0.2.5's package, built by emulated_dml.wheel (not the wheel).

Same import sequence as the wheel's ``__init__.py``: load ``libdirectml.so`` from this folder
with ``torch.ops.load_library`` (the loader then needs ``libd3d12.so`` and ``libdxcore.so``:
plain Linux raises ``OSError``, this folder's stubs on ``LD_LIBRARY_PATH`` make every device
call raise ``RuntimeError: Unknown error <n>``, WSL's libraries found through the loader cache
work), import the native module, then register the ``privateuseone`` device module. The device
itself is emulated_dml's emulator, registered by the native module when the libraries report
adapters.
"""

import os
import sys

import torch
from torch._C import default_generator
from torch.storage import _StorageBase

current_module = sys.modules[__name__]

directml_dll = os.path.join(os.path.dirname(__file__), "libdirectml.so")
torch.ops.load_library(directml_dll)

import torch_directml_native  # noqa: E402

from . import device as _device  # noqa: E402
from .device import *  # noqa: E402,F403
from .device import default_device, device  # noqa: E402

__version__ = "0.2.5.dev240914+emulated"


class PrivateUse1Module:
    """The wheel's device module (``torch.privateuseone``), method for method."""

    # the same functions as device.py's (the wheel writes them out twice)
    is_available = staticmethod(_device.is_available)
    device_count = staticmethod(_device.device_count)
    device_name = staticmethod(_device.device_name)
    default_device = staticmethod(_device.default_device)
    device = staticmethod(_device.device)
    disable_tiled_resources = staticmethod(_device.disable_tiled_resources)
    has_float64_support = staticmethod(_device.has_float64_support)
    gpu_memory = staticmethod(_device.gpu_memory)

    @staticmethod
    def is_autocast_enabled():
        return False

    @staticmethod
    def get_autocast_dtype():
        return torch.float16

    @staticmethod
    def set_autocast_enabled(enable):
        pass

    @staticmethod
    def set_autocast_dtype(dtype):
        pass

    @staticmethod
    def get_amp_supported_dtype():
        return [torch.float16]

    @staticmethod
    def _is_in_bad_fork():
        return False

    @staticmethod
    def manual_seed_all(seed: int) -> None:
        default_generator.manual_seed(seed)  # the wheel draws from the CPU generator

    def _dml(self, dev=None, non_blocking=False, **kwargs):
        non_blocking = torch._utils._get_async_or_non_blocking("privateuseone", non_blocking,
                                                               kwargs)
        dml_device = device(default_device()) if dev is None else device(dev)
        with dml_device:
            if self.is_sparse:
                raise RuntimeError("UntypedStorage sparse copy is not supported.")
            untyped_storage = torch.UntypedStorage(self.size())
            untyped_storage.copy_(self, non_blocking)
            return untyped_storage


_StorageBase.privateuseone = PrivateUse1Module._dml
torch_directml_native._register(PrivateUse1Module)
