"""Device kernels for torch-directml's CPU fallbacks (dmlshim.patches.decompose).

On the emulated DirectML device every operator torch-directml 0.2.5 lacks is counted as a CPU
fallback (emulated_dml.fallback_counts()). Each decomposition is checked op by op against
the CPU (forward, and backward where differentiable) with no fallback counted on the way — so a
decomposition that called an op DirectML lacks would fail here — then on training runs of CUDA
scripts through the runner against native CPU runs.
"""

from __future__ import annotations

import contextlib
import copy
import json
import textwrap
import warnings

import pytest
import torch
import torch.nn as nn
import torch.nn.functional as F
from helpers import describe, losses, run_native, run_shim

import dmlshim
from dmlshim.kernels import decompositions
from dmlshim.kernels.decompositions import Decomposition, all_decompositions, falls_back
from dmlshim.patches import decompose
from dmlshim.patching import get_original

DEV = torch.device("privateuseone", 0)
KEY = "aten/{}/PrivateUse1"


def registered_keys():
    impls = torch.library._impls
    return {d.op for d in all_decompositions() if KEY.format(d.name) in impls}


@pytest.fixture
def emu(shim):
    """The emulated DirectML device with decompositions on; fallback counters at zero."""
    shim(device="emulated-dml", decompose="on")
    import emulated_dml as emulator

    emulator.reset_fallback_counts()
    return emulator


def leaves(value):
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (tuple, list)):
        return [t for v in value for t in leaves(v)]
    return []


def weighted_sum(outputs, seed=1):
    """A loss that gives every output element its own gradient (same on CPU and device)."""
    g = torch.Generator().manual_seed(seed)
    total = 0
    for out in outputs:
        if out.is_floating_point():
            w = torch.randn(out.shape, generator=g).to(out.device)
            total = total + (out * w).sum()
    return total


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def assert_close(got, ref, what, rtol=1e-4, atol=1e-5):
    assert got is not None and ref is not None, f"{what}: missing ({got is None}, {ref is None})"
    assert got.device == DEV, f"{what} is on {got.device}"
    torch.testing.assert_close(got.cpu(), ref, rtol=rtol, atol=atol, equal_nan=True,
                               msg=lambda m: f"{what}: {m}")


def check_module(emulator, module, *inputs, call=None, backward=True, rtol=1e-4, atol=1e-5):
    """Run ``module`` on the CPU and (a copy) on the device: outputs and gradients must match,
    and no CPU fallback may be counted on the device."""
    call = call or (lambda m, *xs: m(*xs))
    module.zero_grad(set_to_none=True)
    dev_module = copy.deepcopy(module).to(DEV)
    ref_in = [x.clone().requires_grad_(x.is_floating_point() and backward) for x in inputs]
    dev_in = [x.detach().to(DEV).requires_grad_(x.is_floating_point() and backward)
              for x in inputs]
    ref_out = leaves(call(module, *ref_in))
    emulator.reset_fallback_counts()
    dev_out = leaves(call(dev_module, *dev_in))
    for i, (got, ref) in enumerate(zip(dev_out, ref_out)):
        assert_close(got, ref.detach(), f"output {i}", rtol, atol)
    if backward:
        weighted_sum(dev_out).backward()
        weighted_sum(ref_out).backward()
        for (name, p), q in zip(module.named_parameters(), dev_module.parameters()):
            assert_close(q.grad, p.grad, f"grad of {name}", rtol, atol)
        for i, (x, y) in enumerate(zip(ref_in, dev_in)):
            if x.grad is None:  # not an input of the graph (detached, or an index tensor)
                assert y.grad is None, f"input {i} got a gradient on the device only"
            else:
                assert_close(y.grad, x.grad, f"grad of input {i}", rtol, atol)
    assert emulator.fallback_counts() == {}


# -- registration ----------------------------------------------------------------------------

