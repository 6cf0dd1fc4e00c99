"""What a child process that never imports torch pays for the shim: ``python -c pass`` with a
plain environment vs the environment a shimmed process gives its children (the bootstrap first
on ``PYTHONPATH``, the options, the ``DMLSHIM_BOOTSTRAP`` record), alternating; reports the
median wall time of each (measured around the child, from start to exit), the ratio and the
number of modules in the child's ``sys.modules`` (deterministic).

    python benchmarks/child_cost.py --runs 20
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from typing import Dict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import alternate, clean_env, emit, header, median  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
os.environ["DMLSHIM_DISABLE"] = "1"  # `import dmlshim` would install the shim in this process
from dmlshim import config  # noqa: E402
from dmlshim.childenv import ChildEnvironment  # noqa: E402

COUNT = "import sys; print('modules', len(sys.modules))"


def shimmed_env(base: Dict[str, str]) -> Dict[str, str]:
    """What processes.child_environment exports for the default options."""
    values = dict(config.load(environ={}).as_env(), DMLSHIM_DISABLE="0")
    return ChildEnvironment(values).build(base)


CPU: Dict[str, list] = {"plain": [], "bootstrap": []}


def wall(env: Dict[str, str], side: str = "") -> float:
    """Wall time of one child; its CPU time (user + system) goes to CPU[side], a figure less
    disturbed by other load on a shared machine."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    elapsed = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if side:
        CPU[side].append(after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime)
    return elapsed


def modules(env: Dict[str, str]) -> int:
    out = subprocess.run([sys.executable, "-c", COUNT], env=env, check=True,
                         capture_output=True, text=True).stdout
    return int(out.split()[1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=20)
    p.add_argument("--out", default=None)
    a = p.parse_args()
    # An installed dmlshim has its .pyc files (pip compiles them); a checkout run with
    # PYTHONDONTWRITEBYTECODE=1 would compile sitecustomize.py from source in every child.
    import compileall

    from dmlshim.bootstrap import BOOTSTRAP_DIR

    compileall.compile_dir(BOOTSTRAP_DIR, quiet=1)
    plain = clean_env()
    shim = shimmed_env(plain)
    wall(plain), wall(shim)  # warm the page cache and the .pyc files
    base, with_shim = alternate(a.runs, lambda: wall(plain, "plain"),
                                lambda: wall(shim, "bootstrap"))
    try:
        head = header()
    except ImportError:  # torch is not needed here
        import platform

        head = {"python": platform.python_version()}
    emit(dict(head, bench="child", runs=a.runs,
              plain_ms=round(median(base) * 1000, 2),
              bootstrap_ms=round(median(with_shim) * 1000, 2),
              added_ms=round((median(with_shim) - median(base)) * 1000, 2),
              ratio=round(median(with_shim) / median(base), 3),
              plain_cpu_ms=round(median(CPU["plain"]) * 1000, 2),
              bootstrap_cpu_ms=round(median(CPU["bootstrap"]) * 1000, 2),
              plain_modules=modules(plain), bootstrap_modules=modules(shim)), a.out)


if __name__ == "__main__":
    main()
