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
import inspect
import sys
import time
import types
from collections import OrderedDict, namedtuple
from typing import Any, Callable, Dict, Optional, Tuple

import torch
import wrapt

from dmlshim import backend, conversions, current, devicemap, events
from dmlshim.backend import _index
from dmlshim.patching import Owns, Patch, called_from_torch, get_original


class UnsupportedCudaAPI(RuntimeError):
    """A torch.cuda API with no DirectML/CPU equivalent."""


# Emulations take exactly torch's parameters (names, defaults, / and * markers): scripts call
# them by keyword (timm: torch.cuda.stream(stream=s)). Where torch releases differ, the
# emulation follows the installed torch; tests/test_signatures.py compares them all.
def _torch_signature(name: str) -> Optional[inspect.Signature]:
    try:
        return inspect.signature(get_original(torch.cuda, name))
    except (AttributeError, TypeError, ValueError):
        return None


def _torch_params(name: str) -> Dict[str, inspect.Parameter]:
    sig = _torch_signature(name)
    return dict(sig.parameters) if sig is not None else {}


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

    if "external" in _torch_params("Event"):  # torch >= 2.7
        def __init__(self, enable_timing: bool = False, blocking: bool = False,
                     interprocess: bool = False, external: bool = False) -> None:
            self._setup(enable_timing, blocking)
    else:
        def __init__(self, enable_timing: bool = False, blocking: bool = False,  # type: ignore[misc]
                     interprocess: bool = False) -> None:
            self._setup(enable_timing, blocking)

    def _setup(self, enable_timing: bool, blocking: bool) -> None:
        self.enable_timing = enable_timing
        self.blocking = blocking
        self._time: Optional[float] = None
        self._device = devicemap.current_index()

    @classmethod
    def from_ipc_handle(cls, device, handle):
        raise UnsupportedCudaAPI("dmlshim: torch.cuda.Event.from_ipc_handle has no DirectML/CPU "
                                 "equivalent; share tensors through torch.multiprocessing")

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

    @staticmethod
    def priority_range():
        return (0, 0)  # one priority: every stream is an in-order queue on the device

    def synchronize(self) -> None:
        backend.synchronize(self.device_index)

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:
        return False  # no CUDA graph is ever being captured here

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


class StreamTable:
    """The streams of one installation (held by the cuda_api patch): each device's default
    stream, and the current one where a script set another."""

    def __init__(self) -> None:
        self.default: Dict[int, Stream] = {}
        self.current: Dict[int, Stream] = {}


def _streams() -> StreamTable:
    shim = current.session
    patch = shim.patch(CudaAPIPatch.name) if shim is not None else None
    return patch.streams if patch is not None else StreamTable()  # not installed: nothing kept


def default_stream(device: Any = None) -> Stream:
    idx = _index(device)
    default = _streams().default
    if idx not in default:
        default[idx] = Stream(idx)
    return default[idx]


def current_stream(device: Any = None) -> Stream:
    idx = _index(device)
    return _streams().current.get(idx) or default_stream(idx)


def set_stream(stream: Stream):
    if stream is not None:
        _streams().current[stream.device_index] = stream


class StreamContext:
    """``with torch.cuda.stream(s):`` — ``s`` is the current stream of its device in the block."""

    def __init__(self, stream: Optional[Stream]) -> None:
        self.stream = stream
        self._prev: Optional[Stream] = None

    def __enter__(self):
        s = self.stream
        if s is not None:
            current = _streams().current
            self._prev = current.get(s.device_index)
            current[s.device_index] = s

    def __exit__(self, type: Any, value: Any, traceback: Any):  # noqa: A002 - torch's names
        s = self.stream
        if s is None:
            return
        current = _streams().current
        if self._prev is None:
            current.pop(s.device_index, None)
        else:
            current[s.device_index] = self._prev


def stream(stream: Optional[Stream]) -> StreamContext:
    return StreamContext(stream)


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

    def __exit__(self, type: Any, value: Any, traceback: Any) -> bool:  # noqa: A002
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


