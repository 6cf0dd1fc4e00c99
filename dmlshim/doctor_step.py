"""The doctor's training step: one step of a small CNN on ``cuda`` under the shim, against the CPU.

A matmul and a sum work on adapters where most training kernels fail, so the doctor trains:
conv2d, training-mode batch norm, ReLU, a linear layer, cross-entropy, backward and an AdamW
step, on ``cuda`` the way a script does (``import dmlshim`` with the options in force: guards,
decompositions, float64 policy, ...), and the same step on the CPU. The loss, every gradient,
the batch-norm running statistics and the updated weights must agree within :data:`RTOL` of
each tensor's scale: float32 on a software or a hardware adapter does (reduction order,
fused kernels: about 1e-6), a wrong kernel does not (a wrong batch-norm backward, statistics
not updated, ``grad_output[0]`` used for every row: differences of order 1). Then a float64 op
on ``cuda``: ``has_float64_support()`` says yes on adapters where every float64 op raises.

It runs in a child process (:func:`run`), like a script: the real wheel's failures include
segfaults and heap aborts (issue 28), and a doctor that dies says nothing. The child announces
each part before it runs it, so a crash still names the part (and the signal).
"""

from __future__ import annotations

import faulthandler
import json
import os
import re
import signal
import subprocess
import sys
import traceback
from dataclasses import dataclass, field
from typing import Any, Dict, List, Tuple

from dmlshim import config as cfgmod
from dmlshim import target as targetmod

RTOL = 2e-3  # of each tensor's scale, its largest |CPU value|
ATOL = 1e-6  # for tensors whose values are all about zero
TIMEOUT_S = 300.0  # a first run on a software adapter compiles every shader
MARK = "dmlshim-doctor-step"
F64_EXPECTED = 13.5  # (arange(6, float64) * 0.5 + 1).sum()

_PKG_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep
_REPO_DIR = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The layers of the model, in order, with the name each part of the step is reported under.
LAYERS = ("conv2d", "batch_norm (training mode)", "relu", "flatten", "linear")
# The parameters' names in the report, in the order backward reaches them: the first one that
# differs names the backward op at fault.
PARAMS = (("4.weight", "linear weight"), ("4.bias", "linear bias"),
          ("1.weight", "batch_norm weight"), ("1.bias", "batch_norm bias"),
          ("0.weight", "conv2d weight"), ("0.bias", "conv2d bias"))
BUFFERS = (("1.running_mean", "batch_norm running_mean"),
           ("1.running_var", "batch_norm running_var"))


@dataclass
class Mismatch:
    what: str  # "loss", "gradient of batch_norm weight", ...
    part: str  # the part of the step it points at
    err: float  # largest |device - CPU|
    scale: float  # largest |CPU|

    def text(self) -> str:
        return f"{self.what}: largest |device - CPU| {self.err:.3g} where the CPU's values " \
               f"reach {self.scale:.3g}"


@dataclass
class StepResult:
    ok: bool
    device: str = ""  # where "cuda" went in the child (privateuseone:0, cpu)
    failed: str = ""  # the part that raised, crashed or differs
    error: str = ""  # "RuntimeError: ..." or "the process died with signal 11 (SIGSEGV)"
    shim_site: str = ""  # "dmlshim/patches/x.py:12 in f" when a dmlshim frame raised
    mismatches: List[Mismatch] = field(default_factory=list)
    largest: float = 0.0  # the largest difference relative to its tensor's scale (see _rel)
    float64: str = ""  # "float64" (ran), "float32" (downcast by the shim), "error: ...", "wrong: ..."
    crashed: bool = False  # the child died (a signal, an exit status) without a result


# -- the parent: run the child, read what it said ---------------------------------------------

def child_env(cfg: cfgmod.Config) -> Dict[str, str]:
    """The environment of a script run with ``cfg``: the options as variables, logging quiet,
    no report and no check mode (the doctor compares itself); this dmlshim first on the path."""
    keep = {targetmod.PROBE_CACHE_ENV, targetmod.DXG_PATH_ENV}
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(cfgmod.ENV_PREFIX) or k in keep}
    values = {**cfg.values, "log": "warning", "report": "", "check": "off", "disable": "0"}
    env.update(cfgmod.Config(values).as_env())
    env["PYTHONPATH"] = os.pathsep.join(p for p in (_REPO_DIR, os.environ.get("PYTHONPATH"))
                                        if p)
    return env


