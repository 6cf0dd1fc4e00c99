"""An inference CNN written for CUDA (conv, batch norm, pooling, linear; eval mode, no_grad).

Prints ``device <type>`` and ``out <float.hex()>`` for each output value, so two runs (the
DirectML adapter, the CPU) compare exactly. These are kernels wine's d3d12 (no DXIL) runs. Max pooling is left out: with
the default guards, dmlshim's max_pool2d takes the indices' int64 remainder, a kernel DirectML
runs with a DXIL shader only ("Invalid parameter." under wine; fine on Windows drivers).
"""

import torch
import torch.nn as nn

torch.manual_seed(0)
model = nn.Sequential(
    nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(), nn.AvgPool2d(2),
    nn.Conv2d(8, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.AvgPool2d(2),
    nn.Flatten(), nn.Linear(16 * 4 * 4, 10),
)
# batch norm statistics that are not the identity, as after training
for module in model.modules():
    if isinstance(module, nn.BatchNorm2d):
        module.running_mean.uniform_(-0.5, 0.5)
        module.running_var.uniform_(0.5, 1.5)
x = torch.randn(4, 3, 16, 16)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = model.to(device).eval()
with torch.no_grad():
    out = model(x.to(device)).cpu()
print("device", device.type)
for value in out.flatten().tolist():
    print("out", float(value).hex())
