"""Mixed precision on the emulated DirectML device: device memory per step, accuracy, fallbacks.

One CUDA training script, ``tests/corpus/amp_models.py`` (a ResNet, a GPT-2-like decoder, a
UNet-like conv net and an LSTM, each with CUDA's recipe: autocast region, GradScaler, AdamW,
gradient clipping), run unchanged through ``python -m dmlshim`` on ``emulated-dml`` with every
torch-directml gap reproduced (``autocast`` included: the shim's kernels fill it):

* ``DMLSHIM_AMP=off`` (float32 regions, a disabled scaler) and ``DMLSHIM_AMP=fp16`` (float16
  autocast on the device, a real scaler), alternating, ``--runs`` times each; medians of the
  device bytes the script reads from ``torch.cuda.max_memory_allocated`` (the peak of a step,
  after ``reset_peak_memory_stats``) and ``torch.cuda.memory_allocated`` (held after the last
  step: weights, gradients, optimizer state), which on the emulator are its live storage bytes;
* float16 accuracy: the final loss of the fp16 run against the same script natively on the CPU
  under ``torch.autocast("cpu", dtype=torch.float16)`` (``--reference cpu16``), in float32
  (``--reference cpu32``), and CUDA's own run on an H200 (recorded in
  ``tests/corpus/amp_cuda_reference.py``);
* CPU fallbacks of each run, from the JSON report (deterministic counts).

Runs on the CPU, no GPU needed::

    python benchmarks/amp_memory.py                 # table for benchmarks/README.md
    python benchmarks/amp_memory.py --runs 1 --json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from typing import Dict, List, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "tests", "corpus", "amp_models.py")
MODELS = ("resnet", "gpt", "unet", "lstm")
LABELS = {"resnet": "ResNet (BatchNorm, residual)", "gpt": "GPT-2-like (attention, tied head)",
          "unet": "UNet-like (GroupNorm, up/down, skips)", "lstm": "LSTM language model"}


def _env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


def _parse(stdout: str) -> Dict[str, Dict[str, object]]:
    out: Dict[str, Dict[str, object]] = {m: {"losses": []} for m in MODELS}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) < 3 or parts[1] not in out:
            continue
        rec = out[parts[1]]
        if parts[0] == "loss":
            rec["losses"].append(float.fromhex(parts[3]))  # type: ignore[union-attr]
        elif parts[0] == "memory":
            rec["peak"], rec["held"] = int(parts[2]), int(parts[3])
        elif parts[0] == "scaler":
            rec["scaler"] = (parts[2] == "1", float(parts[3]))
        elif parts[0] == "dtypes":
            rec["dtypes"] = tuple(parts[2:])
    return out


def _run(cmd: List[str], env: Dict[str, str]) -> str:
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env, timeout=1200, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-3000:]}")
    return proc.stdout


def shim_run(amp: str, steps: int) -> Tuple[Dict[str, Dict[str, object]], Dict[str, int]]:
    with tempfile.TemporaryDirectory(prefix="dmlshim-amp-") as tmp:
        report = os.path.join(tmp, "report.json")
        stdout = _run([sys.executable, "-m", "dmlshim", SCRIPT, "--steps", str(steps)],
                      _env(DMLSHIM_DEVICE="emulated-dml", DMLSHIM_AMP=amp,
                           DMLSHIM_REPORT=report))
        with open(report, encoding="utf-8") as f:
            fallbacks = json.load(f)["cpu_fallbacks"]
    return _parse(stdout), {"total": fallbacks["total"], **fallbacks["ops"]}


def cuda_losses() -> Dict[str, List[float]]:
    sys.path.insert(0, os.path.join(REPO, "tests"))
    from corpus.amp_cuda_reference import MODELS as RECORDED

    return {m: rec["losses"] for m, rec in _parse(RECORDED).items()}  # type: ignore[misc]


def measure(runs: int, steps: int) -> Dict[str, object]:
    per: Dict[str, List[Dict[str, Dict[str, object]]]] = {"off": [], "fp16": []}
    fallbacks: Dict[str, Dict[str, int]] = {}
    for _ in range(runs):  # alternating, so drift on a shared machine hits both alike
        for amp in ("off", "fp16"):
            result, fb = shim_run(amp, steps)
            per[amp].append(result)
            fallbacks[amp] = fb
    refs = {ref: _parse(_run([sys.executable, SCRIPT, "--steps", str(steps), "--reference", ref],
                             _env())) for ref in ("cpu16", "cpu32")}
    cuda = cuda_losses() if steps == 6 else {}  # recorded with the script's default 6 steps
    rows = []
    for m in MODELS:
        def med(amp: str, key: str, m: str = m) -> float:
            return statistics.median(float(r[m][key]) for r in per[amp])  # type: ignore[arg-type]

        final16 = statistics.median(r[m]["losses"][-1] for r in per["fp16"])  # type: ignore[index]
        final32 = statistics.median(r[m]["losses"][-1] for r in per["off"])  # type: ignore[index]
        row = {"model": m, "peak_fp32": med("off", "peak"), "peak_fp16": med("fp16", "peak"),
               "held_fp32": med("off", "held"), "held_fp16": med("fp16", "held"),
               "final_fp16": final16, "final_fp32": final32,
               "cpu16": refs["cpu16"][m]["losses"][-1],  # type: ignore[index]
               "cpu32": refs["cpu32"][m]["losses"][-1],  # type: ignore[index]
               "cuda": cuda[m][-1] if m in cuda else None,
               "scale": per["fp16"][-1][m]["scaler"][1],  # type: ignore[index]
               "deterministic": all(r[m] == per["fp16"][0][m] for r in per["fp16"])}
        rows.append(row)
    return {"runs": runs, "steps": steps, "rows": rows, "fallbacks": fallbacks}


def table(result: Dict[str, object]) -> str:
    lines = ["| model | peak bytes/step fp32 | fp16 | fp16/fp32 | held after step fp32 | fp16 | "
             "final loss fp16 | − CPU fp16 autocast | − CPU fp32 | − CUDA fp16 (H200) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:  # type: ignore[union-attr]
        def diff(key: str, r: Dict[str, object] = r) -> str:
            return "—" if r[key] is None else f"{r['final_fp16'] - r[key]:+.1e}"

        lines.append(
            f"| {LABELS[r['model']]} | {r['peak_fp32']:,.0f} | {r['peak_fp16']:,.0f} | "
            f"{r['peak_fp16'] / r['peak_fp32']:.2f} | {r['held_fp32']:,.0f} | "
            f"{r['held_fp16']:,.0f} | {r['final_fp16']:.5f} | {diff('cpu16')} | {diff('cpu32')} | "
            f"{diff('cuda')} |")
    fb = result["fallbacks"]  # type: ignore[index]
    lines.append("")
    lines.append(f"CPU fallbacks per run (all four models): DMLSHIM_AMP=off {fb['off']['total']}, "
                 f"fp16 {fb['fp16']['total']}.")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--json", action="store_true")
    a = p.parse_args()
    result = measure(a.runs, a.steps)
    if a.json:
        print(json.dumps(result))
    else:
        import platform

        import torch

        print(f"torch {torch.__version__}, Python {platform.python_version()}, "
              f"{a.runs} alternating runs of {a.steps} steps\n")
        print(table(result))


if __name__ == "__main__":
    main()