def test_every_decomposed_op_falls_back_without_dmlshim_and_exists_or_is_versioned():
    # Before installing anything, each op in the table (where this torch has it) has no
    # PrivateUse1 kernel and no composite: registering it overrides nothing.
    present = [d for d in all_decompositions() if decompositions.op_exists(d.op)]
    assert {d.op for d in present} >= {
        "aten::lerp.Scalar_out", "aten::native_group_norm_backward",
        "aten::_thnn_fused_lstm_cell", "aten::_embedding_bag", "aten::upsample_nearest1d.out"}
    for dec in present:
        composite = any(torch._C._dispatch_has_kernel_for_dispatch_key(dec.op, k)
                        for k in ("CompositeImplicitAutograd", "CompositeExplicitAutograd"))
        assert falls_back(dec.op) == (not composite), dec.op
        assert hasattr(torch.ops.aten, dec.name.split(".")[0]), dec.op


def test_falls_back_is_false_for_composites_missing_ops_and_registered_kernels():
    assert not falls_back("aten::softmax.int")  # CompositeImplicitAutograd
    assert not falls_back("aten::_foreach_add_.List")  # CompositeExplicitAutograd (torch >= 2.4)
    assert not falls_back("aten::no_such_op_anywhere")
    lib = torch.library.Library("aten", "IMPL")  # noqa: TOR901
    try:
        lib.impl("isneginf.out", lambda self, *, out: out, "PrivateUse1")
        assert not falls_back("aten::isneginf.out")
        # An op someone (torch-directml) already implements is not registered again.
        reg = decompositions.register([d for d in all_decompositions()
                                       if d.op == "aten::isneginf.out"])
        assert reg.ops == ()
    finally:
        lib._destroy()
    assert falls_back("aten::isneginf.out")


def test_register_skips_unknown_ops_and_remove_is_idempotent():
    ghost = Decomposition("aten::no_such_op_anywhere.out", (), "test", "nothing", lambda: None)
    lerp = next(d for d in all_decompositions() if d.op == "aten::lerp.Scalar_out")
    reg = decompositions.register([ghost, lerp])
    try:
        assert reg.ops == ("aten::lerp.Scalar_out",)
        assert torch._C._dispatch_has_kernel_for_dispatch_key("aten::lerp.Scalar_out",
                                                              "PrivateUse1")
    finally:
        reg.remove()
        reg.remove()
    assert falls_back("aten::lerp.Scalar_out")
    assert KEY.format("lerp.Scalar_out") not in torch.library._impls


def test_remove_without_library_destroy_still_unregisters():
    # Library._destroy is private (torch 2.4.1 and 2.13 have it); without it the C++ handle is
    # reset and torch.library's key set cleaned by hand.
    lerp = next(d for d in all_decompositions() if d.op == "aten::lerp.Scalar_out")
    reg = decompositions.register([lerp])
    reg.library._destroy = None  # shadows the method on this instance
    reg.remove()
    assert falls_back("aten::lerp.Scalar_out")
    assert KEY.format("lerp.Scalar_out") not in torch.library._impls


def test_install_registers_on_directml_only_and_uninstall_removes_every_registration(shim):
    shim(device="cpu")
    assert registered_keys() == set()
    dmlshim.uninstall()
    shim(device="emulated-dml", decompose="off")
    assert registered_keys() == set()
    dmlshim.uninstall()
    shim(device="emulated-dml", decompose="on")
    expected = {d.op for d in all_decompositions() if decompositions.op_exists(d.op)
                and not any(torch._C._dispatch_has_kernel_for_dispatch_key(d.when or d.op, k)
                            for k in ("CompositeImplicitAutograd", "CompositeExplicitAutograd"))}
    assert registered_keys() == expected
    for op in expected:
        assert torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1"), op
    assert torch.backends.mha.get_fastpath_enabled() is False
    dmlshim.uninstall()
    assert registered_keys() == set()
    for op in expected:
        assert not torch._C._dispatch_has_kernel_for_dispatch_key(op, "PrivateUse1"), op
    assert torch.backends.mha.get_fastpath_enabled() is True
    # The emulated device stays registered: the op falls back again, counted.
    import emulated_dml as emulator

    emulator.reset_fallback_counts()
    a, b = torch.zeros(3, device=DEV), torch.ones(3, device=DEV)
    with quiet():  # torch-directml warns once per op and process: maybe not here
        torch.lerp(a, b, 0.25)
    assert emulator.fallback_counts() == {"aten::lerp.Scalar_out": 1}


