"""CPU fallbacks per training step on the emulated DirectML device, decompositions off vs on.

Every run is a subprocess through the runner (``python -m dmlshim script``) with
``DMLSHIM_DEVICE=emulated-dml`` and ``DMLSHIM_REPORT=<tmp>.json``; the count is the report's
``cpu_fallbacks.total`` (the emulator counts every fallback call, exactly), divided by the
training steps the script printed. Two kinds of workloads:

* optimizer steps: this file run as a CUDA-style worker (``--worker``): an 8-layer MLP on
  ``cuda``, whose forward/backward has no fallback, trained with Adam, AdamW, SGD+momentum or
  RMSprop, so every fallback counted is the optimizer's; and two models of the other layers
  with decompositions (EmbeddingBag, GroupNorm, 1-D upsampling; GRU, LSTMCell; both with a
  BCE loss) trained with SGD+momentum, which has no fallback;
* the test corpus (tests/corpus/{mlp,cnn,lstm_lm,transformer}.py, one epoch): whole scripts,
  including their validation passes.

``--zoo`` trains the model zoo of ``benchmarks/zoo/train.py`` (ResNet-50, ViT, GPT-2, BERT, a
diffusers UNet with its DDPM schedule, YOLOv8n with its own loss, an LSTM LM, a DCGAN, a GRU
seq2seq with attention, a VAE, an ELU/SELU MLP, a Huber regressor, a graph network, a box
detector) for a few steps, each with its CUDA recipe (AdamW, autocast, GradScaler, gradient
clipping), in float32 (``DMLSHIM_AMP=off``) and float16 (``DMLSHIM_AMP=fp16`` with the
emulator's ``autocast`` gap off, so that autocast and the scaler really run on the device as
they do on CUDA; torch-directml 0.2.5 itself cannot autocast, #454), and reports per
steady-state step (the first step, a warm-up, is left out) the distinct ops that fell back,
their calls and the bytes they copied between host and device (the report's
``cpu_fallbacks.bytes``). ``--before-repo`` runs the same with another checkout of dmlshim
(the code before a change) for a before/after table.

``--counting-cost`` times, on the wheel's path (``--prefix``: the WSL harness with a real D3D12
library), what counting every fallback call costs (see :func:`counting_cost`).

``--speed`` also times the optimizer workloads with decompositions on, PyTorch's default
(``foreach``) against ``foreach=False``, alternating runs (steps/s of the timed loop, median).
The emulator runs every op through Python on the CPU: the ratio says how the two paths compare
in op count and Python overhead there, not how fast a GPU runs them.

    python benchmarks/fallbacks.py                 # markdown tables on stdout
    python benchmarks/fallbacks.py --speed --runs 5 --json out.jsonl
    python benchmarks/fallbacks.py --counting-cost --python /root/venv241/bin/python \
        --prefix "python emulated_dml/wsl.py --d3d12 /path/to/libvkd3d-proton-d3d12.so --"
    python benchmarks/fallbacks.py --zoo --python /work/venvs/fw241/bin/python \
        --before-repo /tmp/before --json zoo.jsonl
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(HERE)
CORPUS = os.path.join(REPO, "tests", "corpus")
OPTIMIZERS = ("Adam", "AdamW", "SGD", "RMSprop")
OPTIMIZER_LABELS = {"Adam": "Adam", "AdamW": "AdamW", "SGD": "SGD+momentum", "RMSprop": "RMSprop"}
CORPUS_SCRIPTS = ("mlp", "cnn", "lstm_lm", "transformer")
ZOO = os.path.join(HERE, "zoo", "train.py")
ZOO_MODELS = ("resnet50", "vit", "gpt2", "bert", "unet", "yolov8n", "lstm_lm", "dcgan", "seq2seq",
              "vae", "elu_mlp", "huber", "gnn", "detector")
ZOO_LABELS = {"resnet50": "ResNet-50 (timm)", "vit": "ViT (timm)", "gpt2": "GPT-2 (transformers)",
              "bert": "BERT MLM (transformers)", "unet": "UNet2DModel + DDPM (diffusers)",
              "yolov8n": "YOLOv8n + its loss (ultralytics)", "lstm_lm": "LSTM LM",
              "dcgan": "DCGAN", "seq2seq": "GRU seq2seq + attention", "vae": "VAE (torch.normal)",
              "elu_mlp": "ELU/SELU/CELU MLP", "huber": "Huber + SmoothL1 regressor",
              "gnn": "graph network (index_add_)", "detector": "box detector (clamp.Tensor)"}
# float16 on the emulator: every gap but autocast (torch-directml 0.2.5 cannot autocast, #454)
FP16_GAPS = "fallback,float64,generator"
LOSS_STEP_RE = re.compile(r"^loss \d+ \d+ ")  # training steps, not "loss 1 val ..."


# -- the worker: a CUDA-style training loop ---------------------------------------------------

def _layers_net(recurrent: bool):
    """The other layers with decompositions, each model ending in sigmoid + binary cross-entropy:
    EmbeddingBag, Conv1d, GroupNorm, 1-D nearest upsampling; or (``recurrent``) Embedding,
    GRU, LSTMCell (whose fallback cannot run at all: no CPU kernel)."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class LayersNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.bag = nn.EmbeddingBag(40, 16, mode="mean", padding_idx=0)
            self.conv = nn.Conv1d(16, 16, 3, padding=1)
            self.norm = nn.GroupNorm(4, 16)
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.head = nn.Linear(16, 1)

        def forward(self, tokens):
            b, t = tokens.shape
            x = self.bag(tokens.reshape(-1, 4)).reshape(b, t // 4, 16).transpose(1, 2)
            x = self.up(F.relu(self.norm(self.conv(x))))
            return torch.sigmoid(self.head(x.mean(2))).squeeze(1)

    class RecurrentNet(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(40, 16)
            self.gru = nn.GRU(16, 12, batch_first=True)
            self.cell = nn.LSTMCell(12, 8)
            self.head = nn.Linear(8, 1)

        def forward(self, tokens):
            out, _ = self.gru(self.emb(tokens))
            h, _ = self.cell(out[:, -1])
            return torch.sigmoid(self.head(h)).squeeze(1)

    return RecurrentNet() if recurrent else LayersNet()


def worker(argv: Sequence[str]) -> None:
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=("mlp", "layers", "recurrent"), default="mlp")
    p.add_argument("--optimizer", choices=OPTIMIZERS, required=True)
    p.add_argument("--foreach", choices=("default", "false"), default="default")
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--warmup", type=int, default=3)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if a.model in ("layers", "recurrent"):
        model = _layers_net(a.model == "recurrent").to(device)
        x = torch.randint(0, 40, (32, 16)).to(device)
        y = (torch.rand(32) > 0.5).float().to(device)
        criterion = F.binary_cross_entropy
    else:
        layers: List[nn.Module] = []
        for _ in range(7):
            layers += [nn.Linear(64, 64), nn.ReLU()]
        model = nn.Sequential(*layers, nn.Linear(64, 10)).to(device)
        x = torch.randn(32, 64).to(device)
        y = torch.randint(0, 10, (32,)).to(device)
        criterion = F.cross_entropy
    kwargs: Dict[str, object] = {"lr": 1e-3}
    if a.optimizer == "SGD":
        kwargs.update(lr=0.01, momentum=0.9)
    if a.foreach == "false":
        kwargs["foreach"] = False
    optimizer = getattr(torch.optim, a.optimizer)(model.parameters(), **kwargs)

    def step() -> float:
        optimizer.zero_grad()
        loss = criterion(model(x), y)
        loss.backward()
        t0 = time.perf_counter()
        optimizer.step()
        return time.perf_counter() - t0

    for _ in range(a.warmup):
        step()
    t0 = time.perf_counter()
    in_step = 0.0
    for _ in range(a.steps):
        in_step += step()
    elapsed = time.perf_counter() - t0
    print(f"loss_steps {a.warmup + a.steps}")
    print(f"steps_per_s {a.steps / elapsed:.3f}")
    print(f"optimizer_steps_per_s {a.steps / in_step:.3f}")


# -- the driver -------------------------------------------------------------------------------

def clean_env(**extra: str) -> Dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("DMLSHIM_")}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env.update(extra)
    return env


