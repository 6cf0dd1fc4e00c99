"""What CUDA autocast makes of each kind of operator: one line per case, ``case <name> <result>``.

Run on a CUDA machine (``python tests/corpus/amp_ops.py``) it prints CUDA's own answers; under
dmlshim (``DMLSHIM_AMP=fp16``) the same CUDA script's answers on the target. ``<result>`` is the
output dtype (``float16``), or ``raises:<ExceptionType>``. Inputs are float32 unless the case
name says ``16`` (a float16 tensor): cases mix them to exercise each of autocast's cast
policies (lower precision, float32, float32 output dtype, appended dtype, widest input dtype),
the banned ``binary_cross_entropy``, and operators autocast leaves alone.

``--cpu-reference`` runs the cases with ``torch.autocast("cpu", dtype=torch.float16)`` on the
CPU instead (torch's CPU lists, for comparison) and ``--values`` adds each result's float64 sum.
"""

import argparse
import sys

import torch
import torch.nn.functional as F


def cases(dev):
    g = torch.Generator().manual_seed(0)

    def r(*shape, half=False):
        t = torch.randn(*shape, generator=g).to(dev)
        return t.half() if half else t

    a, b = r(4, 4), r(4, 4)
    a16, b16 = r(4, 4, half=True), r(4, 4, half=True)
    v, v16 = r(4), r(4, half=True)
    x3 = r(2, 4, 4)
    img, img16 = r(2, 3, 8, 8), r(2, 3, 8, 8, half=True)
    w2 = r(5, 3, 3, 3)
    seq = r(2, 3, 10)
    w1 = r(4, 3, 3)
    vol = r(1, 2, 4, 4, 4)
    w3 = r(3, 2, 2, 2, 2)
    wt = r(3, 4, 3, 3)
    target = torch.tensor([1, 0, 3, 2]).to(dev)
    prob = torch.rand(4, 4, generator=g).to(dev)
    hx, cx = r(4, 5), r(4, 5)
    w_ih, w_hh, b_ih, b_hh = r(20, 4), r(20, 5), r(20), r(20)
    gw_ih, gw_hh, gb_ih, gb_hh = r(15, 4), r(15, 5), r(15), r(15)
    q = r(2, 2, 6, 8)
    idx = torch.tensor([0, 2]).to(dev)
    grid = (torch.rand(2, 4, 4, 2, generator=g) * 2 - 1).to(dev)
    return {
        # lower_precision_fp: the region's dtype
        "mm": lambda: torch.mm(a, b),
        "mm_16_32": lambda: torch.mm(a16, b),
        "matmul": lambda: a @ b,
        "bmm": lambda: torch.bmm(x3, x3),
        "baddbmm": lambda: torch.baddbmm(x3, x3, x3),
        "addmm": lambda: torch.addmm(a, a, b),
        "addbmm": lambda: torch.addbmm(a, x3, x3),
        "addmv": lambda: torch.addmv(v, a, v),
        "addr": lambda: torch.addr(a, v, v),
        "mv": lambda: torch.mv(a, v),
        "linear": lambda: F.linear(a, b, v),
        "einsum": lambda: torch.einsum("ij,jk->ik", a, b),
        "chain_matmul": lambda: torch.linalg.multi_dot([a, b, a]),
        "conv1d": lambda: F.conv1d(seq, w1),
        "conv2d": lambda: F.conv2d(img, w2),
        "conv2d_16_32": lambda: F.conv2d(img16, w2),
        "conv3d": lambda: F.conv3d(vol, w3),
        "conv_transpose2d": lambda: F.conv_transpose2d(r(2, 3, 4, 4), wt),
        "prelu": lambda: F.prelu(img, r(3)),
        "lstm_cell": lambda: torch.lstm_cell(a, (hx, cx), w_ih, w_hh, b_ih, b_hh)[0],
        "gru_cell": lambda: torch.gru_cell(a, hx, gw_ih, gw_hh, gb_ih, gb_hh),
        "rnn_tanh_cell": lambda: torch.rnn_tanh_cell(a, hx, r(5, 4), r(5, 5), r(5), r(5)),
        "sdpa": lambda: F.scaled_dot_product_attention(q, q, q),
        # fp32: float32 whatever the inputs
        "exp_16": lambda: torch.exp(a16),
        "log_16": lambda: torch.log(a16.abs() + 1),
        "pow_16": lambda: torch.pow(a16, 2),
        "pow_16_16": lambda: torch.pow(a16.abs(), b16),
        "rsqrt_16": lambda: torch.rsqrt(a16.abs() + 1),
        "reciprocal_16": lambda: torch.reciprocal(a16),
        "softplus_16": lambda: F.softplus(a16),
        "layer_norm_16": lambda: F.layer_norm(a16, (4,)),
        "group_norm_16": lambda: F.group_norm(img16, 3),
        "mse_loss_16_32": lambda: F.mse_loss(a16, b),
        "l1_loss_16": lambda: F.l1_loss(a16, b16),
        "smooth_l1_loss_16": lambda: F.smooth_l1_loss(a16, b16),
        "huber_loss_16": lambda: F.huber_loss(a16, b16),
        "kl_div_16": lambda: F.kl_div(a16, b16, reduction="batchmean"),
        "bce_with_logits_16": lambda: F.binary_cross_entropy_with_logits(a16, prob),
        "nll_loss_16": lambda: F.nll_loss(a16, target),
        "cross_entropy_16": lambda: F.cross_entropy(a16, target),
        "cosine_similarity_16": lambda: F.cosine_similarity(a16, b16),
        "cdist_16": lambda: torch.cdist(a16, b16),
        "logsumexp_16": lambda: torch.logsumexp(a16, 1),
        "upsample_nearest_16": lambda: F.interpolate(img16, scale_factor=2),
        "upsample_bilinear_16": lambda: F.interpolate(img16, scale_factor=2, mode="bilinear"),
        "dist_16": lambda: torch.dist(a16, b16),
        # fp32_set_opt_dtype: an unset dtype= becomes float32
        "softmax_16": lambda: torch.softmax(a16, 1),
        "softmax_16_dtype16": lambda: torch.softmax(a16, 1, dtype=torch.float16),
        "log_softmax_16": lambda: F.log_softmax(a16, 1),
        "sum_16": lambda: a16.sum(),
        "sum_dim_16": lambda: a16.sum(1),
        "prod_16": lambda: a16.prod(1),
        "cumsum_16": lambda: a16.cumsum(0),
        "vector_norm_16": lambda: torch.linalg.vector_norm(a16),
        "sum_int": lambda: target.sum(),
        # fp32_append_dtype
        "norm_Scalar_16": lambda: torch.ops.aten.norm.Scalar(a16, 2),
        "norm_dim_16": lambda: torch.ops.aten.norm.ScalarOpt_dim(a16, 2, [1]),
        # promote: the widest floating input
        "addcmul_32_16_16": lambda: torch.addcmul(a, a16, b16),
        "addcmul_16_16_16": lambda: torch.addcmul(a16, a16, b16),
        "addcdiv_16_16_32": lambda: torch.addcdiv(a16, a16, b.abs() + 1),
        "atan2_16_32": lambda: torch.atan2(a16, b),
        "dot_16_32": lambda: torch.dot(v16, v),
        "index_put_32_16": lambda: a.index_put((idx,), a16[:2]),
        "scatter_add_32_16": lambda: a.scatter_add(0, target.view(4, 1).expand(4, 4), a16),
        "cat_16_32": lambda: torch.cat([a16, a]),
        "grid_sample_16": lambda: F.grid_sample(img16, grid.half(), align_corners=False),
        # left alone (fallthrough): the inputs' dtypes and torch's own promotion
        "relu_16": lambda: F.relu(a16),
        "gelu_16": lambda: F.gelu(a16),
        "add_16_32": lambda: a16 + a,
        "add_16_16": lambda: a16 + b16,
        "batch_norm_16": lambda: F.batch_norm(img16, None, None, training=True),
        "dropout_16": lambda: F.dropout(a16, 0.0),
        # banned
        "binary_cross_entropy": lambda: F.binary_cross_entropy(torch.sigmoid(a), prob),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--cpu-reference", action="store_true")
    parser.add_argument("--values", action="store_true")
    args = parser.parse_args()
    if args.cpu_reference:
        dev, region = torch.device("cpu"), lambda: torch.autocast("cpu", dtype=torch.float16)
    else:
        dev = torch.device("cuda" if torch.cuda.is_available() else "cpu")
        region = lambda: torch.autocast("cuda", dtype=torch.float16)  # noqa: E731
    print("device", dev, "torch", torch.__version__)
    for name, fn in cases(dev).items():
        try:
            with region():
                out = fn()
            text = str(out.dtype).replace("torch.", "")
            if args.values:
                text += f" {out.detach().float().cpu().double().sum().item()!r}"
        except Exception as err:  # noqa: BLE001 - the error type is the answer
            text = f"raises:{type(err).__name__}"
        print(f"case {name} {text}")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
