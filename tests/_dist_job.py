"""A small data-parallel-shaped job for tests/test_distributed.py, on the gloo backend (CPU).

Under torchrun: ``torchrun --nproc-per-node 2 tests/_dist_job.py STEPS`` (``--backend nccl``:
one GPU per rank, for ``bench/gpu/distributed_nccl.sh``). Without a launcher
(no ``RANK`` in the environment, as with ``mp.spawn``):
``python tests/_dist_job.py STEPS --init tcp://127.0.0.1:PORT --rank R --world-size N``.

Every step is ``train_step`` = ``work`` (a matmul; on rank 1, or the rank ``--slow-rank``
names, also a 50 ms wait, as for a slow data source) then ``allreduce`` (where the other ranks
then wait for it). The margins are tens of
milliseconds, so which rank is slower in which range does not depend on the machine's load.
Profiling is configured by the ``PROFILED_*`` variables the test sets.
"""

from __future__ import annotations

import argparse
import os
import time

import torch
import torch.distributed as dist

from instrument import profiled

SLOW_RANK = 1
SLOW_WAIT_S = 0.05


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("--init", help="init_method; without it the launcher's variables")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world-size", type=int)
    parser.add_argument("--backend", default="gloo", choices=("gloo", "nccl"))
    parser.add_argument("--slow-rank", type=int, default=SLOW_RANK)
    args = parser.parse_args()
    device = torch.device("cpu")
    if args.backend == "nccl":
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
        torch.cuda.set_device(device)
    if args.init:
        dist.init_process_group(
            args.backend, init_method=args.init, rank=args.rank, world_size=args.world_size
        )
    else:
        dist.init_process_group(args.backend)
    torch.set_num_threads(1)
    wait = SLOW_WAIT_S if dist.get_rank() == args.slow_rank else 0.0

    @profiled("work")
    def work(x: torch.Tensor) -> torch.Tensor:
        if wait:
            time.sleep(wait)
        return torch.tanh(x @ x)

    @profiled("allreduce")
    def allreduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    @profiled("train_step", step=True)
    def train_step(x: torch.Tensor) -> torch.Tensor:
        y = work(x)
        allreduce(y.sum().reshape(1))
        return y

    x = torch.randn(128, 128, device=device) / 16
    for _ in range(args.steps):
        train_step(x)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
