"""Guards against torch-directml 0.2.5's wrong results and failures (``DMLSHIM_GUARDS=on|off``).

On DirectML (real, or the emulator, which reproduces each of them by default) the operators
listed in :data:`dmlshim.patches.guard_kernels.KERNEL_GUARDS` get device kernels
(``torch.library``; nothing wraps a Python entry point, and CPU tensors never see them), for
the key :data:`~dmlshim.patches.guard_kernels.KERNEL_KEYS` names: ``AutogradPrivateUse1`` for
those that fix the inputs of the wheel's own kernel (float × bool multiplication, #686, #737;
``nll_loss``/``cross_entropy``, #739, #740; ``masked_fill`` with a non-bool mask, #702;
reflect padding; max-pool indices; ``unique`` counts; the layer-norm backward without a bias;
negative ``flip`` dims; a read back of one number, ``_local_scalar_dense``, made without the
GIL: the wheel's can deadlock when torch's argument parser makes it holding the GIL),
``PrivateUse1`` for those that replace it (``torch.eye``, #431;
bilinear interpolation; ``logsumexp``). Uninstall destroys the registrations, which brings the
wheel's own kernels back.

One guard is a policy of ``Tensor.to`` (dmlshim.patches.devices owns the entry point):
``x.to("cpu", non_blocking=True)`` of a DirectML tensor returns before the copy is done (the
host tensor reads as garbage, and the late write corrupts the heap: ``malloc(): unaligned
tcache chunk detected``, as GradScaler.update does it every step), so a non-blocking copy out
of a device tensor blocks (for a copy between device tensors blocking changes nothing).

One guard is a setting of autograd's: the wheel's views report storage offset 0, so the
backward of a write into a view (``loss[1] = bce``, ``loss[0] *= box_gain``: YOLOv8's loss)
reads the wrong elements of the gradient (all of it zero or another element's); autograd's view
replay (``torch._C._set_view_replay_enabled``) makes it replay the view's op instead.

One guard stays a Python wrapper and runs only on the emulator's opt-in ``bug-bn-stats`` switch:
BatchNorm running statistics not updated in training (#362) does not reproduce on 0.2.5, so
on real DirectML the guard would only cost time. ``torch.nn.functional.batch_norm`` normalizes
with the batch statistics and updates ``running_mean``/``running_var`` itself, with the
momentum the module passes (cumulative averaging included).
"""

from __future__ import annotations

import logging
import warnings
from typing import Any, Dict, Tuple

import torch
import torch.nn.functional as F

from dmlshim import conversions, events
from dmlshim.patches.guard_kernels import KERNEL_GUARDS, KERNEL_KEYS, add_alias
from dmlshim.patching import Owns, Patch

log = logging.getLogger("dmlshim")

# guard name -> issues; every kernel guard applies wherever the target is DirectML.
GUARDS: Dict[str, str] = {name: issues for name, (issues, _, _) in KERNEL_GUARDS.items()}
GUARDS["non_blocking_to_host"] = "not reported"
GUARDS["view_replay"] = "not reported"
GUARDS["bn_stats"] = "microsoft/DirectML#362"

_BN_PARAMS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum",
              "eps")


def active_guards(caps: Any, config: Any) -> Tuple[str, ...]:
    if config.guards != "on":
        return ()
    bugs = caps.known_bugs()
    return tuple(name for name in GUARDS if name in bugs)


