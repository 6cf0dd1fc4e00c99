"""The rules every kernel dmlshim registers on the device follows (issue 28), each checked
against the emulator's model of the real wheel's host side (facts file, "Host-side crashes of
the wheel"), so that the fast tier catches a repeat without the wheel:

* it accepts every argument form the dispatcher hands it: a wrapped-number operand reaches a
  Python kernel as a Python number (``x * 2.0``, ``2.0 * x``, and the scalars the wheel's own
  batch norm, dropout and attention multiply by);
* it never calls an ``out=`` overload of the wheel: the emulator's gap ``out-unsafe`` refuses
  one called by a Python kernel registered for the device (and ``nll_loss_forward.output``
  from anywhere), so every emulator test that runs dmlshim's kernels checks it; and no module
  that defines a device kernel calls one (read from the source: the kernels registered above
  autograd are not on the emulator's record of who calls);
* it passes non-negative dims (the gap ``flip-negative-dims`` refuses a negative flip dim);
* ``unique`` with counts or the inverse on the device is the CPU's.
"""

from __future__ import annotations

import ast
import copy
import importlib
import inspect
from typing import Dict, List, Set

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F

aten = torch.ops.aten


@pytest.fixture
def emu(shim):
    shim(device="emulated-dml")
    import emulated_dml

    emulated_dml.reset_fallback_counts()  # (counts of an earlier test in this process)
    return emulated_dml


def _cpu(value):
    return value.cpu() if isinstance(value, torch.Tensor) else value


# -- a wrapped-number operand reaches a Python kernel as a number ----------------------------


@pytest.mark.emulator
def test_the_devices_own_kernels_hand_python_kernels_numbers(shim):
    """As the wheel's C++ kernels do: training-mode batch norm, dropout (forward and backward)
    and attention multiply on the device by a wrapped-number scalar, and a Python kernel
    registered for mul.Tensor on PrivateUse1 receives it as a Python float."""
    shim(device="emulated-dml", guards="off")
    import emulated_dml

    seen: List[tuple] = []

    def spy(self, other):
        seen.append((type(self).__name__, type(other).__name__))
        return torch.mul(_cpu(self), _cpu(other)).to(self.device)

    emulated_dml.register_device_kernel("mul.Tensor", spy)
    try:
        x = torch.randn(4, 3, 5, 5, device="cuda", requires_grad=True)
        F.batch_norm(x, torch.zeros(3, device="cuda"), torch.ones(3, device="cuda"),
                     training=True)
        assert ("EmuTensor", "float") in seen, seen
        seen.clear()
        F.dropout(x, 0.5, True).sum().backward()
        assert seen.count(("EmuTensor", "float")) == 2, seen  # forward and backward
        seen.clear()
        q = torch.randn(1, 2, 4, 8, device="cuda")
        F.scaled_dot_product_attention(q, q, q, is_causal=True)
        assert ("EmuTensor", "float") in seen, seen
        seen.clear()
        torch.randn(3, device="cuda") * 2.5  # from Python, as on the wheel
        assert seen == [("EmuTensor", "float")], seen
    finally:
        emulated_dml.unregister_device_kernel("mul.Tensor")