def _device_properties(device: Any) -> Any:
    idx = _index(device)
    # Capability (0, 0): no compute-capability-gated CUDA feature (bf16, TF32, flash attention)
    # exists on DirectML or the CPU, so scripts take their conservative branch.
    return _DeviceProperties(backend.device_name(idx), backend.total_memory(idx), 0, 0,
                             backend.processor_count(idx), False, False, 0, "", "")


if _torch_params("get_device_properties").get("device", inspect.Parameter(
        "device", inspect.Parameter.POSITIONAL_OR_KEYWORD)).default is inspect.Parameter.empty:
    def get_device_properties(device: Any) -> Any:  # torch < 2.5: the device is required
        return _device_properties(device)
else:
    def get_device_properties(device: Any = None) -> Any:  # type: ignore[misc]
        return _device_properties(device)


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


def make_graphed_callables(callables, sample_args, *args, **kwargs):
    # Without CUDA graphs the eager callables are the correct (if slower) result. The
    # parameters are the installed torch's (they grow between releases).
    signature = _torch_signature("make_graphed_callables")
    if signature is not None:
        signature.bind(callables, sample_args, *args, **kwargs)  # torch's TypeErrors
    return callables


if _torch_signature("make_graphed_callables") is not None:
    make_graphed_callables.__signature__ = _torch_signature(  # type: ignore[attr-defined]
        "make_graphed_callables")


def is_bf16_supported(including_emulation: bool = True) -> bool:
    from dmlshim.patches import bf16  # DirectML: DMLSHIM_BF16 converts bf16, unless "error"

    answer = bf16.reports_supported()
    return backend.has_bf16() if answer is None else answer


def current_device() -> int:
    return devicemap.current_index()


def _unsupported(name: str, workaround: str) -> Callable[..., Any]:
    def fail(*args: Any, **kwargs: Any) -> Any:
        sig = _torch_signature(name)
        if sig is not None:  # arguments torch itself would refuse get torch's TypeError first
            sig.bind(*args, **kwargs)
        t = devicemap.target()
        events.redirected("torch.cuda." + name, "", "error", tag="unsupported")
        raise UnsupportedCudaAPI(
            f"dmlshim: torch.cuda.{name} has no equivalent on the {t.kind if t else ''} target; "
            f"{workaround}")

    fail.__name__ = name
    return fail


# what the call-site log shows as it is when an emulated call returns it
_SHOWN = (bool, int, float, str, torch.device)


def _noop(*args: Any, **kwargs: Any) -> None:
    return None


# Small emulations, each with torch's own parameters.
def is_available() -> bool:
    return True


def is_initialized() -> bool:
    return True


def init() -> None:
    return None


def empty_cache() -> None:
    backend.empty_cache()


def reset_accumulated_memory_stats(device: Any = None) -> None:
    return None


def memory_usage(device: Any = None) -> int:
    return 0


def is_current_stream_capturing() -> bool:
    return False


def is_tf32_supported() -> bool:
    return False


def get_arch_list() -> list:
    return []


def get_gencode_flags() -> str:
    return ""


def can_device_access_peer(device: Any, peer_device: Any) -> bool:
    return False


def ipc_collect() -> None:
    return None


def set_per_process_memory_fraction(fraction, device: Any = None) -> None:
    return None


def get_per_process_memory_fraction(device: Any = None) -> float:
    return 1.0


def set_sync_debug_mode(debug_mode) -> None:
    return None


def get_sync_debug_mode() -> int:
    return 0


def get_allocator_backend() -> str:
    return "native"


def host_memory_stats() -> Dict[str, Any]:
    return {}


def reset_peak_host_memory_stats() -> None:
    return None


def reset_accumulated_host_memory_stats() -> None:
    return None


# the emulations whose answer never changes (called without arguments, the wrapper returns it)
_NOT_CONSTANT = object()
CONSTANT_ANSWERS: Dict[Callable[..., Any], Any] = {
    is_available: True, is_initialized: True, init: None, is_current_stream_capturing: False,
    is_tf32_supported: False, ipc_collect: None,
}

