"""The shim against a hand port on the real torch-directml wheel (issue 37): what a zoo step
dispatches to the device, what falls back to the CPU and the bytes crossing host<->device
(``--counts``, deterministic), and steps/s (``--speed``, alternating runs).

The hand port is what a user does without dmlshim: the same CUDA-style step
(benchmarks/zoo/train.py: AdamW, ``torch.autocast("cuda", float16)``, ``GradScaler("cuda")``,
``clip_grad_norm_``) with ``torch_directml.device()`` in place of ``"cuda"`` and nothing else
changed (torch disables the CUDA autocast and scaler it cannot have, with its warnings; the
shim, by default, runs those regions in float32 too). The shim's run is the same step with
``"cuda"``, under ``dmlshim.install()``.

Counting: a ``TorchDispatchMode`` below autograd sees every aten call on a DirectML tensor
(the guards run above it: what it sees is what they hand the wheel). A call the shim
decomposes (its kernels for the PrivateUse1 key) is entered, and its inner calls counted as
the device work that replaced the wheel's fallback; every other call is the wheel's C++ and a
leaf. Per leaf: a *launch* (views and allocations apart), or a *fallback* (the wheel's
``TORCH_WARN`` "will fall back to run on the CPU", with ``torch.set_warn_always(True)``) whose
bytes are its device tensors copied to the host and its device results copied back, or a
*copy* between the host and the device (``_to_copy``/``copy_`` across, ``item()``).

Run it where the wheel runs on a D3D12 device, through the WSL harness::

    python benchmarks/realwheel_cost.py --counts --d3d12 /path/to/libvkd3d-proton-d3d12.so
    python benchmarks/realwheel_cost.py --speed --runs 5 --steps 6 --warmup 2 \
        --variants "hand,shim,shim:decompose=off,shim:guards=off" --d3d12 /path/to/libvkd3d-proton-d3d12.so

``--speed``: each run a fresh process (warm-up steps, then the timed ones, the device's queue
drained once at the end); the variants alternate, the order rotating every round; a variant
``shim:OPTIONS`` installs the shim with those options (``decompose=off;guards=off``), which says
what each part costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections import Counter
from typing import Callable, Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
ZOO = ("resnet50", "vit", "gpt2", "bert", "unet", "lstm_lm", "yolov8n")
SPEED = {"cnn": "resnet50", "lm": "gpt2"}
_COMPOSITES = ("CompositeImplicitAutograd", "CompositeExplicitAutograd",
               "CompositeExplicitAutogradNonFunctional")
_ALLOCS = ("empty.memory_format", "empty_strided", "empty_like", "empty.out")


def _zoo():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "zoo_train", os.path.join(REPO, "benchmarks", "zoo", "train.py"))
    zoo = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(zoo)
    return zoo


def _setup(variant: str, model: str):
    """(zoo, task, optimizer, scaler, device, batch maker) of ``variant`` ("hand", "shim")."""
    import warnings

    warnings.filterwarnings("ignore", message=".*(CUDA is not available|not available).*")
    if variant == "shim":
        os.environ["DMLSHIM_DISABLE"] = "1"  # import only; install() below
        sys.path.insert(0, REPO)
        import dmlshim

        # --shim-options (guards=off, decompose=off: what each costs), through the environment
        options = dict(kv.split("=", 1) for kv in
                       os.environ.get("REALWHEEL_SHIM_OPTIONS", "").split(",") if kv)
        dmlshim.install(**options)
        device = "cuda"
    import torch

    if variant == "hand":
        import torch_directml

        device = torch_directml.device()
    zoo = _zoo()
    torch.manual_seed(0)
    task = zoo.MODELS[model]()
    task.model = task.model.to(device).train()
    opt = torch.optim.AdamW(task.model.parameters(), lr=task.lr, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cuda")
    g = torch.Generator().manual_seed(1)
    dev = next(task.model.parameters()).device
    return zoo, task, opt, scaler, dev, (lambda: zoo.to_device(task.batch(g), dev))


def _counting_mode(decomposed: Dict[str, Callable]):
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    def dml(t) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == "privateuseone"

    def nbytes(t) -> int:
        return t.numel() * t.element_size()

    has = torch._C._dispatch_has_kernel_for_dispatch_key

    def falls_back(qualified: str) -> bool:
        return torch._C._dispatch_has_kernel(qualified) and not has(qualified, "PrivateUse1") \
            and not any(has(qualified, k) for k in _COMPOSITES)

    def out_falls_back(name: str) -> bool:
        """Whether the out= form of a structured op's functional or in-place ``name`` falls back."""
        base, _, overload = name.partition(".")
        base = base.rstrip("_")
        return any(falls_back(f"aten::{base}.{o}") for o in
                   ((overload + "_out") if overload else "out", "out"))

    class Counting(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.c: Counter = Counter()
            self.c_inner: Counter = Counter()  # launches inside the shim's decompositions

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            leaves = [t for t in tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor)]
            dev = kwargs.get("device")
            on = any(dml(t) for t in leaves) or (dev is not None and
                                                  torch.device(dev).type == "privateuseone")
            name = func.name().split("::", 1)[1]
            if not on:
                return func(*args, **kwargs)
            kernel = decomposed.get(name)
            if kernel is not None:  # the shim's kernel: its calls are the device work
                self.c["decomposed:" + name] += 1
                before = Counter({k: v for k, v in self.c.items() if k.startswith("op:")})
                launched = self.c["launches"]
                with self:  # (called directly: func() would come back to this mode)
                    out = kernel(*args, **kwargs)
                self.c["decomposed_launches:" + name] += self.c["launches"] - launched
                for k, v in self.c.items():
                    if k.startswith("op:") and v != before[k]:
                        self.c_inner[k[3:]] += v - before[k]
                return out
            qualified = func.name()
            if not has(qualified, "PrivateUse1") and (
                    name.startswith("_foreach_") or has(qualified, _COMPOSITES[0])
                    or out_falls_back(name)):
                # torch's composite (a foreach slow path; an implicit one that a kernel below
                # autograd calls, chunk; a structured op's functional or in-place form whose
                # out= kernel falls back: lerp_ -> lerp.Scalar_out): its calls are what runs
                composite = next((k for k in _COMPOSITES if has(qualified, k)), None)
                if composite is not None:
                    with self:
                        return func._op_dk(getattr(torch._C.DispatchKey, composite), *args,
                                           **kwargs)
            out = func(*args, **kwargs)
            # no device kernel, no composite: the wheel's boxed CPU fallback (what its warning
            # "will fall back to run on the CPU" says; counted here, where the call is)
            fell_back = falls_back(qualified)
            results = [t for t in tree_leaves(out) if isinstance(t, torch.Tensor)]
            if fell_back:
                self.c["fallbacks"] += 1
                self.c["fallback:" + name] += 1
                self.c["bytes_to_host"] += sum(nbytes(t) for t in leaves if dml(t))
                self.c["bytes_to_device"] += sum(nbytes(t) for t in results if dml(t))
            elif name in ("_to_copy", "copy_") and leaves and results:
                src, dst = (leaves[1], leaves[0]) if name == "copy_" else (leaves[0], results[0])
                if dml(src) != dml(dst):
                    key = "bytes_to_device" if dml(dst) else "bytes_to_host"
                    self.c[key] += nbytes(src)
                    self.c["copies"] += 1
                elif dml(dst):
                    self.c["launches"] += 1
            elif name == "_local_scalar_dense":
                self.c["bytes_to_host"] += leaves[0].element_size()
                self.c["copies"] += 1
            elif name in _ALLOCS or name.startswith("empty"):
                self.c["allocations"] += 1
            elif any(r.alias_info is not None and not r.alias_info.is_write
                     for r in func._schema.returns):
                self.c["views"] += 1
            else:
                self.c["launches"] += 1
                self.c["op:" + name] += 1
            return out

    return Counting()


