"""A GPT-2-like language model (token and position embeddings, pre-LayerNorm blocks of causal
self-attention and a GELU MLP, weights tied to the output layer), written for a CUDA machine
(``--device cpu``: the same run on the CPU). ``--attn`` picks how the causal mask is applied:
``masked_fill_`` (in place, as many hand-written attentions do), ``masked_fill`` (nanoGPT's
slow path) or ``sdpa`` (``scaled_dot_product_attention(is_causal=True)``).

Stdout: ``loss 1 <step> <float.hex()>`` per step.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, dim, heads, block, attn):
        super().__init__()
        self.heads, self.attn = heads, attn
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.register_buffer("causal", torch.tril(torch.ones(block, block, dtype=torch.bool)))

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.attn == "sdpa":
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
            future = ~self.causal[:t, :t]
            if self.attn == "masked_fill_":
                att.masked_fill_(future, float("-inf"))
            else:
                att = att.masked_fill(future, float("-inf"))
            y = F.softmax(att, dim=-1) @ v
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, c))


class Block(nn.Module):
    def __init__(self, dim, heads, block, attn):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = CausalSelfAttention(dim, heads, block, attn)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=64, block=16, dim=32, heads=4, layers=2, attn="masked_fill_"):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(block, dim)
        self.drop = nn.Dropout(0.1)
        self.blocks = nn.ModuleList(Block(dim, heads, block, attn) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2

    def forward(self, idx, targets):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.drop(self.wte(idx) + self.wpe(pos))
        for block in self.blocks:
            x = block(x)
        logits = self.head(self.ln_f(x))
        return F.cross_entropy(logits.view(-1, logits.size(-1)), targets.reshape(-1))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--attn", choices=["masked_fill_", "masked_fill", "sdpa"],
                        default="masked_fill_")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = GPT(attn=args.attn).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    data = torch.randint(0, 64, (args.steps, 4, 17))
    for step in range(args.steps):
        batch = data[step].to(device)
        loss = model(batch[:, :-1], batch[:, 1:])
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
        print(f"loss 1 {step} {loss.item().hex()}")


if __name__ == "__main__":
    main()
