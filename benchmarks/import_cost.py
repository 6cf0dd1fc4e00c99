"""Import cost: `import torch` vs `import dmlshim` (which imports torch and installs every
patch), each in a fresh interpreter followed by the script's first `torch.cuda.is_available()`,
alternating; reports medians and the difference in ms.

    python benchmarks/import_cost.py --runs 11
"""

from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import alternate, clean_env, emit, header, median, run_value  # noqa: E402

# Both sides end with the script's first CUDA query: on an NVIDIA machine that initialises the
# CUDA driver, which dmlshim's target resolution does at import instead (same cost, earlier).
TIMED = ("import time; t = time.perf_counter(); import {mod}; import torch; "
         "torch.cuda.is_available(); print('seconds', time.perf_counter() - t)")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=11)
    p.add_argument("--device", default="auto", help="DMLSHIM_DEVICE for the dmlshim side")
    p.add_argument("--out", default=None)
    a = p.parse_args()

    def torch_only() -> float:
        return run_value([sys.executable, "-c", TIMED.format(mod="torch")], "seconds", clean_env())

    def shim() -> float:
        return run_value([sys.executable, "-c", TIMED.format(mod="dmlshim")], "seconds",
                         clean_env(DMLSHIM_DEVICE=a.device))

    base, with_shim = alternate(a.runs, torch_only, shim)
    emit(dict(header(), bench="import", device=a.device, runs=a.runs,
              import_torch_ms=round(median(base) * 1000, 1),
              import_dmlshim_ms=round(median(with_shim) * 1000, 1),
              added_ms=round((median(with_shim) - median(base)) * 1000, 1)), a.out)


if __name__ == "__main__":
    main()
