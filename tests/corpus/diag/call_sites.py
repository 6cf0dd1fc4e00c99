"""Known call sites for tests/test_diagnostics.py: every line the shim changes ends with a
``# site: <api> -> <what it became> [<tag>]`` marker (``{dev}``: the target device), which the
tests read to know the line numbers and the expected log lines; move lines freely.

Usage: python call_sites.py [ok|clean|fallback|cumprod|raise|exit|interrupt]
  clean: skips the unsupported torch.cuda call (nothing needs attention)
  fallback: shows torch-directml's CPU-fallback warning text for two ops
  cumprod: three cumprods, which torch-directml 0.2.5 (and the emulator) run on the CPU
"""

import os
import signal
import sys
import warnings

import torch

mode = sys.argv[1] if len(sys.argv) > 1 else "ok"

x = torch.zeros(3, device="cuda")  # site: torch.zeros -> {dev} [redirected]
model = torch.nn.Linear(3, 2).cuda()  # site: Module.cuda -> {dev} [redirected]
for _ in range(3):
    y = torch.ones(2, device="cuda:0")  # site: torch.ones -> {dev} [redirected] x3
x = x.cpu().cuda()  # site: Tensor.cuda -> {dev} [redirected]
z = x.to("cuda")  # site: Tensor.to -> {dev} [redirected]
p = torch.zeros(2).pin_memory()  # site: Tensor.pin_memory -> no-op [dropped]
if mode != "clean":
    try:
        torch.cuda.graph_pool_handle()  # site: torch.cuda.graph_pool_handle -> error [unsupported]
    except RuntimeError as err:
        print("unsupported:", type(err).__name__)
with torch.no_grad():
    print("sum", float(model(x).sum() + y.sum() + z.sum() + p.sum()))

if mode == "fallback":
    # The text torch-directml's C++ side shows (once per op) when an op runs on the CPU.
    for op in ("aten::lerp.Scalar_out", "aten::_foreach_add_.List"):
        warnings.warn(f"The operator '{op}' is not currently supported on the DML backend and "
                      "will fall back to run on the CPU. This may have performance implications.",
                      stacklevel=1)
elif mode == "cumprod":
    for _ in range(3):
        x = (x + 1).cumprod(0)  # aten::cumprod.out falls back (DirectML issue #437)
    print("cumprod", x.cpu().tolist())
elif mode == "raise":
    raise ValueError("boom from the script")
elif mode == "exit":
    sys.exit(3)
elif mode == "interrupt":
    os.kill(os.getpid(), signal.SIGINT)  # what Ctrl-C does
    signal.pause()
print("done")
