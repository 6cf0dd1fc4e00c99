"""Child processes carry the shim: DataLoader workers, multiprocessing, mp.spawn, subprocesses.

* **spawn / forkserver / subprocess** children start a fresh interpreter. While the shim is
  installed, ``os.environ`` carries it (dmlshim/childenv.py: the options in force, the
  bootstrap first on ``PYTHONPATH``, the ``DMLSHIM_BOOTSTRAP`` record); the child's bootstrap
  gives the child's script its environment back and installs the shim when the child imports
  torch. ``uninstall()`` puts the variables back byte for byte, so processes started afterwards
  see the environment they would have seen without dmlshim.
* **fork** children inherit the patched interpreter as it is; the session's fork hook
  (dmlshim.api) gives them an event log of their own.
* ``torch.multiprocessing.spawn``/``start_processes`` launch one process per "GPU" and the
  children call ``torch.cuda.set_device(rank)``: the children map CUDA ordinal N to adapter
  N % count, as torchrun's ``LOCAL_RANK`` launches do (see devicemap).
* DirectML has no inter-process memory (CUDA has IPC handles). A DirectML tensor sent to another
  process arrives as a copy on the same adapter, and ``module.share_memory()`` — the hogwild
  idiom — keeps the module in CPU shared memory, where every process updates the same
  parameters; the module's forward then runs on the CPU (see :class:`HostForward`).
"""

from __future__ import annotations

import logging
import os
import sys
import threading
from multiprocessing.reduction import ForkingPickler
from typing import Any, Dict, Optional

import torch
import torch.utils._pytree as pytree

from dmlshim import current, devicemap, events
from dmlshim.childenv import ChildEnvironment
from dmlshim.patching import Owns, Patch

log = logging.getLogger("dmlshim")

WRAP_ORDINALS_ENV = devicemap.WRAP_ORDINALS_ENV


def child_environment(config) -> ChildEnvironment:
    """What a child needs to carry the shim with ``config``'s options."""
    # DMLSHIM_REPORT too: the diagnostics patch makes children write report.<pid>.json.
    values: Dict[str, Optional[str]] = dict(config.as_env())
    # This process is shimmed, so its children are too (install() may run with DISABLE=1 in the
    # environment: the test suite does). A program that sets DMLSHIM_DISABLE=1 again for a
    # child still wins: the child's bootstrap sees the value changed and keeps it.
    values["DMLSHIM_DISABLE"] = "0"
    # Nothing on LD_LIBRARY_PATH: a child imports torch_directml as this process did (on WSL
    # through the loader cache; the wheel's folder there would shadow WSL's libraries).
    return ChildEnvironment(values)


class ProcessesPatch(Patch):
    name = "processes"
    owns = (Owns("torch.nn.Module", ("share_memory",)),
            Owns("torch.multiprocessing.spawn", ("start_processes",)),
            Owns("torch.multiprocessing", ("start_processes",)))

    def applies(self, caps) -> bool:
        return caps.redirects

    def _install(self, caps, config) -> None:
        shim = current.session
        export = child_environment(config)
        export.apply()
        if shim is not None:
            shim.child_environment = export  # the session owns what its children inherit

        def restore() -> None:
            export.restore()
            if shim is not None:
                shim.child_environment = None

        self.on_undo(restore)
        self._install_spawn_launcher()
        if caps.directml:
            self._copy_warned = False
            self._install_tensor_reducers(caps)
            self.wrap(torch.nn.Module, "share_memory", _share_memory)

    # -- torch.multiprocessing.spawn / start_processes -------------------------------------
    def _install_spawn_launcher(self) -> None:
        import torch.multiprocessing

        spawn_mod = sys.modules["torch.multiprocessing.spawn"]

        def start_processes(wrapped, instance, args, kwargs):
            # One process per "GPU": each child calls torch.cuda.set_device(rank), so ordinal N
            # must find adapter N % count. Spawned children learn it from the environment,
            # forked ones inherit the flag.
            saved_env = os.environ.get(WRAP_ORDINALS_ENV)
            dmap = devicemap.active()
            saved_flag = dmap.wrap_ordinals if dmap is not None else False
            os.environ[WRAP_ORDINALS_ENV] = "1"
            devicemap.set_wrap_ordinals(True)
            events.note("processes.spawn_launch")
            try:
                return wrapped(*args, **kwargs)
            finally:
                devicemap.set_wrap_ordinals(saved_flag)
                if saved_env is None:
                    os.environ.pop(WRAP_ORDINALS_ENV, None)
                else:
                    os.environ[WRAP_ORDINALS_ENV] = saved_env

        self.wrap(spawn_mod, "start_processes", start_processes)
        if getattr(torch.multiprocessing, "start_processes", None) is not None:
            self.wrap(torch.multiprocessing, "start_processes", start_processes)

    # -- DirectML tensors sent to another process -----------------------------------------
    def _install_tensor_reducers(self, caps) -> None:
        # ForkingPickler picks a reducer by exact type: torch registers torch.Tensor and
        # nn.Parameter; the emulator's tensors have a class of their own.
        classes = {torch.Tensor, torch.nn.Parameter}
        if caps.emulated:
            classes.add(type(torch.empty(0, device=devicemap.device_for(None))))
        table = ForkingPickler._extra_reducers
        for cls in classes:
            original = table.get(cls)
            table[cls] = _device_tensor_reducer(original, self)

            def undo(cls=cls, original=original) -> None:
                if original is None:
                    table.pop(cls, None)
                else:
                    table[cls] = original

            self.on_undo(undo)


