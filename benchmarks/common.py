"""Shared bits of the benchmark drivers: alternating runs, medians, environment, table rows."""

from __future__ import annotations

import json
import os
import platform
import statistics
import subprocess
import sys
from datetime import date
from typing import Callable, Dict, List, Optional, Sequence

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
WORKLOADS = os.path.join(REPO, "benchmarks", "workloads")


def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def run_value(cmd: Sequence[str], key: str, env: Dict[str, str], timeout: float = 600,
              retries: int = 1) -> float:
    """Run a command and return the float printed after `key` on its own line."""
    proc = subprocess.run(list(cmd), capture_output=True, text=True, env=env, timeout=timeout)
    if proc.returncode != 0 and retries > 0:
        # an emulated-dml process can abort at interpreter exit (see the issue notes); the
        # measurement is redone, never taken from a failed run
        print(f"retrying after exit status {proc.returncode}: {proc.stderr[-200:]!r}",
              file=sys.stderr)
        return run_value(cmd, key, env, timeout, retries - 1)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    for line in proc.stdout.splitlines():
        if line.startswith(key + " "):
            return float(line.split()[1])
    raise RuntimeError(f"{key} not printed by {' '.join(cmd)}:\n{proc.stdout[-2000:]}")


def alternate(runs: int, a: Callable[[], float], b: Callable[[], float]) -> tuple:
    """a, b, a, b, ... `runs` times each; returns the two lists of values."""
    va: List[float] = []
    vb: List[float] = []
    for i in range(runs):
        # swap the order every other round so neither side always runs first
        if i % 2 == 0:
            va.append(a())
            vb.append(b())
        else:
            vb.append(b())
            va.append(a())
    return va, vb


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        with open("/proc/cpuinfo", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("model name"):
                    cpu = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    gpu = ""
    try:
        import torch

        if torch.cuda.is_available():
            gpu = ", " + torch.cuda.get_device_name(0)
    except Exception:
        pass
    return f"{cpu} x{os.cpu_count()}{gpu}"


def header() -> Dict[str, str]:
    import torch

    return {"machine": machine(), "torch": torch.__version__, "python": platform.python_version(),
            "date": date.today().isoformat()}


def median(values: List[float]) -> float:
    return statistics.median(values)


def emit(row: Dict[str, object], out: Optional[str] = None) -> None:
    line = json.dumps(row)
    print(line, flush=True)
    if out:
        with open(out, "a", encoding="utf-8") as fh:
            fh.write(line + "\n")