def one_counts(variant: str, model: str, steps: int) -> Dict[str, object]:
    import torch

    zoo, task, opt, scaler, dev, batch = _setup(variant, model)
    zoo.train_step(task, opt, scaler, batch())  # warm-up: first-call work stays out
    decomposed: Dict[str, Callable] = {}
    if variant == "shim":
        from dmlshim.kernels.decompositions import all_decompositions

        decomposed = {d.name: d.kernel for d in all_decompositions()}
    batches = [batch() for _ in range(steps)]
    mode = _counting_mode(decomposed)
    with mode:
        for b in batches:
            zoo.train_step(task, opt, scaler, b)
    counts = mode.c + Counter({"decomposed_op:" + k: v for k, v in mode.c_inner.items()})
    return {"variant": variant, "model": model, "torch": torch.__version__, "steps": steps,
            "per_step": {k: v / steps for k, v in sorted(counts.items())}}


def one_speed(variant: str, model: str, steps: int, warmup: int) -> Dict[str, object]:
    zoo, task, opt, scaler, dev, batch = _setup(variant, model)
    batches = [batch() for _ in range(warmup + steps)]
    for b in batches[:warmup]:
        zoo.train_step(task, opt, scaler, b).item()
    start = time.perf_counter()
    for b in batches[warmup:]:
        loss = zoo.train_step(task, opt, scaler, b)
    loss.item()  # the device queue drained
    return {"variant": variant, "model": model, "steps_per_s": steps / (time.perf_counter() - start)}


