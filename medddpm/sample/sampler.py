"""Sampling with a trained checkpoint: one NIfTI per mask, in the mask's space (paper §2.1).

The denoiser runs under a run configuration of its own (``--config``; the checkpoint's training
configuration does not matter): inference mode, bf16 autocast, ``torch.compile`` and one CUDA
graph per denoising step where the configuration says so, several masks per batch. Each mask's
noise comes from a generator seeded by (seed, file name), so a mask's sample does not depend on
the batch it is in, nor, under torchrun, on the rank that draws it: rank r of W takes the masks
r, r + W, … of the sorted list and writes only those.
"""
from __future__ import annotations

import collections
import os
import time
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Callable, Iterator

import nibabel as nib
import numpy as np
import torch

from ..core.config import (CONFIGS, SAMPLING_ALIASES, SMALL_JOB, TRITON_KNOBS, fast_from, sampling_config,
                           switched_on)
from ..data.labels import MASK_LABELS, parse
from ..data.nifti import like_mask, list_nifti, load_mask_tensor, strip_nifti_suffix, write_like_mask
from ..run.distributed import World, draw_seed
from ..run import cache
from ..run.engine import autocast, inference, start_marks
from ..core.errors import InputError
from ..diffusion.solvers import FEW_STEP, Recommendation, check_sampler, denoiser_calls, resolve
from ..train.checkpoint import configs_from_checkpoint, data_config, load_checkpoint
from .timing import timing_line


# Threads that read and encode masks, and that write samples while the GPU samples the next ones
# (decompressing and compressing .nii.gz, resampling: work that releases the GIL).
IO_THREADS = min(4, os.cpu_count() or 1)


@dataclass(frozen=True)
class Job:
    """One volume to sample: the ``name`` that seeds its noise (``mask_seed``), its encoded mask
    ``cond`` (M, I, J, K, int8 in {−1, 1}; None where this rank does not sample it), the ``target``
    it is written to and ``save(volume, target)``, which writes a (C, I, J, K) sample there in the
    mask's space (``mask``'s, for a mask file)."""

    name: str
    cond: torch.Tensor | None
    target: Path
    save: Callable[[np.ndarray, Path], None]
    mask: Path | None = None  # the mask file whose space the sample takes (None: a BraTS case)

    def write(self, volume: np.ndarray) -> Path:
        self.save(volume, self.target)
        return self.target

    def to(self, folder: Path) -> "Job":
        """The same job written under another folder."""
        return replace(self, target=Path(folder) / self.target.name)


def default_config(device: torch.device, volumes: int | None = None, calls: int = FEW_STEP.steps) -> tuple[str, str]:
    """The configuration ``sample`` runs without ``--config``, and why: on a CPU FP32 (bf16 autocast
    is slower there, and compile and graphs fall back to eager anyway); on a GPU ``fast`` from
    ``fast_from(calls)`` volumes (all ranks' together) on, where its compilation pays off even with a
    cold cache, else ``SMALL_JOB`` (``fast-eager``: fast's sampler with nothing for torch.compile to
    do), done before ``fast`` would have compiled. The rule reads the command alone (not the cache's
    state, nor the ranks), so the same command always runs the same configuration and writes the
    same files."""
    if device.type != "cuda":
        return "baseline", "a CPU runs FP32"
    if volumes is None or volumes >= fast_from(calls):
        return "fast", f"fast ({volumes if volumes is not None else 'many'} volumes: its compilation pays off)"
    return SMALL_JOB, (f"{SMALL_JOB}, not compiled: {volumes} volume(s) of {calls} denoiser calls are done before "
                       f"fast would have compiled (fast from {fast_from(calls)} such volumes; --config fast forces it)")


def label_map(given: str | None, stored: str, model: str) -> str:
    """The ``--mask-labels`` map masks are read with: ``given`` (checked; "" = the preset's own
    labels), else the checkpoint's ``stored`` one."""
    if given is None:
        return stored
    return parse(given, model).spec if given else ""


