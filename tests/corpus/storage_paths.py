"""Everything a CUDA training script does that reads a GPU tensor's storage.

    python storage_paths.py CHECKPOINT_DIR

On torch-directml device tensors have no storage (``Cannot access storage of
OpaqueTensorImpl``); this script must still run there. It trains a small model, then:
``torch.save`` of the model, the optimizer, a tensor and a view of it, and a whole pickled module;
``torch.load`` with ``map_location`` None, ``"cuda"``, ``"cuda:0"``, ``torch.device`` and a lambda;
``load_state_dict``; ``copy.deepcopy``; ``tensor.share_memory_()`` / ``is_shared()`` on a GPU
tensor (a no-op on CUDA); a DataLoader with ``pin_memory=True`` feeding ``.cuda(non_blocking=True)``;
``clip_grad_norm_`` and ``parameters_to_vector``. Prints ``check <name> <value>`` lines and
``loss`` lines that a CPU run must match.
"""

import copy
import os
import sys

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, TensorDataset


def digest(t):
    return " ".join(v.hex() for v in t.detach().cpu().double().reshape(-1).tolist()[:6])


def main():
    out_dir = sys.argv[1]
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    data = TensorDataset(torch.randn(32, 5), torch.randn(32, 2))
    loader = DataLoader(data, batch_size=8, pin_memory=True)
    model = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    for step, (x, y) in enumerate(loader):
        x, y = x.cuda(non_blocking=True) if device.type == "cuda" else x, y.to(device)
        optimizer.zero_grad()
        loss = nn.functional.mse_loss(model(x), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        print(f"loss 0 {step} {loss.item().hex()} norm {norm.item().hex()}")

    path = os.path.join(out_dir, "ckpt.pt")
    t = torch.arange(6.0, device=device)
    torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "tensor": t, "view": t[2:4]}, path)
    for name, ml in (("none", None), ("cuda", "cuda"), ("cuda0", "cuda:0"),
                     ("device", torch.device("cuda", 0)), ("lambda", lambda s, loc: s.cuda(0))):
        if device.type != "cuda":
            ml = "cpu"
        ck = torch.load(path, map_location=ml)
        print(f"check load-{name} {digest(ck['model']['0.weight'])} "
              f"{digest(ck['optimizer']['state'][0]['exp_avg'])} {digest(ck['view'])}")
    fresh = nn.Sequential(nn.Linear(5, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 2)).to(device)
    fresh.load_state_dict(torch.load(path)["model"])
    print(f"check load_state_dict {digest(fresh[1].running_var)} on_gpu "
          f"{fresh[0].weight.is_cuda}")
    whole = os.path.join(out_dir, "whole.pt")
    torch.save(model, whole)
    loaded = torch.load(whole, weights_only=False)
    print(f"check whole-module {digest(loaded[3].weight)}")
    twin = copy.deepcopy(model)
    print(f"check deepcopy {digest(twin[0].bias)} distinct {twin[0].bias is not model[0].bias}")
    shared = torch.ones(3, device=device).share_memory_()
    print(f"check share_memory_ {digest(shared)}")
    print(f"check parameters_to_vector {digest(torch.nn.utils.parameters_to_vector(model.parameters()))}")


if __name__ == "__main__":
    main()
