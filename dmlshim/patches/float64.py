"""float64 on DirectML adapters without it: ``DMLSHIM_FLOAT64`` = ``keep`` | ``float32``.

Many adapters have no float64: torch-directml raises "The GPU device does not support Double
(Float64) operations!" (microsoft/DirectML#430, #438, #699) or silently computes at float32
precision (#398). CUDA scripts make double tensors without meaning to: ``torch.from_numpy`` of a
numpy array, ``torch.tensor(np_array)``, ``dtype=torch.float64`` in a loss or metric.

* ``keep`` (default): nothing changes; double tensors reach the adapter, which fails as above.
* ``float32``: on an adapter without float64 (``torch_directml.has_float64_support(i)`` false;
  the emulator when its ``float64`` gap is on), a double tensor is made float32 as it ENTERS the
  device, with one warning per call site. Entry points: ``Tensor.to`` (device and/or dtype),
  ``Tensor.cuda``, ``Tensor.double`` of a device tensor (also ``Module.double()``), the factories
  (``torch.zeros(..., dtype=torch.float64, device="cuda")``, ``torch.tensor(np_array,
  device="cuda")``, ``*_like``, ``Tensor.new_*``, factories under ``torch.set_default_dtype(
  torch.float64)``). Ops on device tensors that ask for float64 themselves (``x.sum(
  dtype=torch.float64)``) are not rewritten: that would need a wrapper on every op.

Nothing is installed when no adapter lacks float64 or the option is ``keep``. The wrappers sit
on top of the device patch's wrappers of the same entry points (``Patch.wrap`` layers them).
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from dmlshim import devicemap, events
from dmlshim.patches.devices import TENSOR_NEW_METHODS, factory_names
from dmlshim.patching import Patch

log = logging.getLogger("dmlshim")

F64 = torch.float64
F32 = torch.float32
_MISSING = object()
# Factories whose result dtype comes from their data, not from dtype= or the default dtype.
_INFERRING = ("tensor", "as_tensor", "asarray")


def adapters_without_float64(target: Any, config: Any) -> frozenset:
    """Indices of the target's adapters that have no float64."""
    if target.kind == "dml":
        return frozenset(i for i in range(target.count) if not target.has_float64(i))
    if target.kind == "emulated-dml" and "float64" in config.emulator_switches():
        return frozenset(range(target.count))
    return frozenset()


