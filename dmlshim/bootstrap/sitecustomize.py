"""dmlshim's child-process bootstrap (the mechanism coverage.py and opentelemetry-instrument use).

A shimmed process puts this directory first on ``PYTHONPATH`` and sets ``DMLSHIM_BOOTSTRAP=1``
(dmlshim/patches/processes.py); every Python process it starts then runs this file at startup,
through :mod:`site`. It installs nothing yet: it waits until the child imports ``torch`` and
installs dmlshim then, with the options the parent exported as ``DMLSHIM_*`` variables. A child
that never imports torch (``pip``, ``python -c "print(1)"``, a compiler wrapper) pays for one
stat and one small import, nothing more.

Rules, in this order:

* ``DMLSHIM_DISABLE=1`` in the child's environment wins: nothing happens.
* If the child imports ``dmlshim`` itself before torch (``python -m dmlshim`` does, and so does
  a script starting with ``import dmlshim``), dmlshim is in charge and the hook does nothing.
* A ``sitecustomize`` module that this one shadows (a distribution's or a virtualenv's) still
  runs, after this one.

This file must stay importable on any Python 3 without dmlshim's dependencies: a child may be
another interpreter that merely inherited ``PYTHONPATH``; it then does nothing.
"""

import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_SWITCH = "DMLSHIM_BOOTSTRAP"


def _truthy(value):
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


def _install_dmlshim(_torch_module=None):
    """Post-import hook of ``torch``: install dmlshim from the environment, once."""
    if "dmlshim" in sys.modules:
        # dmlshim was imported first (the runner, or `import dmlshim` in the script): it installs
        # with its own options, or is half-way through doing so right now.
        return
    if _truthy(os.environ.get("DMLSHIM_DISABLE")):
        return
    root = os.path.dirname(os.path.dirname(_HERE))  # the folder that holds the dmlshim package
    added = False
    try:
        import importlib.util

        if importlib.util.find_spec("dmlshim") is None:
            sys.path.insert(0, root)
            added = True
        import dmlshim  # installs from DMLSHIM_* unless sys.argv[0] == "-m" (see below)
    finally:
        if added:
            # the package is loaded; its submodules are found through dmlshim.__path__
            try:
                sys.path.remove(root)
            except ValueError:
                pass
    if not dmlshim.is_installed():
        # `python -m pkg.mod` imports pkg (and maybe torch) while sys.argv[0] is still "-m",
        # which dmlshim's import-time install takes for the runner starting. Install here.
        from dmlshim import config

        try:
            cfg = config.load()
        except config.ConfigError as err:
            config.exit_on_error(err)
        if not cfg.disabled:
            dmlshim.install(_config=cfg)


def _register_hook():
    if "torch" in sys.modules:  # a chained sitecustomize or a .pth imported it already
        _install_dmlshim()
        return
    try:
        from wrapt import register_post_import_hook
    except ImportError:
        return  # not an interpreter dmlshim can run in
    register_post_import_hook(_install_dmlshim, "torch")


def _chain_shadowed_sitecustomize():
    """Run the ``sitecustomize`` this file hides, as :mod:`site` would have."""
    try:
        from importlib.machinery import PathFinder
        from importlib.util import module_from_spec

        path = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
        spec = PathFinder.find_spec("sitecustomize", path)
        if spec is None or spec.loader is None:
            return
        module = module_from_spec(spec)
        sys.modules["dmlshim_chained_sitecustomize"] = module
        spec.loader.exec_module(module)
    except Exception as err:  # site.py reports a failing sitecustomize the same way
        print(f"Error in sitecustomize (chained by dmlshim); set PYTHONVERBOSE for traceback: "
              f"{type(err).__name__}: {err}", file=sys.stderr)


def _main():
    # This directory is on sys.path only to be found at startup; the child's own sys.path
    # should look as it would without dmlshim.
    while _HERE in sys.path:
        sys.path.remove(_HERE)
    if _truthy(os.environ.get(_SWITCH)) and not _truthy(os.environ.get("DMLSHIM_DISABLE")):
        try:
            _register_hook()
        except Exception as err:  # never stop the child from starting
            print(f"dmlshim: child-process bootstrap failed: {type(err).__name__}: {err}",
                  file=sys.stderr)
    _chain_shadowed_sitecustomize()


_main()