# -- DirectML tensors across processes ----------------------------------------------------

def _is_target_tensor(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and devicemap.is_target_device(t.device) \
        and t.device.type != "cpu"


def _rebuild_device_tensor(host: torch.Tensor, index: int, requires_grad: bool,
                           is_param: bool) -> torch.Tensor:
    """Receiving side: the host copy, moved to the same adapter in this process."""
    shim = current.session
    caps = shim.capabilities if shim is not None else None
    if caps is not None and caps.directml:
        device = torch.device(caps.device_type, index)
    else:  # a receiver without the shim (DMLSHIM_DISABLE=1): the data, on the CPU
        device = torch.device("cpu")
    with torch.no_grad():
        t = host.to(device)
    if is_param:
        return torch.nn.Parameter(t, requires_grad=requires_grad)
    return t.requires_grad_(requires_grad) if requires_grad else t


def _device_tensor_reducer(original, patch: ProcessesPatch):
    def reduce(t: torch.Tensor):
        if not _is_target_tensor(t):
            return original(t) if original is not None else t.__reduce_ex__(2)
        if not patch._copy_warned:  # once per installation
            patch._copy_warned = True
            log.warning(
                "a DirectML tensor was sent to another process; DirectML has no "
                "inter-process memory, so the receiver gets a copy (on CUDA it would share the "
                "memory). For hogwild training call module.share_memory() before starting the "
                "processes: dmlshim then keeps the module in CPU shared memory.")
        events.redirected("multiprocessing: DirectML tensor", t.device, "copy", tag="emulated")
        with torch.no_grad():
            host = t.detach().to("cpu")
        index = t.device.index if t.device.index is not None else devicemap.current_index()
        return (_rebuild_device_tensor,
                (host, index, t.requires_grad, isinstance(t, torch.nn.Parameter)))

    return reduce


# -- hogwild: Module.share_memory() on DirectML ------------------------------------------

class HostForward:
    """Forward hooks of a module shared through CPU memory: inputs come to the CPU, outputs
    go back to the adapter the inputs came from. Picklable, so spawned processes get them."""

    def __init__(self, index: int) -> None:
        self.index = index
        self._moved = threading.local()  # per thread: the devices of the forwards under way

    def __getstate__(self) -> Dict[str, Any]:
        return {"index": self.index}  # a thread-local does not pickle; a new process starts empty

    def __setstate__(self, state: Dict[str, Any]) -> None:
        self.__init__(state["index"])  # type: ignore[misc]

    def pre(self, module, args, kwargs):
        found = []

        def to_host(x):
            if _is_target_tensor(x):
                found.append(x.device)
                return x.to("cpu")
            return x

        args, kwargs = pytree.tree_map(to_host, (args, kwargs))
        stack = getattr(self._moved, "stack", None)
        if stack is None:
            stack = self._moved.stack = []
        stack.append(found[0] if found else None)
        return args, kwargs

    def post(self, module, args, kwargs, output):
        stack = getattr(self._moved, "stack", None)
        device = stack.pop() if stack else None
        if device is None:
            return output
        return pytree.tree_map(
            lambda x: x.to(device) if isinstance(x, torch.Tensor) and x.device.type == "cpu"
            else x, output)


def _share_memory(wrapped, instance, args, kwargs):
    module = instance
    on_device = [t for t in list(module.parameters()) + list(module.buffers())
                 if _is_target_tensor(t)]
    if not on_device:
        return wrapped(*args, **kwargs)
    device = on_device[0].device
    index = device.index if device.index is not None else devicemap.current_index()
    log.warning(
        "%s.share_memory(): DirectML memory cannot be shared between processes; the "
        "module now lives in CPU shared memory, so every process updates the same parameters "
        "(hogwild works), and its forward runs on the CPU", type(module).__name__)
    events.redirected("Module.share_memory", device, "cpu shared memory", tag="emulated")
    module.cpu()
    result = wrapped(*args, **kwargs)
    if not getattr(module, "_dmlshim_host_forward", False):
        hooks = HostForward(index)
        module.register_forward_pre_hook(hooks.pre, with_kwargs=True)
        module.register_forward_hook(hooks.post, with_kwargs=True)
        module._dmlshim_host_forward = True
    return result