def mask_seed(seed: int, name: str) -> int:
    """The generator seed of one mask: (run seed, its name: the mask file's, less the suffix)."""
    return draw_seed(seed, zlib.crc32(name.encode()))


class Sampler:
    """A checkpoint's denoiser under one run configuration, loaded and built once, then called
    many times (the shape of diffusers' pipelines): compiled on the first call of each shape, which
    runs eagerly, its CUDA graphs captured at the second (``Knobs.capture_after``); later calls
    replay them. ``medddpm sample`` makes one per
    command; the sampler gate one per configuration for all its runs; a notebook keeps one::

        s = Sampler.from_checkpoint("RUN/best.pt", config="fast")
        images = s.sample("NEW_MASKS", seed=1)       # nibabel images in the masks' own space
        s.write("NEW_MASKS", "SAMPLES")              # the files `medddpm sample` writes

    Each mask's noise comes from a generator seeded by (seed, mask name), so a mask's sample does
    not depend on the call, the batch or the rank it is drawn in."""

    def __init__(self, ckpt: dict, device: torch.device, config: str, weights: str = "ema") -> None:
        self.model_cfg, self.diff_cfg, _, _ = configs_from_checkpoint(ckpt)
        self.data_cfg = data_config(ckpt)
        self.size = tuple(ckpt["config"]["size"])
        self.device, self.config = device, config
        self.cache_key = cache.key(sampling_config(config).name, self.size, device) \
            if device.type == "cuda" and sampling_config(config).compile else None
        if self.cache_key is not None:
            cache.load(self.cache_key)  # before anything compiles
        self._shapes: set[int] = set()  # batch sizes sampled: a new one compiles, then the cache is saved
        self._copies = torch.cuda.Stream(device) if device.type == "cuda" else None  # read-backs beside the sampling
        _, self.diffusion, self.knobs = inference(self.model_cfg, sampling_config(config), device, self.diff_cfg,
                                                  ckpt[weights])

    @classmethod
    def from_checkpoint(cls, path: str | Path, config: str | None = None, device: str | torch.device | None = None,
                        weights: str = "ema") -> "Sampler":
        """Load ``path`` (a ``checkpoint.pt`` or ``best.pt``) under ``config`` (default: ``fast`` on a
        GPU, ``baseline`` on a CPU) on ``device`` (default: the GPU where there is one)."""
        from ..core.runtime import resolve_device

        device = resolve_device(None if device is None else str(device))
        config = config or default_config(device)[0]  # an object kept for many calls: fast on a GPU
        check_options(None, None, None, config, weights, 1, None)
        return cls(load_checkpoint(path), device, config, weights)

    def choose(self, sampler: str | None = None, steps: int | None = None, spacing: str | None = None,
               eta: float | None = None) -> tuple[Recommendation | None, str, int | None, str | None, float]:
        """(recommendation or None, sampler, steps, spacing, η) that a call with these options runs:
        without ``sampler`` the one recommended for this checkpoint's prediction target
        (``solvers.recommended``: v → the equivalence gate's 12-call chain, ε → DDPM 250)."""
        return resolve(sampler, steps, spacing, eta, self.diff_cfg.prediction)

    def jobs(self, masks: str | Path, out: str | Path | None, batch: int = 1, labels: str = "auto",
             one_file: bool = False, say: Callable[[str], None] | None = None,
             mask_labels: str | None = None, world: World = World()) -> list[Job]:
        """``read_masks`` for this checkpoint: its model, size and (unless ``mask_labels``) label map;
        ``out`` None: no files to write (``sample``); ``world``: whose share of the masks to read."""
        return read_masks(masks, out, self.model_cfg.name, self.size, batch, labels, one_file, say,
                          label_map(mask_labels, self.data_cfg.mask_labels, self.model_cfg.name), world)

    def volumes(self, jobs: list[Job], mine: list[int], sampler: str | None = None, steps: int | None = None,
                eta: float | None = None, seed: int = 0, batch: int = 1, clip: bool = True,
                spacing: str | None = None, progress: bool = False) -> Iterator[tuple[int, np.ndarray]]:
        """(job index, (C, I, J, K) volume in the model's space) for jobs ``mine``, ``batch`` at a
        time, each from its own generator (``mask_seed``); ``sampler`` None: the checkpoint's own (``choose``).
        On a GPU each batch is queued before the one before it is read back (``_read_back``), so the GPU
        does not wait between volumes for a copy, the host or the next batch's inputs."""
        from tqdm.auto import tqdm

        _, sampler, steps, spacing, eta = self.choose(sampler, steps, spacing, eta)
        check_options(sampler, steps, spacing, self.config, "ema", batch, eta, self.diff_cfg.timesteps)
        n_steps = denoiser_calls(sampler, steps, self.diff_cfg.timesteps)
        with tqdm(total=len(mine) * n_steps, disable=not progress, desc="sample", unit="step") as bar:
            queued = None  # (a batch's indices, its samples on the device, the event after their last kernel)
            for start in range(0, len(mine), batch):
                chunk = mine[start:start + batch]
                gens = [torch.Generator(self.device).manual_seed(mask_seed(seed, jobs[i].name)) for i in chunk]
                cond = torch.stack([jobs[i].cond for i in chunk])  # int8 ±1: exact
                if self._copies is not None:  # pinned, so the copy need not wait for the batch still sampling
                    cond = cond.pin_memory()
                cond = cond.to(self.device, non_blocking=True).float()
                with torch.inference_mode(), autocast(self.knobs, self.device):
                    x = self.diffusion.sample(cond, self.model_cfg.out_channels, sampler, steps, eta, gens, clip,
                                              on_step=lambda: bar.update(len(chunk)), spacing=spacing)
                done = None
                if self._copies is not None:
                    done = torch.cuda.Event()
                    done.record()
                if queued is not None:
                    yield from self._read_back(*queued)
                queued = (chunk, x, done)
            if queued is not None:
                yield from self._read_back(*queued)

    def _read_back(self, chunk: list[int], x: torch.Tensor, done: torch.cuda.Event | None
                   ) -> Iterator[tuple[int, np.ndarray]]:
        """A batch's samples on the host, once ``done`` (on a GPU: copied on a stream of its own into
        pinned memory while the next batch samples); a compiled shape's first batch saves the cache."""
        if done is None:
            host = x.float().cpu()
        else:
            with torch.cuda.stream(self._copies):
                self._copies.wait_event(done)
                host = x.to("cpu", torch.float32, non_blocking=True)
            self._copies.synchronize()
        if self.cache_key is not None and len(chunk) not in self._shapes:
            self._shapes.add(len(chunk))
            cache.save(self.cache_key)  # this shape's compiled work, for the next process
        volumes = host.numpy()
        yield from ((i, volumes[j]) for j, i in enumerate(chunk))

    def write_jobs(self, jobs: list[Job], mine: list[int], sampler: str | None, steps: int | None, eta: float | None, seed: int,
                   batch: int, clip: bool, spacing: str | None, progress: bool = False,
                   marks: dict[str, float] | None = None) -> list[Path]:
        """Sample jobs ``mine`` (indices of ``jobs``) and write each (``Job.write``: atomically), by
        ``IO_THREADS`` writers while the GPU samples the next ones; at most two volumes per writer
        wait in memory. A failed write stops the run once the writes already started are done.
        ``marks`` gets the ``time.perf_counter()`` of the first volume sampled, the last, and the
        last file written (``timing.TIMING``)."""
        marks = {} if marks is None else marks
        written: list[Path] = []
        with ThreadPoolExecutor(IO_THREADS) as pool:
            pending: collections.deque = collections.deque()
            for i, v in self.volumes(jobs, mine, sampler, steps, eta, seed, batch, clip, spacing, progress):
                marks.setdefault("first volume", time.perf_counter())
                pending.append(pool.submit(jobs[i].write, v))
                if len(pending) > 2 * IO_THREADS:
                    written.append(pending.popleft().result())
            marks["last volume"] = time.perf_counter()
            for k, t in start_marks(self.diffusion).items():  # when its kernels were ready and a graph captured
                marks.setdefault(k, t)
            written += [f.result() for f in pending]
        marks["written"] = time.perf_counter()
        return written

    def warmup(self, batch: int = 1, sampler: str | None = None, steps: int | None = None,
               spacing: str | None = None, eta: float | None = None) -> Path | None:
        """Compile everything one call of ``batch`` masks runs (on empty masks), so the compile cache
        holds it for the next process (``run.cache``; CUDA graphs live in one process only); returns
        the cache file (for ``fast-eager``, Triton's folder of its kernels). Where nothing compiled would
        outlive the process (a CPU, an eager configuration) it samples nothing and returns None."""
        kept = self.compile_cache()
        if kept is None:
            return None
        empty = torch.full((self.model_cfg.mask_channels, *self.size), -1.0)  # no label anywhere
        jobs = [Job(f"warmup-{k}", empty, Path("."), lambda volume, target: None) for k in range(batch)]
        for _ in self.volumes(jobs, list(range(batch)), sampler, steps, eta, 0, batch, True, spacing):
            pass
        return kept

    def compile_cache(self) -> Path | None:
        """Where this sampler's compiled work is kept for the next process: its Mega-Cache file, Triton's folder of
        its kernels (``fast-eager``), or None where nothing it runs is compiled (a CPU, an eager configuration)."""
        if self.cache_key is not None:
            return cache.artifact(self.cache_key)
        if self.device.type == "cuda" and switched_on(self.knobs, TRITON_KNOBS):  # fast-eager: Triton's own cache
            return Path(os.environ["TRITON_CACHE_DIR"])  # cache.use() set it when the denoiser was built
        return None

    def sample(self, masks: str | Path, *, sampler: str | None = None, steps: int | None = None,
               spacing: str | None = None, eta: float | None = None, seed: int = 0, batch: int = 1,
               clip: bool = True, mask_labels: str | None = None, progress: bool = False) -> dict[str, nib.Nifti1Image]:
        """{mask name: sampled image} for a mask file or a folder of them, each image in its mask's
        voxel grid, affine and orientation: what ``write`` would save, kept in memory."""
        jobs = self.jobs(masks, None, batch, mask_labels=mask_labels)
        if any(j.mask is None for j in jobs):
            raise InputError(f"{masks} is a BraTS root: sample it with .write(masks, out)")
        return {jobs[i].name: like_mask(v, jobs[i].mask) for i, v in
                self.volumes(jobs, list(range(len(jobs))), sampler, steps, eta, seed, batch, clip, spacing, progress)}

    def write(self, masks: str | Path, out: str | Path, *, sampler: str | None = None, steps: int | None = None,
              spacing: str | None = None, eta: float | None = None, seed: int = 0, batch: int = 1, clip: bool = True,
              labels: str = "auto", one_file: bool = False, mask_labels: str | None = None, world: World = World(),
              progress: bool = False, say: Callable[[str], None] | None = None) -> list[Path]:
        """Sample every mask of ``masks`` (this rank's share: masks r, r + W, … of the sorted list)
        into ``out``, as ``medddpm sample`` does; every mask is read and checked before any file is written."""
        _, sampler, steps, spacing, eta = self.choose(sampler, steps, spacing, eta)
        check_options(sampler, steps, spacing, self.config, "ema", batch, eta, self.diff_cfg.timesteps)
        jobs = world.checked(lambda: self.jobs(masks, out, batch, labels, one_file, say, mask_labels, world))
        mine = world.share(len(jobs))  # every rank read its share, and all agreed, before any write
        return self.write_jobs(jobs, mine, sampler, steps, eta, seed, batch, clip, spacing, progress)


