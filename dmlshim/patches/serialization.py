"""Checkpoints both ways: CUDA checkpoints load onto the target, target checkpoints load anywhere.

Loading (``torch.load``; ``weights_only`` -- argument and default -- is never touched).
A file written on a CUDA machine tags its storages ``cuda:N``. Every ``map_location`` form
-- None (the tag), ``"cuda"``, ``"cuda:N"``, ``torch.device("cuda", N)``, a dict, a callable
(``lambda s, loc: s.cuda(N)`` included) -- resolves a tag the way torch resolves it, and a CUDA
location then means :func:`dmlshim.devicemap.device_for` its ordinal:

* CPU target: the storage stays on the host. A deserializer registered in
  ``torch.serialization._package_registry`` ahead of torch's CUDA one (as Cambricon's
  ``torch_mlu`` registers one for "cuda" tags) does it, so even calls that bypass the
  ``torch.load`` wrapper work.
* DirectML (real or emulated): storages are read to the host, and the loaded tensors bound for
  the device are moved there after unpickling (``tensor.to(device)``, Parameters stay
  Parameters), as SD.Next does: ``UntypedStorage.to(privateuseone)`` needs a device module
  torch_directml does not register ("map_location=dml" fails: microsoft/DirectML#466). Views of
  one storage become separate tensors on the device.

Saving (``torch.save``). Tensors on a DirectML (or emulated) device are written as CPU tensors
(storages tagged ``cpu``), so the file loads in any torch, with or without dmlshim and
torch_directml, instead of failing with "don't know how to restore data location ... (tagged
with privateuseone)" (microsoft/DirectML#196). Loading such a file with ``map_location=None``
gives CPU tensors; ``load_state_dict`` copies them onto the model's device, and
``map_location="cuda"`` puts them on the target.
"""

from __future__ import annotations

import collections
import logging
import os
import types
from typing import Any, Callable, Dict, Optional

import torch
import torch.serialization as _ser
import torch.storage as _storage

from dmlshim import conversions, devicemap, events
from dmlshim.patching import Owns, Patch, ThreadStack, call_at_callers_line, get_original

log = logging.getLogger("dmlshim")

# Ahead of torch's cuda (20) and privateuse1 (23) entries, behind cpu (10). Priorities must be
# unique: the registry is a sorted list of (priority, tagger, deserializer) tuples.
REGISTRY_PRIORITY = 15

def _device_index(location: str) -> Optional[int]:
    _, _, idx = location.partition(":")
    return int(idx) if idx.isdigit() else None


def _untyped(storage: Any) -> Any:
    return storage._untyped_storage if isinstance(storage, _storage.TypedStorage) else storage


def storage_to_device(storage: Any, device: torch.device) -> Any:
    """A copy of an untyped storage on ``device`` (the storage itself when already there)."""
    storage = _untyped(storage)
    if storage.device.type == device.type and (device.index is None
                                                or storage.device.index == device.index):
        return storage
    if device.type == "cpu":
        return storage.cpu()
    # UntypedStorage.to(device) needs a device module registered as torch.<type>, which
    # torch_directml does not register; a byte tensor over the storage copies anywhere.
    host = storage if storage.device.type == "cpu" else storage.cpu()
    as_bytes = torch.empty(0, dtype=torch.uint8).set_(host)
    return get_original(torch.Tensor, "to")(as_bytes, device).untyped_storage()


