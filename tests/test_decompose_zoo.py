"""Device kernels for the operators the model zoo (benchmarks/fallbacks.py --zoo) met on the CPU
fallback: each against the CPU, forward and backward, with no fallback counted on the device
(the helpers of test_decompose.py), float16 where the zoo runs it; then zoo models that use
them, trained through the runner on the emulated device with zero fallbacks.
"""

from __future__ import annotations

import json
import math
import os

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import describe, losses, run_native, run_shim
from test_decompose import DEV, assert_close, check_module

from dmlshim.kernels.decompositions import all_decompositions, falls_back

ZOO_OPS = (
    "aten::huber_loss", "aten::huber_loss_backward.out", "aten::log_sigmoid_forward",
    "aten::log_sigmoid_backward", "aten::elu.out", "aten::elu_backward.grad_input",
    "aten::index_add.out", "aten::cumprod.out", "aten::amin.out",
    "aten::adaptive_max_pool2d.out", "aten::adaptive_max_pool2d_backward.grad_input",
    "aten::replication_pad2d_backward", "aten::normal.Tensor_Tensor",
    "aten::normal.Tensor_float", "aten::normal.float_Tensor", "aten::addmv.out",
    "aten::_amp_foreach_non_finite_check_and_unscale_",
)
HALF = dict(rtol=1e-2, atol=1e-2)


@pytest.fixture
def emu(shim):
    """The emulated DirectML device with decompositions on; fallback counters at zero."""
    shim(device="emulated-dml", decompose="on")
    import emulated_dml as emulator

    emulator.reset_fallback_counts()
    return emulator


def test_zoo_ops_fall_back_without_dmlshim_and_are_in_the_table():
    table = {d.op for d in all_decompositions()}
    for op in ZOO_OPS:
        assert op in table, op
        assert falls_back(op), op


class Fn(nn.Module):
    """A function as a module (check_module compares modules)."""

    def __init__(self, fn):
        super().__init__()
        self.fn = fn

    def forward(self, *xs):
        return self.fn(*xs)


# -- losses and activations -------------------------------------------------------------------

@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("delta", [1.0, 0.3])
def test_huber_loss_matches_cpu(emu, reduction, delta):
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(6, 5, generator=g) * 2, torch.randn(6, 5, generator=g)
    t[0, 0] = x[0, 0] + delta  # the boundary, |z| == delta
    check_module(emu, nn.HuberLoss(reduction=reduction, delta=delta), x, t)


def test_smooth_l1_loss_stays_on_its_kernel(emu):
    check_module(emu, nn.SmoothL1Loss(beta=0.5), torch.randn(4, 3), torch.randn(4, 3))


@pytest.mark.parametrize("half", [False, True])
def test_log_sigmoid_matches_cpu(emu, half):
    x = torch.cat([torch.linspace(-30, 30, 41), torch.tensor([0.0, -100.0, 100.0])])
    x = x.half() if half else x
    check_module(emu, nn.LogSigmoid(), x, **(HALF if half else {}))


def test_bce_with_logits_matches_cpu(emu):
    g = torch.Generator().manual_seed(0)
    x, t = torch.randn(8, 3, generator=g) * 4, torch.rand(8, 3, generator=g)
    pos = torch.tensor([1.0, 2.0, 0.5])
    check_module(emu, nn.BCEWithLogitsLoss(pos_weight=pos), x, t,
                 call=lambda m, x, t: m(x, t.detach()))


@pytest.mark.parametrize("module", [nn.ELU(), nn.ELU(alpha=0.7), nn.SELU(), nn.CELU(1.3)],
                         ids=["elu", "elu0.7", "selu", "celu"])
@pytest.mark.parametrize("half", [False, True])
def test_elu_family_matches_cpu(emu, module, half):
    x = torch.linspace(-4, 4, 33).reshape(3, 11)
    x = x.half() if half else x
    check_module(emu, module, x, **(HALF if half else {}))


@pytest.mark.parametrize("module", [nn.ELU(inplace=True), nn.SELU(inplace=True)],
                         ids=["elu", "selu"])
def test_inplace_elu_backward_from_the_result_matches_cpu(emu, module):
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(4, 6), module, nn.Linear(6, 2))
    check_module(emu, net, torch.randn(5, 4) * 3)


# -- indexing, scans, reductions --------------------------------------------------------------