@pytest.mark.emulator
def test_the_mul_guard_takes_every_argument_form(emu):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 4, generator=g)
    m = torch.rand(3, 4, generator=g) > 0.5
    forms = {
        "x*m": lambda a, b: a * b, "m*x": lambda a, b: b * a, "x*2.0": lambda a, b: a * 2.0,
        "2.0*x": lambda a, b: 2.0 * a, "x*3": lambda a, b: a * 3, "x*True": lambda a, b: a * True,
        "mul(2, x)": lambda a, b: torch.mul(2, a), "m*2.5": lambda a, b: b * 2.5,
        "x*cpu0d": lambda a, b: a * torch.tensor(0.5), "x*m0d": lambda a, b: a * b[0, 0],
        "x*x": lambda a, b: a * a,
    }
    for name, fn in forms.items():
        want = fn(x, m)
        got = fn(x.to("cuda"), m.to("cuda"))
        assert got.dtype == want.dtype, name
        torch.testing.assert_close(got.cpu(), want, msg=name)
    for name, other in {"*=m": m, "*=2.0": 2.0, "*=x": x, "*=0d": torch.tensor(3.0)}.items():
        want, got = x.clone(), x.to("cuda")
        want *= other
        got *= other.to("cuda") if isinstance(other, torch.Tensor) and other.dim() else other
        torch.testing.assert_close(got.cpu(), want, msg=name)
    # with autograd: the gradients of x * m * 2.0 (the bool operand has none)
    a, b = x.clone().requires_grad_(), x.to("cuda").requires_grad_()
    (a * m * 2.0).sum().backward()
    (b * m.to("cuda") * 2.0).sum().backward()
    torch.testing.assert_close(b.grad.cpu(), a.grad)
    assert emu.fallback_counts() == {}


@pytest.mark.emulator
def test_a_model_with_batch_norm_dropout_and_attention_trains_like_the_cpu(emu):
    """What crashed every model on the wheel: its batch norm, dropout and attention handing the
    guards wrapped-number scalars."""
    torch.manual_seed(0)
    net = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Dropout(0.0), nn.Flatten(2))
    attn = nn.MultiheadAttention(8, 2, batch_first=True)
    x, y = torch.randn(2, 3, 4, 4), torch.randint(0, 8, (2,))
    losses = {}
    for device in ("cpu", "cuda"):
        torch.manual_seed(1)
        n, a = copy.deepcopy(net).to(device), copy.deepcopy(attn).to(device)
        h = n(x.to(device)).transpose(1, 2)
        out, _ = a(h, h, h, need_weights=False, is_causal=False)
        loss = F.cross_entropy(out.mean(1), y.to(device))
        loss.backward()
        losses[device] = (loss.item(), n[0].weight.grad.cpu())
    assert losses["cuda"][0] == pytest.approx(losses["cpu"][0], rel=1e-5)
    torch.testing.assert_close(losses["cuda"][1], losses["cpu"][1], rtol=1e-4, atol=1e-5)


# -- out= overloads ---------------------------------------------------------------------------


@pytest.mark.emulator
def test_out_overloads_called_from_python_are_unsafe_on_the_emulator(shim):
    shim(device="emulated-dml", guards="off")
    import emulated_dml

    logits, target = torch.randn(4, 3, device="cuda"), torch.tensor([0, 2, 1, 1], device="cuda")
    with pytest.raises(RuntimeError, match="out= overload.*SIGABRT"):  # from anywhere
        aten.nll_loss_forward.output(logits, target, None, 1, -100,
                                     output=torch.empty((), device="cuda"),
                                     total_weight=torch.empty((), device="cuda"))
    # the functional form is fine, and so are the out= calls of C++ (torch.arange's composite)
    # and a script's own torch.add(out=)
    torch.testing.assert_close(aten.nll_loss_forward(logits, target, None, 1, -100)[0].cpu(),
                               F.nll_loss(logits.cpu(), target.cpu()))
    assert torch.arange(5, device="cuda").cpu().tolist() == [0, 1, 2, 3, 4]
    y = torch.empty(4, 3, device="cuda")
    torch.add(logits, 1.0, out=y)

    def bad(self, other):  # a device kernel calling the wheel's mul.out
        return torch.mul(self, other, out=torch.empty(self.shape, device=self.device))

    emulated_dml.register_device_kernel("sub.Tensor", bad)
    try:
        with pytest.raises(RuntimeError, match="aten::mul.out is an out= overload, called from "
                                               "Python by a kernel registered for the device"):
            logits - logits
    finally:
        emulated_dml.unregister_device_kernel("sub.Tensor")
    emulated_dml.set_switches([s for s in emulated_dml.GAPS if s != "out-unsafe"])
    try:
        aten.nll_loss_forward.output(logits, target, None, 1, -100,
                                     output=torch.empty((), device="cuda"),
                                     total_weight=torch.empty((), device="cuda"))
    finally:
        emulated_dml.set_switches(emulated_dml.GAPS)