def test_install_is_idempotent_and_reinstall_does_not_double_register(shim):
    shim(device="emulated-dml", decompose="on")
    first = registered_keys()
    shim(device="emulated-dml", decompose="on")  # same options: nothing happens
    shim(device="emulated-dml", decompose="on", log="info")  # other options: reinstall
    assert registered_keys() == first


def test_markdown_table_lists_every_decomposition_with_its_issue():
    table = decompositions.markdown_table()
    for dec in all_decompositions():
        assert f"`{dec.op}`" in table
        for n in dec.issues:
            assert f"#{n}" in table


# -- fallback counts: off has them, on has none -----------------------------------------------

def _adam_step():
    p = nn.Parameter(torch.randn(4, 3, device=DEV))
    opt = torch.optim.Adam([p], lr=0.1, amsgrad=True)
    p.grad = torch.randn(4, 3, device=DEV)
    opt.step()


def _lstm():
    nn.LSTM(4, 5).to(DEV)(torch.randn(3, 2, 4, device=DEV))[0].sum().backward()


def _group_norm():
    x = torch.randn(2, 6, 5, device=DEV, requires_grad=True)
    nn.GroupNorm(3, 6).to(DEV)(x).sum().backward()


def _embedding_bag():
    bag = nn.EmbeddingBag(10, 4, mode="mean").to(DEV)
    bag(torch.tensor([[1, 2], [4, 5]], device=DEV)).sum().backward()


def _upsample():
    x = torch.randn(2, 3, 4, device=DEV, requires_grad=True)
    F.interpolate(x, scale_factor=2, mode="nearest").sum().backward()


def _bce():
    x = torch.rand(5, device=DEV, requires_grad=True)
    F.binary_cross_entropy(x, torch.rand(5, device=DEV)).backward()


PATHS = {
    "adam": (_adam_step, {"aten::lerp.Scalar_out", "aten::clamp_min.Tensor_out"}),
    "lstm": (_lstm, {"aten::_thnn_fused_lstm_cell"}),
    "group_norm": (_group_norm, {"aten::native_group_norm_backward"}),
    "embedding_bag": (_embedding_bag, {"aten::_embedding_bag"}),
    "upsample": (_upsample, {"aten::upsample_nearest1d.out"}),
    "bce": (_bce, {"aten::binary_cross_entropy"}),
}


def test_with_decompose_off_the_paths_fall_back_and_with_on_they_do_not(shim):
    import emulated_dml as emulator

    shim(device="emulated-dml", decompose="off")
    for name, (path, ops) in PATHS.items():
        emulator.reset_fallback_counts()
        with quiet():
            try:
                path()
            except NotImplementedError:  # the fused LSTM cell: no CPU kernel either (#654)
                assert name == "lstm"
        counts = emulator.fallback_counts()
        assert ops <= set(counts) and all(counts[op] > 0 for op in ops), (name, counts)
    dmlshim.uninstall()
    shim(device="emulated-dml", decompose="on")
    for name, (path, _) in PATHS.items():
        emulator.reset_fallback_counts()
        path()
        assert emulator.fallback_counts() == {}, name


# -- op by op against the CPU -----------------------------------------------------------------

@pytest.mark.parametrize("weight", [0.0, 0.1, 0.4999, 0.5, 0.9, 1.0, -0.3, 1.7])
def test_lerp_scalar_matches_cpu(emu, weight):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(5, 7, generator=g), torch.randn(5, 7, generator=g)
    da, db = a.to(DEV), b.to(DEV)
    assert_close(torch.lerp(da, db, weight), torch.lerp(a, b, weight), "lerp", 1e-6, 1e-6)
    # (an out= of the result's shape: the wheel's out= kernels do not resize, nor does the
    # strict emulator)
    out = torch.empty(5, 7, device=DEV)
    torch.lerp(da, db[0], weight, out=out)  # broadcast into out=
    assert_close(out, torch.lerp(a, b[0], weight), "lerp out=", 1e-6, 1e-6)
    da.lerp_(db, weight)
    assert_close(da, a.lerp(b, weight), "lerp_", 1e-6, 1e-6)
    assert emu.fallback_counts() == {}