class Run:
    def __init__(self, proc: subprocess.CompletedProcess, report: Optional[dict]) -> None:
        self.proc = proc
        self.report = report

    @property
    def ok(self) -> bool:
        return self.proc.returncode == 0

    def value(self, key: str) -> Optional[float]:
        for line in self.proc.stdout.splitlines():
            if line.startswith(key + " "):
                return float(line.split()[1])
        return None

    @property
    def steps(self) -> int:
        explicit = self.value("loss_steps")
        if explicit is not None:
            return int(explicit)
        return sum(1 for line in self.proc.stdout.splitlines() if LOSS_STEP_RE.match(line))

    @property
    def measured_steps(self) -> int:
        value = self.value("measured_steps")
        return int(value) if value is not None else self.steps

    @property
    def warmup_fallbacks(self) -> Dict[str, int]:
        for line in self.proc.stdout.splitlines():
            if line.startswith("warmup_fallbacks "):
                return dict(json.loads(line.split(" ", 1)[1]))
        return {}

    @property
    def bytes(self) -> Dict[str, Tuple[int, int]]:
        """{op: (to_host, to_device)} over the counted steps (empty if the report has none)."""
        if self.report is None:
            return {}
        raw = self.report.get("cpu_fallbacks", {}).get("bytes", {})
        return {op: (int(v["to_host"]), int(v["to_device"])) for op, v in raw.items()}

    @property
    def fallbacks(self) -> Dict[str, int]:
        if self.report is None:
            return {}
        return dict(self.report.get("cpu_fallbacks", {}).get("ops", {}))

    @property
    def error(self) -> str:
        lines = [ln for ln in self.proc.stderr.splitlines() if re.match(r"^\w*(Error|Exception)", ln)]
        return lines[-1].split(":", 1)[0] if lines else f"exit status {self.proc.returncode}"


