"""Hot-path cost in one process: the same train step with dmlshim installed and not, in
alternating blocks (install, N steps, uninstall, N steps, ...). Immune to what else the machine
does between processes, so it isolates what the wrappers cost per step.

With the shim the step is written for CUDA (`device="cuda"` tensors made each step, `.cuda()`
on the batch, `torch.cuda.synchronize()`), natively for the CPU; both compute the same thing.

    python benchmarks/inprocess_ab.py --model mlp --blocks 20 --steps 200
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "workloads"))
os.environ["DMLSHIM_DISABLE"] = "1"  # import without installing; install() below toggles

import models  # noqa: E402
import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from common import emit, header  # noqa: E402

import dmlshim  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--blocks", type=int, default=20)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    model = models.mlp() if a.model == "mlp" else models.SmallCNN()
    shape = (64, 64) if a.model == "mlp" else (64, 3, 32, 32)
    x, y = torch.randn(*shape), torch.randint(0, 10, (64,))
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)

    def block(dev: str) -> float:
        t0 = time.perf_counter()
        for _ in range(a.steps):
            xb = x.cuda(non_blocking=True) if dev == "cuda" else x
            yb = y.to(dev)
            noise = torch.zeros(1, device=dev)  # a factory call inside the step
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb + noise), yb)
            loss.backward()
            opt.step()
            if dev == "cuda":
                torch.cuda.synchronize()
        return a.steps / (time.perf_counter() - t0)

    block("cpu")  # warm-up
    native, shim = [], []
    for i in range(a.blocks):
        for side in (("native", "shim") if i % 2 == 0 else ("shim", "native")):
            if side == "shim":
                dmlshim.install(device="cpu")
                shim.append(block("cuda"))
                dmlshim.uninstall()
            else:
                native.append(block("cpu"))
    n, s = statistics.median(native), statistics.median(shim)
    emit(dict(header(), bench="inprocess_ab", model=a.model, blocks=a.blocks, steps=a.steps,
              threads=a.threads, native_steps_per_s=round(n, 1), shim_steps_per_s=round(s, 1),
              ratio=round(n / s, 4)), a.out)


if __name__ == "__main__":
    main()
