"""What the real torch-directml 0.2.5 wheel does differently from the CPU (issue 12), on both
sides: the emulator reproduces it (``DMLSHIM_GUARDS=off`` shows the wheel's behaviour) and
dmlshim's guards give the CPU's result (the default).

One script (FACTS) runs every fact through ``import dmlshim`` three times: on the CPU (the
reference), on ``emulated-dml`` with the default options and on ``emulated-dml`` with
``DMLSHIM_GUARDS=off``; the runs' JSON results are compared mechanically. Facts decided outside
any guard (the once-per-process fallback warning, the channels-last refusal) are checked on the
emulator in this process. The kernel table the emulator models is compared with the installed
wheel's in the torch 2.4.1 lane.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import warnings
from typing import Any, Dict

import pytest
import torch
from helpers import clean_env, describe

import emulated_dml as emulator
from dmlshim.kernels.guards import records
from emulated_dml import _fallback
from emulated_dml._dml_ops import DML_KERNELS_0_2_5

FACTS = r"""
import json, os, sys
import dmlshim  # installs from DMLSHIM_* in the environment
import torch
import torch.nn as nn
import torch.nn.functional as F

dev = "cuda"
out = {}


def enc(t):
    t = t.detach().cpu()
    return {"shape": list(t.shape), "dtype": str(t.dtype),
            "values": t.reshape(-1).tolist() if t.dtype != torch.bool
            else [bool(v) for v in t.reshape(-1).tolist()]}


def leaf(t, device=dev, grad=True):
    # a fresh leaf (on the CPU, .to("cpu") would hand back the same tensor every time)
    return t.to(device).clone().requires_grad_(grad)


def case(name, fn):
    try:
        out[name] = fn()
    except Exception as err:  # the wheel's failures are results here
        out[name] = {"error": f"{type(err).__name__}: {err}"}


torch.manual_seed(0)

# fact 2: eye (#431)
case("eye_n", lambda: enc(torch.eye(3, device=dev)))
case("eye_nm", lambda: enc(torch.eye(2, 4, device=dev)))
# torch.full with a float fill value and no dtype (torch infers the default float dtype)
case("full_float", lambda: {"float": enc(torch.full((2, 3), 1.5, device=dev)),
                            "int": enc(torch.full((2,), 7, device=dev)),
                            "bool": enc(torch.full((2,), True, device=dev)),
                            "dtype": enc(torch.full((2,), 0.25, device=dev,
                                                    dtype=torch.float16))})

# fact 3: float * bool (#686), every spelling
x = torch.tensor([-1.5, 2.0, 0.5, -3.0])
m = x > 0
def mul_forms():
    xd, md = x.to(dev), m.to(dev)
    inplace = xd.clone()
    inplace *= md
    return {"x*m": enc(xd * md), "mul": enc(torch.mul(xd, md)), "m*x": enc(md * xd),
            "x*=m": enc(inplace), "x*2": enc(xd * 2)}
case("mul_bool", mul_forms)
def mul_inplace_broadcast():
    xd = x.to(dev).clone()
    xd *= torch.ones(2, 4, device=dev)  # in place must refuse to grow (an out= kernel would not)
    return enc(xd)
case("mul_inplace_broadcast", mul_inplace_broadcast)

# fact 4: nll_loss / cross_entropy(reduction='none') backward (#739), non-uniform upstream
logits = torch.randn(5, 4)
target = torch.tensor([1, 0, 3, -100, 2])
per_sample = torch.tensor([0.0, 1.0, 2.0, 0.5, 3.0])  # grad_output[0] == 0
keep = torch.tensor([1.0, 0.0, 1.0, 1.0, 0.0])  # masked mean: grad_output[0] != 0
logits2d = torch.randn(2, 3, 2, 2)
target2d = torch.randint(0, 3, (2, 2, 2))
weights2d = torch.rand(2, 2, 2) + 0.5
class_weight = torch.tensor([1.0, 2.0, 0.5, 1.5])

def ce_grads(device):
    res = {}
    for name, fn in {
        "per_sample": lambda lg: (F.cross_entropy(lg, target.to(device), reduction="none")
                                  * per_sample.to(device)).sum(),
        "masked_mean": lambda lg: (F.nll_loss(torch.log_softmax(lg, 1), target.to(device),
                                              weight=class_weight.to(device), reduction="none")
                                   * keep.to(device)).sum() / keep.sum().to(device),
    }.items():
        lg = leaf(logits, device)
        fn(lg).backward()
        res[name] = enc(lg.grad)
    lg = leaf(logits2d, device)
    (F.cross_entropy(lg, target2d.to(device), reduction="none") * weights2d.to(device)).sum().backward()
    res["spatial"] = enc(lg.grad)
    return res
case("nll_none", lambda: ce_grads(dev))

# what the wheel computes: grad_output[0] for every row (on the CPU, for the comparison)
def wheel_nll():
    res = {}
    for name, go, kw in (("per_sample", per_sample, {}),
                         ("masked_mean", keep / keep.sum(), {"weight": class_weight})):
        lg = logits.clone().requires_grad_()
        loss = F.nll_loss(torch.log_softmax(lg, 1), target, reduction="none", **kw)
        loss.backward(torch.full_like(go, float(go[0])))
        res[name] = enc(lg.grad)
    return res
case("nll_none_wheel", wheel_nll)

# fact 5: masked_fill with a uint8 mask (#702)
case("masked_fill_uint8", lambda: enc(x.to(dev).masked_fill(m.to(torch.uint8).to(dev), 7.0)))
case("masked_fill_bool", lambda: enc(x.to(dev).masked_fill(m.to(dev), 7.0)))

# fact 7: reflect padding, (1, 2, 3, 4) on 6x6
img = torch.randn(2, 3, 6, 6)
def pad(name, p):
    xi = leaf(img)
    y = F.pad(xi, p, mode="reflect")
    out[name] = enc(y)
    def grad():
        (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).to(dev)).sum().backward()
        return enc(xi.grad)
    case(name + "_grad", grad)