def run_shim(script: str, args: Sequence[str], decompose: str, python: str,
             timeout: float, repo: str = REPO, **options: str) -> Run:
    with tempfile.TemporaryDirectory(prefix="dmlshim-fallbacks-") as tmp:
        report_path = os.path.join(tmp, "report.json")
        env = clean_env(DMLSHIM_DEVICE="emulated-dml", DMLSHIM_DECOMPOSE=decompose,
                        DMLSHIM_REPORT=report_path, **options)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (repo, os.environ.get("PYTHONPATH")) if p)
        proc = subprocess.run([python, "-m", "dmlshim", script, *args], capture_output=True,
                              text=True, env=env, cwd=tmp, timeout=timeout)
        report = None
        if os.path.exists(report_path):
            with open(report_path, encoding="utf-8") as fh:
                report = json.load(fh)
        return Run(proc, report)


def per_step(run: Run) -> str:
    total = sum(run.fallbacks.values())
    steps = run.steps
    if not run.ok:
        return f"fails at step {steps + 1} ({run.error}, after {total} fallback(s))"
    if not steps:
        return f"{total} (no steps)"
    value = total / steps
    return f"{value:.2f}".rstrip("0").rstrip(".") if value else "0"


def ops_cell(run: Run) -> str:
    ops = run.fallbacks
    if not ops:
        return "-"
    return ", ".join(f"`{op}` x{n}" for op, n in sorted(ops.items(), key=lambda kv: -kv[1]))


def table(rows: List[Tuple[str, Run, Run]]) -> str:
    out = ["| workload | fallbacks per step, off | fallbacks per step, on | ops, off (calls) | "
           "ops, on (calls) |",
           "|---|---|---|---|---|"]
    for name, off, on in rows:
        out.append(f"| {name} | {per_step(off)} | {per_step(on)} | {ops_cell(off)} | "
                   f"{ops_cell(on)} |")
    return "\n".join(out)


def _per(value: float, steps: int) -> str:
    per = value / steps if steps else float(value)
    return f"{per:.2f}".rstrip("0").rstrip(".") if per else "0"


