"""torch.distributed for scripts written for NCCL: gloo does the work, PyTorch's engine runs it.

What the script sees is what it sees on a CUDA machine: ``init_process_group("nccl")`` works,
``dist.get_backend()`` answers ``"nccl"``, ``dist.is_nccl_available()`` is True,
``torch.cuda.set_device(local_rank)`` picks adapter ``local_rank % count``, and
``DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)`` trains.
torch's own code keeps seeing the truth (``called_from_torch``): the group is a gloo group.

* CPU target: tensors are CPU tensors, so ``nccl`` simply becomes ``gloo``.
* DirectML (real or emulated): gloo only takes CPU (and CUDA) tensors, so the group is a
  :class:`StagingProcessGroup` — a ``torch.distributed.ProcessGroup`` written in Python, the
  extension point PyTorch offers for this (``Backend.register_backend``). Every collective on a
  DirectML tensor is staged through host memory: copy device -> CPU, run gloo, copy the result
  back. The script's own ``all_reduce``/``broadcast``/``all_gather``/... go through it.
  Cost: two copies of each tensor per collective, and the collective is synchronous.
* DDP on DirectML: torch's Reducer reads gradient storage, which DirectML tensors lack
  ("Cannot access storage of OpaqueTensorImpl"), so a module on the device gets
  :class:`dmlshim.patches._ddp_device.DeviceDistributedDataParallel` (a subclass of torch's DDP
  that all-reduces gradients through the host), unless ``DMLSHIM_GUARDS=off``.
* ``nn.DataParallel`` on DirectML runs the module on one adapter (see :func:`_data_parallel_init`).
* ``ReduceOp.AVG``, which NCCL has for every dtype and gloo has not (none at all in torch 2.4,
  none for integers later): on a group the script asked NCCL for, ``all_reduce`` and
  ``reduce_scatter(_tensor)`` with AVG sum, then divide by the group's size as NCCL does (floats;
  integers truncated): frameworks told "nccl" average so (Lightning's ``self.log(sync_dist=True)``).
* ``TCPStore`` on a torch built without libuv (torch 2.4's Windows wheels): the stores torch's
  launchers and ``env://`` ask for use the backend the build has (:mod:`dmlshim.patches._store`).
"""

from __future__ import annotations

import logging
import weakref
from datetime import timedelta
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
import torch.distributed as dist

from dmlshim import devicemap, events
from dmlshim.patching import Owns, Patch, called_from_torch

log = logging.getLogger("dmlshim")

STAGING_BACKEND = "dmlshim"  # the name torch's own code sees for the staging group
# backends a CUDA script may ask for that the target cannot run as they are
_CUDA_BACKENDS = ("nccl", "gloo", "undefined")
# ProcessGroup methods whose first argument receives the result (all but send).
_IN_PLACE = {"allreduce", "allreduce_coalesced", "broadcast", "reduce"}
_OUTPUT_FIRST = {
    "allgather", "allgather_coalesced", "_allgather_base", "all_gather_single",
    "allgather_into_tensor_coalesced", "all_gather_single_coalesced",
    "reduce_scatter", "_reduce_scatter_base", "reduce_scatter_single",
    "reduce_scatter_tensor_coalesced", "reduce_scatter_single_coalesced",
    "alltoall", "alltoall_base", "all_to_all_single", "gather", "scatter",
    "recv", "recv_anysource",
}
_INPUT_ONLY = {"send"}
# collectives that can average (ReduceOp.AVG), by their parameters' names (the result first)
_AVERAGING = {"all_reduce": ("tensor", "op", "group", "async_op"),
              "reduce_scatter": ("output", "input_list", "op", "group", "async_op"),
              "reduce_scatter_tensor": ("output", "input", "op", "group", "async_op")}



# -- which backend does the work ----------------------------------------------------------

def requested_name(backend: Any) -> str:
    """The backend string torch would record on a CUDA machine for ``backend``."""
    if backend is None:
        return "undefined"
    return str(dist.Backend(str(backend)))


def actual_backend(backend: Any, caps) -> Any:
    """The backend that runs ``backend`` (as a CUDA script asked for it) on the target of
    ``caps``.

    ``nccl``, ``gloo``, unset and ``device:backend`` lists made of those become ``gloo`` on the
    CPU and the staging group on DirectML. Anything else (mpi, ucc, a custom plugin) is left to
    torch, which says itself whether it can run here.
    """
    text = "undefined" if backend is None else str(backend).strip().lower()
    if ":" in text:
        names = {pair.split(":", 1)[1].strip() for pair in text.split(",") if ":" in pair}
    else:
        names = {text}
    if not names or not names <= set(_CUDA_BACKENDS):
        return backend
    return STAGING_BACKEND if caps.directml else "gloo"


