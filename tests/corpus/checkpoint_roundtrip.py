"""Checkpoint save and resume the way CUDA training scripts do it, in every map_location form.

CUDA idioms exercised: a checkpoint dict with ``model.state_dict()``, an Adam
``optimizer.state_dict()``, a ``torch.cuda.amp.GradScaler`` state, the epoch, CPU and CUDA RNG
states and tensors nested in lists/tuples/dicts, written with ``torch.save``; read back with
``torch.load(path)`` and ``map_location`` = ``"cuda"``, ``"cuda:0"``, ``torch.device("cuda", 0)``,
``{"cuda:0": "cuda:0"}``, ``lambda storage, loc: storage.cuda(0)`` and ``"cpu"`` (then moved
with ``.cuda()``); a whole pickled model loaded with ``weights_only=False``. Each load resumes
training for a few steps.

Stdout: ``device <dev>``; ``loss 1 <step> <hex>`` for the first training; per form
``where <form> <key> <gpu|cpu>`` for a few checkpoint entries, ``resume <form> <step> <hex>``
for the resumed steps, ``same <form> <ok|FAIL>`` (the loaded tensors equal the saved ones).

``--from PATH``: load PATH (e.g. written on a CUDA machine) instead of writing a checkpoint;
``--save PATH``: also write the checkpoint to PATH (for loading in another process).
"""

import argparse
import os
import sys
import tempfile

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(16, 32)
        self.bn = nn.BatchNorm1d(32)
        self.fc2 = nn.Linear(32, 3)

    def forward(self, x):
        return self.fc2(F.relu(self.bn(self.fc1(x))))


def batches(device, n=6, seed=0):
    g = torch.Generator().manual_seed(seed)
    out = []
    for _ in range(n):
        x = torch.randn(32, 16, generator=g)
        y = (x[:, 0] > 0).long() + (x[:, 1] > 0.5).long()
        out.append((x.to(device), y.to(device)))
    return out


def train(model, optimizer, scaler, data, tag, epoch=None):
    model.train()
    for step, (x, y) in enumerate(data):
        optimizer.zero_grad()
        with torch.autocast(device_type="cuda", dtype=torch.float16):
            loss = F.cross_entropy(model(x), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        if epoch is not None:
            print(f"loss {epoch} {step} {loss.float().item().hex()}")
        else:
            print(f"resume {tag} {step} {loss.float().item().hex()}")


def where(t):
    return "gpu" if t.is_cuda else "cpu"


def flat_tensors(obj):
    if isinstance(obj, torch.Tensor):
        yield obj
    elif isinstance(obj, dict):
        for v in obj.values():
            yield from flat_tensors(v)
    elif isinstance(obj, (list, tuple)):
        for v in obj:
            yield from flat_tensors(v)


def main():
    parser = argparse.ArgumentParser(description="checkpoint round trip")
    parser.add_argument("--from", dest="source", default=None)
    parser.add_argument("--save", default=None)
    args = parser.parse_args()

    torch.manual_seed(0)
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    print("device", device)
    kind = "cuda" if use_cuda else "cpu"
    tmp = tempfile.mkdtemp(prefix="ckpt-")

    if args.source is None:
        model = Net().to(device)
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
        scaler = torch.cuda.amp.GradScaler(enabled=use_cuda)
        train(model, optimizer, scaler, batches(device, seed=1), "", epoch=1)
        checkpoint = {
            "epoch": 1,
            "model": model.state_dict(),
            "optimizer": optimizer.state_dict(),
            "scaler": scaler.state_dict(),
            "rng": torch.get_rng_state(),
            "extra": {"list": [torch.arange(4, device=device),
                               (torch.ones(2, 2, device=device), {"deep": torch.eye(3)})]},
        }
        if use_cuda:
            checkpoint["cuda_rng"] = torch.cuda.get_rng_state_all()
        path = args.save or os.path.join(tmp, "checkpoint.pt")
        torch.save(checkpoint, path)
        torch.save(model, os.path.join(tmp, "model.pt"))
        saved = [t.detach().cpu().clone() for t in flat_tensors(checkpoint)]
    else:
        path, saved = args.source, None

    forms = [
        ("none", None),
        ("str", kind),
        ("str_index", "cuda:0" if use_cuda else "cpu"),
        ("device", torch.device("cuda", 0) if use_cuda else torch.device("cpu")),
        ("dict", {"cuda:0": "cuda:0"} if use_cuda else {"cpu": "cpu"}),
        ("callable", (lambda storage, loc: storage.cuda(0)) if use_cuda
         else (lambda storage, loc: storage)),
        ("cpu", "cpu"),
    ]
    for name, map_location in forms:
        ckpt = torch.load(path, map_location=map_location)
        print(f"where {name} model {where(ckpt['model']['fc1.weight'])}")
        state = ckpt["optimizer"]["state"]
        print(f"where {name} optimizer {where(state[0]['exp_avg'])}")
        print(f"where {name} nested {where(ckpt['extra']['list'][1][0])}")
        if saved is not None:
            loaded = [t.detach().cpu() for t in flat_tensors(ckpt)]
            same = len(loaded) == len(saved) and all(
                a.dtype == b.dtype and torch.equal(a, b) for a, b in zip(loaded, saved))
            print(f"same {name} {'ok' if same else 'FAIL'}")
        model2 = Net().to(device)
        model2.load_state_dict(ckpt["model"])
        optimizer2 = torch.optim.Adam(model2.parameters(), lr=1e-2)
        optimizer2.load_state_dict(ckpt["optimizer"])
        scaler2 = torch.cuda.amp.GradScaler(enabled=use_cuda)
        scaler2.load_state_dict(ckpt["scaler"])
        torch.set_rng_state(ckpt["rng"].cpu())
        train(model2, optimizer2, scaler2, batches(device, n=3, seed=2), name)

    if args.source is None:
        whole = torch.load(os.path.join(tmp, "model.pt"), map_location=device,
                           weights_only=False)
        print(f"where whole model {where(whole.fc1.weight)}")
        out = whole.eval()(torch.ones(2, 16, device=device))
        print(f"whole {out.sum().item().hex()}")
    print("done", file=sys.stderr)


if __name__ == "__main__":
    main()
