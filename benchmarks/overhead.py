"""Train-step overhead: the same CUDA-style script, native vs through `python -m dmlshim`.

CPU machine: native runs take the script's CPU branch; shimmed runs take its CUDA branch and
dmlshim sends the work to the CPU (DMLSHIM_DEVICE=cpu). GPU machine: native CUDA vs
DMLSHIM_DEVICE=cuda (every patch installed, CUDA kept). Runs alternate native, shim, ...;
each run reports steps/s of its timed loop. Ratio = shim time / native time (1.00 = no cost).

    python benchmarks/overhead.py --model mlp --runs 7 --shim-device cpu
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import WORKLOADS, alternate, clean_env, emit, header, median, run_value  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", default="mlp", choices=["mlp", "cnn", "resnet50"])
    p.add_argument("--runs", type=int, default=7)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--warmup", type=int, default=30)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--threads", type=int, default=0)
    p.add_argument("--shim-device", default="cpu")
    p.add_argument("--out", default=None)
    a = p.parse_args()
    script = os.path.join(WORKLOADS, "train_step.py")
    args = ["--model", a.model, "--steps", str(a.steps), "--warmup", str(a.warmup),
            "--batch", str(a.batch), "--threads", str(a.threads)]

    def native() -> float:
        return run_value([sys.executable, script, *args], "steps_per_s", clean_env())

    def shim() -> float:
        return run_value([sys.executable, "-m", "dmlshim", script, *args], "steps_per_s",
                         clean_env(DMLSHIM_DEVICE=a.shim_device))

    nat, sh = alternate(a.runs, native, shim)
    row = dict(header(), bench="train_step", model=a.model, batch=a.batch, steps=a.steps,
               shim_device=a.shim_device, runs=a.runs,
               native_steps_per_s=round(median(nat), 2), shim_steps_per_s=round(median(sh), 2),
               ratio=round(median(nat) / median(sh), 4),
               native_all=[round(v, 2) for v in nat], shim_all=[round(v, 2) for v in sh])
    emit(row, a.out)


if __name__ == "__main__":
    main()
