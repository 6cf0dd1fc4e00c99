"""Which device CUDA work goes to, and the safe DirectML probe behind ``DMLSHIM_DEVICE=auto``.

torch_directml 0.2.5 on plain Linux (no WSL ``/dev/dxg``) raises ``RuntimeError: Unknown error``
or segfaults inside ``dml::HardwareAdapter::Enumerate()``. So the probe checks cheaply first
(is the package there, is this Windows or WSL), then asks a *subprocess* to enumerate adapters,
and caches the answer for the process and, through an environment variable, for its children.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import subprocess
import sys
from dataclasses import asdict, dataclass, field
from typing import List, Optional

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


@dataclass(frozen=True)
class Target:
    """Where CUDA work goes.

    kind: ``dml`` (torch-directml), ``emulated-dml`` (dmlshim's emulator), ``cpu`` or ``cuda``
    (real CUDA; ``inert`` when ``auto`` found CUDA and the shim does nothing).
    """

    kind: str
    count: int  # adapters the script sees as CUDA devices (cpu: 1)
    reason: str
    index: int = 0  # the adapter `cuda` (no index) means at start
    inert: bool = False
    names: List[str] = field(default_factory=list)
    # dml: torch_directml.has_float64_support(i) per adapter, as probed; what a target can do
    # is dmlshim.capabilities' answer (Capabilities.has_float64)
    float64: List[bool] = field(default_factory=list)

    @property
    def device_type(self) -> str:
        return {"dml": "privateuseone", "emulated-dml": "privateuseone"}.get(self.kind, self.kind)

    @property
    def is_directml(self) -> bool:
        """Real or emulated DirectML: the targets where Parameters get replaced on conversion."""
        return self.kind in ("dml", "emulated-dml")

    @property
    def redirects(self) -> bool:
        """True when CUDA devices are rewritten to something else."""
        return self.kind != "cuda"

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

_probe: Optional[DirectMLProbe] = None


def directml_package_dir() -> Optional[str]:
    spec = importlib.util.find_spec("torch_directml")
    if spec is None or not spec.submodule_search_locations:
        return None
    return list(spec.submodule_search_locations)[0]


def cheap_directml_check() -> Optional[str]:
    """Reason DirectML cannot work here, found without importing anything; None if it might."""
    if directml_package_dir() is None:
        return "torch_directml is not installed (pip install dmlshim[directml])"
    if sys.platform == "win32":
        return None
    if sys.platform.startswith("linux"):
        if not os.path.exists("/dev/dxg"):
            return "no /dev/dxg: DirectML on Linux needs WSL2's GPU driver"
        return None
    return f"torch_directml does not support {sys.platform}"


_PROBE_CODE = r"""
import json, sys
import torch_directml as d
n = d.device_count()
out = {"count": n, "names": [d.device_name(i) for i in range(n)],
       "float64": [bool(d.has_float64_support(i)) for i in range(n)],
       "version": getattr(d, "__version__", None)}
print("DMLSHIM_PROBE " + json.dumps(out))
"""


def _probe_env() -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    env["DMLSHIM_DISABLE"] = "1"
    pkg = directml_package_dir()
    if pkg and sys.platform.startswith("linux"):
        env["LD_LIBRARY_PATH"] = os.pathsep.join(p for p in (pkg, env.get("LD_LIBRARY_PATH")) if p)
    return env


def probe_directml(force: bool = False) -> DirectMLProbe:
    """Whether torch_directml has a usable adapter; never crashes this process. Cached."""
    global _probe
    if _probe is not None and not force:
        return _probe
    cached = os.environ.get(PROBE_CACHE_ENV)
    if cached and not force:
        try:
            _probe = DirectMLProbe(**json.loads(cached))
            return _probe
        except (TypeError, ValueError):
            pass
    reason = cheap_directml_check()
    if reason is not None and not force:
        _probe = DirectMLProbe(False, reason)
    else:
        _probe = _probe_in_subprocess()
    os.environ[PROBE_CACHE_ENV] = json.dumps(asdict(_probe))
    return _probe


def _probe_in_subprocess() -> DirectMLProbe:
    if directml_package_dir() is None:
        return DirectMLProbe(False, "torch_directml is not installed (pip install dmlshim[directml])")
    try:
        proc = subprocess.run(
            [sys.executable, "-c", _PROBE_CODE], capture_output=True, text=True,
            timeout=PROBE_TIMEOUT_S, env=_probe_env(), stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired:
        return DirectMLProbe(False, f"torch_directml probe hung for {PROBE_TIMEOUT_S:.0f} s")
    except OSError as err:
        return DirectMLProbe(False, f"torch_directml probe could not start: {err}")
    for line in proc.stdout.splitlines():
        if line.startswith("DMLSHIM_PROBE "):
            data = json.loads(line[len("DMLSHIM_PROBE "):])
            if data["count"] < 1:
                return DirectMLProbe(False, "torch_directml found no adapter", version=data["version"])
            return DirectMLProbe(True, "torch_directml adapter found", data["count"], data["names"],
                                 data["float64"], data["version"])
    if proc.returncode < 0:
        why = f"crashed with signal {-proc.returncode}"
    else:
        last = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        why = f"failed: {last}"
    return DirectMLProbe(False, f"torch_directml probe {why}")


def directml_library_path_missing() -> Optional[str]:
    """On Linux, the folder LD_LIBRARY_PATH must hold for torch_directml to import, if absent.

    The wheel's native module needs libd3d12.so, which has no SONAME, so preloading it by path
    does not satisfy the loader: only LD_LIBRARY_PATH, read at process start, does.
    """
    pkg = directml_package_dir()
    if not pkg or not sys.platform.startswith("linux"):
        return None
    entries = os.environ.get("LD_LIBRARY_PATH", "").split(os.pathsep)
    return None if any(os.path.realpath(e) == os.path.realpath(pkg) for e in entries if e) else pkg


def import_torch_directml():
    """Import torch_directml in this process (only after a successful probe)."""
    missing = directml_library_path_missing()
    if missing is not None:
        raise TargetError(
            f"dmlshim: torch_directml needs its folder on LD_LIBRARY_PATH on Linux; run "
            f"LD_LIBRARY_PATH={missing}:$LD_LIBRARY_PATH python -m dmlshim ... (the runner "
            f"does this by itself)")
    import torch_directml  # noqa: PLC0415

    return torch_directml


# -- resolution -----------------------------------------------------------------------------

def _cuda_really_available() -> bool:
    import torch

    # The original, even when dmlshim already patched torch.cuda.is_available.
    from dmlshim.patching import get_original

    return bool(get_original(torch.cuda, "is_available")())


def resolve(device_option: str) -> Target:
    """Turn ``DMLSHIM_DEVICE`` into a Target (raises TargetError when it cannot be used)."""
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
    if _cuda_really_available():
        import torch

        return Target("cuda", torch.cuda.device_count(),
                      "auto: real CUDA is present; dmlshim stays inert", inert=True)
    return Target("cpu", 1, f"auto: no DirectML ({probe.reason}) and no CUDA; training on the CPU",
                  names=[_cpu_name()])
