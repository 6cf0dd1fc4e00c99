"""Gradient clipping without a Python frame per parameter (issue 37).

``torch.nn.utils.clip_grad_norm_`` (what HF Trainer, Lightning's ``gradient_clip_val``, timm's
``--clip-grad`` and nanoGPT call every step) moves each parameter's norm to the first
gradient's device with ``Tensor.to`` before stacking them. Natively that is C++; under the shim
``Tensor.to`` is a wrapped entry point (dmlshim.patches.devices: ``.to("cuda")`` must be
rewritten), so every parameter costs a Python frame, and the shim's cost per step grows with
the model (ResNet-50: 161 frames of its 180). Where every tensor is on one device those moves
return the norm itself: the total norm is the same stack of the same norms without them.

So, where all tensors are on one device, the total norm is computed here, by torch's own steps
minus the moves: the norms grouped by device and dtype as torch groups them
(``_group_tensors_by_device_and_dtype``), ``torch._foreach_norm`` or ``linalg.vector_norm`` per
tensor as torch chooses (``foreach``), their stack's ``vector_norm``, the non-finite check with
torch's message. Bit for bit torch's result (tests/test_clip.py compares with torch's own
function on both torch lines). Tensors on several devices go to torch's function as they are.

Where: torch 2.6 and later compute the total norm in ``clip_grad._get_total_norm`` (also
public as ``torch.nn.utils.get_total_norm``), which ``clip_grad_norm_`` looks up when it runs:
that function is wrapped. torch 2.4 and 2.5 compute it inside ``clip_grad_norm_``: that one is
wrapped, and the clipping after it done as torch does it (``_foreach_mul_`` by the clamped
coefficient, moved once per device group).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch.utils._foreach_utils import (
    _device_has_foreach_support,
    _group_tensors_by_device_and_dtype,
    _has_foreach_support,
)

from dmlshim.patching import Owns, Patch

_TO = torch._C.TensorBase.to  # the coefficient's move: torch's C method, not the shim's wrapper

_NON_FINITE = ("The total norm of order {} for gradients from `parameters` is non-finite, so it "
               "cannot be clipped. To disable this error and scale the gradients by the "
               "non-finite norm anyway, set `error_if_nonfinite=False`")


def total_norm(tensors: List[torch.Tensor], norm_type: float, error_if_nonfinite: bool,
               foreach: Optional[bool], grouped: Dict[Any, Any]) -> torch.Tensor:
    """torch's total norm of ``tensors`` (non-empty, on one device, ``grouped`` by device and
    dtype as torch groups them): its steps without moving each norm to the device it is on.
    (Written out: a helper would be a frame more per call.)"""
    norms: List[torch.Tensor] = []
    for (device, _), ([device_tensors], _) in grouped.items():
        if (foreach is None and _has_foreach_support(device_tensors, device)) or (
                foreach and _device_has_foreach_support(device)):
            norms.extend(torch._foreach_norm(device_tensors, norm_type))
        elif foreach:
            raise RuntimeError(f"foreach=True was passed, but can't use the foreach API on "
                               f"{device.type} tensors")
        else:
            for g in device_tensors:
                norms.append(torch.linalg.vector_norm(g, norm_type))
    total = torch.linalg.vector_norm(torch.stack(norms), norm_type)
    if error_if_nonfinite and torch.logical_or(total.isnan(), total.isinf()):
        raise RuntimeError(_NON_FINITE.format(norm_type))
    return total


def _get_total_norm(wrapped, instance, args, kwargs):
    """The wrapper of torch >= 2.6's ``_get_total_norm(tensors, norm_type=2.0,
    error_if_nonfinite=False, foreach=None)``."""
    tensors = args[0] if args else kwargs.pop("tensors")
    tensors = [tensors] if isinstance(tensors, torch.Tensor) else list(tensors)
    one_device = bool(tensors)
    for t in tensors:
        if t.device != tensors[0].device:
            one_device = False
            break
    if not one_device:
        return wrapped(tensors, *args[1:], **kwargs)
    norm_type = float(args[1] if len(args) > 1 else kwargs.get("norm_type", 2.0))
    error = args[2] if len(args) > 2 else kwargs.get("error_if_nonfinite", False)
    foreach = args[3] if len(args) > 3 else kwargs.get("foreach")
    with torch.no_grad():
        return total_norm(tensors, norm_type, error, foreach,
                          _group_tensors_by_device_and_dtype([tensors]))


def _clip_grad_norm_(wrapped, instance, args, kwargs):
    """The wrapper of torch 2.4/2.5's ``clip_grad_norm_(parameters, max_norm, norm_type=2.0,
    error_if_nonfinite=False, foreach=None)``: the total norm as above, then torch's clipping."""
    bound = dict(zip(("parameters", "max_norm", "norm_type", "error_if_nonfinite", "foreach"),
                     args), **kwargs)
    parameters = bound["parameters"]
    parameters = [parameters] if isinstance(parameters, torch.Tensor) else list(parameters)
    grads: List[torch.Tensor] = []
    for p in parameters:
        if p.grad is not None:
            grads.append(p.grad)
    one_device = bool(grads)
    for g in grads:
        if g.device != grads[0].device:
            one_device = False
            break
    if not one_device:
        bound["parameters"] = parameters  # (a generator was read here, once)
        return wrapped(**bound)
    foreach = bound.get("foreach")
    with torch.no_grad():
        grouped = _group_tensors_by_device_and_dtype([grads])
        total = total_norm(grads, float(bound.get("norm_type", 2.0)),
                           bound.get("error_if_nonfinite", False), foreach, grouped)
        # torch's clipping: the clamped coefficient (no `if clip_coef < 1`: no device sync),
        # moved once per device group
        clamped = torch.clamp(float(bound["max_norm"]) / (total + 1e-6), max=1.0)
        for (device, _), ([device_grads], _) in grouped.items():
            if (foreach is None and _has_foreach_support(device_grads, device)) or (
                    foreach and _device_has_foreach_support(device)):
                torch._foreach_mul_(device_grads, _TO(clamped, device))
            else:  # (foreach=True without support raised above, in total_norm)
                on_device = _TO(clamped, device)
                for g in device_grads:
                    g.mul_(on_device)
    return total


class ClipPatch(Patch):
    name = "clip"
    owns = (Owns("torch.nn.utils", ("clip_grad_norm_", "get_total_norm")),
            Owns("torch.nn.utils.clip_grad", ("clip_grad_norm_", "_get_total_norm")))

    def applies(self, caps) -> bool:
        return caps.redirects  # wherever dmlshim.patches.devices wraps Tensor.to

    def _install(self, caps, config) -> None:
        import torch.nn.utils as utils
        from torch.nn.utils import clip_grad

        if hasattr(clip_grad, "_get_total_norm"):  # torch >= 2.6
            self.wrap(clip_grad, "_get_total_norm", _get_total_norm)
            if getattr(utils, "get_total_norm", None) is not None:
                self.wrap(utils, "get_total_norm", _get_total_norm)
        else:
            self.wrap(clip_grad, "clip_grad_norm_", _clip_grad_norm_)
            self.wrap(utils, "clip_grad_norm_", _clip_grad_norm_)
