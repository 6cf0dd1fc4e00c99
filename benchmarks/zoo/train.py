"""The model zoo of benchmarks/fallbacks.py: one CUDA training recipe, many models.

Each model is trained the way its CUDA users train it: ``.cuda()``, AdamW (Adam for the GAN),
``torch.autocast("cuda", dtype=torch.float16)`` around the forward and the loss, a
``torch.amp.GradScaler("cuda")``, ``scaler.unscale_`` + ``clip_grad_norm_`` + ``scaler.step`` +
``scaler.update``. Nothing here knows about DirectML: ``python -m dmlshim`` decides what
``cuda`` and the autocast region become (``DMLSHIM_AMP=off``: float32 and a disabled scaler;
``fp16``: float16 autocast and a real scaler where the device can autocast). Models are small
(the fallback counts do not depend on their size) and data synthetic (nothing downloaded).

    python benchmarks/zoo/train.py --model vae --steps 4          # natively, on CUDA or the CPU
    python -m dmlshim benchmarks/zoo/train.py --model vae         # through the shim

Output: ``loss 1 <step> <hex>`` per step and ``loss_steps <n>``. The first step is a warm-up
(optimizer state, the scaler's first scale, lazy buffers): when the script runs on dmlshim's
emulated device, the emulator's fallback counters are printed (``warmup_fallbacks {json}``) and
reset after it, so the report counts the steady-state steps only (``measured_steps <n>``).
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn as nn
import torch.nn.functional as F

Batch = Tuple[torch.Tensor, ...]


class Task:
    """A model, a batch maker and a loss; ``optimizers`` for models with more than one."""

    def __init__(self, model: nn.Module, batch: Callable[[torch.Generator], Batch],
                 loss: Callable[[nn.Module, Batch], torch.Tensor], lr: float = 1e-3) -> None:
        self.model, self.batch, self.loss, self.lr = model, batch, loss, lr


# -- models that need only torch --------------------------------------------------------------

def lstm_lm() -> Task:
    class LM(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.emb = nn.Embedding(100, 32)
            self.lstm = nn.LSTM(32, 48, num_layers=2, dropout=0.1, batch_first=True)
            self.head = nn.Linear(48, 100)

        def forward(self, x):
            out, _ = self.lstm(self.emb(x))
            return self.head(out)

    def batch(g):
        tokens = torch.randint(0, 100, (4, 13), generator=g)
        return tokens[:, :-1], tokens[:, 1:]

    return Task(LM(), batch, lambda m, b: F.cross_entropy(m(b[0]).flatten(0, 1), b[1].flatten()))


class _GAN(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.g = nn.Sequential(
            nn.ConvTranspose2d(16, 32, 4, 1, 0, bias=False), nn.BatchNorm2d(32), nn.ReLU(True),
            nn.ConvTranspose2d(32, 16, 4, 2, 1, bias=False), nn.BatchNorm2d(16), nn.ReLU(True),
            nn.ConvTranspose2d(16, 3, 4, 2, 1, bias=False), nn.Tanh())
        self.d = nn.Sequential(
            nn.Conv2d(3, 16, 4, 2, 1, bias=False), nn.LeakyReLU(0.2, inplace=True),
            nn.Conv2d(16, 32, 4, 2, 1, bias=False), nn.BatchNorm2d(32),
            nn.LeakyReLU(0.2, inplace=True), nn.Conv2d(32, 1, 4, 1, 0, bias=False))


def dcgan() -> Task:
    # Two optimizers: handled by train_gan below; the Task carries model and batch only.
    def batch(g):
        return torch.rand(4, 3, 16, 16, generator=g) * 2 - 1, torch.randn(4, 16, 1, 1, generator=g)

    return Task(_GAN(), batch, lambda m, b: torch.zeros(()), lr=2e-4)


def seq2seq() -> Task:
    class Seq2Seq(nn.Module):
        def __init__(self, vocab: int = 50, hidden: int = 32) -> None:
            super().__init__()
            self.src_emb = nn.Embedding(vocab, hidden)
            self.tgt_emb = nn.Embedding(vocab, hidden, padding_idx=0)
            self.encoder = nn.GRU(hidden, hidden, batch_first=True, bidirectional=True)
            self.bridge = nn.Linear(2 * hidden, hidden)
            self.decoder = nn.GRUCell(2 * hidden, hidden)
            self.attn = nn.Linear(2 * hidden, hidden, bias=False)
            self.out = nn.Linear(3 * hidden, vocab)

        def forward(self, src, tgt_in):
            enc, h = self.encoder(self.src_emb(src))  # (B, S, 2H)
            state = torch.tanh(self.bridge(torch.cat([h[0], h[1]], 1)))
            keys = self.attn(enc)  # (B, S, H)
            context = enc.mean(1)
            logits = []
            for t in range(tgt_in.size(1)):  # Bahdanau-style attention, teacher forcing
                state = self.decoder(torch.cat([self.tgt_emb(tgt_in[:, t]), context[:, :32]], 1),
                                     state)
                scores = torch.bmm(keys, state.unsqueeze(2)).squeeze(2)
                weights = F.softmax(scores, dim=1)
                context = torch.bmm(weights.unsqueeze(1), enc).squeeze(1)
                logits.append(self.out(torch.cat([state, context], 1)))
            return torch.stack(logits, 1)

    def batch(g):
        src = torch.randint(1, 50, (4, 9), generator=g)
        tgt = torch.randint(1, 50, (4, 7), generator=g)
        tgt[:, -2:] = 0  # padding, ignored by the loss
        return src, tgt[:, :-1], tgt[:, 1:]

    def loss(m, b):
        logits = m(b[0], b[1])
        return F.cross_entropy(logits.flatten(0, 1), b[2].flatten(), ignore_index=0,
                               label_smoothing=0.1)

    return Task(Seq2Seq(), batch, loss)


def vae() -> Task:
    class VAE(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.enc = nn.Sequential(nn.Linear(64, 48), nn.ReLU(), nn.Linear(48, 2 * 8))
            self.dec = nn.Sequential(nn.Linear(8, 48), nn.ReLU(), nn.Linear(48, 64))

        def forward(self, x):
            mu, logvar = self.enc(x).chunk(2, dim=1)
            z = torch.normal(mu, torch.exp(0.5 * logvar))  # the reparametrisation trick
            return self.dec(z), mu, logvar

    def loss(m, b):
        logits, mu, logvar = m(b[0])
        with torch.autocast("cuda", enabled=False):  # BCE is unsafe to autocast
            recon = F.binary_cross_entropy(torch.sigmoid(logits.float()), b[0], reduction="sum")
        kl = -0.5 * torch.sum(1 + logvar - mu.pow(2) - logvar.exp())
        return (recon + kl) / b[0].size(0)

    return Task(VAE(), lambda g: (torch.rand(8, 64, generator=g),), loss)


def elu_mlp() -> Task:
    model = nn.Sequential(nn.Linear(16, 32), nn.ELU(), nn.Linear(32, 32), nn.SELU(),
                          nn.AlphaDropout(0.1), nn.Linear(32, 32), nn.CELU(0.5),
                          nn.Linear(32, 4))

    def batch(g):
        return torch.randn(16, 16, generator=g), torch.randn(16, 4, generator=g)

    return Task(model, batch, lambda m, b: F.mse_loss(m(b[0]), b[1]))


def huber_regressor() -> Task:
    model = nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 3))

    def batch(g):
        x = torch.randn(32, 8, generator=g)
        return x, x[:, :3] * 2 + torch.randn(32, 3, generator=g) * 3  # heavy noise: robust loss

    def loss(m, b):
        out = m(b[0])
        return F.huber_loss(out, b[1], delta=1.5) + nn.SmoothL1Loss(beta=0.5)(out, b[1])

    return Task(model, batch, loss)


def gnn() -> Task:
    nodes, edges = 20, 60

    class GraphNet(nn.Module):
        """Message passing with index_add_ (GCN-style sum aggregation) and an attention
        readout with a matrix-vector product."""

        def __init__(self) -> None:
            super().__init__()
            self.inp = nn.Linear(6, 16)
            self.msg = nn.ModuleList([nn.Linear(16, 16) for _ in range(2)])
            self.gate = nn.Parameter(torch.randn(16) * 0.1)
            self.head = nn.Linear(16, 3)

        def forward(self, x, edge_index):
            src, dst = edge_index
            h = F.relu(self.inp(x))
            deg = torch.zeros(x.size(0), device=x.device).index_add_(
                0, dst, torch.ones(dst.numel(), device=x.device)).clamp_min(1)
            for layer in self.msg:
                agg = torch.zeros_like(h).index_add_(0, dst, layer(h)[src].to(h.dtype))
                h = F.relu(h + agg / deg.unsqueeze(1))
            score = torch.softmax(h @ self.gate.to(h.dtype), dim=0)  # matrix-vector: addmv
            return self.head(h), (score.unsqueeze(1) * h).sum(0)

    def batch(g):
        return (torch.randn(nodes, 6, generator=g), torch.randint(0, nodes, (2, edges), generator=g),
                torch.randint(0, 3, (nodes,), generator=g))

    def loss(m, b):
        logits, pooled = m(b[0], b[1])
        return F.cross_entropy(logits, b[2]) + 0.01 * pooled.float().pow(2).sum()

    return Task(GraphNet(), batch, loss)


def box_detector() -> Task:
    size = 32.0

    class Detector(nn.Module):
        """A tiny anchor-free detector: a replicate-padded backbone, adaptive max pooling, box
        regression clamped to the image with tensor bounds, a GIoU loss (amin/amax corners)."""

        def __init__(self) -> None:
            super().__init__()
            self.stem = nn.Sequential(
                nn.ReplicationPad2d(1), nn.Conv2d(3, 16, 3, stride=2), nn.BatchNorm2d(16),
                nn.SiLU())
            self.pad = nn.ReplicationPad2d(1)
            self.conv = nn.Conv2d(16, 16, 3, stride=2)
            self.pool = nn.AdaptiveMaxPool2d((3, 3))
            self.boxes = nn.Linear(16 * 9, 4 * 4)
            self.logits = nn.Linear(16 * 9, 4)

        def forward(self, x):
            # (padded in float32: torch 2.4.1's CPU, which the emulator runs, has no float16
            # replication pad; the conv after it autocasts back to float16)
            f = F.silu(self.conv(self.pad(self.stem(x).float())))
            f = self.pool(f).flatten(1)
            return self.boxes(f).view(-1, 4, 4), self.logits(f)

    def batch(g):
        imgs = torch.rand(4, 3, 32, 32, generator=g)
        xy = torch.rand(4, 4, 2, generator=g) * 20
        wh = torch.rand(4, 4, 2, generator=g) * 10 + 2
        return imgs, torch.cat([xy, xy + wh], 2), (torch.rand(4, 4, generator=g) > 0.5).float()

    def loss(m, b):
        raw, logits = m(b[0])
        raw, logits = raw.float(), logits.float()
        centre = torch.sigmoid(raw[..., :2]) * size
        half = torch.exp(raw[..., 2:].clamp(max=4))
        boxes = torch.cat([centre - half, centre + half], 2)
        lo = torch.zeros(4, device=boxes.device)
        hi = torch.full((4,), size, device=boxes.device)
        boxes = torch.clamp(boxes, min=lo, max=hi)  # tensor bounds: clamp.Tensor
        target = b[1]
        stacked = torch.stack([boxes, target], 0)
        inter_lo = torch.amax(stacked[..., :2], 0)
        inter_hi = torch.amin(stacked[..., 2:], 0)
        inter = (inter_hi - inter_lo).clamp(min=0).prod(-1)
        area = lambda bx: (bx[..., 2] - bx[..., 0]) * (bx[..., 3] - bx[..., 1])  # noqa: E731
        union = area(boxes) + area(target) - inter
        hull = (torch.amax(stacked[..., 2:], 0) - torch.amin(stacked[..., :2], 0)).prod(-1)
        giou = inter / union - (hull - union) / hull
        return (1 - giou).mean() + F.binary_cross_entropy_with_logits(logits, b[2])

    return Task(Detector(), batch, loss)


# -- framework models (timm, transformers, diffusers, ultralytics) ----------------------------

def resnet50() -> Task:
    import timm

    model = timm.create_model("resnet50", pretrained=False, num_classes=10)

    def batch(g):
        return torch.randn(2, 3, 64, 64, generator=g), torch.randint(0, 10, (2,), generator=g)

    return Task(model, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1], label_smoothing=0.1))


def vit() -> Task:
    import timm

    model = timm.create_model("vit_tiny_patch16_224", pretrained=False, num_classes=10,
                              img_size=32, patch_size=8, depth=2)

    def batch(g):
        return torch.randn(2, 3, 32, 32, generator=g), torch.randint(0, 10, (2,), generator=g)

    return Task(model, batch, lambda m, b: F.cross_entropy(m(b[0]), b[1], label_smoothing=0.1))


def gpt2() -> Task:
    from transformers import GPT2Config, GPT2LMHeadModel

    config = GPT2Config(vocab_size=200, n_positions=32, n_embd=32, n_layer=2, n_head=2)
    model = GPT2LMHeadModel(config)

    def batch(g):
        return (torch.randint(0, 200, (2, 16), generator=g),)

    return Task(model, batch, lambda m, b: m(input_ids=b[0], labels=b[0]).loss, lr=3e-4)


def bert() -> Task:
    from transformers import BertConfig, BertForMaskedLM

    config = BertConfig(vocab_size=200, hidden_size=32, num_hidden_layers=2,
                        num_attention_heads=2, intermediate_size=64, max_position_embeddings=32)
    model = BertForMaskedLM(config)

    def batch(g):
        ids = torch.randint(5, 200, (2, 16), generator=g)
        labels = torch.full_like(ids, -100)
        masked = torch.rand(ids.shape, generator=g) < 0.3
        labels[masked] = ids[masked]
        ids = ids.masked_fill(masked, 4)
        return ids, torch.ones_like(ids), labels

    return Task(model, batch,
                lambda m, b: m(input_ids=b[0], attention_mask=b[1], labels=b[2]).loss, lr=3e-4)


def unet() -> Task:
    from diffusers import DDPMScheduler, UNet2DModel

    model = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                        block_out_channels=(16, 32), norm_num_groups=8,
                        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                        up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    scheduler = DDPMScheduler(num_train_timesteps=1000)
    state: Dict[str, torch.Tensor] = {}

    def loss(m, b):
        x0 = b[0]
        if "alphas" not in state:  # the schedule on the device: cumprod of alphas there
            betas = torch.linspace(1e-4, 0.02, 1000, device=x0.device)
            state["alphas"] = torch.cumprod(1.0 - betas, dim=0)
            scheduler.alphas_cumprod = state["alphas"]
        noise = torch.randn(x0.shape, device=x0.device)
        t = torch.randint(0, 1000, (x0.size(0),), device=x0.device)
        noisy = scheduler.add_noise(x0, noise, t)
        return F.mse_loss(m(noisy, t).sample.float(), noise)

    return Task(model, lambda g: (torch.randn(2, 3, 16, 16, generator=g),), loss, lr=1e-4)


def yolov8n() -> Task:
    import os
    import tempfile

    os.environ.setdefault("YOLO_OFFLINE", "1")
    os.environ.setdefault("YOLO_CONFIG_DIR", tempfile.mkdtemp(prefix="zoo-yolo-"))
    from ultralytics.nn.tasks import DetectionModel
    from ultralytics.utils import DEFAULT_CFG

    model = DetectionModel("yolov8n.yaml", nc=4, verbose=False)  # built from its config
    model.args = DEFAULT_CFG  # the hyperparameters its own loss reads (box, cls, dfl gains)

    def batch(g):
        n = 6
        return (torch.rand(2, 3, 64, 64, generator=g), torch.tensor([0, 0, 0, 1, 1, 1]),
                torch.randint(0, 4, (n, 1), generator=g).float(),
                torch.rand(n, 2, generator=g) * 0.5 + 0.25, torch.rand(n, 2, generator=g) * 0.2 + 0.05)

    def loss(m, b):
        img, batch_idx, cls, xy, wh = b
        targets = {"batch_idx": batch_idx, "cls": cls, "bboxes": torch.cat([xy, wh], 1),
                   "img": img}
        total, _ = m.loss(targets, m(img))
        return total.sum()

    return Task(model, batch, loss, lr=1e-3)


MODELS: Dict[str, Callable[[], Task]] = {
    "lstm_lm": lstm_lm, "dcgan": dcgan, "seq2seq": seq2seq, "vae": vae, "elu_mlp": elu_mlp,
    "huber": huber_regressor, "gnn": gnn, "detector": box_detector,
    "resnet50": resnet50, "vit": vit, "gpt2": gpt2, "bert": bert, "unet": unet,
    "yolov8n": yolov8n,
}
FRAMEWORK = {"resnet50": "timm", "vit": "timm", "gpt2": "transformers", "bert": "transformers",
             "unet": "diffusers", "yolov8n": "ultralytics"}


# -- the recipe -------------------------------------------------------------------------------

def to_device(batch: Batch, device: torch.device) -> Batch:
    return tuple(t.to(device) for t in batch)


def train_step(task: Task, opt, scaler, batch: Batch) -> torch.Tensor:
    with torch.autocast("cuda", dtype=torch.float16):
        loss = task.loss(task.model, batch)
    opt.zero_grad(set_to_none=True)
    scaler.scale(loss).backward()
    scaler.unscale_(opt)
    torch.nn.utils.clip_grad_norm_(task.model.parameters(), 1.0)
    scaler.step(opt)
    scaler.update()
    return loss


def gan_step(task: Task, opts, scaler, batch: Batch) -> torch.Tensor:
    gan, (opt_d, opt_g) = task.model, opts
    real, z = batch
    ones = torch.ones(real.size(0), device=real.device)
    zeros = torch.zeros(real.size(0), device=real.device)
    with torch.autocast("cuda", dtype=torch.float16):
        fake = gan.g(z)
        d_loss = (F.binary_cross_entropy_with_logits(gan.d(real).flatten(), ones)
                  + F.binary_cross_entropy_with_logits(gan.d(fake.detach()).flatten(), zeros))
    opt_d.zero_grad(set_to_none=True)
    scaler.scale(d_loss).backward()
    scaler.step(opt_d)
    with torch.autocast("cuda", dtype=torch.float16):
        g_loss = F.binary_cross_entropy_with_logits(gan.d(fake).flatten(), ones)
    opt_g.zero_grad(set_to_none=True)
    scaler.scale(g_loss).backward()
    scaler.step(opt_g)
    scaler.update()
    return d_loss + g_loss


def _emulator():
    """dmlshim's emulator when this process trains on it (a benchmark hook, not the recipe)."""
    if "emulated_dml" not in sys.modules:
        return None
    emulator = sys.modules["emulated_dml"]
    return emulator if emulator.is_registered() else None


