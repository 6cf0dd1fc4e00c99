"""``torch.inference_mode()`` on DirectML runs as ``torch.no_grad()`` (fact 9 of the real wheel).

On torch-directml 0.2.5 nearly every operator on a tensor created outside an inference-mode
region raises inside it ("Cannot set version_counter for inference tensor": conv2d, linear,
batch_norm, ``expand``, ``.data``), so a validation loop -- timm's, Lightning's and Hugging Face's
evaluation use inference mode -- dies at its first batch; ``torch.no_grad()`` works. On a
DirectML target (real, or the emulator, which reproduces this as its ``inference-mode`` gap)
``inference_mode.__enter__``/``__exit__`` are wrapped, on torch's class itself so that
references taken before the shim was installed (``from torch import inference_mode``) and the
decorator forms behave the same: ``inference_mode(True)`` disables gradients as ``no_grad``
does, ``inference_mode(False)`` enables them, as torch's ``InferenceMode(False)`` does.

What each side sees. The results are those of inference mode: the same values, nothing
recorded for autograd, ``requires_grad`` False on outputs. torch's C++ inference mode is never
switched on, so torch's own code and its C++ checks see the truth: ``torch.is_inference_mode_enabled()``
called from inside the ``torch`` package answers False, and tensors made in the region are
ordinary tensors (``t.is_inference()`` is False; they may later be saved for backward, which
CUDA would refuse). The script's own ``torch.is_inference_mode_enabled()`` answers what it
would answer on CUDA: True inside a region, False outside or inside ``inference_mode(False)``.
``DMLSHIM_GUARDS=off`` leaves inference mode to torch (and the wheel's error).
"""

from __future__ import annotations

import torch

from dmlshim import events
from dmlshim.patching import Owns, Patch, ThreadStack, called_from_torch


def _wrappers(modes: ThreadStack):
    """``__enter__``/``__exit__``/``is_inference_mode_enabled`` over ``modes``: the modes of the
    emulated regions open in each thread, innermost last (the installation's)."""

    def enter(wrapped, instance, args, kwargs):
        mode = bool(getattr(instance, "mode", True))
        # One instance may be entered again while open (a decorated function calling itself).
        saved = instance.__dict__.setdefault("_dmlshim_grad_enabled", [])
        saved.append(torch.is_grad_enabled())
        torch._C._set_grad_enabled(not mode)
        modes.push(mode)
        events.redirected("torch.inference_mode", f"inference_mode({mode})",
                          "no_grad()" if mode else "enable_grad()", tag="emulated")

    def exit_(wrapped, instance, args, kwargs):
        saved = instance.__dict__.get("_dmlshim_grad_enabled")
        if not saved:  # entered before the shim was installed: torch's own context is open
            return wrapped(*args, **kwargs)
        torch._C._set_grad_enabled(saved.pop())
        modes.pop()
        return None

    def is_enabled(wrapped, instance, args, kwargs):
        real = wrapped(*args, **kwargs)
        if real or called_from_torch():
            return real
        return bool(modes.top)

    return enter, exit_, is_enabled


class InferenceModePatch(Patch):
    name = "inference"
    owns = (Owns("torch.inference_mode", ("__enter__", "__exit__")), Owns("torch", ("is_inference_mode_enabled",)))

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config) -> None:
        if config.guards != "on":
            return
        cls = torch.autograd.grad_mode.inference_mode
        enter, exit_, is_enabled = _wrappers(ThreadStack())
        self.wrap(cls, "__enter__", enter)
        self.wrap(cls, "__exit__", exit_)
        self.wrap(torch, "is_inference_mode_enabled", is_enabled)
