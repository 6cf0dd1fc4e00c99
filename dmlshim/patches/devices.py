"""The one owner of torch's device-taking entry points: each is wrapped here, once.

A call runs the rewriters of :mod:`dmlshim.conversions` in their order (the device rule, then
the dtype and memory-format rules other areas register) and records one event. Never the ops
inside a model's forward. The ``.cuda``-like paths whose meaning belongs to another area --
``Tensor.type`` with a legacy CUDA type, ``Storage.cuda``, ``Tensor.share_memory_`` -- are
wrapped here too and ask that area's policy (the session's
:attr:`dmlshim.conversions.Rewriters.policies`).

torch's own per-step code calls factories too (autograd's ``_make_grads``: ``torch.ones_like``;
the optimizers' ``torch.tensor(1.0, device="cpu")`` and ``zeros_like``), always with devices
taken from tensors, never a script's "cuda". Those modules (:data:`TORCH_INTERNALS`) get, as
their global ``torch``, a module object holding torch's attributes with the factories' originals
(:func:`truth_namespace`): their calls reach torch's C functions with no shim frame at all, and
an attribute torch gains later is looked up once (then kept). The emulator and the shim's own
kernels call ``torch._C._VariableFunctions`` directly.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import torch.storage as _storage
import torch.utils._device as _torch_device

from dmlshim import conversions, current, devicemap, events
from dmlshim.devicemap import map_device
from dmlshim.patches.oom import reraise as oom_reraise
from dmlshim.patching import Owns, Patch, called_from_torch, get_original

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
# torch modules whose per-step code calls torch factories with tensors' devices (never a
# script's): they see torch's originals (module global ``torch`` -> :func:`truth_namespace`).
# Not the ones that take a device from their caller (GradScaler(device=), swa_utils).
# (those of this torch that use the global `torch`: adamw on torch 2.14, lr_scheduler do not)
TORCH_INTERNALS = tuple(name for name in ("torch.autograd",) + tuple("torch.optim." + m for m in (
    "optimizer", "adam", "adamw", "sgd", "adagrad", "adadelta", "adamax", "asgd", "nadam",
    "radam", "rmsprop", "rprop", "sparse_adam", "lr_scheduler"))
    if vars(importlib.import_module(name)).get("torch") is torch)
TENSOR_NEW_METHODS = ("new", "new_tensor", "new_zeros", "new_ones", "new_empty", "new_full",
                      "new_empty_strided")


def factory_names() -> Tuple[str, ...]:
    # Prime torch's lru-cached list *before* patching: it holds the functions found in the torch
    # namespace, and `with torch.device(...)` modes compare against the originals.
    names = {f.__name__ for f in _torch_device._device_constructors()}
    names.update(n for n in _EXTRA_FACTORIES if hasattr(torch, n))
    return tuple(sorted(n for n in names if callable(getattr(torch, n, None))))


_DEVICE = torch.device
_DTYPE = torch.dtype
_PRESERVE = torch.preserve_format
# Factories whose result dtype comes from their data, not from dtype= or the default dtype.
_INFERRING = ("tensor", "as_tensor", "asarray")


# What a device-argument call does after the device rule: the rules of a torch factory, of
# Tensor.to, of Tensor.new_*, or none (Module.to, submodule factories).
FACTORY, TENSOR_TO, NEW_METHOD, DEVICE_ONLY = "factory", "Tensor.to", "Tensor.new_*", "device"


def _device_kwarg(rw: conversions.Rewriters, api: str, position: Optional[int] = None,
                  name: str = "", kind: str = DEVICE_ONLY):
    """The wrapper of a call taking ``device=`` (or a device at ``position``): the device rule,
    then the dtype and memory-format rules of its ``kind`` (``name``: a factory's torch name),
    then the call's one event. One body for every such entry point, so the device rule's inline
    pre-check is written once."""
    if name:
        kind = FACTORY
    infers = name in _INFERRING
    likes = name.endswith("_like")
    positional_dtype = name == "as_tensor"  # as_tensor(data, dtype=None, device=None)

    def wrapper(wrapped, instance, args, kwargs):
        try:
            # torch's own code calls these every step (autograd's ones_like, Adam's
            # torch.tensor(..., device="cpu")): arguments that cannot be CUDA devices are let
            # through here, without a call (devicemap.maybe_cuda, inlined).
            moved = None  # (argument as passed, what it became, keyword): recorded once, below
            if position is not None and len(args) > position:
                first = args[position]
                cls = first.__class__
                if (cls is str and first.startswith("cuda")) or cls is int \
                        or (cls is _DEVICE and first.type == "cuda"):
                    new = map_device(first, int_is_cuda=True)
                    if new is not first:
                        args = args[:position] + (new,) + args[position + 1:]
                        moved = (first, new, "")
            dev = kwargs.get("device")
            if dev is not None:
                cls = dev.__class__
                if (cls is str and dev.startswith("cuda")) or cls is int \
                        or (cls is _DEVICE and dev.type == "cuda"):
                    new = map_device(dev, int_is_cuda=True)
                    if new is not dev:
                        kwargs["device"] = new
                        moved = (dev, new, "device")
                        dev = new
            rules = rw.dtype_rules
            if kind is FACTORY:
                if rules:
                    # the dtype rules, only when the result could have one of their dtypes
                    dtype = kwargs.get("dtype")
                    if dtype is not None:
                        hit = dtype in rules
                    elif positional_dtype and len(args) > 1:
                        hit = True
                    elif likes:
                        hit = bool(args) and getattr(args[0], "dtype", None) in rules
                    elif infers:
                        hit = not (dev.__class__ is str and dev == "cpu"
                                   or dev.__class__ is _DEVICE and dev.type == "cpu")
                    else:
                        hit = torch.get_default_dtype() in rules
                    if hit:
                        return rw.call_factory(name, wrapped, args, kwargs, moved)
            elif kind is TENSOR_TO:
                if kwargs.get("non_blocking"):
                    # the guards' policy: a non-blocking copy out of a DirectML tensor
                    # comes back unfinished (see dmlshim.patches.guards)
                    blocking = rw.policies.get("Tensor.to non_blocking")
                    if blocking is not None and blocking(instance):
                        kwargs["non_blocking"] = False
                if rules or rw.memory_format_rule is not None:
                    hit = instance.dtype in rules or kwargs.get("dtype") in rules \
                        or kwargs.get("memory_format") is not None
                    if not hit:
                        for a in args:
                            if (a.__class__ is _DTYPE and a in rules) \
                                    or (isinstance(a, torch.Tensor) and a.dtype in rules):
                                hit = True
                                break
                    if hit:
                        rewritten = rw.rewrite_to(api, instance, args, kwargs, moved)
                        if rewritten is not None:
                            return wrapped(*rewritten[0], **rewritten[1])
            elif kind is NEW_METHOD:
                dtype = kwargs.get("dtype")
                if dtype is not None and dtype in rules:
                    new_dtype = rw.dtype_for(
                        api, dtype, dev if dev is not None else instance.device)
                    if new_dtype is not None:
                        conversions.record(api, moved, (dtype, new_dtype))
                        return wrapped(*args, **dict(kwargs, dtype=new_dtype))
            if moved is not None:
                shim = current.session
                if shim is None or shim.events.trace:
                    events.redirected(api, moved[0], moved[1], arg=moved[2])
                else:  # events.redirected's count, inline
                    records = shim.events
                    records.api_counts[api] += 1
                    records.tag_counts["redirected"] += 1
                    records.api_tags[api] = "redirected"
            return wrapped(*args, **kwargs)
        except RuntimeError as exc:  # DirectML's untyped OOM becomes CUDA's
            oom_reraise(exc)
            raise

    return wrapper


def truth_namespace(originals: Dict[str, Any]) -> types.ModuleType:
    """A module object with torch's attributes, ``originals`` over them (for torch's modules).

    Attribute hits are dict lookups in C (no Python frame); a miss (a submodule torch imports
    later, e.g. ``torch._dynamo``) is taken from torch once and kept.
    """
    ns = types.ModuleType("torch", torch.__doc__)
    namespace = vars(ns)
    namespace.update(vars(torch))
    namespace.update(originals)

    def __getattr__(name: str) -> Any:  # noqa: N807 - PEP 562 module __getattr__
        value = getattr(torch, name)
        if not name.startswith("__"):
            namespace[name] = value
        return value

    namespace["__getattr__"] = __getattr__
    return ns


def _cuda_method(rw: conversions.Rewriters, api: str, move: Optional[Callable[..., Any]] = None,
                 tensor: bool = False, policy: str = ""):
    """The wrapper of a ``.cuda(device=None, ...)`` method, the one place where a ``.cuda()``
    argument becomes the target device: its CUDA ordinal (none: the current device) ->
    :func:`dmlshim.devicemap.map_device` -> the call's one event -> the move.

    ``tensor``: ``move`` is ``Tensor.to`` (``move(t, device, dtype, non_blocking=,
    memory_format=)``), after the dtype and memory-format rules; else ``move(instance,
    device)``, or the area policy ``policy`` of the session's rewriters (calls go to torch while
    no area registered one).
    """

    def wrapper(wrapped, instance, args, kwargs):
        try:
            carry = move
            if policy:
                carry = rw.policies.get(policy)
                if carry is None:
                    return wrapped(*args, **kwargs)
            arg = args[0] if args else kwargs.get("device")
            if arg is None:
                dev = map_device("cuda")
            else:
                dev = map_device(arg, int_is_cuda=True)
                if dev is arg:  # e.g. x.cuda("cpu"): let torch raise its own error
                    return wrapped(*args, **kwargs)
            shown = arg if arg is not None else ""
            if not tensor:
                events.redirected(api, shown, dev)
                return carry(instance, dev)  # type: ignore[misc]
            dtype = instance.dtype
            memory_format = kwargs.get("memory_format", _PRESERVE)
            if dtype in rw.dtype_rules or memory_format is not _PRESERVE:
                dtype, memory_format = _tensor_rules(rw, api, (shown, dev, ""), dtype, dev,
                                                     memory_format)
            else:
                events.redirected(api, shown, dev)
            return carry(instance, dev, dtype,  # type: ignore[misc]
                         non_blocking=kwargs.get("non_blocking", False), memory_format=memory_format)
        except RuntimeError as exc:  # DirectML's untyped OOM becomes CUDA's
            oom_reraise(exc)
            raise

    return wrapper


def _tensor_rules(rw: conversions.Rewriters, api: str, moved: Tuple[Any, Any, str],
                  dtype: torch.dtype, dev: torch.device,
                  memory_format: Any) -> Tuple[torch.dtype, Any]:
    """The dtype and memory-format rules for a tensor of ``dtype`` entering ``dev`` (the
    device rule made ``moved``), and the call's one event: the (dtype, memory_format) to use."""
    new_dtype = dtype
    if dtype in rw.dtype_rules:
        new_dtype = rw.dtype_for(api, dtype, dev) or dtype
    dropped = None
    if memory_format is not _PRESERVE and rw.memory_format_for(api, memory_format, dev):
        dropped, memory_format = memory_format, _PRESERVE
    conversions.record(api, moved, (dtype, new_dtype) if new_dtype is not dtype else None,
                       dropped)
    return new_dtype, memory_format


