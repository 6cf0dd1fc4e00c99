"""``python -m dmlshim --doctor``: can this machine run CUDA scripts through dmlshim, and how?

Prints the system (OS, Python, torch, torch-directml and its adapters), the target ``auto``
would pick and why, float64 support, every option with its value and where it came from, and
then tries the setup: one training step on ``cuda`` under the shim, against the CPU, in a
child process with its environment as it is (:mod:`dmlshim.doctor_step`; torch_directml's
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
from dmlshim import doctor_step
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


def _float64_line(tgt: targetmod.Target, cfg: cfgmod.Config, out: _Out,
                  step: Optional[doctor_step.StepResult] = None) -> str:
    """The float64 row: what the target says, and what a float64 op on ``cuda`` did in the
    step's process (``step``), where it ran."""
    caps = _capabilities(tgt, cfg)
    missing = [i for i in range(tgt.count) if not caps.has_float64(i)]
    summary = caps.float64_summary()
    checked = step.float64 if step is not None else ""
    if checked and not missing and checked != "float64":
        # torch_directml.has_float64_support() says yes on adapters where float64 ops raise
        out.problems.append(f"float64: the target says {summary}, but a float64 op on "
                            f"{step.device or 'cuda'} gave {checked}; scripts that use double "
                            "tensors fail there: make them float32 (x.float()) and report "
                            "this output to dmlshim")
        return f"no ({checked}; the target said {summary})"
    if missing and cfg.float64 == "keep":
        out.notes.append(f"adapter(s) {missing} lack float64: scripts that use double "
                         "tensors fail there (DMLSHIM_FLOAT64=keep); DMLSHIM_FLOAT64=auto "
                         "or float32 downcasts them")
    elif missing:
        out.notes.append(f"adapter(s) {missing} lack float64: double tensors are made "
                         f"float32 as they enter them (DMLSHIM_FLOAT64={cfg.float64}; "
                         "DMLSHIM_FLOAT64=float32 does the same, keep lets them fail)")
    if checked == "float64":
        return f"{summary}; a float64 op ran on {step.device}"
    if checked == "float32":
        return f"{summary}; a float64 tensor made on cuda became float32"
    return summary + (f"; a float64 op on cuda gave {checked}" if checked else "")


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


_SWITCHES = (("dmlshim/kernels/guards/", "guards"), ("dmlshim/patches/guard", "guards"),
             ("dmlshim/kernels/decompositions/", "decompose"), ("dmlshim/patches/amp", "amp"))


def _step_row(step: doctor_step.StepResult) -> str:
    if step.ok:
        return (f"ok on {step.device}: conv2d, batch_norm (training mode), cross_entropy, "
                f"backward, AdamW match the CPU within {doctor_step.RTOL:g} "
                f"(largest difference {step.largest:.1g})")
    if step.error:
        return f"FAILED: {step.failed}: {step.error}"
    first = step.mismatches[0]
    return f"FAILED: differs from the CPU: {first.text()}"


def _step_problem(step: doctor_step.StepResult, tgt: targetmod.Target,
                  cfg: cfgmod.Config) -> str:
    """The problem line of a failed step: what failed, and what to do."""
    where = f"on {step.device}" if step.device else f"on {_describe(tgt)}"
    if step.error:
        what = f"the training step failed {where} in {step.failed}: {step.error}"
        if step.shim_site:
            what += f" (in {step.shim_site})"
    else:
        others = ", ".join(m.what for m in step.mismatches[1:4])
        more = len(step.mismatches) - 4
        what = (f"the training step {where} differs from the CPU's (pointing at "
                f"{step.failed}): {step.mismatches[0].text()}"
                + (f"; also {others}" if others else "") + (f" and {more} more" if more > 0
                                                            else ""))
    # Which dmlshim option is at fault: the one owning the frame that raised, else those that
    # make the step right when flipped (guards and decompositions; tried only on a failure).
    # An exception raised outside dmlshim's frames is the wheel's or the adapter's.
    culprit = next((opt for prefix, opt in _SWITCHES if step.shim_site.startswith(prefix)), "")
    flips = [(culprit, "off")] if culprit else [] if step.error and not step.crashed else [
        (o, "off" if cfg.values[o] == "on" else "on") for o in ("guards", "decompose")]
    for n in range(1, len(flips) + 1):
        values = {**cfg.values, **dict(flips[:n])}
        if doctor_step.run(cfgmod.Config(values)).ok:
            flags = " ".join(f"DMLSHIM_{o.upper()}={v}" for o, v in flips[:n])
            return (f"{what}; with {flags} the step trains right: run scripts with {flags}"
                    + (" and report this output to dmlshim (a dmlshim kernel is at fault)"
                       if "=off" in flags else ""))
    caps = _capabilities(tgt, cfg)
    if caps.emulated:
        return (f"{what}; the emulated adapter reproduces a torch-directml bug that the options "
                f"in force do not work around (DMLSHIM_EMULATOR_GAPS={cfg.emulator_gaps})")
    if not caps.directml:
        return f"{what}; this is a dmlshim or torch bug: report this output to dmlshim"
    return (f"{what}; this adapter's DirectML does not train right: update the GPU driver "
            "(and torch-directml), or train on the CPU meanwhile (DMLSHIM_DEVICE=cpu)")


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
        out.row("torch_directml", f"not installed ({targetmod.directml_install_hint()})")
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
    except targetmod.TargetError as err:
        out.row("DMLSHIM_DEVICE", f"{cfg.device} -> cannot be used")
        out.problems.append(str(err).replace("dmlshim: ", "", 1))
    problem = _capabilities(tgt, cfg).load_problem() if tgt is not None else None
    if problem is not None:
        out.problems.append(f"DMLSHIM_DEVICE={cfg.device} but {problem}")
    step = None
    if tgt is not None and not tgt.inert and not cfg.disabled and not out.problems:
        step = doctor_step.run(cfg)  # a training step on cuda, in a child process
    if tgt is not None:
        out.row("float64", _float64_line(tgt, cfg, out, step))

    if cfg.disabled:
        out.notes.append("DMLSHIM_DISABLE=1: dmlshim does nothing; CUDA scripts run unchanged")
    elif tgt is not None and tgt.inert:
        out.notes.append("real CUDA is present: dmlshim stays inert and scripts use it")
    elif step is not None:
        out.row("training step", _step_row(step))
        if not step.ok:
            out.problems.insert(0, _step_problem(step, tgt, cfg))

    out.section("options (value, where it came from)")
    # each option by its flag's name (--emulator-gaps: emulator-gaps), in aligned columns
    rows = []
    for opt in cfgmod.OPTIONS:
        value = cfg.values[opt.name]
        source = cfg.sources.get(opt.name, "default")
        where = {"env": opt.env, "cli": opt.flag, "install()": "install()"}.get(source, "default")
        rows.append((opt.flag[2:], value if value != "" else "-", where))
    name_width = max(len(row[0]) for row in rows) + 2
    value_width = max(16, max(len(row[1]) for row in rows) + 2)
    for name, value, where in rows:
        print(f"  {name:<{name_width}}{value:<{value_width}}{where}")

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
