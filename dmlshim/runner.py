"""``python -m dmlshim [options] script.py|-m module [args...]``: run a script as python would.

The script runs as ``__main__`` in a fresh module object registered in ``sys.modules`` (so
classes defined in it pickle for DataLoader workers), with ``sys.argv`` and ``sys.path[0]`` as
``python script.py`` sets them, the same exit status, and tracebacks without runner frames.
The approach follows coverage.py's PyRunner.
"""

from __future__ import annotations

import os
import runpy
import sys
import types
from typing import Dict, List, Optional, Tuple

from dmlshim import config

USAGE = """usage: python -m dmlshim [options] script.py [args ...]
       python -m dmlshim [options] -m module [args ...]
       python -m dmlshim --doctor

Runs a CUDA PyTorch script unchanged on DirectML, or on the CPU where no adapter exists.
"""


class UsageError(Exception):
    pass


def parse_args(argv: List[str]) -> Tuple[Dict[str, str], Optional[str], Optional[str], List[str], bool]:
    """-> (options, script, module, script_args, doctor)."""
    options: Dict[str, str] = {}
    i = 0
    doctor = False
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            if i + 1 >= len(argv):
                raise UsageError("argument -m: expected a module name")
            return options, None, argv[i + 1], argv[i + 2:], doctor
        if arg in ("-h", "--help"):
            print(USAGE + "\n" + config.help_text())
            raise SystemExit(0)
        if arg == "--version":
            from dmlshim import __version__

            print(f"dmlshim {__version__}")
            raise SystemExit(0)
        if arg == "--doctor":
            doctor = True
            i += 1
            continue
        if arg == "--":
            i += 1
            break
        if arg.startswith("--"):
            flag, eq, value = arg.partition("=")
            opt = config.OPTIONS_BY_FLAG.get(flag)
            if opt is None:
                raise UsageError(f"unknown option {flag} (see python -m dmlshim --help)")
            if not eq:
                if i + 1 >= len(argv):
                    raise UsageError(f"option {flag} needs a value ({opt.valid})")
                value = argv[i + 1]
                i += 1
            try:
                options[opt.name] = opt.parse(value)
            except config.ConfigError as err:
                # name the flag the user typed, and the variable it stands for
                raise config.ConfigError(f"{flag} ({opt.env})", value, opt.valid) from err
            i += 1
            continue
        break
    if i >= len(argv):
        if doctor:
            return options, None, None, [], True
        raise UsageError("no script given")
    return options, argv[i], None, argv[i + 1:], doctor


def _strip_runner_frames(tb: Optional[types.TracebackType]) -> Optional[types.TracebackType]:
    here = os.path.dirname(os.path.abspath(__file__))
    runpy_file = os.path.abspath(runpy.__file__)
    while tb is not None:
        fname = os.path.abspath(tb.tb_frame.f_code.co_filename)
        if not (fname.startswith(here) or fname == runpy_file or fname.startswith("<frozen runpy")):
            break
        tb = tb.tb_next
    return tb


def _report_exception() -> int:
    etype, value, tb = sys.exc_info()
    assert etype is not None and value is not None
    value.__traceback__ = _strip_runner_frames(tb)
    sys.excepthook(etype, value, value.__traceback__)
    return 130 if issubclass(etype, KeyboardInterrupt) else 1


def run_path(script: str, args: List[str]) -> None:
    path = os.path.abspath(script)
    if os.path.isdir(path):
        main_py = os.path.join(path, "__main__.py")
        if not os.path.exists(main_py):
            print(f"{sys.executable}: can't find '__main__' module in {script!r}", file=sys.stderr)
            raise SystemExit(1)
        sys.argv = [script] + args
        sys.path[0] = path
        runpy.run_path(path, run_name="__main__")
        return
    try:
        with open(path, "rb") as fh:
            source = fh.read()
    except OSError as err:
        print(f"{sys.executable}: can't open file {path!r}: [Errno {err.errno}] {err.strerror}",
              file=sys.stderr)
        raise SystemExit(2)
    code = compile(source, path, "exec", dont_inherit=True)
    main = types.ModuleType("__main__")
    main.__file__ = path
    main.__builtins__ = sys.modules["builtins"]  # type: ignore[attr-defined]
    main.__loader__ = None  # type: ignore[assignment]
    main.__spec__ = None
    sys.modules["__main__"] = main
    sys.argv = [script] + args
    sys.path[0] = os.path.dirname(path)
    exec(code, main.__dict__)


def run_module(module: str, args: List[str]) -> None:
    sys.argv = [module] + args  # runpy replaces argv[0] with the module's file
    sys.path[0] = os.getcwd()
    try:
        runpy._run_module_as_main(module, alter_argv=True)  # type: ignore[attr-defined]
    except ImportError as err:
        if getattr(err, "name", None) == module or str(err).startswith("No module named"):
            print(f"{sys.executable}: {err}", file=sys.stderr)
            raise SystemExit(1)
        raise


def _reexec_for_directml(cfg: config.Config, argv: List[str]) -> None:
    """On Linux, restart with torch_directml's folder on LD_LIBRARY_PATH when DirectML will be
    used: the loader reads that variable only at process start (see target.py)."""
    if not (cfg.device == "auto" or cfg.device.startswith("dml")):
        return
    from dmlshim import target

    pkg = target.directml_library_path_missing()
    if pkg is None or not target.probe_directml().usable:  # the probe is cached for the child
        return
    env = dict(os.environ)
    env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (pkg, env.get("LD_LIBRARY_PATH")) if p)
    sys.stdout.flush()
    sys.stderr.flush()
    os.execve(sys.executable, [sys.executable, "-m", "dmlshim", *argv], env)


def main(argv: Optional[List[str]] = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        options, script, module, args, doctor = parse_args(argv)
    except config.ConfigError as err:
        print(str(err), file=sys.stderr)
        return 2
    except UsageError as err:
        print(f"dmlshim: {err}\n{USAGE}", file=sys.stderr)
        return 2
    try:
        cfg = config.load(options, source="cli")
    except config.ConfigError as err:
        print(str(err), file=sys.stderr)
        return 2
    if doctor:
        from dmlshim import doctor as doctor_mod

        return doctor_mod.main(cfg)
    if not cfg.disabled:
        from dmlshim import api
        from dmlshim.target import TargetError

        _reexec_for_directml(cfg, argv)

        # children (DataLoader workers, subprocesses) inherit the same options
        os.environ.update(cfg.as_env())
        try:
            api.install(_config=cfg)
        except TargetError as err:
            print(str(err), file=sys.stderr)
            return 2
    try:
        if module is not None:
            run_module(module, args)
        else:
            run_path(script, args)  # type: ignore[arg-type]
    except SystemExit as exc:
        code = exc.code
        if code is None:
            return 0
        if isinstance(code, int):
            return code
        print(code, file=sys.stderr)
        return 1
    except BaseException:
        return _report_exception()
    return 0