@pytest.mark.parametrize("dim,alpha", [(0, 1), (1, 2.5), (-1, 1)])
@pytest.mark.parametrize("half", [False, True])
def test_index_add_matches_cpu(emu, dim, alpha, half):
    g = torch.Generator().manual_seed(0)
    base = torch.randn(5, 4, generator=g)
    n = 7
    index = torch.randint(0, base.size(dim), (n,), generator=g)
    shape = list(base.shape)
    shape[dim] = n
    source = torch.randn(*shape, generator=g)
    if half:
        base, source = base.half(), source.half()
    check_module(emu, Fn(lambda b, s: b.index_add(dim, index.to(b.device), s, alpha=alpha)),
                 base, source, **(HALF if half else {}))


def test_index_add_in_place_message_passing_matches_cpu(emu):
    # A graph layer: messages from source nodes summed into their target nodes, in place.
    g = torch.Generator().manual_seed(0)
    edges = torch.randint(0, 6, (2, 15), generator=g)
    lin = nn.Linear(3, 3)

    def layer(m, x):
        out = torch.zeros_like(x)
        out.index_add_(0, edges[1].to(x.device), m(x)[edges[0].to(x.device)])
        return out

    check_module(emu, lin, torch.randn(6, 3, generator=g), call=layer)
    scalar = torch.tensor(1.5)
    assert_close(scalar.to(DEV).index_add(0, torch.tensor([0], device=DEV),
                                          torch.tensor(2.0, device=DEV)),
                 scalar.index_add(0, torch.tensor([0]), torch.tensor(2.0)), "0-dim")


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_cumprod_matches_cpu_with_zeros_and_signs(emu, dim):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(9, 6, generator=g)
    x[3, 2] = 0.0
    x[5, 4] = 0.0
    x[7, 4] = 0.0  # two zeros on one line: the gradient before the first is zero too
    check_module(emu, Fn(lambda t: torch.cumprod(t, dim)), x)


def test_cumprod_of_a_diffusion_schedule_and_integers_matches_cpu(emu):
    betas = torch.linspace(1e-4, 0.02, 1000)
    ref = torch.cumprod(1.0 - betas, dim=0)
    assert_close(torch.cumprod(1.0 - betas.to(DEV), dim=0), ref, "alphas_cumprod", 1e-5, 1e-7)
    ints = torch.tensor([[1, 2, 3, -1], [2, 0, 5, 7]])
    assert_close(torch.cumprod(ints.to(DEV), 1), torch.cumprod(ints, 1), "int64", 0, 0)
    x = torch.rand(5)
    assert_close(torch.cumprod(x.to(DEV), 0, dtype=torch.float16),
                 torch.cumprod(x, 0, dtype=torch.float16), "dtype=", **HALF)
    t = torch.ones(4, device=DEV)
    t.cumprod_(0)
    assert emu.fallback_counts() == {}


@pytest.mark.parametrize("dim,keepdim", [((), False), (1, False), ((0, 2), True), (-1, True)])
def test_amin_matches_cpu(emu, dim, keepdim):
    g = torch.Generator().manual_seed(0)
    x = torch.randint(-3, 3, (4, 5, 3), generator=g).float()  # ties: the gradient is shared
    check_module(emu, Fn(lambda t: torch.amin(t, dim, keepdim)), x)
    ints = torch.randint(-9, 9, (4, 5, 3), generator=g)
    assert_close(torch.amin(ints.to(DEV), dim, keepdim), torch.amin(ints, dim, keepdim),
                 "int", 0, 0)


def test_amin_propagates_nan_like_cpu(emu):
    x = torch.tensor([[1.0, float("nan"), -2.0], [3.0, 0.5, 4.0]])
    assert_close(torch.amin(x.to(DEV), 1), torch.amin(x, 1), "nan", 0, 0)


# -- pooling and padding ----------------------------------------------------------------------

@pytest.mark.parametrize("size,out", [((7, 7), 3), ((8, 6), (4, 3)), ((5, 9), (2, 4)),
                                      ((4, 4), 1), ((3, 5), (3, 5))])
@pytest.mark.parametrize("half", [False, True])
def test_adaptive_max_pool2d_matches_cpu(emu, size, out, half):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, *size, generator=g)
    x = x.half() if half else x
    check_module(emu, nn.AdaptiveMaxPool2d(out, return_indices=True), x,
                 **(HALF if half else {}))


def test_adaptive_max_pool2d_3d_input_and_ties_match_cpu(emu):
    x = torch.zeros(2, 5, 5)
    x[0, 1, 1] = 1.0
    check_module(emu, nn.AdaptiveMaxPool2d((2, 3), return_indices=True), x)


