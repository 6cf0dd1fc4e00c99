"""A diffusers denoising loop (the ``train_unconditional.py`` pattern) written for a CUDA
machine: a tiny ``UNet2DModel`` from a config, ``DDPMScheduler.add_noise``, ``accelerate``'s
``Accelerator(mixed_precision="fp16")`` (``--mixed-precision no`` for fp32, ``--cpu`` for the same
run told to use the CPU), ``accelerator.backward``, gradient clipping through the accelerator.

Stdout: ``device <accelerator.device>``, ``loss 1 <step> <float.hex()>``.
"""

import argparse

import torch
import torch.nn.functional as F
from accelerate import Accelerator
from diffusers import DDPMScheduler, UNet2DModel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed-precision", default="fp16")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision, cpu=args.cpu)
    torch.manual_seed(0)
    model = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                        block_out_channels=(16, 32), norm_num_groups=8,
                        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                        up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    scheduler = DDPMScheduler(num_train_timesteps=100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(1)
    images = torch.rand(args.steps * 4, 3, 16, 16, generator=g) * 2 - 1
    loader = torch.utils.data.DataLoader(images, batch_size=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    print("device", accelerator.device)

    model.train()
    for step, clean in enumerate(loader):
        # noise and timesteps from the CPU generator, then moved: the same numbers on any device
        noise = torch.randn(clean.shape, generator=g).to(clean.device)
        timesteps = torch.randint(0, 100, (clean.size(0),), generator=g).to(clean.device)
        noisy = scheduler.add_noise(clean, noise, timesteps)
        with accelerator.accumulate(model):
            pred = model(noisy, timesteps, return_dict=False)[0]
            loss = F.mse_loss(pred.float(), noise.float())
            accelerator.backward(loss)
            if accelerator.sync_gradients:
                accelerator.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            optimizer.zero_grad()
        print(f"loss 1 {step} {loss.detach().float().item().hex()}")


if __name__ == "__main__":
    main()
