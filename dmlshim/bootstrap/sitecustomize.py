"""dmlshim's process bootstrap (the mechanism of coverage.py and opentelemetry-instrument).

``python -m dmlshim`` and a shimmed process starting a child put this directory first on
``PYTHONPATH`` and set ``DMLSHIM_BOOTSTRAP`` (see dmlshim/childenv.py); :mod:`site` then runs
this file at startup. It

* gives the script back the environment it would have had without dmlshim: ``PYTHONPATH`` and
  every variable the marker lists are restored byte for byte (the values dmlshim set are kept
  here, in :data:`inherited`, for the shim to read), and this directory leaves ``sys.path``;
* puts a finder on ``sys.meta_path`` that waits for ``import torch`` and, once torch has
  finished importing, imports dmlshim, which installs itself (dmlshim/launch.py). A child that
  never imports torch pays for this file and nothing else;
* runs the ``sitecustomize`` this one shadows (a distribution's or a virtualenv's), as site
  would have.

``DMLSHIM_DISABLE=1`` in the environment the process starts with turns the hook off. If the
script imports dmlshim itself before torch, dmlshim is in charge and the hook does nothing.

It must stay importable on any Python 3 and import nothing that ``python -c pass`` does not
load anyway (no wrapt, logging, threading, importlib.util, json, re): a child may be another
interpreter that merely inherited ``PYTHONPATH``, or a tool that must patch those modules first.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
MARKER = "DMLSHIM_BOOTSTRAP"

# Set once, at startup (below): the variables the marker listed, with the values the launching
# process gave them (None: it removed the variable), which dmlshim reads its options from
# (dmlshim/launch.py); and whether this process started with the marker (and the hook on).
inherited = {}
active = False


def _unescape(text):
    return text.replace("%3B", ";").replace("%3D", "=").replace("%25", "%")


def _decode(field):
    return None if field == "-" else _unescape(field[1:])


def undo(environ, marker):
    """Put back in ``environ`` what the marker says was changed; return the changed values.

    A variable whose value is no longer the one the marker recorded was changed again by
    whoever started this process: it keeps that value. The marker format is written by
    dmlshim/childenv.py: ``1`` then ``;``-separated records, ``V<name>=<old>=<new>`` (a value
    is ``-`` for unset or ``+`` and the escaped text), ``P<name>=<folder>=<+|->`` (``folder``
    was put first on a path list that was set or unset before) and ``M=<old marker>``.
    """
    changed = {}
    records = marker.split(";")[1:]
    for record in records:
        kind, rest = record[:1], record[1:]
        parts = rest.split("=")
        if kind == "V" and len(parts) == 3:
            name, old, new = _unescape(parts[0]), _decode(parts[1]), _decode(parts[2])
            current = environ.get(name)
            changed[name] = current
            if current == new:
                if old is None:
                    environ.pop(name, None)
                else:
                    environ[name] = old
        elif kind == "P" and len(parts) == 3:
            name, folder, was_set = _unescape(parts[0]), _unescape(parts[1]), parts[2] == "+"
            current = environ.get(name)
            changed[name] = current
            if current is None:
                continue
            if current == folder and not was_set:
                environ.pop(name, None)
            elif current.startswith(folder + os.pathsep):
                environ[name] = current[len(folder) + 1:]
        elif kind == "M" and len(parts) == 2:
            old = _decode(parts[1])
            if environ.get(MARKER) == marker:
                if old is None:
                    environ.pop(MARKER, None)
                else:
                    environ[MARKER] = old
    return changed


def _disables(value):
    """``DMLSHIM_DISABLE`` as dmlshim/config.py reads it: "1" disables; any other value leaves
    the hook on, and a bad one then stops the process with config's message at ``import torch``
    (as ``import dmlshim`` does)."""
    return (value or "").strip() == "1"


def _install_dmlshim():
    """Called once torch has finished importing: import dmlshim, which installs itself."""
    if "dmlshim" in sys.modules:
        # the script imported dmlshim first: it installs (or is installing right now) itself
        return
    # Import the dmlshim this bootstrap belongs to, wherever sys.path points.
    from _frozen_importlib import module_from_spec
    from _frozen_importlib_external import PathFinder

    root = os.path.dirname(os.path.dirname(_HERE))
    spec = PathFinder.find_spec("dmlshim", [root])
    if spec is None or spec.loader is None:
        return
    # dmlshim imports its sibling dmlshared (what it shares with the emulator; its package file
    # imports nothing) from the start: the one beside it, for the same reason
    shared = PathFinder.find_spec("dmlshared", [root]) if "dmlshared" not in sys.modules else None
    if shared is not None and shared.loader is not None:
        sys.modules["dmlshared"] = module_from_spec(shared)
        shared.loader.exec_module(sys.modules["dmlshared"])
    module = module_from_spec(spec)
    sys.modules["dmlshim"] = module
    try:
        spec.loader.exec_module(module)  # dmlshim/__init__.py installs (dmlshim/launch.py)
    except BaseException:
        sys.modules.pop("dmlshim", None)
        raise


class _AfterImport:
    """Loader wrapper: runs the real loader, then ``callback``; the module keeps its loader."""

    def __init__(self, loader, callback):
        self.loader, self.callback = loader, callback

    def create_module(self, spec):
        return self.loader.create_module(spec)

    def exec_module(self, module):
        module.__loader__ = self.loader
        if getattr(module, "__spec__", None) is not None:
            module.__spec__.loader = self.loader
        self.loader.exec_module(module)
        self.callback()


class TorchImportHook:
    """A ``sys.meta_path`` finder that runs ``callback`` (:func:`_install_dmlshim`) once, after
    ``import torch``. ``import dmlshim`` uses it too, while ``python -m`` is looking for its module
    (dmlshim/__init__.py)."""

    def __init__(self, callback=None):
        self._finding = False
        self.callback = callback or _install_dmlshim

    def find_spec(self, name, path=None, target=None):
        if name != "torch" or self._finding:
            return None
        self._finding = True
        try:
            for finder in sys.meta_path:
                find = getattr(finder, "find_spec", None)
                if finder is self or find is None:
                    continue
                spec = find(name, path, target)
                if spec is not None:
                    break
            else:
                return None
        finally:
            self._finding = False
        if spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return spec
        spec.loader = _AfterImport(spec.loader, self._torch_imported)
        return spec

    def _torch_imported(self):
        self.remove()
        self.callback()

    def remove(self):
        if self in sys.meta_path:
            sys.meta_path.remove(self)


def _chain_shadowed_sitecustomize():
    """Run the ``sitecustomize`` this file hides, as :mod:`site` would have."""
    try:
        from _frozen_importlib import module_from_spec
        from _frozen_importlib_external import PathFinder

        here = os.path.normcase(_HERE)
        path = [p for p in sys.path if os.path.normcase(os.path.abspath(p or os.curdir)) != here]
        spec = PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        module = module_from_spec(spec)
        sys.modules["dmlshim_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as err:  # site.py reports a failing sitecustomize the same way
        print(f"Error in sitecustomize (chained by dmlshim); set PYTHONVERBOSE for traceback: "
              f"{type(err).__name__}: {err}", file=sys.stderr)


class _ScriptView:
    """``os.environ`` as the script reads it, changed without ``putenv``/``unsetenv``.

    The process's own environment block keeps what the launching process exported (the
    bootstrap on ``PYTHONPATH``, the options, the marker), so every child that inherits it
    carries the shim, children of children too: ``subprocess`` without ``env=``, ``os.system``,
    ``os.exec*v``, multiprocessing's spawn and forkserver, a launcher that never imports torch
    (ddtrace-run and opentelemetry-instrument cover the process tree the same way). The
    script's ``os.environ`` is plain python's. What the script sets in ``os.environ`` reaches
    the block as usual (``putenv``) and so its children."""

    def __init__(self, environ):
        self.environ = environ

    def get(self, name, default=None):
        return self.environ.get(name, default)

    def __setitem__(self, name, value):
        env = self.environ
        env._data[env.encodekey(name)] = env.encodevalue(value)

    def pop(self, name, default=None):
        env = self.environ
        return env._data.pop(env.encodekey(name), default)


def _script_view():
    env = os.environ
    if all(hasattr(env, a) for a in ("_data", "encodekey", "encodevalue")):
        return _ScriptView(env)
    return env  # not CPython's os._Environ: give the environment back to the children too


def _read_marker():
    """-> (inherited, active): the environment given back, what the launching process set."""
    marker = os.environ.get(MARKER)
    if marker is None or marker[:1] != "1":
        return {}, False
    changed = undo(_script_view(), marker)
    disabled = changed.get("DMLSHIM_DISABLE", os.environ.get("DMLSHIM_DISABLE"))
    return changed, not _disables(disabled)


def _is_runner():
    """Whether this interpreter is dmlshim's runner (_dmlshim_startup.py says, which lies next
    to the dmlshim package and which dmlshim-startup.pth has usually imported already)."""
    argv = getattr(sys, "orig_argv", None)
    if argv is not None and not any("dmlshim" in arg for arg in argv[1:]):
        return False  # most children: nothing to load (argv[0], python, may lie in any folder)
    startup = sys.modules.get("_dmlshim_startup")
    if startup is None:
        # loaded, not imported: the script's sys.modules stays python's
        from _frozen_importlib import module_from_spec
        from _frozen_importlib_external import PathFinder

        spec = PathFinder.find_spec("_dmlshim_startup", [os.path.dirname(os.path.dirname(_HERE))])
        if spec is None or spec.loader is None:
            return False
        startup = module_from_spec(spec)
        spec.loader.exec_module(startup)
    return startup.is_runner(startup.command_line())


def _start(on):
    if on:
        if "torch" in sys.modules:  # a .pth file imported it already
            _install_dmlshim()
        else:
            sys.meta_path.insert(0, TorchImportHook())
    # This directory is on sys.path only to be found at startup.
    if _HERE in sys.path:
        sys.path.remove(_HERE)
        sys.path_importer_cache.pop(_HERE, None)
    # The runner replaces itself with the interpreter that runs the script, whose bootstrap
    # runs the shadowed sitecustomize: once per script, as with plain python, not here too.
    if not _is_runner():
        _chain_shadowed_sitecustomize()


if __name__ == "sitecustomize":
    inherited, active = _read_marker()  # before dmlshim may read them (_start installs it)
    _start(active)
