"""Which device CUDA work goes to, and the safe DirectML probe behind ``DMLSHIM_DEVICE=auto``.

torch_directml 0.2.5 on plain Linux (no WSL ``/dev/dxg``) fails to import (``libd3d12.so``
missing) and, with its own folder's stub libraries on ``LD_LIBRARY_PATH``, raises ``RuntimeError:
Unknown error`` or segfaults on device calls. So the probe checks cheaply first (``/dev/dxg`` on
Linux, the package there), then asks a *subprocess* with the script's own environment to
enumerate adapters, and caches the answer for the process and, through an environment variable,
for its children. Nothing here ever puts the wheel's folder on ``LD_LIBRARY_PATH``: on WSL the
loader finds the real libraries in ``/usr/lib/wsl/lib`` through its cache, and the folder's stubs
would shadow them.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import platform
import struct
import subprocess
import sys
from dataclasses import asdict, dataclass, field, replace
from typing import List, Optional

from dmlshim import config

log = logging.getLogger("dmlshim")

PROBE_CACHE_ENV = "DMLSHIM_PROBE_CACHE"  # internal: JSON of a finished probe, for children
PROBE_TIMEOUT_S = 60.0


class TargetError(RuntimeError):
    """The requested target cannot be used (shown as one line, exit status 2, by the runner)."""


@dataclass(frozen=True)
class DirectMLProbe:
    usable: bool
    reason: str
    count: int = 0
    names: List[str] = field(default_factory=list)
    float64: List[bool] = field(default_factory=list)
    version: Optional[str] = None
    # a DirectML driver is there (Windows, or WSL2's /dev/dxg): a failed probe is a problem
    present: bool = False
    announced: bool = False  # the "present but unusable" line was printed in this process tree


@dataclass(frozen=True)
class Target:
    """Where CUDA work goes.

    kind: ``dml`` (torch-directml), ``emulated-dml`` (dmlshim's emulator), ``cpu`` or ``cuda``
    (real CUDA; ``inert`` when ``auto`` found CUDA and the shim does nothing). Plain data: what
    the target can do is its :mod:`dmlshim.capabilities` object's answer.
    """

    kind: str
    count: int  # adapters the script sees as CUDA devices (cpu: 1)
    reason: str
    index: int = 0  # the adapter `cuda` (no index) means at start
    inert: bool = False
    names: List[str] = field(default_factory=list)
    # dml: torch_directml.has_float64_support(i) and a float64 op worked, per adapter, as
    # probed; what a target can do is dmlshim.capabilities' answer (Capabilities.has_float64)
    float64: List[bool] = field(default_factory=list)

    def device_name(self, index: int) -> str:
        if index < len(self.names):
            return self.names[index]
        if self.kind == "cpu":
            return _cpu_name()
        return f"{self.kind} adapter {index}"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as fh:
            for line in fh:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip() + " (CPU)"
    except OSError:
        pass
    import platform

    return (platform.processor() or platform.machine() or "CPU") + " (CPU)"


# -- DirectML ---------------------------------------------------------------------------------

# Where WSL2's GPU driver shows itself; without it Linux has no DirectML adapter. Tests point
# DMLSHIM_DXG_PATH at a missing path to arrange "no adapter" on any machine.
DXG_PATH = "/dev/dxg"
DXG_PATH_ENV = config.INTERNAL_BY_NAME["dxg_path"].env
WSL_LIB_DIR = "/usr/lib/wsl/lib"


def dxg_path() -> str:
    return os.environ.get(DXG_PATH_ENV) or DXG_PATH


def directml_package_dir() -> Optional[str]:
    spec = importlib.util.find_spec("torch_directml")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def directml_install_hint() -> str:
    """How to get torch-directml into this environment, for this interpreter and machine.

    dmlshim is not on the package index (``pip install "dmlshim[directml]"`` finds nothing): its
    ``directml`` extra is installed from a checkout. The extra's marker skips torch-directml
    where it has no wheel (64-bit CPython 3.8-3.11, Windows x64 and Linux x86-64 only), so
    there the extra installs nothing and the remedy is another interpreter: the hint says so."""
    checkout = 'from the dmlshim checkout, pip install -e ".[directml]"'
    bits = struct.calcsize("P") * 8
    if (platform.python_implementation() != "CPython" or sys.version_info >= (3, 12)
            or bits != 64 or platform.machine().lower() not in ("amd64", "x86_64")
            or not (sys.platform == "win32" or sys.platform.startswith("linux"))):
        here = (f"{platform.python_implementation()} {platform.python_version()} ({bits}-bit) "
                f"on {sys.platform} {platform.machine()}".rstrip())
        return (f"torch-directml has no wheel for {here}: make a virtual environment of 64-bit "
                f"CPython 3.9-3.11 on Windows x64 or Linux x86-64 and there, {checkout}")
    return (f"{checkout}, or pip install torch-directml==0.2.5.dev240914 into an environment "
            "with torch 2.4.1")


def directml_missing_reason() -> str:
    """The probe's reason when torch_directml cannot be found, with what to do about it."""
    return f"torch_directml is not installed ({directml_install_hint()})"


def _driver_present() -> bool:
    """Whether this machine has a DirectML driver (Windows, or WSL2's ``/dev/dxg``)."""
    return sys.platform == "win32" or (sys.platform.startswith("linux")
                                       and os.path.exists(dxg_path()))


def cheap_directml_check() -> Optional[str]:
    """Reason DirectML cannot work here, found without importing anything; None if it might."""
    if sys.platform.startswith("linux") and not os.path.exists(dxg_path()):
        return f"no {dxg_path()}: DirectML on Linux needs WSL2's GPU driver"
    if sys.platform != "win32" and not sys.platform.startswith("linux"):
        return f"torch_directml does not support {sys.platform}"
    if directml_package_dir() is None:
        return directml_missing_reason()
    return None


# The wheel's device_name(i) ends with a NUL character: the names are kept without it.
# has_float64_support(i) says True on adapters where every float64 op raises (the software
# D3D12 adapter): float64 counts only once a float64 op gave the right answer there, checked
# after the adapter line is out (a crash then leaves float64 unconfirmed, i.e. False).
_PROBE_CODE = r"""
import json, sys
import torch_directml as d
n = d.device_count()
claimed = [bool(d.has_float64_support(i)) for i in range(n)]
out = {"count": n, "names": [d.device_name(i).rstrip("\0") for i in range(n)],
       "float64": claimed, "version": getattr(d, "__version__", None)}
print("DMLSHIM_PROBE " + json.dumps(out), flush=True)
import torch
def works(i):
    try:
        x = torch.arange(6, dtype=torch.float64, device=d.device(i))
        return (x * 0.5 + 1).sum().item() == 13.5
    except Exception:
        return False
print("DMLSHIM_PROBE float64 " + json.dumps([c and works(i) for i, c in enumerate(claimed)]))
"""


def _probe_env() -> dict:
    # The script's own environment (LD_LIBRARY_PATH included, untouched): the probe must see
    # the libraries the script will see. On WSL the loader finds libd3d12.so/libdxcore.so in
    # /usr/lib/wsl/lib through its cache; the wheel's folder holds empty stubs of them.
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    env["DMLSHIM_DISABLE"] = "1"
    return env


def probe_directml(force: bool = False) -> DirectMLProbe:
    """Whether torch_directml has a usable adapter; never crashes this process.

    The answer is kept in the process's environment (:data:`PROBE_CACHE_ENV`): the one cache,
    for this process and for its children alike."""
    cached = os.environ.get(PROBE_CACHE_ENV)
    if cached and not force:
        try:
            return DirectMLProbe(**json.loads(cached))
        except (TypeError, ValueError):
            pass
    reason = cheap_directml_check()
    if reason is not None and not force:
        probe = DirectMLProbe(False, reason)
    else:
        probe = _probe_in_subprocess()
    _cache(probe)
    return probe


def _cache(probe: DirectMLProbe) -> None:
    os.environ[PROBE_CACHE_ENV] = json.dumps(asdict(probe))


def _probe_in_subprocess() -> DirectMLProbe:
    present = _driver_present()
    if directml_package_dir() is None:
        return DirectMLProbe(False, directml_missing_reason())
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE_CODE], capture_output=True, text=True,
            timeout=PROBE_TIMEOUT_S, env=_probe_env(), stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return DirectMLProbe(False, f"torch_directml probe hung for {PROBE_TIMEOUT_S:.0f} s",
                             present=present)
    except OSError as err:
        return DirectMLProbe(False, f"torch_directml probe could not start: {err}",
                             present=present)
    lines = proc.stdout.splitlines()
    checked = [json.loads(line.split(" ", 2)[2]) for line in lines
               if line.startswith("DMLSHIM_PROBE float64 ")]
    for line in lines:
        if line.startswith("DMLSHIM_PROBE {"):
            data = json.loads(line[len("DMLSHIM_PROBE "):])
            data["float64"] = checked[0] if checked else [False] * len(data["float64"])
            if data["count"] < 1:
                return DirectMLProbe(False, "torch_directml found no adapter",
                                     version=data["version"], present=present)
            return DirectMLProbe(True, "torch_directml adapter found", data["count"], data["names"],
                                 data["float64"], data["version"], present=present)
    if proc.returncode < 0:
        why = f"crashed with signal {-proc.returncode}"
    else:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"failed: {last}"
    return DirectMLProbe(False, f"torch_directml probe {why}", present=present)


