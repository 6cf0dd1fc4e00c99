"""An op battery: each op on a device against the same op on the CPU, forward and backward.

    python tests/scripts/op_battery.py --device dml          # torch_directml itself, no shim
    python -m dmlshim tests/scripts/op_battery.py --device cuda   # a CUDA script, shimmed

Prints one ``op <name> <STATUS> <detail>`` line per op, flushed as it goes: OK (forward and
input gradients within tolerance of the CPU), MISMATCH, RAISES (an exception; its first line in
the detail). ``--skip a,b`` leaves ops out (a driver that reruns the battery after a crash
skips what already ran and names the op that crashed: tests/test_real_wheel.py). ``--list``
prints the names. Inputs are made on the CPU from a fixed seed, then moved: both sides see the
same numbers.
"""

from __future__ import annotations

import argparse
import sys
from typing import Callable, Dict, List, Sequence, Tuple

import torch
import torch.nn.functional as F

Case = Tuple[Callable[..., object], Callable[[], List[torch.Tensor]]]


def _r(*shape: int) -> torch.Tensor:
    return torch.randn(*shape)


def _pos(*shape: int) -> torch.Tensor:
    return torch.rand(*shape) + 0.1


def _sub_self(a: torch.Tensor) -> torch.Tensor:
    y = a * 1
    y -= y  # Hugging Face Trainer's tr_loss -= tr_loss
    return y + a


def _add_detached_alpha(a: torch.Tensor) -> torch.Tensor:
    y = a * 1
    return y.add_(y.detach(), alpha=-0.5)