def _cuda_device_arg(value: Any) -> bool:
    return value is not None and devicemap.is_cuda_device(value, int_is_cuda=True)


# -- staging process group ----------------------------------------------------------------

def _needs_staging(t: Any) -> bool:
    return isinstance(t, torch.Tensor) and t.device.type not in ("cpu", "cuda", "meta")


def _completed_work(result: List[torch.Tensor]) -> dist.Work:
    """A finished collective: ``wait()`` returns at once, the future holds ``result``.

    A C++ Work wrapping a completed future, not a Python subclass of Work: torch 2.4 keeps only
    the C++ half of a Python Work alive once C++ code (DDP) holds it, and its ``wait()`` then
    blocks forever.
    """
    future: torch.futures.Future = torch.futures.Future()
    future.set_result(result)
    return torch._C._distributed_c10d._create_work_from_future(future)


class _Stager:
    """Replace device tensors in a collective's arguments by CPU copies; copy results back."""

    def __init__(self, stage: Callable[[Any], bool]) -> None:
        self._stage = stage
        self.pairs: List[Tuple[torch.Tensor, torch.Tensor]] = []  # (device tensor, CPU copy)
        self.found = False

    def convert(self, value: Any, copy_data: bool, copy_back: bool) -> Any:
        if isinstance(value, torch.Tensor):
            if not self._stage(value):
                return value
            self.found = True
            with torch.no_grad():
                host = value.detach().to("cpu") if copy_data else torch.empty_like(value, device="cpu")
            if copy_back:
                self.pairs.append((value, host))
            return host
        if isinstance(value, (list, tuple)):
            return type(value)(self.convert(v, copy_data, copy_back) for v in value)
        return value

    def copy_back(self) -> None:
        with torch.no_grad():
            for device_tensor, host in self.pairs:
                device_tensor.copy_(host)


class StagingProcessGroup(dist.ProcessGroup):
    """A gloo process group that also takes DirectML tensors, staging them through the CPU.

    Calls without a DirectML tensor go to gloo as they are (asynchronous as usual). Calls with
    one copy it to the CPU, wait for gloo, and copy the result back before returning a finished
    Work, so the caller may use the tensor at once — as after a CUDA collective on its stream.
    """

    def __init__(self, store, rank: int, size: int, timeout: timedelta,
                 stage: Callable[[Any], bool] = _needs_staging) -> None:
        super().__init__(rank, size)
        gloo = dist.ProcessGroupGloo(store, rank, size, timeout)
        if hasattr(gloo, "_set_sequence_number_for_group"):
            gloo._set_sequence_number_for_group()
        gloo_type = dist.ProcessGroup.BackendType.GLOO
        # The inner group runs gloo on CPU tensors; this group answers torch's queries about
        # devices and backends with the same gloo backend (cpu and the DirectML device type).
        self._inner = _plain_process_group(store, rank, size, timeout)
        self._inner._register_backend(torch.device("cpu"), gloo_type, gloo)
        if hasattr(self._inner, "_set_default_backend"):
            self._inner._set_default_backend(gloo_type)
        for device_type in ("cpu", torch._C._get_privateuse1_backend_name()):
            self._register_backend(torch.device(device_type), gloo_type, gloo)
        if hasattr(self, "_set_default_backend"):
            self._set_default_backend(gloo_type)
        self._gloo = gloo
        self._stage = stage

    def _run(self, name: str, args: Sequence[Any], kwargs: Dict[str, Any]) -> Any:
        stager = _Stager(self._stage)
        args = list(args)
        if args:
            if name in _INPUT_ONLY:
                args[0] = stager.convert(args[0], copy_data=True, copy_back=False)
            else:
                args[0] = stager.convert(args[0], copy_data=name in _IN_PLACE, copy_back=True)
        for i in range(1, len(args)):
            args[i] = stager.convert(args[i], copy_data=True, copy_back=False)
        method = getattr(self._inner, name)
        if not stager.found:
            return method(*args, **kwargs)
        events.note("distributed.staged." + name)
        work = method(*args, **kwargs)
        if work is not None:
            work.wait()
        stager.copy_back()
        return _completed_work([d for d, _ in stager.pairs])

    def barrier(self, opts=None):  # noqa: D102
        new = dist.BarrierOptions()
        if opts is not None:
            new.timeout = opts.timeout
        if hasattr(new, "device"):
            new.device = torch.device("cpu")  # gloo's barrier needs no device tensor
        return self._inner.barrier(new)

    def getBackendName(self) -> str:  # noqa: N802 - name of the C++ virtual
        return "gloo"

    def size(self) -> int:  # noqa: D102
        return self._inner.size()

    def rank(self) -> int:  # noqa: D102
        return self._inner.rank()


