"""README's example CUDA script (examples/train_cnn.py) on the Windows wheel under wine: the
DirectML adapter against dmlshim's CPU target, on the same Windows python.

Runs ``python.exe -m dmlshim examples/train_cnn.py`` with default options (the adapter) and with
``DMLSHIM_DEVICE=cpu`` alternately (the order swaps every round), and records the wall time of
each epoch as the script prints it (epoch 0 includes compiling DirectML's shaders; epoch 1 is
the steady state: its 16 training steps of 64 images and the validation of 512, as steps per
second below) and of the whole process (importing torch, the adapter's probe, DataLoader
spawn workers, the checkpoint; and the small Windows parent that reads its exit status).
It runs inside the Windows lane's wine set-up, on the python the lane's tests get, started the
way they start it (tests/windows/wine.py); for the adapter to be a real one, give the lane a
real D3D12 library (``DMLSHIM_WINDOWS_D3D12``; the lane's probe says whether it runs under
that wine):

    DMLSHIM_WINDOWS_D3D12=/opt/vkd3d-proton/x64 \\
        .ci/windows-lane --exec python3 benchmarks/windows_training.py --runs 3
"""

from __future__ import annotations

import argparse
import os
import re
import sys
import tempfile
import time
from typing import Dict, List

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, alternate, median  # noqa: E402

sys.path.insert(0, REPO)
from tests.windows.wine import WindowsPython  # noqa: E402

EPOCH = re.compile(r"^epoch (\d+): .*\(wall ([0-9.]+) s\)")
STEPS_PER_EPOCH = 1024 // 64  # examples/train_cnn.py's defaults: 1024 images, batches of 64


def run(win: WindowsPython, device: str, cwd: str, results: Dict[str, List[float]]) -> float:
    args = ["-m", "dmlshim", win.path(os.path.join(REPO, "examples", "train_cnn.py"))]
    env = win.env(DMLSHIM_DEVICE=device or None, VKD3D_DEBUG="none")
    start = time.perf_counter()
    proc = win.run(args, env, cwd, timeout=1800)
    total = time.perf_counter() - start
    epochs = {int(m.group(1)): float(m.group(2))
              for m in map(EPOCH.match, proc.stdout.splitlines()) if m}
    if proc.returncode != 0 or sorted(epochs) != [0, 1]:
        raise RuntimeError(f"{' '.join(proc.args)} failed ({proc.returncode}):\n"
                           f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
    results["epoch0"].append(epochs[0])
    results["epoch1"].append(epochs[1])
    results["process"].append(total)
    return total


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if "DMLSHIM_WINDOWS_PYTHON" not in os.environ:
        sys.exit("windows_training.py: run it through .ci/windows-lane --exec (see its docstring)")
    if not os.environ.get("DMLSHIM_WINDOWS_D3D12"):
        sys.exit("windows_training.py: needs the lane's DMLSHIM_WINDOWS_D3D12 (wine's own d3d12 "
                 "cannot run DirectML's training kernels)")
    win = WindowsPython(os.environ["DMLSHIM_WINDOWS_PYTHON"], real_d3d12=True)
    # vkd3d-proton keeps its pipeline cache in the working folder: one for the whole invocation
    # (the first adapter run compiles DirectML's shaders, the others find them)
    cwd = tempfile.mkdtemp(prefix="dmlshim-windows-training-")
    on_dml: Dict[str, List[float]] = {"epoch0": [], "epoch1": [], "process": []}
    on_cpu: Dict[str, List[float]] = {"epoch0": [], "epoch1": [], "process": []}
    alternate(args.runs, lambda: run(win, "", cwd, on_dml), lambda: run(win, "cpu", cwd, on_cpu))
    print(f"runs: {args.runs} each, alternating; seconds, median (all values)")
    for key in ("epoch0", "epoch1", "process"):
        d, c = median(on_dml[key]), median(on_cpu[key])
        print(f"{key:8s} adapter {d:7.1f} {[round(v, 1) for v in on_dml[key]]}  "
              f"cpu {c:7.1f} {[round(v, 1) for v in on_cpu[key]]}  adapter/cpu {d / c:.2f}")
    d, c = STEPS_PER_EPOCH / median(on_dml["epoch1"]), STEPS_PER_EPOCH / median(on_cpu["epoch1"])
    print(f"steps/s  adapter {d:7.2f}  cpu {c:7.2f}  adapter/cpu {d / c:.2f} (epoch 1, its "
          "validation included)")


if __name__ == "__main__":
    main()