def _tensor_type(rw: conversions.Rewriters, t_to: Any):
    """``Tensor.type``: a CUDA legacy tensor type (the ``"Tensor.type"`` policy names its dtype)
    means the current CUDA device and that dtype; any other argument is torch's."""

    def wrapper(wrapped, instance, args, kwargs):
        try:
            arg = args[0] if args else kwargs.get("dtype")
            policy = rw.policies.get("Tensor.type")
            # a torch.dtype (x.type(y.dtype): YOLOv8's loss) is never a legacy type: no call
            dtype = policy(arg) if policy is not None and arg is not None \
                and type(arg) is not _DTYPE else None
            if dtype is None:
                return wrapped(*args, **kwargs)
            dev = map_device("cuda")
            dtype, _ = _tensor_rules(rw, "Tensor.type", (arg, dev, ""), dtype, dev, _PRESERVE)
            return t_to(instance, device=dev, dtype=dtype,
                        non_blocking=kwargs.get("non_blocking", False))
        except RuntimeError as exc:  # DirectML's untyped OOM becomes CUDA's
            oom_reraise(exc)
            raise

    return wrapper


def _share_memory(rw: conversions.Rewriters):
    """``Tensor.share_memory_``: a no-op where the storage area's policy says the tensor's memory
    cannot be shared (a DirectML tensor), as it is for a CUDA tensor."""

    def wrapper(wrapped, instance, args, kwargs):
        refuses = rw.policies.get("Tensor.share_memory_")
        if refuses is not None and refuses(instance):
            events.redirected("Tensor.share_memory_", "share_memory_()", "no-op", tag="dropped")
            return instance
        return wrapped(*args, **kwargs)

    return wrapper


