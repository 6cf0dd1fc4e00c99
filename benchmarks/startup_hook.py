"""What the startup hook (dmlshim-startup.pth) costs every python process of an environment
that has dmlshim installed: ``site`` executes its one line at each start.

* ``python -c ...`` and ``python script.py``: the line tests ``sys.argv[0]`` and stops
  (timed in this process with ``timeit``, the line exactly as installed);
* ``python -m module`` (pytest, pip, ...): the line imports ``_dmlshim_startup`` (one module)
  and asks whether the module is dmlshim's runner: ``-X importtime``'s figure for it in a child
  ``python -m json.tool``, median of the runs, and the child's module count with and without
  the import (deterministic).

    python benchmarks/startup_hook.py --runs 11
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import sysconfig
import timeit
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
LINE = (REPO / "dmlshim-startup.pth").read_text().strip()


def line_cost_us(argv0: str, number: int = 200000) -> float:
    saved = sys.argv
    sys.argv = [argv0]
    try:
        return timeit.timeit(LINE, number=number) / number * 1e6
    finally:
        sys.argv = saved


def import_cost_us(runs: int) -> list:
    hook = Path(sysconfig.get_paths()["purelib"]) / "dmlshim-startup.pth"
    if not hook.is_file():
        raise SystemExit(f"{hook} is missing: pip install -e . first")
    costs = []
    for _ in range(runs):
        proc = subprocess.run([sys.executable, "-X", "importtime", "-m", "json.tool", "-h"],
                              capture_output=True, text=True, check=True)
        match = re.search(r"import time:\s+(\d+) \|\s+(\d+) \| +_dmlshim_startup$",
                          proc.stderr, re.M)
        assert match, proc.stderr[-2000:]
        costs.append(int(match.group(2)))
    return costs


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=11)
    a = p.parse_args()
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} cores")
    print(f"line, python -c:        {line_cost_us('-c'):.3f} us")
    print(f"line, python script.py: {line_cost_us('train.py'):.3f} us")
    costs = import_cost_us(a.runs)
    print(f"python -m: _dmlshim_startup import (cumulative) median {statistics.median(costs)} us "
          f"(min {min(costs)}, max {max(costs)}, runs {len(costs)}); modules added: 1")


if __name__ == "__main__":
    main()