class Float64Patch(Patch):
    name = "float64"

    def applies(self, target) -> bool:
        return target.is_directml

    def _install(self, target, config) -> None:
        lacking = adapters_without_float64(target, config)
        if not lacking:
            return
        if config.float64 == "keep":
            log.info("adapter(s) %s have no float64; DMLSHIM_FLOAT64=keep: double tensors fail "
                     "there (DMLSHIM_FLOAT64=float32 downcasts them)", sorted(lacking))
            return
        device_type = target.device_type

        def lacks(dev: Any) -> bool:
            """Whether a tensor made on ``dev`` (any device argument) lands on such an adapter."""
            if dev is None:
                return False
            dev = devicemap.map_device(dev, int_is_cuda=True)
            if isinstance(dev, str):
                dev = torch.device(dev)
            if not isinstance(dev, torch.device) or dev.type != device_type:
                return False
            index = dev.index if dev.index is not None else devicemap.current_index()
            return index in lacking

        self.lacks = lacks

        # -- conversions -------------------------------------------------------------------
        def tensor_to(wrapped, instance, args, kwargs):
            asked = kwargs.get("dtype") is F64
            if not asked:
                for a in args:
                    if a is F64:
                        asked = True
                        break
            if not asked and instance.dtype is not F64:
                return wrapped(*args, **kwargs)
            dev, dtype, rest = _parse_to(args, kwargs)
            result_dtype = dtype if dtype is not None else instance.dtype
            if result_dtype is not F64 or not lacks(dev if dev is not None else instance.device):
                return wrapped(*args, **kwargs)
            _downcast_note("Tensor.to")
            head = (dev, F32) if dev is not None else (F32,)
            return wrapped(*head, **rest)

        def tensor_cuda(wrapped, instance, args, kwargs):
            if instance.dtype is not F64:
                return wrapped(*args, **kwargs)
            arg = args[0] if args else kwargs.get("device")
            dev = "cuda" if arg is None else arg
            if not lacks(dev):
                return wrapped(*args, **kwargs)
            _downcast_note("Tensor.cuda")
            return instance.float().cuda(*args, **kwargs)

        def tensor_double(wrapped, instance, args, kwargs):
            if not lacks(instance.device):
                return wrapped(*args, **kwargs)
            _downcast_note("Tensor.double")
            return instance.to(F32, copy=True, **kwargs)

        self.wrap(torch.Tensor, "to", tensor_to)
        self.wrap(torch.Tensor, "cuda", tensor_cuda)
        self.wrap(torch.Tensor, "double", tensor_double)

        # -- factories ---------------------------------------------------------------------
        for name in factory_names():
            self.wrap(torch, name, self._factory(name))
        for name in TENSOR_NEW_METHODS:
            if hasattr(torch.Tensor, name):
                self.wrap(torch.Tensor, name, self._new_method("Tensor." + name))

    def _factory(self, name: str):
        api = "torch." + name
        infers = name in _INFERRING
        likes = name.endswith("_like")
        lacks = self.lacks

        def wrapper(wrapped, instance, args, kwargs):
            dtype = kwargs.get("dtype")
            dev = kwargs.get("device")
            if name == "as_tensor" and len(args) > 1:  # as_tensor(data, dtype=None, device=None)
                dtype = args[1] if dtype is None else dtype
                dev = args[2] if len(args) > 2 and dev is None else dev
            if dtype is not None and dtype is not F64:
                return wrapped(*args, **kwargs)
            if dtype is None:
                if likes:
                    if not (args and getattr(args[0], "dtype", None) is F64):
                        return wrapped(*args, **kwargs)
                elif not infers and torch.get_default_dtype() is not F64:
                    return wrapped(*args, **kwargs)
            if dev is None:
                dev = torch.get_default_device()
            if not lacks(dev):
                return wrapped(*args, **kwargs)
            if name == "as_tensor" and len(args) > 1:
                args = (args[0],)
                kwargs = dict(kwargs, dtype=dtype, device=dev)
            if dtype is F64 or likes:
                _downcast_note(api)
                return wrapped(*args, **dict(kwargs, dtype=F32))
            if infers:
                return self._inferred(wrapped, api, args, kwargs, dev)
            # default dtype is float64: learn the result dtype on the meta device (no data)
            probe_kwargs = {k: v for k, v in kwargs.items()
                            if k not in ("generator", "pin_memory", "requires_grad", "out")}
            try:
                probe = wrapped(*args, **dict(probe_kwargs, device="meta"))
            except Exception:  # noqa: BLE001 - no probe: leave the call as it is
                return wrapped(*args, **kwargs)
            if getattr(probe, "dtype", None) is not F64:
                return wrapped(*args, **kwargs)
            _downcast_note(api)
            return wrapped(*args, **dict(kwargs, dtype=F32))

        return wrapper

    def _inferred(self, wrapped, api: str, args: tuple, kwargs: dict, dev: Any) -> torch.Tensor:
        """torch.tensor/as_tensor/asarray without dtype: the data decides; build on the host."""
        data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
        if isinstance(data, torch.Tensor) and data.dtype is not F64:
            return wrapped(*args, **kwargs)
        host_kwargs = dict(kwargs, device="cpu")
        requires_grad = bool(host_kwargs.pop("requires_grad", False))
        host = wrapped(*args, **host_kwargs)
        if host.dtype is not F64:
            return wrapped(*args, **kwargs)  # the usual path, so storage sharing stays as it is
        _downcast_note(api)
        moved = host.to(device=devicemap.map_device(dev, int_is_cuda=True), dtype=F32)
        if requires_grad:
            moved.requires_grad_(True)
        return moved

    def _new_method(self, api: str):
        lacks = self.lacks

        def wrapper(wrapped, instance, args, kwargs):
            if kwargs.get("dtype") is not F64:
                return wrapped(*args, **kwargs)
            dev = kwargs.get("device")
            if not lacks(dev if dev is not None else instance.device):
                return wrapped(*args, **kwargs)
            _downcast_note(api)
            return wrapped(*args, **dict(kwargs, dtype=F32))

        return wrapper


def _downcast_note(api: str) -> None:
    events.redirected(api, "float64", "float32", tag="emulated")
    events.warn_at_user_site(f"dmlshim: {api}: float64 tensor made float32 on the DirectML device, "
                      "which has no float64 (DMLSHIM_FLOAT64=float32)")


def _parse_to(args: tuple, kwargs: dict):
    """(device or None, dtype or None, the other keyword arguments) of a ``Tensor.to`` call."""
    dev: Optional[Any] = kwargs.get("device")
    dtype: Optional[torch.dtype] = kwargs.get("dtype")
    rest = {k: v for k, v in kwargs.items() if k not in ("device", "dtype")}
    i = 0
    if args:
        first = args[0]
        if isinstance(first, torch.Tensor):
            dev, dtype, i = first.device, first.dtype, 1
        elif isinstance(first, torch.dtype):
            dtype, i = first, 1
        elif type(first) is not bool:  # to(device, dtype=None, non_blocking, copy)
            dev, i = first, 1
            if len(args) > 1 and (args[1] is None or isinstance(args[1], torch.dtype)):
                dtype, i = args[1], 2
    for key, value in zip(("non_blocking", "copy"), args[i:]):
        rest[key] = value
    return dev, dtype, rest
