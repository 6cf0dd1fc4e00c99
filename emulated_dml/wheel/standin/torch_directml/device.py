"""torch-directml 0.2.5's ``device.py``, as the wheel has it (on the stand-in's native module)."""

import torch_directml_native

__all__ = ["is_available", "device_count", "device_name", "default_device", "device",
           "disable_tiled_resources", "has_float64_support", "gpu_memory"]


def is_available() -> bool:
    if not hasattr(torch_directml_native, "get_device_count"):
        return False
    return torch_directml_native.get_device_count() > 0


def device_count() -> int:
    if is_available():
        return torch_directml_native.get_device_count()
    return 0


def device_name(device_id) -> str:
    if device_id >= 0 and device_id < device_count():
        return torch_directml_native.get_device_name(device_id)
    return ""


def default_device() -> int:
    return torch_directml_native.get_default_device()


def device(device_id=None):
    num_devices = device_count()
    if device_id is None:
        return torch_directml_native.custom_device(default_device())
    if device_id >= 0 and device_id < num_devices:
        return torch_directml_native.custom_device(device_id)
    raise Exception(f"Invalid device_id argument supplied {device_id}. device_id must be in "
                    f"range [0, {num_devices}).")


def disable_tiled_resources(is_disabled):
    torch_directml_native.disable_tiled_resources(is_disabled)


def has_float64_support(device_id=default_device()):  # noqa: B008 - evaluated at import, as in the wheel
    return torch_directml_native.has_float64_support(device_id)


def gpu_memory(device_id=default_device(), mb_per_tile=1):  # noqa: B008
    return torch_directml_native.get_gpu_memory(device_id, mb_per_tile)
