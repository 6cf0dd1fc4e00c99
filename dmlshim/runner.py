"""``python -m dmlshim [dmlshim options] [python options] script|-m mod|-c code|dir|zip [args]``.

The runner does not run the script. It validates dmlshim's options, sets up the environment
that makes the interpreter carry the shim (dmlshim/childenv.py: the bootstrap first on
``PYTHONPATH``, the options as ``DMLSHIM_*``) and replaces itself with ``sys.executable``
and the same interpreter options and target (``os.execve``), so python itself runs the
script: ``sys.path``, zip apps, directories, ``-c``/``-m``/``-P``/``-W``/``-X``, globals,
frames, signals and exit status are python's. The bootstrap installs the shim when the script
imports torch. Where ``os.execve`` is not a real exec (Windows), the interpreter runs as a
child: its exit status is passed on, and Ctrl-C reaches it.
"""

from __future__ import annotations

import os
import sys
from typing import Dict, List, Mapping, Optional, Tuple

from dmlshim import config
from dmlshim.exit_status import windows_exit_status

USAGE = """usage: python -m dmlshim [options] [python options] script.py|dir|app.zip [args ...]
       python -m dmlshim [options] [python options] -m module [args ...]
       python -m dmlshim [options] [python options] -c code [args ...]
       python -m dmlshim --doctor

Runs a CUDA PyTorch script unchanged on DirectML, or on the CPU where no adapter exists.
dmlshim's options come first; python's options and the script follow, as after `python`.

How it runs: this runner validates the options and execs python with dmlshim's bootstrap
(dmlshim/bootstrap) on PYTHONPATH -> the bootstrap gives the script its environment back and
waits for `import torch` -> the session (dmlshim.api.Shim) picks the target and installs the
patches (dmlshim/patches: one owner per entry point) -> CUDA work goes to the target:
torch_directml, the CPU, CUDA (inert), or emulated_dml (the wheel's emulator, for tests).
"""

AS_CHILD_ENV = config.INTERNAL_BY_NAME["runner_as_child"].env

# python's short options that take a value, and those after which python needs no script
_PY_VALUE_OPTIONS = "WX"
_PY_TARGET_OPTIONS = "cm"
_PY_NO_TARGET_OPTIONS = "hV?i"
_PY_LONG_OPTIONS = {"--check-hash-based-pycs": True, "--help-env": False,
                    "--help-xoptions": False, "--help-all": False}
# python options that keep the interpreter from reading PYTHONPATH or running sitecustomize
_PY_NO_BOOTSTRAP = {"E": "-E", "I": "-I", "S": "-S"}


class UsageError(Exception):
    pass


def parse_args(argv: List[str]) -> Tuple[Dict[str, str], List[str], Dict[str, bool]]:
    """-> (dmlshim options as typed {name: raw value}, the interpreter's argv, actions).

    ``actions``: ``doctor``, ``help``, ``version``. Values are not validated here.
    """
    options: Dict[str, str] = {}
    actions = {"doctor": False, "help": False, "version": False}
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            actions["help"] = True
        elif arg == "--version":
            actions["version"] = True
        elif arg == "--doctor":
            actions["doctor"] = True
        elif arg == "--":
            i += 1
            break
        elif arg.startswith("--") and arg.partition("=")[0] not in _PY_LONG_OPTIONS:
            flag, eq, value = arg.partition("=")
            opt = config.OPTIONS_BY_FLAG.get(flag)
            if opt is None:
                raise UsageError(f"unknown option {flag} (see python -m dmlshim --help)")
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"option {flag} needs a value ({opt.valid})")
                i += 1
                value = argv[i]
            options[opt.name] = value
        else:
            break
        i += 1
    return options, argv[i:], actions