def _dtype_method(rw: conversions.Rewriters, api: str, dtype: torch.dtype, t_to: Any):
    def wrapper(wrapped, instance, args, kwargs):
        try:
            if dtype in rw.dtype_rules:
                new = rw.dtype_for(api, dtype, instance.device)
                if new is not None:
                    conversions.record(api, None, (dtype, new))
                    return t_to(instance, new, copy=True, **kwargs)
            return wrapped(*args, **kwargs)
        except RuntimeError as exc:  # DirectML's untyped OOM becomes CUDA's
            oom_reraise(exc)
            raise

    return wrapper


class DevicesPatch(Patch):
    name = "devices"
    owns = (Owns("torch.Tensor", ("cuda", "type", "to", "double", "bfloat16", "share_memory_",
                                "is_cuda", "pin_memory") + TENSOR_NEW_METHODS),
            Owns("torch.nn.Module", ("cuda", "to", "to_empty")),
            Owns("torch.storage._StorageBase", ("cuda",)),
            Owns("torch", factory_names() + ("Generator", "set_default_device")),
            Owns("torch.utils._device.DeviceContext", ("__init__",)))
    owns += tuple(Owns(module, (name,)) for module, name, _ in _SUBMODULE_FACTORIES)
    owns += tuple(Owns(module, ("torch",)) for module in TORCH_INTERNALS)

    def applies(self, caps) -> bool:
        return caps.redirects  # on real CUDA every wrapper would be a pass-through

    def _install(self, caps, config) -> None:
        # the session's rules: the wrappers read them where the areas register them
        rw = current.session.rewriters
        t_to = get_original(torch.Tensor, "to")
        self.wrap(torch.Tensor, "cuda", _cuda_method(rw, "Tensor.cuda", t_to, tensor=True))
        # x.type(torch.cuda.FloatTensor): legacy typed CUDA tensors (cuda_api's policy)
        self.wrap(torch.Tensor, "type", _tensor_type(rw, t_to))
        self.wrap(torch.Tensor, "to", _device_kwarg(rw, "Tensor.to", position=0, kind=TENSOR_TO))
        # Module.to/.cuda convert each tensor with Tensor.to: the dtype and memory-format rules
        # run there, once per tensor, attributed to the script's model.to() line.
        self.wrap(torch.nn.Module, "cuda",
                  _cuda_method(rw, "Module.cuda", get_original(torch.nn.Module, "to")))
        # TypedStorage.cuda delegates to its untyped storage's cuda(), so this covers both;
        # serialization's policy places the storage (inside a DirectML load: afterwards).
        self.wrap(_storage._StorageBase, "cuda",
                  _cuda_method(rw, "Storage.cuda", policy="Storage.cuda"))
        self.wrap(torch.nn.Module, "to", _device_kwarg(rw, "Module.to", position=0))
        self.wrap(torch.nn.Module, "to_empty", _device_kwarg(rw, "Module.to_empty"))

        for name in factory_names():
            self.wrap(torch, name, _device_kwarg(rw, "torch." + name, name=name))
        for name in TENSOR_NEW_METHODS:
            if hasattr(torch.Tensor, name):
                self.wrap(torch.Tensor, name,
                          _device_kwarg(rw, "Tensor." + name, kind=NEW_METHOD))
        if caps.directml:
            # x.double() / x.bfloat16() of a device tensor (Module.double() calls them)
            for name, dtype in (("double", torch.float64), ("bfloat16", torch.bfloat16)):
                self.wrap(torch.Tensor, name, _dtype_method(rw, "Tensor." + name, dtype, t_to))
        for modname, name, position in _SUBMODULE_FACTORIES:
            module = importlib.import_module(modname)
            if hasattr(module, name):
                self.wrap(module, name, _device_kwarg(rw, f"{modname}.{name}", position))

        if caps.directml:
            self.wrap(torch.Tensor, "share_memory_", _share_memory(rw))
        self._install_is_cuda(caps)
        self._install_generator(caps)
        self._install_default_device()
        self._install_pin_memory(caps)
        self._install_truth_namespace()

    # -- torch's own factory calls ---------------------------------------------------------
    def _install_truth_namespace(self) -> None:
        ns = truth_namespace({name: get_original(torch, name) for name in factory_names()})
        for modname in TORCH_INTERNALS:
            module = sys.modules.get(modname)
            if module is not None and vars(module).get("torch") is torch:
                self.replace(module, "torch", ns)

    # -- x.is_cuda -------------------------------------------------------------------------
    def _install_is_cuda(self, caps) -> None:
        if not caps.redirects:
            return
        real = torch._C.TensorBase.is_cuda  # a getset descriptor

        def is_cuda(self_tensor) -> bool:
            if called_from_torch():
                return real.__get__(self_tensor)
            return devicemap.is_target_device(self_tensor.device)

        self.replace(torch.Tensor, "is_cuda", property(is_cuda, doc=real.__doc__))

    # -- torch.Generator(device=...) -------------------------------------------------------
    def _install_generator(self, caps) -> None:
        if not caps.redirects:
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
    def _install_pin_memory(self, caps) -> None:
        if not caps.redirects:
            return

        def pin_memory(wrapped, instance, args, kwargs):
            # Page-locked host memory only speeds up host->CUDA copies; there is no CUDA here.
            events.redirected("Tensor.pin_memory", "pin_memory()", "no-op", tag="dropped")
            return instance

        self.wrap(torch.Tensor, "pin_memory", pin_memory)
