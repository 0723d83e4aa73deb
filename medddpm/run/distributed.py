"""Several processes, one run: torchrun + ``torch.distributed`` (NCCL on GPUs, gloo on CPUs).

``torchrun --standalone --nproc-per-node N -m medddpm train …`` sets RANK, WORLD_SIZE and
LOCAL_RANK; ``World.from_env`` joins that group (or is a world of one without them). The training
step itself stays DistributedDataParallel's (``engine``); this module holds only the process
group, the data split and the agreement helpers that make a bad input on one rank stop every rank.

Data split (tested on CPU): draw ``(step · grad_accum + k) · world + rank`` of the seeded subject
sequence (``train.sample_order``) feeds micro-batch ``k`` of ``step`` on ``rank``, and its
diffusion time and noise come from a generator seeded with that draw number. The global order is
therefore the one a single process with ``grad_accum · world`` micro-batches per step would see.
"""
from __future__ import annotations

import contextlib
import datetime
import os
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from ..core.errors import InputError, MedddpmError

# Seconds a collective may wait for the other ranks before the run stops with an error (a rank
# that died or hangs). Long enough for the first step's compilation on the slowest rank.
TIMEOUT_S = 1800
# Environment that keeps NVLink multicast off in every process we start (the lent machines' rule).
NO_MULTICAST = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1", "NVSHMEM_DISABLE_NVLS": "1"}


# Set in a rank that sees only its own GPU (``own_gpu_only``): it runs on cuda:0
OWN_GPU = "MEDDDPM_OWN_GPU"


def own_gpu_only() -> None:
    """Under torchrun, let this process see only its LOCAL_RANK's GPU (``CUDA_VISIBLE_DEVICES``), so
    that it runs on cuda:0 like a single process. Torch's compile caches key graphs by the device
    index (pytorch/pytorch#108971): a sampling rank on cuda:3 missed what ``medddpm warmup`` had
    compiled on cuda:0, and compiled again (cProfile of 4 H100 ranks, issue 48). Call it before CUDA
    starts; where it started already the variable changes nothing and ``World.device`` keeps
    cuda:LOCAL_RANK."""
    try:
        size, local = int(os.environ.get("WORLD_SIZE", "1")), int(os.environ.get("LOCAL_RANK", "0"))
    except ValueError:  # World.from_env says what is wrong
        return
    if size < 2 or OWN_GPU in os.environ:
        return
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    ids = [v.strip() for v in visible.split(",") if v.strip()] if visible is not None else None
    if ids is not None and local >= len(ids):  # fewer GPUs than ranks: World.device's error says so
        return
    os.environ["CUDA_VISIBLE_DEVICES"] = ids[local] if ids is not None else str(local)
    os.environ[OWN_GPU] = "1"


class RankError(MedddpmError):
    """Another rank failed or vanished; this rank stops too."""


def lost_contact(exc: BaseException) -> bool:
    """Whether ``exc`` is a collective's failure to reach another rank (gloo's closed connection, NCCL's error or
    timeout), not a fault of this rank's own."""
    words = ("Connection closed by peer", "Connection reset", "NCCL", "gloo", "timed out", "Timeout")
    return isinstance(exc, dist.DistError) or any(w in str(exc) for w in words)


