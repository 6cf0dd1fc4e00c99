"""A timm-style validation loop under ``torch.inference_mode()``, written for CUDA.

    python inference_validate.py

``model.eval()`` then ``with torch.inference_mode():`` over a loader: conv2d, batch_norm
(running statistics), linear, a class token ``expand``-ed to the batch, a parameter read
through ``.data``, the ``@torch.inference_mode()`` decorator form, and a nested
``torch.inference_mode(False)`` region. Parameters and buffers are made (and trained for a few
steps) outside the region, as in any train/validate script. Prints ``out <batch> <hex...>``
lines with the outputs, ``loss`` lines, and what ``torch.is_inference_mode_enabled()`` says.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset


class TinyNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(3, 4, 3, padding=1)
        self.bn = nn.BatchNorm2d(4)
        self.cls_token = nn.Parameter(torch.randn(1, 1, 4))
        self.scale = nn.Parameter(torch.tensor(0.5))
        self.fc = nn.Linear(4, 3)

    def forward(self, x):
        feat = F.relu(self.bn(self.conv(x)))  # (B, 4, H, W)
        tokens = feat.flatten(2).transpose(1, 2)  # (B, HW, 4)
        cls = self.cls_token.expand(x.shape[0], -1, -1)  # ViT's class token
        tokens = torch.cat([cls, tokens], dim=1)
        return self.fc(tokens.mean(1)) * self.scale.data  # .data: EMA/weight-norm style reads


@torch.inference_mode()
def predict(model, x):
    return model(x).argmax(1)


def main():
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(0)
    images = torch.randn(24, 3, 6, 6)
    labels = torch.randint(0, 3, (24,))
    loader = DataLoader(TensorDataset(images, labels), batch_size=8)
    model = TinyNet().to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    model.train()
    for step, (x, y) in enumerate(loader):  # a little training: running statistics move
        x, y = x.to(device), y.to(device)
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        print(f"loss 0 {step} {loss.item().hex()}")

    model.eval()
    print(f"outside {torch.is_inference_mode_enabled()}")
    with torch.inference_mode():
        print(f"inside {torch.is_inference_mode_enabled()} grad {torch.is_grad_enabled()}")
        for i, (x, y) in enumerate(loader):
            x = x.to(device, non_blocking=True)
            out = model(x)
            loss = F.cross_entropy(out, y.to(device))
            print(f"out {i} " + " ".join(v.hex() for v in out.cpu().reshape(-1).tolist()))
            print(f"loss 1 {i} {loss.item().hex()} requires_grad {out.requires_grad}")
        with torch.inference_mode(False):
            print(f"nested {torch.is_inference_mode_enabled()} grad {torch.is_grad_enabled()}")
    print(f"predict {predict(model, images[:4].to(device)).tolist()}")
    print(f"after {torch.is_inference_mode_enabled()} grad {torch.is_grad_enabled()}")


if __name__ == "__main__":
    main()
