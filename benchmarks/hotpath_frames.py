"""dmlshim Python frames per training step, and the aten calls each step makes on the device.

Counts, not timings. ``sys.setprofile`` counts the ``call`` events whose code lies in the
dmlshim package during N train steps (after warm-up steps that take the one-time paths).
Frames of ``emulated_dml/`` are not counted: they stand in for torch-directml's C++. Every
dmlshim frame is, wherever it is entered from (the emulator calling a wrapped torch factory
counts: on the real wheel that call is C++ and never reaches the shim).

``--zoo``: the model zoo instead (benchmarks/zoo/train.py's models and recipe: AdamW, a
GradScaler, ``clip_grad_norm_(..., 1.0)``), its frames per step against issue 37's limits.

Workloads (``--workload``):

* ``mlp``: 3-layer MLP, AdamW, StepLR;
* ``transformer2`` / ``transformer4``: a small causal transformer of 2 or 4 blocks (LayerNorm,
  ``masked_fill`` of the causal mask, softmax, GELU, dropout, a gated residual ``x + g * h``,
  cross-entropy, AdamW).

Each has two steps: ``plain`` (the batch is on the device already: only torch's own code runs,
so every frame counted is a wrapper torch went through) and ``moves`` (plus the three
entry-point calls a CUDA-style loop makes itself: ``x.cuda()``, ``y.to("cuda")``,
``torch.zeros(1, device="cuda")``).

``--count`` runs the plain step under a ``TorchDispatchMode`` that sees every aten call on a
device tensor, those the shim's device kernels (guards, decompositions) make inside included:
per step, the *launches* (calls that run a kernel of the device: a leaf, no device call under
it, not an allocation, not a view), *allocations* (``empty``), *views*, *fallbacks* (leaves the wheel runs on the CPU)
and the *transfers* those fallbacks make (each device tensor they read is copied to the host,
each one they return or write is copied back). Compared with ``DMLSHIM_DECOMPOSE=off
DMLSHIM_GUARDS=off`` (the wheel's own path), the shim's path must launch no more, counting the
wheel's fallbacks at their transfers (a decomposition replaces a fallback's copies).
The emulator runs a structured op (``mul.Tensor``) in one go where the wheel's composite
allocates its result and calls ``mul.out``; so allocations compare with the real wheel's path,
not with the emulator's raw one.

    python benchmarks/hotpath_frames.py                    # the table of benchmarks/README.md §2
    python benchmarks/hotpath_frames.py --one emulated-dml --workload mlp --json
    python benchmarks/hotpath_frames.py --one emulated-dml --count --json
    python benchmarks/hotpath_frames.py --device emulated-dml --emulator-memory 4096
    python benchmarks/hotpath_frames.py --zoo --steps 3              # the zoo on emulated-dml
    python benchmarks/hotpath_frames.py --one emulated-dml --zoo --zoo-model gpt2 --json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from collections import Counter
from typing import Dict, List

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
MOVES_PER_STEP = 3  # entry-point calls the `moves` step makes itself
WORKLOADS = ("mlp", "transformer2", "transformer4")
# the model zoo (benchmarks/zoo/train.py) and issue 37's budget of shim frames per step, default
# options: whatever grows with the parameters or layers breaks it
ZOO = ("resnet50", "vit", "gpt2", "bert", "unet", "lstm_lm", "yolov8n")
ZOO_LIMITS = {"resnet50": 20, "vit": 20, "gpt2": 40, "bert": 20, "unet": 60, "lstm_lm": 20,
              "yolov8n": 200}
_ALLOCS = ("aten::empty.memory_format", "aten::empty_strided", "aten::empty.out", "aten::empty_like",
           "aten::empty_strided.out")


def build(workload: str):
    """(model, optimizer, scheduler, host batch) of ``workload``; the model on "cuda"."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    torch.manual_seed(0)
    if workload == "mlp":
        model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(),
                              nn.Linear(64, 10))
        x, y = torch.randn(16, 32), torch.randint(0, 10, (16,))

        def loss_of(m, xb, yb):
            return F.cross_entropy(m(xb), yb)
    else:
        blocks = int(workload[len("transformer"):])
        d, heads, seq, vocab = 32, 4, 16, 50

        class Block(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
                self.qkv, self.proj = nn.Linear(d, 3 * d), nn.Linear(d, d)
                self.fc1, self.fc2 = nn.Linear(d, 4 * d), nn.Linear(4 * d, d)
                self.gate = nn.Parameter(torch.full((d,), 0.5))
                self.drop = nn.Dropout(0.1)

            def forward(self, x, mask):
                b, t, _ = x.shape
                q, k, v = self.qkv(self.ln1(x)).view(b, t, 3, heads, d // heads) \
                    .permute(2, 0, 3, 1, 4)
                att = (q @ k.transpose(-2, -1)).masked_fill(mask[:t, :t], float("-inf"))
                att = self.drop(att.softmax(-1))
                h = (att @ v).transpose(1, 2).reshape(b, t, d)
                x = x + self.gate * self.drop(self.proj(h))  # gated residual
                return x + self.drop(self.fc2(F.gelu(self.fc1(self.ln2(x)))))

        class Tiny(nn.Module):
            def __init__(self) -> None:
                super().__init__()
                self.emb = nn.Embedding(vocab, d)
                self.blocks = nn.ModuleList(Block() for _ in range(blocks))
                self.ln = nn.LayerNorm(d)
                self.head = nn.Linear(d, vocab)
                self.register_buffer("mask", torch.ones(seq, seq, dtype=torch.bool).triu(1))

            def forward(self, idx):
                x = self.emb(idx)
                for blk in self.blocks:
                    x = blk(x, self.mask)
                return self.head(self.ln(x))

        model = Tiny()
        x, y = torch.randint(0, vocab, (4, seq)), torch.randint(0, vocab, (4, seq))

        def loss_of(m, xb, yb):
            return F.cross_entropy(m(xb).flatten(0, 1), yb.flatten())
    model = model.cuda()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=5, gamma=0.9)
    return model, opt, sched, x, y, loss_of


def _device_calls_mode(device_type: str):
    """A TorchDispatchMode counting the aten calls on ``device_type`` tensors, nested ones too."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    import emulated_dml
    from emulated_dml._tensor import EmuTensor

    def on_device(t) -> bool:
        return isinstance(t, torch.Tensor) and t.device.type == device_type

    def fallbacks() -> int:
        return sum(emulated_dml.fallback_counts().values())

    class DeviceCalls(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.counts: Counter = Counter()
            self.nested: List[int] = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            leaves = tree_leaves((args, kwargs))
            dev = kwargs.get("device")
            if not any(on_device(t) for t in leaves) and not (
                    dev is not None and torch.device(dev).type == device_type):
                return func(*args, **kwargs)
            self.nested.append(0)
            before = fallbacks()
            try:
                if any(type(t) is EmuTensor for t in leaves):
                    with self:  # the calls the device's kernels make come back here
                        out = EmuTensor.__torch_dispatch__(func, types, args, kwargs)
                else:  # a factory: a leaf
                    out = func(*args, **kwargs)
            finally:
                nested = self.nested.pop()
                if self.nested:
                    self.nested[-1] += 1
            if nested == 0:
                name = func.name()
                if fallbacks() > before:
                    self.counts["fallbacks"] += 1
                    self.counts["fallback_transfers"] += sum(on_device(t) for t in leaves) + \
                        sum(on_device(t) for t in tree_leaves(out))
                elif name in _ALLOCS:
                    self.counts["allocations"] += 1
                elif any(r.alias_info is not None and not r.alias_info.is_write
                         for r in func._schema.returns):
                    self.counts["views"] += 1  # metadata only: no kernel runs
                else:
                    self.counts["launches"] += 1
                    self.counts["op:" + name] += 1
            return out

    return DeviceCalls()


def count_frames(pkg: str, step, steps: int) -> Dict[str, object]:
    """dmlshim's frames per call of ``step`` (``sys.setprofile``'s ``call`` events whose code lies
    in the package ``pkg``), over ``steps`` calls: in total, in device kernels (decompositions,
    guards), and by function (with where it was entered from, outside the shim)."""
    kern = pkg + os.path.join("kernels", "decompositions") + os.sep  # op kernels for the device
    guard_dir = pkg + os.path.join("kernels", "guards") + os.sep
    shim: Counter = Counter()
    kernels = guards = 0

    def profile(frame, event, arg):  # noqa: ARG001
        nonlocal kernels, guards
        if event != "call":
            return
        code = frame.f_code
        fname = code.co_filename
        if not fname.startswith(pkg):
            return  # emulated_dml/ lies beside dmlshim/, not in it
        if fname.startswith(kern):
            kernels += 1
        elif fname.startswith(guard_dir):
            guards += 1
        key = f"{os.path.relpath(fname, pkg)}:{code.co_name}"
        back = frame.f_back
        if back is not None and not back.f_code.co_filename.startswith(pkg):
            # entered from outside the shim: say from where (torch's own code, the script)
            key += f" <- {os.path.basename(back.f_code.co_filename)}:{back.f_code.co_name}"
        shim[key] += 1

    sys.setprofile(profile)
    try:
        for _ in range(steps):
            step()
    finally:
        sys.setprofile(None)
    return {"shim_per_step": sum(shim.values()) / steps, "kernels_per_step": kernels / steps,
            "guards_per_step": guards / steps,
            "functions": {k: v / steps for k, v in shim.most_common()}}


def measure_zoo(device: str, model: str, steps: int, warmup: int) -> Dict[str, object]:
    """Frames per step of a zoo model (benchmarks/zoo/train.py: AdamW, GradScaler,
    ``clip_grad_norm_(..., 1.0)``, the autocast region) with default options, its batches on the
    device already."""
    os.environ["DMLSHIM_DISABLE"] = "1"  # import only; install() below
    sys.path.insert(0, REPO)
    import importlib.util

    import torch

    import dmlshim

    dmlshim.install(device=device)
    pkg = os.path.dirname(os.path.abspath(dmlshim.__file__)) + os.sep
    spec = importlib.util.spec_from_file_location(
        "zoo_train", os.path.join(REPO, "benchmarks", "zoo", "train.py"))
    zoo = importlib.util.module_from_spec(spec)
    assert spec.loader is not None
    spec.loader.exec_module(zoo)
    torch.set_num_threads(1)
    torch.manual_seed(0)
    task = zoo.MODELS[model]()
    task.model = task.model.to("cuda").train()
    opt = torch.optim.AdamW(task.model.parameters(), lr=task.lr, weight_decay=0.01)
    scaler = torch.amp.GradScaler("cuda")
    g = torch.Generator().manual_seed(1)
    dev = next(task.model.parameters()).device
    batches = [zoo.to_device(task.batch(g), dev) for _ in range(warmup + steps)]
    for batch in batches[:warmup]:
        zoo.train_step(task, opt, scaler, batch)
    rest = iter(batches[warmup:])
    out: Dict[str, object] = {"device": device, "model": model, "torch": torch.__version__,
                              "steps": steps,
                              "parameters": sum(1 for _ in task.model.parameters())}
    out["plain"] = count_frames(pkg, lambda: zoo.train_step(task, opt, scaler, next(rest)), steps)
    return out


def measure(device: str, workload: str, steps: int, warmup: int, emulator_memory: str = "",
            count: bool = False) -> Dict[str, object]:
    os.environ["DMLSHIM_DISABLE"] = "1"  # import only; install() below
    sys.path.insert(0, REPO)
    import torch

    import dmlshim

    dmlshim.install(device=device, emulator_memory=emulator_memory)
    pkg = os.path.dirname(os.path.abspath(dmlshim.__file__)) + os.sep
    torch.set_num_threads(1)
    model, opt, sched, x_host, y_host, loss_of = build(workload)
    x_dev, y_dev = x_host.cuda(), y_host.cuda()

    def step(move: bool) -> None:
        if move:
            x, y = x_host.cuda(), y_host.to("cuda")
            if x.is_floating_point():
                x = x + torch.zeros(1, device="cuda")
            else:
                x = x + torch.zeros(1, device="cuda", dtype=x.dtype)
        else:
            x, y = x_dev, y_dev
        opt.zero_grad(set_to_none=True)
        loss = loss_of(model, x, y)
        loss.backward()
        opt.step()
        sched.step()

    out: Dict[str, object] = {"device": device, "workload": workload, "torch": torch.__version__,
                              "steps": steps,
                              "parameters": sum(1 for _ in model.parameters())}
    for kind in ("plain", "moves"):
        for _ in range(warmup):
            step(kind == "moves")
        out[kind] = count_frames(pkg, lambda kind=kind: step(kind == "moves"), steps)
    moves = out["moves"]["shim_per_step"] - out["plain"]["shim_per_step"]  # type: ignore[index]
    out["per_entry_point_call"] = moves / MOVES_PER_STEP
    if count:
        mode = _device_calls_mode(torch.device(x_dev.device).type)
        with mode:
            for _ in range(steps):
                step(False)
        out["device_calls"] = {k: v / steps for k, v in sorted(mode.counts.items())}
    return out


def _run_zoo(device: str, model: str, steps: int, warmup: int) -> Dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    cmd = [sys.executable, __file__, "--one", device, "--zoo", "--zoo-model", model, "--json",
           "--steps", str(steps), "--warmup", str(warmup)]
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def zoo_table(a) -> None:
    print("| model | params | shim frames / step | limit | of them device kernels "
          "| largest sources |")
    print("|---|---:|---:|---:|---:|---|")
    for device in a.device or ["emulated-dml"]:
        for model in ZOO:
            r = _run_zoo(device, model, a.steps, a.warmup)
            plain = r["plain"]
            top = ", ".join(f"{name.split(' ')[0]} {n:g}" for name, n in
                            list(plain["functions"].items())[:3])
            print(f"| {model} | {r['parameters']} | {plain['shim_per_step']:g} | "
                  f"{ZOO_LIMITS[model]} | {plain['kernels_per_step'] + plain['guards_per_step']:g}"
                  f" | {top} |")
            for name, n in plain["functions"].items():
                print(f"  {device} {model}: {n:g} x {name}", file=sys.stderr)


def _run(device: str, workload: str, a, env: Dict[str, str], count: bool = False) -> Dict:
    cmd = [sys.executable, __file__, "--one", device, "--workload", workload, "--json",
           "--steps", str(a.steps), "--warmup", str(a.warmup),
           "--emulator-memory", a.emulator_memory] + (["--count"] if count else [])
    proc = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if proc.returncode != 0:
        raise RuntimeError(proc.stderr.strip()[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", action="append", help="DMLSHIM_DEVICE values (repeatable)")
    p.add_argument("--one", help="measure this target in this process")
    p.add_argument("--workload", default="mlp", choices=WORKLOADS)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    p.add_argument("--json", action="store_true")
    p.add_argument("--count", action="store_true",
                   help="also count the aten calls on the device (TorchDispatchMode)")
    p.add_argument("--emulator-memory", default="",
                   help="cap emulated adapters (MiB): an untyped OOM can then happen, as on "
                        "real DirectML")
    p.add_argument("--zoo", action="store_true",
                   help="the model zoo's frames per step (with --one: --zoo-model's)")
    p.add_argument("--zoo-model", choices=ZOO)
    a = p.parse_args()
    if a.one:
        if a.zoo:
            result = measure_zoo(a.one, a.zoo_model, a.steps, a.warmup)
        else:
            result = measure(a.one, a.workload, a.steps, a.warmup, a.emulator_memory, a.count)
        print(json.dumps(result) if a.json else json.dumps(result, indent=1))
        return
    if a.zoo:
        zoo_table(a)
        return
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    raw_env = dict(env, DMLSHIM_DECOMPOSE="off", DMLSHIM_GUARDS="off")
    print("| target | workload | params | shim frames / plain step | of them device kernels "
          "| per entry-point call | device launches / step (wheel's own path) | allocations "
          "| fallbacks (their transfers) |")
    print("|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for device in a.device or ["cpu", "emulated-dml"]:
        for workload in WORKLOADS:
            count = device != "cpu"
            try:
                r = _run(device, workload, a, env, count)
                raw = _run(device, workload, a, raw_env, True) if count else None
            except RuntimeError as exc:
                print(f"| {device} | {workload} | failed: {str(exc).splitlines()[-1:]} |||||||")
                continue
            plain = r["plain"]
            calls = "" if raw is None else (
                f"{r['device_calls'].get('launches', 0):g} "
                f"({raw['device_calls'].get('launches', 0):g})")
            allocs = "" if raw is None else (
                f"{r['device_calls'].get('allocations', 0):g} "
                f"({raw['device_calls'].get('allocations', 0):g})")
            fb = "" if raw is None else (
                f"{r['device_calls'].get('fallbacks', 0):g} "
                f"({raw['device_calls'].get('fallbacks', 0):g}: "
                f"{raw['device_calls'].get('fallback_transfers', 0):g} transfers)")
            print(f"| {device} | {workload} | {r['parameters']} | {plain['shim_per_step']:g} | "
                  f"{plain['kernels_per_step'] + plain['guards_per_step']:g} | "
                  f"{r['per_entry_point_call']:.2f} | {calls} | {allocs} | {fb} |")
            for kind in ("plain", "moves"):
                for name, n in r[kind]["functions"].items():
                    print(f"  {device} {workload} {kind}: {n:g} x {name}", file=sys.stderr)


if __name__ == "__main__":
    main()
