"""The patch registry: every patch dmlshim installs goes through here, so uninstall is exact.

Modelled on OpenTelemetry's ``BaseInstrumentor`` (idempotent ``install``/``uninstall``) and
gevent.monkey's ``get_original``. A :class:`Patch` wraps attributes with wrapt and records, for
each ``(owner, name)``, whether the owner had the attribute in its own ``__dict__`` and what it
was, so ``uninstall`` puts back the very same object (or deletes an attribute that was
inherited, e.g. ``torch.Tensor.to`` which lives on ``torch._C.TensorBase``).
"""

from __future__ import annotations

import logging
import sys
import threading
from dataclasses import dataclass
from types import CodeType, FunctionType
from typing import Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

import wrapt

from dmlshim import current

log = logging.getLogger("dmlshim")

_MISSING = object()

# (id(owner), name) -> (owner, name, value in owner.__dict__ or _MISSING, looked-up original)
_originals: Dict[Tuple[int, str], Tuple[Any, str, Any, Any]] = {}


def get_original(owner: Any, name: Union[str, Sequence[str]]) -> Any:
    """The object ``owner.name`` had before dmlshim patched it (the current one if unpatched).

    ``owner`` is the object holding the attribute (``torch.cuda``, ``torch.Tensor``) or its
    dotted name (``"torch.cuda"``, as gevent.monkey's ``get_original(mod_name, item_name)``);
    a list of names gives a list of originals, as gevent's does."""
    if isinstance(owner, str):
        found = resolve(owner)
        if found is None:
            import importlib

            found = importlib.import_module(owner)  # a module not imported yet: as gevent does
        owner = found
    if not isinstance(name, str):
        return [get_original(owner, n) for n in name]
    rec = _originals.get((id(owner), name))
    return rec[3] if rec is not None else getattr(owner, name)


def is_patched(owner: Any, name: str) -> bool:
    return (id(owner), name) in _originals


def _is_shim(module_name: str) -> bool:
    return module_name.startswith("dmlshim.") or module_name.startswith("wrapt")


# torch, the emulator (standing in for torch-directml's C++) and the kernels the two share with
# dmlshim (dmlshared: the emulator runs them as the wheel's own)
_TRUTH_PACKAGES = frozenset(("torch", "emulated_dml", "dmlshared"))


def caller_module(depth: int = 1) -> str:
    """``__name__`` of the module that called the function calling this one.

    Frames of wrapt's pure-Python fallback and of dmlshim itself are skipped, so the answer is
    the first frame outside the shim.
    """
    frame = sys._getframe(depth + 1)
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if not _is_shim(name):
            return name
        frame = frame.f_back  # type: ignore[assignment]
    return ""


def called_from_torch(depth: int = 1) -> bool:
    """True when the caller is torch's own code, which must keep seeing the truth.

    The answer is kept per calling code object (``api.Shim.torch_callers``): a code object
    belongs to one module, so it never changes, and the frame walk happens once per calling
    function, not once per call (torch's Optimizer.step and autograd call patched functions
    every step). Hot wrappers capture that dict at install and inline the lookup
    (``callers.get(sys._getframe(1).f_code)``), calling this only on a miss.
    """
    frame = sys._getframe(depth + 1)
    shim = current.session
    memo: Dict[CodeType, bool] = shim.torch_callers if shim is not None else {}
    hit = memo.get(frame.f_code)
    if hit is not None:
        return hit
    while frame is not None:
        name = frame.f_globals.get("__name__", "")
        if _is_shim(name):
            frame = frame.f_back  # type: ignore[assignment]
            continue
        # the emulator stands in for torch-directml's C++, which sees torch's truth too
        answer = name.split(".", 1)[0] in _TRUTH_PACKAGES
        memo[frame.f_code] = answer
        return answer
    return False


# one line, which stands for the caller's: co_firstlineno is the line of the call
def _trampoline(fn, args, kwargs): return fn(*args, **kwargs)  # type: ignore[no-untyped-def]  # noqa: E704