PADS = [(1, 2, 1, 2), (0, 0, 3, 1), (2, 0, 0, 0), (3, 3, 3, 3)]


@pytest.mark.parametrize("pad", PADS)
def test_replication_pad2d_backward_matches_cpu(emu, pad):
    g = torch.Generator().manual_seed(0)
    check_module(emu, Fn(lambda t: F.pad(t, pad, mode="replicate")),
                 torch.randn(2, 3, 4, 5, generator=g))


@pytest.mark.parametrize("pad", PADS)
def test_replication_pad2d_backward_in_half_matches_cpu_float(emu, pad):
    # (torch 2.4.1's CPU has no half replication_pad2d: the reference is float32)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 4, 5, generator=g)
    grad = torch.randn(2, 3, 4 + pad[2] + pad[3], 5 + pad[0] + pad[1], generator=g)
    ref = torch.ops.aten.replication_pad2d_backward(grad, x, list(pad))
    got = torch.ops.aten.replication_pad2d_backward(grad.half().to(DEV), x.half().to(DEV),
                                                    list(pad))
    assert got.dtype is torch.float16
    assert_close(got.float(), ref, "half grad", **HALF)
    assert emu.fallback_counts() == {}


def test_replication_pad2d_module_on_3d_input_matches_cpu(emu):
    check_module(emu, nn.ReplicationPad2d((1, 0, 2, 1)), torch.randn(3, 4, 4))


# -- sampling ---------------------------------------------------------------------------------

def test_normal_with_tensor_arguments_draws_the_cpu_numbers(emu):
    mean, std = torch.randn(4, 3), torch.rand(4, 3) + 0.1
    for make in (lambda m, s: torch.normal(m, s), lambda m, s: torch.normal(m, 0.5),
                 lambda m, s: torch.normal(1.0, s), lambda m, s: torch.normal(m, s[0])):
        torch.manual_seed(5)
        ref = make(mean, std)
        torch.manual_seed(5)
        got = make(mean.to(DEV), std.to(DEV))
        assert_close(got, ref, "normal", 0, 0)
    gen_ref, gen_dev = torch.Generator().manual_seed(3), torch.Generator().manual_seed(3)
    assert_close(torch.normal(mean.to(DEV), std.to(DEV), generator=gen_dev),
                 torch.normal(mean, std, generator=gen_ref), "generator", 0, 0)
    assert emu.fallback_counts() == {}


def test_vae_reparametrisation_backward_matches_cpu(emu):
    torch.manual_seed(0)
    enc = nn.Linear(4, 6)

    def sample(m, x):
        torch.manual_seed(11)  # the same draw on both sides
        mu, logvar = m(x).chunk(2, 1)
        return torch.normal(mu, torch.exp(0.5 * logvar))

    check_module(emu, enc, torch.randn(5, 4), call=sample)


def test_normal_rejects_negative_std_like_the_cpu(emu):
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        torch.normal(torch.zeros(3), -torch.ones(3))
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        torch.normal(torch.zeros(3, device=DEV), -torch.ones(3, device=DEV))
    with pytest.raises(RuntimeError, match="std >= 0.0"):
        torch.normal(torch.zeros(3, device=DEV), -1.0)


# -- matrix-vector products -------------------------------------------------------------------

@pytest.mark.parametrize("beta,alpha", [(1, 1), (0.5, 2.0), (0, 1)])
@pytest.mark.parametrize("half", [False, True])
def test_addmv_matches_cpu(emu, beta, alpha, half):
    g = torch.Generator().manual_seed(0)
    args = [torch.randn(4, generator=g), torch.randn(4, 3, generator=g),
            torch.randn(3, generator=g)]
    args = [a.half() for a in args] if half else args
    check_module(emu, Fn(lambda s, m, v: torch.addmv(s, m, v, beta=beta, alpha=alpha)), *args,
                 **(HALF if half else {}))


def test_mv_and_matmul_with_a_vector_match_cpu(emu):
    g = torch.Generator().manual_seed(0)
    m, v = torch.randn(5, 3, generator=g), torch.randn(3, generator=g)
    check_module(emu, Fn(torch.mv), m, v)
    check_module(emu, Fn(lambda a, b: a @ b), m, v)
    check_module(emu, Fn(lambda a, b: b @ a), m, torch.randn(5, generator=g))
    nan_self = torch.full((5,), float("nan"))
    assert_close(torch.addmv(nan_self.to(DEV), m.to(DEV), v.to(DEV), beta=0),
                 torch.addmv(nan_self, m, v, beta=0), "beta=0 ignores NaN")
    assert_close(torch.addmv(torch.tensor(1.0, device=DEV), m.to(DEV), v.to(DEV)),
                 torch.addmv(torch.tensor(1.0), m, v), "0-dim self")