def test_lerp_tensor_weight_and_autograd_match_cpu(emu):
    g = torch.Generator().manual_seed(0)
    a, b = torch.randn(4, 6, generator=g), torch.randn(4, 6, generator=g)
    w = torch.rand(4, 6, generator=g) * 1.5 - 0.25
    check_module(emu, nn.Identity(), a, b, w, call=lambda m, x, y, z: torch.lerp(x, y, z),
                 rtol=1e-6, atol=1e-6)
    check_module(emu, nn.Identity(), a, b, call=lambda m, x, y: torch.lerp(x, y, 0.3),
                 rtol=1e-6, atol=1e-6)


def test_clamp_with_tensor_bounds_and_foreach_maximum_minimum_match_cpu(emu):
    a = torch.tensor([1.0, float("nan"), -2.0, 3.0, 0.0])
    b = torch.tensor([0.5, 0.0, float("nan"), 4.0, -0.0])
    assert_close(torch.clamp_min(a.to(DEV), b.to(DEV)), torch.clamp_min(a, b), "clamp_min",
                 0, 0)
    assert_close(torch.clamp(a.to(DEV), min=b.to(DEV)), torch.clamp(a, min=b), "clamp", 0, 0)
    assert_close(torch.clamp(a.to(DEV), max=b.to(DEV)), torch.clamp(a, max=b), "clamp", 0, 0)
    assert_close(torch.clamp(a.to(DEV), b.to(DEV), b.to(DEV) - 1), torch.clamp(a, b, b - 1),
                 "clamp min > max", 0, 0)
    assert_close(torch.clamp_max(a.to(DEV), b.to(DEV)), torch.clamp_max(a, b), "clamp_max", 0, 0)
    xs, ys = [a.clone(), b.clone()], [b.clone(), a.clone()]
    dxs = [x.to(DEV) for x in xs]
    torch._foreach_maximum_(dxs, [y.to(DEV) for y in ys])
    torch._foreach_maximum_(xs, ys)
    torch._foreach_minimum_(dxs, [y.to(DEV) for y in ys])
    torch._foreach_minimum_(xs, ys)
    for got, ref in zip(dxs, xs):
        assert_close(got, ref, "_foreach_maximum_/_foreach_minimum_", 0, 0)
    assert emu.fallback_counts() == {}


@pytest.mark.parametrize("shape,groups,affine", [
    ((4, 6, 5, 3), 3, True), ((4, 6, 5, 3), 2, False), ((3, 4), 2, True), ((2, 6, 7), 6, True),
    ((2, 8, 3, 2, 2), 1, True),
])
def test_group_norm_matches_cpu(emu, shape, groups, affine):
    torch.manual_seed(0)
    module = nn.GroupNorm(groups, shape[1], affine=affine)
    if affine:
        with torch.no_grad():
            module.weight.uniform_(0.5, 1.5)
            module.bias.uniform_(-0.5, 0.5)
    check_module(emu, module, torch.randn(*shape) * 2 + 1)


def test_group_norm_half_precision_matches_cpu(emu):
    torch.manual_seed(0)
    module = nn.GroupNorm(2, 4).half()
    check_module(emu, module, torch.randn(3, 4, 5).half(), rtol=1e-2, atol=1e-2)


def test_group_norm_backward_without_input_grad(emu):
    module = nn.GroupNorm(2, 4)
    check_module(emu, module, torch.randn(3, 4, 5), call=lambda m, x: m(x.detach()))


