"""Harness shared by the test files: run corpus scripts natively and through dmlshim, and parse
what they print.

Corpus scripts (tests/corpus/) print their losses as ``loss <epoch> <step> <float.hex()>``, the
device they chose as ``device <str(device)>`` and, for cuda_api.py, sanity checks as
``check <name> <ok|FAIL>``. A native run is plain ``python script.py`` (no dmlshim at all); a
shimmed run is ``python -m dmlshim script.py`` (``via="runner"``) or a copy of the script with
``import dmlshim`` as its first statement (``via="import"``). Children never inherit the
``DMLSHIM_*`` variables of the test process (tests/conftest.py sets ``DMLSHIM_DISABLE=1``).
"""

from __future__ import annotations

import ast
import functools
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Dict, List, Mapping, Optional, Sequence, Tuple, Union

REPO = Path(__file__).resolve().parent.parent
CORPUS = REPO / "tests" / "corpus"
DEFAULT_TIMEOUT = 300.0
WSL_HARNESS = REPO / "emulated_dml" / "wsl.py"
# what dmlshim's no-gradient alarm prints (dmlshim/check/results.py): a run whose parameters all
# train natively must not print them
GRADIENT_ALARMS = ("received no gradient", "all-zero gradient")

PathLike = Union[str, os.PathLike]

_CODING_RE = re.compile(r"^[ \t\f]*#.*?coding[:=][ \t]*[-\w.]+")


