"""DirectML's out-of-memory error, seen by scripts as CUDA's.

torch-directml's allocator raises ``RuntimeError("Could not allocate tensor with N bytes. There
is not enough GPU video memory available!")`` (or ``DML allocator out of memory!``). CUDA code
catches ``torch.cuda.OutOfMemoryError``, and the frameworks' batch-size finders look at the
text: accelerate's ``should_reduce_batch_size`` (HF Trainer's ``auto_find_batch_size`` uses it)
wants ``" out of memory."``, Lightning's ``is_oom_error`` wants ``"CUDA"`` and
``"out of memory"``, both in the one argument of a RuntimeError. So the error is translated to
:class:`DirectMLOutOfMemoryError`: a real ``torch.OutOfMemoryError`` (hence a RuntimeError)
whose one argument is CUDA-style text followed by the original DirectML text (a script that
matched torch-directml's words still finds them).

Where it is translated:

* ``emulated-dml``: where the error is raised. The emulator builds its out-of-memory error
  through a factory (``emulator/_memory.py``) and this patch sets the factory, so every
  operator -- an entry point, forward, backward, the optimizer step -- raises the translated
  error, and nothing is added to the normal path.
* ``dml``: torch-directml raises from C++, below every Python frame of the shim's, and
  translating in backward or the optimizer step would need a wrapper frame on every step. So
  there the frameworks' OOM predicates are wrapped instead (they run only once an exception
  was raised) and also recognise the raw text (:func:`is_directml_oom`); a script's own
  ``except torch.cuda.OutOfMemoryError`` does not see the untranslated error.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import torch

from dmlshim.patching import Patch, when_imported

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


def cuda_text(original: str, nbytes: Optional[int] = None, index: Optional[int] = None,
              where: str = "", in_use: Optional[int] = None) -> str:
    """CUDA-style out-of-memory text that ends with torch-directml's own."""
    parts = ["CUDA out of memory."]
    if nbytes is not None:
        parts.append(f"Tried to allocate {_mib(nbytes)}.")
    gpu = f"GPU {index if index is not None else 0}"
    if where:
        gpu += f" ({where})"
    if in_use is not None:
        parts.append(f"{gpu} has {_mib(in_use)} allocated.")
    else:
        parts.append(f"{gpu} is out of memory.")
    parts.append("Reduce the batch size (or the model) to fit the adapter.")
    parts.append(f"[torch-directml] {original}")
    return " ".join(parts)


def translate(exc: BaseException) -> BaseException:
    """``exc`` as a :class:`DirectMLOutOfMemoryError` if it is DirectML's OOM, else ``exc``."""
    if not is_directml_oom(exc):
        return exc
    new = DirectMLOutOfMemoryError(cuda_text(str(exc.args[0] if exc.args else exc)))
    new.__cause__ = exc
    return new


def _emulator_error(nbytes: int, index: int) -> BaseException:
    from dmlshim.emulator import _memory

    limit = _memory.limit()
    where = f"emulated DirectML adapter {index}"
    if limit is not None:
        where += f", limit {_mib(limit)} set by DMLSHIM_EMULATOR_MEMORY"
    return DirectMLOutOfMemoryError(cuda_text(_memory.oom_message(nbytes), nbytes, index, where,
                                              _memory.allocated(index)))


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

    def applies(self, target) -> bool:
        return target.kind in ("dml", "emulated-dml")

    def _install(self, target, config) -> None:
        if target.kind == "emulated-dml":
            from dmlshim.emulator import _memory

            mib = config.emulator_memory
            _memory.set_limit(int(mib) * 2**20 if mib else None)
            _memory.set_oom_error(_emulator_error)

            def restore() -> None:
                _memory.set_limit(None)
                _memory.set_oom_error(None)

            self.on_undo(restore)
        for modname, attr in FRAMEWORK_PREDICATES:
            when_imported(modname, lambda mod, attr=attr: self._wrap_predicate(mod, attr))

    def _wrap_predicate(self, module: Any, attr: str) -> None:
        if not self.installed or not callable(getattr(module, attr, None)):
            return
        from dmlshim.patching import is_patched

        if not is_patched(module, attr):
            self.wrap(module, attr, _recognising)