case("reflect_pad", lambda: pad("reflect_pad", (1, 2, 3, 4)) or out["reflect_pad"])
case("reflect_pad_square", lambda: pad("reflect_pad_square", (2, 2, 2, 2)) or out["reflect_pad_square"])

# fact 11: layer norm backward without a bias
feat = torch.randn(3, 5, 8)
def layer_norm(kw, input_grad=True):
    torch.manual_seed(1)
    ln = nn.LayerNorm(8, **kw)
    with torch.no_grad():
        for p in ln.parameters():
            p.add_(torch.randn_like(p) * 0.1)
    ln = ln.to(dev)
    xi = leaf(feat, grad=input_grad)
    y = ln(xi)
    (y * torch.linspace(-1, 1, 8).to(dev)).sum().backward()
    res = {"out": enc(y)}
    if input_grad:
        res["grad_input"] = enc(xi.grad)
    for name, p in ln.named_parameters():
        res["grad_" + name] = enc(p.grad)
    return res
case("ln_weight_only", lambda: layer_norm({"bias": False}))
case("ln_neither", lambda: layer_norm({"elementwise_affine": False}))
case("ln_weight_input_no_grad", lambda: layer_norm({"bias": False}, input_grad=False))
case("ln_weight_and_bias", lambda: layer_norm({}))

# the wheel's out=/resize_ rules, unique counts, flattened max-pool indices, partial scatter
def out_rules():
    xd = torch.randn(3).to(dev)
    res = {"add_out_empty": enc(torch.add(xd, xd, out=torch.empty(0, device=dev)))}
    for name, fn in {"resize_from_empty": lambda: torch.empty(0, device=dev).resize_((3, 4)),
                     "resize_same_count": lambda: torch.empty(12, device=dev).resize_((3, 4))}.items():
        try:
            res[name] = list(fn().shape)
        except RuntimeError as err:
            res[name] = str(err)
    return res
case("out_rules", out_rules)
ids = torch.tensor([[3, 1, 3], [2, 1, 3]])
case("unique_counts", lambda: [enc(t) for t in torch.unique(ids.to(dev), return_inverse=True,
                                                             return_counts=True)])
case("unique_plain", lambda: enc(torch.unique(ids.to(dev))))
case("unique_inverse", lambda: [enc(t) for t in torch.unique(ids.to(dev), return_inverse=True)])

# the wheel's host-side crashes: flip with a negative dim (segfault), an out= overload called
# from Python (nll_loss_forward.output: dangling tensors, SIGABRT)
def flip_negative():
    xi = leaf(torch.arange(24.0).reshape(2, 3, 4))
    y = torch.flip(xi, [-1, 0])
    (y * torch.arange(24.0).reshape(2, 3, 4).to(dev)).sum().backward()
    return {"out": enc(y), "grad": enc(xi.grad), "hflip": enc(xi.detach().flip(-1))}
case("flip_negative", flip_negative)
def nll_output():
    ld, td = logits.to(dev), torch.tensor([1, 0, 3, 2, 2]).to(dev)
    got = torch.ops.aten.nll_loss_forward.output(
        ld, td, None, 1, -100, output=torch.empty((), device=dev),
        total_weight=torch.empty((), device=dev))
    return enc(got[0])
case("nll_output", nll_output)
pool_in = torch.randn(2, 2, 4, 4)
def max_pool():
    xi = leaf(pool_in)
    y, i = F.max_pool2d(xi, 2, return_indices=True)
    (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).to(dev)).sum().backward()
    return {"indices": enc(i), "grad": enc(xi.grad)}
case("max_pool_indices", max_pool)
case("max_unpool", lambda: enc(F.max_unpool2d(*F.max_pool2d(pool_in.to(dev), 2,
                                                             return_indices=True), 2)))
case("scatter_partial", lambda: enc(torch.zeros(4, 5, device=dev).scatter(
    1, torch.zeros(2, 1, dtype=torch.long, device=dev), 1.0)))
case("scatter_full", lambda: enc(torch.zeros(4, 5, device=dev).scatter(
    1, torch.tensor([[0], [1], [2], [4]], device=dev), 1.0)))
# the batch-norm backward of a float16 input with float32 weights (CUDA autocast's form)
def bn_mixed():
    torch.manual_seed(5)
    xi = leaf(torch.randn(4, 3, 5, 5).half())
    bn = nn.BatchNorm2d(3).to(dev)
    y = bn(xi)
    (y.float() * torch.arange(float(y.numel())).reshape(y.shape).to(dev) / y.numel()).sum().backward()
    return {"out": enc(y.float()), "grad": enc(xi.grad.float()), "grad_dtype": str(xi.grad.dtype),
            "weight_grad": enc(bn.weight.grad), "bias_grad": enc(bn.bias.grad),
            "running_mean": enc(bn.running_mean)}
case("bn_mixed", bn_mixed)
# scatter_add: YOLOv8's form (a partial update of an int8 count) and a full one with gradients
def scatter_add():
    idx = torch.tensor([[[3], [0], [9]], [[3], [3], [1]]]).to(dev)
    ones = torch.ones(2, 3, 1, dtype=torch.int8, device=dev)
    res = {"int8_partial": enc(torch.zeros(2, 3, 10, dtype=torch.int8, device=dev)
                               .scatter_add_(-1, idx, ones))}
    xi, si = leaf(torch.randn(3, 6)), leaf(torch.randn(3, 4))
    ii = torch.tensor([[0, 5, 0, 2], [1, 1, 1, 1], [4, 3, 2, 0]]).to(dev)
    y = xi.scatter_add(1, ii, si)
    (y * torch.arange(18.0).reshape(3, 6).to(dev)).sum().backward()
    res["float_full"] = {"out": enc(y), "grad_self": enc(xi.grad), "grad_src": enc(si.grad)}
    return res
