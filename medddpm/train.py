"""Training Med-DDPM (paper §3.2): Adam, gradient accumulation, EMA, atomic checkpoints, exact
resume, NVTX ranges ``train_step`` ⊃ ``forward`` / ``backward`` / ``optimizer`` for profiling."""
from __future__ import annotations

import contextlib
import copy
import csv
import io
import json
import math
import random
from dataclasses import asdict
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import torch
from torch import Tensor, nn

from .config import DiffusionConfig, Knobs, ModelConfig, TrainConfig, from_dict
from .diffusion import GaussianDiffusion
from .errors import DivergedError, InputError
from .io import atomic_path, write_text_atomic
from .model import UNet3D
from .runtime import apply_knobs

CHECKPOINT = "checkpoint.pt"


@contextlib.contextmanager
def nvtx(name: str) -> Iterator[None]:
    """An NVTX push/pop range on CUDA builds with a GPU; nothing elsewhere."""
    active = torch.cuda.is_available()
    if active:
        torch.cuda.nvtx.range_push(name)
    try:
        yield
    finally:
        if active:
            torch.cuda.nvtx.range_pop()


def memory_format(knobs: Knobs) -> torch.memory_format:
    return torch.channels_last_3d if knobs.channels_last else torch.contiguous_format


def build(model_cfg: ModelConfig, knobs: Knobs, device: torch.device,
          diffusion_cfg: DiffusionConfig = DiffusionConfig()) -> tuple[UNet3D, GaussianDiffusion]:
    """The model (in ``knobs``' layout) and a diffusion wrapper that runs it (compiled if asked)."""
    apply_knobs(knobs)
    model = UNet3D(model_cfg, checkpoint_attention=knobs.checkpoint_attention)
    model = model.to(device=device, memory_format=memory_format(knobs))
    runner: nn.Module = torch.compile(model) if knobs.compile else model
    return model, GaussianDiffusion(runner, diffusion_cfg).to(device)


def autocast(knobs: Knobs, device: torch.device) -> contextlib.AbstractContextManager:
    if knobs.precision == "bf16":
        return torch.autocast(device.type, dtype=torch.bfloat16)
    return contextlib.nullcontext()


def to_device(t: Tensor, device: torch.device, knobs: Knobs) -> Tensor:
    return t.to(device, non_blocking=True).contiguous(memory_format=memory_format(knobs))


def micro_step(diffusion: GaussianDiffusion, image: Tensor, mask: Tensor, knobs: Knobs,
               scale: float = 1.0) -> Tensor:
    """Forward + L1 loss + backward of one micro-batch; returns the unscaled loss (detached)."""
    with nvtx("forward"), autocast(knobs, image.device):
        loss = diffusion.loss(image, mask)
    with nvtx("backward"):
        (loss * scale).backward()
    return loss.detach()


@torch.no_grad()
def ema_update(ema: nn.Module, model: nn.Module, decay: float) -> None:
    for e, p in zip(ema.parameters(), model.parameters()):
        e.lerp_(p, 1 - decay)