def _child(d3d12: str, args: List[str]) -> Dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    cmd = [sys.executable, os.path.join(REPO, "emulated_dml", "wsl.py"), "--d3d12", d3d12, "--",
           sys.executable, os.path.abspath(__file__), *args]
    for _attempt in range(3):
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=REPO)
        # 134 (SIGABRT): the software adapter's own crash, seen now and then on a loaded
        # 2-core machine (the same run passes again); retried, and said in the row
        if proc.returncode != 134:
            break
        print(f"  (retried: {' '.join(args)} aborted, exit 134)", file=sys.stderr, flush=True)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("{")]
    if proc.returncode != 0 or not lines:
        # what the run died of: the last line of its traceback (a hand port that cannot train
        # the model at all is a result, not a benchmark failure)
        errors = [ln for ln in proc.stderr.splitlines() if ln and not ln.startswith(" ")
                  and ("Error" in ln or "Exception" in ln)]
        return {"error": errors[-1][:160] if errors else f"exit {proc.returncode}",
                "args": args}
    return json.loads(lines[-1])


def counts_table(a) -> None:
    print("| model | hand port: launches / fallbacks / bytes to host, to device | shim: launches / "
          "fallbacks / bytes to host, to device | decomposed by the shim (calls: launches) | "
          "hand port's fallbacks | other launches, shim - hand port |")
    print("|---|---|---|---|---|---|")
    for model in a.models:
        rows = {v: _child(a.d3d12, ["--one-counts", v, "--model", model, "--steps",
                                     str(a.steps)]) for v in ("hand", "shim")}
        if a.json:
            with open(a.json, "a", encoding="utf-8") as f:
                for r in rows.values():
                    f.write(json.dumps(r) + "\n")

        def cells(r: Dict) -> str:
            if "error" in r:
                return f"fails: {r['error']}"
            p = r["per_step"]
            return (f"{p.get('launches', 0):g} / {p.get('fallbacks', 0):g} / "
                    f"{p.get('bytes_to_host', 0):g}, {p.get('bytes_to_device', 0):g}")

        hand, shim = rows["hand"].get("per_step", {}), rows["shim"].get("per_step", {})
        dec = ", ".join(f"`{k[11:]}` {v:g}: {shim.get('decomposed_launches:' + k[11:], 0):g}"
                        for k, v in shim.items() if k.startswith("decomposed:")) or "-"
        fb = ", ".join(f"`{k[9:]}` {v:g}" for k, v in hand.items()
                       if k.startswith("fallback:")) or "-"
        # launches outside the decompositions that differ (the guards' work, what they replace)
        inner = {k[3:]: v for k, v in shim.items() if k.startswith("op:")}
        for k, v in shim.items():
            if k.startswith("decomposed_op:"):
                inner[k[14:]] = inner.get(k[14:], 0) - v
        ops = sorted(set(inner) | {k[3:] for k in hand if k.startswith("op:")})
        diff = ", ".join(f"`{op}` {inner.get(op, 0) - hand.get('op:' + op, 0):+g}" for op in ops
                         if inner.get(op, 0) != hand.get("op:" + op, 0)) or "-"
        print(f"| {model} | {cells(rows['hand'])} | {cells(rows['shim'])} | {dec} | {fb} | "
              f"{diff if hand and shim else '-'} |", flush=True)


