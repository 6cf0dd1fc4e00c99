"""The shadow: a TorchDispatchMode that runs each device op a second time on CPU copies.

Every aten op that reaches the dispatcher with a tensor (or a ``device=``) on the target device
is run as usual, then again on CPU copies of the very inputs it saw, and the two results are
compared (:mod:`dmlshim.check.compare`): outputs and the arguments the op writes to. Each op is
judged alone, on its real inputs, so one wrong op does not make everything after it "differ".

Dispatch modes live in thread-local state, but autograd's engine copies the calling thread's
state (``at::ThreadLocalState``, the dispatch-mode stack included) into the thread that runs a
backward graph, so backward ops are shadowed too — on torch 2.4.1 and 2.13 alike (tested).

Not compared: random ops (``Tag.nondeterministic_seeded``; running them again would also move
the CPU generator the device shares with the script), ops whose results are uninitialised
memory (``empty``, ``resize_``, ...), sparse/meta tensors and tensor subclasses on the CPU, and
ops the CPU has no kernel for. Shadowing never changes what the script computes: the copies are
the only tensors the second run touches.

The user's line: for forward and optimizer ops the first frame outside dmlshim, torch and wrapt
(what the shim's warnings use); for backward ops the same frame of the *forward* call that
created the autograd node, which torch's anomaly mode records on each node
(``node.metadata["traceback_"]``) while the shadow is on.
"""

from __future__ import annotations

import logging
import re
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from dmlshim import events
from dmlshim.check.compare import Mismatch, compare_values, describe_tensor
from dmlshim.check.results import Divergence, Results

log = logging.getLogger("dmlshim")

# Ops whose result is memory nobody initialised (or storage plumbing): comparing is meaningless.
UNINITIALIZED = frozenset({
    "aten::empty", "aten::empty_strided", "aten::empty_like", "aten::new_empty",
    "aten::new_empty_strided", "aten::empty_permuted", "aten::resize_", "aten::resize_as_",
    "aten::_resize_output_", "aten::set_", "aten::_empty_affine_quantized",
    "aten::_empty_per_channel_affine_quantized", "aten::record_stream",
})
# Ops that write to arguments their schema does not mark as written (running statistics).
UNDECLARED_WRITES = {
    "aten::native_batch_norm": ((3, "running_mean"), (4, "running_var")),
}
_SEEDED = torch.Tag.nondeterministic_seeded
_CPU = torch.device("cpu")
_to_copy = torch.ops.aten._to_copy.default
_copy_op = torch.ops.aten.copy_.default
_FRAME_RE = re.compile(r'File "([^"]+)", line (\d+)')
_PLAIN_TYPES = (torch.Tensor, torch.nn.Parameter)


# Outputs that are scratch memory (the CPU's LSTM workspace, batch norm's reserve): not compared.
SCRATCH_OUTPUTS = {
    "aten::mkldnn_rnn_layer": frozenset({3}),
    "aten::_batch_norm_with_update": frozenset({3}),
    "aten::_batch_norm_no_update": frozenset({1, 2, 3}),
    "aten::_native_batch_norm_legit_no_training": frozenset({1, 2}),
}
# Outputs nobody reads under some arguments, as (argument position, name, values that hide,
# outputs hidden): nll_loss's total_weight with reduction='none' (Reduction::None is 0; the
# CPU leaves it 0, the wheel writes the batch size), batch norm's saved statistics in eval
# mode (backward then uses the running ones). Outputs not asked for by an ``output_mask``
# (convolution_backward & co.: the CPU returns None, the wheel a tensor) are hidden too.
HIDDEN_WHEN = {
    "aten::nll_loss_forward": (3, "reduction", (0,), frozenset({1})),
    "aten::nll_loss2d_forward": (3, "reduction", (0,), frozenset({1})),
    "aten::native_batch_norm": (5, "training", (False,), frozenset({1, 2})),
    "aten::_native_batch_norm_legit": (5, "training", (False,), frozenset({1, 2})),
}
# max_pool2d indices, in the form the CPU kernels use: per (n, c) plane. torch-directml 0.2.5
# returns them flattened over the whole tensor (plus c*H*W + n*C*H*W; its own backward agrees),
# and the CPU's backward fed those writes out of bounds. Per op: (position of the input whose
# last two sizes are the plane, names of the index results, position and name of an index
# argument).
PLANE_INDICES = {
    "aten::max_pool2d_with_indices": (0, ("output 1", "argument indices"), None),
    "aten::max_pool2d_with_indices_backward": (1, (), (7, "indices")),
}