def check_options(sampler: str | None, steps: int | None, spacing: str | None, config: str, weights: str, batch: int,
                  eta: float | None, timesteps: int | None = None) -> None:
    """Refuse a sampling option (InputError: one line) before anything is read or written; the
    step count against the schedule's ``timesteps`` once the checkpoint says how many it has
    (``solvers.check_sampler``)."""
    if weights not in ("ema", "model"):
        raise InputError(f"--weights must be 'ema' or 'model', got {weights!r}")
    if config not in CONFIGS and config not in SAMPLING_ALIASES:
        raise InputError(f"--config {config!r} is not a run configuration; choose one of "
                         f"{', '.join([*SAMPLING_ALIASES, *CONFIGS])}")
    if batch < 1:
        raise InputError(f"--batch must be >= 1, got {batch}")
    try:
        check_sampler(sampler, steps, spacing, timesteps, eta)
    except ValueError as exc:
        raise InputError(str(exc)) from None


def read_masks(masks: str | Path, out: str | Path | None, model: str, size: tuple[int, ...], batch: int = 1,
               labels: str = "auto", one_file: bool = False, say: Callable[[str], None] | None = None,
               mask_labels: str = "", world: World = World()) -> list[Job]:
    """A job per mask of ``masks``, its target under ``out`` (None: nothing to write): a mask file, a
    folder of them, or for a BraTS model a BraTS root (``brats.find_cases``; the subject's
    modalities, where there, give the healthy brain and the window; ``say`` hears which label rule
    applied; ``mask_labels`` maps a folder's label values, ``labels.parse``). ``world``'s share of
    the sorted list (``World.share``) is read and encoded, ``IO_THREADS`` masks at a time; the
    others' ``cond`` stays None. Refuses a target that exists, an unknown model and any
    bad mask read before anything is written."""
    from ..data import brats

    if model not in MASK_LABELS:
        raise InputError(f"the checkpoint's model {model!r} has no mask labels defined")
    out = Path(out) if out is not None else None
    if out is not None and out.exists() and not out.is_dir():
        raise InputError(f"--out {out} is a file; give a folder for the samples (it is made if missing)")
    what = ""
    if model in brats.BRATS_MODELS and brats.is_brats_root(masks):
        if mask_labels:
            raise InputError("--mask-labels applies to a folder of mask files; a BraTS root has its own labels")
        cases, what = brats.find_cases(masks, labels, need_images=False)
        read = set(world.share(len(cases)))
        jobs = []
        for k, case in enumerate(cases):  # every case read first: a bad one fails before any output is written
            target = brats.targets(out or Path("."), case.subject, one_file)
            if k not in read:
                jobs.append(Job(case.subject, None, target, lambda volume, target: None))
                continue
            _, label_map, window = brats.prepare(case, brats.window_of(model))
            save = lambda volume, target, w=window, seg=case.mask: brats.write_case(volume, w, seg, target)
            jobs.append(Job(case.subject, brats.encode(label_map, size).to(torch.int8), target, save))
    else:
        if labels != "auto" or one_file:
            raise InputError(f"--labels and --one-file apply to BraTS roots; {masks} is a folder of mask files"
                             if model in brats.BRATS_MODELS else f"--labels and --one-file apply to BraTS models, "
                             f"not {model!r}")
        files = [Path(masks)] if Path(masks).is_file() else list_nifti(masks, "masks")
        read = world.share(len(files))
        with ThreadPoolExecutor(IO_THREADS) as pool:  # the first bad mask (in order) raises
            conds = dict(zip(read, pool.map(lambda k: load_mask_tensor(files[k], model, size, mask_labels, np.int8),
                                            read)))
        jobs = [Job(strip_nifti_suffix(f.name), conds.get(k), (out or Path(".")) / f"{strip_nifti_suffix(f.name)}.nii.gz",
                    lambda volume, target, f=f: write_like_mask(volume, f, target), f) for k, f in enumerate(files)]
    if batch > len(jobs):
        raise InputError(f"--batch {batch} is larger than the {len(jobs)} mask(s) in {masks}")
    existing = [j.target.name for j in jobs if out is not None and j.target.exists()]
    if existing:
        raise InputError(f"{out} already holds {', '.join(existing)}; choose another --out")
    if what and say is not None:
        say(f"masks: {what}")  # which label rule applied, as train says it; once every check passed
    return jobs