case("scatter_add", scatter_add)
# gather with a negative dim (wrong values), scatter and scatter_add with one (raise)
def gather_scatter_negative():
    xi = leaf(torch.randn(3, 6))
    ii = torch.tensor([[0, 5, 0, 2], [1, 1, 1, 1], [4, 3, 2, 0]]).to(dev)
    res = {"scatter": enc(torch.zeros(3, 6, device=dev).scatter(-1, ii[:, :1], 1.0)),
           "scatter_add": enc(torch.zeros(3, 6, device=dev).scatter_add(
               -1, ii, torch.ones(3, 4, device=dev)))}
    y = xi.gather(-1, ii)
    res["gather"] = enc(y)
    (y * torch.arange(12.0).reshape(3, 4).to(dev)).sum().backward()
    res["grad"] = enc(xi.grad)
    return res
case("gather_scatter_negative", gather_scatter_negative)
def gather_negative_forward():
    return enc(torch.arange(18.0).reshape(3, 6).to(dev).gather(
        -1, torch.tensor([[0, 5], [1, 1], [4, 3]]).to(dev)))
case("gather_negative_forward", gather_negative_forward)
# a float number minus a device tensor (its float64 wrapped scalar is refused)
def rsub_number():
    xi = leaf(torch.tensor([0.25, 0.5, 2.0]))
    y = 1.0 - xi
    (y * y).sum().backward()
    return {"out": enc(y), "grad": enc(xi.grad), "half": enc(1.0 - xi.detach().half()),
            "int_tensor": enc(1.5 - torch.tensor([1, 2]).to(dev)),
            "alpha": enc(torch.rsub(xi.detach(), 3.0, alpha=2)), "int_number": enc(1 - xi.detach())}
case("rsub_number", rsub_number)
# a non-blocking copy to the host (GradScaler.update); split/chunk of an empty tensor
case("to_host_non_blocking", lambda: {
    "float": enc(torch.arange(6.0).to(dev).to("cpu", non_blocking=True)),
    "int": enc(torch.arange(3).to(dev).to(device="cpu", non_blocking=True))})
def split_empty():
    xi = leaf(torch.zeros(0, 8, 4))
    parts = xi.chunk(4, -1)
    sum(p.sum() for p in parts).backward()
    return {"chunk": [enc(p) for p in parts], "grad": enc(xi.grad),
            "split": [enc(p) for p in xi.detach().split([1, 3], -1)]}
case("split_empty", split_empty)
def sub_empty():
    xi, yi = leaf(torch.zeros(0, 1)), leaf(torch.zeros(0, 1))
    z = xi - yi
    z.sum().backward()
    inplace = torch.zeros(0, 1).to(dev)
    inplace.sub_(torch.ones(0, 1).to(dev))
    return {"sub": enc(z), "grad": enc(yi.grad), "broadcast": enc(xi.detach() - torch.ones(1, 3).to(dev)),
            "in_place": enc(inplace), "values": enc(torch.arange(3.0).to(dev) - torch.ones(3).to(dev))}
case("sub_empty", sub_empty)
def inplace_alias():
    # float32 add/sub written into a tensor that shares the other operand's memory (HF
    # Trainer's tr_loss -= tr_loss); distinct operands and float16 are right on the wheel
    def x():
        return torch.tensor([1.0, 2.0, 3.0, 4.0]).to(dev)
    a = x(); a -= a
    b = x(); b.sub_(b.detach(), alpha=2)
    d = x(); d.sub_(d.view(4))
    e = x(); torch.sub(x() * 10, e, out=e)
    f = x(); f.add_(x(), alpha=-1)
    g = x().half(); g -= g
    xi = leaf(torch.tensor([1.0, 2.0, 3.0, 4.0]))
    y = xi * 3
    y -= y.detach()
    (y * torch.arange(4.0).to(dev)).sum().backward()
    overlap = x()
    try:
        overlap.sub_(overlap[0])
        refused = enc(overlap)
    except RuntimeError as err:
        refused = str(err).split(".")[0]
    return {"isub_self": enc(a), "sub_detach_alpha": enc(b),
            "sub_view": enc(d), "sub_out_other": enc(e), "add_distinct_alpha": enc(f),
            "half_self": enc(g), "grad_out": enc(y), "grad": enc(xi.grad),
            "partial_overlap": refused}
case("inplace_alias", inplace_alias)
def add_alias_alpha():
    # add_ with an alpha is wrong the same way, and not guarded (docs/known-directml-bugs.md)
    c = torch.tensor([1.0, 2.0, 3.0, 4.0]).to(dev)
    c.add_(c, alpha=-1)
    return enc(c)
case("add_alias_alpha", add_alias_alpha)
def gather_empty():
    xi = leaf(torch.randn(3, 16))
    y = torch.log_softmax(xi, 1).gather(1, torch.zeros(3, 0, dtype=torch.long).to(dev))
    (y.sum() + xi.sum()).backward()
    return {"out": enc(y), "grad": enc(xi.grad)}
case("gather_empty", gather_empty)
# a device tensor given where a number goes: torch's argument parser reads it holding the GIL
# (on the wheel that can deadlock: YOLOv8's torch.zeros(b, counts.max(), n)); item() does not
def readback_gil():
    t = torch.tensor([3, 1]).to(dev).max()
    return {"zeros": list(torch.zeros(2, t, device=dev).shape),
            "full": enc(torch.full((2,), t, device=dev)), "item": t.item(), "int": int(t),
            "float": float(t)}
