"""``torch.cuda.*`` answered for the script, the truth kept for torch.

Every public name of ``torch.cuda`` falls in one of three groups (the tables below; a test
checks that the installed torch has no name outside them):

* EMULATED — answered from the target (DirectML adapter, emulator or CPU);
* ACCEPTED — harmless to run as they are (exceptions, storage types, values) or no-ops;
* UNSUPPORTED — raise :class:`UnsupportedCudaAPI` naming the API and a workaround.

Function wrappers look at their caller: code in the ``torch`` package gets the original (so
``torch.cuda.is_available()`` stays False for torch's own checks and libraries don't go down
CUDA-only paths inside torch), everything else gets the emulation.
"""

from __future__ import annotations

import contextlib
import time
from collections import namedtuple
from typing import Any, Callable, Dict, Optional

import torch

from dmlshim import backend, devicemap, events
from dmlshim.backend import _index
from dmlshim.patching import Patch, called_from_torch


class UnsupportedCudaAPI(RuntimeError):
    """A torch.cuda API with no DirectML/CPU equivalent."""


# -- Streams and events: host-clock timing after a device sync -----------------------------

def _dynamo_bases() -> tuple:
    """torch 2.4's dynamo asserts torch.cuda.Event/Stream inherit the ABCs of torch._streambase;
    later torch made those deprecated aliases of torch.Event/Stream and checks nothing."""
    import abc

    try:
        from torch._streambase import _EventBase, _StreamBase
    except ImportError:
        return object, object
    if type(_EventBase) is abc.ABCMeta and type(_StreamBase) is abc.ABCMeta:
        return _EventBase, _StreamBase
    return object, object


_EventBase, _StreamBase = _dynamo_bases()


