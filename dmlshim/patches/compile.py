"""``torch.compile`` on DirectML: the eager module or function, with one info line per call site.

TorchDynamo/Inductor have no DirectML backend: Inductor generates Triton (CUDA/ROCm/XPU) or C++
(CPU) kernels, and tracing privateuseone tensors ends in errors or CPU code. The eager model
computes the same thing, so ``torch.compile(model)`` returns ``model`` itself (also for
``@torch.compile`` / ``@torch.compile(mode=...)`` decorators, ``torch.compiler.compile`` and
``nn.Module.compile()``, which call ``torch.compile``). On the CPU target torch.compile is left
alone: Inductor's C++ backend works there. ``torch.jit.script``/``trace`` are never touched.

Difference from CUDA: a compiled module's ``state_dict()`` keys carry an ``_orig_mod.`` prefix on
CUDA; the eager module's keys do not.
"""

from __future__ import annotations

from typing import Any, Callable

import torch

from dmlshim import events
from dmlshim.patching import Owns, Patch


def _describe(kwargs: dict) -> str:
    backend = kwargs.get("backend")
    name = backend if isinstance(backend, str) else getattr(backend, "__name__", "inductor")
    mode = kwargs.get("mode")
    return f"backend={name or 'inductor'}" + (f", mode={mode}" if mode else "")


class CompilePatch(Patch):
    name = "compile"
    owns = (Owns("torch", ("compile",)),)

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config) -> None:
        def compile_(wrapped, instance, args, kwargs):
            model = args[0] if args else kwargs.get("model")
            if kwargs.get("disable"):
                return wrapped(*args, **kwargs)  # torch's own no-op switch
            if model is None:
                described = _describe(kwargs)

                def decorator(fn: Callable[..., Any]) -> Callable[..., Any]:
                    if fn is None:
                        raise RuntimeError("Model can't be None")
                    events.redirected("torch.compile", described, "eager", tag="dropped")
                    return fn

                return decorator
            events.redirected("torch.compile", _describe(kwargs), "eager", tag="dropped")
            return model

        self.wrap(torch, "compile", compile_)