def _kib(nbytes: float) -> str:
    if not nbytes:
        return "0"
    return f"{nbytes:.0f} B" if nbytes < 1024 else f"{nbytes / 1024:.1f} KiB"


def zoo_record(model: str, amp: str, side: str, run: Run) -> Dict[str, object]:
    """One zoo run as a JSON row (what the tables are made from; ``--zoo-from`` reads them)."""
    return {"bench": "zoo", "model": model, "amp": amp, "side": side, "ok": run.ok,
            "error": "" if run.ok else run.error, "measured_steps": run.measured_steps,
            "ops": run.fallbacks, "bytes": {k: list(v) for k, v in run.bytes.items()},
            "warmup_ops": run.warmup_fallbacks}


def _ops_text(ops: Dict[str, int], steps: int) -> str:
    return ", ".join(f"`{op.split('::', 1)[-1]}` {_per(n, steps)}"
                     for op, n in sorted(ops.items(), key=lambda kv: (-kv[1], kv[0])))


def zoo_cells(rec: Dict[str, object]) -> Tuple[str, str, str]:
    """(calls per step, ops with calls per step, bytes per step to host / to device)."""
    steps = int(rec["measured_steps"])  # type: ignore[arg-type]
    ops: Dict[str, int] = dict(rec["ops"])  # type: ignore[arg-type]
    if not rec["ok"]:
        return (f"fails ({rec.get('error') or 'error'}, after {sum(ops.values())} fallback(s))",
                "-", "-")
    names = _ops_text(ops, steps) or "-"
    warmup: Dict[str, int] = dict(rec.get("warmup_ops") or {})  # type: ignore[arg-type]
    only_first = {op: n for op, n in warmup.items() if op not in ops}
    if only_first:  # setup work done once, in the first step (e.g. a schedule's cumprod)
        names += f" (first step only: {_ops_text(only_first, 1)})"
    moved = dict(rec.get("bytes") or {})  # type: ignore[arg-type]
    to_host = sum(v[0] for v in moved.values())
    to_device = sum(v[1] for v in moved.values())
    traffic = "0" if not (to_host or to_device) else (
        f"{_kib(to_host / max(steps, 1))} / {_kib(to_device / max(steps, 1))}")
    return _per(sum(ops.values()), steps), names, traffic


def cost_table(records: List[Dict[str, object]], side: str) -> str:
    """Per operator and run of ``side``: calls per steady-state step and the bytes one call
    copies to the host and back, i.e. what each fallback costs where it happens."""
    out = ["| operator | model, precision | calls per step | bytes per call, to host / to device |",
           "|---|---|---|---|"]
    rows = []
    for rec in records:
        if rec["side"] != side or not rec["ok"]:
            continue
        steps = max(int(rec["measured_steps"]), 1)  # type: ignore[arg-type]
        moved = dict(rec.get("bytes") or {})  # type: ignore[arg-type]
        for op, n in dict(rec["ops"]).items():  # type: ignore[arg-type]
            host, device = moved.get(op, (0, 0))
            precision = "float16" if rec["amp"] == "fp16" else "float32"
            rows.append((op, ZOO_MODELS.index(str(rec["model"])), rec["amp"] != "fp16",
                         f"| `{op}` | {ZOO_LABELS[str(rec['model'])]}, {precision} | "
                         f"{_per(n, steps)} | {_kib(host / n)} / {_kib(device / n)} |"))
    if not rows:
        return f"No operator fell back in a steady-state step of any zoo run ({side})."
    return "\n".join(out + [r[-1] for r in sorted(rows)])


def zoo_tables(records: List[Dict[str, object]]) -> str:
    """The before/after table (one row per model and precision) and a cost table per side."""
    sides = [side for side in ("before", "after") if any(r["side"] == side for r in records)]
    head, rule = "| model | precision |", "|---|---|"
    for side in sides:
        head += (f" {side}: fallback calls per step | {side}: ops (calls per step) | "
                 f"{side}: bytes per step, to host / to device |")
        rule += "---|---|---|"
    out = [head, rule]
    index = {(r["model"], r["amp"], r["side"]): r for r in records}
    for model in ZOO_MODELS:
        for amp in ("off", "fp16"):
            if not any((model, amp, side) in index for side in sides):
                continue
            row = f"| {ZOO_LABELS[model]} | {'float32' if amp == 'off' else 'float16 + GradScaler'} |"
            for side in sides:
                rec = index.get((model, amp, side))
                row += " {} | {} | {} |".format(*zoo_cells(rec)) if rec else " - | - | - |"
            out.append(row)
    costs = [f"\nCost of each fallback, {side}:\n\n{cost_table(records, side)}"
             for side in sides]
    return "\n".join(out) + "\n" + "\n".join(costs)