def _plain_process_group(store, rank: int, size: int, timeout: timedelta) -> dist.ProcessGroup:
    if hasattr(dist.ProcessGroup, "Options"):  # torch < 2.5: the group takes base options
        options = dist.ProcessGroup.Options(backend="gloo")
        options._timeout = timeout
        return dist.ProcessGroup(store, rank, size, options)
    return dist.ProcessGroup(store, rank, size)


def _forwarder(name: str):
    def method(self, *args, **kwargs):
        return self._run(name, args, kwargs)

    method.__name__ = name
    return method


for _name in sorted(_IN_PLACE | _OUTPUT_FIRST | _INPUT_ONLY):
    if hasattr(dist.ProcessGroup, _name):
        setattr(StagingProcessGroup, _name, _forwarder(_name))
del _name


def _create_staging_group(store, rank: int, size: int, timeout: timedelta) -> StagingProcessGroup:
    return StagingProcessGroup(store, rank, size, timeout)


# -- the patch ----------------------------------------------------------------------------

class DistributedPatch(Patch):
    name = "distributed"
    owns = (Owns("torch.distributed", ("init_process_group", "new_group", "get_backend",
                                     "is_nccl_available", "is_backend_available",
                                     *_AVERAGING)),
            Owns("torch.distributed.distributed_c10d", ("init_process_group", "new_group",
                                                        "get_backend", "is_nccl_available",
                                                        "is_backend_available", *_AVERAGING)),
            Owns("torch.distributed.TCPStore", ("__init__",)),
            Owns("torch.nn.parallel.DistributedDataParallel", ("__init__",)),
            Owns("torch.nn.DataParallel", ("__init__",)))

    def applies(self, caps) -> bool:
        return caps.redirects and dist.is_available()

    def _install(self, caps, config) -> None:
        import torch.distributed.distributed_c10d as c10d

        # process group -> the backend string the script asked for (what dist.get_backend
        # answers it), for this installation's groups
        self._requested: weakref.WeakKeyDictionary[Any, str] = weakref.WeakKeyDictionary()
        if caps.directml:
            self._register_staging_backend()
        self._install_init(caps, c10d)
        self._install_answers(c10d)
        self._install_average(c10d)
        self._install_store()
        self._install_ddp(caps, config)
        if caps.directml:
            self._install_data_parallel()

    # -- Backend.register_backend, undone at uninstall ---------------------------------------
    def _register_staging_backend(self) -> None:
        backend_cls = dist.Backend
        saved = {
            "attr": STAGING_BACKEND.upper() in vars(backend_cls),
            "list": list(backend_cls.backend_list),
            "map": dict(backend_cls.default_device_backend_map),
            "capability": dict(backend_cls.backend_capability),
            "types": dict(backend_cls.backend_type_map),
            "plugins": dict(backend_cls._plugins),
        }
        devices = ["cpu", torch._C._get_privateuse1_backend_name()]
        backend_cls.register_backend(STAGING_BACKEND, _create_staging_group, devices=devices)

        def undo() -> None:
            backend_cls.backend_list[:] = saved["list"]
            for attr in ("default_device_backend_map", "backend_capability", "backend_type_map",
                         "_plugins"):
                current = getattr(backend_cls, attr)
                current.clear()
                current.update(saved[{"default_device_backend_map": "map",
                                      "backend_capability": "capability",
                                      "backend_type_map": "types", "_plugins": "plugins"}[attr]])
            if not saved["attr"] and STAGING_BACKEND.upper() in vars(backend_cls):
                delattr(backend_cls, STAGING_BACKEND.upper())

        self.on_undo(undo)

    # -- init_process_group / new_group -----------------------------------------------------
    def _install_init(self, caps, c10d) -> None:
        requested_of = self._requested
        def init_process_group(wrapped, instance, args, kwargs):
            args = list(args)
            requested = args[0] if args else kwargs.get("backend")
            actual = actual_backend(requested, caps)
            if args:
                args[0] = actual
            else:
                kwargs["backend"] = actual
            device_id = kwargs.get("device_id")
            if _cuda_device_arg(device_id):
                # binds the group to a CUDA device for eager NCCL set-up; gloo has nothing to bind
                kwargs["device_id"] = None
                events.redirected("init_process_group(device_id)", device_id, None, tag="dropped")
            if str(actual) != str(requested):
                events.redirected("torch.distributed.init_process_group", requested, actual)
            # several processes: `cuda:{rank}` must find an adapter even with fewer adapters
            devicemap.set_wrap_ordinals(True)
            result = wrapped(*args, **kwargs)
            requested_of[c10d._get_default_group()] = requested_name(requested)
            return result

        def new_group(wrapped, instance, args, kwargs):
            requested = kwargs.get("backend")
            if len(args) >= 3:
                requested = args[2]
            if requested is not None:
                actual = actual_backend(requested, caps)
                if len(args) >= 3:
                    args = args[:2] + (actual,) + args[3:]
                else:
                    kwargs["backend"] = actual
                shown: Optional[str] = requested_name(requested)
            else:  # the default group's backend, as the script was told it
                shown = requested_of.get(c10d._get_default_group()) if c10d.is_initialized() \
                    else None
            group = wrapped(*args, **kwargs)
            if shown is not None and isinstance(group, dist.ProcessGroup):
                requested_of[group] = shown
            return group

        for owner in (dist, c10d):
            self.wrap(owner, "init_process_group", init_process_group)
            self.wrap(owner, "new_group", new_group)

    # -- what the script is told --------------------------------------------------------------
    def _install_answers(self, c10d) -> None:
        requested_of = self._requested

        def get_backend(wrapped, instance, args, kwargs):
            real = wrapped(*args, **kwargs)
            if called_from_torch():
                return real
            group = args[0] if args else kwargs.get("group")
            if group is None:
                group = c10d._get_default_group()
            answer = requested_of.get(group)
            return dist.Backend(answer) if answer is not None else real

        def nccl_available(wrapped, instance, args, kwargs):
            if called_from_torch():
                return wrapped(*args, **kwargs)
            return True

        def backend_available(wrapped, instance, args, kwargs):
            name = args[0] if args else kwargs.get("backend")
            if not called_from_torch() and str(name).lower() == "nccl":
                return True
            return wrapped(*args, **kwargs)

        for owner in (dist, c10d):
            self.wrap(owner, "get_backend", get_backend)
            self.wrap(owner, "is_nccl_available", nccl_available)
            if hasattr(owner, "is_backend_available"):
                self.wrap(owner, "is_backend_available", backend_available)

    # -- ReduceOp.AVG on a script's NCCL -----------------------------------------------------
    def _install_average(self, c10d) -> None:
        requested_of = self._requested
        average, total = dist.ReduceOp.AVG, dist.ReduceOp.SUM

        def averaging(names: Tuple[str, ...]):
            def wrapper(wrapped, instance, args, kwargs):
                bound = dict(zip(names, args), **kwargs)
                if bound.get("op") != average:
                    return wrapped(*args, **kwargs)
                group = bound.get("group") or c10d._get_default_group()
                if requested_of.get(group, "gloo") == "gloo":
                    return wrapped(*args, **kwargs)  # gloo asked for: its own refusal
                # what NCCL's ncclAvg does: the sum divided by the group's size (integers with
                # C's division, toward zero), here on the gloo that runs the script's NCCL
                async_op = bound.pop("async_op", False)
                wrapped(**dict(bound, op=total))
                result = bound[names[0]]
                size = dist.get_world_size(group)
                with torch.no_grad():
                    if result.is_floating_point() or result.is_complex():
                        result.div_(size)
                    else:
                        result.div_(size, rounding_mode="trunc")
                events.redirected(f"dist.{wrapped.__name__}(op=AVG)", "AVG", "SUM / world size")
                return _completed_work([result]) if async_op else None
            return wrapper

        for name, names in _AVERAGING.items():
            for owner in (dist, c10d):
                self.wrap(owner, name, averaging(names))

    # -- the rendezvous store -----------------------------------------------------------------
    def _install_store(self) -> None:
        # torch 2.4's launchers ask every TCPStore for libuv, which its Windows wheels lack:
        # there (only there: the store itself says so) they get the backend the build has
        from dmlshim.patches._store import StoreBackend

        self.store_backend = StoreBackend()
        self.wrap(dist.TCPStore, "__init__", self.store_backend)

    # -- DistributedDataParallel(device_ids=[local_rank], output_device=local_rank) ----------
    def _install_ddp(self, caps, config) -> None:
        from torch.nn.parallel import DistributedDataParallel

        # DirectML tensors have no storage, which DDP's Reducer reads (fact 8): there the
        # script gets DeviceDistributedDataParallel, unless DMLSHIM_GUARDS=off asks for torch's.
        device_ddp = caps.directml and config.guards == "on"

        def ddp_init(wrapped, instance, args, kwargs):
            # On a CUDA machine device_ids names the one GPU of this process; everywhere else
            # torch wants None (the module's own device is used).
            args = list(args)
            input_device = None
            for pos, key in ((1, "device_ids"), (2, "output_device")):
                value = args[pos] if len(args) > pos else kwargs.get(key)
                if value is None:
                    continue
                values = value if isinstance(value, (list, tuple)) else [value]
                if values and all(_cuda_device_arg(v) for v in values):
                    for v in values:
                        devicemap.check_index(v if isinstance(v, int) else (devicemap.cuda_index(v) or 0))
                    if key == "device_ids" and len(values) == 1:
                        v = values[0]
                        input_device = devicemap.device_for(
                            v if isinstance(v, int) else devicemap.cuda_index(v))
                    if len(args) > pos:
                        args[pos] = None
                    else:
                        kwargs[key] = None
                    events.redirected(f"DistributedDataParallel({key})", value, None, tag="dropped")
            module = args[0] if args else kwargs.get("module")
            if device_ddp and _on_device(module, caps):
                from dmlshim.patches._ddp_device import DeviceDistributedDataParallel

                instance.__class__ = DeviceDistributedDataParallel
                events.redirected("DistributedDataParallel", "Reducer",
                                  "gradients all-reduced through the host", tag="emulated")
                return DeviceDistributedDataParallel.__init__(
                    instance, *args, input_device=input_device, **kwargs)
            return wrapped(*args, **kwargs)

        self.wrap(DistributedDataParallel, "__init__", ddp_init)

    # -- nn.DataParallel ---------------------------------------------------------------------
    def _install_data_parallel(self) -> None:
        self.wrap(torch.nn.DataParallel, "__init__", _data_parallel_init)


