"""ReduceOp.AVG in a script written for NCCL: two ranks (mp.spawn), each averaging a float and an
int64 tensor with ``all_reduce`` (also ``async_op=True``) and ``reduce_scatter_tensor``. NCCL
averages every dtype (integers with C's division, toward zero); gloo has no AVG. Rank 0 prints
``avg <what> <values>``; with ``--backend gloo`` it asks for gloo (no AVG there: the error).
"""

import argparse
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def rank_main(rank: int, port: int, backend: str) -> None:
    dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    torch.cuda.set_device(rank)
    dev = torch.device("cuda", rank)
    f = torch.tensor([rank + 1.0, 3.0, -1.0 - 2 * rank], device=dev)
    i = torch.tensor([rank * 3 + 1, 7, -3 - rank], device=dev)  # sums 5, 14, -7
    dist.all_reduce(f, op=dist.ReduceOp.AVG)
    work = dist.all_reduce(i, op=dist.ReduceOp.AVG, async_op=True)
    work.wait()
    out = torch.empty(2, device=dev)
    dist.reduce_scatter_tensor(out, torch.arange(4.0, device=dev) * (rank + 1),
                               op=dist.ReduceOp.AVG)
    gathered = [torch.empty(2, device=dev) for _ in range(2)]
    dist.all_gather(gathered, out)
    if rank == 0:
        print("avg float", f.cpu().tolist(), flush=True)
        print("avg int64", i.cpu().tolist(), str(i.dtype), flush=True)
        print("avg scatter", torch.cat(gathered).cpu().tolist(), flush=True)
    dist.destroy_process_group()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--backend", default="nccl")
    args = parser.parse_args()
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.spawn(rank_main, args=(port, args.backend), nprocs=2)


if __name__ == "__main__":
    main()
