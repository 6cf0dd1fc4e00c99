"""Conversion cost: `model.cpu()` -> `model.to(device)` bounces of a model with Adam state.

CUDA-style script (device = "cuda" if available). `--overwrite` sets
torch.__future__.set_overwrite_module_params_on_conversion(True), which makes conversions
replace Parameters as DirectML does (needed on CUDA; the emulator replaces them by itself).
Prints `seconds_per_bounce`, `peak_mib` (device memory high-water mark during the bounces) and
`live 1` if the optimizer still updates the model's parameters afterwards.
"""

import argparse
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import models  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["resnet50", "gpt2"], default="resnet50")
    p.add_argument("--bounces", type=int, default=5)
    p.add_argument("--overwrite", action="store_true")
    p.add_argument("--move-state", action="store_true",
                   help="after each conversion move the optimizer state to its parameter's "
                        "device by hand (what a correct script needs when params keep identity)")
    a = p.parse_args()
    if a.overwrite:
        torch.__future__.set_overwrite_module_params_on_conversion(True)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if a.model == "resnet50":
        model, x = models.ResNet50(), torch.randn(2, 3, 64, 64)
    else:
        model, x = models.GPT2Small(), torch.randint(0, 50257, (1, 16))
    model = model.to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-4)
    out = model(x.to(device))
    out.float().mean().backward()
    opt.step()  # Adam state (exp_avg, exp_avg_sq) now exists for every parameter
    opt.zero_grad(set_to_none=True)
    del out

    def sync():
        if device.type == "cuda":
            torch.cuda.synchronize()

    sync()
    torch.cuda.reset_peak_memory_stats() if device.type == "cuda" else None
    base = torch.cuda.memory_allocated() if device.type == "cuda" else 0
    t0 = time.perf_counter()
    def move_state(dev):
        for state in opt.state.values():
            for key, value in state.items():
                if torch.is_tensor(value) and key != "step":
                    state[key] = value.to(dev)

    for _ in range(a.bounces):
        model.cpu()
        if a.move_state:
            move_state("cpu")
        model.to(device)
        if a.move_state:
            move_state(device)
    sync()
    dt = (time.perf_counter() - t0) / a.bounces
    peak = torch.cuda.max_memory_allocated() if device.type == "cuda" else 0

    first = next(model.parameters())
    before = first.detach().clone()
    model(x.to(device)).float().mean().backward()
    opt.step()
    live = int(not torch.equal(before, first.detach()))
    print(f"device {device}")
    print(f"seconds_per_bounce {dt:.6f}")
    print(f"base_mib {base / 2**20:.1f}")
    print(f"peak_mib {peak / 2**20:.1f}")
    print(f"live {live}")


if __name__ == "__main__":
    main()