_TRAMPOLINE = _trampoline.__code__


def call_at_callers_line(fn: Callable[..., Any], args: Sequence[Any],
                         kwargs: Dict[str, Any]) -> Any:
    """``fn(*args, **kwargs)``, called from a frame that stands at the caller's line.

    The caller is the first frame outside dmlshim and wrapt. A wrapped API that warns with
    ``stacklevel=2`` (torch 2.4's ``torch.load`` FutureWarning about ``weights_only``) names
    its caller's line: with a wrapper between them, that would be dmlshim's. From this frame
    (the caller's file, line, function name and module globals: the module its filters match
    and its warning registry) the warning reads as it does without dmlshim. An exception
    raised through the call leaves that frame out of its traceback, which would otherwise
    print the caller's line a second time. For APIs called rarely (a code and a function
    object per call, a few microseconds).
    """
    frame = sys._getframe(1)
    while frame is not None and _is_shim(frame.f_globals.get("__name__", "")):
        frame = frame.f_back  # type: ignore[assignment]
    if frame is None or not frame.f_lineno:
        return fn(*args, **kwargs)
    code = _TRAMPOLINE.replace(co_filename=frame.f_code.co_filename,
                               co_name=frame.f_code.co_name, co_firstlineno=frame.f_lineno)
    try:
        return FunctionType(code, frame.f_globals)(fn, args, kwargs)
    except BaseException as err:
        # The traceback runs this frame -> the trampoline -> fn's frames. Unlinking the
        # trampoline (tb_next is writable) leaves the caller's line printed once, where the
        # caller's own frame stands; a bare raise re-raises this same traceback object on
        # every Python, and adds no entry for this frame a second time.
        here = err.__traceback__
        if here is not None and here.tb_next is not None and here.tb_next.tb_frame.f_code is code:
            here.tb_next = here.tb_next.tb_next
        raise


class Reentry(threading.local):
    """A per-thread "already inside" marker, the one re-entry helper of the patches.

    ``with guard:`` around the wrapped call; ``guard.active`` is true in calls it makes (torch
    recursing into the same entry point, e.g. ``Module.train`` on each child)."""

    depth = 0

    @property
    def active(self) -> bool:
        return self.depth > 0

    def __enter__(self) -> Reentry:
        self.depth += 1
        return self

    def __exit__(self, *exc: Any) -> None:
        self.depth -= 1


