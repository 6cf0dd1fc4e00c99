"""Cost of DMLSHIM_CHECK: time per shadowed step ÷ time per plain step, in one process.

Alternating blocks: install(check=S+1), one step (first-step work: optimizer state, gradient
sanity), S shadowed steps timed, uninstall; install(check=off), one step, S plain steps timed,
uninstall; ... (the order swaps every round). The same model and batch, written for CUDA, on the
chosen target (``cpu`` or ``emulated-dml``). Also prints how many ops one shadowed step compares.

    python benchmarks/check_cost.py --device cpu --model mlp --rounds 7 --steps 5
    python benchmarks/check_cost.py --device emulated-dml --model cnn --rounds 5 --steps 3
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
from dmlshim import api  # noqa: E402


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", choices=["cpu", "emulated-dml"], default="cpu")
    p.add_argument("--model", choices=["mlp", "cnn"], default="mlp")
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--steps", type=int, default=5, help="timed steps per block")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    shape = (64, 64) if a.model == "mlp" else (64, 3, 32, 32)

    def block(check: str) -> tuple:
        dmlshim.install(device=a.device, check=check)
        results = api.session().patch("check").results  # the installation's findings
        try:
            torch.manual_seed(0)
            model = (models.mlp() if a.model == "mlp" else models.SmallCNN()).cuda()
            opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
            x = torch.randn(*shape, device="cuda")
            y = torch.randint(0, 10, (64,), device="cuda")

            def step() -> None:
                opt.zero_grad(set_to_none=True)
                F.cross_entropy(model(x), y).backward()
                opt.step()
                torch.cuda.synchronize()

            step()  # not timed: optimizer state, gradient sanity
            compared = results.ops_compared
            t0 = time.perf_counter()
            for _ in range(a.steps):
                step()
            per_step = (time.perf_counter() - t0) / a.steps
            ops = (results.ops_compared - compared) / a.steps
            if check != "off":
                assert results.steps_shadowed == a.steps + 1 and not results.counts, results.section()
            return per_step, ops
        finally:
            dmlshim.uninstall()

    block("off")  # warm-up (and the emulator's registration)
    shadowed, plain, ops = [], [], []
    for i in range(a.rounds):
        for side in (("check", "off") if i % 2 == 0 else ("off", "check")):
            if side == "check":
                t, n = block(str(a.steps + 1))
                shadowed.append(t)
                ops.append(n)
            else:
                plain.append(block("off")[0])
    s, q = statistics.median(shadowed), statistics.median(plain)
    emit(dict(header(), bench="check_cost", device=a.device, model=a.model, rounds=a.rounds,
              steps=a.steps, threads=a.threads, plain_ms_per_step=round(q * 1e3, 2),
              shadowed_ms_per_step=round(s * 1e3, 2), ratio=round(s / q, 2),
              ops_compared_per_step=statistics.median(ops),
              shadowed_all=[round(v * 1e3, 2) for v in shadowed],
              plain_all=[round(v * 1e3, 2) for v in plain]), a.out)


if __name__ == "__main__":
    main()