def _kernel_modules() -> Dict[str, Set[str]]:
    """Module name -> names of the functions dmlshim registers on the device from it (the
    guards', the decompositions', torchvision's autograd layer), and the kernels it shares with
    the emulator (dmlshared: the fused LSTM cell, CUDA's autocast kernels)."""
    from dmlshared import autocast_kernels, lstm_cell
    from dmlshim.kernels import vision
    from dmlshim.kernels.decompositions import all_decompositions
    from dmlshim.kernels.guards.records import GUARDS

    kernels = [k for g in GUARDS for k in g.kernels.values()]
    kernels += [d.kernel for d in all_decompositions()]
    modules: Dict[str, Set[str]] = {m.__name__: set() for m in (vision, lstm_cell,
                                                                autocast_kernels)}
    for k in kernels:
        fn = getattr(k, "func", k)  # functools.partial
        modules.setdefault(fn.__module__, set()).add(fn.__name__)
    return modules


def _is_out_overload(chain: List[str]) -> bool:
    """``aten.<op>.<overload>`` (or ``torch.ops.aten...``) naming an overload with out= args."""
    if len(chain) < 3 or chain[-3] != "aten":
        return False
    packet = getattr(aten, chain[-2], None)
    overload = getattr(packet, chain[-1], None) if packet is not None else None
    if not isinstance(overload, torch._ops.OpOverload):
        return False
    return any(a.kwarg_only and a.alias_info is not None and a.alias_info.is_write
               for a in overload._schema.arguments)


def _chain(node: ast.AST) -> List[str]:
    names: List[str] = []
    while isinstance(node, ast.Attribute):
        names.insert(0, node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        names.insert(0, node.id)
    return names


def out_calls(tree: ast.AST) -> List[ast.Call]:
    """Calls with an ``out=`` argument other than a kernel's own ``out`` parameter handed on
    (an ``out=`` kernel passing its caller's tensor to the wheel's kernel, unboxed through
    torch's C function, makes the caller's own call: nothing allocated, nothing dangling)."""
    own_out: Dict[int, bool] = {}
    for fn in ast.walk(tree):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            params = {a.arg for a in fn.args.args + fn.args.kwonlyargs + fn.args.posonlyargs}
            for node in ast.walk(fn):
                if isinstance(node, ast.Call):
                    own_out[id(node)] = own_out.get(id(node), False) or "out" in params
    found = []
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        for k in node.keywords:
            if k.arg not in ("out", "output", "grad_input"):
                continue
            handed_on = k.arg == "out" and isinstance(k.value, ast.Name) \
                and k.value.id == "out" and own_out.get(id(node), False)
            if not handed_on:
                found.append(node)
                break
    return found


def test_no_device_kernel_of_dmlshim_calls_an_out_overload():
    """Read from the source of every module that defines a kernel dmlshim registers on the
    device (guards, decompositions, AMP, foreach, torchvision ops): no call with an ``out=``
    argument to anything but the module's own functions (or the kernel's own ``out=`` handed
    on), no ``aten.<op>.<out overload>``."""
    problems = []
    modules = _kernel_modules()
    assert len(modules) >= 10, modules
    for name in modules:
        module = importlib.import_module(name)
        tree = ast.parse(inspect.getsource(module))
        own = {n.name for n in ast.walk(tree) if isinstance(n, ast.FunctionDef)}
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_out_overload(_chain(node)):
                problems.append(f"{name}:{node.lineno} {'.'.join(_chain(node))}")
        for node in out_calls(tree):
            callee = _chain(node.func)
            if not (len(callee) == 1 and callee[0] in own):
                problems.append(f"{name}:{node.lineno} {'.'.join(callee)}(..., out=...)")
    assert problems == [], problems


def test_the_scan_sees_an_out_call():
    src = "import torch\naten = torch.ops.aten\ndef k(x):\n    return aten.mul.out(x, x, out=x)\n"
    tree = ast.parse(src)
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Attribute)
             and _is_out_overload(_chain(n))]
    assert [".".join(_chain(n)) for n in calls] == ["aten.mul.out"]
    assert not _is_out_overload(["aten", "mul", "Tensor"])
    assert _is_out_overload(["torch", "ops", "aten", "nll_loss_forward", "output"])
    # an out= kernel handing its caller's tensor on is not an out= call of the kernel's own
    src = ("def add_out(self, other, *, out, op):\n    return op(self, other, out=out)\n"
           "def mine(x, op):\n    out = x.new_empty(3)\n    return op(x, out=out)\n"
           "def other(x, *, out, op):\n    return op(x, out=x)\n")
    assert [n.lineno for n in out_calls(ast.parse(src))] == [5, 7]


