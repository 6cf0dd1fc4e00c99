"""README's example CUDA script (examples/train_cnn.py) on the Windows wheel under wine: the
DirectML adapter against dmlshim's CPU target, on the same Windows python.

Runs ``python.exe -m dmlshim examples/train_cnn.py`` with default options (the adapter) and with
``DMLSHIM_DEVICE=cpu`` alternately (the order swaps every round), and records the wall time of
each epoch as the script prints it (epoch 0 includes compiling DirectML's shaders; epoch 1 is
the steady state) and of the whole process (importing torch, the adapter's probe, DataLoader
spawn workers, the checkpoint). The python folder is the one .ci/windows-lane makes for a real
D3D12 library (``DMLSHIM_WINDOWS_D3D12``: vkd3d-proton's d3d12.dll beside
emulated_dml/windows/d3d12.c's); run it where the lane runs (wine 9 or newer), with the lane's
prefix. It starts an Xvfb display of its own when DISPLAY is not set.

    python benchmarks/windows_training.py --runs 3 \\
        --windows-python ~/.cache/dmlshim-windows/python-3.11.9-d3d12/python.exe \\
        --wineprefix ~/.cache/dmlshim-windows/wineprefix
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, alternate, median  # noqa: E402

EPOCH = re.compile(r"^epoch (\d+): .*\(wall ([0-9.]+) s\)")


def windows_path(path: str) -> str:
    return "Z:" + os.path.abspath(path).replace("/", "\\")


def run(wine: str, python: str, env: Dict[str, str], cwd: str,
        results: Dict[str, List[float]]) -> float:
    cmd = [wine, python, "-m", "dmlshim", windows_path(os.path.join(REPO, "examples",
                                                                     "train_cnn.py"))]
    start = time.perf_counter()
    # stdin a pipe: CPython under wine dies on a file as stdio
    proc = subprocess.run(cmd, input="", capture_output=True, text=True, env=env, cwd=cwd,
                          timeout=1800)
    total = time.perf_counter() - start
    epochs = {int(m.group(1)): float(m.group(2))
              for m in map(EPOCH.match, proc.stdout.splitlines()) if m}
    if proc.returncode != 0 or sorted(epochs) != [0, 1]:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    results["epoch0"].append(epochs[0])
    results["epoch1"].append(epochs[1])
    results["process"].append(total)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--windows-python", required=True)
    parser.add_argument("--wineprefix", required=True)
    args = parser.parse_args()

    base = {k: v for k, v in os.environ.items()
            if k in ("HOME", "USER", "PATH", "LANG", "TMPDIR", "DISPLAY", "XAUTHORITY")}
    base.update(WINEPREFIX=args.wineprefix, WINEARCH="win64", WINEDEBUG="-all",
                WINE_D3D_CONFIG="renderer=vulkan", VKD3D_DEBUG="none",
                WINEDLLOVERRIDES="mscoree,mshtml=;winedbg.exe=d;d3d12,d3d12core=n",
                PYTHONPATH=windows_path(REPO))
    xvfb = None
    if "DISPLAY" not in base:
        base["DISPLAY"] = ":" + str(150 + os.getpid() % 50)
        xvfb = subprocess.Popen(["Xvfb", base["DISPLAY"], "-screen", "0", "1024x768x24",
                                 "-nolisten", "tcp"], stdin=subprocess.DEVNULL,
                                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                start_new_session=True)
        time.sleep(2)
    wine = os.environ.get("WINE") or shutil.which("wine64") or shutil.which("wine") or "wine"
    detached = dict(stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                    stderr=subprocess.DEVNULL, start_new_session=True, env=base)
    # as .ci/windows-lane does: wine's server and desktop started apart from the runs' pipes
    # (a process under wine inherits its caller's descriptors; the desktop outlives its user)
    subprocess.Popen([shutil.which("wineserver") or wine + "server", "-p"], **detached)
    subprocess.run([wine, "wineboot"], timeout=300, **detached)
    desktop = subprocess.Popen([wine, args.windows_python, "-I", "-S", "-c",
                                "import ctypes, time; ctypes.windll.user32.GetDesktopWindow();"
                                " time.sleep(86400)"], **detached)
    time.sleep(5)
    # vkd3d-proton keeps its pipeline cache in the working folder: one for the whole invocation
    # (the first adapter run compiles DirectML's shaders, the others find them)
    cwd = tempfile.mkdtemp(prefix="dmlshim-windows-training-")
    on_dml: Dict[str, List[float]] = {"epoch0": [], "epoch1": [], "process": []}
    on_cpu: Dict[str, List[float]] = {"epoch0": [], "epoch1": [], "process": []}
    try:
        alternate(args.runs, lambda: run(wine, args.windows_python, base, cwd, on_dml),
                  lambda: run(wine, args.windows_python, dict(base, DMLSHIM_DEVICE="cpu"), cwd,
                              on_cpu))
    finally:
        desktop.terminate()
        subprocess.run([shutil.which("wineserver") or wine + "server", "-k"], env=base,
                       check=False)
        if xvfb is not None:
            xvfb.terminate()
    print(f"runs: {args.runs} each, alternating; seconds, median (all values)")
    for key in ("epoch0", "epoch1", "process"):
        d, c = median(on_dml[key]), median(on_cpu[key])
        print(f"{key:8s} adapter {d:7.1f} {[round(v, 1) for v in on_dml[key]]}  "
              f"cpu {c:7.1f} {[round(v, 1) for v in on_cpu[key]]}  adapter/cpu {d / c:.2f}")


if __name__ == "__main__":
    main()