def clean_env(**extra: Optional[str]) -> Dict[str, str]:
    """A copy of ``os.environ`` without any ``DMLSHIM_*`` variable, with the repo first on
    ``PYTHONPATH`` (so ``dmlshim`` imports from any cwd), then ``extra`` applied (``None``
    removes a variable). ``CUDA_VISIBLE_DEVICES`` is the suite's (``""``: no CUDA, see
    :func:`hide_cuda`); :func:`cuda_visible` gives a child the GPUs back."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("DMLSHIM_") and k != CUDA_SAVED}
    old = env.get("PYTHONPATH")
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + old if old else "")
    for key, value in extra.items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = value
    return env


# -- CUDA: hidden from the suite, given back to the tests marked cuda -------------------------
#
# The suite compares dmlshim's CPU and emulated targets with native runs of the same script,
# which choose "cuda" when torch.cuda.is_available(): on a machine with an NVIDIA GPU those would
# train on the GPU and every comparison would fail. So tests/conftest.py hides CUDA from the
# pytest process (before torch initialises CUDA, which reads the variable once) and, through
# os.environ, from every process a test starts; the tests marked cuda (tests/cuda/) give their
# children the GPUs back with cuda_visible().

# where the first pytest process keeps CUDA_VISIBLE_DEVICES as it was started with (JSON; xdist
# workers inherit it) and, once probed, whether torch sees CUDA there; not a dmlshim variable
CUDA_SAVED = "_DMLSHIM_TESTS_CUDA"


def hide_cuda() -> None:
    """``CUDA_VISIBLE_DEVICES=""`` for this process and its children, the value it had kept in
    :data:`CUDA_SAVED` (an xdist worker, started with both, keeps its parent's)."""
    if CUDA_SAVED not in os.environ:
        os.environ[CUDA_SAVED] = json.dumps({"visible": os.environ.get("CUDA_VISIBLE_DEVICES")})
    os.environ["CUDA_VISIBLE_DEVICES"] = ""


def restore_ctrl_c() -> None:
    """Ctrl-C for this process and its children as a terminal gives it. A suite started in the
    background of a non-interactive shell (``cmd &``, ``nohup``) inherits SIGINT ignored, which
    python keeps and every child inherits: the Ctrl-C tests would then compare two processes
    that cannot be interrupted (and time out). A handler here is SIG_DFL again in each child."""
    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def cuda_state() -> Dict[str, Any]:
    """``{"visible": CUDA_VISIBLE_DEVICES as pytest was started with (None: unset)}``, plus
    ``present`` and ``why`` once :func:`record_cuda_probe` ran."""
    raw = os.environ.get(CUDA_SAVED)
    return json.loads(raw) if raw else {"visible": os.environ.get("CUDA_VISIBLE_DEVICES")}


def cuda_visible(**extra: Optional[str]) -> Dict[str, Optional[str]]:
    """``env=`` for a child that sees the GPUs (``CUDA_VISIBLE_DEVICES`` as pytest was started
    with; None removes it again), plus ``extra``: for :func:`run_native`, :func:`run_shim`,
    :func:`clean_env`."""
    return {"CUDA_VISIBLE_DEVICES": cuda_state()["visible"], **extra}


# Linux device nodes of the drivers torch's CUDA can run on (NVIDIA; WSL's GPU paravirtualisation;
# ROCm, whose torch.cuda is HIP): without one, torch.cuda.is_available() is False, and asking a
# child process would only cost a torch import
_GPU_NODES = ("/dev/nvidiactl", "/dev/dxg", "/dev/kfd")
_CUDA_PROBE = ("import torch; print(int(torch.cuda.is_available()), torch.cuda.device_count(), "
               "torch.__version__, torch.version.cuda or torch.version.hip)")


def probe_cuda() -> Tuple[bool, str]:
    """(whether torch sees a CUDA device with the GPUs given back, a line saying why), asked
    of a child: this process must not initialise CUDA."""
    import torch

    version = torch.__version__
    if torch.version.cuda is None and getattr(torch.version, "hip", None) is None:
        return False, f"torch {version} is built without CUDA"
    if sys.platform.startswith("linux") and not any(map(os.path.exists, _GPU_NODES)):
        return False, f"no GPU driver here ({', '.join(_GPU_NODES)} absent)"
    visible = cuda_state()["visible"]
    shown = "unset" if visible is None else repr(visible)
    try:
        proc = subprocess.run([sys.executable, "-c", _CUDA_PROBE], capture_output=True, text=True,
                              env=clean_env(**cuda_visible()), cwd=neutral_cwd(), timeout=300,
                              check=False)
    except subprocess.TimeoutExpired:
        return False, f"asking torch {version} for CUDA devices took over 300 s"
    words = proc.stdout.split()
    if proc.returncode != 0 or len(words) != 4:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return False, f"asking torch {version} for CUDA devices failed: {last}"
    available, count, _, runtime = words
    if available != "1":
        return False, (f"torch {version} (CUDA {runtime}) sees no CUDA device "
                       f"(CUDA_VISIBLE_DEVICES {shown})")
    return True, f"torch {version} (CUDA {runtime}) sees {count} CUDA device(s)"


def record_cuda_probe() -> Dict[str, Any]:
    """:func:`cuda_state` with ``present`` and ``why``: probed once, by the first pytest process,
    whose xdist workers inherit the answer."""
    state = cuda_state()
    if "present" not in state:
        state["present"], state["why"] = probe_cuda()
        os.environ[CUDA_SAVED] = json.dumps(state)
    return state


class Python:
    """The interpreter tests start scripts with, as ``[python, *args]``: this one. The Windows
    lane (tests/windows/wine.py) starts the Windows CPython under wine through the same four
    members, so a test written against them runs on both."""

    pathsep = os.pathsep

    def path(self, path: PathLike) -> str:
        """``path`` (of this machine) as that interpreter names it."""
        return str(path)

    def env(self, **extra: Optional[str]) -> Dict[str, str]:
        """:func:`clean_env` for that interpreter."""
        return clean_env(**extra)

    def run(self, args: Sequence[str], env: Mapping[str, str], cwd: PathLike,
            input: Optional[str] = None,
            timeout: float = DEFAULT_TIMEOUT) -> subprocess.CompletedProcess[str]:
        """``python *args``; its exit status as that platform's ``subprocess`` reports it."""
        return subprocess.run([sys.executable, *args], input=input, capture_output=True,
                              text=True, env=dict(env), cwd=str(cwd), timeout=timeout,
                              check=False)


HOST = Python()


def script_path(script: PathLike) -> Path:
    """``script`` as a path: a bare name like ``"mlp.py"`` or ``"mlp"`` means tests/corpus/."""
    path = Path(script)
    if path.is_absolute():
        return path
    if path.suffix != ".py":
        path = path.with_suffix(".py")
    candidate = CORPUS / path
    if candidate.exists():
        return candidate
    return path.resolve()


def option_env(options: Optional[Mapping[str, Any]]) -> Dict[str, str]:
    """``{"optimizer": "reset", "emulator-gaps": "none"}`` -> ``{"DMLSHIM_OPTIMIZER": "reset",
    "DMLSHIM_EMULATOR_GAPS": "none"}``; booleans become ``"1"``/``"0"``."""
    env: Dict[str, str] = {}
    for name, value in (options or {}).items():
        key = "DMLSHIM_" + name.replace("-", "_").upper()
        if isinstance(value, bool):
            env[key] = "1" if value else "0"
        else:
            env[key] = str(value)
    return env


def with_import_line(source: str, line: str = "import dmlshim") -> str:
    """``source`` with ``line`` as its first statement.

    It goes on the very first line, except that a shebang or encoding line stays first and
    ``from __future__`` imports (which must come first) stay before it.
    """
    lines = source.splitlines(keepends=True)
    at = 0
    while at < len(lines) and at < 2 and (
        (at == 0 and lines[at].startswith("#!")) or _CODING_RE.match(lines[at])
    ):
        at += 1
    tree = ast.parse(source)
    for node in tree.body:
        if isinstance(node, ast.ImportFrom) and node.module == "__future__":
            at = max(at, node.end_lineno or node.lineno)
    return "".join(lines[:at]) + line + "\n" + "".join(lines[at:])


@functools.cache
def neutral_cwd() -> str:
    """An empty directory of our own: `python -m` puts the cwd first on sys.path, so a stray
    `enum.py` in a shared temp dir would shadow the standard library."""
    return tempfile.mkdtemp(prefix="dmlshim-cwd-")


def on_users_path(cmd: Sequence[str], adapters: int = 1, memory_mib: int = 0) -> List[str]:
    """``cmd`` run the way a user with DirectML adapters runs it: inside the WSL harness
    (``python emulated_dml/wsl.py``: ``/dev/dxg``, WSL's libraries in the loader cache, the
    stand-in ``torch_directml`` as the wheel), where ``auto`` finds the wheel and the adapter."""
    return [sys.executable, str(WSL_HARNESS), "--adapters", str(adapters),
            "--memory", str(memory_mib), "--", *map(str, cmd)]


# The real route of the real-wheel suite (the tests marked real_d3d12 and users_path), set by
# tests/conftest.py: the real D3D12 library (else None), and where the wheel runs on it. With
# ``pytest --real-d3d12 PATH`` the Linux wheel installed here, in the WSL harness over PATH
# (REAL_WINDOWS None); in the Windows lane with a real library (``--windows-python EXE
# --windows-d3d12``) the Windows DirectML.dll: every command of those tests then runs on that
# Windows python under wine (REAL_WINDOWS, tests/windows/wine.py), natively or shimmed, with
# the variables it was given (paths of this machine work there as they are: wine's current drive
# is Z:, the Linux root).
REAL_D3D12: Optional[str] = None
REAL_WINDOWS: Optional[Python] = None


def on_real_wheel(cmd: Sequence[str], adapters: int = 1) -> List[str]:
    """``cmd`` inside the WSL harness's real route: the torch-directml wheel installed in this
    interpreter's environment on the real D3D12 library of ``pytest --real-d3d12``
    (``adapters`` adapters, all its one device)."""
    if REAL_D3D12 is None:
        raise RuntimeError("on_real_wheel: run pytest with --real-d3d12 PATH")
    return [sys.executable, str(WSL_HARNESS), "--d3d12", REAL_D3D12, "--adapters",
            str(adapters), "--", *map(str, cmd)]


def gradient_alarms(stderr: str) -> List[str]:
    """The no-gradient alarm's lines in ``stderr``."""
    return [line for line in stderr.splitlines() if any(a in line for a in GRADIENT_ALARMS)]


def _on_windows(cmd: Sequence[str], env: Mapping[str, str], cwd: Optional[PathLike],
                timeout: float, input: Optional[str] = None) -> subprocess.CompletedProcess[str]:
    """``cmd`` (``[sys.executable, *args]``) on :data:`REAL_WINDOWS` with what ``env`` adds to
    (or removes from) :func:`clean_env`, as that python takes it."""
    assert REAL_WINDOWS is not None and cmd[0] == sys.executable, cmd
    base = clean_env()
    extra: Dict[str, Optional[str]] = {k: v for k, v in env.items()
                                       if base.get(k) != v and k != "PYTHONPATH"}
    extra.update({k: None for k in base if k not in env})
    added = env.get("PYTHONPATH", "").split(os.pathsep)[1:]  # after the checkout's entry
    windows_env = REAL_WINDOWS.env(**extra)
    if added:
        windows_env["PYTHONPATH"] = REAL_WINDOWS.pathsep.join(
            [windows_env["PYTHONPATH"], *map(REAL_WINDOWS.path, added)])
    return REAL_WINDOWS.run(list(cmd[1:]), windows_env, cwd or neutral_cwd(), input=input,
                            timeout=timeout)


def _run(cmd: Sequence[str], env: Mapping[str, str], cwd: Optional[PathLike],
         timeout: float, wsl: Union[int, str] = 0, **kw: Any) -> subprocess.CompletedProcess[str]:
    if REAL_WINDOWS is not None:  # the Windows lane's real route: natively there too
        return _on_windows(cmd, env, cwd, timeout, input=kw.pop("input", None))
    if isinstance(wsl, str):  # "real" or "real:N"
        cmd = on_real_wheel(cmd, int(wsl.partition(":")[2] or 1))
    elif wsl:
        cmd = on_users_path(cmd, adapters=int(wsl))
    cwd_s = str(cwd) if cwd is not None else neutral_cwd()
    if not wsl:
        return subprocess.run(list(cmd), env=dict(env), cwd=cwd_s, capture_output=True,
                              text=True, timeout=timeout, check=False, **kw)
    # in the WSL harness, a session of its own: on a timeout the whole tree goes (the harness's
    # unshare and the command under it would live on after the harness, holding a core)
    data = kw.pop("input", None)
    with subprocess.Popen(list(cmd), env=dict(env), cwd=cwd_s,
                          stdin=subprocess.PIPE if data is not None else None,
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          start_new_session=True, **kw) as proc:
        try:
            out, err = proc.communicate(data, timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.communicate()
            raise
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


# How far losses on the real adapter may lie from a native CPU run's after a few steps: another
# device's float32 (its own summation orders and fused kernels), not a skipped update.
REAL_REL = 2e-3


def users_lane(adapters: int = 1) -> Union[int, str]:
    """``wsl=`` for the users' path: the stand-in with ``adapters`` adapters, or, in the
    real-wheel lane, the real route with as many."""
    return f"real:{adapters}" if REAL_D3D12 is not None else adapters


@functools.cache
def users_adapter_name() -> str:
    """The name dmlshim reports for adapter 0 on the users' path (no trailing NUL)."""
    if REAL_D3D12 is None:
        return "Emulated DirectML Adapter 0 (emulated_dml)"
    proc = run_wsl([sys.executable, "-c",
                    "import torch_directml as d; print(repr(d.device_name(0)))"])
    assert proc.returncode == 0, describe(proc)
    return ast.literal_eval(proc.stdout.strip().splitlines()[-1]).rstrip("\0")


def run_wsl(cmd: Sequence[str], env: Optional[Mapping[str, str]] = None,
            wsl: Union[int, str] = "real", timeout: float = 900.0,
            cwd: Optional[PathLike] = None) -> subprocess.CompletedProcess[str]:
    """``cmd`` (no dmlshim unless it says so) in the WSL harness: ``wsl="real"`` the real-wheel
    lane's real route, N the stand-in with N adapters; ``env`` defaults to :func:`clean_env`."""
    return _run(cmd, clean_env() if env is None else env, cwd, timeout, wsl=wsl)


@functools.cache
def _run_native_cached(path: str, args: Tuple[str, ...],
                       env_items: Tuple[Tuple[str, Optional[str]], ...],
                       cwd: Optional[str], timeout: float) -> subprocess.CompletedProcess[str]:
    return _run([sys.executable, path, *args], clean_env(**dict(env_items)), cwd, timeout)


def run_native(script: PathLike, *args: str, env: Optional[Mapping[str, Optional[str]]] = None,
               cwd: Optional[PathLike] = None, timeout: float = DEFAULT_TIMEOUT,
               cached: bool = True) -> subprocess.CompletedProcess[str]:
    """``python script args`` with no dmlshim at all. Runs once per test session for each
    (script, args, env, cwd) unless ``cached=False``; treat the result as read-only."""
    path = str(script_path(script))
    str_args = tuple(str(a) for a in args)
    env_items = tuple(sorted((env or {}).items()))
    cwd_s = str(cwd) if cwd is not None else None
    if cached:
        return _run_native_cached(path, str_args, env_items, cwd_s, timeout)
    return _run([sys.executable, path, *str_args], clean_env(**dict(env_items)), cwd_s, timeout)


def run_shim(script: PathLike, *args: str, device: Optional[str] = "cpu", via: str = "runner",
             options: Optional[Mapping[str, Any]] = None,
             env: Optional[Mapping[str, Optional[str]]] = None,
             cwd: Optional[PathLike] = None, timeout: float = DEFAULT_TIMEOUT,
             wsl: Union[int, str] = 0, **kw: Any) -> subprocess.CompletedProcess[str]:
    """Run ``script`` under dmlshim.

    ``via="runner"``: ``python -m dmlshim script args``. ``via="import"``: a copy of the script,
    in a temporary directory, with ``import dmlshim`` as its first statement. Options travel in
    the environment: ``device`` -> ``DMLSHIM_DEVICE`` (``None``: leave unset, i.e. auto) and
    each ``options`` entry -> ``DMLSHIM_<NAME>``; ``env`` adds more variables (None removes one:
    :func:`cuda_visible`). Other keyword arguments go to :func:`subprocess.run`. ``wsl=N``:
    inside the WSL harness with N adapters
    (:func:`on_users_path`; with ``device=None`` that is the users' path); ``wsl="real"``: on
    the real wheel and D3D12 library of the real-wheel lane (:func:`on_real_wheel`;
    ``"real:N"``: N adapters).
    """
    path = script_path(script)
    str_args = [str(a) for a in args]
    extra: Dict[str, Optional[str]] = {}
    if device is not None:
        extra["DMLSHIM_DEVICE"] = device
    extra.update(option_env(options))
    extra.update(env or {})
    if via == "runner":
        return _run([sys.executable, "-m", "dmlshim", str(path), *str_args], clean_env(**extra),
                    cwd, timeout, wsl=wsl, **kw)
    if via == "import":
        with tempfile.TemporaryDirectory(prefix="dmlshim-import-") as tmp:
            copy = Path(tmp) / path.name
            copy.write_text(with_import_line(path.read_text(encoding="utf-8")), encoding="utf-8")
            # The original directory stays importable, as it would be for the script itself.
            env_ = clean_env(**extra)
            env_["PYTHONPATH"] = env_["PYTHONPATH"] + os.pathsep + str(path.parent)
            return _run([sys.executable, str(copy), *str_args], env_, cwd, timeout, wsl=wsl,
                        **kw)
    raise ValueError(f"via must be 'runner' or 'import', not {via!r}")


def losses(stdout: str) -> List[float]:
    """The floats of the ``loss <epoch> <step> <hex>`` lines, in order."""
    out: List[float] = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "loss":
            out.append(float.fromhex(parts[-1]))
    return out


def checks(stdout: str) -> Dict[str, str]:
    """``{name: "ok" | "FAIL"}`` from the ``check <name> <status>`` lines."""
    out: Dict[str, str] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 3 and parts[0] == "check":
            out[parts[1]] = parts[2]
    return out


def printed_device(stdout: str) -> Optional[str]:
    """What the script printed on its first ``device <str(device)>`` line, if any."""
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 2 and parts[0] == "device":
            return parts[1]
    return None


def describe(proc: subprocess.CompletedProcess[str], tail: int = 3000) -> str:
    """The command, exit status and the ends of stdout/stderr, for assertion messages."""
    cmd = proc.args if isinstance(proc.args, str) else " ".join(map(str, proc.args))
    return (f"\n$ {cmd}\nexit status {proc.returncode}\n"
            f"--- stdout (tail) ---\n{(proc.stdout or '')[-tail:]}\n"
            f"--- stderr (tail) ---\n{(proc.stderr or '')[-tail:]}")


def first_difference(got: Sequence[float], expected: Sequence[float]) -> str:
    """Where two loss lists first differ, for assertion messages."""
    for i, (a, b) in enumerate(zip(got, expected)):
        if a != b:
            return f"first difference at loss #{i}: got {a!r} ({a.hex()}), expected {b!r} ({b.hex()})"
    if len(got) != len(expected):
        return f"got {len(got)} losses, expected {len(expected)}"
    return "no difference"


def sitecustomize_logger(tmp_path: Path, log_path=str) -> Tuple[Path, Path]:
    """A user's ``sitecustomize`` in ``tmp_path/site`` that appends its process's ``sys.argv``
    to ``tmp_path/ran.txt`` (named in it by ``log_path``: a Windows path under wine), and
    ``tmp_path/script.py``, which prints ``script``: how many times it ran, and where. The
    script never imports ``sitecustomize`` itself: every line of the log is a run that Python's
    own start-up (:mod:`site`, or dmlshim's bootstrap chaining the one it shadows) made, so a
    process that skipped it leaves no line instead of one the script's import would write."""
    site = tmp_path / "site"
    site.mkdir()
    log = tmp_path / "ran.txt"
    (site / "sitecustomize.py").write_text(
        f"import sys\nwith open({log_path(log)!r}, 'a') as f:\n"
        "    f.write(repr(sys.argv) + '\\n')\n")
    (tmp_path / "script.py").write_text("print('script')\n")
    return site, log
