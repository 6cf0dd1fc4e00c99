"""A device tensor given where a number goes, after a loss written into views (YOLOv8's step).

torch's argument parser reads ``counts.max()`` in ``torch.zeros(b, counts.max(), n)`` with
``item()`` while it holds the GIL. On torch-directml 0.2.5 that read back waits for the wheel's
event thread, which first runs the completions queued before it; one that drops the last
reference to a tensor Python has let go of (the temporaries of ``counts_of``, still used by the
device) takes the GIL to free it: a deadlock (guard ``readback_gil``). A C watchdog
(faulthandler) ends a hung run: "Timeout" on stderr, exit status 1. On Windows its exit
(ExitProcess) waits for the DLLs' detach, which the wheel's stuck threads hold up: a watchdog
process terminates the run a few seconds after the dump instead (exit status 15).

``--device dml`` runs on the wheel alone; ``--device cuda`` as a CUDA script (under dmlshim).
Prints one line per step (the shape made from the device tensor) and "done" at the end.
"""

from __future__ import annotations

import argparse
import faulthandler
import os
import subprocess
import sys

import torch


def counts_of(labels: torch.Tensor) -> torch.Tensor:
    # run lengths of the sorted labels, CUDA's unique counts from slices of temporaries
    values, _ = torch.sort(labels, stable=True)
    n = values.numel()
    first = torch.cat([torch.ones(1, dtype=torch.bool, device=labels.device),
                       torch.ne(values[1:], values[:-1])])
    starts = torch.nonzero(first).reshape(-1)
    ends = torch.cat([starts[1:], torch.full((1,), n, dtype=starts.dtype, device=labels.device)])
    return ends - starts


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--timeout", type=float, default=60.0)
    args = parser.parse_args()
    faulthandler.dump_traceback_later(args.timeout, exit=True)
    watchdog = None
    if os.name == "nt":  # (see the docstring) os.kill is TerminateProcess there
        watchdog = subprocess.Popen([sys.executable, "-I", "-S", "-c",
                                     "import os, sys, time; time.sleep(float(sys.argv[1])); "
                                     "os.kill(int(sys.argv[2]), 15)",
                                     str(args.timeout + 5), str(os.getpid())])
    if args.device == "dml":
        import torch_directml

        dev = torch_directml.device()
    else:
        dev = torch.device(args.device)
    torch.manual_seed(0)
    w = torch.randn(512, 512, device=dev, requires_grad=True)
    x = torch.randn(512, 512, device=dev)
    for step in range(args.steps):
        h = (x @ w).tanh()
        loss = torch.zeros(3, device=dev)
        loss[0] = h.mean()
        loss[1] = (h * h).mean()
        loss[0] *= 7.5
        (loss.sum() * 4).backward()
        with torch.no_grad():
            w -= 1e-3 * w.grad
        w.grad = None
        counts = counts_of((h[:16, 0] > 0).long())
        z = torch.zeros(4, counts.max(), 5, device=dev)
        print("step", step, tuple(z.shape), flush=True)
    faulthandler.cancel_dump_traceback_later()
    if watchdog is not None:
        watchdog.kill()
    print("done", flush=True)


if __name__ == "__main__":
    main()