def scan_python_args(args: List[str]) -> Tuple[bool, List[str]]:
    """Read python's options as python does: (whether a script/-c/-m/- or a no-script option
    such as -V is given, the options that keep the bootstrap from running)."""
    no_bootstrap: List[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg == "-" or not arg.startswith("-"):
            return True, no_bootstrap
        if arg == "--":
            return i + 1 < len(args), no_bootstrap
        if arg.startswith("--"):
            name = arg.partition("=")[0]
            if name not in _PY_LONG_OPTIONS:
                return True, no_bootstrap  # python reports it
            if name != "--check-hash-based-pycs":
                return True, no_bootstrap  # --help-*: python prints and exits
            i += 1 if "=" in arg else 2
            continue
        j = 1
        while j < len(arg):
            c = arg[j]
            if c in _PY_TARGET_OPTIONS:
                return True, no_bootstrap
            if c in _PY_NO_TARGET_OPTIONS:
                return True, no_bootstrap
            if c in _PY_NO_BOOTSTRAP:
                no_bootstrap.append(_PY_NO_BOOTSTRAP[c])
            if c in _PY_VALUE_OPTIONS:
                if j + 1 == len(arg):
                    i += 1  # the value is the next argument
                break
            j += 1
        i += 1
    return False, no_bootstrap


def interpreter_options() -> List[str]:
    """The options this interpreter was started with, before ``-m dmlshim``."""
    orig = getattr(sys, "orig_argv", None)  # Python >= 3.10: exactly what was typed
    if orig is not None:
        head = orig[1:len(orig) - (len(sys.argv) - 1)]
        if head[-1:] and head[-1] in ("-mdmlshim", "-mdmlshim.__main__"):
            return head[:-1]
        if head[-2:-1] == ["-m"]:
            return head[:-2]
    import subprocess

    return subprocess._args_from_interpreter_flags()  # type: ignore[attr-defined]


def _disabled(raw_flag: Optional[str], environ: Mapping[str, str]) -> bool:
    """DMLSHIM_DISABLE (or --disable), the one option read when it is on."""
    opt = config.OPTIONS_BY_NAME["disable"]
    raw = raw_flag if raw_flag is not None else environ.get(opt.env, "")
    if raw == "":
        return False
    try:
        return opt.parse(raw) == "1"
    except config.ConfigError as err:
        if raw_flag is not None:
            raise config.ConfigError(f"{opt.flag} ({opt.env})", raw, opt.valid) from err
        raise


def _validated(options: Dict[str, str], environ: Mapping[str, str]) -> config.Config:
    from dmlshim import launch

    parsed: Dict[str, str] = {}
    for name, raw in options.items():
        opt = config.OPTIONS_BY_NAME[name]
        try:
            parsed[name] = opt.parse(raw)
        except config.ConfigError as err:
            # name the flag the user typed, and the variable it stands for
            raise config.ConfigError(f"{opt.flag} ({opt.env})", raw, opt.valid) from err
    return launch.configure(parsed, source="cli", environ=environ)


def _directml_setup(cfg: config.Config) -> None:
    """For DirectML: fail now if it cannot be used; for ``auto``, say once (here, not in the
    script's process too: the probe cache tells it) that a present adapter is unusable.
    The environment is left as it is: on WSL the loader finds WSL's libraries through its
    cache, and torch_directml's folder on LD_LIBRARY_PATH would shadow them (see target.py)."""
    if not (cfg.device == "auto" or cfg.device.startswith("dml")):
        return
    from dmlshim import target

    if cfg.device.startswith("dml"):
        target.resolve(cfg.device)  # raises TargetError
    else:
        target.announce_unusable()


def _replace_with(argv: List[str], env: Dict[str, str]) -> int:
    sys.stdout.flush()
    sys.stderr.flush()
    if os.name == "nt" or os.environ.get(AS_CHILD_ENV) == "1":
        return _run_as_child(argv, env)
    try:
        os.execve(sys.executable, argv, env)
    except OSError as err:
        print(f"dmlshim: cannot start {sys.executable}: {err}", file=sys.stderr)
        return 127
    raise AssertionError("unreachable")  # pragma: no cover


def _run_as_child(argv: List[str], env: Dict[str, str]) -> int:
    """Windows: run the interpreter as a child and end as it ends.

    Ctrl-C goes to every process of the console (or the process group): the child gets it and
    decides; this process only waits. A child killed by a signal kills this process with the
    same signal (POSIX, where this path runs when forced for tests).
    """
    import signal
    import subprocess

    def ignore(signum, frame):  # a handler, not SIG_IGN: exec resets it, so the child gets Ctrl-C
        pass

    forwarded = [s for s in (getattr(signal, "SIGTERM", None), getattr(signal, "SIGHUP", None))
                 if s is not None and os.name != "nt"]
    saved = {signal.SIGINT: signal.signal(signal.SIGINT, ignore)}
    proc = subprocess.Popen(argv, executable=sys.executable, env=env)

    def forward(signum, frame):
        proc.send_signal(signum)

    for sig in forwarded:
        saved[sig] = signal.signal(sig, forward)
    try:
        code = proc.wait()
    finally:
        for sig, handler in saved.items():
            signal.signal(sig, handler)
    if os.name == "nt":
        return windows_exit_status(code)
    if code < 0:
        sys.stdout.flush()
        sys.stderr.flush()
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    return code


def main(argv: Optional[List[str]] = None) -> int:
    from dmlshim import launch

    argv = sys.argv[1:] if argv is None else argv
    # what a shimmed parent exported counts (the bootstrap took it out of os.environ)
    effective = launch.environment()
    try:
        raw_options, python_args, actions = parse_args(argv)
        if actions["help"]:
            print(USAGE + "\n" + config.help_text())
            return 0
        if actions["version"]:
            from dmlshim._version import __version__

            print(f"dmlshim {__version__}")
            return 0
        disabled = _disabled(raw_options.get("disable"), effective)
        prefix = interpreter_options()
        has_target, no_bootstrap = scan_python_args(prefix + python_args)
        if not has_target and not actions["doctor"]:
            raise UsageError("no script given")
        command = [sys.executable, *prefix, *python_args]
        if disabled and not actions["doctor"]:
            return _replace_with(command, dict(os.environ))  # plain python, nothing validated
        cfg = _validated(raw_options, effective)
    except config.ConfigError as err:
        print(str(err), file=sys.stderr)
        return 2
    except UsageError as err:
        print(f"dmlshim: {err}\n{USAGE}", file=sys.stderr)
        return 2
    if actions["doctor"]:
        from dmlshim import doctor as doctor_mod

        return doctor_mod.main(cfg)
    if no_bootstrap:
        print(f"dmlshim: python's {'/'.join(no_bootstrap)} keeps the interpreter from reading "
              f"PYTHONPATH or running sitecustomize, which the runner needs; drop it, or put "
              f"`import dmlshim` at the top of the script instead", file=sys.stderr)
        return 2
    from dmlshim.childenv import ChildEnvironment
    from dmlshim.target import PROBE_CACHE_ENV, TargetError

    before = dict(os.environ)
    try:
        _directml_setup(cfg)
    except TargetError as err:
        print(str(err), file=sys.stderr)
        return 2
    # the options given here, and those a shimmed parent exported to this process
    values: Dict[str, Optional[str]] = {
        k: v for k, v in effective.items()
        if k.startswith(config.ENV_PREFIX) and before.get(k) != v}
    values.update({config.OPTIONS_BY_NAME[name].env: cfg.values[name] for name in raw_options})
    if os.environ.get(PROBE_CACHE_ENV) != before.get(PROBE_CACHE_ENV):
        values[PROBE_CACHE_ENV] = os.environ[PROBE_CACHE_ENV]  # the child need not probe again
    values[AS_CHILD_ENV] = None  # test-only switch: not the script's business
    return _replace_with(command, ChildEnvironment(values).build(before))