class _OpInfo:
    __slots__ = ("skip", "writes", "scratch", "hidden_when", "mask_at", "returned_args",
                 "planes")

    def __init__(self, func) -> None:
        schema = func._schema
        self.skip = ""
        self.scratch = SCRATCH_OUTPUTS.get(schema.name, frozenset())
        self.hidden_when = HIDDEN_WHEN.get(schema.name)
        self.planes = PLANE_INDICES.get(schema.name)
        if func.namespace != "aten":
            self.skip = "not aten"  # profiler records, custom ops: not the device's arithmetic
        elif _SEEDED in func.tags:
            self.skip = "random"
        elif schema.name in UNINITIALIZED:
            self.skip = "uninitialized"
        arguments = list(schema.arguments)
        # (position, name) of the arguments the op writes to: compared after the op as well
        self.writes: Tuple[Tuple[int, str], ...] = tuple(
            (i, a.name) for i, a in enumerate(arguments)
            if a.alias_info is not None and a.alias_info.is_write
        ) + UNDECLARED_WRITES.get(schema.name, ())
        self.mask_at: Optional[Tuple[int, str]] = next(
            ((i, a.name) for i, a in enumerate(arguments) if a.name == "output_mask"), None)
        # result index -> (position, name) of the written argument it returns (in place, out=)
        self.returned_args: Dict[int, Tuple[int, str]] = {}
        for r, ret in enumerate(schema.returns):
            if ret.alias_info is None or not ret.alias_info.is_write:
                continue
            for i, a in enumerate(arguments):
                if a.alias_info is not None and a.alias_info.before_set == ret.alias_info.before_set:
                    self.returned_args[r] = (i, a.name)
                    break

    def hidden(self, args, kwargs) -> frozenset:
        """Results the caller cannot see with these arguments (never compared)."""
        out = self.scratch
        rule = self.hidden_when
        if rule is not None and _arg(args, kwargs, rule[0], rule[1]) in rule[2]:
            out = out | rule[3]
        if self.mask_at is not None:
            mask = _arg(args, kwargs, *self.mask_at)
            if mask is not None:
                out = out | {i for i, m in enumerate(mask) if not m}
        return out


def _arg(args, kwargs, position: int, name: str) -> Any:
    return args[position] if position < len(args) else kwargs.get(name)


class _NotComparable(Exception):
    """The op's inputs cannot be copied to the CPU faithfully (sparse, meta, a subclass)."""