class Event(_EventBase):  # type: ignore[misc, valid-type]
    """torch.cuda.Event on a target without CUDA: records the host clock after a device sync."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False,
                 interprocess: bool = False, external: bool = False) -> None:
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._time: Optional[float] = None
        self._device = devicemap.current_index()

    def record(self, stream: Any = None) -> None:
        backend.synchronize(self._device)
        self._time = time.perf_counter()

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        backend.synchronize(self._device)

    def elapsed_time(self, end_event: Event) -> float:
        if not (self.enable_timing and end_event.enable_timing):
            raise RuntimeError("Both events must be created with argument 'enable_timing=True'.")
        if self._time is None or end_event._time is None:
            raise RuntimeError("Both events must be recorded before calculating elapsed time.")
        return (end_event._time - self._time) * 1000.0

    def ipc_handle(self):
        raise UnsupportedCudaAPI("dmlshim: torch.cuda.Event.ipc_handle has no DirectML/CPU "
                                 "equivalent; share tensors through torch.multiprocessing")

    def __repr__(self) -> str:
        return f"<dmlshim Event recorded={self._time is not None}>"


class Stream(_StreamBase):  # type: ignore[misc, valid-type]
    """torch.cuda.Stream stand-in: one in-order queue per device, like the default stream."""

    def __init__(self, device: Any = None, priority: int = 0, **kwargs: Any) -> None:
        self.device_index = _index(device)
        self.device = torch.device("cuda", self.device_index)
        self.priority = priority
        self.cuda_stream = 0
        self._ctx: Optional[Any] = None

    def synchronize(self) -> None:
        backend.synchronize(self.device_index)

    def query(self) -> bool:
        return True

    def wait_event(self, event: Event) -> None:
        pass

    def wait_stream(self, stream: Stream) -> None:
        pass

    def record_event(self, event: Optional[Event] = None) -> Event:
        event = event if event is not None else Event()
        event.record(self)
        return event

    def __enter__(self) -> Stream:
        self._ctx = stream(self)
        self._ctx.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        ctx, self._ctx = self._ctx, None
        if ctx is not None:
            ctx.__exit__(*exc)

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Stream) and other.device_index == self.device_index

    def __hash__(self) -> int:
        return hash(("dmlshim-stream", self.device_index))

    def __repr__(self) -> str:
        return f"<dmlshim Stream device={self.device}>"


_default_streams: Dict[int, Stream] = {}
_current_stream: Dict[int, Stream] = {}


def default_stream(device: Any = None) -> Stream:
    idx = _index(device)
    if idx not in _default_streams:
        _default_streams[idx] = Stream(idx)
    return _default_streams[idx]


def current_stream(device: Any = None) -> Stream:
    idx = _index(device)
    return _current_stream.get(idx) or default_stream(idx)


def set_stream(s: Stream) -> None:
    if s is not None:
        _current_stream[s.device_index] = s


@contextlib.contextmanager
def stream(s: Optional[Stream]):
    if s is None:
        yield
        return
    prev = _current_stream.get(s.device_index)
    _current_stream[s.device_index] = s
    try:
        yield
    finally:
        if prev is None:
            _current_stream.pop(s.device_index, None)
        else:
            _current_stream[s.device_index] = prev


class StreamContext:
    def __init__(self, s: Optional[Stream]) -> None:
        self._cm = stream(s)

    def __enter__(self):
        return self._cm.__enter__()

    def __exit__(self, *exc):
        return self._cm.__exit__(*exc)


class device:  # noqa: N801 - mirrors torch.cuda.device
    """``with torch.cuda.device(i):`` — selects the current adapter for the block."""

    def __init__(self, device: Any) -> None:
        self.idx = -1 if device is None else _index(device)
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx == -1:
            return
        self.prev_idx = devicemap.current_index()
        devicemap.set_current_index(self.idx)

    def __exit__(self, *exc: Any) -> bool:
        if self.prev_idx != -1:
            devicemap.set_current_index(self.prev_idx)
        return False


class device_of(device):  # noqa: N801
    def __init__(self, obj: Any) -> None:
        idx = obj.get_device() if getattr(obj, "is_cuda", False) else -1
        super().__init__(idx if idx >= 0 else None)


# -- properties, memory, rng ---------------------------------------------------------------

_DeviceProperties = namedtuple(
    "_DeviceProperties",
    "name total_memory major minor multi_processor_count is_integrated is_multi_gpu_board "
    "L2_cache_size uuid gcnArchName")


def get_device_properties(device: Any = None) -> Any:
    idx = _index(device)
    # Capability (0, 0): no compute-capability-gated CUDA feature (bf16, TF32, flash attention)
    # exists on DirectML or the CPU, so scripts take their conservative branch.
    return _DeviceProperties(backend.device_name(idx), backend.total_memory(idx), 0, 0,
                             backend.processor_count(idx), False, False, 0, "", "")


def get_device_capability(device: Any = None):
    _index(device)
    return (0, 0)


def get_device_name(device: Any = None) -> str:
    return backend.device_name(_index(device))


def device_count() -> int:
    t = devicemap.target()
    return t.count if t is not None else 0


def set_device(device: Any) -> None:
    idx = _index(device)
    if idx >= 0:
        devicemap.set_current_index(idx)


def synchronize(device: Any = None) -> None:
    backend.synchronize(_index(device))


def memory_allocated(device: Any = None) -> int:
    return backend.memory_allocated(_index(device))


def max_memory_allocated(device: Any = None) -> int:
    return backend.max_memory_allocated(_index(device))


def reset_peak_memory_stats(device: Any = None) -> None:
    backend.reset_peak(_index(device))


def mem_get_info(device: Any = None):
    return backend.mem_get_info(_index(device))


def memory_stats(device: Any = None) -> Dict[str, int]:
    idx = _index(device)
    cur, peak = backend.memory_allocated(idx), backend.max_memory_allocated(idx)
    return {"allocated_bytes.all.current": cur, "allocated_bytes.all.peak": peak,
            "reserved_bytes.all.current": cur, "reserved_bytes.all.peak": peak,
            "active_bytes.all.current": cur, "active_bytes.all.peak": peak,
            "num_alloc_retries": 0, "num_ooms": 0}


def memory_summary(device: Any = None, abbreviated: bool = False) -> str:
    idx = _index(device)
    t = devicemap.target()
    return (f"dmlshim memory summary for cuda:{idx} ({t.kind if t else '?'} target)\n"
            f"  allocated: {backend.memory_allocated(idx) / 2**20:.1f} MiB\n"
            f"  peak:      {backend.max_memory_allocated(idx) / 2**20:.1f} MiB\n")


def list_gpu_processes(device: Any = None) -> str:
    idx = _index(device)
    return f"GPU:{idx}\nprocess information is not available on this target"


def manual_seed(seed: int) -> None:
    # torch-directml draws device random numbers from the CPU generator (facts file).
    torch.manual_seed(int(seed))


def seed() -> None:
    torch.seed()


def initial_seed() -> int:
    return torch.initial_seed()


def get_rng_state(device: Any = "cuda") -> torch.Tensor:
    _index(device)
    return torch.get_rng_state()


def set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    _index(device)
    torch.set_rng_state(new_state)


def get_rng_state_all():
    return [torch.get_rng_state() for _ in range(device_count())]


def set_rng_state_all(new_states) -> None:
    for state in new_states[:1]:
        torch.set_rng_state(state)


def make_graphed_callables(callables, sample_args, *args: Any, **kwargs: Any):
    # Without CUDA graphs the eager callables are the correct (if slower) result.
    return callables


def is_bf16_supported(including_emulation: bool = True) -> bool:
    return backend.has_bf16()


def current_device() -> int:
    return devicemap.current_index()


def _unsupported(name: str, workaround: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        t = devicemap.target()
        events.redirected("torch.cuda." + name, "", "error", tag="unsupported")
        raise UnsupportedCudaAPI(
            f"dmlshim: torch.cuda.{name} has no equivalent on the {t.kind if t else ''} target; "
            f"{workaround}")

    fail.__name__ = name
    return fail


def _shown(result: Any) -> Any:
    """What the call-site log shows an emulated call returned: small values as they are."""
    if result is None or isinstance(result, (bool, int, float, str, torch.device)):
        return result if result is not None else "None"
    return type(result).__name__


def _const(value: Any) -> Callable[..., Any]:
    return lambda *args, **kwargs: value


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


EMULATED: Dict[str, Callable[..., Any]] = {
    "is_available": _const(True),
    "is_initialized": _const(True),
    "init": _noop,
    "device_count": device_count,
    "current_device": current_device,
    "set_device": set_device,
    "get_device_name": get_device_name,
    "get_device_properties": get_device_properties,
    "get_device_capability": get_device_capability,
    "synchronize": synchronize,
    "empty_cache": lambda: backend.empty_cache(),
    "memory_allocated": memory_allocated,
    "memory_reserved": memory_allocated,
    "memory_cached": memory_allocated,
    "device_memory_used": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "max_memory_reserved": max_memory_allocated,
    "max_memory_cached": max_memory_allocated,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "reset_max_memory_allocated": reset_peak_memory_stats,
    "reset_max_memory_cached": reset_peak_memory_stats,
    "reset_accumulated_memory_stats": _noop,
    "mem_get_info": mem_get_info,
    "memory_stats": memory_stats,
    "memory_stats_as_nested_dict": memory_stats,
    "memory_summary": memory_summary,
    "memory_usage": lambda device=None: 0,
    "list_gpu_processes": list_gpu_processes,
    "manual_seed": manual_seed,
    "manual_seed_all": manual_seed,
    "seed": seed,
    "seed_all": seed,
    "initial_seed": initial_seed,
    "get_rng_state": get_rng_state,
    "set_rng_state": set_rng_state,
    "get_rng_state_all": get_rng_state_all,
    "set_rng_state_all": set_rng_state_all,
    "current_stream": current_stream,
    "default_stream": default_stream,
    "set_stream": set_stream,
    "stream": stream,
    "is_current_stream_capturing": _const(False),
    "is_bf16_supported": is_bf16_supported,
    "is_tf32_supported": _const(False),
    "get_arch_list": _const([]),
    "get_gencode_flags": _const(""),
    "can_device_access_peer": _const(False),
    "ipc_collect": _noop,
    "set_per_process_memory_fraction": _noop,
    "get_per_process_memory_fraction": _const(1.0),
    "set_sync_debug_mode": _noop,
    "get_sync_debug_mode": _const(0),
    "get_allocator_backend": _const("native"),
    "host_memory_stats": _const({}),
    "host_memory_stats_as_nested_dict": _const({}),
    "reset_peak_host_memory_stats": _noop,
    "reset_accumulated_host_memory_stats": _noop,
    "make_graphed_callables": make_graphed_callables,
}

# Classes replaced for the script (torch never constructs these itself without CUDA).
EMULATED_CLASSES: Dict[str, type] = {
    "Event": Event, "Stream": Stream, "StreamContext": StreamContext,
    "device": device, "device_of": device_of,
}

# Legacy typed constructors (old GAN/RL code: `Tensor = torch.cuda.FloatTensor`).
LEGACY_TENSOR_TYPES: Dict[str, torch.dtype] = {
    "FloatTensor": torch.float32, "DoubleTensor": torch.float64, "HalfTensor": torch.float16,
    "BFloat16Tensor": torch.bfloat16, "LongTensor": torch.int64, "IntTensor": torch.int32,
    "ShortTensor": torch.int16, "CharTensor": torch.int8, "ByteTensor": torch.uint8,
    "BoolTensor": torch.bool,
}


class _LegacyTensorType(type):
    dtype: torch.dtype

    def __call__(cls, *args: Any, **kwargs: Any) -> torch.Tensor:
        dev = devicemap.device_for(None)
        events.redirected("torch.cuda." + cls.__name__, "", dev)
        if len(args) == 1 and not isinstance(args[0], (int, torch.Size)):
            return torch.as_tensor(args[0], dtype=cls.dtype).to(dev)  # from data
        return torch.empty(*args, dtype=cls.dtype, device=dev)  # from sizes, uninitialised

    def __instancecheck__(cls, obj: object) -> bool:
        return isinstance(obj, torch.Tensor) and obj.dtype == cls.dtype \
            and devicemap.is_target_device(obj.device)


def _legacy_type(name: str, dtype: torch.dtype) -> type:
    return _LegacyTensorType(name, (), {"dtype": dtype, "__module__": "torch.cuda"})


_GRAPHS = "run the captured code eagerly (CUDA graphs only exist on NVIDIA GPUs)"
_ALLOC = "remove the allocator customisation; the target manages its own memory"
UNSUPPORTED: Dict[str, str] = {
    "CUDAGraph": _GRAPHS, "graph": _GRAPHS, "graph_pool_handle": _GRAPHS,
    "export_dot": _GRAPHS, "export_graph_data": _GRAPHS,  # torch >= 2.14
    "caching_allocator_alloc": _ALLOC, "caching_allocator_delete": _ALLOC,
    "caching_allocator_enable": _ALLOC, "caching_allocator_disabled": _ALLOC,
    "CUDAPluggableAllocator": _ALLOC, "change_current_allocator": _ALLOC,
    "MemPool": _ALLOC, "use_mem_pool": _ALLOC, "memory_snapshot": _ALLOC,
    "ExternalStream": "create streams with torch.cuda.Stream()",
    "get_stream_from_external": "create streams with torch.cuda.Stream()",
    "GreenContext": "partitioning GPU multiprocessors is CUDA-only",
    "current_blas_handle": "cuBLAS handles exist on NVIDIA GPUs only",
    "current_solver_handle": "cuSOLVER handles exist on NVIDIA GPUs only",
    "cudart": "the CUDA runtime library is not present",
    "check_error": "the CUDA runtime library is not present",
    "cudaStatus": "the CUDA runtime library is not present",
    "utilization": "read GPU load with the OS tools (Task Manager, radeontop, intel_gpu_top)",
    "temperature": "read GPU sensors with the OS tools",
    "power_draw": "read GPU sensors with the OS tools",
    "clock_rate": "read GPU sensors with the OS tools",
    "jiterator": "write the elementwise op with regular torch ops",
}

# Names left as they are: types, exceptions, values, submodules handled elsewhere.
ACCEPTED = {
    "BFloat16Storage", "BoolStorage", "ByteStorage", "CharStorage", "ComplexDoubleStorage",
    "ComplexFloatStorage", "DoubleStorage", "FloatStorage", "HalfStorage", "IntStorage",
    "LongStorage", "ShortStorage",
    "CudaError", "DeferredCudaCallError", "OutOfMemoryError",
    "amp",  # dmlshim.patches.amp
    "nccl",  # dmlshim.patches.distributed
    "nvtx",  # no-ops, patched below
    "default_generators", "has_half", "has_magma", "graphs", "memory", "profiler", "random",
    "sparse", "streams", "tunable",
    "graph_annotations",  # torch >= 2.14: a submodule of CUDA-graph helpers
}

# torch.accelerator (torch >= 2.6) answered for the script as on a CUDA machine.
ACCELERATOR: Dict[str, Callable[..., Any]] = {
    "is_available": _const(True),
    "current_accelerator": lambda check_available=False: torch.device("cuda"),
    "device_count": device_count,
    "current_device_index": current_device,
    "current_device_idx": current_device,
    "set_device_index": set_device,
    "set_device_idx": set_device,
    "synchronize": synchronize,
    "empty_cache": lambda: backend.empty_cache(),
    "memory_allocated": memory_allocated,
    "memory_reserved": memory_allocated,
    "max_memory_allocated": max_memory_allocated,
    "max_memory_reserved": max_memory_allocated,
    "reset_peak_memory_stats": reset_peak_memory_stats,
    "get_memory_info": mem_get_info,
    "memory_stats": memory_stats,
    "get_device_capability": lambda device=None: {"major": 0, "minor": 0},
}

NVTX_NOOPS = ("range_push", "range_pop", "range_start", "range_end", "mark", "range")


@contextlib.contextmanager
def _nvtx_range(*args: Any, **kwargs: Any):
    yield


class CudaAPIPatch(Patch):
    name = "cuda_api"

    def applies(self, target) -> bool:
        return True

    def _install(self, target, config) -> None:
        cuda = torch.cuda
        passthrough = not target.redirects

        def route(name: str, emulation: Callable[..., Any], api: str = ""):
            api = api or "torch.cuda." + name

            def wrapper(wrapped, instance, args, kwargs):
                if passthrough or called_from_torch():
                    return wrapped(*args, **kwargs)
                result = emulation(*args, **kwargs)
                events.redirected(api, args[0] if args else "", _shown(result), tag="emulated")
                return result

            return wrapper

        for name, emulation in EMULATED.items():
            if hasattr(cuda, name):
                self.wrap(cuda, name, route(name, emulation))
        for name, workaround in UNSUPPORTED.items():
            if hasattr(cuda, name):
                self.wrap(cuda, name, route(name, _unsupported(name, workaround)))
        accelerator = getattr(torch, "accelerator", None)
        if accelerator is not None:
            for name, emulation in ACCELERATOR.items():
                if hasattr(accelerator, name):
                    self.wrap(accelerator, name, route(name, emulation, "torch.accelerator." + name))
        if passthrough:
            return
        for name, cls in EMULATED_CLASSES.items():
            if hasattr(cuda, name):
                self.replace(cuda, name, cls)
        legacy = {name: _legacy_type(name, dt) for name, dt in LEGACY_TENSOR_TYPES.items()}
        for name, cls in legacy.items():
            if hasattr(cuda, name):
                self.replace(cuda, name, cls)

        def tensor_type(wrapped, instance, args, kwargs):
            # x.type(torch.cuda.FloatTensor) / x.type("torch.cuda.FloatTensor")
            arg = args[0] if args else kwargs.get("dtype")
            name = arg if isinstance(arg, str) else getattr(arg, "__name__", None)
            if isinstance(arg, str) and arg.startswith("torch.cuda."):
                name = arg[len("torch.cuda."):]
            elif not (isinstance(arg, type) and isinstance(arg, _LegacyTensorType)):
                name = None
            if name in legacy:
                dev = devicemap.device_for(None)
                events.redirected("Tensor.type", arg, dev)
                return instance.to(device=dev, dtype=LEGACY_TENSOR_TYPES[name],
                                   non_blocking=kwargs.get("non_blocking", False))
            return wrapped(*args, **kwargs)

        self.wrap(torch.Tensor, "type", tensor_type)
        nvtx = cuda.nvtx
        for name in NVTX_NOOPS:
            if hasattr(nvtx, name):
                self.replace(nvtx, name, _nvtx_range if name == "range" else _noop)
        self._install_backend_flags()

    def _install_backend_flags(self) -> None:
        # torch.backends.cudnn/cuda flags are plain settable attributes already; only the
        # availability queries need an answer for scripts that print them.
        cudnn = torch.backends.cudnn

        def cudnn_available(wrapped, instance, args, kwargs):
            if called_from_torch():
                return wrapped(*args, **kwargs)
            return True

        self.wrap(cudnn, "is_available", cudnn_available)
        if hasattr(cudnn, "version"):
            def cudnn_version(wrapped, instance, args, kwargs):
                if called_from_torch():
                    return wrapped(*args, **kwargs)
                return None

            self.wrap(cudnn, "version", cudnn_version)


def public_names() -> set:
    """torch.cuda's public names in the installed torch."""
    return set(getattr(torch.cuda, "__all__", ())) | {"OutOfMemoryError"}