def zoo(args: argparse.Namespace, emit) -> str:
    sides = [("after", REPO)]
    if args.before_repo:
        sides.insert(0, ("before", os.path.abspath(args.before_repo)))
    records: List[Dict[str, object]] = []
    for model in args.zoo:
        for amp in ("off", "fp16"):
            options = {"DMLSHIM_AMP": amp}
            if amp == "fp16":
                options["DMLSHIM_EMULATOR_GAPS"] = FP16_GAPS
            for side, repo in sides:
                run = run_shim(ZOO, ["--model", model, "--steps", str(args.zoo_steps)], "on",
                               args.python, args.timeout, repo=repo, **options)
                if not run.ok:
                    sys.stderr.write(f"{model} {amp} {side}: {run.proc.stderr[-1500:]}\n")
                elif run.value("scaler_enabled") != (1.0 if amp == "fp16" else 0.0):
                    raise RuntimeError(f"{model} {amp}: the scaler is not what DMLSHIM_AMP={amp} "
                                       "should give (float16 did not run?)")
                rec = zoo_record(model, amp, side, run)
                emit(rec)
                records.append(rec)
                print(f"{model} {amp} {side}: " + " | ".join(zoo_cells(rec)), file=sys.stderr,
                      flush=True)
    return zoo_tables(records)


def speed(args: argparse.Namespace, emit) -> str:
    out = ["| optimizer | default (foreach), steps/s | foreach=False, steps/s | "
           "optimizer.step() only: foreach / foreach=False, steps/s |",
           "|---|---|---|---|"]
    me = os.path.abspath(__file__)
    for name in args.optimizers:
        results: Dict[str, List[Tuple[float, float]]] = {"default": [], "false": []}
        for i in range(args.runs):
            order = ("default", "false") if i % 2 == 0 else ("false", "default")
            for mode in order:
                run = run_shim(me, ["--worker", "--optimizer", name, "--foreach", mode,
                                    "--steps", str(args.speed_steps)], "on", args.python,
                               args.timeout)
                if not run.ok:
                    raise RuntimeError(f"{name} foreach={mode} failed:\n{run.proc.stderr[-2000:]}")
                results[mode].append((run.value("steps_per_s") or 0.0,
                                      run.value("optimizer_steps_per_s") or 0.0))
        med = {m: (_median([v[0] for v in r]), _median([v[1] for v in r]))
               for m, r in results.items()}
        emit({"bench": "foreach_speed", "optimizer": name, "runs": args.runs,
              "default": results["default"], "foreach_false": results["false"]})
        out.append(f"| {OPTIMIZER_LABELS[name]} | {med['default'][0]:.1f} | {med['false'][0]:.1f} "
                   f"| {med['default'][1]:.1f} / {med['false'][1]:.1f} |")
    return "\n".join(out)


def _median(values: List[float]) -> float:
    values = sorted(values)
    mid = len(values) // 2
    return values[mid] if len(values) % 2 else (values[mid - 1] + values[mid]) / 2


# -- what counting every fallback call costs on the wheel's path ------------------------------