def run(cfg: cfgmod.Config, timeout: float = TIMEOUT_S) -> StepResult:
    """Run the step in a child process with ``cfg``'s options; what happened."""
    code = "import dmlshim.doctor_step as s; s.child_main()"
    try:
        proc = subprocess.run([sys.executable, "-c", code], env=child_env(cfg),
                              capture_output=True, text=True, timeout=timeout,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as err:
        out = err.stdout.decode() if isinstance(err.stdout, bytes) else (err.stdout or "")
        part = _last_part(out)
        # (not "crashed": trying other settings would wait as long again, each)
        return StepResult(False, failed=part or "starting", error=f"it hung for {timeout:.0f} s")
    except OSError as err:
        return StepResult(False, failed="starting", error=f"the child process could not "
                                                          f"start: {err}")
    return parse(proc.stdout, proc.stderr, proc.returncode)


def _lines(stdout: str, kind: str) -> List[str]:
    prefix = f"{MARK} {kind} "
    return [line[len(prefix):] for line in stdout.splitlines() if line.startswith(prefix)]


def _last_part(stdout: str) -> str:
    parts = _lines(stdout, "part")
    return json.loads(parts[-1]) if parts else ""


def parse(stdout: str, stderr: str, returncode: int) -> StepResult:
    """The child's output -> a StepResult (also when it died halfway)."""
    results = _lines(stdout, "result")
    if results:
        data = json.loads(results[-1])
        data["mismatches"] = [Mismatch(**m) for m in data["mismatches"]]
        return StepResult(**data)
    part = _last_part(stdout) or "starting"
    device = [json.loads(d) for d in _lines(stdout, "device")]
    if returncode < 0:
        try:
            name = signal.Signals(-returncode).name
        except ValueError:
            name = "unknown signal"
        why = f"the process died with signal {-returncode} ({name})"
    else:
        why = f"the process exited with status {returncode}"
    lines = [line.strip() for line in stderr.strip().splitlines() if line.strip()]
    fatal = [line for line in lines if line.startswith("Fatal Python error:")]
    last = fatal[:1] or [line for line in lines if not line.startswith("File ")][-1:]
    return StepResult(False, device=device[0] if device else "", failed=part,
                      shim_site=_crash_site(lines), crashed=True,
                      error=why + (f" ({last[0]})" if last else ""))


_FRAME_RE = re.compile(r'^File "([^"]+)", line (\d+) in (\S+)')


def _crash_site(stderr_lines: List[str]) -> str:
    """The innermost dmlshim frame of faulthandler's dump (most recent call first)."""
    for line in stderr_lines:
        match = _FRAME_RE.match(line)
        if match is not None:
            site = _site(match.group(1), int(match.group(2)), match.group(3))
            if site:
                return site
    return ""


def _site(filename: str, lineno: int, func: str) -> str:
    path = os.path.abspath(filename)
    if path.startswith(_PKG_DIR) and path != os.path.abspath(__file__):
        return f"dmlshim/{path[len(_PKG_DIR):]}:{lineno} in {func}"
    return ""


# -- the child: the step itself ---------------------------------------------------------------

def _emit(kind: str, payload: Any) -> None:
    print(f"{MARK} {kind} {json.dumps(payload)}", flush=True)


def _model_and_batch():
    import torch
    import torch.nn as nn

    torch.manual_seed(0)  # (a process of its own: nobody else's random state)
    model = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                          nn.Flatten(), nn.Linear(4 * 6 * 6, 5))
    with torch.no_grad():  # batch norm's affine parameters away from 1 and 0
        model[1].weight.uniform_(0.5, 1.5)
        model[1].bias.uniform_(-0.5, 0.5)
    x = torch.randn(8, 3, 6, 6)
    y = torch.randint(0, 5, (8,))
    return model, x, y


class _Backward:
    """Which autograd node is running: a hook before and after each node of the graph, so an
    exception in backward names the op (NativeBatchNormBackward0 of batch_norm)."""

    def __init__(self, part) -> None:
        self.labels: Dict[Any, str] = {}
        self.running: List[Any] = []
        self.part = part  # announces each node, so that a crash names it too

    def label(self, node: Any, name: str) -> None:
        if node is not None and node not in self.labels:
            self.labels[node] = name

    def attach(self, root: Any, loss_label: str) -> None:
        seen, todo = set(), [root]
        while todo:
            node = todo.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            self.label(node, loss_label)  # nodes no layer claimed: the loss's
            node.register_prehook(lambda grads, n=node: self._start(n))
            node.register_hook(lambda gin, gout, n=node: self.running.remove(n))
            todo.extend(next_node for next_node, _ in node.next_functions)

    def _start(self, node: Any) -> None:
        self.running.append(node)
        self.part(self.describe(node))

    def failing(self) -> str:
        return self.describe(self.running[-1]) if self.running else "backward"

    def describe(self, node: Any) -> str:
        name = node.name()
        if name.endswith("AccumulateGrad"):
            return "backward (accumulating a parameter's gradient)"
        return f"{self.labels.get(node, 'backward')} backward ({name})"


