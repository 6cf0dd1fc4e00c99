"""Benchmark-style training loop that times and profiles itself with the torch.cuda API.

CUDA idioms exercised (all guarded by ``if torch.cuda.is_available()`` so the script also runs on
a CPU-only machine): ``torch.cuda.device_count()``, ``current_device()``, ``get_device_name()``,
``get_device_capability()``, ``get_device_properties(0).total_memory``,
``torch.cuda.Event(enable_timing=True)`` with ``record()``/``synchronize()``/``query()``/
``elapsed_time()``, ``torch.cuda.synchronize()``, ``memory_allocated()``,
``max_memory_allocated()``, ``memory_reserved()``, ``reset_peak_memory_stats()``,
``empty_cache()``, and ``torch.ones(..., device="cuda")`` in a factory.

Timing and memory figures go to stderr (they differ between runs). On CUDA the script prints
``check <name> <ok|FAIL>`` sanity lines to stdout.
"""

import argparse
import sys
import time

import torch
import torch.nn as nn
import torch.nn.functional as F


def check(name, cond):
    print(f"check {name} {'ok' if cond else 'FAIL'}")


def is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def main():
    parser = argparse.ArgumentParser(description="torch.cuda timing/memory API")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--steps", type=int, default=10)
    args = parser.parse_args()

    torch.manual_seed(0)
    use_cuda = torch.cuda.is_available()
    device = torch.device("cuda" if use_cuda else "cpu")
    print("device", device)

    if use_cuda:
        n = torch.cuda.device_count()
        cur = torch.cuda.current_device()
        name = torch.cuda.get_device_name(0)
        cap = torch.cuda.get_device_capability(0)
        props = torch.cuda.get_device_properties(0)
        total_gb = props.total_memory / 1024**3
        print(f"{n} GPU(s); using {cur}: {name} (sm_{cap[0]}{cap[1]}), {total_gb:.1f} GiB",
              file=sys.stderr)
        check("device_count", is_int(n) and n >= 1)
        check("current_device", is_int(cur) and 0 <= cur < n)
        check("device_name", isinstance(name, str) and len(name) > 0)
        check("device_capability", isinstance(cap, tuple) and len(cap) == 2
              and all(is_int(c) for c in cap))
        check("total_memory", is_int(props.total_memory) and props.total_memory > 0)
        check("props_name", isinstance(props.name, str) and len(props.name) > 0)
        torch.cuda.reset_peak_memory_stats()

    x_all = torch.randn(640, 32, generator=torch.Generator().manual_seed(1))
    y_all = (x_all[:, :8].sum(dim=1) > 0).long()
    model = nn.Sequential(nn.Linear(32, 128), nn.ReLU(), nn.Linear(128, 2)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, nesterov=True)

    if use_cuda:
        scratch = torch.ones(256, 256, device="cuda")
        allocated = torch.cuda.memory_allocated()
        check("memory_allocated", is_int(allocated) and allocated >= 0)
        del scratch
        torch.cuda.empty_cache()
        check("empty_cache", True)

    batch = x_all.size(0) // args.steps
    for epoch in range(1, args.epochs + 1):
        if use_cuda:
            start = torch.cuda.Event(enable_timing=True)
            end = torch.cuda.Event(enable_timing=True)
            start.record()
        else:
            t0 = time.perf_counter()

        model.train()
        for step in range(args.steps):
            x = x_all[step * batch:(step + 1) * batch].to(device)
            y = y_all[step * batch:(step + 1) * batch].to(device)
            optimizer.zero_grad()
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            optimizer.step()
            print(f"loss {epoch} {step} {loss.item().hex()}")

        if use_cuda:
            end.record()
            end.synchronize()
            torch.cuda.synchronize()
            ms = start.elapsed_time(end)
            check(f"event_query_{epoch}", end.query() is True)
            check(f"elapsed_time_{epoch}", isinstance(ms, float) and ms > 0)
            alloc = torch.cuda.memory_allocated(device)
            peak = torch.cuda.max_memory_allocated(device)
            reserved = torch.cuda.memory_reserved()
            print(f"epoch {epoch}: {ms:.2f} ms, allocated {alloc / 1024**2:.2f} MiB, "
                  f"peak {peak / 1024**2:.2f} MiB, reserved {reserved / 1024**2:.2f} MiB",
                  file=sys.stderr)
            check(f"memory_allocated_{epoch}", is_int(alloc) and alloc >= 0)
            check(f"max_memory_allocated_{epoch}", is_int(peak) and peak >= alloc)
            check(f"memory_reserved_{epoch}", is_int(reserved) and reserved >= alloc)
            torch.cuda.reset_peak_memory_stats(device)
            peak_after = torch.cuda.max_memory_allocated(device)
            check(f"reset_peak_memory_stats_{epoch}", is_int(peak_after) and peak_after <= peak)
        else:
            ms = (time.perf_counter() - t0) * 1000.0
            print(f"epoch {epoch}: {ms:.2f} ms (cpu)", file=sys.stderr)

    if use_cuda:
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        check("synchronize", True)


if __name__ == "__main__":
    main()
