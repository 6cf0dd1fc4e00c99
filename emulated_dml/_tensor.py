"""The emulated DirectML tensor: a wrapper subclass whose data lives in a CPU tensor.

``EmuTensor`` reports ``device == privateuseone:N`` and carries the PrivateUse1 dispatch
key (so PyTorch treats it as a PrivateUse1 tensor everywhere, e.g. in ``nn.Module._apply``,
``torch.optim``'s foreach defaults, the RNN and dropout code paths), plus the Python key,
which sends every operator that reaches it to ``__torch_dispatch__``. There the operator is
planned once (``_policy.py``) and run on the CPU elems, so results are bit-identical to CPU.
"""

from __future__ import annotations

import collections
import copy
import os
import sys
import threading
from typing import Any, Callable, Dict, Optional, Tuple

import torch

from emulated_dml import _fallback, _memory, _policy
from emulated_dml._state import EmulatorError, check_index, state

F64_MESSAGE = "The GPU device does not support Double (Float64) operations!"
# torch-directml's tensors are OpaqueTensorImpls (fact 8 of the real wheel).
STORAGE_MESSAGE = "Cannot access storage of OpaqueTensorImpl"
# torch.inference_mode() on torch-directml (fact 9): ops on tensors made outside the region fail.
INFERENCE_MESSAGE = "Cannot set version_counter for inference tensor"
# A bfloat16 tensor on torch-directml kills the process (fact 6, #688), from its native code.
BF16_MESSAGE = "dml_util.cc:118 Invalid or unsupported data type BFloat16"
_inference_enabled = torch.is_inference_mode_enabled

_PU1 = torch._C.DispatchKeySet(torch._C.DispatchKey.PrivateUse1)
_CPU = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)
_CPU_DEVICE = torch.device("cpu")
_set_storage = torch.ops.aten.set_.source_Storage_storage_offset
_data_descriptor = torch._C.TensorBase.__dict__["data"]
_impls: set = getattr(torch.library, "_impls", set())

# Filled by the modules that implement special ops, bugs and CPU-less kernels (see _ops.py).
SPECIALS: Dict[str, Callable] = {}
BUGS: Dict[str, Tuple[str, Callable]] = {}
CPU_IMPLS: Dict[str, Callable] = {}
_PLANS: Dict[Any, _policy.Plan] = {}

# Set by _backend.install(): (tensor, message) -> None makes C++ storage access of a wrapper
# throw; (tensor, sizes, strides, offset) -> None sets the metadata of such a wrapper.
refuse_storage: Optional[Callable] = None
set_metadata: Optional[Callable] = None


def _refused() -> NotImplementedError:
    return NotImplementedError(STORAGE_MESSAGE)


def check_float64(dtype: torch.dtype) -> None:
    if dtype is torch.float64 and state.float64:
        raise RuntimeError(F64_MESSAGE)


def abort_bfloat16() -> None:
    """Die as torch-directml does when a bfloat16 tensor reaches the device: a line on stderr
    from its native code, then abort() -- no Python exception, no traceback, no atexit."""
    try:
        sys.stderr.flush()
        os.write(2, (BF16_MESSAGE + "\n").encode())
    finally:
        os.abort()


def _check_inference(args, kwargs) -> None:
    """Inside torch.inference_mode(): refuse device tensors made outside it, as the wheel does."""
    for a in args:
        if type(a) is EmuTensor and not a.is_inference():
            raise RuntimeError(INFERENCE_MESSAGE)
        if (type(a) is list or type(a) is tuple) and a and type(a[0]) is EmuTensor:
            if any(not x.is_inference() for x in a if type(x) is EmuTensor):
                raise RuntimeError(INFERENCE_MESSAGE)
    if kwargs:
        _check_inference(tuple(kwargs.values()), None)
CHANNELS_LAST_MESSAGE = "'memory_format' argument is must be Contiguous for DML tensors"
_REFUSED_FORMATS = (torch.channels_last, torch.channels_last_3d)
def check_memory_format(memory_format) -> None:
    """The ``channels-last`` gap: a channels-last copy to the device is refused.
    Reached from ``_to_copy`` of a device tensor and from the allocation a CPU tensor's
    ``.to(device, memory_format=...)`` makes; ``.contiguous(memory_format=...)`` runs as one
    ``clone`` on the CPU elem and is accepted, as on torch-directml.
    """
    if memory_format in _REFUSED_FORMATS and state.channels_last:
        raise RuntimeError(CHANNELS_LAST_MESSAGE)


