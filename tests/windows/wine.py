"""The Windows CPython of the Windows lane (.ci/windows-lane), started under wine from Linux.

:class:`WindowsPython` has the members of :class:`tests.helpers.Python`, so the tests that
compare ``python X`` with ``python -m dmlshim X`` run on it unchanged: paths as Windows names
them (``Z:\\`` is the Linux root), ``;`` between ``PYTHONPATH`` entries, and exit statuses as
Windows' ``subprocess`` reports them (unsigned 32 bits: a Windows parent, status.py, reads them;
a Linux parent would see the low 8 bits only).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Dict, Mapping, Optional, Sequence

from tests.helpers import REPO, PathLike, Python

STATUS = Path(__file__).with_name("status.py")
STATUS_CONTROL_C_EXIT = 0xC000013A
STATUS_ACCESS_VIOLATION = 0xC0000005

# What wine itself needs from the host environment; everything else stays out of the Windows
# process, as on a Windows machine (host PYTHON*, PIP_*, LD_* variables would leak in). The host's
# Vulkan loader settings (VK_ICD_FILENAMES, VK_DRIVER_FILES: which driver winevulkan, and so the
# real D3D12 library, runs on) are wine's too.
_HOST_KEEP = ("HOME", "USER", "LOGNAME", "PATH", "DISPLAY", "XAUTHORITY", "XDG_RUNTIME_DIR",
              "LANG", "TMPDIR")
# Microsoft's C++ runtime (msvc-runtime's DLLs beside python.exe), as a Windows machine loads it:
# wine 8 loads its own builtin copies unless told otherwise, and with those a DirectML script
# crashed 3 runs in 5 (page faults, winedbg) where Microsoft's ran 4 of 4 clean: a crash this
# lane shows must be one a Windows user would meet
MSVC_RUNTIME = ("msvcp140", "vcruntime140", "vcruntime140_1", "concrt140", "vcomp140")


def wine_binary() -> str:
    return os.environ.get("WINE") or shutil.which("wine64") or "/usr/lib/wine/wine64"


class WindowsPython(Python):
    pathsep = ";"

    def __init__(self, exe: PathLike, real_d3d12: bool = False) -> None:
        """``real_d3d12``: ``exe``'s folder holds a real D3D12 library (.ci/windows-lane's
        ``DMLSHIM_WINDOWS_D3D12`` folder), whose d3d12.dll and d3d12core.dll wine then loads
        (it prefers its builtin ones to DLLs beside the program)."""
        self.exe = Path(exe).resolve()
        self.native_dlls = ("d3d12", "d3d12core") if real_d3d12 else ()
        if not self.exe.is_file():
            raise FileNotFoundError(f"{exe}: no such file (.ci/windows-lane --setup-only "
                                    "builds it)")

    def path(self, path: PathLike) -> str:
        return "Z:" + os.path.abspath(str(path)).replace("/", "\\")

    def env(self, **extra: Optional[str]) -> Dict[str, str]:
        """The lane's wine settings, the checkout first on ``PYTHONPATH`` (as
        :func:`tests.helpers.clean_env` does), then ``extra`` (``None`` removes)."""
        env = {k: v for k, v in os.environ.items()
               if k in _HOST_KEEP or k.startswith(("WINE", "LC_", "VK_"))}
        # a crash must end the process, not start winedbg (which waits for ever)
        overrides = [env.get("WINEDLLOVERRIDES", "")]
        if "winedbg" not in overrides[0]:
            overrides.append("winedbg.exe=d")
        overrides.append(",".join(self.native_dlls + MSVC_RUNTIME) + "=n")
        env["WINEDLLOVERRIDES"] = ";".join(filter(None, overrides))
        env["PYTHONPATH"] = self.path(REPO)
        for key, value in extra.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def run(self, args: Sequence[str], env: Mapping[str, str], cwd: PathLike,
            input: Optional[str] = None,
            timeout: float = 600) -> subprocess.CompletedProcess[str]:
        with tempfile.TemporaryDirectory(prefix="dmlshim-win-") as tmp:
            status_file = Path(tmp) / "status"
            # -I -S: the Windows parent ignores PYTHONPATH and site; the command gets env as is.
            # stdin is a pipe even when empty: CPython under wine dies on a file as stdio.
            cmd = [wine_binary(), str(self.exe), "-I", "-S", self.path(STATUS),
                   self.path(status_file), "--", self.path(self.exe), *args]
            proc = subprocess.run(cmd, input=input or "", capture_output=True, text=True,
                                  encoding="utf-8", errors="replace", env=dict(env),
                                  cwd=str(cwd), timeout=timeout, check=False)
            # wine's own notes ("wine: Unhandled page fault ... thread 0718") name thread ids
            # that differ from run to run; they are wine's, not the Windows process's output
            proc.stderr = "".join(line for line in proc.stderr.splitlines(keepends=True)
                                  if not line.startswith("wine: "))
            if not status_file.is_file():
                raise RuntimeError(f"the Windows parent wrote no exit status (wine exited "
                                   f"{proc.returncode}): {proc.stderr[-2000:]}")
            proc.returncode = int(status_file.read_text())
            proc.args = [self.path(self.exe), *args]
        return proc