def cost_worker(argv: Sequence[str]) -> None:
    """Microseconds per call of four device ops without a fallback, of one op with one CPU
    fallback (``F.huber_loss``, decompositions off), and of a CPU op that reaches one of torch's
    own warn-once sites, with the shim counting every fallback call
    (a report asked for: ``warn_always`` on) and not (``warn_always`` off, as without a report:
    after its one warning the wheel's warn-once site does nothing). The two alternate in this
    one process, ``rounds`` times; the least time of each is kept (a shared machine's noise only
    adds time)."""
    import torch
    import torch.nn.functional as F

    calls, rounds = (int(a) for a in argv) if argv else (300, 7)
    x = torch.randn(64, 64, device="cuda")
    t = torch.randn(64, 64, device="cuda")
    xc, wc = torch.randn(1, 1, 8), torch.randn(1, 1, 2)  # on the CPU
    work = {"clean": lambda: ((x * 1.5 + t).relu() - t).sum(),
            "fallback": lambda: F.huber_loss(x, t),
            # one of torch's own TORCH_WARN_ONCE sites (shown once per source line either way)
            "warn-once": lambda: F.conv1d(xc, wc, padding="same").sum()}
    best: Dict[str, float] = {}
    for _ in range(rounds):
        for name, fn in work.items():
            for counted in (False, True):
                torch.set_warn_always(counted)
                fn().item()
                start = time.perf_counter()
                for _ in range(calls):
                    r = fn()
                r.item()  # waits for the queued work
                key = f"{name} {'counted' if counted else 'first-warning'}"
                us = (time.perf_counter() - start) / calls * 1e6
                best[key] = min(best.get(key, us), us)
    torch.set_warn_always(True)
    print("cost " + json.dumps(best))


def counting_cost(args: argparse.Namespace) -> str:
    """The table of :func:`cost_worker`, run under the shim with a report (``--prefix``: under
    another command, e.g. the WSL harness with a real D3D12 library)."""
    import shlex

    me = os.path.abspath(__file__)
    with tempfile.TemporaryDirectory(prefix="dmlshim-cost-") as tmp:
        report_path = os.path.join(tmp, "report.json")
        env = clean_env(DMLSHIM_DEVICE=args.device, DMLSHIM_DECOMPOSE="off",
                        DMLSHIM_GUARDS=args.guards, DMLSHIM_REPORT=report_path)
        cmd = shlex.split(args.prefix) + [args.python, "-m", "dmlshim", me, "--cost-worker",
                                          str(args.cost_calls), str(args.runs)]
        proc = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=tmp,
                              timeout=args.timeout)
        line = [s for s in proc.stdout.splitlines() if s.startswith("cost ")]
        if proc.returncode != 0 or not line:
            raise SystemExit(f"cost worker failed:\n{proc.stderr[-2000:]}")
        best = json.loads(line[0][5:])
        with open(report_path, encoding="utf-8") as fh:
            counted = json.load(fh)["cpu_fallbacks"]
    rows = ["| work | warn_always off (first-warning): us/call | every call counted: us/call |",
            "|---|---|---|"]
    for name, label in (("clean", "4 device ops, no fallback"),
                        ("fallback", "F.huber_loss: 1 CPU fallback"),
                        ("warn-once", "CPU conv1d, padding='same', even kernel: torch's own "
                                      "TORCH_WARN_ONCE site")):
        rows.append(f"| {label} | {best[name + ' first-warning']:.1f} | "
                    f"{best[name + ' counted']:.1f} |")
    rows.append(f"\nthe report: counting {counted['counting']}, ops {counted['ops']}")
    return "\n".join(rows)