def speed_table(a) -> None:
    """Medians of alternating runs of each variant: ``hand``, ``shim`` and ``shim:OPTIONS``
    (``shim:decompose=off``: what the decompositions cost, or save)."""
    variants = a.variants
    print("| workload | model | " + " | ".join(f"{v} steps/s" for v in variants)
          + " | " + " | ".join(f"{v} / hand" for v in variants[1:]) + " | runs |")
    print("|---|---|" + "---:|" * (2 * len(variants) - 1) + "---:|")
    for workload in a.workloads:
        model = SPEED[workload]
        got: Dict[str, List[float]] = {v: [] for v in variants}
        for i in range(a.runs):
            shift = i % len(variants)  # the order rotates every round
            for v in variants[shift:] + variants[:shift]:
                kind, _, options = v.partition(":")
                os.environ["REALWHEEL_SHIM_OPTIONS"] = options.replace(";", ",")
                r = _child(a.d3d12, ["--one-speed", kind, "--model", model, "--steps",
                                     str(a.steps), "--warmup", str(a.warmup)])
                if "error" in r:
                    raise RuntimeError(f"{workload} {v}: {r['error']}")
                got[v].append(r["steps_per_s"])
                if a.json:
                    with open(a.json, "a", encoding="utf-8") as f:
                        f.write(json.dumps(dict(r, variant=v, workload=workload, round=i)) + "\n")
        med = {v: statistics.median(got[v]) for v in variants}
        print(f"| {workload} | {model} | " + " | ".join(f"{med[v]:.3f}" for v in variants) + " | "
              + " | ".join(f"{med[v] / med[variants[0]]:.2f}" for v in variants[1:])
              + f" | {a.runs} |", flush=True)
        for v in variants:
            print(f"  {v}: {[round(x, 3) for x in got[v]]}", flush=True)


def main(argv: List[str]) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--d3d12", help="the real D3D12 library (a vkd3d-proton build)")
    p.add_argument("--counts", action="store_true", help="per-step counts, hand port vs shim")
    p.add_argument("--speed", action="store_true", help="steps/s, hand port vs shim")
    p.add_argument("--models", type=lambda s: s.split(","), default=list(ZOO))
    p.add_argument("--workloads", type=lambda s: s.split(","), default=list(SPEED))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--warmup", type=int, default=2)
    p.add_argument("--json", help="append the raw rows (JSON lines) to this file")
    p.add_argument("--variants", type=lambda s: s.split(","), default=["hand", "shim"],
                   help="--speed: hand, shim, shim:OPTIONS (shim:decompose=off;guards=off)")
    p.add_argument("--shim-options", default="",
                   help="install() options of the shim's runs, e.g. guards=off,decompose=off")
    p.add_argument("--one-counts", choices=("hand", "shim"), help=argparse.SUPPRESS)
    p.add_argument("--one-speed", choices=("hand", "shim"), help=argparse.SUPPRESS)
    p.add_argument("--model", choices=ZOO, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.one_counts:
        print(json.dumps(one_counts(a.one_counts, a.model, a.steps or 2)))
    elif a.one_speed:
        print(json.dumps(one_speed(a.one_speed, a.model, a.steps or 10, a.warmup)))
    else:
        os.environ["REALWHEEL_SHIM_OPTIONS"] = a.shim_options
        if not a.d3d12:
            p.error("--d3d12 PATH: the real wheel runs on a real D3D12 library")
        if a.counts:
            a.steps = a.steps or 2
            counts_table(a)
        if a.speed:
            a.steps = a.steps or 10
            speed_table(a)


if __name__ == "__main__":
    main(sys.argv[1:])