def main(argv: List[str]) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", choices=sorted(MODELS), required=True)
    p.add_argument("--steps", type=int, default=4)
    a = p.parse_args(argv)
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print("device", device)
    task = MODELS[a.model]()
    task.model = task.model.to(device).train()
    scaler = torch.amp.GradScaler("cuda")
    g = torch.Generator().manual_seed(1)
    if a.model == "dcgan":
        opts = (torch.optim.Adam(task.model.d.parameters(), lr=task.lr, betas=(0.5, 0.999)),
                torch.optim.Adam(task.model.g.parameters(), lr=task.lr, betas=(0.5, 0.999)))
        step_fn: Callable = gan_step
    else:
        opts = torch.optim.AdamW(task.model.parameters(), lr=task.lr, weight_decay=0.01)
        step_fn = train_step
    for step in range(a.steps):
        loss = step_fn(task, opts, scaler, to_device(task.batch(g), device))
        value = float(loss.detach().float().item())
        if not math.isfinite(value):
            print(f"nonfinite_loss {step}")
        print(f"loss 1 {step} {value.hex()}")
        emulator = _emulator()
        if step == 0 and emulator is not None:
            print("warmup_fallbacks " + json.dumps(emulator.fallback_counts(), sort_keys=True))
            emulator.reset_fallback_counts()
    print(f"scaler_enabled {int(scaler.is_enabled())}")  # float16 with a real scaler, or float32
    print(f"loss_steps {a.steps}")
    print(f"measured_steps {a.steps - 1 if _emulator() is not None else a.steps}")


if __name__ == "__main__":
    main(sys.argv[1:])