# -- dims ------------------------------------------------------------------------------------


@pytest.mark.emulator
def test_flip_with_a_negative_dim_raises_on_the_emulator_and_the_guard_wraps_it(shim):
    shim(device="emulated-dml", guards="off")
    t = torch.arange(24.0).reshape(2, 3, 4)
    with pytest.raises(RuntimeError, match="flip_dml_helper"):
        t.to("cuda").flip(-1)
    assert torch.equal(t.to("cuda").flip(2).cpu(), t.flip(-1))  # non-negative: right
    import dmlshim

    dmlshim.uninstall()
    shim(device="emulated-dml")
    for dims in ([-1], [0, -2], [-3, -1], [1]):
        a, b = t.clone().requires_grad_(), t.to("cuda").requires_grad_()
        ya, yb = torch.flip(a, dims), torch.flip(b, dims)
        assert torch.equal(yb.cpu(), ya.detach()), dims
        (ya * torch.arange(24.0).reshape(2, 3, 4)).sum().backward()
        (yb * torch.arange(24.0).reshape(2, 3, 4).to("cuda")).sum().backward()
        assert torch.equal(b.grad.cpu(), a.grad), dims
    with pytest.raises(IndexError, match="Dimension out of range"):
        t.to("cuda").flip(-4)
    # reflect padding of unequal sides flips inside the guard: dims made non-negative there
    img = torch.randn(1, 2, 6, 6)
    assert torch.equal(F.pad(img.to("cuda"), (1, 2, 3, 4), mode="reflect").cpu(),
                       F.pad(img, (1, 2, 3, 4), mode="reflect"))


# -- unique ----------------------------------------------------------------------------------


@pytest.mark.emulator
@pytest.mark.parametrize("values", [
    [3, 1, 3, 2, 1, 3, 7], [5], [], [[2.5, -1.0], [2.5, 0.0]], [True, False, True]])
def test_unique_counts_and_inverse_match_the_cpu(emu, values):
    t = torch.tensor(values)
    for kw in ({"return_counts": True}, {"return_inverse": True},
               {"return_inverse": True, "return_counts": True}, {},
               {"sorted": False, "return_counts": True}):
        want = torch.unique(t, sorted=True, **{k: v for k, v in kw.items() if k != "sorted"})
        got = torch.unique(t.to("cuda"), **kw)
        want, got = (want if isinstance(want, tuple) else (want,),
                     got if isinstance(got, tuple) else (got,))
        assert len(got) == len(want), kw
        for g, w in zip(got, want):
            assert g.device.type == "privateuseone" and g.dtype == w.dtype, kw
            assert torch.equal(g.cpu(), w), (kw, g.cpu(), w)
    assert emu.fallback_counts() == {}