def _on_device(module: Any, caps) -> bool:
    """Whether ``module``'s parameters are on the target's DirectML device type."""
    if not isinstance(module, torch.nn.Module):
        return False
    return any(p.device.type == caps.device_type for p in module.parameters())


def _data_parallel_init(wrapped, instance, args, kwargs):
    """``nn.DataParallel`` on DirectML: the wrapper runs the module on one adapter.

    torch's DataParallel splits batches with CUDA's scatter/gather kernels and broadcasts
    replicas device-to-device; torch-directml has neither, and copies between two DirectML
    adapters return zeros (microsoft/DirectML#443). The module therefore runs, unsplit, on the
    adapter its parameters are on — results are those of one GPU, as torch's own DataParallel
    gives with one device. DistributedDataParallel with one process per adapter uses them all.
    """
    module = args[0] if args else kwargs["module"]
    device_ids = args[1] if len(args) > 1 else kwargs.get("device_ids")
    output_device = args[2] if len(args) > 2 else kwargs.get("output_device")
    dim = args[3] if len(args) > 3 else kwargs.get("dim", 0)
    torch.nn.Module.__init__(instance)
    torch._C._log_api_usage_once("torch.nn.parallel.DataParallel")
    target = devicemap.target()
    count = target.count if target is not None else 1
    ids = list(device_ids) if device_ids is not None else list(range(count))
    instance.module = module
    instance.dim = dim
    instance.device_ids = []  # torch's forward then calls the module as it is
    if len(ids) == 1:
        # torch moves the module to its single device
        index = ids[0] if isinstance(ids[0], int) else devicemap.cuda_index(ids[0])
        device = devicemap.device_for(index if isinstance(index, int) else None)
        module.to(device)
    instance.output_device = output_device
    events.redirected("nn.DataParallel", device_ids if device_ids is not None else "all devices",
                      "one adapter", tag="emulated")