class EmuTensor(torch.Tensor):
    """A tensor on an emulated DirectML adapter (``privateuseone:N``); data in ``_elem`` (CPU)."""

    _elem: torch.Tensor
    _index: int

    # Behave like a plain tensor at the Python level (and skip the Python-level overhead).
    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        if state.inference_mode and _inference_enabled():
            _check_inference(args, kwargs)
        plan = _PLANS.get(func)
        if plan is None:
            plan = _PLANS[func] = _policy.build(func, SPECIALS, BUGS, CPU_IMPLS)
        if kwargs is None:
            kwargs = {}
        if plan.out_call and state.out_unsafe:
            check_out_call(plan)
        keys = plan.impl_keys  # PrivateUse1 kernels registered through torch.library:
        if keys[0] in _impls:  # for the op itself
            return call_kernel(func, plan, args, kwargs)
        for key in keys[1:]:  # for its out= variant: PyTorch's structured composite calls it
            if key in _impls:
                return run_composite(func, plan, args, kwargs)
        if plan.special is not None:
            return plan.special(func, plan, args, kwargs)
        if plan.bug is not None and getattr(state, plan.bug_flag):
            return plan.bug(func, plan, args, kwargs)
        kind = plan.kind
        if kind == _policy.DECOMPOSE:
            return run_composite(func, plan, args, kwargs)
        if kind == _policy.FALLBACK:
            return _fallback_call(func, plan, args, kwargs)
        return run_on_cpu(func, plan, args, kwargs)

    # Module._apply assigns `param.data = new` when the types are shallow-copy compatible
    # (emulated -> emulated dtype changes): keep the CPU elem in step with the new metadata.
    @property
    def data(self):
        if state.inference_mode and _inference_enabled() and not self.is_inference():
            raise RuntimeError(INFERENCE_MESSAGE)
        return _data_descriptor.__get__(self, type(self))

    @data.setter
    def data(self, value):
        _data_descriptor.__set__(self, value)
        if isinstance(value, EmuTensor):
            self._elem = value._elem
            self._index = value._index

    # The storage gap: no storage, as on torch-directml (C++ paths raise from the TensorImpl,
    # see wrap(); these are the Python entry points, NotImplementedError like the wheel's).
    def untyped_storage(self):
        if state.storage:
            raise _refused()
        return super().untyped_storage()

    def storage(self):
        if state.storage:
            raise _refused()
        return super().storage()

    def _typed_storage(self):
        if state.storage:
            raise _refused()
        return super()._typed_storage()

    def data_ptr(self) -> int:
        # The wrapper has no memory of its own; expose the CPU elem's address so that code that
        # compares data pointers (tied weights, shared storage detection) sees real aliasing.
        return self._elem.data_ptr()

    def __repr__(self, *, tensor_contents=None):
        # torch._tensor_str prefixes subclasses with their class name; print "tensor(" (and
        # "Parameter containing:") like a real DirectML tensor. The formatting itself runs on
        # the device, as there (with the float64 gap, printing floats fails like #430).
        cls = type(self)
        cls.__name__ = "tensor"
        try:
            text = torch._tensor_str._str(self, tensor_contents=tensor_contents)
        finally:
            cls.__name__ = "EmuTensor"
        if getattr(self, "_is_param", False):
            if text.startswith("Parameter("):  # torch >= 2.6 marks custom-type parameters
                text = text[len("Parameter("):-1]
            return "Parameter containing:\n" + text
        return text

    def __format__(self, format_spec):
        # Tensor.__format__ formats 0-dim tensors as numbers only when type(self) is Tensor.
        if self.dim() == 0:
            return self.detach().item().__format__(format_spec)
        return object.__format__(self, format_spec)

    def numpy(self, *, force: bool = False):
        # What PyTorch says for any non-CPU tensor (the subclass check would say otherwise).
        if force:
            return self._elem.detach().numpy()
        raise TypeError(
            f"can't convert {self.device} device type tensor to numpy. Use Tensor.cpu() to copy "
            "the tensor to host memory first."
        )

    def tolist(self):
        # PyTorch refuses tolist() on tensor subclasses; a device tensor copies to the host.
        return self._elem.tolist()

    def __deepcopy__(self, memo):
        if id(self) in memo:
            return memo[id(self)]
        if not self.is_leaf:
            raise RuntimeError(
                "Only Tensors created explicitly by the user (graph leaves) support the deepcopy "
                "protocol at the moment.  If you were attempting to deepcopy a module, this may "
                "be because of a torch.nn.utils.weight_norm usage, see "
                "https://github.com/pytorch/pytorch/pull/103001"
            )
        with torch.no_grad():
            new = wrap(self._elem.clone(), self._index)
        if getattr(self, "_is_param", False):
            new = torch.nn.Parameter(new, self.requires_grad)
        else:
            new.requires_grad_(self.requires_grad)
        if self.grad is not None:
            new.grad = copy.deepcopy(self.grad, memo)
        for key, value in self.__dict__.items():
            if key not in ("_elem", "_index", "_is_param"):
                setattr(new, key, copy.deepcopy(value, memo))
        memo[id(self)] = new
        return new

    def __reduce_ex__(self, proto):
        # Saved like PyTorch saves PrivateUse1 tensors without storage: a CPU copy plus the
        # device string; loading moves it back to privateuseone:N (the emulator must be
        # registered then, as torch-directml must be to load a real DirectML checkpoint).
        if getattr(self, "_is_param", False):
            plain = wrap(self._elem, self._index)
            return (torch._utils._rebuild_parameter,
                    (plain, self.requires_grad, collections.OrderedDict()))
        cpu = self._elem.detach().clone()
        rebuild = getattr(torch._utils, "_rebuild_device_tensor_from_cpu_tensor", None)
        if rebuild is not None:
            return (rebuild, (cpu, self.dtype, str(self.device), self.requires_grad))
        numpy_array = cpu.numpy() if cpu.dtype != torch.bfloat16 else cpu.float().numpy()
        return (torch._utils._rebuild_device_tensor_from_numpy,
                (numpy_array, self.dtype, str(self.device), self.requires_grad))


