"""DirectML's out-of-memory error, seen by scripts as CUDA's.

torch-directml's allocator raises ``RuntimeError("Could not allocate tensor with N bytes. There
is not enough GPU video memory available!")`` (or ``DML allocator out of memory!``), and so does
the emulator past ``DMLSHIM_EMULATOR_MEMORY``. CUDA code catches ``torch.cuda.OutOfMemoryError``,
and the frameworks' batch-size finders look at the text: accelerate's
``should_reduce_batch_size`` (HF Trainer's ``auto_find_batch_size`` uses it) wants
``" out of memory."``, Lightning's ``is_oom_error`` wants ``"CUDA"`` and ``"out of memory"``,
both in the one argument of a RuntimeError.

Where the shim already has a frame, the error becomes :class:`DirectMLOutOfMemoryError` (a
real ``torch.OutOfMemoryError`` whose one argument is CUDA-style text followed by the original
DirectML text): the device entry points (``dmlshim.patches.devices`` calls :func:`reraise`), where
a script's ``.cuda()``/``.to("cuda")``/factory runs out. The raise happens in C++, so catching it
anywhere else takes a frame around the call, paid on every call whether or not anything goes
wrong: the shim adds none to the per-step paths (forward, ``backward``, the optimizer's
``step``), so an OOM there stays the wheel's RuntimeError, as on torch-directml. What code does
with such an error is asking the frameworks' OOM predicates (accelerate's, Lightning's), which
are wrapped (called once per failure, never per step) to recognise the raw text; a script's own
``except torch.cuda.OutOfMemoryError`` around ``backward()`` does not see it (the trade-off:
zero cost per step against that one pattern). :func:`translate` converts one by hand.
"""

from __future__ import annotations

import logging
import re
from typing import Any

import torch

from dmlshim.patching import Owns, Patch, is_patched

log = logging.getLogger("dmlshim")

# torch-directml 0.2.5's out-of-memory texts (strings in its native extension).
DIRECTML_OOM_TEXTS = ("There is not enough GPU video memory available",
                      "DML allocator out of memory")


class DirectMLOutOfMemoryError(torch.OutOfMemoryError):
    """torch-directml's out-of-memory error as ``torch.cuda.OutOfMemoryError``."""


def is_directml_oom(exc: BaseException) -> bool:
    """Whether ``exc`` is torch-directml's (untranslated) out-of-memory RuntimeError."""
    if not isinstance(exc, RuntimeError) or isinstance(exc, torch.OutOfMemoryError):
        return False
    text = exc.args[0] if len(exc.args) == 1 and isinstance(exc.args[0], str) else str(exc)
    return any(t in text for t in DIRECTML_OOM_TEXTS)


def _mib(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB"


_NBYTES = re.compile(r"allocate tensor with (\d+) bytes")


def cuda_text(original: str) -> str:
    """CUDA-style out-of-memory text that ends with torch-directml's own."""
    parts = ["CUDA out of memory."]
    m = _NBYTES.search(original)
    if m is not None:
        parts.append(f"Tried to allocate {_mib(int(m.group(1)))}.")
    parts.append("The DirectML adapter is out of memory; reduce the batch size (or the model) "
                 "to fit it.")
    parts.append(f"[torch-directml] {original}")
    return " ".join(parts)


def translate(exc: BaseException) -> BaseException:
    """``exc`` as a :class:`DirectMLOutOfMemoryError` if it is DirectML's OOM, else ``exc``."""
    if not is_directml_oom(exc):
        return exc
    new = DirectMLOutOfMemoryError(cuda_text(str(exc.args[0] if exc.args else exc)))
    new.__cause__ = exc
    return new


def reraise(exc: RuntimeError) -> None:
    """Raise ``exc`` translated if it is DirectML's OOM; otherwise return (the caller re-raises)."""
    new = translate(exc)
    if new is not exc:
        try:
            raise new from exc
        finally:
            # the raised error's traceback holds this frame: without the del, its locals would
            # hold the error (a cycle), and the script's frames, model and optimizer with it,
            # until the garbage collector runs; native CUDA's OOM frees them when caught
            del new, exc


def _recognising(wrapped: Any, instance: Any, args: tuple, kwargs: dict) -> Any:
    """A framework's "is this an OOM?" predicate that also says yes to DirectML's text."""
    if wrapped(*args, **kwargs):
        return True
    exc = args[0] if args else next(iter(kwargs.values()), None)
    return isinstance(exc, BaseException) and is_directml_oom(exc)


# (module, attribute) of the frameworks' predicates, including the names their finders bound
# with `from ... import`.
FRAMEWORK_PREDICATES = (
    ("accelerate.utils.memory", "should_reduce_batch_size"),
    ("accelerate.utils", "should_reduce_batch_size"),
    ("lightning.pytorch.utilities.memory", "is_oom_error"),
    ("lightning.pytorch.tuner.batch_size_scaling", "is_oom_error"),
    ("pytorch_lightning.utilities.memory", "is_oom_error"),
    ("pytorch_lightning.tuner.batch_size_scaling", "is_oom_error"),
)


class OutOfMemoryPatch(Patch):
    name = "oom"
    owns = tuple(Owns(module, (attr,)) for module, attr in FRAMEWORK_PREDICATES)

    def applies(self, caps) -> bool:
        return caps.directml

    def _install(self, caps, config) -> None:
        caps = caps
        mib = config.emulator_memory
        if mib:
            caps.limit_memory(int(mib) * 2**20)
            self.on_undo(lambda: caps.limit_memory(None))
        for modname, attr in FRAMEWORK_PREDICATES:
            self.when_imported(modname, lambda mod, attr=attr: self._wrap_predicate(mod, attr))

    def _wrap_predicate(self, module: Any, attr: str) -> None:
        if self.installed and callable(getattr(module, attr, None)) \
                and not is_patched(module, attr):
            self.wrap(module, attr, _recognising)