# -- GradScaler -------------------------------------------------------------------------------

@pytest.mark.parametrize("bad", [None, float("inf"), float("nan")])
def test_amp_unscale_matches_cpu(emu, bad):
    g = torch.Generator().manual_seed(0)
    grads = [torch.randn(3, 4, generator=g), torch.randn(5, generator=g)]
    if bad is not None:
        grads[1][2] = bad
    ref = [t.clone() for t in grads]
    dev = [t.to(DEV) for t in grads]
    found_ref, found_dev = torch.zeros(()), torch.zeros((), device=DEV)
    inv_ref = torch.full((), 1 / 1024)
    torch._amp_foreach_non_finite_check_and_unscale_(ref, found_ref, inv_ref)
    torch._amp_foreach_non_finite_check_and_unscale_(dev, found_dev, inv_ref.to(DEV))
    for got, want in zip(dev, ref):
        assert_close(got, want, "unscaled grad", 0, 0)
    assert_close(found_dev, found_ref, "found_inf", 0, 0)
    assert found_ref.item() == (0.0 if bad is None else 1.0)
    assert emu.fallback_counts() == {}


def test_grad_scaler_step_skips_on_overflow_like_cpu(emu):
    # A whole scaler step on the device (scale on the host, as dmlshim's AMP keeps it) next to
    # the CPU scaler: same parameters after a finite step and after an overflowing one.
    torch.manual_seed(0)
    ref = nn.Linear(3, 2)
    dev = nn.Linear(3, 2).to(DEV)
    dev.load_state_dict(ref.state_dict())
    x = torch.randn(4, 3)
    for model, xx in ((ref, x), (dev, x.to(DEV))):
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)
        scaler._lazy_init_scale_growth_tracker(torch.device("cpu"))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for scale_by in (1.0, math.inf):
            opt.zero_grad()
            scaler.scale(model(xx).sum() * scale_by).backward()
            scaler.step(opt)
            scaler.update()
        assert scaler.get_scale() == 2.0 ** 9  # the overflow halved the scale
    for p, q in zip(ref.parameters(), dev.parameters()):
        assert_close(q.detach(), p.detach(), "parameter")
    assert emu.fallback_counts() == {}


# -- zoo models through the runner ------------------------------------------------------------

ZOO = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "benchmarks",
                   "zoo", "train.py")


@pytest.mark.parametrize("model,amp", [
    ("detector", "off"),  # clamp.Tensor, amin, adaptive max pool, replication pad, prod (cumprod)
    ("gnn", "off"),  # index_add_, matrix-vector product
    ("vae", "fp16"),  # torch.normal; float16 autocast with a real GradScaler (unscale)
])
def test_zoo_model_trains_on_the_device_with_zero_fallbacks(tmp_path, model, amp):
    report = tmp_path / "report.json"
    options = {"decompose": "on", "report": str(report), "amp": amp}
    if amp == "fp16":  # autocast as on CUDA: every gap of torch-directml but that one (#454)
        options["emulator_gaps"] = "fallback,float64,generator"
    got = run_shim(ZOO, "--model", model, "--steps", "3", device="emulated-dml",
                   options=options)
    assert got.returncode == 0, describe(got)
    assert "device cuda" in got.stdout, describe(got)
    assert f"scaler_enabled {int(amp == 'fp16')}" in got.stdout, describe(got)
    assert "warmup_fallbacks {}" in got.stdout, describe(got)  # the first step
    fallbacks = json.loads(report.read_text(encoding="utf-8"))["cpu_fallbacks"]
    assert fallbacks["counting"] == "exact" and fallbacks["total"] == 0, fallbacks
    actual = losses(got.stdout)
    assert len(actual) == 3 and all(math.isfinite(v) for v in actual), describe(got)
    if amp == "off":
        ref = run_native(ZOO, "--model", model, "--steps", "3")
        assert ref.returncode == 0, describe(ref)
        torch.testing.assert_close(torch.tensor(actual), torch.tensor(losses(ref.stdout)),
                                   rtol=1e-4, atol=0)
