"""A tiny GPT-style causal transformer trained to continue modular-arithmetic sequences:
token embedding + learned positions, two pre-norm ``nn.TransformerEncoderLayer`` blocks
(``batch_first=True``, GELU, LayerNorm) with a causal mask, weight-decayed AdamW with parameter
groups, ``OneCycleLR``, gradient clipping, and a greedy-decoding accuracy check in eval mode.

CUDA idioms exercised: the string device ``device = "cuda" if torch.cuda.is_available() else
"cpu"``, ``device=device`` in tensor factories (``torch.arange``, ``torch.full``,
``nn.Transformer.generate_square_subsequent_mask``), ``torch.cuda.manual_seed_all``,
``model.to(device)`` and ``x.to(device)`` with a string device.
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


def make_sequences(n, seq_len, vocab, seed):
    """x[t+1] = (x[t] + step) mod vocab, with a per-sequence random start and step."""
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab, (n, 1), generator=g)
    step = torch.randint(1, 4, (n, 1), generator=g)
    t = torch.arange(seq_len + 1).unsqueeze(0)
    return (start + step * t) % vocab


class TinyGPT(nn.Module):
    def __init__(self, vocab, d_model=64, nhead=4, num_layers=2, max_len=32, dropout=0.1):
        super().__init__()
        self.tok_emb = nn.Embedding(vocab, d_model)
        self.pos_emb = nn.Embedding(max_len, d_model)
        layer = nn.TransformerEncoderLayer(
            d_model, nhead, dim_feedforward=4 * d_model, dropout=dropout,
            activation="gelu", batch_first=True, norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, num_layers, enable_nested_tensor=False)
        self.ln_f = nn.LayerNorm(d_model)
        self.head = nn.Linear(d_model, vocab, bias=False)
        self.d_model = d_model

    def forward(self, idx):
        b, t = idx.shape
        pos = torch.arange(t, device=idx.device)
        x = self.tok_emb(idx) * math.sqrt(self.d_model) + self.pos_emb(pos)
        mask = nn.Transformer.generate_square_subsequent_mask(t, device=idx.device)
        x = self.blocks(x, mask=mask, is_causal=True)
        return self.head(self.ln_f(x))


def configure_optimizer(model, lr, weight_decay):
    decay, no_decay = [], []
    for name, p in model.named_parameters():
        (decay if p.dim() >= 2 and "emb" not in name else no_decay).append(p)
    groups = [{"params": decay, "weight_decay": weight_decay},
              {"params": no_decay, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.95))


@torch.no_grad()
def greedy_accuracy(model, prompts, targets, device):
    model.eval()
    idx = prompts.to(device)
    for _ in range(targets.size(1)):
        logits = model(idx)
        idx = torch.cat([idx, logits[:, -1].argmax(dim=-1, keepdim=True)], dim=1)
    generated = idx[:, prompts.size(1):].cpu()
    return (generated == targets).float().mean().item()


def main():
    parser = argparse.ArgumentParser(description="tiny causal transformer")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=32)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(args.seed)
    torch.cuda.manual_seed_all(args.seed)
    print("device", device)

    vocab, seq_len = 17, 16
    data = make_sequences(512, seq_len, vocab, seed=1)
    model = TinyGPT(vocab, max_len=seq_len + 8).to(device)
    optimizer = configure_optimizer(model, args.lr, weight_decay=0.1)
    steps_per_epoch = data.size(0) // args.batch_size
    scheduler = torch.optim.lr_scheduler.OneCycleLR(
        optimizer, max_lr=args.lr, total_steps=args.epochs * steps_per_epoch, pct_start=0.3)

    for epoch in range(1, args.epochs + 1):
        model.train()
        perm = torch.randperm(data.size(0))
        for step in range(steps_per_epoch):
            batch = data[perm[step * args.batch_size:(step + 1) * args.batch_size]].to(device)
            x, y = batch[:, :-1], batch[:, 1:]
            logits = model(x)
            loss = F.cross_entropy(logits.reshape(-1, vocab), y.reshape(-1))
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            scheduler.step()
            print(f"loss {epoch} {step} {loss.item().hex()}")

        test = make_sequences(64, 8, vocab, seed=100 + epoch)
        acc = greedy_accuracy(model, test[:, :4], test[:, 4:], device)
        print(f"epoch {epoch} greedy_acc {acc:.4f} lr {scheduler.get_last_lr()[0]:.2e}")


if __name__ == "__main__":
    main()