case("readback_gil", readback_gil)
# torch.cat with an empty operand (ultralytics' NMS: a zero-width mask beside the boxes)
def cat_empty():
    xi = leaf(torch.arange(12.0).reshape(3, 4))
    y = torch.cat((xi, torch.zeros(3, 0).to(dev), xi[:, :1] * 2), 1)
    (y * y).sum().backward()
    res = {"out": enc(y), "grad": enc(xi.grad),
           "legacy": enc(torch.cat((torch.zeros(0).to(dev), torch.ones(2, 2).to(dev)))),
           "promoted": enc(torch.cat((torch.ones(2, 1).half().to(dev), torch.zeros(2, 0).to(dev)), 1)),
           "all_empty": enc(torch.cat((torch.zeros(2, 0).to(dev), torch.zeros(2, 0).to(dev)), 1))}
    try:
        torch.cat((torch.ones(3, 2).to(dev), torch.zeros(4, 0).to(dev)), 1)
    except RuntimeError as err:
        res["mismatch"] = str(err)
    return res
case("cat_empty", cat_empty)
# an empty slice past the front (ultralytics' validation: x[:, 6:] of its (n, 6) detections)
def slice_empty():
    xi = leaf(torch.arange(12.0).reshape(3, 4))
    parts = {"end": xi[:, 4:], "mid": xi[:, 2:2], "dim0": xi[3:], "step": xi[:, 4::2],
             "neg": xi[:, -1:-1], "front": xi[:, :0], "normal": xi[:, 1:3], "tail": xi[1:, -2:]}
    sum((p * p).sum() for p in parts.values()).backward()
    return {**{k: enc(v) for k, v in parts.items()}, "grad": enc(xi.grad)}
case("slice_empty", slice_empty)

# seen on the software adapter (opt-in bug switches in the emulator): every guard is right
# with and without them; loss and gradient against the CPU
def ce_ignore():
    res = {}
    torch.manual_seed(3)
    for classes in (5, 256):
        logits_c = torch.randn(6, classes)
        for ignore in (-100, -1):
            tgt = torch.randint(0, classes, (6,))
            tgt[1] = tgt[4] = ignore
            weight_c = torch.rand(classes)
            for reduction in ("mean", "sum", "none"):
                for weighted in (False, True):
                    lg = leaf(logits_c)
                    loss = F.cross_entropy(lg, tgt.to(dev), ignore_index=ignore,
                                           reduction=reduction,
                                           weight=weight_c.to(dev) if weighted else None)
                    (loss * torch.linspace(0.5, 1.5, loss.numel()).reshape(loss.shape)
                     .to(dev)).sum().backward()
                    res[f"{classes}_{ignore}_{reduction}_{weighted}"] = {
                        "loss": enc(loss), "grad": enc(lg.grad)}
    lg = leaf(logits2d)
    loss = F.cross_entropy(lg, target2d.to(dev), reduction="none")
    (loss * weights2d.to(dev)).sum().backward()
    res["2d_none"] = {"loss": enc(loss), "grad": enc(lg.grad)}
    return res
case("ce_ignore", ce_ignore)
def bilinear():
    res = {}
    src = torch.randn(2, 3, 4, 5)
    for align in (False, True):
        for kw in ({"size": (7, 9)}, {"scale_factor": 2.5}):
            xi = leaf(src)
            y = F.interpolate(xi, mode="bilinear", align_corners=align, **kw)
            (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).to(dev)).sum().backward()
            res[f"{align}_{sorted(kw)[0]}"] = {"out": enc(y), "grad": enc(xi.grad)}
    return res
case("bilinear", bilinear)
def scatter_based():
    res = {}
    xi, si = leaf(torch.randn(4, 3)), leaf(torch.randn(5, 3))
    y = xi.index_add(0, torch.tensor([0, 2, 0, 3, 2]).to(dev), si, alpha=0.5)
    (y * torch.arange(12.0).reshape(4, 3).to(dev)).sum().backward()
    res["index_add"] = {"out": enc(y), "grad_source": enc(si.grad)}
    xi = leaf(torch.randn(2, 3, 5, 7))
    y = F.adaptive_max_pool2d(xi, (2, 3))
    (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).to(dev)).sum().backward()
    res["adaptive_max_pool"] = {"out": enc(y), "grad": enc(xi.grad)}
    xi = leaf(img)
    y = F.pad(xi, (1, 2, 3, 4), mode="replicate")
    (y * torch.arange(y.numel(), dtype=y.dtype).reshape(y.shape).to(dev)).sum().backward()
    res["replicate_pad"] = {"out": enc(y), "grad": enc(xi.grad)}
    conv = nn.utils.parametrizations.weight_norm(nn.Linear(4, 3)).to(dev)
    yi = conv(torch.randn(2, 4, generator=torch.Generator().manual_seed(5)).to(dev))
    yi.sum().backward()
    res["weight_norm"] = {"out": enc(yi), "grad": enc(conv.parametrizations.weight.original1.grad)}
    return res
torch.manual_seed(4)
case("scatter_based", scatter_based)

# fact 1: two different ops fall back (neither has a decomposition); counted per op
a = torch.eye(3).to(dev) * 2 + 1
for _ in range(2):
    torch.linalg.solve(a, torch.ones(3, 1, device=dev))
for _ in range(3):
    torch.count_nonzero(a)