class SerializationPatch(Patch):
    name = "serialization"
    owns = (Owns("torch", ("load", "save")), Owns("torch.serialization", ("load", "save")))

    def applies(self, caps) -> bool:
        return caps.redirects

    def _install(self, caps, config) -> None:
        self.directml = caps.directml
        self.device_type = caps.device_type
        self._register_location_handler()
        for owner in (torch, _ser):
            self.wrap(owner, "load", self._load)
        # devices.py wraps Storage.cuda (``lambda s, loc: s.cuda(0)`` map_locations call it)
        # while a torch.load runs in a thread: where its storages go on DirectML (storage
        # _cdata -> device; they are moved after unpickling), and the location rewrites it saw
        # (one event each)
        self._dest, self._seen = ThreadStack(), ThreadStack()
        self.on_undo(conversions.add_policy("Storage.cuda", self.place_storage))
        if self.directml:
            for owner in (torch, _ser):
                self.wrap(owner, "save", self._save)

    # -- where a location tag goes ---------------------------------------------------------
    def target_device(self, location: Any) -> Optional[torch.device]:
        """The target device a location string stands for; None when it is not ours."""
        if not isinstance(location, str):
            return None
        if location.startswith("cuda"):
            index = devicemap.cuda_index(location)
            if index is False:
                return None
            return devicemap.device_for(index)  # type: ignore[arg-type]
        if self.directml and location.startswith(self.device_type):
            index = _device_index(location)
            devicemap.check_index(index if index is not None else 0)
            return torch.device(self.device_type, index if index is not None else 0)
        return None

    def _register_location_handler(self) -> None:
        directml, device_type = self.directml, self.device_type

        def tagger(obj: Any) -> Optional[str]:
            # Storage-backed DirectML tensors: same bytes, a tag every torch can restore.
            if directml and obj.device.type == device_type:
                return "cpu"
            return None

        def deserializer(obj: Any, location: Any) -> Any:
            dev = self.target_device(location)
            if dev is None:
                return None
            self._note_location(location, dev)
            return self.place_storage(obj, dev)

        entry = (REGISTRY_PRIORITY, tagger, deserializer)
        registry = _ser._package_registry
        if any(e[0] == REGISTRY_PRIORITY for e in registry):
            raise RuntimeError("dmlshim: torch.serialization already has a package with priority "
                               f"{REGISTRY_PRIORITY}; cannot register dmlshim's location handler")
        _ser.register_package(*entry)

        def unregister() -> None:
            for i, e in enumerate(registry):
                if e[1] is tagger and e[2] is deserializer:
                    del registry[i]
                    break

        self.on_undo(unregister)

    # -- torch.load ------------------------------------------------------------------------
    def _load(self, wrapped, instance, args, kwargs):
        if len(args) >= 2:
            ml, where = args[1], "arg"
        else:
            ml, where = kwargs.get("map_location"), "kw"
        new_ml = devicemap.map_device(ml)
        if new_ml is not ml:
            events.redirected("torch.load", ml, new_ml, arg="map_location")
        f = args[0] if args else kwargs.get("f")
        seen: set = set()
        try:
            with self._seen.pushed(seen):
                if not self.directml or _is_safetensors(f):
                    args, kwargs = _with_ml(args, kwargs, where, new_ml)
                    # torch 2.4 warns about weights_only at its caller's line: the user's
                    return call_at_callers_line(wrapped, args, kwargs)
                # DirectML: read every storage to the host, note where each was going, move
                # after.
                dest: Dict[int, torch.device] = {}
                restore = self._host_restore(new_ml, dest)
                args, kwargs = _with_ml(args, kwargs, where, restore)
                with self._dest.pushed(dest):
                    result = call_at_callers_line(wrapped, args, kwargs)
                return _Mover(dest).move(result) if dest else result
        finally:
            for location, dev in sorted(seen, key=str):
                events.redirected("torch.load", location, dev)

    def _host_restore(self, map_location: Any, dest: Dict[int, torch.device]) -> Callable:
        """A map_location callable resolving tags as torch would, keeping storages on the host."""

        def resolve(storage: Any, location: str) -> Any:
            dev = self.target_device(location)
            if dev is None:
                return _ser.default_restore_location(storage, location)
            self._note_location(location, dev)
            storage = _untyped(storage)
            if dev.type != "cpu":
                dest[storage._cdata] = dev
            return storage

        if map_location is None:
            return resolve
        if isinstance(map_location, dict):
            return lambda storage, location: resolve(storage,
                                                     map_location.get(location, location))
        if isinstance(map_location, (str, bytes, torch.device)):
            loc = map_location.decode() if isinstance(map_location, bytes) else str(map_location)
            return lambda storage, location: resolve(storage, loc)

        def call_user(storage: Any, location: str) -> Any:
            result = map_location(storage, location)  # storage.cuda() notes its destination
            return resolve(storage, location) if result is None else result

        return call_user

    # -- Storage.cuda inside and outside a load ---------------------------------------------
    def place_storage(self, storage: Any, dev: torch.device) -> Any:
        """``Storage.cuda``'s policy (devices.py wraps it and maps the device): ``storage`` on
        ``dev``; inside a DirectML load, the host storage, noted to be moved after unpickling."""
        dest = self._dest.top
        if dest is not None and dev.type != "cpu":
            storage = _untyped(storage)
            dest[storage._cdata] = dev
            return storage
        return storage_to_device(storage, dev)

    def _note_location(self, location: str, dev: torch.device) -> None:
        """Record a rewritten location once per torch.load call (per storage outside one)."""
        seen = self._seen.top
        if seen is None:
            events.redirected("torch.load", location, dev)
        else:
            seen.add((location, str(dev)))

    # -- torch.save ------------------------------------------------------------------------
    def _save(self, wrapped, instance, args, kwargs):
        if len(args) >= 3:
            args = args[:2] + (_portable_pickle_module(args[2], self.device_type),) + args[3:]
        else:
            import pickle

            module = kwargs.get("pickle_module", pickle)
            kwargs = dict(kwargs, pickle_module=_portable_pickle_module(module, self.device_type))
        return wrapped(*args, **kwargs)


