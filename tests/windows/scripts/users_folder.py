"""A training run in a user's own folder (``C:\\Users\\José Ñúñez\\my runs``: spaces, accents),
written for a CUDA machine: DataLoader spawn workers, a checkpoint saved there and loaded back
with ``map_location="cuda:0"``, training resumed from it.

Stdout: ``worker <phase>.<id> <dmlshim installed in that worker> <its target>`` per worker,
``loss <phase> <step> <hex>``, ``loaded <device of the loaded weights> <device of a new tensor on the GPU>`` and
``params <rank 0> <sha1 of the trained parameters>``.
"""

import argparse
import hashlib
import os
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset, get_worker_info


def shim_state():
    shim = sys.modules.get("dmlshim")
    if shim is None or not shim.is_installed():
        return "False -"
    return f"True {shim.current_target().kind}"


class Samples(Dataset):
    def __len__(self):
        return 64

    def __getitem__(self, idx):
        g = torch.Generator().manual_seed(idx)
        x = torch.randn(8, generator=g)
        info = get_worker_info()
        return x, x[:3].sum(0, keepdim=True), info.id if info is not None else -1, shim_state()


def collate(batch):
    xs, ys, workers, states = zip(*batch)
    return torch.stack(xs), torch.stack(ys), workers[0], states[0]


def train(model, optimizer, loader, device, phase, seen):
    for step, (x, y, worker, state) in enumerate(loader):
        seen.setdefault((phase, worker), state)
        x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss {phase} {step} {loss.item().hex()}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    device = "cuda:0" if torch.cuda.is_available() else "cpu"
    here = os.path.dirname(os.path.abspath(__file__))
    loader = DataLoader(Samples(), batch_size=16, num_workers=args.workers, collate_fn=collate,
                        pin_memory=torch.cuda.is_available(), persistent_workers=False)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    seen = {}
    train(model, optimizer, loader, device, 1, seen)
    checkpoint = os.path.join(here, "checkpoints ñ", "epoch 1 — José.pt")
    os.makedirs(os.path.dirname(checkpoint), exist_ok=True)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint)

    state = torch.load(checkpoint, map_location=device, weights_only=True)
    print("loaded", state["model"]["0.weight"].device, torch.empty(0, device=device).device)
    torch.manual_seed(1)
    model = nn.Sequential(nn.Linear(8, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    model.load_state_dict(state["model"])
    optimizer = torch.optim.Adam(model.parameters(), lr=0.01)
    optimizer.load_state_dict(state["optimizer"])
    train(model, optimizer, loader, device, 2, seen)
    for phase, worker in sorted(seen):
        print(f"worker {phase}.{worker} {seen[phase, worker]}")
    flat = torch.cat([p.detach().cpu().reshape(-1) for p in model.parameters()])
    print("params 0", hashlib.sha1(flat.numpy().tobytes()).hexdigest())


if __name__ == "__main__":
    main()