@pytest.mark.parametrize("kwargs", [
    {}, {"num_layers": 2, "bias": False}, {"bidirectional": True, "batch_first": True},
    {"num_layers": 2, "proj_size": 3, "dropout": 0.0},
])
def test_lstm_matches_cpu(emu, kwargs):
    torch.manual_seed(0)
    module = nn.LSTM(4, 5, **kwargs)
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    hidden = kwargs.get("proj_size", 5)
    x = torch.randn(3, 6, 4)
    h0, c0 = torch.randn(layers, 3 if kwargs.get("batch_first") else 6, hidden), \
        torch.randn(layers, 3 if kwargs.get("batch_first") else 6, 5)
    check_module(emu, module, x, h0, c0, call=lambda m, x, h, c: m(x, (h, c)))


def test_lstm_cell_and_only_cy_used_match_cpu(emu):
    torch.manual_seed(0)
    cell = nn.LSTMCell(4, 5)
    x, h, c = torch.randn(3, 4), torch.randn(3, 5), torch.randn(3, 5)
    check_module(emu, cell, x, h, c, call=lambda m, x, h, c: m(x, (h, c)))
    # Only the cell state feeds the loss: the backward gets grad_hy undefined.
    check_module(emu, cell, x, h, c, call=lambda m, x, h, c: m(x, (h, c))[1])
    check_module(emu, cell, x, h, c, call=lambda m, x, h, c: m(x, (h, c))[0])


def test_lstm_double_backward_matches_cpu(emu):
    torch.manual_seed(0)
    cell = nn.LSTMCell(3, 4)
    dev_cell = copy.deepcopy(cell).to(DEV)

    def grad_norm(m, x):
        hy, cy = m(x)
        (g,) = torch.autograd.grad((hy * cy).sum(), x, create_graph=True)
        return (g * g).sum()

    x = torch.randn(2, 3, requires_grad=True)
    dx = x.detach().to(DEV).requires_grad_()
    grad_norm(cell, x).backward()
    grad_norm(dev_cell, dx).backward()
    assert_close(dx.grad, x.grad, "double backward")
    assert emu.fallback_counts() == {}


@pytest.mark.parametrize("kwargs", [{}, {"bias": False, "num_layers": 2},
                                    {"bidirectional": True, "batch_first": True}])
def test_gru_matches_cpu(emu, kwargs):
    torch.manual_seed(0)
    module = nn.GRU(4, 5, **kwargs)
    layers = kwargs.get("num_layers", 1) * (2 if kwargs.get("bidirectional") else 1)
    x, h0 = torch.randn(3, 6, 4), torch.randn(layers, 3 if kwargs.get("batch_first") else 6, 5)
    check_module(emu, module, x, h0)


def test_gru_cell_matches_cpu(emu):
    torch.manual_seed(0)
    check_module(emu, nn.GRUCell(4, 5), torch.randn(3, 4), torch.randn(3, 5))


BAG_INDICES = torch.tensor([1, 2, 4, 5, 4, 3, 2, 9, 0, 0, 7])
BAG_OFFSETS = torch.tensor([0, 4, 4, 6, 8])  # bag 1 empty, bag 3 = [2, 9], bag 4 = [0, 0, 7]


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
@pytest.mark.parametrize("padding_idx", [None, 4, 0])
@pytest.mark.parametrize("include_last_offset", [False, True])
def test_embedding_bag_matches_cpu(emu, mode, padding_idx, include_last_offset):
    torch.manual_seed(0)
    module = nn.EmbeddingBag(10, 3, mode=mode, padding_idx=padding_idx,
                             include_last_offset=include_last_offset)
    offsets = BAG_OFFSETS
    if include_last_offset:
        offsets = torch.cat([offsets, torch.tensor([BAG_INDICES.numel()])])
    check_module(emu, module, BAG_INDICES, offsets)


BAG_2D = torch.tensor([[1, 2, 2, 7], [7, 7, 3, 1], [0, 11, 2, 2]])


@pytest.mark.parametrize("mode", ["sum", "mean", "max"])
def test_embedding_bag_2d_input_matches_cpu(emu, mode):
    torch.manual_seed(0)
    check_module(emu, nn.EmbeddingBag(12, 4, mode=mode), BAG_2D)


