"""The training loop's input pipeline: which volumes feed each micro-batch, and how they reach the GPU.

Every micro-batch is a numbered *draw* (``distributed.World.draw``); the draw picks its subjects
(``train.sample_order``), so the pipeline decides only *where the decoded volumes come from*, never
which ones: every pipeline feeds the step the same tensors (tested bit-exact on CPU).

Pipelines (``Knobs.data_cache``), fastest first:

* ``device``: every subject decoded once and stacked in GPU memory; a micro-batch is a view of it
  (batch 1) or one gather on the GPU: no host work and no PCIe copy on the critical path.
* ``host``: stacked in pinned host memory; each micro-batch is copied to the GPU on a side stream
  while the step before it runs.
* ``none``: decoded per draw by ``Knobs.loader_workers`` DataLoader worker processes,
  ``PREFETCH`` micro-batches ahead per worker, into pinned memory, then copied on a side stream.
* ``auto``: the fastest one whose memory rule holds (``plan``).

Memory rule: a subject takes (image + mask channels) × D·H·W × 4 bytes (float32): 24 MiB at 128³
for the whole-head model (1 + 2 channels). ``device`` holds when all subjects take at most
``DEVICE_SHARE`` of the GPU's memory (an H200: about 1,400 subjects at 128³); ``host`` when
they take at most ``HOST_SHARE`` of the host's available memory divided by the ranks on this host
(each rank keeps its own copy).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor

from ..core.errors import InputError, MedddpmError

DEVICE_SHARE = 0.25  # share of the GPU's memory a device cache may take: the step needs the rest (fast: 8 GiB at 128³)
HOST_SHARE = 0.5  # share of the host's available memory (MemAvailable) the ranks' host caches may take together
PREFETCH = 4  # micro-batches each loader worker decodes ahead of the step
LOADER_TIMEOUT_S = 600  # a worker silent this long (a hung file system) stops the run with an error

Batch = tuple[Tensor, Tensor]  # (images (B, C, D, H, W), masks (B, M, D, H, W))


class LoaderError(MedddpmError):
    """A loader worker died or fell silent; the last checkpoint is left as it was."""


@dataclass(frozen=True)
class Plan:
    """The pipeline a run uses and why; recorded in the checkpoint (``config.data``) and ``log.csv``."""

    pipeline: str  # device | host | none
    subjects: int  # subjects in the data set
    subject_bytes: int  # bytes of one decoded subject (float32 image + one-hot mask)
    budget_bytes: int  # what the memory rule allows a cache of the chosen kind (0 for none)
    reason: str  # one sentence: the rule that decided

    @property
    def cache_bytes(self) -> int:
        return self.subjects * self.subject_bytes

    def asdict(self) -> dict[str, Any]:
        return {**asdict(self), "cache_bytes": self.cache_bytes}


def subject_bytes(channels: int, size: Sequence[int]) -> int:
    """Bytes of one decoded subject: ``channels`` (image + mask) float32 volumes of ``size``."""
    voxels = 1
    for s in size:
        voxels *= int(s)
    return 4 * channels * voxels


def host_available_bytes() -> int:
    """MemAvailable from /proc/meminfo (Linux), else the free physical pages."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def local_ranks() -> int:
    """Processes of this run on this host (torchrun's LOCAL_WORLD_SIZE; 1 without torchrun)."""
    try:
        return max(1, int(os.environ.get("LOCAL_WORLD_SIZE", "1")))
    except ValueError:
        return 1


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB"


def plan(choice: str, subjects: int, channels: int, size: Sequence[int], device: torch.device,
         ranks_here: int | None = None, host_bytes: int | None = None) -> Plan:
    """The pipeline for ``choice`` (``Knobs.data_cache``) under the memory rule (module doc). A cache
    asked for by name that breaks the rule is refused with an error naming the numbers."""
    each = subject_bytes(channels, size)
    need = subjects * each
    ranks_here = local_ranks() if ranks_here is None else ranks_here
    host = (host_available_bytes() if host_bytes is None else host_bytes) * HOST_SHARE // ranks_here
    gpu = int(torch.cuda.get_device_properties(device).total_memory * DEVICE_SHARE) if device.type == "cuda" else 0
    what = f"{subjects} subjects × {_gib(each)} = {_gib(need)}"
    if choice == "none":
        return Plan("none", subjects, each, 0, "decoded per draw by loader workers (asked for)")
    if choice in ("auto", "device") and device.type == "cuda" and need <= gpu:
        return Plan("device", subjects, each, gpu, f"{what} ≤ {DEVICE_SHARE:.0%} of the GPU's memory ({_gib(gpu)})")
    if choice == "device" and device.type == "cuda":
        raise InputError(f"data_cache device: {what} exceed {DEVICE_SHARE:.0%} of the GPU's memory ({_gib(gpu)}); "
                         "use a configuration with data_cache auto or none")
    if choice in ("auto", "device", "host") and need <= host:
        why = f"{what} ≤ {HOST_SHARE:.0%} of the available host memory / {ranks_here} rank(s) ({_gib(host)})"
        return Plan("host", subjects, each, host, why)
    if choice in ("device", "host"):
        raise InputError(f"data_cache {choice}: {what} exceed {HOST_SHARE:.0%} of the available host memory / "
                         f"{ranks_here} rank(s) ({_gib(host)}); use a configuration with data_cache auto or none")
    return Plan("none", subjects, each, 0, f"{what} fit neither cache (GPU {_gib(gpu)}, host {_gib(host)})")