def _what_to_check() -> str:
    """The likely cause of a failing probe where a DirectML driver is present."""
    if sys.platform == "win32":
        return ("check that the GPU driver supports DirectX 12 and that torch-directml matches "
                "the installed torch (python -m dmlshim --doctor)")
    pkg = directml_package_dir()
    entries = [e for e in os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep) if e]
    if pkg and any(os.path.realpath(e) == os.path.realpath(pkg) for e in entries):
        return (f"LD_LIBRARY_PATH holds torch_directml's folder {pkg}, whose libd3d12.so and "
                f"libdxcore.so are empty stubs that shadow WSL's real ones in {WSL_LIB_DIR}: "
                "remove it from LD_LIBRARY_PATH")
    return (f"is LD_LIBRARY_PATH pointing at torch_directml's folder? WSL's libraries are in "
            f"{WSL_LIB_DIR} (`ldconfig -p | grep d3d12` should list them)")


def unusable_message(probe: DirectMLProbe) -> str:
    """The one line for a DirectML driver that is present while the probe failed."""
    where = "Windows" if sys.platform == "win32" else dxg_path()
    return (f"dmlshim: DirectML is present ({where}) but unusable: {probe.reason}; "
            f"{_what_to_check()}")


def announce_unusable() -> None:
    """Print :func:`unusable_message` once per process tree (the probe cache carries that it
    was said, so children and the runner's script stay quiet)."""
    probe = probe_directml()
    if probe.usable or not probe.present or probe.announced:
        return
    print(unusable_message(probe) + "; training on the CPU", file=sys.stderr)
    _cache(replace(probe, announced=True))