@pytest.mark.parametrize("mode", ["sum", "mean"])
def test_embedding_bag_scale_grad_by_freq_divides_by_each_index_frequency(emu, mode):
    # The CPU kernel divides by the count of the wrong index (pytorch/pytorch#190063, torch
    # 2.4.1 and 2.13 alike); CUDA divides each row's gradient by its own index's frequency, as
    # documented, and so does the device kernel: the reference is the unscaled CPU gradient
    # divided by the frequencies.
    torch.manual_seed(0)
    ref = nn.EmbeddingBag(12, 4, mode=mode)
    dev = copy.deepcopy(ref).to(DEV)
    dev.scale_grad_by_freq = True
    weighted_sum([ref(BAG_2D)]).backward()
    weighted_sum([dev(BAG_2D.to(DEV))]).backward()
    freq = torch.bincount(BAG_2D.flatten(), minlength=12).clamp_min(1).unsqueeze(1)
    assert_close(dev.weight.grad, ref.weight.grad / freq, "scaled weight grad")
    assert emu.fallback_counts() == {}


@pytest.mark.parametrize("padding_idx", [None, 2])
def test_embedding_bag_per_sample_weights_match_cpu(emu, padding_idx):
    torch.manual_seed(0)
    module = nn.EmbeddingBag(10, 3, mode="sum", padding_idx=padding_idx)
    psw = torch.rand(BAG_INDICES.numel())
    check_module(emu, module, BAG_INDICES, BAG_OFFSETS, psw,
                 call=lambda m, i, o, w: m(i, o, per_sample_weights=w))


def test_embedding_bag_without_grad_matches_cpu(emu):
    torch.manual_seed(0)
    module = nn.EmbeddingBag(10, 3, mode="max").requires_grad_(False)
    with torch.no_grad():
        check_module(emu, module, BAG_INDICES, BAG_OFFSETS, backward=False)
    check_module(emu, nn.Identity(), torch.randn(10, 3), call=lambda m, w: F.embedding_bag(
        BAG_INDICES.to(w.device), w, BAG_OFFSETS.to(w.device), mode="mean"))


@pytest.mark.parametrize("kwargs", [{"scale_factor": 2}, {"scale_factor": 3},
                                    {"scale_factor": 1.5}, {"size": 11}, {"size": 4},
                                    {"scale_factor": 0.7}])
def test_upsample_nearest1d_matches_cpu(emu, kwargs):
    torch.manual_seed(0)
    check_module(emu, nn.Upsample(mode="nearest", **kwargs), torch.randn(2, 3, 7),
                 rtol=0, atol=1e-6)


@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True])
def test_binary_cross_entropy_matches_cpu(emu, reduction, weighted):
    g = torch.Generator().manual_seed(0)
    x = torch.rand(4, 5, generator=g).clamp(1e-3, 1 - 1e-3)
    x[0, 0], x[0, 1] = 0.0, 1.0  # the clamped log terms
    target = torch.rand(4, 5, generator=g)
    weight = torch.rand(5, generator=g) if weighted else None
    # The target gets no gradient here: its backward formula in PyTorch calls aten::logit,
    # which torch-directml lacks too (outside this table: targets rarely require grad).
    check_module(emu, nn.BCELoss(weight=weight, reduction=reduction), x.clamp(0, 1), target,
                 call=lambda m, x, t: m(x, t.detach()))


def test_binary_cross_entropy_rejects_inputs_outside_0_1_like_the_cpu(emu):
    x, t = torch.tensor([0.5, 1.5]), torch.tensor([0.0, 1.0])
    with pytest.raises(RuntimeError, match="between 0 and 1") as cpu_err:
        F.binary_cross_entropy(x, t)
    with pytest.raises(RuntimeError, match="between 0 and 1") as dev_err:
        F.binary_cross_entropy(x.to(DEV), t.to(DEV))
    assert str(cpu_err.value).strip() == str(dev_err.value).strip()


