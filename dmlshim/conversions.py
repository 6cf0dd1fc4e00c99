"""The rules the device-argument wrappers apply after the device rule, and the areas' policies.

:mod:`dmlshim.patches.devices` wraps each entry point once (``Tensor.to``/``.cuda``/
``.double``/``.bfloat16``, ``Module.to``/``.cuda``, the factories, ``Tensor.new_*``). Its
wrapper bodies are the one place the order is written: the device rule
(:func:`dmlshim.devicemap.map_device`: a CUDA device becomes the target), then the rule for the
dtype the tensor would have on the device (contributed by the float64 and bf16 areas, for
DirectML devices only), then the memory-format rule (a non-contiguous ``memory_format`` bound
for a DirectML device is dropped: the layout area), then the call's one event.

A rule is data plus two small functions. The rules of an installation are its
:class:`Rewriters` (``api.Shim.rewriters``): areas register in their ``_install`` through the
front doors below and unregister through ``Patch.on_undo``; when none is registered (the CPU
target), the entry points run only the device rule.

Entry points whose call is more than a device argument also get the owning area's decision as
a policy function (:attr:`Rewriters.policies`): which legacy ``torch.cuda.*Tensor`` type
``Tensor.type`` names (cuda_api), where a storage's ``.cuda()`` puts it while a checkpoint
loads (serialization), whether ``share_memory_`` is a no-op (storage). devices.py still runs
the device rule and records the call's one event.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from dmlshim import current, devicemap, events


@dataclass(frozen=True)
class DtypeRule:
    """What becomes of ``dtype`` when a tensor of it enters a device that ``lands_on``."""

    area: str  # "float64", "bf16": the option that decides (shown in messages)
    dtype: torch.dtype
    lands_on: Callable[[torch.device], bool]  # the (already mapped) device is affected
    replace: Callable[[str], torch.dtype]  # api -> the dtype to use (warns once per site, or raises)


@dataclass(frozen=True)
class MemoryFormatRule:
    lands_on: Callable[[torch.device], bool]  # formats other than contiguous are dropped there


_KEPT_FORMATS = (torch.preserve_format, torch.contiguous_format, None)


def as_device(dev: Any) -> Optional[torch.device]:
    """``dev`` (any device argument, already mapped) as a torch.device; None if it is none."""
    if dev is None:
        return None
    if isinstance(dev, torch.device):
        return dev
    if isinstance(dev, (str, int)):
        try:
            return torch.device(dev)
        except (RuntimeError, TypeError):
            return None
    return None


def _name(dtype: Any) -> str:
    return str(dtype).replace("torch.", "")


def record(api: str, moved: Optional[Tuple[Any, Any, str]],
           dtype_change: Optional[Tuple[Any, Any]] = None, dropped: Any = None) -> None:
    """The one event of a call the rewriters changed: ``moved`` (device as passed, what it
    became, keyword), ``dtype_change`` (old, new), ``dropped`` (a memory format)."""
    before, after = [], []
    if moved is not None and not (isinstance(moved[0], str) and moved[0] == ""):
        before.append(str(moved[0]))
    if moved is not None:
        after.append(str(moved[1]))
    if dtype_change is not None:
        before.append(_name(dtype_change[0]))
        after.append(_name(dtype_change[1]))
    if dropped is not None:
        before.append(f"memory_format={_name(dropped)}")
        after.append("contiguous")
    if moved is not None:
        tag = "redirected"
    elif dtype_change is not None:
        tag = "emulated"
    else:
        tag = "dropped"
    if moved is not None and len(after) == 1:
        events.redirected(api, moved[0], moved[1], arg=moved[2])
    else:
        events.redirected(api, ", ".join(before), ", ".join(after), tag=tag)


def parse_to(args: tuple, kwargs: dict) -> Tuple[Any, Optional[torch.dtype], Dict[str, Any]]:
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


def device_of_default() -> Any:
    return torch.get_default_device() if hasattr(torch, "get_default_device") else "cpu"


def map_any(dev: Any) -> Any:
    return devicemap.map_device(dev, int_is_cuda=True)


# -- factories ----------------------------------------------------------------------------------

_INFERRING = ("tensor", "as_tensor", "asarray")  # the result dtype comes from the data


def _record_factory(api: str, moved: Any, old: Any, new: Any) -> None:
    if new is not None:
        record(api, moved, (old, new))
    elif moved is not None:
        events.redirected(api, moved[0], moved[1], arg=moved[2])


class Rewriters:
    """The rules and policies of one installation (``api.Shim.rewriters``)."""

    def __init__(self) -> None:
        #: dtype -> its rule; empty unless an area registered one (DirectML targets)
        self.dtype_rules: Dict[torch.dtype, DtypeRule] = {}
        self.memory_format_rule: Optional[MemoryFormatRule] = None
        #: entry point -> the function of the area that decides what its call does (an entry
        #: point without one passes its calls to torch):
        #:
        #: * ``"Tensor.type"``: ``arg -> dtype or None``: the dtype of the CUDA legacy tensor
        #:   type the argument names (``torch.cuda.FloatTensor``, ``"torch.cuda.FloatTensor"``),
        #:   else None;
        #: * ``"Storage.cuda"``: ``(storage, target device) -> storage``: the storage put there;
        #: * ``"Tensor.share_memory_"``: ``tensor -> bool``: True when its memory cannot be
        #:   shared (the call is then a no-op returning the tensor, as for a CUDA tensor);
        #: * ``"Tensor.to non_blocking"``: ``tensor -> bool``: True when a ``non_blocking=True``
        #:   copy out of that tensor must block (asked only of calls that pass it).
        self.policies: Dict[str, Callable[..., Any]] = {}

    def add_dtype_rule(self, rule: DtypeRule) -> Callable[[], None]:
        """Register ``rule``; returns the function that removes it (for ``Patch.on_undo``)."""
        rules = self.dtype_rules
        if rule.dtype in rules:
            raise RuntimeError(f"dmlshim: a rule for {rule.dtype} is already registered "
                               f"(by {rules[rule.dtype].area})")
        rules[rule.dtype] = rule
        return lambda: rules.pop(rule.dtype, None)

    def set_memory_format_rule(self, rule: MemoryFormatRule) -> Callable[[], None]:
        self.memory_format_rule = rule

        def remove() -> None:
            self.memory_format_rule = None

        return remove

    def add_policy(self, api: str, policy: Callable[..., Any]) -> Callable[[], None]:
        """Register the area's ``policy`` for entry point ``api``; returns its remover (for
        ``Patch.on_undo``). One area decides each entry point."""
        policies = self.policies
        if api in policies:
            raise RuntimeError(f"dmlshim: {api} already has a policy ({policies[api]!r})")
        policies[api] = policy

        def remove() -> None:
            if policies.get(api) is policy:
                del policies[api]

        return remove

    def dtype_for(self, api: str, dtype: Optional[torch.dtype],
                  dev: Any) -> Optional[torch.dtype]:
        """The dtype rule's answer for a tensor of ``dtype`` entering ``dev``: the new dtype, or
        None when nothing changes."""
        rule = self.dtype_rules.get(dtype)  # type: ignore[arg-type]
        if rule is None:
            return None
        device = as_device(dev)
        if device is None or not rule.lands_on(device):
            return None
        new = rule.replace(api)
        return None if new is dtype else new

    def memory_format_for(self, api: str, memory_format: Any, dev: Any) -> bool:
        """Whether ``memory_format`` is to be dropped for a tensor entering ``dev``."""
        rule = self.memory_format_rule
        if rule is None or memory_format in _KEPT_FORMATS:
            return False
        device = as_device(dev)
        return device is not None and rule.lands_on(device)

    def rewrite_to(self, api: str, instance: torch.Tensor, args: tuple, kwargs: dict,
                   moved: Optional[Tuple[Any, Any, str]] = None) -> Optional[Tuple[tuple, dict]]:
        """The dtype and memory-format rules for a ``Tensor.to`` call whose device rule already
        ran (``moved``: what it changed): new (args, kwargs) with the call's one event recorded,
        or None when they change nothing (the caller records ``moved``)."""
        dev, dtype, rest = parse_to(args, kwargs)
        target = dev if dev is not None else instance.device
        old_dtype = dtype if dtype is not None else instance.dtype
        new_dtype = self.dtype_for(api, old_dtype, target)
        dropped = rest.get("memory_format")
        drop = self.memory_format_for(api, dropped, target)
        if new_dtype is None and not drop:
            return None
        record(api, moved, (old_dtype, new_dtype) if new_dtype is not None else None,
               dropped if drop else None)
        if drop:
            rest.pop("memory_format")
        if new_dtype is not None:
            dtype = new_dtype
        if dev is None and dtype is None:
            return (), rest
        head: tuple = (dev,) if dev is not None else ()
        return head, dict(rest, dtype=dtype) if dtype is not None else rest

    def call_factory(self, name: str, wrapped: Callable[..., Any], args: tuple, kwargs: dict,
                     moved: Optional[Tuple[Any, Any, str]] = None) -> Any:
        """A factory call whose result may have a dtype of :attr:`dtype_rules` (the device
        rule has already run; ``moved``: what it changed): the rule decides, and the call's one
        event is recorded; the call is made as it is otherwise."""
        api = "torch." + name
        infers = name in _INFERRING
        likes = name.endswith("_like")
        dtype = kwargs.get("dtype")
        dev = kwargs.get("device")
        if name == "as_tensor" and len(args) > 1:  # as_tensor(data, dtype=None, device=None)
            dtype = args[1] if dtype is None else dtype
            if len(args) > 2 and dev is None:
                dev = map_any(args[2])
                if dev is not args[2]:
                    moved = (args[2], dev, "device")
            args = (args[0],)
            kwargs = dict(kwargs, dtype=dtype, device=dev)
        if dev is None:
            dev = getattr(args[0], "device", None) if likes and args else device_of_default()
        if dtype is not None or likes:
            if dtype is None:
                dtype = getattr(args[0], "dtype", None) if args else None
            new = self.dtype_for(api, dtype, dev)
            _record_factory(api, moved, dtype, new)
            if new is None:
                return wrapped(*args, **kwargs)
            return wrapped(*args, **dict(kwargs, dtype=new))
        if infers:
            return self._inferred(wrapped, api, args, kwargs, dev, moved)
        # the default dtype has a rule: learn the result dtype on the meta device (no data)
        probe_kwargs = {k: v for k, v in kwargs.items()
                        if k not in ("generator", "pin_memory", "requires_grad", "out")}
        try:
            probe = wrapped(*args, **dict(probe_kwargs, device="meta"))
        except Exception:  # noqa: BLE001 - no probe: leave the call as it is
            _record_factory(api, moved, None, None)
            return wrapped(*args, **kwargs)
        new = self.dtype_for(api, getattr(probe, "dtype", None), dev)
        _record_factory(api, moved, getattr(probe, "dtype", None), new)
        if new is None:
            return wrapped(*args, **kwargs)
        return wrapped(*args, **dict(kwargs, dtype=new))

    def _inferred(self, wrapped: Callable[..., Any], api: str, args: tuple, kwargs: dict,
                  dev: Any, moved: Any = None) -> Any:
        """torch.tensor/as_tensor/asarray without dtype: the data decides; build on the host."""
        device = as_device(dev)
        data = args[0] if args else kwargs.get("data", kwargs.get("obj"))
        if device is None or device.type in ("cpu", "meta") \
                or (isinstance(data, torch.Tensor) and data.dtype not in self.dtype_rules):
            _record_factory(api, moved, None, None)
            return wrapped(*args, **kwargs)
        host_kwargs = dict(kwargs, device="cpu")
        requires_grad = bool(host_kwargs.pop("requires_grad", False))
        host = wrapped(*args, **host_kwargs)
        new = self.dtype_for(api, host.dtype, dev) if host.dtype in self.dtype_rules else None
        _record_factory(api, moved, host.dtype, new)
        if new is None:
            return wrapped(*args, **kwargs)  # the usual path, so storage sharing stays as it is
        result = host.to(device=map_any(dev), dtype=new)
        if requires_grad:
            result.requires_grad_(True)
        return result


# -- the front doors of the areas (they register while the session installs them) ---------

def _rewriters() -> Rewriters:
    shim = current.session
    if shim is None or shim.rewriters is None:
        raise RuntimeError("dmlshim: rules are registered by patches while dmlshim installs")
    return shim.rewriters


def add_dtype_rule(rule: DtypeRule) -> Callable[[], None]:
    """Register ``rule`` with the installing session; returns its remover."""
    return _rewriters().add_dtype_rule(rule)


def set_memory_format_rule(rule: MemoryFormatRule) -> Callable[[], None]:
    return _rewriters().set_memory_format_rule(rule)


def add_policy(api: str, policy: Callable[..., Any]) -> Callable[[], None]:
    """Register the area's ``policy`` for entry point ``api`` with the installing session."""
    return _rewriters().add_policy(api, policy)
