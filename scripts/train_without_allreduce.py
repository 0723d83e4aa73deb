#!/usr/bin/env python3
"""Diagnostic (issue 49): ``medddpm train`` with every gradient all-reduce turned into nothing.

    torchrun --standalone --nproc-per-node N scripts/train_without_allreduce.py train … (no --nproc)
    torchrun --standalone --nproc-per-node N scripts/train_without_allreduce.py --scaling profile …
        (the same under ``python -m medddpm.profiling.scaling profile``: its kernels with no NCCL kernel among them)

Each rank runs the code path of N ranks (segments, flat gradient buckets, their hooks and copies,
the step's CUDA graph, its own data) but NCCL moves no byte and no rank waits for another, so the
step time against a real N-rank run splits the scaling loss into communication (transfer, and the
wait for the slowest rank) and the rest (the N-rank code path, and N GPUs busy at once). The
weights drift apart between ranks: the losses mean nothing, only the step times do.
"""
import sys

import torch.distributed as dist


class _Done:
    """What an asynchronous collective returns, already complete."""

    def wait(self, *args, **kwargs) -> bool:
        return True


def _no_all_reduce(tensor, op=None, group=None, async_op=False):
    return _Done() if async_op else None


if __name__ == "__main__":
    dist.all_reduce = _no_all_reduce
    if sys.argv[1:2] == ["--scaling"]:
        from medddpm.profiling.scaling import main

        sys.exit(main(sys.argv[2:]))
    from medddpm.cli import main

    sys.exit(main(sys.argv[1:]))