def test_isneginf_matches_cpu(emu):
    x = torch.tensor([1.0, float("-inf"), float("inf"), float("nan"), -0.0])
    assert_close(torch.isneginf(x.to(DEV)), torch.isneginf(x), "isneginf", 0, 0)
    n = torch.tensor([-3, 0, 5])
    assert_close(torch.isneginf(n.to(DEV)), torch.isneginf(n), "isneginf int", 0, 0)
    assert emu.fallback_counts() == {}


def test_transformer_inference_skips_the_falling_back_fast_path_and_matches_cpu(emu):
    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(16, 4, dim_feedforward=32, batch_first=True).eval()
    encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False).eval()
    with torch.no_grad():
        check_module(emu, encoder, torch.randn(3, 5, 16), backward=False, rtol=1e-4, atol=1e-5)
        mha = nn.MultiheadAttention(16, 4, batch_first=True).eval()
        x = torch.randn(2, 5, 16)
        check_module(emu, mha, x, x, x, backward=False)


# -- optimizers -------------------------------------------------------------------------------

OPTIMIZERS = {
    "Adam": (torch.optim.Adam, {"lr": 0.01}),
    "AdamW": (torch.optim.AdamW, {"lr": 0.01, "weight_decay": 0.1}),
    "Adam-amsgrad": (torch.optim.Adam, {"lr": 0.01, "amsgrad": True}),
    "SGD-momentum": (torch.optim.SGD, {"lr": 0.05, "momentum": 0.9, "nesterov": True}),
    "RMSprop": (torch.optim.RMSprop, {"lr": 0.01, "momentum": 0.5}),
    "Adamax": (torch.optim.Adamax, {"lr": 0.01}),
    "NAdam": (torch.optim.NAdam, {"lr": 0.01}),
}


@pytest.mark.parametrize("foreach", [None, False])
@pytest.mark.parametrize("name", list(OPTIMIZERS))
def test_optimizer_steps_match_cpu_without_fallbacks(emu, name, foreach):
    cls, kwargs = OPTIMIZERS[name]
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(5, 8), nn.Tanh(), nn.Linear(8, 3))
    dev_model = copy.deepcopy(model).to(DEV)
    ref_opt = cls(model.parameters(), foreach=foreach, **kwargs)
    dev_opt = cls(dev_model.parameters(), foreach=foreach, **kwargs)
    x, y = torch.randn(16, 5), torch.randn(16, 3)
    for _ in range(3):
        for m, opt, xx, yy in ((model, ref_opt, x, y), (dev_model, dev_opt, x.to(DEV), y.to(DEV))):
            opt.zero_grad()
            F.mse_loss(m(xx), yy).backward()
            opt.step()
    for (pname, p), q in zip(model.named_parameters(), dev_model.parameters()):
        assert_close(q.detach(), p.detach(), pname, 1e-5, 1e-6)
    assert emu.fallback_counts() == {}


def test_foreach_is_kept_where_the_foreach_ops_run_on_the_device(emu):
    from torch.optim.optimizer import _default_to_fused_or_foreach

    assert not decompose.foreach_falls_back()
    p = nn.Parameter(torch.zeros(2, device=DEV))
    assert _default_to_fused_or_foreach([p], False) == (False, True)


def test_foreach_defaults_off_where_the_foreach_ops_fall_back(shim, monkeypatch):
    import torch.optim.optimizer as optimizer_mod
    import torch.utils._foreach_utils as foreach_utils

    originals = (optimizer_mod._get_foreach_kernels_supported_devices,
                 foreach_utils._get_foreach_kernels_supported_devices)
    monkeypatch.setattr(decompose, "foreach_falls_back", lambda: True)
    shim(device="emulated-dml", decompose="on")
    p = nn.Parameter(torch.zeros(2, device=DEV))
    assert optimizer_mod._default_to_fused_or_foreach([p], False) == (False, False)
    assert "privateuseone" not in optimizer_mod._get_foreach_kernels_supported_devices()
    assert "cuda" in foreach_utils._get_foreach_kernels_supported_devices()
    assert not foreach_utils._device_has_foreach_support(DEV)
    # An explicit foreach=True is the user's choice: kept.
    opt = torch.optim.Adam([p], foreach=True)
    assert opt.defaults["foreach"] is True
    dmlshim.uninstall()
    assert (optimizer_mod._get_foreach_kernels_supported_devices,
            foreach_utils._get_foreach_kernels_supported_devices) == originals
    assert get_original(optimizer_mod, "_get_foreach_kernels_supported_devices") is originals[0]
    assert optimizer_mod._default_to_fused_or_foreach([p], False) == (False, True)


