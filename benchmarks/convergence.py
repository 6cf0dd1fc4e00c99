"""Convergence with each DMLSHIM_OPTIMIZER policy, against the native run and the published
workaround: the table of final losses after N epochs for SGD+momentum and Adam.

    python benchmarks/convergence.py [--device cpu|emulated-dml] [--epochs 10] [--steps 8]

Every row runs tests/corpus/stall/train.py -- a CUDA-style script whose optimizer (and StepLR
scheduler) is built *before* ``model.to(device)``, the order that stalls on DirectML -- in a
subprocess:

* native (correct order): ``python train.py --order right`` on the CPU, no dmlshim: the
  reference.
* shim rebind / shim reset / stalled (off): ``python -m dmlshim train.py --order wrong`` with
  ``DMLSHIM_OPTIMIZER`` set so.
* article's re-create-every-epoch: the published workaround (a new optimizer at the top of each
  epoch, the scheduler left on the first one) with the shim's optimizer handling off, i.e. what
  the workaround gets on DirectML by itself; and the same script under ``rebind``.

On the CPU target Parameters are replaced as on DirectML through torch's overwrite flag
(``--overwrite-params``); on ``emulated-dml`` they are replaced by the device itself.
Final loss: mean training loss of the last epoch, and the last validation loss.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Dict, List, Optional, Sequence, Tuple

from common import clean_env  # benchmarks/common.py (this folder is sys.path[0])

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "tests" / "corpus" / "stall" / "train.py"


@dataclass(frozen=True)
class Row:
    label: str
    shim: Optional[str]  # DMLSHIM_OPTIMIZER, or None for the native run
    args: Tuple[str, ...]


ROWS = (
    Row("native (correct order)", None, ("--order", "right")),
    Row("shim rebind", "rebind", ("--order", "wrong")),
    Row("article's re-create-every-epoch", "off", ("--order", "right", "--recreate")),
    Row("article's workaround under rebind", "rebind", ("--order", "right", "--recreate")),
    Row("shim reset", "reset", ("--order", "wrong")),
    Row("stalled (off)", "off", ("--order", "wrong")),
)


@dataclass
class Result:
    train: Optional[float]  # mean training loss of the last epoch
    val: Optional[float]
    losses: List[str]
    error: str = ""


def _env(device: str, policy: Optional[str]) -> Dict[str, str]:
    if policy is None:
        return clean_env()
    return clean_env(DMLSHIM_DEVICE=device, DMLSHIM_OPTIMIZER=policy)


def run_row(row: Row, optim: str, device: str, common: Sequence[str]) -> Result:
    args = ["--optim", optim, "--sched", "step", *common, *row.args]
    if row.shim is None:
        cmd = [sys.executable, str(SCRIPT), *args]
    else:
        if device == "cpu":
            args.append("--overwrite-params")
        cmd = [sys.executable, "-m", "dmlshim", str(SCRIPT), *args]
    proc = subprocess.run(cmd, env=_env(device, row.shim), capture_output=True, text=True,
                          cwd=str(REPO), check=False)
    if proc.returncode != 0:
        tail = (proc.stderr.strip().splitlines() or ["no output"])[-1]
        return Result(None, None, [], f"exit {proc.returncode}: {tail}")
    train: Dict[int, List[float]] = {}
    val: Dict[int, float] = {}
    lines: List[str] = []
    for line in proc.stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[0] == "loss":
            lines.append(parts[3])
            if parts[2] == "val":
                val[int(parts[1])] = float.fromhex(parts[3])
            else:
                train.setdefault(int(parts[1]), []).append(float.fromhex(parts[3]))
    last = max(train)
    return Result(sum(train[last]) / len(train[last]), val.get(last), lines)


def table(device: str, epochs: int, steps: int, optims: Sequence[str], jobs: int) -> str:
    common = ["--epochs", str(epochs), "--steps", str(steps)]
    work = [(row, optim) for optim in optims for row in ROWS]
    with ThreadPoolExecutor(max_workers=max(1, jobs)) as pool:
        results = list(pool.map(lambda rw: run_row(rw[0], rw[1], device, common), work))
    by_key = {(row.label, optim): res for (row, optim), res in zip(work, results)}
    names = {"sgd": "SGD+momentum", "adam": "Adam"}
    head = ["run"]
    for optim in optims:
        head += [f"{names.get(optim, optim)} train", f"{names.get(optim, optim)} val",
                 f"{names.get(optim, optim)} = native"]
    out = [f"device: {device}; {epochs} epochs x {steps} steps; StepLR(gamma=0.7); "
           f"final loss = mean training loss of the last epoch, last validation loss",
           "",
           "| " + " | ".join(head) + " |",
           "|" + "|".join(["---"] + ["---:"] * (len(head) - 1)) + "|"]
    for row in ROWS:
        cells = [row.label]
        for optim in optims:
            res = by_key[(row.label, optim)]
            ref = by_key[(ROWS[0].label, optim)]
            if res.error:
                cells += [res.error, "", ""]
                continue
            same = "bit-identical" if res.losses == ref.losses else "no"
            cells += [f"{res.train:.4f}", f"{res.val:.4f}" if res.val is not None else "-",
                      "-" if row is ROWS[0] else same]
        out.append("| " + " | ".join(cells) + " |")
    return "\n".join(out)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cpu", choices=["cpu", "emulated-dml"])
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--optims", default="sgd,adam")
    parser.add_argument("--jobs", type=int, default=2, help="runs at a time")
    args = parser.parse_args(argv)
    print(table(args.device, args.epochs, args.steps, args.optims.split(","), args.jobs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