def resolve(dotted: str) -> Any:
    """The object a dotted name denotes among the imported modules (None: not imported)."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        obj = sys.modules.get(".".join(parts[:cut]))
        if obj is None:
            continue
        for attr in parts[cut:]:
            obj = getattr(obj, attr, None)
            if obj is None:
                return None
        return obj
    return None


@dataclass(frozen=True)
class Owns:
    """Attributes a patch may wrap or replace, as data (gevent.monkey's ``__implements__``).

    ``owner`` is a dotted name (a module or class, resolved among the imported modules, so a
    framework that is imported later can be named); ``names`` the attribute names, or ``"*"``
    for any attribute of that owner. With ``subclasses=True`` the names belong on the owner's
    strict subclasses (every optimizer's ``step``), not on the owner itself.
    """

    owner: str
    names: Union[Tuple[str, ...], str]
    subclasses: bool = False

    def covers(self, owner: Any, name: str) -> bool:
        if self.names != "*" and name not in self.names:
            return False
        declared = resolve(self.owner)
        if declared is None:
            return False
        if not self.subclasses:
            return owner is declared
        return isinstance(owner, type) and isinstance(declared, type) and owner is not declared \
            and issubclass(owner, declared)


class Patch:
    """One area's patches. Subclasses implement :meth:`_install` using :meth:`wrap`/:meth:`replace`."""

    #: short name used in logs, reports and ``install(patches=...)``
    name = "patch"
    #: what this patch may wrap or replace; nothing else (tests/test_patch_owners.py checks
    #: that no two patches own the same attribute)
    owns: Tuple[Owns, ...] = ()

    def __init__(self) -> None:
        self._installed = False
        self._keys: List[Tuple[int, str]] = []
        self._undo: List[Callable[[], None]] = []

    @property
    def installed(self) -> bool:
        """Whether this patch changed something (an empty plan is not installed)."""
        return self._installed

    def applies(self, caps: Any) -> bool:  # noqa: ARG002 - overridden
        """Whether this patch is wanted on the target whose capabilities are ``caps`` (the
        session's :class:`dmlshim.capabilities.Capabilities`; ``caps.target`` is the Target)."""
        return True

    def install(self, caps: Any, config: Any) -> None:
        if self._installed:
            return
        self._installed = True
        try:
            self._install(caps, config)
        except BaseException:
            self.uninstall()
            raise
        if not (self._keys or self._undo):
            # applies() said yes but the plan came out empty (nothing to change for this
            # target and these options): not installed, so reports list only what acts
            self._installed = False

    def uninstall(self) -> None:
        if not self._installed:
            return
        for undo in reversed(self._undo):
            try:
                undo()
            except Exception:  # pragma: no cover - an undo must never stop the others
                log.debug("dmlshim: undo step of %s failed", self.name, exc_info=True)
        for key in reversed(self._keys):
            owner, name, own_value, _ = _originals.pop(key)
            if own_value is _MISSING:
                try:
                    delattr(owner, name)
                except AttributeError:
                    pass
            else:
                setattr(owner, name, own_value)
        self._keys.clear()
        self._undo.clear()
        self._installed = False

    # -- helpers for subclasses -------------------------------------------------------------

    def _install(self, caps: Any, config: Any) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def replace(self, owner: Any, name: str, value: Any) -> Any:
        """Set ``owner.name = value``, remembering the original. Returns the original."""
        key = (id(owner), name)
        if key in _originals:
            raise RuntimeError(f"dmlshim: {owner!r}.{name} is already patched")
        if not any(o.covers(owner, name) for o in self.owns):
            raise RuntimeError(f"dmlshim: the {self.name} patch changes {_dotted(owner)}.{name}, "
                               "which its `owns` does not declare")
        own = vars(owner).get(name, _MISSING)
        original = getattr(owner, name, None)
        _originals[key] = (owner, name, own, original)
        self._keys.append(key)
        setattr(owner, name, value)
        return original

    def wrap(self, owner: Any, name: str, wrapper: Callable[..., Any]) -> Any:
        """Wrap ``owner.name`` with a wrapt ``FunctionWrapper``: ``wrapper(wrapped, instance, args, kwargs)``.

        An attribute is wrapped once, by the one area that owns it: wrapping it again is an
        error (add a rewriter to :mod:`dmlshim.conversions` instead of a second layer).
        """
        if is_patched(owner, name):
            raise RuntimeError(f"dmlshim: {owner!r}.{name} is already wrapped; one owner per "
                               "entry point (see dmlshim.conversions for adding a rule)")
        original = getattr(owner, name)
        if isinstance(owner, type):
            # Look the attribute up raw so staticmethod/classmethod/descriptors wrap correctly.
            for klass in owner.__mro__:
                if name in klass.__dict__:
                    raw = klass.__dict__[name]
                    break
            else:  # pragma: no cover
                raw = original
            wrapped = wrapt.FunctionWrapper(raw, wrapper)
        else:
            wrapped = wrapt.FunctionWrapper(original, wrapper)
        self.replace(owner, name, wrapped)
        return original

    def on_undo(self, fn: Callable[[], None]) -> None:
        """Run ``fn`` at uninstall (for state that is not an attribute, e.g. a registered hook)."""
        self._undo.append(fn)

    def when_imported(self, module_name: str, fn: Callable[[Any], None]) -> None:
        """Run ``fn(module)`` now if the module is imported, else right after its import, if
        this patch is still installed then (uninstall cancels the wait)."""
        module = sys.modules.get(module_name)
        if module is not None:
            fn(module)
        else:
            self.on_undo(_wait_for(module_name, fn))


def _dotted(owner: Any) -> str:
    if isinstance(owner, type):
        return f"{owner.__module__}.{owner.__qualname__}"
    return getattr(owner, "__name__", repr(owner))


# Module names with a post-import hook of dmlshim's that has not fired yet. wrapt cannot
# unregister a hook, so dmlshim registers one per module name and process (_run_waiting, a
# module-level function: it keeps nothing alive) and the session keeps the callbacks that wait
# (``api.Shim.import_waits``), which uninstall drops: a hook per callback would keep every
# uninstalled patch alive until the module is imported.
_hooked: Set[str] = set()
_hook_lock = threading.Lock()


def _run_waiting(module: Any) -> None:
    """wrapt's post-import hook: the module is imported; run what waits for it (once: wrapt
    drops its hooks for a module when they fire)."""
    name = getattr(module, "__name__", "")
    shim = current.session
    with _hook_lock:
        _hooked.discard(name)
        callbacks = shim.import_waits.pop(name, []) if shim is not None else []
    for fn in callbacks:
        fn(module)


def _wait_for(module_name: str, fn: Callable[[Any], None]) -> Callable[[], None]:
    """Run ``fn(module)`` right after ``module_name`` is imported; returns the cancel step."""
    shim = current.session
    if shim is None:  # a patch installed on its own, outside a session: wrapt's hook directly
        wrapt.register_post_import_hook(fn, module_name)
        return lambda: None
    waits = shim.import_waits
    with _hook_lock:
        waits.setdefault(module_name, []).append(fn)
        hook = module_name not in _hooked
        _hooked.add(module_name)
    if hook:  # outside the lock: wrapt runs the hook at once if the module was just imported
        wrapt.register_post_import_hook(_run_waiting, module_name)

    def cancel() -> None:
        with _hook_lock:
            waiting = waits.get(module_name, [])
            for i, other in enumerate(waiting):
                if other is fn:
                    del waiting[i]
                    break
            if not waiting:
                waits.pop(module_name, None)

    return cancel


class PatchSet:
    """An ordered group of patches installed and removed together."""

    def __init__(self, patches: List[Patch]) -> None:
        self.patches = patches

    def install(self, caps: Any, config: Any, only: Optional[List[str]] = None) -> List[str]:
        done = []
        try:
            for patch in self.patches:
                if only is not None and patch.name not in only:
                    continue
                if patch.applies(caps):
                    patch.install(caps, config)
                    if patch.installed:
                        done.append(patch.name)
        except BaseException:
            self.uninstall()
            raise
        return done

    def uninstall(self) -> None:
        for patch in reversed(self.patches):
            patch.uninstall()


class ThreadStack(threading.local):
    """A per-thread stack of values: data a wrapper hands down to the calls it makes (the
    modules a conversion covers, where a load's storages go, the inference-mode regions open),
    where :class:`Reentry` would hold only a flag.

    ``with stack.pushed(value):`` around the wrapped call (an inner call pushes its own and the
    outer value comes back after it); ``stack.top`` is the innermost value, None when none is
    pushed in this thread. An enter and an exit that are separate calls use ``push``/``pop``.
    """

    def __init__(self) -> None:  # threading.local runs it once in each thread
        self.items: List[Any] = []

    @property
    def top(self) -> Any:
        items = self.items
        return items[-1] if items else None

    def push(self, value: Any) -> None:
        self.items.append(value)

    def pop(self) -> Any:
        """The innermost value, removed (None when the stack is empty)."""
        items = self.items
        return items.pop() if items else None

    def pushed(self, value: Any) -> _Pushed:
        return _Pushed(self, value)


class _Pushed:
    __slots__ = ("stack", "value")

    def __init__(self, stack: ThreadStack, value: Any) -> None:
        self.stack, self.value = stack, value

    def __enter__(self) -> Any:
        self.stack.items.append(self.value)
        return self.value

    def __exit__(self, *exc: Any) -> None:
        self.stack.items.pop()
