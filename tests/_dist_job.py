"""A small data-parallel-shaped job for tests/test_distributed.py, on the gloo backend (CPU).

Under torchrun: ``torchrun --nproc-per-node 2 tests/_dist_job.py STEPS``. Without a launcher
(no ``RANK`` in the environment, as with ``mp.spawn``):
``python tests/_dist_job.py STEPS --init tcp://127.0.0.1:PORT --rank R --world-size N``.

Every step is ``train_step`` = ``work`` (matmuls; rank 1 does eight times as many) then
``allreduce``. Profiling is configured by the ``PROFILED_*`` variables the test sets.
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist

from instrument import profiled

SLOW_RANK = 1
SLOW_FACTOR = 8


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("steps", type=int)
    parser.add_argument("--init", help="init_method; without it the launcher's variables")
    parser.add_argument("--rank", type=int)
    parser.add_argument("--world-size", type=int)
    args = parser.parse_args()
    if args.init:
        dist.init_process_group("gloo", init_method=args.init, rank=args.rank,
                                world_size=args.world_size)
    else:
        dist.init_process_group("gloo")
    torch.set_num_threads(1)
    rounds = SLOW_FACTOR if dist.get_rank() == SLOW_RANK else 1

    @profiled("work")
    def work(x: torch.Tensor) -> torch.Tensor:
        for _ in range(rounds):
            x = torch.tanh(x @ x)
        return x

    @profiled("allreduce")
    def allreduce(t: torch.Tensor) -> torch.Tensor:
        dist.all_reduce(t)
        return t

    @profiled("train_step", step=True)
    def train_step(x: torch.Tensor) -> torch.Tensor:
        y = work(x)
        allreduce(y.sum().reshape(1))
        return y

    x = torch.randn(128, 128) / 16
    for _ in range(args.steps):
        train_step(x)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
