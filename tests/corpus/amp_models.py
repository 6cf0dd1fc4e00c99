"""Four small models trained with CUDA's mixed-precision recipe, the way their CUDA users write it.

A CUDA script: ``.cuda()``, AdamW, an autocast region around forward and loss (each model opens it
a different way: ``torch.autocast("cuda", dtype=torch.float16)``, ``torch.cuda.amp.autocast()``,
``torch.amp.autocast("cuda")``, ``torch.autocast(device_type="cuda")``), a GradScaler
(``torch.amp.GradScaler("cuda")`` or ``torch.cuda.amp.GradScaler()``) with
``scale(loss).backward()``, ``unscale_`` + ``clip_grad_norm_``, ``step``, ``update``. Models
(pure torch, small; one synthetic batch that each model learns to fit):

* ``resnet``: a ResNet (3x3 convs, BatchNorm, residual blocks, a strided 1x1 shortcut, average
  pooling), cross entropy;
* ``gpt``: a GPT-2-like decoder (token and position embeddings, causal self-attention written
  with matmul/masked_fill/softmax in one block and ``scaled_dot_product_attention`` in the other,
  LayerNorm, GELU MLP, a head tied to the embedding), next-token cross entropy;
* ``unet``: a UNet-like conv net (GroupNorm + SiLU blocks, a strided down conv, nearest
  upsampling and a transposed conv up, skip concatenation), MSE to a noise target;
* ``lstm``: an LSTM language model (embedding, 2-layer ``nn.LSTM``, linear head).

Stdout per model: ``loss <model> <step> <float.hex()>``, ``dtypes <model> <output> <loss>``,
``scaler <model> <enabled 0|1> <final scale>``, ``memory <model> <peak> <held>`` (bytes: the
highest ``torch.cuda.max_memory_allocated`` of a step, after ``reset_peak_memory_stats``, and
``torch.cuda.memory_allocated`` after the last step; 0 without CUDA). ``--reference cpu16``
trains on the CPU under ``torch.autocast("cpu", dtype=torch.float16)`` with
``torch.amp.GradScaler("cpu")``; ``--reference cpu32`` in float32 without a scaler: references
to compare the CUDA recipe with.
"""

import argparse
import contextlib
import math

import torch
import torch.nn as nn
import torch.nn.functional as F

# -- models -------------------------------------------------------------------------------------

class Block(nn.Module):
    def __init__(self, cin, cout, stride=1):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.short = None
        if stride != 1 or cin != cout:
            self.short = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                       nn.BatchNorm2d(cout))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + (x if self.short is None else self.short(x)))


class ResNet(nn.Module):
    def __init__(self, classes=10):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU())
        self.layers = nn.Sequential(Block(16, 16), Block(16, 32, 2))
        self.fc = nn.Linear(32, classes)

    def forward(self, x):
        x = self.layers(self.stem(x))
        return self.fc(F.adaptive_avg_pool2d(x, 1).flatten(1))


class Attention(nn.Module):
    def __init__(self, dim, heads, sdpa):
        super().__init__()
        self.heads, self.sdpa = heads, sdpa
        self.qkv = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)

    def forward(self, x):
        b, t, c = x.shape
        q, k, v = self.qkv(x).split(c, dim=2)
        q, k, v = (z.view(b, t, self.heads, c // self.heads).transpose(1, 2) for z in (q, k, v))
        if self.sdpa:
            y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        else:
            att = (q @ k.transpose(-2, -1)) * (1.0 / math.sqrt(k.size(-1)))
            mask = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
            att = F.softmax(att.masked_fill(~mask, float("-inf")), dim=-1)
            y = att @ v
        return self.proj(y.transpose(1, 2).reshape(b, t, c))


class GPTBlock(nn.Module):
    def __init__(self, dim, heads, sdpa):
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = Attention(dim, heads, sdpa)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x):
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab=64, dim=32, heads=2, ctx=16):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, dim), nn.Embedding(ctx, dim)
        self.blocks = nn.Sequential(GPTBlock(dim, heads, False), GPTBlock(dim, heads, True))
        self.ln = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab, bias=False)
        self.head.weight = self.wte.weight  # tied, as GPT-2's
        for emb in (self.wte, self.wpe):
            nn.init.normal_(emb.weight, std=0.02)  # GPT-2's initialisation

    def forward(self, idx):
        pos = torch.arange(idx.size(1), device=idx.device)
        return self.head(self.ln(self.blocks(self.wte(idx) + self.wpe(pos))))