def rng_state() -> dict[str, Any]:
    state = {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def sample_order(n: int, seed: int, micro_batch: int) -> int:
    """Dataset index of the ``micro_batch``-th draw: a fresh seeded permutation every epoch."""
    epoch, pos = divmod(micro_batch, n)
    return int(np.random.default_rng([seed, epoch]).permutation(n)[pos])


def load_checkpoint(path: str | Path, map_location: str | torch.device = "cpu") -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise InputError(f"checkpoint {str(path)!r} does not exist")
    try:
        ckpt = torch.load(path, map_location=map_location, weights_only=False)
    except Exception as exc:
        raise InputError(f"cannot read checkpoint {path}: {exc}") from None
    missing = {"step", "model", "ema", "optimizer", "config", "rng"} - set(ckpt)
    if missing:
        raise InputError(f"{path} is not a medddpm checkpoint (missing {sorted(missing)})")
    return ckpt


def configs_from_checkpoint(ckpt: dict[str, Any]) -> tuple[ModelConfig, DiffusionConfig, TrainConfig, Knobs]:
    c = ckpt["config"]
    return (from_dict(ModelConfig, c["model"]), from_dict(DiffusionConfig, c["diffusion"]),
            from_dict(TrainConfig, c["train"]), from_dict(Knobs, c["knobs"]))


class Trainer:
    """Optimises a ``GaussianDiffusion`` on a dataset of (image, mask) pairs, batch 1 per draw.

    One *step* is one optimizer step over ``grad_accum`` micro-batches (paper §3.2).
    Checkpoints hold ``{step, model, ema, optimizer, config, rng, losses, size}``.
    """

    def __init__(self, dataset, model_cfg: ModelConfig, train_cfg: TrainConfig, knobs: Knobs,
                 device: torch.device, out: str | Path, size: tuple[int, int, int],
                 diffusion_cfg: DiffusionConfig = DiffusionConfig()) -> None:
        self.dataset, self.device, self.out = dataset, device, Path(out)
        self.model_cfg, self.train_cfg, self.knobs, self.diffusion_cfg = model_cfg, train_cfg, knobs, diffusion_cfg
        self.size = tuple(size)
        model_cfg.check_size(self.size)
        torch.manual_seed(train_cfg.seed)
        np.random.seed(train_cfg.seed)
        random.seed(train_cfg.seed)
        self.model, self.diffusion = build(model_cfg, knobs, device, diffusion_cfg)
        self.ema = copy.deepcopy(self.model).requires_grad_(False)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=train_cfg.lr)
        self.step = 0
        self.losses: list[float] = []

    # ---- persistence --------------------------------------------------------------------------
    def config_dict(self) -> dict[str, Any]:
        return {"model": asdict(self.model_cfg), "diffusion": asdict(self.diffusion_cfg),
                "train": asdict(self.train_cfg), "knobs": asdict(self.knobs), "size": list(self.size)}

    def save(self) -> Path:
        """Write ``checkpoint.pt`` and ``log.csv`` atomically (temp file + rename)."""
        ckpt = {"step": self.step, "model": self.model.state_dict(), "ema": self.ema.state_dict(),
                "optimizer": self.optimizer.state_dict(), "config": self.config_dict(),
                "rng": rng_state(), "losses": list(self.losses)}
        path = self.out / CHECKPOINT
        with atomic_path(path) as tmp:
            torch.save(ckpt, tmp)
        buf = io.StringIO()
        writer = csv.writer(buf)
        writer.writerow(["step", "loss"])
        writer.writerows((i + 1, f"{loss:.8g}") for i, loss in enumerate(self.losses))
        write_text_atomic(self.out / "log.csv", buf.getvalue())
        return path

    def resume(self) -> None:
        ckpt = load_checkpoint(self.out / CHECKPOINT)  # CPU: RNG states must stay CPU tensors
        stored = json.loads(json.dumps(ckpt["config"]))  # tuples → lists on both sides
        mine = json.loads(json.dumps(self.config_dict()))
        for key in ("model", "diffusion", "train", "knobs", "size"):
            if stored[key] != mine[key]:
                raise InputError(f"cannot resume {self.out}: its {key} config {stored[key]} differs from {mine[key]}")
        self.model.load_state_dict(ckpt["model"])
        self.ema.load_state_dict(ckpt["ema"])
        self.optimizer.load_state_dict(ckpt["optimizer"])
        set_rng_state(ckpt["rng"])
        self.step = int(ckpt["step"])
        self.losses = list(ckpt.get("losses", []))

    # ---- training -----------------------------------------------------------------------------
    def batch(self, micro_batch: int) -> tuple[Tensor, Tensor]:
        b = self.train_cfg.batch_size
        items = [self.dataset[sample_order(len(self.dataset), self.train_cfg.seed, micro_batch * b + k)]
                 for k in range(b)]
        image = torch.stack([i for i, _ in items])
        mask = torch.stack([m for _, m in items])
        return to_device(image, self.device, self.knobs), to_device(mask, self.device, self.knobs)

    def train_step(self) -> float:
        """One optimizer step (``grad_accum`` micro-batches); raises DivergedError on NaN/inf."""
        accum = self.train_cfg.grad_accum
        total = 0.0
        with nvtx("train_step"):
            for k in range(accum):
                image, mask = self.batch(self.step * accum + k)
                loss = float(micro_step(self.diffusion, image, mask, self.knobs, 1.0 / accum))
                if not math.isfinite(loss):
                    raise DivergedError(
                        f"loss became {loss} at step {self.step + 1}; the last good checkpoint "
                        f"({self.out / CHECKPOINT}) is left as it was")
                total += loss / accum
            with nvtx("optimizer"):
                self.optimizer.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        cfg = self.train_cfg
        if self.step % cfg.ema_every == 0:
            if self.step < cfg.ema_start_step:
                self.ema.load_state_dict(self.model.state_dict())
            else:
                ema_update(self.ema, self.model, cfg.ema_decay)
        self.losses.append(total)
        return total

    def fit(self, steps: int, progress: bool = True) -> list[float]:
        """Train until ``steps`` optimizer steps in total; checkpoint every ``save_every`` and at the end."""
        if steps < self.step:
            raise InputError(f"--steps {steps} is below the {self.step} steps already trained")
        from tqdm.auto import tqdm

        bar = tqdm(total=steps, initial=self.step, disable=not progress, desc="train", unit="step")
        try:
            while self.step < steps:
                loss = self.train_step()
                bar.update(1)
                bar.set_postfix(loss=f"{loss:.4f}")
                if self.step % self.train_cfg.save_every == 0:
                    self.save()
        finally:
            bar.close()
        self.save()
        return self.losses