from dmlshim import events
out["fallbacks_from_warnings"] = dict(events.cpu_fallbacks)
out["guard_notes"] = {k: v for k, v in events.notes.items() if k.startswith("guard.")}
print("RESULT " + json.dumps(out))
"""

FALLBACK_OPS = {"aten::_linalg_solve_ex.result": 2, "aten::count_nonzero.dim_IntList": 3,
                "aten::max_unpool2d": 1}


def run_facts(tmp_path, name: str, **options: str) -> Dict[str, Any]:
    report = tmp_path / f"{name}.json"
    env = clean_env(**{"DMLSHIM_" + k.upper(): v for k, v in options.items()},
                    DMLSHIM_REPORT=str(report))
    proc = subprocess.run([sys.executable, "-c", FACTS], capture_output=True, text=True,
                          env=env, timeout=300)
    assert proc.returncode == 0, describe(proc)
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    result = json.loads(line[len("RESULT "):])
    result["_report"] = json.loads(report.read_text())
    result["_stderr"] = proc.stderr
    return result


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("facts")
    return {
        "cpu": run_facts(tmp, "cpu", device="cpu"),
        "shim": run_facts(tmp, "shim", device="emulated-dml"),
        "wheel": run_facts(tmp, "wheel", device="emulated-dml", guards="off"),
        # the software adapter's wrong results switched on: the guards still give the CPU's
        "adapter": run_facts(tmp, "adapter", device="emulated-dml", emulator_gaps=ADAPTER),
        "adapter_wheel": run_facts(tmp, "adapter_wheel", device="emulated-dml", guards="off",
                                   emulator_gaps=ADAPTER),
    }


ADAPTER = "all,bug-nll-ignore,bug-scatter-add,bug-ce-2d-none,bug-bilinear"


@pytest.mark.parametrize("fact", ["ce_ignore", "bilinear", "scatter_based", "nll_none",
                                  "reflect_pad_grad", "unique_counts", "max_pool_indices"])
def test_guards_give_the_cpu_result_with_the_software_adapters_bugs(runs, fact):
    assert close(runs["adapter"][fact], runs["cpu"][fact], 1e-4), fact


def test_emulator_shows_the_software_adapters_bugs_without_guards(runs):
    wheel, cpu = runs["adapter_wheel"], runs["cpu"]
    ce = wheel["ce_ignore"]
    # -100 is ignored with 5 classes, not with 256; -1 never
    assert close(ce["5_-100_mean_False"]["loss"], cpu["ce_ignore"]["5_-100_mean_False"]["loss"])
    for key in ("256_-100_mean_False", "256_-1_sum_True", "5_-1_mean_False"):
        assert not close(ce[key]["loss"], cpu["ce_ignore"][key]["loss"]), key
    assert not close(ce["2d_none"]["loss"], cpu["ce_ignore"]["2d_none"]["loss"])
    assert not close(wheel["bilinear"], cpu["bilinear"])
    # (the decompositions built on scatter_add raised here; they stay on with guards off)
    assert close(wheel["scatter_based"], cpu["scatter_based"], 1e-4)


def close(a: Any, b: Any, tol: float = 1e-5) -> bool:
    """Equal structure, shapes and dtypes; floats equal within ``tol`` (relative and absolute)."""
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    if isinstance(a, float) and isinstance(b, (int, float)) and not isinstance(b, bool):
        return math.isclose(a, b, rel_tol=tol, abs_tol=tol)
    return a == b


CPU_EQUAL = ["eye_n", "eye_nm", "mul_bool", "mul_inplace_broadcast", "nll_none", "masked_fill_uint8", "masked_fill_bool",
             "reflect_pad", "reflect_pad_grad", "reflect_pad_square", "reflect_pad_square_grad",
             "ln_weight_only", "ln_neither",
             "ln_weight_input_no_grad", "ln_weight_and_bias", "unique_counts", "unique_plain",
             "unique_inverse", "flip_negative",
             "max_pool_indices", "max_unpool", "scatter_full", "ce_ignore", "bilinear",
             "scatter_based", "scatter_add", "gather_scatter_negative",
             "gather_negative_forward", "rsub_number", "to_host_non_blocking", "split_empty",
             "sub_empty", "gather_empty", "readback_gil", "cat_empty", "slice_empty",
             "inplace_alias", "full_float"]


@pytest.mark.parametrize("fact", CPU_EQUAL)
def test_guards_give_the_cpu_result(runs, fact):
    cpu, shim = runs["cpu"][fact], runs["shim"][fact]
    assert close(shim, cpu), (fact, shim, cpu)


def test_the_mixed_batch_norm_backward_gives_the_cpus_result_in_float16(runs):
    # the guard computes the backward in float32 and hands float16 back; the CPU's mixed kernel
    # rounds its float16 gradient on its own way: float16's precision apart
    cpu, shim = runs["cpu"]["bn_mixed"], runs["shim"]["bn_mixed"]
    assert "error" not in cpu and "error" not in shim, (cpu, shim)
    assert shim["grad_dtype"] == cpu["grad_dtype"] == "torch.float16"
    assert close(shim, dict(cpu, grad_dtype=shim["grad_dtype"]), 2e-3), (shim, cpu)


def test_the_cpu_reference_is_what_torch_says(runs):
    cpu = runs["cpu"]
    assert cpu["eye_n"]["shape"] == [3, 3] and cpu["eye_nm"]["shape"] == [2, 4]
    assert cpu["mul_bool"]["x*m"]["dtype"] == "torch.float32"
    assert cpu["masked_fill_uint8"]["error"] == (
        "RuntimeError: masked_fill_ only supports boolean masks, but got mask with dtype "
        "unsigned char")
    assert cpu["reflect_pad"]["shape"] == [2, 3, 13, 9]
    assert "error" not in cpu["ln_weight_only"] and "error" not in cpu["ln_neither"]
    assert not close(cpu["nll_none"]["per_sample"], cpu["nll_none_wheel"]["per_sample"])


def test_emulator_shows_the_wheels_behaviour_without_guards(runs):
    wheel, cpu = runs["wheel"], runs["cpu"]
    # fact 2: eye comes back with shape (0,)
    assert wheel["eye_n"]["shape"] == [0] and wheel["eye_nm"]["shape"] == [0]
    # fact 3: float * bool is bool in every spelling; float * 2 is not affected
    forms = wheel["mul_bool"]
    assert {k: v["dtype"] for k, v in forms.items()} == {
        "x*m": "torch.bool", "mul": "torch.bool", "m*x": "torch.bool", "x*=m": "torch.bool",
        "x*2": "torch.float32"}
    # fact 4: the backward uses grad_output[0] for every row (all zero when it is 0)
    nll = wheel["nll_none"]
    assert set(nll["per_sample"]["values"]) == {0.0}
    assert close(nll["per_sample"], wheel["nll_none_wheel"]["per_sample"])
    assert close(nll["masked_mean"], wheel["nll_none_wheel"]["masked_mean"])
    assert not close(nll["masked_mean"], cpu["nll_none"]["masked_mean"])
    assert not close(nll["spatial"], cpu["nll_none"]["spatial"])
    # fact 5: a uint8 mask is accepted (as if bool)
    assert close(wheel["masked_fill_uint8"], cpu["masked_fill_bool"])
    # fact 7: the height and width padding are swapped: 9x13 instead of 13x9 (and the
    # backward of that output does not fit the input)
    assert wheel["reflect_pad"]["shape"] == [2, 3, 9, 13]
    assert not close(wheel["reflect_pad_grad"], cpu["reflect_pad_grad"])
    assert close(wheel["reflect_pad_square"], cpu["reflect_pad_square"])
    assert close(wheel["reflect_pad_square_grad"], cpu["reflect_pad_square_grad"])
    # fact 11: the layer-norm backward without a bias fails three ways; with one it works
    assert wheel["ln_weight_only"] == {"error": "RuntimeError: Unknown error -2005270523"}
    assert wheel["ln_neither"] == {"error": "RuntimeError: tensor does not have a device"}
    assert wheel["ln_weight_input_no_grad"]["error"].startswith(
        "RuntimeError: DirectML graph compilation failed")
    assert close(wheel["ln_weight_and_bias"], cpu["ln_weight_and_bias"])
    # the wheel's out= kernels and resize_ do not reallocate; unique counts raise; indices are
    # flattened over the whole tensor (max_unpool2d then fails); partial scatters raise
    rules = wheel["out_rules"]
    assert rules["add_out_empty"]["shape"] == [0] and rules["resize_same_count"] == [3, 4]
    assert rules["resize_from_empty"] == ("The size of tensor a (0) must match the size of "
                                          "tensor b (4) at non-singleton dimension 1")
    assert wheel["unique_counts"]["error"] == (
        "RuntimeError: Return counts not implemented for unique operator for DirectML.")
    assert wheel["unique_inverse"]["error"] == (
        "RuntimeError: Return inverse not implemented for unique operator for DirectML.")
    assert close(wheel["unique_plain"], cpu["unique_plain"])
    # host-side crashes of the wheel, raised: flip with a negative dim; an out= overload called
    # from Python (whoever calls it: the guards do not make it safe, they never call it)
    assert "flip_dml_helper" in wheel["flip_negative"]["error"]
    for run in (wheel, runs["shim"]):
        assert "out= overload" in run["nll_output"]["error"] and "SIGABRT" in run["nll_output"]["error"]
    assert "error" not in cpu["nll_output"]
    flat = wheel["max_pool_indices"]["indices"]["values"]
    per_plane = cpu["max_pool_indices"]["indices"]["values"]
    assert flat[-4:] == [v + 48 for v in per_plane[-4:]]  # + (n * C + c) * H * W
    assert close(wheel["max_pool_indices"]["grad"], cpu["max_pool_indices"]["grad"])
    assert "Found an invalid max index" in wheel["max_unpool"]["error"]
    assert "partially modified dimensions" in wheel["scatter_partial"]["error"]
    assert "partially modified dimensions" in runs["shim"]["scatter_partial"]["error"]
    assert close(wheel["scatter_full"], cpu["scatter_full"])
    assert "partially modified dimensions" in wheel["scatter_add"]["error"]  # YOLOv8's form
    # a negative dim: gather is wrong, scatter (and gather's backward, a scatter_add) raise
    assert "partially modified dimensions" in wheel["gather_scatter_negative"]["error"]
    assert not close(wheel["gather_negative_forward"], cpu["gather_negative_forward"])
    assert wheel["sub_empty"]["sub"]["shape"] == [0, 0]
    # alpha and the sign dropped: x + other in place, self copied in first with out=
    alias = wheel["inplace_alias"]
    for form in ("isub_self", "sub_detach_alpha", "sub_view"):
        assert alias[form]["values"] == [2.0, 4.0, 6.0, 8.0], (form, alias)
    # add_ with an alpha: the same fault, left to the wheel (not guarded: a frame on every add_)
    assert wheel["add_alias_alpha"]["values"] == [2.0, 4.0, 6.0, 8.0], wheel["add_alias_alpha"]
    assert runs["shim"]["add_alias_alpha"] == wheel["add_alias_alpha"]
    assert alias["sub_out_other"]["values"] == [20.0, 40.0, 60.0, 80.0], alias
    assert alias["partial_overlap"]["values"] == [2.0, 3.0, 4.0, 5.0], alias
    assert alias["add_distinct_alpha"] == cpu["inplace_alias"]["add_distinct_alpha"]
    assert alias["half_self"] == cpu["inplace_alias"]["half_self"]
    assert wheel["gather_empty"] == {"error": "RuntimeError: Unknown error -2147024809"}
    assert wheel["split_empty"] == {"error": "RuntimeError: Unknown error -2147024809"}
    assert wheel["cat_empty"] == {"error": "RuntimeError: Unknown error -2147024809"}
    assert "gap slice-empty" in wheel["slice_empty"]["error"]
    assert wheel["readback_gil"]["error"].startswith(
        "RuntimeError: emulated_dml (gap readback-gil): a device tensor was read back")
    assert not close(wheel["to_host_non_blocking"], cpu["to_host_non_blocking"])
    assert wheel["full_float"] == {
        "error": "RuntimeError: The GPU device does not support Double (Float64) operations!"}
    assert wheel["rsub_number"] == {
        "error": "RuntimeError: The GPU device does not support Double (Float64) operations!"}
    # the batch-norm backward refuses a float16 input with float32 weights
    assert wheel["bn_mixed"]["error"].startswith("RuntimeError: Unknown error -2147024809")
    assert wheel["guard_notes"] == {}


def test_guard_counters(runs):
    notes = runs["shim"]["guard_notes"]
    assert notes["guard.eye"] >= 2 and notes["guard.mul_bool"] == 4
    assert notes["guard.nll_none"] >= 3 and notes["guard.masked_fill_uint8"] == 1
    assert notes["guard.nll"] > 0 and notes["guard.bilinear"] == 8
    # (reflect padding: the forward only; autograd differentiates its narrow, flip and cat)
    assert notes["guard.reflect_pad"] == 1 and notes["guard.layer_norm_nobias"] == 3
    # (scatter_add: two calls, and the backward of a gather)
    assert notes["guard.bn_mixed_backward"] == 1 and notes["guard.scatter_add"] == 4
    assert notes["guard.rsub_number"] == 4 and notes["guard.split_empty"] == 2
    assert notes["guard.non_blocking_to_host"] == 2 and notes["guard.sub_empty"] == 3
    assert notes["guard.cat_empty"] == 5 and notes["guard.slice_empty"] >= 5
    # (isub_self, sub_detach_alpha, sub_view, sub_out_other, y -= y.detach(), and the partial
    # overlap refused; add_ is not guarded)
    assert notes["guard.inplace_alias"] == 6


def test_the_facts_run_notes_what_the_records_say(runs):
    """Every guard whose fact is in this script notes the events its record lists, and nothing
    else notes: the summary's "guards applied" says what ran. (readback_gil, max_pool_indices
    and flip_dims note nothing: every read back of a number, every pooling with indices and
    every flip takes them; that the read back ran without the GIL is the emulator's check on
    readback_gil's fact, below the guard.)"""
    here = "tests/test_dml_facts.py::"
    expected = {n for g in records.GUARDS if any(t.startswith(here) for t in g.fact_tests)
                for n in g.notes}
    assert set(runs["shim"]["guard_notes"]) == expected
    assert {"guard.nll", "guard.mul_bool"} <= expected  # (the records list notes at all)