def main(argv: Optional[Sequence[str]] = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--worker"]:
        worker(argv[1:])
        return
    if argv[:1] == ["--cost-worker"]:
        cost_worker(argv[1:])
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--optimizers", nargs="*", default=list(OPTIMIZERS), choices=OPTIMIZERS)
    p.add_argument("--corpus", nargs="*", default=list(CORPUS_SCRIPTS), choices=CORPUS_SCRIPTS)
    p.add_argument("--steps", type=int, default=10, help="optimizer steps per counting run")
    p.add_argument("--no-layers", dest="layers", action="store_false",
                   help="skip the workload of the other decomposed layers")
    p.add_argument("--speed", action="store_true", help="also time foreach vs foreach=False")
    p.add_argument("--speed-steps", type=int, default=30)
    p.add_argument("--runs", type=int, default=3, help="alternating timing runs per side")
    p.add_argument("--python", default=sys.executable, help="interpreter to run the scripts")
    p.add_argument("--timeout", type=float, default=900)
    p.add_argument("--json", default=None, help="append one JSON line per result here")
    p.add_argument("--counting-cost", action="store_true",
                   help="only time a call with and without every fallback counted (see "
                        "counting_cost); --device, --prefix, --guards, --cost-calls")
    p.add_argument("--device", default="auto", help="DMLSHIM_DEVICE of --counting-cost")
    p.add_argument("--guards", default="on", help="DMLSHIM_GUARDS of --counting-cost")
    p.add_argument("--prefix", default="", help="command the --counting-cost worker runs under")
    p.add_argument("--cost-calls", type=int, default=300, help="calls per timing (--runs: rounds)")
    p.add_argument("--zoo", nargs="*", default=None, choices=ZOO_MODELS,
                   help="train the model zoo (all models if none named) instead of the "
                        "workloads above")
    p.add_argument("--zoo-steps", type=int, default=4, help="steps per zoo run (1 warm-up)")
    p.add_argument("--before-repo", default=None,
                   help="a checkout of dmlshim to run the zoo with for the 'before' columns")
    p.add_argument("--zoo-from", default=None,
                   help="print the zoo tables from the JSON rows of an earlier --zoo --json run")
    args = p.parse_args(argv)

    def emit(row: Dict[str, object]) -> None:
        if args.json:
            with open(args.json, "a", encoding="utf-8") as fh:
                fh.write(json.dumps(row) + "\n")

    if args.counting_cost:
        print(counting_cost(args))
        return
    if args.zoo_from:
        with open(args.zoo_from, encoding="utf-8") as fh:
            rows = [json.loads(line) for line in fh if line.strip()]
        print(zoo_tables([r for r in rows if r.get("bench") == "zoo"]))
        return
    version = subprocess.run([args.python, "-c", "import torch; print(torch.__version__)"],
                             capture_output=True, text=True).stdout.strip()
    if args.zoo is not None:
        args.zoo = args.zoo or list(ZOO_MODELS)
        print(f"CPU fallbacks per training step of the model zoo, emulated-dml, torch {version}, "
              f"{args.zoo_steps - 1} steady-state steps after a warm-up\n")
        print(zoo(args, emit))
        return
    me = os.path.abspath(__file__)
    rows: List[Tuple[str, Run, Run]] = []
    for name in args.optimizers:
        runs = [run_shim(me, ["--worker", "--optimizer", name, "--steps", str(args.steps)],
                         mode, args.python, args.timeout) for mode in ("off", "on")]
        rows.append((f"{OPTIMIZER_LABELS[name]} step (8-layer MLP)", *runs))
    if args.layers:
        for model, label in (("layers", "EmbeddingBag, GroupNorm, Upsample (1-D), BCE"),
                             ("recurrent", "GRU, LSTMCell, BCE")):
            runs = [run_shim(me, ["--worker", "--model", model, "--optimizer", "SGD",
                                  "--steps", str(args.steps)], mode, args.python, args.timeout)
                    for mode in ("off", "on")]
            rows.append((f"{label}: training step with SGD+momentum", *runs))
    for script in args.corpus:
        path = os.path.join(CORPUS, script + ".py")
        runs = [run_shim(path, ["--epochs", "1"], mode, args.python, args.timeout)
                for mode in ("off", "on")]
        rows.append((f"corpus `{script}.py` (1 epoch)", *runs))
    for name, off, on in rows:
        emit({"bench": "fallbacks", "workload": name, "torch": version,
              "off": {"ok": off.ok, "steps": off.steps, "ops": off.fallbacks},
              "on": {"ok": on.ok, "steps": on.steps, "ops": on.fallbacks}})
    print(f"CPU fallbacks per training step, emulated-dml, torch {version} "
          f"(DMLSHIM_DECOMPOSE=off vs on)\n")
    print(table(rows))
    if args.speed:
        print(f"\nOptimizer path speed on the emulator, DMLSHIM_DECOMPOSE=on, torch {version}, "
              f"median of {args.runs} alternating runs\n")
        print(speed(args, emit))


if __name__ == "__main__":
    main()
