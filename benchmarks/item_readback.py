"""What the guard ``readback_gil`` costs a read back of one number (``t.item()``).

Runs a child through ``python -m dmlshim`` with ``DMLSHIM_GUARDS=on`` and ``off`` alternately
(the order swaps every round). Each child times ``t.item()`` of a fresh device scalar (the work
that makes it is finished first, so the time is the read back itself) and counts, with
``sys.setprofile``, the Python frames one ``t.item()`` runs in dmlshim (a deterministic count).
``--d3d12 PATH`` runs the children on the real wheel in the WSL harness's real route (a
vkd3d-proton build); without it, on the target ``--device`` names (default ``emulated-dml``).

    python benchmarks/item_readback.py --runs 5 --d3d12 /path/to/libvkd3d-proton-d3d12.so
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import REPO, alternate, clean_env, header, median, run_value  # noqa: E402


def child(reads: int) -> None:
    import torch

    x = torch.randn(64, device="cuda")
    times = []
    for _ in range(reads):
        t = (x * 1.5).sum()
        float((x * 0).sum().to("cpu"))  # the queue is drained: only the read back is timed
        start = time.perf_counter()
        t.item()
        times.append(time.perf_counter() - start)
    t = x.sum()
    float(t.to("cpu"))
    frames = 0
    shim_dir = os.path.join(REPO, "dmlshim")

    def count(frame, event, arg):
        nonlocal frames
        if event == "call" and frame.f_code.co_filename.startswith(shim_dir):
            frames += 1

    sys.setprofile(count)
    t.item()
    sys.setprofile(None)
    print("us", statistics.median(times) * 1e6)
    print("frames", frames)


def measure(guards: str, key: str, args: argparse.Namespace) -> float:
    cmd = [sys.executable, "-m", "dmlshim", os.path.abspath(__file__), "--child",
           "--reads", str(args.reads)]
    if args.d3d12:
        cmd = [sys.executable, "-m", "emulated_dml.wsl", "--d3d12", args.d3d12, "--", *cmd]
    env = clean_env(DMLSHIM_GUARDS=guards, OMP_NUM_THREADS="1")
    if not args.d3d12:
        env["DMLSHIM_DEVICE"] = args.device
    return run_value(cmd, key, env)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--reads", type=int, default=200)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--device", default="emulated-dml")
    parser.add_argument("--d3d12", default="")
    args = parser.parse_args()
    if args.child:
        child(args.reads)
        return
    off, on = alternate(args.runs, lambda: measure("off", "us", args),
                        lambda: measure("on", "us", args))
    frames = {g: int(measure(g, "frames", args)) for g in ("off", "on")}  # deterministic
    h = header()
    print(f"{h['machine']}, torch {h['torch']}, {h['date']}, "
          f"{'real wheel (--d3d12)' if args.d3d12 else args.device}, "
          f"{args.runs} alternating runs of {args.reads} reads")
    print(f"t.item(): guards off {median(off):.1f} us, on {median(on):.1f} us "
          f"(ratio {median(on) / median(off):.2f}); dmlshim frames per item(): "
          f"off {frames['off']}, on {frames['on']}")


if __name__ == "__main__":
    main()
