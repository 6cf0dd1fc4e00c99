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
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


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
    shim_dir = str(REPO / "dmlshim")

    def count(frame, event, arg):
        nonlocal frames
        if event == "call" and frame.f_code.co_filename.startswith(shim_dir):
            frames += 1

    sys.setprofile(count)
    t.item()
    sys.setprofile(None)
    print(json.dumps({"us": statistics.median(times) * 1e6, "frames": frames}))


def run(guards: str, args: argparse.Namespace) -> dict:
    cmd = [sys.executable, "-m", "dmlshim", str(Path(__file__).resolve()), "--child",
           "--reads", str(args.reads)]
    if args.d3d12:
        cmd = [sys.executable, "-m", "emulated_dml.wsl", "--d3d12", args.d3d12, "--", *cmd]
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    env.update(DMLSHIM_GUARDS=guards, OMP_NUM_THREADS="1")
    if not args.d3d12:
        env["DMLSHIM_DEVICE"] = args.device
    env["PYTHONPATH"] = str(REPO) + (os.pathsep + env["PYTHONPATH"] if "PYTHONPATH" in env else "")
    proc = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0:
        raise SystemExit(f"child failed ({guards}):\n{proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


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
    rows = {"on": [], "off": []}
    for i in range(args.runs):
        for guards in (("off", "on") if i % 2 == 0 else ("on", "off")):
            rows[guards].append(run(guards, args))
    on = statistics.median(r["us"] for r in rows["on"])
    off = statistics.median(r["us"] for r in rows["off"])
    import torch

    print(f"torch {torch.__version__}, {'real wheel (--d3d12)' if args.d3d12 else args.device}, "
          f"{args.runs} alternating runs of {args.reads} reads")
    print(f"t.item(): guards off {off:.1f} us, on {on:.1f} us (ratio {on / off:.2f}); "
          f"dmlshim frames per item(): off {rows['off'][0]['frames']}, "
          f"on {rows['on'][0]['frames']}")


if __name__ == "__main__":
    main()