def _is_safetensors(f: Any) -> bool:
    return isinstance(f, (str, os.PathLike)) and os.fspath(f).endswith(".safetensors")


def _with_ml(args: tuple, kwargs: dict, where: str, ml: Any):
    if where == "arg":
        args = args[:1] + (ml,) + tuple(args[2:])
    else:
        kwargs = dict(kwargs, map_location=ml)
    return args, kwargs


class _Mover:
    """Moves loaded tensors whose storage was bound for the device, walking the loaded object."""

    def __init__(self, dest: Dict[int, torch.device]) -> None:
        self.dest = dest
        self.memo: Dict[int, Any] = {}

    def move(self, obj: Any) -> Any:
        key = id(obj)
        if key in self.memo:
            return self.memo[key]
        self.memo[key] = obj  # cycles resolve to the object itself
        new = self._move(obj)
        self.memo[key] = new
        return new

    def _move(self, obj: Any) -> Any:
        if isinstance(obj, torch.Tensor):
            return self._tensor(obj)
        if isinstance(obj, (str, bytes, int, float, bool, type(None), torch.dtype,
                            torch.device, type, types.ModuleType, types.FunctionType)):
            return obj
        if isinstance(obj, dict):
            for k, v in list(obj.items()):
                nv = self.move(v)
                if nv is not v:
                    obj[k] = nv
            return obj
        if isinstance(obj, list):
            for i, v in enumerate(obj):
                nv = self.move(v)
                if nv is not v:
                    obj[i] = nv
            return obj
        if isinstance(obj, tuple):
            items = [self.move(v) for v in obj]
            if all(a is b for a, b in zip(items, obj)):
                return obj
            return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
        attrs = getattr(obj, "__dict__", None)
        if isinstance(attrs, dict):  # modules, optimizers, namespaces, user objects
            self._move(attrs)
        return obj

    def _tensor(self, t: torch.Tensor) -> torch.Tensor:
        try:
            dev = self.dest.get(t.untyped_storage()._cdata)
        except (RuntimeError, NotImplementedError):
            return t
        if dev is None:
            return t
        with torch.no_grad():
            moved = t.detach().to(dev)
        if isinstance(t, torch.nn.Parameter):
            return torch.nn.Parameter(moved, requires_grad=t.requires_grad)
        if t.requires_grad:
            moved.requires_grad_(True)
        return moved


# -- portable saving ----------------------------------------------------------------------

def _portable_pickle_module(module: Any, device_type: str) -> Any:
    """``module`` with a Pickler that writes ``device_type`` tensors as CPU tensors."""
    base = module.Pickler

    class PortablePickler(base):  # type: ignore[misc, valid-type]
        def reducer_override(self, obj: Any) -> Any:
            if isinstance(obj, torch.Tensor) and obj.device.type == device_type \
                    and _needs_cpu_copy(obj):
                return _cpu_reduction(obj)
            parent = getattr(super(), "reducer_override", None)
            return parent(obj) if parent is not None else NotImplemented

    proxy = types.ModuleType(getattr(module, "__name__", "pickle"))
    proxy.__dict__.update({k: v for k, v in vars(module).items() if not k.startswith("__")}
                          if isinstance(module, types.ModuleType) else {})
    proxy.Pickler = PortablePickler  # type: ignore[attr-defined]
    if not isinstance(module, types.ModuleType):
        proxy.__getattr__ = lambda name: getattr(module, name)  # type: ignore[attr-defined]
    return proxy


def _needs_cpu_copy(t: torch.Tensor) -> bool:
    # Storage-backed plain tensors are handled by the "cpu" location tag (views keep sharing
    # their storage); tensors without usable storage or with their own __reduce_ex__ (the
    # emulator's, torch's PrivateUse1 path) would pickle their device string.
    if type(t) not in (torch.Tensor, torch.nn.Parameter):
        return True
    try:
        return not torch._C._has_storage(t) or (t.untyped_storage().data_ptr() == 0
                                                and t.numel() > 0)
    except (RuntimeError, NotImplementedError):
        return True


def _cpu_reduction(t: torch.Tensor) -> Any:
    cpu = t.detach().cpu()
    if isinstance(t, torch.nn.Parameter):
        return (torch._utils._rebuild_parameter, (cpu, t.requires_grad, collections.OrderedDict()))
    if t.requires_grad:
        cpu.requires_grad_(True)
    return cpu.__reduce_ex__(2)