def _bind(names: Tuple[str, ...], args: tuple, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


class GuardsPatch(Patch):
    name = "guards"
    owns = (Owns("torch.nn.functional", ("batch_norm",)), Owns("torch.Tensor", ("add_",)))

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config) -> None:
        self.active = active = active_guards(caps, config)
        for name in active:
            log.info("guard %s on (%s)", name, GUARDS[name])
        # (one kernel per op: guards that share an op list the same kernel, which does both)
        kernels = {op: (fn, KERNEL_KEYS[name]) for name in active if name in KERNEL_GUARDS
                   for op, fn in KERNEL_GUARDS[name][2].items()}
        if kernels:
            self._register([(op, fn, key) for op, (fn, key) in kernels.items()])
        if "inplace_alias" in active:
            self.wrap(torch.Tensor, "add_", _add_alpha_guard(caps.device_type))
        if "non_blocking_to_host" in active:
            device_type = caps.device_type

            def blocking(tensor: torch.Tensor) -> bool:
                if tensor.device.type != device_type:
                    return False
                events.note("guard.non_blocking_to_host")
                return True

            self.on_undo(conversions.add_policy("Tensor.to non_blocking", blocking))
        if "bn_stats" in active:
            self.wrap(F, "batch_norm", _bn_guard(caps.device_type))
        if "view_replay" in active:
            # The wheel's views report storage offset 0, and autograd's CopySlices (the
            # backward of writing into a view: ``loss[1] = ...``, ``loss[0] *= gain``) reads the
            # gradient of the view at that offset in a fresh tensor: element 0's, not the
            # view's. With view replay autograd records each view's op and replays it there
            # instead (torch's own switch, used by AOTAutograd; thread-local: this thread's).
            previous = torch._C._is_view_replay_enabled()
            torch._C._set_view_replay_enabled(True)
            self.on_undo(lambda: torch._C._set_view_replay_enabled(previous))

    def _register(self, kernels) -> None:
        lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901 - destroyed on uninstall
        self.on_undo(lib._destroy)  # (private on torch 2.4.1 and 2.13 alike)
        with warnings.catch_warnings():
            # replacing the wheel's own kernel is the point: no "Overriding a previously
            # registered kernel" warning for the user
            warnings.simplefilter("ignore")
            for op, fn, key in kernels:
                lib.impl(op, fn, key)


def _add_alpha_guard(device_type: str):
    """``Tensor.add_(other, alpha=a)``, a != 1, where ``other`` may share the tensor's memory
    (guard_kernels: inplace_alias). The method, not the op: add_ with alpha 1 is right on the
    wheel and is the one C++ callers make (``out += identity``, foreach ops, gradient
    accumulation), which stay off Python; an alpha comes from Python code alone."""
    f32 = torch.float32

    def wrapper(wrapped, instance, args, kwargs):
        alpha = kwargs.get("alpha", 1) if kwargs else 1
        if alpha == 1 or instance.dtype is not f32 or instance.device.type != device_type:
            return wrapped(*args, **kwargs)
        other = args[0] if args else kwargs.get("other")
        if isinstance(other, torch.Tensor) and not other.is_cpu \
                and (other is instance or other._version == instance._version):
            return add_alias(instance, other, alpha)
        return wrapped(*args, **kwargs)

    return wrapper


def _bn_guard(device_type: str):
    def wrapper(wrapped, instance, args, kwargs):
        b = _bind(_BN_PARAMS, args, kwargs)
        x, rm, rv = b["input"], b["running_mean"], b["running_var"]
        if not b.get("training", False) or rm is None or rv is None \
                or x.device.type != device_type:
            return wrapped(*args, **kwargs)
        momentum = b.get("momentum", 0.1)
        out = wrapped(x, None, None, b.get("weight"), b.get("bias"), True, momentum,
                      b.get("eps", 1e-5))
        events.note("guard.bn_stats")
        events.redirected("F.batch_norm", "running stats", "updated by dmlshim (#362)",
                          tag="emulated")
        with torch.no_grad():
            dims = [0] + list(range(2, x.dim()))
            xd = x.detach()
            mean = xd.mean(dims).to(rm.dtype)
            var = xd.var(dims, unbiased=True).to(rv.dtype)
            rm.mul_(1.0 - momentum).add_(mean, alpha=momentum)
            rv.mul_(1.0 - momentum).add_(var, alpha=momentum)
        return out

    return wrapper