def stack_cache(dataset, plan_: Plan, to_device: Callable[[Tensor], Tensor]) -> Batch | None:
    """Every (image, mask) of ``dataset`` decoded once and stacked where ``plan_`` says: on the GPU
    (in the run's memory layout), in pinned host memory, or nothing for ``none``."""
    if plan_.pipeline == "none":
        return None
    items = [dataset[i] for i in range(len(dataset))]
    images, masks = torch.stack([i for i, _ in items]), torch.stack([m for _, m in items])
    if plan_.pipeline == "device":
        return to_device(images), to_device(masks)
    if torch.cuda.is_available():
        return images.pin_memory(), masks.pin_memory()
    return images, masks


# ---- the draws of one rank ----------------------------------------------------------------------

class _Reads(torch.utils.data.Dataset):
    """The data set as loader workers read it: a failure becomes a one-line message that the
    loop raises as an ``InputError`` (never a worker traceback)."""

    def __init__(self, dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        try:
            return self.dataset[i]
        except Exception as exc:  # anything a decoder raises for a broken file
            return " ".join(f"{exc}".split()) or type(exc).__name__


def _collate(items: list) -> Batch | str:
    failed = [x for x in items if isinstance(x, str)]
    if failed:
        return failed[0]
    return torch.stack([i for i, _ in items]), torch.stack([m for _, m in items])


class _BatchIndices:
    """DataLoader batch sampler: the subject indices of each micro-batch, in draw order."""

    def __init__(self, indices: Callable[[int], list[list[int]]], start: int, stop: int | None) -> None:
        self.indices, self.start, self.stop = indices, start, stop

    def __iter__(self) -> Iterator[list[int]]:
        step = self.start
        while self.stop is None or step < self.stop:
            yield from self.indices(step)
            step += 1


class Feed:
    """This rank's micro-batches from step ``start`` on (to ``stop``, or without end), on the
    device, in the order of its draws. ``take(step)`` returns step ``step``'s micro-batches.

    ``indices(step)`` gives the subject indices of each of a step's micro-batches. With a host
    cache or loader workers, the next micro-batch's copy to the GPU is issued on a side stream
    before the current one is handed out, so it overlaps the step."""

    def __init__(self, dataset, plan_: Plan, cache: Batch | None, indices: Callable[[int], list[list[int]]],
                 start: int, stop: int | None, device: torch.device, to_device: Callable[[Tensor], Tensor],
                 workers: int) -> None:
        self.cache, self.device, self.to_device = cache, device, to_device
        self.next_step = start
        self.per_step = len(indices(start))
        if plan_.pipeline == "none":
            loader = torch.utils.data.DataLoader(
                _Reads(dataset), batch_sampler=_BatchIndices(indices, start, stop), num_workers=workers,
                collate_fn=_collate, pin_memory=device.type == "cuda",
                prefetch_factor=PREFETCH if workers else None, timeout=LOADER_TIMEOUT_S if workers else 0)
            self._host: Iterator = iter(loader)
        else:
            self._host = (self._from_cache(idx) for idx in _BatchIndices(indices, start, stop))
        self.stream = torch.cuda.Stream(device) if device.type == "cuda" and plan_.pipeline != "device" else None
        self._ahead = self._load()

    def _from_cache(self, idx: list[int]) -> list[Batch]:
        """One view (pinned if the cache is) per subject of the micro-batch; joined on the device."""
        assert self.cache is not None
        return [(self.cache[0][i][None], self.cache[1][i][None]) for i in idx]

    def _next_host(self):
        try:
            batch = next(self._host)
        except StopIteration:
            return None
        except RuntimeError as exc:  # a worker that died (killed, out of memory) or timed out
            first = f"{exc}".strip().splitlines()[0] if f"{exc}".strip() else type(exc).__name__
            raise LoaderError(f"data loader stopped: {first}") from None
        if isinstance(batch, str):
            raise InputError(f"data loader: {batch}")
        return batch if isinstance(batch, list) else [batch]  # a loader's batch is already one stack

    def _to_device(self, parts: list[Batch]) -> Batch:
        moved = [(self.to_device(i), self.to_device(m)) for i, m in parts]
        if len(moved) == 1:
            return moved[0]
        return torch.cat([i for i, _ in moved]), torch.cat([m for _, m in moved])

    def _load(self):
        batch = self._next_host()
        if batch is None or self.stream is None:
            return None if batch is None else (self._to_device(batch), None)
        with torch.cuda.stream(self.stream):
            moved = self._to_device(batch)
            done = torch.cuda.Event()
            done.record(self.stream)
        return moved, done

    def _pop(self) -> Batch:
        if self._ahead is None:
            raise InputError("the data feed ran past its last step")
        batch, done = self._ahead
        if done is not None:
            current = torch.cuda.current_stream(self.device)
            current.wait_event(done)
            for t in batch:
                t.record_stream(current)  # the allocator keeps it until the step that reads it is done
        self._ahead = self._load()
        return batch

    def take(self, step: int) -> list[Batch]:
        if step != self.next_step:
            raise ValueError(f"the feed is at step {self.next_step}, asked for step {step}")
        self.next_step += 1
        return [self._pop() for _ in range(self.per_step)]

    def close(self) -> None:
        """Stop the loader workers (if any)."""
        host, self._host, self._ahead = self._host, iter(()), None
        shutdown = getattr(host, "_shutdown_workers", None)
        if shutdown is not None:
            shutdown()
