"""ultralytics YOLOv8n trained from its model yaml (no weights), written for a CUDA machine:
``model.train(data=..., device=0, amp=True, epochs=1)`` on a tiny synthetic dataset that the
script writes into the working directory (random images, one box each). ``--device cpu`` is the
same run told to use the CPU (``--fused-adamw``: with the AdamW kernel ultralytics picks on
CUDA). Training includes ultralytics' validation pass.
``channels_last=False``: on a CUDA device ultralytics switches the model to NHWC by default, and
NHWC convolutions round differently from NCHW ones on the CPU that stands in for it. Run with
``OMP_NUM_THREADS=1`` to compare runs bit for bit: ultralytics pins the thread count only on its
CPU branch.

Nothing is downloaded: run with ``YOLO_OFFLINE=1`` and ``YOLO_CONFIG_DIR`` set to a folder that
holds an ``Arial.ttf`` (ultralytics fetches that font otherwise).

Stdout: ``device <trainer device>``, ``amp <trainer amp>``, ``loss 1 <batch> <float.hex()>``
(the summed box/cls/dfl loss items of each batch), ``fitness <float.hex()>`` after validation;
what ultralytics wrote to its ``results.csv`` (each column but epoch and time: the epoch's mean
train losses, the validation losses and metrics, the learning rates; as ultralytics rounds them)
as ``logged <column> <epoch> <float.hex()>``, and the trained parameters of the model and of its
EMA (``ema.`` names: the model ultralytics validates and saves) as ``param`` lines (fwreport.py).
"""

import argparse
from pathlib import Path

import fwreport
import numpy as np
from PIL import Image


def write_dataset(root: Path, n_train=8, n_val=4, size=64):
    rng = np.random.default_rng(0)
    for split, n in (("train", n_train), ("val", n_val)):
        (root / "images" / split).mkdir(parents=True, exist_ok=True)
        (root / "labels" / split).mkdir(parents=True, exist_ok=True)
        for i in range(n):
            img = rng.integers(0, 256, (size, size, 3), dtype=np.uint8)
            cls = int(rng.integers(0, 2))
            x, y = rng.uniform(0.3, 0.7, 2)
            w, h = rng.uniform(0.2, 0.4, 2)
            img[int((y - h / 2) * size):int((y + h / 2) * size),
                int((x - w / 2) * size):int((x + w / 2) * size)] = 255 * cls
            Image.fromarray(img).save(root / "images" / split / f"{i}.jpg")
            (root / "labels" / split / f"{i}.txt").write_text(
                f"{cls} {x:.4f} {y:.4f} {w:.4f} {h:.4f}\n")
    yaml = root / "data.yaml"
    yaml.write_text(f"path: {root}\ntrain: images/train\nval: images/val\n"
                    "names:\n  0: dark\n  1: bright\n")
    return yaml


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="0")
    parser.add_argument("--fused-adamw", action="store_true",
                        help="AdamW's fused kernel on any device (ultralytics fuses on CUDA)")
    args = parser.parse_args()

    if args.fused_adamw:
        # ultralytics asks torch for AdamW's fused kernel when the model's parameters are on
        # CUDA (BaseTrainer.build_optimizer: fused=True), through torch.optim's attribute
        import torch

        class FusedAdamW(torch.optim.AdamW):
            def __init__(self, *a, **k):
                k.setdefault("fused", True)
                super().__init__(*a, **k)

        torch.optim.AdamW = FusedAdamW

    from ultralytics import YOLO

    data = write_dataset(Path.cwd() / "synthetic")
    model = YOLO("yolov8n.yaml")

    def on_batch_end(trainer):
        step = getattr(trainer, "_step", 0)
        trainer._step = step + 1
        items = trainer.loss_items  # a dict of loss tensors in newer releases
        total = sum(float(v) for v in (items.values() if isinstance(items, dict) else items))
        # a new line: ultralytics draws its progress bar on stdout without one
        print(f"\nloss 1 {step} {total.hex()}", flush=True)

    def on_train_start(trainer):
        print("device", trainer.device, flush=True)
        print("amp", bool(trainer.amp), flush=True)

    model.add_callback("on_train_start", on_train_start)
    model.add_callback("on_train_batch_end", on_batch_end)
    device = int(args.device) if args.device.isdigit() else args.device
    model.train(data=str(data), device=device, amp=True, epochs=1, imgsz=64, batch=4,
                workers=0, plots=False, seed=0, deterministic=True, channels_last=False, project=str(Path.cwd()),
                name="run", exist_ok=True, verbose=False, val=True, save=False)
    print(f"fitness {float(model.trainer.fitness or 0.0).hex()}")
    fwreport.log_csv(model.trainer.csv, step_column="epoch", skip=("time",))
    fwreport.params(model.trainer.model)
    fwreport.params(model.trainer.ema.ema, prefix="ema.")


if __name__ == "__main__":
    main()
