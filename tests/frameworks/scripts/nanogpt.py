"""A nanoGPT-style ``train.py`` (Karpathy's structure, tiny): ``LayerNorm(bias=False)`` (a
custom module over ``F.layer_norm`` with ``bias=None``), causal self-attention through
``F.scaled_dot_product_attention``, weight tying, fused AdamW when ``'cuda' in device``,
``torch.cuda.is_bf16_supported()`` choosing the autocast dtype, ``torch.amp.autocast`` in a
``nullcontext``-or-autocast ``ctx``, ``GradScaler(enabled=dtype == 'float16')``, and
``--compile`` for ``torch.compile(model)``. ``--device cpu`` is the same run told to use the CPU.

Stdout: ``device <device>``, ``dtype <autocast dtype>``, ``loss 1 <iter> <float.hex()>``; what
nanoGPT prints at each ``eval_interval`` (its ``estimate_loss()``: ``model.eval()``, mean losses
of ``eval_iters`` batches of each split under ``torch.no_grad``, here before the first iteration
and after the last) as ``logged train|val <iter> <float.hex()>``, and the trained parameters as
``param`` lines (fwreport.py).
"""

import argparse
import math
from contextlib import nullcontext

import fwreport
import torch
import torch.nn as nn
from torch.nn import functional as F


class LayerNorm(nn.Module):
    """LayerNorm but with an optional bias. PyTorch doesn't support simply bias=False"""

    def __init__(self, ndim, bias):
        super().__init__()
        self.weight = nn.Parameter(torch.ones(ndim))
        self.bias = nn.Parameter(torch.zeros(ndim)) if bias else None

    def forward(self, input):
        return F.layer_norm(input, self.weight.shape, self.weight, self.bias, 1e-5)


class Block(nn.Module):
    def __init__(self, n_embd, n_head, bias):
        super().__init__()
        self.ln_1 = LayerNorm(n_embd, bias)
        self.c_attn = nn.Linear(n_embd, 3 * n_embd, bias=bias)
        self.c_proj = nn.Linear(n_embd, n_embd, bias=bias)
        self.ln_2 = LayerNorm(n_embd, bias)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd, bias=bias), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd, bias=bias))
        self.n_head = n_head

    def attn(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, vocab=64, block_size=16, n_layer=2, n_head=2, n_embd=32, bias=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.h = nn.ModuleList([Block(n_embd, n_head, bias) for _ in range(n_layer)])
        self.ln_f = LayerNorm(n_embd, bias)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.wte.weight = self.lm_head.weight  # weight tying
        self.apply(self._init_weights)
        for pn, p in self.named_parameters():
            if pn.endswith("c_proj.weight"):
                nn.init.normal_(p, mean=0.0, std=0.02 / math.sqrt(2 * n_layer))

    def _init_weights(self, module):
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, mean=0.0, std=0.02)
            if getattr(module, "bias", None) is not None:
                nn.init.zeros_(module.bias)

    def forward(self, idx, targets):
        pos = torch.arange(0, idx.size(1), dtype=torch.long, device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.h:
            x = block(x)
        logits = self.lm_head(self.ln_f(x))
        return logits, F.cross_entropy(logits.view(-1, logits.size(-1)), targets.view(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--compile", action="store_true")
    parser.add_argument("--iters", type=int, default=5)
    parser.add_argument("--fused", choices=["auto", "on"], default="auto",
                        help="on: fused AdamW on any device (nanoGPT fuses only on CUDA)")
    args = parser.parse_args()

    device = args.device
    device_type = "cuda" if "cuda" in device else "cpu"
    dtype = ("bfloat16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported()
             else "float16")
    ptdtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[dtype]
    ctx = (nullcontext() if device_type == "cpu"
           else torch.amp.autocast(device_type=device_type, dtype=ptdtype))
    torch.manual_seed(1337)
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    print("device", device)
    print("dtype", dtype)

    data = torch.randint(0, 64, (4096,), generator=torch.Generator().manual_seed(0))
    val_data = torch.randint(0, 64, (1024,), generator=torch.Generator().manual_seed(3))
    g = torch.Generator().manual_seed(2)

    def get_batch(split="train", gen=g):
        source = data if split == "train" else val_data
        ix = torch.randint(len(source) - 16, (8,), generator=gen)
        x = torch.stack([source[i:i + 16] for i in ix])
        y = torch.stack([source[i + 1:i + 17] for i in ix])
        if device_type == "cuda":
            return x.pin_memory().to(device, non_blocking=True), y.pin_memory().to(
                device, non_blocking=True)
        return x.to(device), y.to(device)

    model = GPT().to(device)
    scaler = torch.amp.GradScaler("cuda", enabled=(dtype == "float16"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, betas=(0.9, 0.95),
                                  fused=device_type == "cuda" or args.fused == "on")
    if args.compile:
        model = torch.compile(model)

    @torch.no_grad()
    def estimate_loss(eval_iters=2):
        out = {}
        model.eval()
        # the same batches at each evaluation, drawn apart from the training batches' generator
        gen = torch.Generator().manual_seed(4)
        for split in ["train", "val"]:
            losses = torch.zeros(eval_iters)
            for k in range(eval_iters):
                X, Y = get_batch(split, gen)
                with ctx:
                    _, loss = model(X, Y)
                losses[k] = loss.item()
            out[split] = losses.mean()
        model.train()
        return out

    def evaluate(it):
        losses = estimate_loss()
        print(f"step {it}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
        fwreport.log("train", it, losses["train"])
        fwreport.log("val", it, losses["val"])

    evaluate(0)
    X, Y = get_batch()
    for it in range(args.iters):
        with ctx:
            _, loss = model(X, Y)
        X, Y = get_batch()
        scaler.scale(loss).backward()
        scaler.unscale_(optimizer)
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad(set_to_none=True)
        print(f"loss 1 {it} {loss.float().item().hex()}")
    evaluate(args.iters)
    # torch.compile wraps the model (under dmlshim on DirectML it gives the eager one back)
    fwreport.params(getattr(model, "_orig_mod", model))


if __name__ == "__main__":
    main()