def sample_masks(checkpoint: str | Path, masks: str | Path, out: str | Path, device: torch.device,
                 sampler: str | None = None, steps: int | None = None, eta: float | None = None, seed: int = 0,
                 weights: str = "ema", progress: bool = True, config: str | None = None, batch: int = 1,
                 world: World = World(), clip: bool = True, spacing: str | None = None, labels: str = "auto",
                 one_file: bool = False, say: Callable[[str], None] | None = None,
                 mask_labels: str | None = None, started: float | None = None,
                 imported: float | None = None) -> list[Path]:
    """Generate one image per mask file (this rank's share); every input is checked before
    anything is written, and each file is written atomically. ``clip``: x̂₀ clipped to [−1, 1] at
    every step (as the reference implementation does; ``False`` is DDPM Alg. 2 as published).
    ``sampler``: one of ``solvers.SAMPLERS`` (None: the checkpoint's recommended one, ``solvers.resolve``,
    which ``say`` hears named); ``steps``, ``spacing`` and ``eta``: its chain; ``labels`` and
    ``one_file``: a BraTS root's label convention and output form (``read_masks``); ``say`` is
    told what the masks are (a BraTS root: its layout and the label rule that applied);
    ``mask_labels`` maps the mask files' labels (``labels.parse``; None: the checkpoint's own map);
    with ``started`` (the ``time.perf_counter()`` of the process's start, or of the command's) ``say``
    hears ``timing_line`` at the end; ``imported``: when the command line was read (its imports done)."""
    check_options(sampler, steps, spacing, config or "fast", weights, batch, eta)  # the rest once the checkpoint says
    ckpt = load_checkpoint(checkpoint)
    model_cfg, diff_cfg, _, _ = configs_from_checkpoint(ckpt)
    rec, sampler, steps, spacing, eta = resolve(sampler, steps, spacing, eta, diff_cfg.prediction)
    check_options(sampler, steps, spacing, config or "fast", weights, batch, eta, diff_cfg.timesteps)
    labels_map = label_map(mask_labels, data_config(ckpt).mask_labels, model_cfg.name)
    jobs = world.checked(lambda: read_masks(masks, out, model_cfg.name, tuple(ckpt["config"]["size"]), batch, labels,
                                            one_file, say, labels_map, world))
    mine = world.share(len(jobs))  # every rank read its share, and all agreed, before any write
    if config is None:
        calls = denoiser_calls(sampler, steps, diff_cfg.timesteps)
        config, why = default_config(device, len(jobs), calls)  # every rank decides alike
        if say is not None and device.type == "cuda":
            say(f"config {why}")
    if say is not None and rec is not None:
        say(f"sampler {rec.describe()}: the default; {rec.why}")
    denoiser = Sampler(ckpt, device, config, weights)
    marks = {"ready": time.perf_counter(), **({} if imported is None else {"imports": imported})}
    written = denoiser.write_jobs(jobs, mine, sampler, steps, eta, seed, batch, clip, spacing, progress, marks)
    if say is not None and started is not None:
        say(timing_line(marks, started))
    return written
