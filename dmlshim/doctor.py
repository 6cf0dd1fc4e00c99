"""``python -m dmlshim --doctor``: can this machine run CUDA scripts through dmlshim, and how?

Prints the system (OS, Python, torch, torch-directml and its adapters), the target ``auto``
would pick and why, float64 support, every option with its value and where it came from, and
then tries the setup: installs the shim for the requested device, runs a few tensor ops on
``cuda``, and uninstalls, in this process with its environment as it is (torch_directml's
folder is never put on ``LD_LIBRARY_PATH``: on WSL its stub libraries would shadow the real
ones). A DirectML driver that is present (WSL's ``/dev/dxg``, Windows) while the probe fails
is a problem, even though ``auto`` then trains on the CPU. Exit status 0 when the setup can
run, 1 (with the reason on the last line) when it cannot.

Where an adapter has a native PyTorch backend (Radeon RX 7000/9000: ROCm on Windows; Intel Arc:
XPU), one ``info:`` line says so; the facts are fixed text, nothing is looked up.

torch_directml is never imported here unless the subprocess probe
(:func:`dmlshim.target.probe_directml`) found a usable adapter: on plain Linux the import
crashes the process.
"""

from __future__ import annotations

import os
import platform
import re
import sys
from typing import List, Optional, Sequence, Tuple

from dmlshim import config as cfgmod
from dmlshim import target as targetmod

OK, FAILED = 0, 1


class _Out:
    def __init__(self) -> None:
        self.problems: List[str] = []
        self.notes: List[str] = []
        self.infos: List[str] = []

    @staticmethod
    def section(title: str) -> None:
        print(title)

    @staticmethod
    def row(label: str, value: str) -> None:
        print(f"  {label + ':':<17}{value}")


def _torch_info() -> Tuple[str, str]:
    import torch

    cuda_build = torch.version.cuda or getattr(torch.version, "hip", None)
    return str(torch.__version__), (f"built with CUDA {cuda_build}" if cuda_build
                                     else "CPU build (no CUDA)")


def _directml_distribution() -> Tuple[Optional[str], Optional[str]]:
    """(installed torch-directml version, the torch version it pins) from package metadata."""
    try:
        from importlib.metadata import PackageNotFoundError, requires, version
    except ImportError:  # pragma: no cover
        return None, None
    try:
        ver = version("torch-directml")
    except PackageNotFoundError:
        return None, None
    pin = None
    for req in requires("torch-directml") or []:
        name = req.split(";")[0].strip()
        if name.replace(" ", "").startswith("torch==") and "vision" not in name:
            pin = name.split("==", 1)[1].strip()
    return ver, pin


def _base_version(v: str) -> str:
    return v.split("+", 1)[0]


def _wsl() -> bool:
    return sys.platform.startswith("linux") and ("microsoft" in platform.release().lower()
                                                 or os.path.exists(targetmod.dxg_path()))


def _capabilities(tgt: targetmod.Target, cfg: cfgmod.Config):
    from dmlshim import capabilities  # imports torch: only once torch's version is shown

    return capabilities.of(tgt, cfg)


def _float64_line(tgt: targetmod.Target, cfg: cfgmod.Config, out: _Out) -> str:
    caps = _capabilities(tgt, cfg)
    missing = [i for i in range(tgt.count) if not caps.has_float64(i)]
    if missing and cfg.float64 == "keep":
        out.notes.append(f"adapter(s) {missing} lack float64: scripts that use double "
                         "tensors fail there (DMLSHIM_FLOAT64=keep); DMLSHIM_FLOAT64=auto "
                         "or float32 downcasts them")
    elif missing:
        out.notes.append(f"adapter(s) {missing} lack float64: double tensors are made "
                         f"float32 as they enter them (DMLSHIM_FLOAT64={cfg.float64}; "
                         "DMLSHIM_FLOAT64=float32 does the same, keep lets them fail)")
    return caps.float64_summary()


def _describe(tgt: targetmod.Target) -> str:
    names = ", ".join(tgt.names) if tgt.names else f"{tgt.count} device(s)"
    return f"{tgt.kind} ({names})"


_RADEON_RE = re.compile(r"\bRadeon\b.*\bRX\s*[79]\d{3}", re.I)
_ARC_RE = re.compile(r"\bIntel\b.*\bArc\b", re.I)


def native_backend_note(adapter_names: Sequence[str]) -> Optional[str]:
    """One line naming the native PyTorch backend for an adapter that has one (else None)."""
    for name in adapter_names:
        if _RADEON_RE.search(name):
            return (f"adapter {name!r} is a Radeon RX 7000/9000-series GPU: PyTorch on Windows "
                    "with ROCm (AMD's preview builds, ROCm 6.4.4 and later) runs CUDA scripts "
                    "natively there (torch.cuda is the GPU; dmlshim then stays inert)")
        if _ARC_RE.search(name):
            return (f"adapter {name!r} is an Intel Arc GPU: PyTorch's upstream XPU build runs "
                    "on it natively (device 'xpu', torch.xpu), which Intel recommends over "
                    "DirectML")
    return None


