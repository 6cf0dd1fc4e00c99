"""dmlshim's startup hook: the runner's own interpreter runs no sitecustomize of the user's.

``python -m dmlshim train.py`` is two interpreters where ``python train.py`` is one: the
runner's, which replaces itself with (on Windows: waits for) the interpreter that runs the
script. :mod:`site` runs ``sitecustomize`` and ``usercustomize`` at the start of each, so a
user's would run twice. ``dmlshim-startup.pth``, which the package installs next to it, runs
:func:`startup` while :mod:`site` reads ``.pth`` files, before it imports ``sitecustomize``; in
the runner's interpreter it tells :mod:`site` to leave both to the script's interpreter, where
they run once, as with plain python. In every other process it does nothing and leaves no
module behind (the ``.pth`` line imports this module only when the command line may start the
runner, and the module then leaves ``sys.modules``).

The one exception is dmlshim's own bootstrap (a runner started by a shimmed process, whose
``PYTHONPATH`` puts the bootstrap first): it must run, to give that runner its environment
back, and it chains the user's ``sitecustomize`` only where :func:`is_runner` says no.

Like the bootstrap, this file imports nothing that ``python -c pass`` does not load.
"""

import os
import sys

RUNNER_MODULES = ("dmlshim", "dmlshim.__main__")
BOOTSTRAP_MARKER = "DMLSHIM_BOOTSTRAP"  # dmlshim/bootstrap/sitecustomize.py's MARKER


def is_runner(argv) -> bool:
    """Whether ``argv`` (``sys.orig_argv``) starts dmlshim's runner: ``python [options] -m
    dmlshim`` or the ``dmlshim`` console script. Python's own options are read as python reads
    them."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "--check-hash-based-pycs":
            i += 2
            continue
        if not arg.startswith("-") or arg in ("-", "--") or arg.startswith("--"):
            return _is_console_script(arg)  # a script (dmlshim's own?), stdin, or an option
        for j in range(1, len(arg)):
            c = arg[j]
            if c in "cm":
                module = arg[j + 1:] or (argv[i + 1] if i + 1 < len(argv) else "")
                return c == "m" and module in RUNNER_MODULES
            if c in "WX":
                i += 0 if arg[j + 1:] else 1  # the value: the rest, or the next argument
                break
        i += 1
    return False


def _is_console_script(path: str) -> bool:
    # pip's console script: bin/dmlshim (POSIX); on Windows Scripts\dmlshim.exe runs python on
    # its own archive (sys.orig_argv names the .exe) or dmlshim-script.py
    name = os.path.basename(path).lower()
    return name in ("dmlshim", "dmlshim.exe", "dmlshim-script.py")


def command_line() -> list:
    """The interpreter's command line as started (``sys.orig_argv``; read from the OS before
    Python 3.10, where ``sys.argv`` has lost the module's name while ``.pth`` files run)."""
    argv = getattr(sys, "orig_argv", None)
    if argv:
        return list(argv)
    try:
        if sys.platform == "win32":
            import ctypes  # only on Python 3.9 under -m: not on the path of any other process

            kernel32, shell32 = ctypes.windll.kernel32, ctypes.windll.shell32
            kernel32.GetCommandLineW.restype = ctypes.c_wchar_p
            shell32.CommandLineToArgvW.restype = ctypes.POINTER(ctypes.c_wchar_p)
            count = ctypes.c_int()
            args = shell32.CommandLineToArgvW(kernel32.GetCommandLineW(), ctypes.byref(count))
            return [args[k] for k in range(count.value)]
        with open("/proc/self/cmdline", "rb") as f:
            return [os.fsdecode(a) for a in f.read().split(b"\0")[:-1]]
    except Exception:
        return []


def _skip():
    """Stands in for site's execsitecustomize/execusercustomize in the runner's interpreter."""


def startup() -> None:
    site = sys.modules.get("site")
    if site is None or not is_runner(command_line()):
        sys.modules.pop(__name__, None)  # no trace in the script's sys.modules: python's
        return
    if BOOTSTRAP_MARKER not in os.environ:
        site.execsitecustomize = _skip
    site.execusercustomize = _skip