def import_torch_directml():
    """Import torch_directml in this process (only after a successful probe)."""
    try:
        import torch_directml  # noqa: PLC0415
    except (ImportError, OSError, RuntimeError) as err:
        raise TargetError(f"dmlshim: importing torch_directml failed although its probe found "
                          f"an adapter: {type(err).__name__}: {err}; {_what_to_check()}")
    return torch_directml


# -- resolution -----------------------------------------------------------------------------

def _cuda_really_available() -> bool:
    import torch

    # The original, even when dmlshim already patched torch.cuda.is_available.
    from dmlshim.patching import get_original

    return bool(get_original(torch.cuda, "is_available")())


def resolve(device_option: str, announce: bool = True) -> Target:
    """Turn ``DMLSHIM_DEVICE`` into a Target (raises TargetError when it cannot be used).

    ``auto`` where a DirectML driver is present but the probe failed prints one line on
    stderr saying so (``announce=False``: the doctor, which reports it its own way)."""
    opt = device_option
    if opt == "cpu":
        return Target("cpu", 1, "DMLSHIM_DEVICE=cpu", names=[_cpu_name()])
    if opt == "cuda":
        if not _cuda_really_available():
            raise TargetError("dmlshim: DMLSHIM_DEVICE=cuda but torch sees no CUDA device; "
                              "use DMLSHIM_DEVICE=auto or cpu")
        import torch

        n = torch.cuda.device_count()
        return Target("cuda", n, "DMLSHIM_DEVICE=cuda")
    if opt.startswith("emulated-dml"):
        count = int(opt.split(":", 1)[1]) if ":" in opt else 1
        return Target("emulated-dml", count, f"DMLSHIM_DEVICE={opt}",
                      names=[f"dmlshim emulated DirectML adapter {i}" for i in range(count)])
    if opt.startswith("dml"):
        probe = probe_directml()
        if not probe.usable and probe.present:
            raise TargetError(f"{unusable_message(probe)} (DMLSHIM_DEVICE={opt}; "
                              f"DMLSHIM_DEVICE=cpu trains on the CPU)")
        if not probe.usable:
            raise TargetError(f"dmlshim: DMLSHIM_DEVICE={opt} but no DirectML adapter is usable: "
                              f"{probe.reason}; use DMLSHIM_DEVICE=auto or cpu")
        index = int(opt.split(":", 1)[1]) if ":" in opt else 0
        if index >= probe.count:
            raise TargetError(f"dmlshim: DMLSHIM_DEVICE={opt} but only {probe.count} DirectML "
                              f"adapter(s) exist (0..{probe.count - 1})")
        return Target("dml", probe.count, f"DMLSHIM_DEVICE={opt}", index=index,
                      names=probe.names, float64=probe.float64)
    # auto
    probe = probe_directml()
    if probe.usable:
        return Target("dml", probe.count, "auto: " + probe.reason, names=probe.names,
                      float64=probe.float64)
    if announce:
        announce_unusable()
    if _cuda_really_available():
        import torch

        return Target("cuda", torch.cuda.device_count(),
                      "auto: real CUDA is present; dmlshim stays inert", inert=True)
    return Target("cpu", 1, f"auto: no DirectML ({probe.reason}) and no CUDA; training on the CPU",
                  names=[_cpu_name()])