@pytest.mark.parametrize("run", ["shim", "wheel"])
def test_every_fallback_op_is_reported_with_its_count(runs, run):
    r = runs[run]
    report = r["_report"]["cpu_fallbacks"]
    # without the guards, torch.eye falls back too (and comes back empty)
    expected = FALLBACK_OPS if run == "shim" else {**FALLBACK_OPS, "aten::eye.m_out": 2}
    assert report["ops"] == expected
    # the emulator, like the wheel, warns once per process in total: the shim leaves that
    # alone (no process-wide set_warn_always), so the warnings name the first op, once
    first = r["fallbacks_from_warnings"]
    assert len(first) == 1 and set(first) <= set(expected) and list(first.values()) == [1], first
    summary = [x for x in r["_stderr"].splitlines() if "CPU fallbacks" in x]
    assert len(summary) == 1, r["_stderr"]
    for op, n in expected.items():
        assert f"{op} x{n}" in summary[0]  # the report's counts are the emulator's exact ones
    assert r["_stderr"].count("is not currently supported on the DML backend") == 1, r["_stderr"]
    assert runs["cpu"]["_report"]["cpu_fallbacks"]["ops"] == {}


# -- facts decided outside the guards, on the emulator in this process ------------------------


@pytest.fixture
def emu():
    before = (emulator.device_count(), emulator.switches()) if emulator.is_registered() else None
    emulator.register(1)
    emulator.reset_fallback_counts()
    _fallback.rearm_warnings()
    yield emulator
    torch.set_warn_always(False)
    if before is not None:
        emulator.register(*before)
    else:
        emulator.set_switches(emulator.GAPS)


