"""A float16 batch into a float32 model inside CUDA autocast (ultralytics' validation in
training does this). On CUDA autocast casts both operands of conv/linear, so it runs.

Prints the output dtypes and the outputs as float.hex(). ``--reference`` computes the same on
the CPU in float32 without autocast: the input rounded to float16, then cast to float32.
"""

import sys

import torch

torch.manual_seed(0)
conv = torch.nn.Conv2d(3, 4, 3)
lin = torch.nn.Linear(4 * 6 * 6, 5)
x = torch.randn(2, 3, 8, 8).half()

if "--reference" in sys.argv:
    with torch.no_grad():
        y = conv(x.float())
        z = lin(y.flatten(1))
    regions = {"reference": (y, z)}
else:
    conv, lin, x = conv.cuda(), lin.cuda(), x.cuda()
    regions = {}
    for name, make in (("torch.autocast('cuda')", lambda: torch.autocast("cuda")),
                       ("torch.cuda.amp.autocast()", lambda: torch.cuda.amp.autocast())):
        with torch.no_grad(), make():
            y = conv(x)
            z = lin(y.flatten(1))
        regions[name] = (y, z)

for name, (y, z) in regions.items():
    print("dtypes", name.replace(" ", ""), str(y.dtype), str(z.dtype))
    for v in z.float().cpu().flatten().tolist():
        print("out", name.replace(" ", ""), float(v).hex())