EMULATED: Dict[str, Callable[..., Any]] = {
    "is_available": is_available,
    "is_initialized": is_initialized,
    "init": init,
    "device_count": device_count,
    "current_device": current_device,
    "set_device": set_device,
    "get_device_name": get_device_name,
    "get_device_properties": get_device_properties,
    "get_device_capability": get_device_capability,
    "synchronize": synchronize,
    "empty_cache": empty_cache,
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
    "reset_accumulated_memory_stats": reset_accumulated_memory_stats,
    "mem_get_info": mem_get_info,
    "memory_stats": memory_stats,
    "memory_stats_as_nested_dict": memory_stats,
    "memory_summary": memory_summary,
    "memory_usage": memory_usage,
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
    "is_current_stream_capturing": is_current_stream_capturing,
    "is_bf16_supported": is_bf16_supported,
    "is_tf32_supported": is_tf32_supported,
    "get_arch_list": get_arch_list,
    "get_gencode_flags": get_gencode_flags,
    "can_device_access_peer": can_device_access_peer,
    "ipc_collect": ipc_collect,
    "set_per_process_memory_fraction": set_per_process_memory_fraction,
    "get_per_process_memory_fraction": get_per_process_memory_fraction,
    "set_sync_debug_mode": set_sync_debug_mode,
    "get_sync_debug_mode": get_sync_debug_mode,
    "get_allocator_backend": get_allocator_backend,
    "host_memory_stats": host_memory_stats,
    "host_memory_stats_as_nested_dict": host_memory_stats,
    "reset_peak_host_memory_stats": reset_peak_host_memory_stats,
    "reset_accumulated_host_memory_stats": reset_accumulated_host_memory_stats,
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


def legacy_dtype(arg: Any) -> Optional[torch.dtype]:
    """``Tensor.type``'s policy: the dtype of the CUDA legacy tensor type ``arg`` names (the
    class ``torch.cuda.FloatTensor`` or the string ``"torch.cuda.FloatTensor"``), else None."""
    if isinstance(arg, str):
        name = arg[len("torch.cuda."):] if arg.startswith("torch.cuda.") else None
    elif isinstance(arg, _LegacyTensorType):
        name = arg.__name__
    else:
        name = None
    return LEGACY_TENSOR_TYPES.get(name) if name is not None else None


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

# torch.accelerator (torch >= 2.6) answered for the script as on a CUDA machine, with torch
# 2.13's parameters. On older torch (2.4.1, what torch-directml pins) the shim installs a
# stand-in module with these names, so scripts written for newer torch run there too.
class _Accelerator:
    """Namespace of the torch.accelerator emulations (torch's names, torch's parameters)."""

    @staticmethod
    def is_available() -> bool:
        return True

    @staticmethod
    def current_accelerator(check_available: bool = False) -> torch.device:
        return torch.device("cuda")

    @staticmethod
    def device_count() -> int:
        return device_count()

    @staticmethod
    def current_device_index() -> int:
        return devicemap.current_index()

    @staticmethod
    def set_device_index(device: Any, /) -> None:
        set_device(device)

    @staticmethod
    def synchronize(device: Any = None, /) -> None:
        synchronize(device)

    @staticmethod
    def get_device_capability(device: Any = None, /) -> Dict[str, Any]:
        _index(device)
        return {"major": 0, "minor": 0}

    @staticmethod
    def current_stream(device: Any = None, /) -> Stream:
        return current_stream(device)

    @staticmethod
    def set_stream(stream: Stream) -> None:
        set_stream(stream)

    # torch.accelerator.memory
    @staticmethod
    def empty_cache() -> None:
        backend.empty_cache()

    @staticmethod
    def empty_host_cache() -> None:
        return None

    @staticmethod
    def memory_allocated(device_index: Any = None, /) -> int:
        return memory_allocated(device_index)

    @staticmethod
    def max_memory_allocated(device_index: Any = None, /) -> int:
        return max_memory_allocated(device_index)

    @staticmethod
    def memory_stats(device_index: Any = None, /) -> Dict[str, Any]:
        return OrderedDict(memory_stats(device_index))

    @staticmethod
    def reset_peak_memory_stats(device_index: Any = None, /) -> None:
        reset_peak_memory_stats(device_index)

    @staticmethod
    def reset_accumulated_memory_stats(device_index: Any = None, /) -> None:
        _index(device_index)

    @staticmethod
    def get_memory_info(device_index: Any = None, /) -> Tuple[int, int]:
        return mem_get_info(device_index)


class accelerator_device_index:  # noqa: N801 - mirrors torch.accelerator.device_index
    """``with torch.accelerator.device_index(i):`` — the current adapter for the block."""

    def __init__(self, device: Optional[int], /) -> None:
        self.idx = device
        self.prev_idx = -1

    def __enter__(self) -> None:
        if self.idx is not None:
            self.prev_idx = devicemap.current_index()
            set_device(self.idx)

    def __exit__(self, *exc_info: object) -> None:
        if self.idx is not None:
            devicemap.set_current_index(self.prev_idx)


_acc = _Accelerator
ACCELERATOR_MEMORY: Dict[str, Callable[..., Any]] = {
    "empty_cache": _acc.empty_cache,
    "empty_host_cache": _acc.empty_host_cache,
    "memory_allocated": _acc.memory_allocated,
    "memory_reserved": _acc.memory_allocated,
    "max_memory_allocated": _acc.max_memory_allocated,
    "max_memory_reserved": _acc.max_memory_allocated,
    "memory_stats": _acc.memory_stats,
    "reset_peak_memory_stats": _acc.reset_peak_memory_stats,
    "reset_accumulated_memory_stats": _acc.reset_accumulated_memory_stats,
    "get_memory_info": _acc.get_memory_info,
}
ACCELERATOR: Dict[str, Callable[..., Any]] = {
    "is_available": _acc.is_available,
    "current_accelerator": _acc.current_accelerator,
    "device_count": _acc.device_count,
    "current_device_index": _acc.current_device_index,
    "current_device_idx": _acc.current_device_index,
    "set_device_index": _acc.set_device_index,
    "set_device_idx": _acc.set_device_index,
    "synchronize": _acc.synchronize,
    "get_device_capability": _acc.get_device_capability,
    "current_stream": _acc.current_stream,
    "set_stream": _acc.set_stream,
    **ACCELERATOR_MEMORY,  # torch.accelerator re-exports torch.accelerator.memory's functions
}
ACCELERATOR_CLASSES: Dict[str, type] = {"device_index": accelerator_device_index}


NVTX_NOOPS = ("range_push", "range_pop", "range_start", "range_end", "mark", "range")


@contextlib.contextmanager
def _nvtx_range(*args: Any, **kwargs: Any):
    yield


class CudaAPIPatch(Patch):
    name = "cuda_api"
    owns = (Owns("torch.cuda", "*"), Owns("torch.cuda.nvtx", "*"), Owns("torch.accelerator", "*"),
            Owns("torch.accelerator.memory", "*"),
            Owns("torch.backends.cudnn", ("is_available", "version")))

    def applies(self, caps) -> bool:
        return True

    def _install(self, caps, config) -> None:
        if not caps.redirects:
            return  # real CUDA answers for itself: a pass-through wrapper would only cost time
        self.streams = StreamTable()
        cuda = torch.cuda
        callers = current.session.torch_callers  # called_from_torch's memo, read inline

        def route(name: str, emulation: Callable[..., Any], api: str = ""):
            api = api or "torch.cuda." + name
            constant = CONSTANT_ANSWERS.get(emulation, _NOT_CONSTANT)

            def wrapper(wrapped, instance, args, kwargs):
                torch_caller = callers.get(sys._getframe(1).f_code)
                if torch_caller is None:
                    torch_caller = called_from_torch()
                if torch_caller:
                    return wrapped(*args, **kwargs)
                if constant is not _NOT_CONSTANT and not args and not kwargs:
                    result = constant  # the emulation's answer, without its frame
                else:
                    result = emulation(*args, **kwargs)
                shim = current.session
                records = shim.events if shim is not None else None
                if records is not None and not records.trace:
                    # events.redirected's count, inline (frameworks ask some of these every
                    # step: transformers is_current_stream_capturing() twice per forward)
                    records.api_counts[api] += 1
                    records.tag_counts["emulated"] += 1
                    records.api_tags[api] = "emulated"
                    return result
                # what the call-site log shows it returned: small values as they are
                shown = result if isinstance(result, _SHOWN) else (
                    "None" if result is None else type(result).__name__)
                events.redirected(api, args[0] if args else "", shown, tag="emulated")
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
            memory = getattr(accelerator, "memory", None)
            for name, emulation in ACCELERATOR_MEMORY.items():
                if memory is not None and hasattr(memory, name):
                    self.wrap(memory, name,
                              route(name, emulation, "torch.accelerator.memory." + name))
        if accelerator is None:
            self._install_accelerator_stand_in(route)
        else:
            for name, cls in ACCELERATOR_CLASSES.items():
                if hasattr(accelerator, name):
                    self.replace(accelerator, name, cls)
        for name, cls in EMULATED_CLASSES.items():
            if hasattr(cuda, name):
                self.replace(cuda, name, cls)
        legacy = {name: _legacy_type(name, dt) for name, dt in LEGACY_TENSOR_TYPES.items()}
        for name, cls in legacy.items():
            if hasattr(cuda, name):
                self.replace(cuda, name, cls)

        # x.type(torch.cuda.FloatTensor): devices.py wraps Tensor.type, this names the dtype
        self.on_undo(conversions.add_policy("Tensor.type", legacy_dtype))
        nvtx = cuda.nvtx
        for name in NVTX_NOOPS:
            if hasattr(nvtx, name):
                self.replace(nvtx, name, _nvtx_range if name == "range" else _noop)
        self._install_backend_flags()

    def _install_accelerator_stand_in(self, route) -> None:
        """torch < 2.6: a ``torch.accelerator`` (and ``.memory``) with newer torch's API.

        Only user code can call it (this torch has no caller of its own), and it leaves
        ``torch`` and ``sys.modules`` exactly as found at uninstall.
        """
        def module(name: str, table: Dict[str, Callable[..., Any]]) -> types.ModuleType:
            mod = types.ModuleType(name, f"dmlshim stand-in for {name} of torch >= 2.6")
            for fname, emulation in table.items():
                setattr(mod, fname, wrapt.FunctionWrapper(emulation, route(
                    fname, emulation, f"{name}.{fname}")))
            mod.__all__ = sorted(table)  # type: ignore[attr-defined]
            return mod

        acc = module("torch.accelerator", ACCELERATOR)
        for name, cls in ACCELERATOR_CLASSES.items():
            setattr(acc, name, cls)
        acc.__all__ = sorted(list(ACCELERATOR) + list(ACCELERATOR_CLASSES))  # type: ignore[attr-defined]
        acc.memory = module("torch.accelerator.memory", ACCELERATOR_MEMORY)  # type: ignore[attr-defined]
        # Not through replace(): there is no original to record, and uninstall deletes it.
        torch.accelerator = acc  # type: ignore[attr-defined]
        mods = {"torch.accelerator": acc, "torch.accelerator.memory": acc.memory}  # type: ignore[attr-defined]
        found = {name: sys.modules.get(name) for name in mods}
        sys.modules.update(mods)

        def restore() -> None:
            if vars(torch).get("accelerator") is acc:
                delattr(torch, "accelerator")
            for name, mod in mods.items():
                if sys.modules.get(name) is mod:
                    if found[name] is None:
                        del sys.modules[name]
                    else:
                        sys.modules[name] = found[name]  # type: ignore[assignment]

        self.on_undo(restore)

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
