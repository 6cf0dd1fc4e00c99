"""dmlshim Python frames per training step: a deterministic overhead count beside the timings.

``sys.setprofile`` counts the ``call`` events whose code lies in the dmlshim package during N
train steps (after warm-up steps that take the one-time paths), for two steps:

* ``plain``: MLP forward, backward, AdamW step, StepLR step; the batch is already on the device.
  Only torch's own code runs, so every frame counted is a wrapper torch itself went through.
* ``moves``: the same, plus the three entry-point calls a CUDA-style loop makes each step:
  ``x.cuda()``, ``y.to("cuda")`` and ``torch.zeros(1, device="cuda")``.

Counted apart: frames of the emulator's own dispatch (``emulated_dml/``, the emulated
device's kernels, and shim frames those kernels enter by calling torch factories) and the
decomposition kernels (``dmlshim/decompositions/``: ops torch-directml lacks, registered for
the device so they do not fall back to the CPU; they run on real DirectML too). One process per target, so targets do not see each other's patches::

    python benchmarks/hotpath_frames.py                  # cpu and emulated-dml
    python benchmarks/hotpath_frames.py --device cuda    # on an NVIDIA machine
    python benchmarks/hotpath_frames.py --one cpu --json # one target, JSON line (tests use it)
    python benchmarks/hotpath_frames.py --device emulated-dml --emulator-memory 4096
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Dict

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOVES_PER_STEP = 3  # entry-point calls the `moves` step makes itself


def measure(device: str, steps: int, warmup: int, emulator_memory: str = "") -> Dict[str, object]:
    os.environ["DMLSHIM_DISABLE"] = "1"  # import only; install() below
    sys.path.insert(0, REPO)
    import torch
    import torch.nn.functional as F

    import dmlshim

    dmlshim.install(device=device, emulator_memory=emulator_memory)
    pkg = os.path.dirname(os.path.abspath(dmlshim.__file__)) + os.sep
    emu = os.path.join(os.path.dirname(pkg.rstrip(os.sep)), "emulated_dml") + os.sep
    kern = pkg + "decompositions" + os.sep  # op kernels registered for the device
    torch.manual_seed(0)
    torch.set_num_threads(1)
    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.ReLU(),
                                torch.nn.Linear(64, 10)).cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
    x_host, y_host = torch.randn(16, 32), torch.randint(0, 10, (16,))
    x_dev, y_dev = x_host.cuda(), y_host.cuda()

    def step(move: bool) -> None:
        if move:
            x, y = x_host.cuda(), y_host.to("cuda")
            x = x + torch.zeros(1, device="cuda")
        else:
            x, y = x_dev, y_dev
        opt.zero_grad(set_to_none=True)
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        sched.step()

    out: Dict[str, object] = {"device": device, "torch": torch.__version__, "steps": steps}
    for kind in ("plain", "moves"):
        for _ in range(warmup):
            step(kind == "moves")
        shim: Counter = Counter()
        emulator = kernels = 0

        def profile(frame, event, arg, shim=shim):  # noqa: ARG001
            nonlocal emulator, kernels
            if event != "call":
                return
            code = frame.f_code
            fname = code.co_filename
            if not fname.startswith(pkg):
                return
            if fname.startswith(emu):
                emulator += 1
                return
            if fname.startswith(kern):
                kernels += 1
                return
            # a shim frame entered from the emulator's kernels (they call torch factories)
            # belongs to the emulator's dispatch, not to the shim's entry points
            back = frame.f_back
            while back is not None and back.f_code.co_filename.startswith(pkg) \
                    and not back.f_code.co_filename.startswith(emu):
                back = back.f_back
            if back is not None and back.f_code.co_filename.startswith(emu):
                emulator += 1
                return
            shim[f"{os.path.relpath(fname, pkg)}:{code.co_name}"] += 1

        sys.setprofile(profile)
        try:
            for _ in range(steps):
                step(kind == "moves")
        finally:
            sys.setprofile(None)
        total = sum(shim.values())
        out[kind] = {"shim_per_step": total / steps, "emulator_per_step": emulator / steps,
                     "kernels_per_step": kernels / steps,
                     "functions": {k: v / steps for k, v in shim.most_common()}}
    moves = out["moves"]["shim_per_step"] - out["plain"]["shim_per_step"]  # type: ignore[index]
    out["per_entry_point_call"] = moves / MOVES_PER_STEP
    return out


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", action="append", help="DMLSHIM_DEVICE values (repeatable)")
    p.add_argument("--one", help="measure this target in this process")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--emulator-memory", default="",
                   help="cap emulated adapters (MiB): an untyped OOM can then happen, and the "
                        "OOM translation wraps backward and the optimizer step")
    a = p.parse_args()
    if a.one:
        result = measure(a.one, a.steps, a.warmup, a.emulator_memory)
        print(json.dumps(result) if a.json else json.dumps(result, indent=1))
        return
    print("| target | torch | shim frames / plain step | shim frames / step with 3 moves "
          "| per entry-point call | emulator frames / plain step | decomposition kernels / plain step |")
    print("|---|---|---:|---:|---:|---:|---:|")
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    for device in a.device or ["cpu", "emulated-dml"]:
        proc = subprocess.run([sys.executable, __file__, "--one", device, "--json", "--steps",
                               str(a.steps), "--warmup", str(a.warmup),
                               "--emulator-memory", a.emulator_memory],
                              capture_output=True, text=True, env=env)
        if proc.returncode != 0:
            print(f"| {device} | failed: {proc.stderr.strip().splitlines()[-1:]} |||||")
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        print(f"| {device} | {r['torch']} | {r['plain']['shim_per_step']:g} | "
              f"{r['moves']['shim_per_step']:g} | {r['per_entry_point_call']:.2f} | "
              f"{r['plain']['emulator_per_step']:g} | {r['plain']['kernels_per_step']:g} |")
        for kind in ("plain", "moves"):
            for name, n in r[kind]["functions"].items():
                print(f"  {kind}: {n:g} x {name}", file=sys.stderr)


if __name__ == "__main__":
    main()