def test_out_kernels_do_not_resize_like_the_wheels(emu):
    """The facts' three out= cases, word for word (no backward: in this process)."""
    dev = emu.device()
    aten = torch.ops.aten
    x = torch.randn(2, 8, 64).to(dev)
    weight, bias = torch.ones(64).to(dev), torch.zeros(64).to(dev)
    _, mean, rstd = aten.native_layer_norm(x, [64], weight, bias, 1e-5)

    def empty():
        return torch.empty(0, device=dev)

    with pytest.raises(RuntimeError) as err:
        aten.native_layer_norm_backward.out(x, x, [64], mean, rstd, weight, bias,
                                            [True, True, True], out0=empty(), out1=empty(),
                                            out2=empty())
    assert str(err.value) == ("The size of tensor a (64) must match the size of tensor b (0) "
                              "at non-singleton dimension 2")
    planes = torch.randn(1, 1, 6, 6).to(dev)
    assert aten.reflection_pad2d.out(planes, [1, 1, 1, 1], out=empty()).shape == (0,)
    assert torch.add(x, x, out=empty()).shape == (0,)
    # the composites torch itself builds on an empty out= still work (arange, logical_not)
    assert torch.arange(5, device=dev).cpu().tolist() == list(range(5))
    assert torch.logical_not(torch.zeros(3, dtype=torch.bool).to(dev)).cpu().all()
    # and so do the same calls on the CPU (the reference resizes)
    assert torch.add(x.cpu(), x.cpu(), out=torch.empty(0)).shape == x.shape


def _fallback_warnings(caught):
    return [str(w.message) for w in caught if "DML backend" in str(w.message)]


def test_fallback_warning_fires_once_per_process_like_the_wheel(emu):
    dev = emu.device(0)
    a = torch.eye(3).to(dev) * 2 + 1
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        for _ in range(2):
            torch.linalg.solve(a, torch.ones(3, 1, device=dev))
        torch.count_nonzero(a)
    assert len(_fallback_warnings(caught)) == 1  # one TORCH_WARN_ONCE site for every op
    assert "_linalg_solve_ex.result" in _fallback_warnings(caught)[0]
    assert emu.fallback_counts() == {"aten::_linalg_solve_ex.result": 2,
                                     "aten::count_nonzero.dim_IntList": 1}
    torch.set_warn_always(True)  # such a site then fires every time
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.count_nonzero(a)
        torch.count_nonzero(a)
    assert len(_fallback_warnings(caught)) == 2
    torch.set_warn_always(False)
    emu.set_switches([s for s in emu.GAPS if s != "fallback-warn-once"])  # once per op
    _fallback.rearm_warnings()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        torch.linalg.solve(a, torch.ones(3, 1, device=dev))
        torch.count_nonzero(a)
        torch.count_nonzero(a)
    assert len(_fallback_warnings(caught)) == 2