def _step(model, x, y, device: str, part) -> Dict[str, Any]:
    """One training step on ``device``; the results, on the CPU."""
    import torch
    import torch.nn.functional as F

    part("copy the model and the batch to the device")
    model = model.to(device)
    x, y = x.to(device), y.to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, eps=1e-3, weight_decay=1e-2)
    model.train()
    tracker = _Backward(part)
    h = x
    for label, layer in zip(LAYERS, model):
        part(f"{label} forward")
        h = layer(h)
        tracker.label(h.grad_fn, label)
    part("cross_entropy forward")
    loss = F.cross_entropy(h, y)
    part("backward")
    tracker.attach(loss.grad_fn, "cross_entropy")
    try:
        loss.backward()
    except Exception as err:
        err.doctor_part = tracker.failing()  # type: ignore[attr-defined]
        raise
    part("AdamW step")
    opt.step()
    part("copy the results to the CPU")
    out = {"loss": loss.detach().cpu()}
    params = dict(model.named_parameters())
    buffers = dict(model.named_buffers())
    for name, _ in PARAMS:
        out["grad " + name] = params[name].grad.detach().cpu()
        out["param " + name] = params[name].detach().cpu()
    for name, _ in BUFFERS:
        out["buffer " + name] = buffers[name].detach().cpu()
    return out


def _shim_site(err: BaseException) -> str:
    """The innermost frame of the traceback when it is dmlshim's (not this module's): a dmlshim
    kernel raised, or a C function it called did. A dmlshim frame further out only passed the
    call on (a guard calling a kernel that raised in Python), and names nothing."""
    frames = traceback.extract_tb(err.__traceback__)
    if not frames:
        return ""
    last = frames[-1]
    return _site(last.filename, last.lineno or 0, last.name)


def _error_text(err: BaseException) -> str:
    text = f"{type(err).__name__}: {err}".strip().splitlines()[0]
    return text if len(text) <= 300 else text[:297] + "..."


def _rel(err: float, scale: float) -> float:
    # relative to the scale, or to ATOL / RTOL for tensors about zero (the gradient of a conv
    # bias before batch norm is zero up to rounding)
    return err / max(scale, ATOL / RTOL)


def compare(dev: Dict[str, Any], ref: Dict[str, Any]) -> Tuple[List[Mismatch], float]:
    """Every result of the device step against the CPU's: (those out of tolerance, in the
    order that points at the op at fault; the largest difference relative to its scale)."""
    items = [("loss", "loss", "cross_entropy forward (or a layer before it)")]
    items += [("grad " + n, f"gradient of {label}", _grad_part(label)) for n, label in PARAMS]
    items += [("buffer " + n, label, "batch_norm forward (training mode)") for n, label in BUFFERS]
    items += [("param " + n, f"updated {label}", "AdamW step") for n, label in PARAMS]
    bad, largest = [], 0.0
    for key, what, part in items:
        a, b = dev[key].double(), ref[key].double()
        if a.shape != b.shape:
            bad.append(Mismatch(f"{what} (shape {tuple(a.shape)}, CPU {tuple(b.shape)})", part,
                                float("inf"), 0.0))
            continue
        err = float((a - b).abs().max()) if a.numel() else 0.0
        scale = float(b.abs().max()) if b.numel() else 0.0
        if err != err:  # NaN somewhere
            err = float("inf")
        largest = max(largest, _rel(err, scale))
        if not err <= RTOL * scale + ATOL:
            bad.append(Mismatch(what, part, err, scale))
    return bad, largest


def _grad_part(label: str) -> str:
    layer = label.split(" ", 1)[0]
    if layer == "linear":
        return "cross_entropy or linear backward"
    return f"{layer} backward" if layer != "batch_norm" else "batch_norm backward (training mode)"


def _float64() -> str:
    import torch

    _emit("part", "float64")
    try:
        x = torch.arange(6, dtype=torch.float64, device="cuda")
        got = float((x * 0.5 + 1).sum().cpu().item())
    except Exception as err:
        return "error: " + _error_text(err)
    if abs(got - F64_EXPECTED) > 1e-6:
        return f"wrong: (arange(6) * 0.5 + 1).sum() gave {got}, expected {F64_EXPECTED}"
    return "float64" if x.dtype == torch.float64 else str(x.dtype).replace("torch.", "")


def child_main() -> None:
    """The child process (``import dmlshim`` already installed the shim from the options)."""
    import copy

    import torch

    faulthandler.enable()  # a crash still tells where (read by parse())
    result = StepResult(False)

    def part(name: str) -> None:
        result.failed = name
        _emit("part", name)

    try:
        part("starting")
        model, x, y = _model_and_batch()
        ref = _step(copy.deepcopy(model), x, y, "cpu", lambda name: None)
        result.device = str(torch.empty(0, device="cuda").device)
        _emit("device", result.device)
        dev = _step(model, x, y, "cuda", part)
        result.mismatches, result.largest = compare(dev, ref)
        result.ok = not result.mismatches
        result.failed = result.mismatches[0].part if result.mismatches else ""
    except Exception as err:  # the diagnosis: which part, what error, whose frame
        result.failed = getattr(err, "doctor_part", result.failed)
        result.error = _error_text(err)
        result.shim_site = _shim_site(err)
    result.float64 = _float64()
    data = {k: v for k, v in result.__dict__.items() if k != "mismatches"}
    data["mismatches"] = [m.__dict__ for m in result.mismatches]
    _emit("result", data)
