"""Conversion cost of `model.cpu()` / `model.to(device)` with DMLSHIM_OPTIMIZER=rebind vs
without the rebind, for a ResNet-50 and a GPT-2-small with Adam state.

Both sides convert with Parameter replacement (what DirectML does): on a GPU machine the
baseline is plain torch (no dmlshim) with the overwrite flag, the shim side
`DMLSHIM_DEVICE=cuda` + rebind; on a CPU machine both run on the emulator
(`DMLSHIM_DEVICE=emulated-dml`), `DMLSHIM_OPTIMIZER=off` vs `rebind`. Reports the median time
per bounce, the device-memory peak during the bounces, and whether the optimizer is still
live afterwards (the baseline's is not: that is the stall rebind fixes).

    python benchmarks/conversion.py --model resnet50 --runs 5 [--gpu]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import WORKLOADS, clean_env, emit, header, median  # noqa: E402


def measure(cmd, env):
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=900)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr[-3000:])
    vals = dict(line.split(" ", 1) for line in proc.stdout.splitlines() if " " in line)
    return {k: float(vals[k]) for k in ("seconds_per_bounce", "peak_mib", "base_mib", "live")}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="resnet50", choices=["resnet50", "gpt2"])
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--bounces", type=int, default=3)
    p.add_argument("--gpu", action="store_true", help="native CUDA baseline vs DMLSHIM_DEVICE=cuda")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    script = os.path.join(WORKLOADS, "convert.py")
    args = [script, "--model", a.model, "--bounces", str(a.bounces), "--overwrite"]
    if a.gpu:
        base_cmd, base_env = [sys.executable, *args], clean_env()
        shim_env = clean_env(DMLSHIM_DEVICE="cuda", DMLSHIM_OPTIMIZER="rebind")
    else:
        base_cmd = [sys.executable, "-m", "dmlshim", *args]
        base_env = clean_env(DMLSHIM_DEVICE="emulated-dml", DMLSHIM_OPTIMIZER="off")
        shim_env = clean_env(DMLSHIM_DEVICE="emulated-dml", DMLSHIM_OPTIMIZER="rebind")
    shim_cmd = [sys.executable, "-m", "dmlshim", *args]
    # The correct native way: Parameters keep their identity (no overwrite flag) and the script
    # moves the optimizer state itself; the same bytes move as under rebind.
    correct_args = [a_ for a_ in args if a_ != "--overwrite"] + ["--move-state"]
    if a.gpu:
        correct_cmd, correct_env = [sys.executable, *correct_args], clean_env()
    else:  # CPU machine: the emulator replaces Parameters anyway, so only base vs rebind
        correct_cmd, correct_env = None, None
    results = {"base": [], "shim": [], "correct": []}
    for i in range(a.runs):
        order = ["base", "shim", "correct"] if i % 2 == 0 else ["correct", "shim", "base"]
        for side in order:
            if side == "base":
                results["base"].append(measure(base_cmd, base_env))
            elif side == "shim":
                results["shim"].append(measure(shim_cmd, shim_env))
            elif correct_cmd is not None:
                results["correct"].append(measure(correct_cmd, correct_env))

    def med(side, key):
        return median([r[key] for r in results[side]])

    emit(dict(header(), bench="conversion", model=a.model, gpu=a.gpu, runs=a.runs,
              bounces=a.bounces,
              base_s=round(med("base", "seconds_per_bounce"), 4),
              rebind_s=round(med("shim", "seconds_per_bounce"), 4),
              time_ratio=round(med("shim", "seconds_per_bounce") / med("base", "seconds_per_bounce"), 3),
              base_peak_mib=round(med("base", "peak_mib"), 1),
              rebind_peak_mib=round(med("shim", "peak_mib"), 1),
              mem_ratio=round(med("shim", "peak_mib") / max(med("base", "peak_mib"), 1e-9), 3),
              base_live=med("base", "live"), rebind_live=med("shim", "live"),
              **({} if not results["correct"] else dict(
                  correct_s=round(med("correct", "seconds_per_bounce"), 4),
                  time_ratio_vs_correct=round(med("shim", "seconds_per_bounce")
                                              / med("correct", "seconds_per_bounce"), 3),
                  correct_peak_mib=round(med("correct", "peak_mib"), 1),
                  mem_ratio_vs_correct=round(med("shim", "peak_mib")
                                             / max(med("correct", "peak_mib"), 1e-9), 3),
                  correct_live=med("correct", "live")))), a.out)


if __name__ == "__main__":
    main()
