"""Gradients through writes into views (autograd's CopySlices), on a device and on the CPU.

``python view_write_grads.py --device dml`` (the wheel itself) or ``python -m dmlshim
view_write_grads.py --device cuda``: prints ``case NAME same|differs CPU DEVICE`` per case. The
wheel's views report storage offset 0, so without view replay the backward of ``loss[2] = s``
reads element 0's gradient (tests/test_real_wheel.py). YOLOv8's loss writes its three parts
into ``loss[0..2]`` and scales them in place (``loss[0] *= box``).
"""

import argparse

import torch


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--device", required=True)
    device = p.parse_args().device
    if device == "dml":
        import torch_directml

        device = torch_directml.device()

    def select_weighted(x, d):
        loss = torch.zeros(3, device=d)
        loss[2] = (x * 2).sum()
        return (loss * torch.tensor([1.0, 2.0, 3.0], device=d)).sum()

    def two_selects(x, d):
        loss = torch.zeros(3, device=d)
        loss[0], loss[2] = (x * 2).sum(), (x * 3).sum()
        return loss.sum()

    def yolo_gains(x, d):
        loss = torch.zeros(3, device=d)
        loss[0], loss[2] = (x * 2).sum(), (x ** 2).sum()
        loss[1] = x.sigmoid().sum()
        loss[0] *= 7.5
        loss[1] *= 0.5
        loss[2] *= 1.5
        return loss.sum() * 2

    def row_slice(x, d):
        grid = torch.zeros(3, 5, device=d)
        grid[1:, 1:3] = torch.stack([x[:2], x[2:4]]).T
        return (grid * torch.arange(15.0, device=d).reshape(3, 5)).sum()

    for name, fn in [("select_weighted", select_weighted), ("two_selects", two_selects),
                     ("yolo_gains", yolo_gains), ("row_slice", row_slice)]:
        grads = []
        for d in ("cpu", device):
            x = torch.arange(1.0, 6.0, device=d).requires_grad_()
            fn(x, d).backward()
            grads.append(x.grad.cpu())
        same = torch.allclose(grads[0], grads[1], rtol=1e-5, atol=1e-6)
        print(f"case {name} {'same' if same else 'differs'} {grads[0].tolist()} "
              f"{grads[1].tolist()}", flush=True)


if __name__ == "__main__":
    main()