def test_channels_last_is_refused_on_to_like_the_wheel(emu):
    dev = emu.device(0)
    message = "'memory_format' argument is must be Contiguous for DML tensors"
    conv = torch.nn.Conv2d(3, 4, 3).to(dev)
    x = torch.randn(2, 3, 5, 5)
    for call in (lambda: conv.to(memory_format=torch.channels_last),
                 lambda: x.to(dev).to(memory_format=torch.channels_last),
                 lambda: x.to(dev, memory_format=torch.channels_last)):
        with pytest.raises(RuntimeError) as err:
            call()
        assert str(err.value) == message
    y = x.to(dev).contiguous(memory_format=torch.channels_last)  # accepted
    assert y.is_contiguous(memory_format=torch.channels_last)
    assert torch.equal(y.cpu(), x)
    emu.set_switches([s for s in emu.GAPS if s != "channels-last"])
    assert x.to(dev, memory_format=torch.channels_last).is_contiguous(
        memory_format=torch.channels_last)


# -- the kernel table against the installed wheel (torch 2.4.1 lane) -------------------------

_REGISTRATIONS = r"""
import json, warnings
import torch, torch_directml
from dmlshim import capabilities, config
from dmlshim.kernels.guards.records import GUARDS
from dmlshim.patches.guards import GuardsPatch
from dmlshim.target import Target

regs = torch._C._dispatch_get_registrations_for_dispatch_key("PrivateUse1")
print("REGS " + json.dumps(sorted(r for r in regs if r.startswith("aten::"))))

# dmlshim's guard kernels: input fixes above autograd (the wheel's own kernel stays in place
# behind them), replacements on PrivateUse1; all given back at uninstall
ops = {"aten::" + op: g.key for g in GUARDS for op in g.kernels}
def table():
    return {op: [line for line in torch._C._dispatch_dump_table(op).splitlines()
                 if line.startswith(("PrivateUse1:", "AutogradPrivateUse1:"))]
            for op in ops}
before = table()
# (the guards register a policy with the installing session's rewriters: a bare one here)
import types
from dmlshim import conversions, current
current.switch(types.SimpleNamespace(rewriters=conversions.Rewriters()))
patch = GuardsPatch()
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    cfg = config.load({"device": "cpu"}, environ={})
    patch.install(capabilities.of(Target("dml", 1, "test"), cfg), cfg)
during = table()
patch.uninstall()
print("GUARDS " + json.dumps({"before": before, "during": during, "after": table(),
                              "keys": ops, "warnings": [str(w.message) for w in caught]}))
"""


def test_kernel_table_matches_the_installed_wheel():
    spec = importlib.util.find_spec("torch_directml")
    if spec is None or not spec.submodule_search_locations:
        pytest.skip("torch-directml is not installed (the torch 2.4.1 lane has it)")
    pkg = list(spec.submodule_search_locations)[0]
    env = clean_env(DMLSHIM_DISABLE="1",
                    LD_LIBRARY_PATH=os.pathsep.join(
                        p for p in (pkg, os.environ.get("LD_LIBRARY_PATH")) if p))
    # importing registers the kernels with the dispatcher; no adapter is needed for that, nor
    # for registering dmlshim's guard kernels over them
    proc = subprocess.run([sys.executable, "-c", _REGISTRATIONS], capture_output=True,
                          text=True, env=env, timeout=120)
    assert proc.returncode == 0, describe(proc)
    lines = {x.split(" ", 1)[0]: json.loads(x.split(" ", 1)[1]) for x in proc.stdout.splitlines()
             if x.startswith(("REGS ", "GUARDS "))}
    wheel = set(lines["REGS"])
    assert len(wheel) > 200
    assert sorted(wheel - DML_KERNELS_0_2_5) == [] and sorted(DML_KERNELS_0_2_5 - wheel) == []
    guards = lines["GUARDS"]
    assert guards["warnings"] == []  # no "Overriding a previously registered kernel" for users
    assert guards["after"] == guards["before"]
    for op, rows in guards["during"].items():
        key = guards["keys"][op]
        row = next(r for r in rows if r.startswith(key + ":"))
        assert row not in guards["before"][op] and "[kernel]" in row, (op, rows)
        if key == "AutogradPrivateUse1":  # the wheel's own kernel stays, behind the input fix
            wheels = [r for r in guards["before"][op] if r.startswith("PrivateUse1:")]
            assert wheels and wheels[0] in rows, (op, rows)
    assert "torch_directml" in guards["during"]["aten::masked_fill_.Scalar"][0]


def test_fallback_collection_leaves_the_scripts_settings_alone(shim):
    from dmlshim import events

    events.reset()
    assert not torch.is_warn_always_enabled()
    shim(device="emulated-dml")
    try:
        # no process-wide set_warn_always: every TORCH_WARN_ONCE site of torch stays once
        assert not torch.is_warn_always_enabled()
        assert not any(f[1] is not None and "DML backend" in f[1].pattern
                       for f in warnings.filters)
        a = torch.ones(4, device="privateuseone")
        _fallback.rearm_warnings()
        emulator.reset_fallback_counts()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")  # the script's own filter decides what is shown
            for _ in range(3):
                torch.count_nonzero(a)  # the wheel's site fires once per process
        assert len(_fallback_warnings(caught)) == 1
        assert emulator.fallback_counts() == {"aten::count_nonzero.dim_IntList": 3}  # exact
        torch.set_warn_always(True)  # the script's choice: it stays on
        assert torch.is_warn_always_enabled()
        torch.set_warn_always(False)
    finally:
        import dmlshim

        dmlshim.uninstall()
        events.reset()
    assert not torch.is_warn_always_enabled()