class _Husk(torch.Tensor):
    """A storage donor for metadata resyncs; never used in an operator."""

    __torch_function__ = torch._C._disabled_torch_function_impl

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise EmulatorError(f"dmlshim emulator: internal husk tensor reached {func}")


def wrap(elem: torch.Tensor, index: int) -> EmuTensor:
    """A new emulated tensor on adapter ``index`` holding ``elem`` (a CPU tensor)."""
    if elem.dtype is torch.float64 and state.float64:
        raise RuntimeError(F64_MESSAGE)
    if elem.dtype is torch.bfloat16 and state.bfloat16:
        abort_bfloat16()
    if elem.layout is not torch.strided:
        raise EmulatorError(f"dmlshim emulator: {elem.layout} tensors are not supported")
    out = torch.Tensor._make_wrapper_subclass(
        EmuTensor, elem.size(), strides=elem.stride(), storage_offset=elem.storage_offset(),
        dtype=elem.dtype, device=state.devices[index], requires_grad=False,
    )
    out._elem = elem
    out._index = index
    if state.storage and refuse_storage is not None:
        refuse_storage(out, STORAGE_MESSAGE)
    _memory.track(elem, index)
    return out


def sync_metadata(wrapper: EmuTensor) -> None:
    """Make the wrapper's sizes/strides/offset follow its elem after an in-place resize."""
    elem = wrapper._elem
    if (wrapper.size() == elem.size() and wrapper.stride() == elem.stride()
            and wrapper.storage_offset() == elem.storage_offset()):
        return
    if set_metadata is not None and state.storage:  # set_() below would read its storage
        set_metadata(wrapper, list(elem.size()), list(elem.stride()), elem.storage_offset())
        _memory.refresh(elem)
        return
    numel = max(elem.untyped_storage().nbytes() // max(elem.element_size(), 1), 1)
    husk = torch.Tensor._make_wrapper_subclass(
        _Husk, (numel,), strides=(1,), storage_offset=0, dtype=elem.dtype, device=wrapper.device
    )
    _set_storage.redispatch(_CPU, wrapper, husk.untyped_storage(), elem.storage_offset(),
                            elem.size(), elem.stride())
    _memory.refresh(elem)


def _device_error(a: str, b: str) -> RuntimeError:
    return RuntimeError(
        f"Expected all tensors to be on the same device, but found at least two devices, {a} and {b}!"
    )


def unwrap(plan: _policy.Plan, args, kwargs) -> Tuple[list, dict, int, bool]:
    """CPU arguments, the adapter index of the device tensors, and whether to wrap results."""
    index = -1
    cpu_seen = None
    new_args = []
    for a in args:
        t = type(a)
        if t is EmuTensor:
            if index < 0:
                index = a._index
            elif a._index != index:
                raise _device_error(f"privateuseone:{index}", f"privateuseone:{a._index}")
            new_args.append(a._elem)
        elif (t is list or t is tuple) and a and not isinstance(a[0], (int, float, bool)):
            items = []
            for x in a:
                if type(x) is EmuTensor:
                    if index < 0:
                        index = x._index
                    elif x._index != index:
                        raise _device_error(f"privateuseone:{index}", f"privateuseone:{x._index}")
                    items.append(x._elem)
                else:
                    if isinstance(x, torch.Tensor) and x.dim() > 0 and cpu_seen is None:
                        cpu_seen = x.device
                    items.append(x)
            new_args.append(items)
        else:
            if isinstance(a, torch.Tensor) and a.dim() > 0 and cpu_seen is None:
                cpu_seen = a.device
            new_args.append(a)
    new_kwargs = kwargs
    if kwargs:
        new_kwargs = {}
        for k, v in kwargs.items():
            if type(v) is EmuTensor:
                if index < 0:
                    index = v._index
                elif v._index != index:
                    raise _device_error(f"privateuseone:{index}", f"privateuseone:{v._index}")
                v = v._elem
            elif type(v) is list and v and type(v[0]) is EmuTensor:
                v = [x._elem for x in v]
            elif isinstance(v, torch.Tensor) and v.dim() > 0 and cpu_seen is None:
                cpu_seen = v.device
            new_kwargs[k] = v
    wrap_results = True
    if plan.has_device_kw and new_kwargs.get("device") is not None:
        target = torch.device(new_kwargs["device"])
        if target.type == "privateuseone":
            index = check_index(target.index)
            new_kwargs["device"] = _CPU_DEVICE
        else:
            wrap_results = False
    if cpu_seen is not None and not plan.mixed_ok and index >= 0:
        raise _device_error(f"privateuseone:{index}", str(cpu_seen))
    if index < 0:
        index = state.current_index
    return new_args, new_kwargs, index, wrap_results


def _wrap_result(out, index: int):
    if isinstance(out, torch.Tensor):
        return wrap(out, index)
    if isinstance(out, (tuple, list)):
        return type(out)(_wrap_result(o, index) for o in out)
    return out


def size_mismatch_message(a, b) -> str:
    """torch's broadcasting message for shapes ``a`` and ``b`` (a, the result; b, the output)."""
    a, b = list(a), list(b)
    n = max(len(a), len(b), 1)
    a, b = [1] * (n - len(a)) + a, [1] * (n - len(b)) + b
    differ = [d for d in range(n - 1, -1, -1) if a[d] != b[d]] or [n - 1]
    d = next((d for d in differ if a[d] != 1 and b[d] != 1), differ[0])
    return (f"The size of tensor a ({a[d]}) must match the size of tensor b ({b[d]}) at "
            f"non-singleton dimension {d}")


def _keep_out_size(plan: _policy.Plan, t: EmuTensor) -> None:
    """The gap "out-resize": the CPU kernel resized the elem of ``t``; the wheel's does not."""
    elem = t._elem
    result_shape = elem.shape
    elem.set_(elem.untyped_storage(), t.storage_offset(), t.shape, t.stride())
    if plan.name in _policy.OUT_RAISES or t.numel() != 0:
        raise RuntimeError(size_mismatch_message(result_shape, t.shape))


def finish(plan: _policy.Plan, args, kwargs, out, index: int, wrap_results: bool = True):
    """Turn the CPU result of ``plan``'s op into the value the caller gets back."""
    writes = plan.writes
    if writes is None:
        return _wrap_result(out, index) if wrap_results else out
    originals = []
    for i, target in enumerate(writes):
        if target is None:
            value = out[i] if isinstance(out, (tuple, list)) else out
            originals.append(_wrap_result(value, index) if wrap_results else value)
            continue
        position, name = target
        if position is not None and position < len(args):
            original = args[position]
        else:
            original = kwargs.get(name)
        originals.append(original)
        if plan.resizes:
            for t in original if isinstance(original, (list, tuple)) else (original,):
                if type(t) is EmuTensor:
                    if plan.strict_out and state.out_resize and t._elem.shape != t.shape:
                        _keep_out_size(plan, t)
                    sync_metadata(t)
    if len(writes) == 1 and not isinstance(out, (tuple, list)):
        return originals[0]
    return tuple(originals)


def run_on_cpu(func, plan: _policy.Plan, args, kwargs):
    cargs, ckwargs, index, wrap_results = unwrap(plan, args, kwargs)
    if plan.cpu_impl is not None:
        out = plan.cpu_impl(*cargs, **ckwargs)
    else:
        try:
            out = func(*cargs, **ckwargs)
        except RuntimeError:
            # a wrapped number (remainder(x, 7) reaches remainder.Tensor with a Python 7):
            # the CPU overload wants a tensor there (the normal path pays nothing for this)
            positions = plan.tensor_args[0]
            if not any(i < len(cargs) and isinstance(cargs[i], (int, float, complex))
                       for i in positions):
                raise
            cargs = [_as_tensor(a) if i in positions else a for i, a in enumerate(cargs)]
            out = func(*cargs, **ckwargs)
    return finish(plan, args, kwargs, out, index, wrap_results)


_C_TENSOR = torch._C._VariableFunctions.tensor  # the C function: no Python wrapper


def _as_tensor(value):
    if isinstance(value, bool):
        return _C_TENSOR(value, dtype=torch.bool)
    if isinstance(value, int):
        return _C_TENSOR(value, dtype=torch.int64)
    if isinstance(value, float):
        # The default dtype promotes like the wrapped number it stands for (a 0-dim tensor
        # never wins over a dimensioned one of the same category).
        return _C_TENSOR(value, dtype=torch.get_default_dtype())
    if isinstance(value, complex):
        return _C_TENSOR(value)
    return value


# Who runs on this thread, innermost last: a Python kernel registered for the device
# (KERNEL), or C++ (COMPOSITE: PyTorch's composites, C++ kernels), as the wheel's would be.
KERNEL, COMPOSITE = "kernel", "composite"
_local = threading.local()
OUT_UNSAFE_MESSAGE = (
    "{op} is an out= overload, called from Python{where}: torch-directml 0.2.5's out= kernels "
    "hand a boxed (Python) caller dangling tensors (nll_loss_forward.output: heap corruption, "
    "'free(): corrupted unsorted chunks', SIGABRT). Call the functional overload (it allocates "
    "its result) and copy the result where it must go. (dmlshim emulator, gap out-unsafe)")


def callers() -> list:
    """This thread's stack of KERNEL / COMPOSITE frames (see check_out_call)."""
    try:
        return _local.callers
    except AttributeError:
        _local.callers = []
        return _local.callers


def check_out_call(plan: _policy.Plan) -> None:
    """The gap "out-unsafe": an out= overload called from Python. C++ (a composite the emulator
    runs, standing in for the wheel's C++) may call any; a Python kernel registered for the
    device may call none (but those PyTorch's composites call for their functional form, such
    as arange.start_out: a factory's composite does not pass through the emulator, so its call
    cannot be told from the kernel's own); anyone else may not call those that abort
    (DANGLING_OUT)."""
    stack = callers()
    top = stack[-1] if stack else None
    if top is COMPOSITE:
        return
    if top is KERNEL and not plan.composite_calls_out:
        raise RuntimeError(OUT_UNSAFE_MESSAGE.format(
            op=plan.name, where=" by a kernel registered for the device"))
    if plan.name in _policy.DANGLING_OUT:
        raise RuntimeError(OUT_UNSAFE_MESSAGE.format(op=plan.name, where=""))


_PU1_KEY = torch._C.DispatchKey.PrivateUse1


def call_kernel(func, plan: _policy.Plan, args, kwargs):
    """Run the Python kernel registered for ``func`` on PrivateUse1 (torch.library) as the
    wheel's dispatcher runs it: a wrapped-number operand (``x * 2.0``, and the scalars the
    wheel's own C++ kernels multiply by) reaches it as a Python number, not a tensor."""
    positions, names = plan.tensor_args
    if not plan.numbers_ok:  # (a boxed call takes a number for a Tensor only for these ops)
        if positions and any(i < len(args) and isinstance(args[i], (int, float, complex))
                             for i in positions):
            args = tuple(_as_tensor(a) if i in positions else a for i, a in enumerate(args))
        if names and kwargs:
            kwargs = {k: (_as_tensor(v) if k in names else v) for k, v in kwargs.items()}
    stack = callers()
    stack.append(KERNEL)
    try:
        return func._op_dk(_PU1_KEY, *args, **kwargs)
    finally:
        stack.pop()


def run_composite(func, plan: _policy.Plan, args, kwargs):
    """PyTorch's composite (C++) for ``func`` on PrivateUse1: the out= overloads it calls are
    C++ calls, as the wheel's own."""
    stack = callers()
    stack.append(COMPOSITE)
    try:
        return redispatch(func, plan, args, kwargs)
    finally:
        stack.pop()


def redispatch(func, plan: _policy.Plan, args, kwargs):
    """Run the PrivateUse1 kernel of ``func``: a C++ one, or PyTorch's composite."""
    positions, names = plan.tensor_args
    if positions and any(i < len(args) and isinstance(args[i], (int, float, complex))
                         for i in positions):
        args = tuple(_as_tensor(a) if i in positions else a for i, a in enumerate(args))
    if names and kwargs:
        kwargs = {k: (_as_tensor(v) if k in names else v) for k, v in kwargs.items()}
    return func.redispatch(_PU1, *args, **kwargs)


def _device_bytes(value) -> int:
    """Bytes of the emulated tensors in ``value`` (nested tuples, lists, dicts)."""
    if type(value) is EmuTensor:
        return value.numel() * value.element_size()
    if isinstance(value, (tuple, list)):
        return sum(_device_bytes(v) for v in value)
    if isinstance(value, dict):
        return sum(_device_bytes(v) for v in value.values())
    return 0


def _copied_back(func, args, kwargs, result) -> int:
    """Bytes a fallback copies back: its new results and every argument it wrote (in-place and
    out= arguments, also of ops that return nothing, like ``_amp_foreach_*_``)."""
    written = []
    for i, arg in enumerate(func._schema.arguments):
        if arg.alias_info is not None and arg.alias_info.is_write:
            written.append(args[i] if i < len(args) and not arg.kwarg_only
                           else kwargs.get(arg.name))
    seen = {id(t) for t in _leaves(written)}
    fresh = [t for t in _leaves(result) if id(t) not in seen]
    return _device_bytes(written) + _device_bytes(fresh)


def _leaves(value) -> list:
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in _leaves(v)]
    return [value] if isinstance(value, torch.Tensor) else []


def _fallback_call(func, plan: _policy.Plan, args, kwargs):
    # C++-registered PrivateUse1 kernels are invisible to the torch.library set checked in
    # __torch_dispatch__; look them up exactly here, where the cost does not matter.
    for name in {plan.name, plan.fallback_name}:
        try:
            if _policy._has_kernel(name, "PrivateUse1"):
                return run_composite(func, plan, args, kwargs)
        except RuntimeError:
            pass
    if state.fallback:
        _fallback.record(plan.fallback_name)
        cargs, ckwargs, index, wrap_results = unwrap(plan, args, kwargs)
        to_host = _device_bytes((args, kwargs))
        # torch-directml's fallback runs the CPU kernel, which may not exist
        # (aten::_thnn_fused_lstm_cell): the NotImplementedError comes from the CPU, as there.
        result = finish(plan, args, kwargs, func(*cargs, **ckwargs), index, wrap_results)
        _fallback.record_bytes(plan.fallback_name, to_host, _copied_back(func, args, kwargs,
                                                                         result))
        return result
    return run_on_cpu(func, plan, args, kwargs)
