"""Device arguments at torch's entry points: conversions, factories, generators, default device.

Only entry points are wrapped — never the ops inside a model's forward. Each wrapper looks at
its device argument(s), asks :func:`dmlshim.devicemap.map_device`, and calls the original.
"""

from __future__ import annotations

import importlib
from typing import Any, Dict, Optional, Tuple

import torch
import torch.utils._device as _torch_device

from dmlshim import devicemap, events
from dmlshim.devicemap import map_device
from dmlshim.patching import Patch, called_from_torch, get_original

# torch.* factories that take device= but are not in torch's own list of device constructors.
_EXTRA_FACTORIES = (
    "zeros_like", "ones_like", "empty_like", "full_like", "rand_like", "randn_like",
    "randint_like", "normal", "from_file", "sparse_compressed_tensor", "from_dlpack",
)
# Device-taking constructors in torch's submodules: (module, name, position of `device` when
# it may be passed positionally, else None).
_SUBMODULE_FACTORIES = (
    ("torch.fft", "fftfreq", None), ("torch.fft", "rfftfreq", None),
    ("torch.nested", "nested_tensor", None), ("torch.nested", "as_nested_tensor", 2),
)
TENSOR_NEW_METHODS = ("new", "new_tensor", "new_zeros", "new_ones", "new_empty", "new_full",
                      "new_empty_strided")


def factory_names() -> Tuple[str, ...]:
    # Prime torch's lru-cached list *before* patching: it holds the functions found in the torch
    # namespace, and `with torch.device(...)` modes compare against the originals.
    names = {f.__name__ for f in _torch_device._device_constructors()}
    names.update(n for n in _EXTRA_FACTORIES if hasattr(torch, n))
    return tuple(sorted(n for n in names if callable(getattr(torch, n, None))))


_DEVICE = torch.device


def _device_kwarg(api: str, position: Optional[int] = None):
    def wrapper(wrapped, instance, args, kwargs):
        # torch's own code calls these every step (autograd's ones_like, Adam's
        # torch.tensor(..., device="cpu")): arguments that cannot be CUDA devices are let
        # through here, without a call (devicemap.maybe_cuda, inlined).
        if position is not None and len(args) > position:
            first = args[position]
            cls = first.__class__
            if (cls is str and first.startswith("cuda")) or cls is int \
                    or (cls is _DEVICE and first.type == "cuda"):
                new = map_device(first, int_is_cuda=True)
                if new is not first:
                    args = args[:position] + (new,) + args[position + 1:]
                    events.redirected(api, first, new)
        dev = kwargs.get("device")
        if dev is not None:
            cls = dev.__class__
            if not ((cls is str and dev.startswith("cuda")) or cls is int
                    or (cls is _DEVICE and dev.type == "cuda")):
                return wrapped(*args, **kwargs)
            new = map_device(dev, int_is_cuda=True)
            if new is not dev:
                kwargs["device"] = new
                events.redirected(api, dev, new, arg="device")
        return wrapped(*args, **kwargs)

    return wrapper


def _cuda_arg(args: tuple, kwargs: Dict[str, Any]) -> Any:
    if args:
        return args[0]
    return kwargs.get("device")


