"""A ResNet-50-shaped network (bottleneck blocks 3-4-6-3, a 7x7 stem and a 3x3 max-pool, as
torchvision's) at a small width, with ``zero_init_residual``: the last BatchNorm of each
block starts at zero, so at the first step every layer before it in the block gets an
all-zero gradient; from the second step on they train. Written for a CUDA machine
(``--device cpu``: the same run on the CPU).

Stdout: ``loss 1 <step> <float.hex()>`` per step, then ``param <name>`` for each parameter the
optimizer steps and ``unchanged <name>`` for those the run left as they were.
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Bottleneck(nn.Module):
    expansion = 4

    def __init__(self, inplanes, planes, stride=1):
        super().__init__()
        out = planes * self.expansion
        self.conv1 = nn.Conv2d(inplanes, planes, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.conv2 = nn.Conv2d(planes, planes, 3, stride=stride, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.conv3 = nn.Conv2d(planes, out, 1, bias=False)
        self.bn3 = nn.BatchNorm2d(out)
        self.downsample = None
        if stride != 1 or inplanes != out:
            self.downsample = nn.Sequential(nn.Conv2d(inplanes, out, 1, stride=stride, bias=False),
                                            nn.BatchNorm2d(out))

    def forward(self, x):
        identity = x if self.downsample is None else self.downsample(x)
        y = F.relu(self.bn1(self.conv1(x)))
        y = F.relu(self.bn2(self.conv2(y)))
        y = self.bn3(self.conv3(y))
        return F.relu(y + identity)


class ResNet(nn.Module):
    def __init__(self, width=8, layers=(3, 4, 6, 3), num_classes=10, zero_init_residual=True):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        stages, inplanes = [], width
        for i, blocks in enumerate(layers):
            planes = width * 2 ** i
            stage = []
            for b in range(blocks):
                stage.append(Bottleneck(inplanes, planes, stride=2 if (b == 0 and i > 0) else 1))
                inplanes = planes * Bottleneck.expansion
            stages.append(nn.Sequential(*stage))
        self.layer1, self.layer2, self.layer3, self.layer4 = stages
        self.fc = nn.Linear(inplanes, num_classes)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
        if zero_init_residual:  # torchvision's option; timm's zero_init_last
            for m in self.modules():
                if isinstance(m, Bottleneck):
                    nn.init.zeros_(m.bn3.weight)

    def forward(self, x):
        x = self.maxpool(F.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


def report_unchanged(model, optimizer, initial):
    held = {id(p) for g in optimizer.param_groups for p in g["params"] if p.requires_grad}
    for name, p in model.named_parameters(prefix="model"):
        if id(p) in held:
            print("param", name)
            if torch.equal(p.detach().cpu(), initial[name]):
                print("unchanged", name)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--optimizer", choices=["sgd", "adam"], default="sgd")
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device(args.device)
    model = ResNet().to(device)
    if args.optimizer == "sgd":
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    else:
        optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    initial = {n: p.detach().cpu().clone() for n, p in model.named_parameters(prefix="model")}
    x = torch.randn(args.steps, 4, 3, 32, 32)
    y = torch.randint(0, 10, (args.steps, 4))
    model.train()
    for step in range(args.steps):
        optimizer.zero_grad()
        loss = F.cross_entropy(model(x[step].to(device)), y[step].to(device))
        loss.backward()
        optimizer.step()
        print(f"loss 1 {step} {loss.item().hex()}")
    report_unchanged(model, optimizer, initial)


if __name__ == "__main__":
    main()
