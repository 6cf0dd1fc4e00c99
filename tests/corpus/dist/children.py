"""Every kind of child process a training script starts, reporting what CUDA looks like to it.

Each child prints ``child <kind> <torch.cuda.is_available()> <device of torch.zeros(1,
device="cuda") or error:<type>>``: DataLoader workers with the fork, spawn and forkserver start
methods, a ``torch.multiprocessing.spawn`` process, and ``python children.py --probe`` run with
``subprocess``. On a CUDA machine every line reads ``True cuda:0``.
"""

import argparse
import subprocess
import sys

import torch
import torch.multiprocessing as mp
from torch.utils.data import DataLoader, Dataset


def say(line):
    # one write per line: the ranks share stdout, and print() may write text and newline apart
    sys.stdout.write(line + "\n")
    sys.stdout.flush()

def probe(kind):
    available = torch.cuda.is_available()
    try:
        where = str(torch.zeros(1, device="cuda").device)
    except Exception as err:  # what an unshimmed child on a machine without CUDA hits
        where = "error:" + type(err).__name__
    return f"child {kind} {available} {where}"


class ProbeInWorker(Dataset):
    def __init__(self, kind):
        self.kind = kind

    def __len__(self):
        return 1

    def __getitem__(self, index):
        return probe(self.kind)


def spawned(index, kind):
    say(probe(kind))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--probe", help="print this process's probe line and exit")
    parser.add_argument("--methods", default="fork,spawn,forkserver",
                        help="DataLoader worker start methods to try")
    parser.add_argument("--no-fresh", action="store_true",
                        help="skip the mp.spawn process and the subprocess")
    args = parser.parse_args()
    if args.probe:
        say(probe(args.probe))
        return

    say(probe("parent"))
    for method in args.methods.split(","):
        loader = DataLoader(ProbeInWorker("dataloader-" + method), batch_size=None,
                            num_workers=1, multiprocessing_context=method)
        for line in loader:
            say(line)
    if args.no_fresh:
        return
    mp.spawn(spawned, args=("mp.spawn",), nprocs=1, join=True)
    sub = subprocess.run([sys.executable, __file__, "--probe", "subprocess"],
                         capture_output=True, text=True, timeout=120)
    sys.stdout.write(sub.stdout)
    sys.stderr.write(sub.stderr)


if __name__ == "__main__":
    main()