# -- training runs through the runner, against native CPU runs --------------------------------

MIXED_SCRIPT = textwrap.dedent('''
    """CUDA-style training of a model that uses every decomposed layer: EmbeddingBag, Conv1d,
    GroupNorm, nearest 1-D upsampling, GRU, LSTMCell, BCE loss, AdamW with amsgrad."""
    import torch
    import torch.nn as nn
    import torch.nn.functional as F

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.bag = nn.EmbeddingBag(40, 16, mode="mean", padding_idx=0)
            self.conv = nn.Conv1d(16, 16, 3, padding=1)
            self.norm = nn.GroupNorm(4, 16)
            self.up = nn.Upsample(scale_factor=2, mode="nearest")
            self.gru = nn.GRU(16, 12, batch_first=True)
            self.cell = nn.LSTMCell(12, 8)
            self.head = nn.Linear(8, 1)

        def forward(self, tokens):
            b, t = tokens.shape
            x = self.bag(tokens.reshape(-1, 4)).reshape(b, t // 4, 16).transpose(1, 2)
            x = self.up(F.relu(self.norm(self.conv(x))))
            out, _ = self.gru(x.transpose(1, 2))
            h, _ = self.cell(out[:, -1])
            return torch.sigmoid(self.head(h)).squeeze(1)

    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print("device", device)
    g = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 40, (64, 16), generator=g)
    labels = (tokens[:, :8].sum(1) > tokens[:, 8:].sum(1)).float()
    model = Net().to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2, amsgrad=True)
    for step in range(8):
        idx = torch.arange(step * 8, step * 8 + 8) % 64
        x, y = tokens[idx].to(device), labels[idx].to(device)
        optimizer.zero_grad()
        loss = F.binary_cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss 1 {step} {loss.item().hex()}")
''')


def _assert_trains_like_cpu(script, args, tmp_path, rtol):
    report = tmp_path / "report.json"
    ref = run_native(script, *args)
    assert ref.returncode == 0, describe(ref)
    got = run_shim(script, *args, device="emulated-dml",
                   options={"decompose": "on", "report": str(report)})
    assert got.returncode == 0, describe(got)
    assert "device cuda" in got.stdout, describe(got)
    expected, actual = losses(ref.stdout), losses(got.stdout)
    assert expected and len(actual) == len(expected), describe(got)
    torch.testing.assert_close(torch.tensor(actual), torch.tensor(expected), rtol=rtol, atol=0)
    fallbacks = json.loads(report.read_text(encoding="utf-8"))["cpu_fallbacks"]
    assert fallbacks["total"] == 0, fallbacks


def test_mixed_model_trains_on_the_device_like_the_cpu(tmp_path):
    script = tmp_path / "mixed_train.py"
    script.write_text(MIXED_SCRIPT, encoding="utf-8")
    _assert_trains_like_cpu(script, (), tmp_path, rtol=1e-4)


@pytest.mark.parametrize("script", ["lstm_lm", "cnn", "transformer"])
def test_corpus_trains_on_the_device_like_the_cpu(tmp_path, script):
    # lstm_lm cannot train at all on torch-directml without the fused-cell kernels (#654);
    # cnn steps Adam (lerp, #675); transformer steps AdamW and runs eval-mode inference.
    _assert_trains_like_cpu(script, ("--epochs", "1"), tmp_path, rtol=1e-4)