def _smoke_test(cfg: cfgmod.Config) -> Optional[str]:
    """Install the shim, run a few ops on ``cuda``, uninstall; the error text, or None."""
    from dmlshim import api

    quiet = cfgmod.Config({**cfg.values, "log": "warning", "report": ""}, dict(cfg.sources))
    try:
        api.install(_config=quiet)
        import torch

        x = torch.arange(6, dtype=torch.float32, device="cuda").reshape(2, 3)
        w = torch.ones(3, 2, device="cuda")
        got = (x @ w).sum().cpu().item()
        if got != 30.0:
            return f"a 2x3 @ 3x2 matmul on {x.device} gave {got}, expected 30.0"
        if not torch.cuda.is_available():
            return "torch.cuda.is_available() is False for the script under the shim"
        return None
    except Exception as err:  # report, do not crash: this is the diagnosis
        return f"{type(err).__name__}: {err}"
    finally:
        api.uninstall()


def main(cfg: cfgmod.Config) -> int:
    from dmlshim._version import __version__

    out = _Out()
    print(f"dmlshim {__version__} doctor")

    out.section("system")
    out.row("OS", f"{platform.platform()} ({platform.machine()})"
            + ("; WSL GPU driver (/dev/dxg) present" if _wsl() else ""))
    out.row("Python", f"{platform.python_version()} ({sys.executable})")
    torch_version, torch_build = _torch_info()
    out.row("torch", f"{torch_version}, {torch_build}")
    dml_version, dml_pin = _directml_distribution()
    if dml_version is None:
        out.row("torch_directml", "not installed (pip install \"dmlshim[directml]\")")
    else:
        text = dml_version + (f", requires torch=={dml_pin}" if dml_pin else "")
        out.row("torch_directml", text)
        if dml_pin and _base_version(torch_version) != _base_version(dml_pin):
            out.notes.append(f"torch-directml {dml_version} was built for torch {dml_pin} but "
                             f"torch {torch_version} is installed; install torch=={dml_pin}")

    out.section("DirectML")
    cheap = targetmod.cheap_directml_check()
    probe = targetmod.probe_directml()
    how = "checked without importing" if cheap is not None else "probed in a subprocess"
    out.row("usable", ("yes" if probe.usable else "no") + f" ({probe.reason}; {how})")
    if probe.usable:
        for i, name in enumerate(probe.names):
            f64 = probe.float64[i] if i < len(probe.float64) else False
            out.row(f"adapter {i}", f"{name} (float64: {'yes' if f64 else 'no'})")
        native = native_backend_note(probe.names)
        if native is not None:
            out.infos.append(native)
    else:
        out.row("adapters", "none")
        if probe.present:
            out.problems.append(targetmod.unusable_message(probe).replace("dmlshim: ", "", 1)
                                + "; auto trains on the CPU meanwhile")

    out.section("target")
    try:
        auto = targetmod.resolve("auto", announce=False)
        out.row("auto picks", f"{_describe(auto)}: {auto.reason}")
    except targetmod.TargetError as err:  # pragma: no cover - auto always resolves
        out.row("auto picks", f"nothing: {err}")
    tgt: Optional[targetmod.Target] = None
    try:
        tgt = targetmod.resolve(cfg.device, announce=False)
        if cfg.device != "auto":
            out.row("DMLSHIM_DEVICE", f"{cfg.device} -> {_describe(tgt)}")
        out.row("float64", _float64_line(tgt, cfg, out))
    except targetmod.TargetError as err:
        out.row("DMLSHIM_DEVICE", f"{cfg.device} -> cannot be used")
        out.problems.append(str(err).replace("dmlshim: ", "", 1))
    problem = _capabilities(tgt, cfg).load_problem() if tgt is not None else None
    if problem is not None:
        out.problems.append(f"DMLSHIM_DEVICE={cfg.device} but {problem}")

    if cfg.disabled:
        out.notes.append("DMLSHIM_DISABLE=1: dmlshim does nothing; CUDA scripts run unchanged")
    elif tgt is not None and not out.problems:
        if tgt.inert:
            out.notes.append("real CUDA is present: dmlshim stays inert and scripts use it")
        else:
            error = _smoke_test(cfg)
            out.row("tensor ops", "ok" if error is None else "FAILED")
            if error is not None:
                out.problems.append(f"tensor ops on 'cuda' failed under the shim: {error}")

    out.section("options (value, where it came from)")
    for opt in cfgmod.OPTIONS:
        value = cfg.values[opt.name]
        source = cfg.sources.get(opt.name, "default")
        where = {"env": opt.env, "cli": opt.flag, "install()": "install()"}.get(source, "default")
        print(f"  {opt.name + ' ':<14}{(value if value != '' else '-'):<16}{where}")

    for info in out.infos:
        print(f"info: {info}")
    for note in out.notes:
        print(f"note: {note}")
    if out.problems:
        for problem in out.problems:
            print(f"problem: {problem}")
        print("result: this setup cannot run CUDA scripts through dmlshim (see problem above)")
        return FAILED
    if cfg.disabled or tgt is None:
        print("result: ok (dmlshim disabled)")
    elif tgt.inert:
        print("result: ok: scripts use the real CUDA device; dmlshim stays inert")
    else:
        print(f"result: ok: CUDA scripts will run on {_describe(tgt)}")
    return OK