class DevicesPatch(Patch):
    name = "devices"

    def applies(self, target) -> bool:
        return True  # on a real-CUDA target every wrapper is a pass-through (overhead runs)

    def _install(self, target, config) -> None:
        redirect = target.redirects
        t_to = get_original(torch.Tensor, "to")

        def tensor_cuda(wrapped, instance, args, kwargs):
            if not redirect:
                return wrapped(*args, **kwargs)
            arg = args[0] if args else kwargs.get("device")
            if arg is None:
                dev = devicemap.map_device("cuda")
            else:
                dev = devicemap.map_device(arg, int_is_cuda=True)
                if dev is arg:  # e.g. x.cuda("cpu"): let torch raise its own error
                    return wrapped(*args, **kwargs)
            events.redirected("Tensor.cuda", arg if arg is not None else "", dev)
            return t_to(instance, dev, non_blocking=kwargs.get("non_blocking", False),
                        memory_format=kwargs.get("memory_format", torch.preserve_format))

        m_to = get_original(torch.nn.Module, "to")

        def module_cuda(wrapped, instance, args, kwargs):
            if not redirect:
                return wrapped(*args, **kwargs)
            arg = _cuda_arg(args, kwargs)
            index = None if arg is None else devicemap.cuda_index(arg, int_is_cuda=True)
            if index is False:
                return wrapped(*args, **kwargs)
            dev = devicemap.device_for(index)  # type: ignore[arg-type]
            events.redirected("Module.cuda", arg if arg is not None else "", dev)
            return m_to(instance, dev)

        self.wrap(torch.Tensor, "cuda", tensor_cuda)
        self.wrap(torch.Tensor, "to", _device_kwarg("Tensor.to", position=0))
        self.wrap(torch.nn.Module, "cuda", module_cuda)
        self.wrap(torch.nn.Module, "to", _device_kwarg("Module.to", position=0))
        self.wrap(torch.nn.Module, "to_empty", _device_kwarg("Module.to_empty"))

        for name in factory_names():
            self.wrap(torch, name, _device_kwarg("torch." + name))
        for name in TENSOR_NEW_METHODS:
            self.wrap(torch.Tensor, name, _device_kwarg("Tensor." + name))
        for modname, name, position in _SUBMODULE_FACTORIES:
            module = importlib.import_module(modname)
            if hasattr(module, name):
                self.wrap(module, name, _device_kwarg(f"{modname}.{name}", position))

        self._install_is_cuda(target)
        self._install_generator(target)
        self._install_default_device()
        self._install_pin_memory(target)

    # -- x.is_cuda -------------------------------------------------------------------------
    def _install_is_cuda(self, target) -> None:
        if not target.redirects:
            return
        real = torch._C.TensorBase.is_cuda  # a getset descriptor

        def is_cuda(self_tensor) -> bool:
            if called_from_torch():
                return real.__get__(self_tensor)
            return devicemap.is_target_device(self_tensor.device)

        self.replace(torch.Tensor, "is_cuda", property(is_cuda, doc=real.__doc__))

    # -- torch.Generator(device=...) -------------------------------------------------------
    def _install_generator(self, target) -> None:
        if not target.redirects:
            return
        base = torch.Generator
        # torch-directml refuses privateuseone generators (#374) and draws device random
        # numbers from the CPU generator, so a "CUDA" generator becomes a CPU one.
        generator_device = torch.device("cpu")

        class _GeneratorMeta(type(base)):  # type: ignore[misc]
            # generators made before install, or by torch itself, are still torch.Generators
            def __instancecheck__(cls, obj: object) -> bool:
                return isinstance(obj, base)

            def __subclasscheck__(cls, sub: type) -> bool:
                return issubclass(sub, base)

        class Generator(base, metaclass=_GeneratorMeta):  # type: ignore[misc, valid-type]
            __doc__ = base.__doc__

            def __new__(cls, device="cpu"):  # noqa: D102
                if devicemap.is_cuda_device(device, int_is_cuda=True):
                    events.redirected("torch.Generator", device, generator_device)
                    device = generator_device
                return base.__new__(cls, device)

            def __init__(self, device="cpu"):
                pass

        Generator.__name__ = Generator.__qualname__ = "Generator"
        Generator.__module__ = "torch"
        self.replace(torch, "Generator", Generator)

    # -- with torch.device("cuda"): / torch.set_default_device("cuda") ---------------------
    def _install_default_device(self) -> None:
        def first_arg_device(api: str):
            def wrapper(wrapped, instance, args, kwargs):
                dev = args[0] if args else kwargs.get("device")
                new = map_device(dev, int_is_cuda=True) if dev is not None else dev
                if new is not dev:
                    events.redirected(api, dev, new)
                return wrapped(new)

            return wrapper

        self.wrap(_torch_device.DeviceContext, "__init__", first_arg_device("torch.device context"))
        self.wrap(torch, "set_default_device", first_arg_device("torch.set_default_device"))

    # -- pin_memory ------------------------------------------------------------------------
    def _install_pin_memory(self, target) -> None:
        if not target.redirects:
            return

        def pin_memory(wrapped, instance, args, kwargs):
            # Page-locked host memory only speeds up host->CUDA copies; there is no CUDA here.
            events.redirected("Tensor.pin_memory", "pin_memory()", "no-op", tag="dropped")
            return instance

        self.wrap(torch.Tensor, "pin_memory", pin_memory)