class UNet(nn.Module):
    def __init__(self):
        super().__init__()

        def block(cin, cout):
            return nn.Sequential(nn.Conv2d(cin, cout, 3, 1, 1), nn.GroupNorm(4, cout), nn.SiLU())

        self.inc = block(3, 8)
        self.down = nn.Conv2d(8, 16, 3, 2, 1)
        self.mid = block(16, 16)
        self.up_t = nn.ConvTranspose2d(16, 8, 2, 2)
        self.up_conv = block(16, 8)
        self.dec = block(16, 8)
        self.out = nn.Conv2d(8, 3, 1)

    def forward(self, x):
        skip = self.inc(x)
        h = self.mid(self.down(skip))
        up = torch.cat([self.up_t(h), self.up_conv(F.interpolate(h, scale_factor=2.0))], 1)
        return self.out(self.dec(torch.cat([up[:, :8], skip], 1)))


class LSTMLM(nn.Module):
    def __init__(self, vocab=50):
        super().__init__()
        self.emb = nn.Embedding(vocab, 16)
        self.lstm = nn.LSTM(16, 32, num_layers=2, batch_first=True)
        self.head = nn.Linear(32, vocab)

    def forward(self, x):
        return self.head(self.lstm(self.emb(x))[0])


# -- each model's task, and how its CUDA script opens the region and builds the scaler ---------

INIT_SCALE = {"resnet": 2.0 ** 16, "gpt": 2.0 ** 16, "unet": 2.0 ** 16, "lstm": 2.0 ** 12}


def tasks():
    def classify(model, batch):
        out = model(batch[0])
        return out, F.cross_entropy(out, batch[1])

    def next_token(model, batch):
        out = model(batch[0][:, :-1])
        return out, F.cross_entropy(out.reshape(-1, out.size(-1)), batch[0][:, 1:].reshape(-1))

    def denoise(model, batch):
        out = model(batch[0] + batch[1])
        return out, F.mse_loss(out, batch[1])

    return {
        "resnet": (ResNet, lambda g: (torch.randn(4, 3, 16, 16, generator=g),
                                      torch.randint(0, 10, (4,), generator=g)), classify,
                   lambda: torch.autocast("cuda", dtype=torch.float16),
                   lambda: torch.amp.GradScaler("cuda")),
        "gpt": (GPT, lambda g: (torch.randint(0, 64, (4, 17), generator=g),), next_token,
                lambda: torch.cuda.amp.autocast(), lambda: torch.cuda.amp.GradScaler()),
        "unet": (UNet, lambda g: (torch.randn(2, 3, 16, 16, generator=g),
                                  torch.randn(2, 3, 16, 16, generator=g)), denoise,
                 lambda: torch.amp.autocast("cuda"), lambda: torch.amp.GradScaler("cuda")),
        "lstm": (LSTMLM, lambda g: (torch.randint(0, 50, (4, 13), generator=g),), next_token,
                 lambda: torch.autocast(device_type="cuda"),
                 lambda: torch.amp.GradScaler("cuda", init_scale=INIT_SCALE["lstm"])),
    }


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--models", default="resnet,gpt,unet,lstm")
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--reference", choices=("cpu16", "cpu32"), default=None)
    args = parser.parse_args()
    use_cuda = torch.cuda.is_available() and args.reference is None
    device = torch.device("cuda" if use_cuda else "cpu")
    print("device", device)
    for name in args.models.split(","):
        make_model, make_batch, loss_fn, region, make_scaler = tasks()[name]
        torch.manual_seed(0)
        model = make_model().to(device).train()
        opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
        if args.reference == "cpu16":
            region = lambda: torch.autocast("cpu", dtype=torch.float16)  # noqa: E731
            scaler = torch.amp.GradScaler("cpu", init_scale=INIT_SCALE[name])
        elif args.reference == "cpu32":
            region, scaler = contextlib.nullcontext, torch.amp.GradScaler("cpu", enabled=False)
        else:
            scaler = make_scaler()
        # one batch, seen every step: the loss must fall as the model fits it
        batch = tuple(t.to(device) for t in make_batch(torch.Generator().manual_seed(1)))
        peak = 0
        # the CPU's oneDNN LSTM has no float16 (its fused layer refuses it): torch's own
        # LSTM cell then, for the float16 CPU reference
        no_onednn = contextlib.nullcontext
        if args.reference == "cpu16" and name == "lstm":
            no_onednn = lambda: torch.backends.mkldnn.flags(enabled=False)  # noqa: E731
        for step in range(args.steps):
            if use_cuda:
                torch.cuda.reset_peak_memory_stats()
            opt.zero_grad(set_to_none=True)
            with region(), no_onednn():
                out, loss = loss_fn(model, batch)
            scaler.scale(loss).backward()
            scaler.unscale_(opt)
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            scaler.step(opt)
            scaler.update()
            if use_cuda:
                peak = max(peak, torch.cuda.max_memory_allocated())
            if step == 0:
                print(f"dtypes {name} {str(out.dtype)[6:]} {str(loss.dtype)[6:]}")
            print(f"loss {name} {step} {loss.detach().float().item().hex()}")
        print(f"scaler {name} {int(scaler.is_enabled())} {scaler.get_scale()}")
        held = torch.cuda.memory_allocated() if use_cuda else 0
        print(f"memory {name} {peak} {held}")


if __name__ == "__main__":
    main()
