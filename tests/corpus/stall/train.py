"""A CUDA training script in the shapes that stall on DirectML, chosen by flags.

On DirectML every ``model.to(device)`` between the CPU and the adapter (and every
``load_state_dict(..., assign=True)``) makes new Parameter objects, so an optimizer holding the
old ones trains nothing. The flags pick how the script gets there:

  --order wrong      optimizer (and scheduler) built BEFORE model.to(device) [and the load]
  --order right      built after them (the order that works everywhere)
  --bounce           every epoch: model.cpu(), torch.save(state_dict), model.to(device)
  --assign           model.load_state_dict(torch.load(checkpoint), assign=True) after the move
  --recreate         the published workaround: a new optimizer every epoch, the scheduler built
                     on the first one
  --model mlp|tied|lstm, --optim sgd|adam|adamw|rmsprop, --sched none|step|onecycle|plateau
  --overwrite-params torch.__future__.set_overwrite_module_params_on_conversion(True): makes
                     conversions replace Parameters on any device, as DirectML does

Data order is fixed (no shuffle, no dropout), so a stalled run prints the same training losses
every epoch. Output: ``device <device>``, ``loss <epoch> <step> <float.hex()>`` per batch and
``loss <epoch> val <float.hex()>`` per epoch.
"""

import argparse
import io

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

VOCAB = 24


class MLP(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(8, 32)
        self.fc2 = nn.Linear(32, 4)

    def forward(self, x):
        return self.fc2(F.relu(self.fc1(x)))


class TiedLM(nn.Module):
    """Next-token model whose output layer shares the embedding matrix (weight tying)."""

    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, 16)
        self.hidden = nn.Linear(16, 16)
        self.decoder = nn.Linear(16, VOCAB)
        self.decoder.weight = self.encoder.weight

    def forward(self, tokens):
        return self.decoder(torch.tanh(self.hidden(self.encoder(tokens))))


class LSTMLM(nn.Module):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Embedding(VOCAB, 12)
        self.rnn = nn.LSTM(12, 16, num_layers=1, batch_first=True)
        self.decoder = nn.Linear(16, VOCAB)

    def forward(self, tokens):
        out, _ = self.rnn(self.encoder(tokens))
        return self.decoder(out)


def make_data(kind, n, seed):
    g = torch.Generator().manual_seed(seed)
    if kind == "mlp":
        # one fixed labelling rule for every split: class = argmax(x @ w), 10% label noise
        w = torch.randn(8, 4, generator=torch.Generator().manual_seed(1234))
        x = torch.randn(n, 8, generator=g)
        y = (x @ w).argmax(dim=1)
        noise = torch.rand(n, generator=g) < 0.1
        y[noise] = torch.randint(0, 4, (int(noise.sum()),), generator=g)
        return x, y
    # a noisy "next token = 5 * token + 3 (mod V)" stream
    tokens = torch.randint(0, VOCAB, (n, 6), generator=g)
    targets = (tokens * 5 + 3) % VOCAB
    noise = torch.rand(n, 6, generator=g) < 0.1
    targets[noise] = torch.randint(0, VOCAB, (int(noise.sum()),), generator=g)
    return tokens, targets


def make_optimizer(name, params, lr):
    if name == "sgd":
        return torch.optim.SGD(params, lr=lr, momentum=0.9)
    if name == "adam":
        return torch.optim.Adam(params, lr=lr)
    if name == "adamw":
        return torch.optim.AdamW(params, lr=lr, weight_decay=0.05)
    if name == "rmsprop":
        return torch.optim.RMSprop(params, lr=lr, momentum=0.5)
    raise SystemExit(f"unknown optimizer {name}")


def make_scheduler(name, optimizer, lr, total_steps):
    if name == "step":
        return torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
    if name == "onecycle":
        return torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=lr * 2,
                                                   total_steps=total_steps)
    if name == "plateau":
        return torch.optim.lr_scheduler.ReduceLROnPlateau(optimizer, factor=0.5, patience=0)
    return None


def loss_fn(output, target):
    return F.cross_entropy(output.reshape(-1, output.size(-1)), target.reshape(-1))


def main():
    parser = argparse.ArgumentParser(description="a CUDA training script that stalls on DirectML")
    parser.add_argument("--model", choices=["mlp", "tied", "lstm"], default="mlp")
    parser.add_argument("--optim", choices=["sgd", "adam", "adamw", "rmsprop"], default="sgd")
    parser.add_argument("--sched", choices=["none", "step", "onecycle", "plateau"],
                        default="none")
    parser.add_argument("--order", choices=["wrong", "right"], default="wrong")
    parser.add_argument("--bounce", action="store_true")
    parser.add_argument("--assign", action="store_true")
    parser.add_argument("--recreate", action="store_true")
    parser.add_argument("--overwrite-params", action="store_true")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()

    if args.overwrite_params:
        torch.__future__.set_overwrite_module_params_on_conversion(True)
    torch.manual_seed(args.seed)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    print("device", device)

    kind = "mlp" if args.model == "mlp" else "tokens"
    n_train = args.steps * args.batch_size
    x, y = make_data(kind, n_train, seed=1)
    val_x, val_y = make_data(kind, 64, seed=2)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=False)
    val_loader = DataLoader(TensorDataset(val_x, val_y), batch_size=32)

    model = {"mlp": MLP, "tied": TiedLM, "lstm": LSTMLM}[args.model]()
    lr = args.lr if args.lr is not None else {"sgd": 0.1, "adam": 0.02, "adamw": 0.02,
                                              "rmsprop": 0.01}[args.optim]
    total_steps = args.epochs * args.steps
    checkpoint = io.BytesIO()
    torch.save(model.state_dict(), checkpoint)

    def build():
        opt = make_optimizer(args.optim, model.parameters(), lr)
        return opt, make_scheduler(args.sched, opt, lr, total_steps)

    if args.order == "wrong":
        optimizer, scheduler = build()
    model.to(device)
    if args.assign:
        checkpoint.seek(0)
        model.load_state_dict(torch.load(checkpoint, map_location=device, weights_only=True),
                              assign=True)
    if args.order == "right":
        optimizer, scheduler = build()

    for epoch in range(1, args.epochs + 1):
        if args.recreate:
            # "On AMD/DirectML the optimizer has to be created inside the loop"
            optimizer = make_optimizer(args.optim, model.parameters(), lr)
        model.train()
        for step, (data, target) in enumerate(loader):
            data, target = data.to(device), target.to(device)
            optimizer.zero_grad()
            loss = loss_fn(model(data), target)
            loss.backward()
            optimizer.step()
            if args.sched == "onecycle":
                scheduler.step()
            print(f"loss {epoch} {step} {loss.item().hex()}")

        model.eval()
        total = 0.0
        with torch.no_grad():
            for data, target in val_loader:
                data, target = data.to(device), target.to(device)
                total += loss_fn(model(data), target).item() * len(data)
        val_loss = total / len(val_loader.dataset)
        print(f"loss {epoch} val {val_loss.hex()}")
        if args.sched in ("step",):
            scheduler.step()
        elif args.sched == "plateau":
            scheduler.step(val_loss)

        if args.bounce:
            # save a CPU copy of the weights each epoch, then carry on on the GPU
            model.cpu()
            torch.save(model.state_dict(), io.BytesIO())
            model.to(device)


if __name__ == "__main__":
    main()
