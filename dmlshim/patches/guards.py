"""Guards against torch-directml 0.2.5's known silent wrong results (``DMLSHIM_GUARDS=on|off``).

Each guard is one wrapper on one entry point, installed only where the bug exists: on real
DirectML (``target.kind == "dml"``), or on the emulator when its matching bug switch is on
(``DMLSHIM_EMULATOR_GAPS=...,bug-ce-none``), so the guard can be tested there. The wrapper
passes every call outside the affected path straight through.

* ``cross_entropy(reduction="none")`` gives zero gradients (microsoft/DirectML#739, #740).
  Guard: ``torch.nn.functional.cross_entropy`` (``nn.CrossEntropyLoss`` calls it) computes the
  per-element loss from ``log_softmax`` + ``gather`` (weights, ``ignore_index``,
  ``label_smoothing`` and probability targets as torch defines them) when the input is on the
  device, needs a gradient and ``reduction="none"``.
* ``float_tensor *= bool_tensor`` turns the result into bool (#686, #737; NaN losses in #702).
  Guard: ``Tensor.__imul__`` multiplies by the mask converted to the float dtype. ``x.mul_(mask)``
  and ``torch.mul(x, mask, out=x)`` are not guarded: ``mul_`` is on optimizers' hot path.
* BatchNorm running statistics are not updated in training (#362). Guard:
  ``torch.nn.functional.batch_norm`` (every BatchNorm module calls it) normalizes with the batch
  statistics and updates ``running_mean``/``running_var`` itself, with the momentum the module
  passes (cumulative averaging included), when training with running stats on the device.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Optional, Tuple

import torch
import torch.nn.functional as F

from dmlshim import capabilities, events
from dmlshim.patching import Patch

log = logging.getLogger("dmlshim")

# guard name -> (emulator bug switch, issues)
GUARDS: Dict[str, Tuple[str, str]] = {
    "ce_none": ("bug-ce-none", "microsoft/DirectML#739, #740"),
    "mul_bool": ("bug-mul-bool", "microsoft/DirectML#686, #737"),
    "bn_stats": ("bug-bn-stats", "microsoft/DirectML#362"),
}

_CE_PARAMS = ("input", "target", "weight", "size_average", "ignore_index", "reduce", "reduction",
              "label_smoothing")
_BN_PARAMS = ("input", "running_mean", "running_var", "weight", "bias", "training", "momentum",
              "eps")


def active_guards(target: Any, config: Any) -> Tuple[str, ...]:
    if config.guards != "on":
        return ()
    bugs = capabilities.of(target, config).known_bugs()
    return tuple(name for name in GUARDS if name in bugs)


def _bind(names: Tuple[str, ...], args: tuple, kwargs: Dict[str, Any]) -> Dict[str, Any]:
    bound = dict(zip(names, args))
    bound.update(kwargs)
    return bound


def cross_entropy_none(input: torch.Tensor, target: torch.Tensor,
                       weight: Optional[torch.Tensor] = None, ignore_index: int = -100,
                       label_smoothing: float = 0.0) -> torch.Tensor:
    """``F.cross_entropy(..., reduction="none")`` from log_softmax and gather (no nll_loss)."""
    class_dim = 0 if input.dim() == 1 else 1
    n_classes = input.shape[class_dim]
    logp = torch.log_softmax(input, dim=class_dim)
    wshape = [1] * input.dim()
    wshape[class_dim] = n_classes
    if target.is_floating_point():  # class probabilities, same shape as input
        if label_smoothing > 0.0:
            target = target * (1.0 - label_smoothing) + label_smoothing / n_classes
        prod = logp * target
        if weight is not None:
            prod = prod * weight.view(wshape)
        return -prod.sum(class_dim)
    unbatched = input.dim() == 1
    if unbatched:
        logp, target = logp.unsqueeze(0), target.unsqueeze(0)
        wshape = [1, n_classes]
    ignored = target == ignore_index
    safe = target.masked_fill(ignored, 0)
    nll = -logp.gather(1, safe.unsqueeze(1)).squeeze(1)
    if weight is not None:
        nll = nll * weight[safe]
    nll = nll.masked_fill(ignored, 0.0)
    if label_smoothing > 0.0:
        smooth = -(logp * weight.view(wshape)).sum(1) if weight is not None else -logp.sum(1)
        smooth = smooth.masked_fill(ignored, 0.0)
        nll = (1.0 - label_smoothing) * nll + smooth * (label_smoothing / n_classes)
    return nll.squeeze(0) if unbatched else nll


class GuardsPatch(Patch):
    name = "guards"

    def applies(self, target) -> bool:
        return target.is_directml

    def _install(self, target, config) -> None:
        self.active = active = active_guards(target, config)
        device_type = target.device_type
        for name in active:
            log.info("guard %s on (%s)", name, GUARDS[name][1])
        if "ce_none" in active:
            self.wrap(F, "cross_entropy", _ce_guard(device_type))
        if "mul_bool" in active:
            self.wrap(torch.Tensor, "__imul__", _imul_guard(device_type))
        if "bn_stats" in active:
            self.wrap(F, "batch_norm", _bn_guard(device_type))


def _ce_guard(device_type: str):
    def wrapper(wrapped, instance, args, kwargs):
        b = _bind(_CE_PARAMS, args, kwargs)
        reduction = b.get("reduction", "mean")
        if b.get("size_average") is not None or b.get("reduce") is not None:
            from torch.nn import _reduction

            reduction = _reduction.legacy_get_string(b.get("size_average"), b.get("reduce"))
        x = b["input"]
        if reduction != "none" or x.device.type != device_type or not x.requires_grad \
                or not torch.is_grad_enabled():
            return wrapped(*args, **kwargs)
        events.note("guard.ce_none")
        events.redirected("F.cross_entropy", "reduction='none'",
                          "log_softmax+gather (#739, #740)", tag="emulated")
        return cross_entropy_none(x, b["target"], b.get("weight"), b.get("ignore_index", -100),
                                  b.get("label_smoothing", 0.0))

    return wrapper


def _imul_guard(device_type: str):
    bool_ = torch.bool

    def wrapper(wrapped, instance, args, kwargs):
        other = args[0] if args else None
        if getattr(other, "dtype", None) is bool_ and instance.device.type == device_type \
                and instance.is_floating_point():
            events.note("guard.mul_bool")
            events.redirected("Tensor.__imul__", "bool mask", f"mask.to({instance.dtype}) (#686)",
                              tag="emulated")
            return instance.mul_(other.to(instance.dtype))
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
