"""A diffusers denoising loop (the ``train_unconditional.py`` pattern) written for a CUDA
machine: a tiny ``UNet2DModel`` from a config, ``DDPMScheduler.add_noise``, ``accelerate``'s
``Accelerator(mixed_precision="fp16")`` (``--mixed-precision no`` for fp32, ``--cpu`` for the same
run told to use the CPU), ``accelerator.backward``, gradient clipping through the accelerator.

With ``train_unconditional.py``'s EMA of the weights (``diffusers.training_utils.EMAModel``
with its warm-up; the model that script saves) and its log of each step through
``accelerator.log`` (loss, lr, ema_decay; here to a tracker passed as ``log_with``).

Stdout: ``device <accelerator.device>``, ``loss 1 <step> <float.hex()>``; what the loop logged as
``logged <key> <step> <float.hex()>``, the trained parameters and the EMA's (``ema.<name>``) as
``param`` lines (fwreport.py).
"""

import argparse

import fwreport
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from diffusers import DDPMScheduler, UNet2DModel
from diffusers.optimization import get_scheduler
from diffusers.training_utils import EMAModel


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--mixed-precision", default="fp16")
    parser.add_argument("--cpu", action="store_true")
    parser.add_argument("--steps", type=int, default=3)
    args = parser.parse_args()

    accelerator = Accelerator(mixed_precision=args.mixed_precision, cpu=args.cpu,
                              log_with=[fwreport.accelerate_tracker()])
    torch.manual_seed(0)
    model = UNet2DModel(sample_size=16, in_channels=3, out_channels=3, layers_per_block=1,
                        block_out_channels=(16, 32), norm_num_groups=8,
                        down_block_types=("DownBlock2D", "AttnDownBlock2D"),
                        up_block_types=("AttnUpBlock2D", "UpBlock2D"))
    scheduler = DDPMScheduler(num_train_timesteps=100)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=0,
                                 num_training_steps=args.steps)
    g = torch.Generator().manual_seed(1)
    images = torch.rand(args.steps * 4, 3, 16, 16, generator=g) * 2 - 1
    loader = torch.utils.data.DataLoader(images, batch_size=4)
    model, optimizer, loader, lr_scheduler = accelerator.prepare(model, optimizer, loader,
                                                                 lr_scheduler)
    ema_model = EMAModel(accelerator.unwrap_model(model).parameters(), decay=0.9999,
                         use_ema_warmup=True, inv_gamma=1.0, power=3 / 4)
    ema_model.to(accelerator.device)
    accelerator.init_trackers("diffusers_unet")
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
            lr_scheduler.step()
            optimizer.zero_grad()
        if accelerator.sync_gradients:
            ema_model.step(model.parameters())
        print(f"loss 1 {step} {loss.detach().float().item().hex()}")
        accelerator.log({"loss": loss.detach().item(), "lr": lr_scheduler.get_last_lr()[0],
                         "ema_decay": ema_model.cur_decay_value}, step=step)
    accelerator.end_training()
    unet = accelerator.unwrap_model(model)
    fwreport.params(unet)
    # the shadow parameters follow model.parameters()' order
    fwreport.tensors(zip((n for n, _ in unet.named_parameters()), ema_model.shadow_params),
                     prefix="ema.")


if __name__ == "__main__":
    main()