class ShadowMode(TorchDispatchMode):
    """Shadow every op on ``device_type`` tensors while active (see the module docstring)."""

    def __init__(self, device_type: str, results: Results) -> None:
        super().__init__()
        self.device_type = device_type
        self.results = results
        self.step = 1  # the optimizer step being shadowed
        self.in_optimizer = False
        self.paused = False  # dmlshim's own tensor work (gradient sanity) is not the user's
        self._infos: Dict[Any, _OpInfo] = {}
        self._lock = threading.Lock()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        info = self._infos.get(func)
        if info is None:
            info = self._infos[func] = _OpInfo(func)
        if self.paused:
            return self._run(func, info, args, kwargs)
        flat, _ = pytree.tree_flatten((args, kwargs))
        if not self._on_target(flat):
            return func(*args, **kwargs)
        if info.skip:
            self._skipped(info.skip)
            return self._run(func, info, args, kwargs)
        try:
            cargs, ckwargs = self._cpu_copies(info, args, kwargs)
        except Exception as err:  # _NotComparable, or a copy the device refuses
            if not isinstance(err, _NotComparable):
                log.debug("check: copying the inputs of %s failed", func.name(), exc_info=True)
            self._skipped("not copyable")
            return self._run(func, info, args, kwargs)
        out = self._run(func, info, args, kwargs)
        try:
            self._compare(func, info, args, kwargs, out, cargs, ckwargs, flat)
        except Exception:  # the check must never break the script
            log.debug("check: comparing %s failed", func.name(), exc_info=True)
            self._skipped("comparison failed")
        return out

    def _run(self, func, info: _OpInfo, args, kwargs):
        """The op itself, returning what it returns without a dispatch mode: under any
        TorchDispatchMode, torch-directml 0.2.5's ``masked_fill_`` returns a new tensor and
        leaves ``self`` as it was (facts file), so a result that should be a written argument
        but is another tensor is copied into that argument, which is returned instead."""
        out = func(*args, **kwargs)
        if not info.returned_args:
            return out
        several = isinstance(out, (tuple, list))
        results = list(out) if several else [out]
        changed = False
        for r, (position, name) in info.returned_args.items():
            if r >= len(results):
                continue
            got, arg = results[r], _arg(args, kwargs, position, name)
            if (isinstance(got, torch.Tensor) and isinstance(arg, torch.Tensor) and got is not arg
                    and got.shape == arg.shape and got.dtype == arg.dtype):
                _copy(arg, got)
                results[r] = arg
                changed = True
                log.debug("check: %s returned a new tensor instead of writing %s; copied it there",
                          func.name(), name)
        if not changed:
            return out
        return type(out)(results) if several else results[0]

    # -- which ops, which copies ----------------------------------------------------------

    def _on_target(self, flat: List[Any]) -> bool:
        dt = self.device_type
        if dt == "cpu":  # every op runs on the target: all but meta-only ones
            return not any(isinstance(x, torch.Tensor) and x.device.type == "meta" for x in flat)
        for x in flat:
            if isinstance(x, torch.Tensor):
                if x.device.type == dt:
                    return True
            elif isinstance(x, torch.device) and x.type == dt:
                return True
        return False

    def _cpu_copies(self, info: _OpInfo, args, kwargs):
        """CPU inputs for the second run. Device tensors are copied; CPU tensors are cloned
        only for ops that write (the real op runs first and may change them, through any
        alias); an op that writes nothing leaves them as they were, so they are shared.
        Max-pool indices are given the CPU's per-plane form."""
        dt = self.device_type
        writes = bool(info.writes)
        memo: Dict[int, torch.Tensor] = {}  # the same tensor twice stays one tensor

        def copy(x):
            if isinstance(x, torch.Tensor):
                got = memo.get(id(x))
                if got is not None:
                    return got
                if x.layout is not torch.strided or x.device.type == "meta":
                    raise _NotComparable
                if x.device.type == "cpu":
                    if type(x) not in _PLAIN_TYPES:
                        raise _NotComparable
                    c = x.detach().clone() if writes else x
                else:
                    # the op itself, not Tensor.to: inside a dispatch handler .to("cpu") of an
                    # emulated tensor can return its CPU data without a copy
                    c = _to_copy(x, device=_CPU)
                memo[id(x)] = c
                return c
            if isinstance(x, torch.device) and x.type == dt:
                return _CPU
            return x

        cargs, ckwargs = pytree.tree_map(copy, args), pytree.tree_map(copy, kwargs)
        if info.planes is not None and info.planes[2] is not None and dt != "cpu":
            position, name = info.planes[2]
            plane = _plane(_arg(cargs, ckwargs, info.planes[0], "self"))
            indices = _arg(cargs, ckwargs, position, name)
            if plane and isinstance(indices, torch.Tensor):
                if position < len(cargs):
                    cargs = cargs[:position] + (indices % plane,) + cargs[position + 1:]
                else:
                    ckwargs = dict(ckwargs, **{name: indices % plane})
        return cargs, ckwargs

    def _skipped(self, reason: str) -> None:
        with self._lock:
            self.results.skipped[reason] += 1

    # -- comparing --------------------------------------------------------------------------

    def _compare(self, func, info: _OpInfo, args, kwargs, out, cargs, ckwargs, flat) -> None:
        # what the op was given, as dtype[shape]: the CPU copies were taken before it ran
        flat = pytree.tree_flatten((cargs, ckwargs))[0]
        try:
            want = func(*cargs, **ckwargs)
        except NotImplementedError:
            self._skipped("no CPU kernel")
            return
        except Exception as err:  # the CPU refuses what the device accepted
            text = str(err).strip().splitlines()[0][:200] if str(err).strip() else type(err).__name__
            if "not implemented for" in text:
                self._skipped("no CPU kernel")
                return
            self._diverged(func, "call", Mismatch("error", "a result", text), flat)
            return
        pairs: List[Tuple[str, Any, Any]] = []
        got_flat, _ = pytree.tree_flatten(out)
        want_flat, _ = pytree.tree_flatten(want)
        if len(got_flat) != len(want_flat):
            self._diverged(func, "outputs", Mismatch(
                "outputs", f"{len(got_flat)} values", f"{len(want_flat)} values"), flat)
            return
        hidden = info.hidden(args, kwargs)
        pairs.extend((f"output {i}", g, w) for i, (g, w) in enumerate(zip(got_flat, want_flat))
                     if i not in hidden)
        hidden_args = {info.returned_args[i][1] for i in hidden if i in info.returned_args}
        for pos, name in info.writes:
            if name in hidden_args:
                continue
            if pos < len(args):
                g, w = args[pos], cargs[pos]
            elif name in kwargs:
                g, w = kwargs[name], ckwargs[name]
            else:
                continue
            gl, _ = pytree.tree_flatten(g)
            wl, _ = pytree.tree_flatten(w)
            pairs.extend((f"argument {name}" + (f"[{i}]" if len(gl) > 1 else ""), a, b)
                         for i, (a, b) in enumerate(zip(gl, wl)))
        dtype = next((x.dtype for x in flat if isinstance(x, torch.Tensor)), None)
        with self._lock:
            self.results.ops_compared += 1
        planes = info.planes[1] if info.planes is not None else ()
        plane = _plane(_arg(cargs, ckwargs, info.planes[0], "self")) if planes else 0
        for label, g, w in pairs:
            if isinstance(g, torch.Tensor) and g.device.type != "cpu":
                g = _to_copy(g, device=_CPU)
                if plane and label in planes:
                    g = g % plane  # the wheel's flattened max-pool indices, per plane
            mismatch = compare_values(g, w, dtype)
            if mismatch is not None:
                self._diverged(func, label, mismatch, flat)
                return

    def _diverged(self, func, label: str, mismatch: Mismatch, inputs_flat: List[Any]) -> None:
        node = torch._C._current_autograd_node()
        if node is not None:
            phase, node_name = "backward", node.name()
            site = _forward_site(node)
        else:
            phase = "optimizer" if self.in_optimizer else "forward"
            node_name = ""
            site = events.last_user_frame_info()
        inputs = [describe_tensor(x) for x in inputs_flat if isinstance(x, torch.Tensor)]
        if len(inputs) > 8:
            inputs = inputs[:8] + [f"... ({len(inputs) - 8} more)"]
        file, line = site if site is not None else ("", 0)
        d = Divergence(func.name(), self.step, phase, file, line, node_name, label, mismatch,
                       inputs)
        with self._lock:
            self.results.divergence(d)


def _copy(dst: torch.Tensor, src: torch.Tensor) -> None:
    _copy_op(dst, src)


def _plane(t: Any) -> int:
    """Elements of one (n, c) plane of a pooling input (its last two sizes), 0 if unknown."""
    if not isinstance(t, torch.Tensor) or t.dim() < 2:
        return 0
    return int(t.shape[-1]) * int(t.shape[-2])


def _forward_site(node) -> Optional[Tuple[str, int]]:
    """The user's line of the forward call that created ``node`` (anomaly-mode metadata)."""
    try:
        stack = node.metadata.get("traceback_")
    except Exception:  # pragma: no cover - a node without metadata
        return None
    if not stack:
        return None
    text = "".join(stack) if isinstance(stack, (list, tuple)) else str(stack)
    frames = [(f, int(n)) for f, n in _FRAME_RE.findall(text)]
    for file, line in reversed(frames):  # innermost first, as warnings search
        if events.is_user_file(file):
            return file, line
    return None