@dataclass(frozen=True)
class World:
    """This process's place in the run: rank, world size and local rank (GPU index)."""

    rank: int = 0  # global rank; rank 0 alone writes files
    size: int = 1  # number of processes
    local_rank: int = 0  # rank on this host: the GPU this process uses
    own_gpu: bool = False  # the process sees only its own GPU (own_gpu_only): cuda:0

    @property
    def main(self) -> bool:
        return self.rank == 0

    @property
    def distributed(self) -> bool:
        return self.size > 1

    @classmethod
    def from_env(cls) -> "World":
        """The world torchrun describes in the environment (a world of one without it)."""
        try:
            size = int(os.environ.get("WORLD_SIZE", "1"))
            rank = int(os.environ.get("RANK", "0"))
            local = int(os.environ.get("LOCAL_RANK", str(rank)))
        except ValueError as exc:
            raise InputError(f"bad torchrun environment (RANK/WORLD_SIZE/LOCAL_RANK): {exc}") from None
        if size < 1 or not 0 <= rank < size:
            raise InputError(f"bad torchrun environment: RANK={rank}, WORLD_SIZE={size}")
        return cls(rank, size, local, size > 1 and OWN_GPU in os.environ)

    def device(self, requested: str) -> str:
        """``cuda`` becomes this rank's own GPU: cuda:0 where it sees no other (``own_gpu``), else
        ``cuda:LOCAL_RANK``; a fixed index is refused with several ranks (they would share one GPU)."""
        if not self.distributed or not requested.startswith("cuda"):
            return requested
        if requested != "cuda":
            raise InputError(f"--device {requested}: with {self.size} ranks use --device cuda; "
                             "each rank takes the GPU of its LOCAL_RANK")
        return "cuda:0" if self.own_gpu and torch.cuda.device_count() == 1 else f"cuda:{self.local_rank}"

    def init(self, device: torch.device, timeout_s: int = TIMEOUT_S) -> None:
        """Join the process group: NCCL for GPUs, gloo for CPUs; multicast stays off."""
        if not self.distributed or dist.is_initialized():
            return
        for key, value in NO_MULTICAST.items():
            os.environ.setdefault(key, value)
        if device.type == "cuda":
            torch.cuda.set_device(device)  # object collectives stage through the current device
        backend = "nccl" if device.type == "cuda" else "gloo"
        kwargs: dict[str, Any] = {"device_id": device} if device.type == "cuda" else {}
        dist.init_process_group(backend, timeout=datetime.timedelta(seconds=timeout_s), **kwargs)

    def close(self) -> None:
        if self.distributed and dist.is_initialized():
            dist.destroy_process_group()

    @contextlib.contextmanager
    def _collective(self):
        """A collective that fails (a rank died, or timed out) ends this rank with a RankError."""
        try:
            yield
        except Exception as exc:
            detail = f" ({exc})" if os.environ.get("MEDDDPM_DEBUG") else ""  # gloo's and NCCL's own words, when asked
            raise RankError(f"rank {self.rank}: lost contact with the other ranks{detail}") from None

    def share(self, n: int) -> list[int]:
        """This rank's items of ``n`` in a sorted list: r, r + W, … (sampling's masks)."""
        return list(range(self.rank, n, self.size))

    def draw(self, step: int, accum: int, k: int) -> int:
        """Index in the seeded draw sequence of micro-batch ``k`` of ``step`` on this rank."""
        return (step * accum + k) * self.size + self.rank

    def agree(self, error: BaseException | None) -> None:
        """Collective: every rank passes its own check's error (or None); if any rank failed, every
        rank raises — the failing rank its own error, the others a RankError naming it."""
        if not self.distributed:
            if error is not None:
                raise error
            return
        messages: list[str | None] = [None] * self.size
        with self._collective():
            dist.all_gather_object(messages, None if error is None else str(error))
        if error is not None:
            raise error
        failed = [(r, m) for r, m in enumerate(messages) if m is not None]
        if failed:
            r, m = failed[0]
            raise RankError(f"rank {r} stopped the run: {m}")

    def checked(self, fn):
        """``fn()`` on every rank (a check of inputs); if it raised an input error on any rank,
        every rank raises (``agree``), else its result."""
        try:
            result, error = fn(), None
        except (MedddpmError, ValueError) as exc:
            result, error = None, exc
        self.agree(error)
        return result

    def sum(self, values: torch.Tensor) -> torch.Tensor:
        """All-reduce sum of ``values`` over the ranks (pieces each rank computed, zero elsewhere: exact)."""
        if not self.distributed:
            return values
        with self._collective():
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values

    def mean(self, values: torch.Tensor) -> torch.Tensor:
        """All-reduce average of ``values`` over the ranks (the logged loss is the global mean)."""
        if not self.distributed:
            return values
        with self._collective():
            dist.all_reduce(values, op=dist.ReduceOp.SUM)
        return values / self.size


def draw_seed(seed: int, draw: int) -> int:
    """A 63-bit generator seed for one draw of the run seeded ``seed`` (independent streams)."""
    return int(np.random.SeedSequence([seed, draw]).generate_state(1, np.uint64)[0] >> np.uint64(1))


LAUNCH_OPTIONS = ("--nproc", "--nnodes", "--rdzv-endpoint", "--rdzv-id")  # what torchrun takes over


def torchrun_args(nproc: int, argv: list[str], nnodes: int | None = None, endpoint: str | None = None,
                  rdzv_id: str = "medddpm") -> list[str]:
    """torchrun's arguments for what ``--nproc N`` stands for: this command, the launch options
    dropped; one machine standalone, or ``nnodes`` machines meeting at ``endpoint`` (c10d)."""
    rest, skip = [], False
    for arg in argv:
        if skip:
            skip = False
        elif arg in LAUNCH_OPTIONS:
            skip = True
        elif not arg.startswith(tuple(f"{o}=" for o in LAUNCH_OPTIONS)):
            rest.append(arg)
    where = ["--standalone"] if nnodes is None else [
        f"--nnodes={nnodes}", "--rdzv-backend=c10d", f"--rdzv-endpoint={endpoint}", f"--rdzv-id={rdzv_id}"]
    return [*where, f"--nproc-per-node={nproc}", "-m", "medddpm", *rest]