def _sub_out_other(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():  # out= takes no autograd
        y = a * 1
        return torch.sub(b, y, out=y)


def _cases() -> Dict[str, Case]:
    g = torch.Generator().manual_seed(0)
    torch.manual_seed(0)
    tgt5 = torch.randint(0, 5, (8,), generator=g)
    tgt256 = torch.randint(0, 256, (8,), generator=g)
    tgt256[::3] = -100
    tgt2d = torch.randint(0, 5, (2, 6, 6), generator=g)
    mask = torch.rand(4, 8, generator=g) > 0.5
    ints = torch.randint(0, 6, (40,), generator=g)

    def t(*xs):
        return lambda: [x.clone() for x in xs]

    return {
        # element-wise
        "add": (lambda a, b: a + b, t(_r(4, 8), _r(4, 8))),
        "add_scalar": (lambda a: a + 2.5, t(_r(4, 8))),
        "mul": (lambda a, b: a * b, t(_r(4, 8), _r(4, 8))),
        "mul_bool_mask": (lambda a, m: a * m, t(_r(4, 8), mask)),
        "mul_bool_mask_inplace": (lambda a, m: a.clone().mul_(m), t(_r(4, 8), mask)),
        "sub_self_inplace": (_sub_self, t(_r(4, 8))),
        "full_float": (lambda a: torch.full((4, 8), 1.5, device=a.device) * a, t(_r(4, 8))),
        "add_detached_alpha": (_add_detached_alpha, t(_r(4, 8))),
        "sub_out_other": (_sub_out_other, t(_r(4, 8), _r(4, 8))),
        "div": (lambda a, b: a / b, t(_r(4, 8), _pos(4, 8))),
        "pow_scalar": (lambda a: a.abs() ** 1.5, t(_r(4, 8))),
        "exp_log": (lambda a: torch.log(torch.exp(a) + 1), t(_r(4, 8))),
        "sqrt_rsqrt": (lambda a: torch.sqrt(a) + torch.rsqrt(a), t(_pos(4, 8))),
        "maximum": (lambda a, b: torch.maximum(a, b), t(_r(4, 8), _r(4, 8))),
        "clamp": (lambda a: a.clamp(-0.5, 0.5), t(_r(4, 8))),
        "where": (lambda a, b, m: torch.where(m, a, b), t(_r(4, 8), _r(4, 8), mask)),
        "masked_fill": (lambda a, m: a.masked_fill(m, -1e4), t(_r(4, 8), mask)),
        "lerp": (lambda a, b: torch.lerp(a, b, 0.3), t(_r(4, 8), _r(4, 8))),
        # activations
        "relu": (F.relu, t(_r(4, 8))),
        "gelu": (F.gelu, t(_r(4, 8))),
        "gelu_tanh": (lambda a: F.gelu(a, approximate="tanh"), t(_r(4, 8))),
        "silu": (F.silu, t(_r(4, 8))),
        "sigmoid_tanh": (lambda a: torch.sigmoid(a) + torch.tanh(a), t(_r(4, 8))),
        "softplus": (F.softplus, t(_r(4, 8))),
        "elu": (F.elu, t(_r(4, 8))),
        "leaky_relu": (lambda a: F.leaky_relu(a, 0.1), t(_r(4, 8))),
        "mish": (F.mish, t(_r(4, 8))),
        "hardswish": (F.hardswish, t(_r(4, 8))),
        "softmax": (lambda a: F.softmax(a, dim=-1), t(_r(4, 8))),
        "log_softmax": (lambda a: F.log_softmax(a, dim=1), t(_r(4, 8))),
        # reductions
        "sum_mean": (lambda a: a.sum(0) + a.mean(1, keepdim=True), t(_r(4, 8))),
        "var_std": (lambda a: a.var(1) + a.std(0).sum(), t(_r(4, 8))),
        "amax": (lambda a: a.amax(1), t(_r(4, 8))),
        "logsumexp": (lambda a: torch.logsumexp(a, dim=1), t(_r(4, 8))),
        "norm": (lambda a: a.norm(dim=1), t(_r(4, 8))),
        "cumsum": (lambda a: a.cumsum(1), t(_r(4, 8))),
        "argmax": (lambda a: a.argmax(1), t(_r(4, 8))),
        "topk": (lambda a: a.topk(3, dim=1).values, t(_r(4, 8))),
        # linear algebra
        "matmul": (lambda a, b: a @ b, t(_r(8, 16), _r(16, 4))),
        "bmm": (torch.bmm, t(_r(2, 4, 8), _r(2, 8, 3))),
        "linear": (F.linear, t(_r(4, 8), _r(6, 8), _r(6))),
        "addmm": (lambda c, a, b: torch.addmm(c, a, b), t(_r(4, 3), _r(4, 8), _r(8, 3))),
        # convolution, pooling, normalisation
        "conv2d": (lambda x, w, b: F.conv2d(x, w, b, padding=1), t(_r(2, 3, 8, 8), _r(4, 3, 3, 3),
                                                                  _r(4))),
        "conv_transpose2d": (lambda x, w: F.conv_transpose2d(x, w, stride=2),
                             t(_r(1, 4, 5, 5), _r(4, 2, 3, 3))),
        "conv1d": (lambda x, w: F.conv1d(x, w), t(_r(2, 3, 16), _r(4, 3, 3))),
        "max_pool2d": (lambda x: F.max_pool2d(x, 2), t(_r(2, 3, 8, 8))),
        "avg_pool2d": (lambda x: F.avg_pool2d(x, 2), t(_r(2, 3, 8, 8))),
        "adaptive_avg_pool2d": (lambda x: F.adaptive_avg_pool2d(x, 1), t(_r(2, 3, 8, 8))),
        "batch_norm_train": (lambda x, w, b: F.batch_norm(x, None, None, w, b, training=True),
                             t(_r(4, 3, 5, 5), _pos(3), _r(3))),
        "batch_norm_eval": (lambda x, m, v: F.batch_norm(x, m, v, training=False),
                            t(_r(4, 3, 5, 5), _r(3), _pos(3))),
        "layer_norm": (lambda x, w, b: F.layer_norm(x, (8,), w, b), t(_r(4, 8), _pos(8), _r(8))),
        "layer_norm_no_bias": (lambda x, w: F.layer_norm(x, (8,), w), t(_r(4, 8), _pos(8))),
        "group_norm": (lambda x, w, b: F.group_norm(x, 2, w, b), t(_r(2, 4, 5, 5), _pos(4),
                                                                  _r(4))),
        "dropout_eval": (lambda x: F.dropout(x, 0.5, training=False), t(_r(4, 8))),
        "sdpa": (lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
                 t(_r(1, 2, 6, 8), _r(1, 2, 6, 8), _r(1, 2, 6, 8))),
        "embedding": (lambda i, w: F.embedding(i, w), t(torch.tensor([[1, 2, 0], [3, 1, 1]]),
                                                        _r(5, 4))),
        "interpolate_nearest": (lambda x: F.interpolate(x, scale_factor=2),
                                t(_r(1, 2, 4, 4))),
        "interpolate_bilinear": (lambda x: F.interpolate(x, scale_factor=2, mode="bilinear"),
                                 t(_r(1, 2, 4, 4))),
        "pad_reflect": (lambda x: F.pad(x, (1, 2, 3, 1), mode="reflect"), t(_r(1, 2, 6, 6))),
        "pad_replicate": (lambda x: F.pad(x, (1, 2, 3, 1), mode="replicate"),
                          t(_r(1, 2, 6, 6))),
        "pad_constant": (lambda x: F.pad(x, (1, 2, 3, 1)), t(_r(1, 2, 6, 6))),
        # losses
        "mse_loss": (F.mse_loss, t(_r(4, 8), _r(4, 8))),
        "l1_loss": (F.l1_loss, t(_r(4, 8), _r(4, 8))),
        "smooth_l1_loss": (F.smooth_l1_loss, t(_r(4, 8), _r(4, 8))),
        "cross_entropy": (F.cross_entropy, t(_r(8, 5), tgt5)),
        "cross_entropy_none": (lambda x, y: F.cross_entropy(x, y, reduction="none") *
                               torch.arange(8.0, device=x.device), t(_r(8, 5), tgt5)),
        "cross_entropy_ignore_index": (lambda x, y: F.cross_entropy(x, y, ignore_index=-100),
                                       t(_r(8, 256), tgt256)),
        "cross_entropy_2d_none": (lambda x, y: F.cross_entropy(x, y, reduction="none"),
                                  t(_r(2, 5, 6, 6), tgt2d)),
        "nll_loss": (lambda x, y: F.nll_loss(F.log_softmax(x, 1), y), t(_r(8, 5), tgt5)),
        "bce_with_logits": (F.binary_cross_entropy_with_logits, t(_r(4, 8), torch.rand(4, 8))),
        "bce": (lambda x, y: F.binary_cross_entropy(torch.sigmoid(x), y),
                t(_r(4, 8), torch.rand(4, 8))),
        "kl_div": (lambda x, y: F.kl_div(F.log_softmax(x, 1), F.softmax(y, 1),
                                         reduction="batchmean"), t(_r(4, 8), _r(4, 8))),
        # shapes and indexing
        "cat_stack": (lambda a, b: torch.cat([a, b]).sum() + torch.stack([a, b]), t(_r(4, 8),
                                                                                   _r(4, 8))),
        "transpose_contiguous": (lambda a: a.t().contiguous() * 2, t(_r(4, 8))),
        "index_select": (lambda a, i: a.index_select(0, i), t(_r(6, 4), torch.tensor([0, 5, 2]))),
        "gather": (lambda a, i: a.gather(1, i), t(_r(4, 8), torch.randint(0, 8, (4, 3),
                                                                         generator=g))),
        "indexing_bool": (lambda a, m: a[m], t(_r(4, 8), mask)),
        "flip_last": (lambda a: a.flip(-1), t(_r(2, 3, 4))),
        "roll": (lambda a: a.roll(2, dims=-1), t(_r(2, 3, 4))),
        "tril": (lambda a: a.tril(), t(_r(5, 5))),
        "eye": (lambda a: torch.eye(4, device=a.device) * a, t(_r(4, 4))),
        "arange_linspace": (lambda a: a + torch.arange(8, device=a.device) +
                            torch.linspace(0, 1, 8, device=a.device), t(_r(4, 8))),
        "unique": (lambda a: torch.unique(a), t(ints)),
        "unique_counts": (lambda a: torch.unique(a, return_counts=True)[1], t(ints)),
        "bincount": (lambda a: torch.bincount(a), t(ints)),
        "sort": (lambda a: a.sort(dim=1).values, t(_r(4, 8))),
        "half_matmul": (lambda a, b: (a.half() @ b.half()).float(), t(_r(8, 16), _r(16, 4))),
        "float16_conv": (lambda x, w: F.conv2d(x.half(), w.half()).float(),
                         t(_r(1, 3, 8, 8), _r(4, 3, 3, 3))),
    }


# gradients are taken with respect to every floating input but these cases' statistics
FIRST_INPUT_ONLY = {"batch_norm_eval"}


def _to(device, xs: Sequence[torch.Tensor], name: str) -> List[torch.Tensor]:
    out = []
    for i, x in enumerate(xs):
        y = x.detach().clone().to(device)  # a leaf of its own on each side
        if y.is_floating_point() and (i == 0 or name not in FIRST_INPUT_ONLY):
            y.requires_grad_(True)
        out.append(y)
    return out


def _run(fn, xs: List[torch.Tensor]):
    out = fn(*xs)
    grads = []
    if isinstance(out, torch.Tensor) and out.is_floating_point() and out.requires_grad:
        out_f = out.float()
        (out_f * torch.linspace(0.5, 1.5, out_f.numel(), device=out_f.device)
         .reshape(out_f.shape)).sum().backward()
        grads = [x.grad for x in xs if x.requires_grad]
    return out, grads


def _close(a, b, tol: float) -> bool:
    if a is None or b is None:
        return a is None and b is None
    a = a.detach().cpu()
    if a.shape != b.shape or a.dtype != b.dtype:
        return False
    if not a.is_floating_point():
        return torch.equal(a, b)
    return torch.allclose(a.float(), b.float(), rtol=tol, atol=tol)


def check(name: str, case: Case, device) -> Tuple[str, str]:
    fn, make = case
    inputs = make()
    want, want_grads = _run(fn, _to("cpu", inputs, name))
    try:
        got, got_grads = _run(fn, _to(device, inputs, name))
        if isinstance(got, torch.Tensor):
            got = got.cpu()
        got_grads = [None if x is None else x.cpu() for x in got_grads]
    except Exception as err:  # noqa: BLE001 - the battery reports what the device raised
        return "RAISES", (str(err).strip().splitlines() or [type(err).__name__])[0][:160]
    tol = 2e-2 if "half" in name or "float16" in name else 1e-4
    if not _close(got, want.detach(), tol):
        return "MISMATCH", "forward"
    if len(got_grads) != len(want_grads) or not all(
            _close(a, b, tol) for a, b in zip(got_grads, want_grads)):
        return "MISMATCH", "backward"
    return "OK", ""


def main(argv: Sequence[str]) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", help="cuda (a CUDA script) or dml "
                   "(torch_directml.device(), no shim)")
    p.add_argument("--skip", default="")
    p.add_argument("--list", action="store_true")
    args = p.parse_args(argv)
    cases = _cases()
    if args.list:
        print("\n".join(cases))
        return 0
    if args.device == "dml":
        import torch_directml

        device = torch_directml.device()
    else:
        device = torch.device(args.device)
    skip = set(filter(None, args.skip.split(",")))
    for name, case in cases.items():
        if name in skip:
            continue
        print(f"start {name}", flush=True)
        status, detail = check(name, case, device)
        print(f"op {name} {status} {detail}".rstrip(), flush=True)
    print("battery done", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
