"""The profiled workload: N training steps of a model/configuration at a size, with the package's
NVTX ranges (``train_step`` ⊃ ``forward``/``backward``/``optimizer``), for ncu to attach to.

    python -m medddpm.profiling.workload --model whole-head --config baseline --size 128 --steps 3
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Any, Callable

import torch

from ..core.config import Knobs, ModelConfig, model_preset, run_config
from ..run.engine import Engine, to_device
from ..core.errors import MedddpmError
from ..core.runtime import resolve_device


def synthetic_batch(cfg: ModelConfig, size: tuple[int, int, int], knobs: Knobs, device: torch.device,
                    batch: int = 1, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """A seeded image in [-1, 1] and a binary one-hot-like mask in {-1, 1} (timing only)."""
    gen = torch.Generator(device="cpu").manual_seed(seed)
    image = torch.rand((batch, cfg.out_channels, *size), generator=gen) * 2 - 1
    mask = (torch.rand((batch, cfg.mask_channels, *size), generator=gen) > 0.5).float() * 2 - 1
    return to_device(image, device, knobs), to_device(mask, device, knobs)


class Workload:
    """An engine and one fixed batch; ``step()`` runs one NVTX-annotated training step
    (``grad_accum`` × forward + L1 loss + backward, then Adam): the paper's step, as ``medddpm train --recipe paper``
    or ``cosine`` runs it (the default recipe's Muon adds its update: chapter 17's step table)."""

    def __init__(self, cfg: ModelConfig, knobs: Knobs, size: tuple[int, int, int], device: torch.device,
                 batch: int = 1, grad_accum: int = 1) -> None:
        cfg.check_size(size)
        if batch < 1 or grad_accum < 1:
            raise ValueError(f"batch and grad_accum must be >= 1, got {batch} and {grad_accum}")
        torch.manual_seed(0)
        self.cfg, self.size, self.device, self.batch, self.grad_accum = cfg, size, device, batch, grad_accum
        self.engine = Engine(cfg, knobs, device)
        self.knobs = self.engine.knobs
        self.image, self.mask = synthetic_batch(cfg, size, self.knobs, device, batch)

    def step(self, mark: Callable[[], Any] | None = None) -> tuple[torch.Tensor, list[Any]]:
        """One step; ``mark()`` (a timer) is called at its start, after forward + loss (None
        inside a CUDA graph) and at its end; returns the loss (a device tensor) and the marks."""
        return self.engine.train_step([self.image] * self.grad_accum, [self.mask] * self.grad_accum, mark)

    def settings(self) -> dict:
        return self.engine.settings()


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m medddpm.profiling.workload")
    p.add_argument("--model", default="whole-head")
    p.add_argument("--config", default="baseline")
    p.add_argument("--size", type=int, default=128)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--device", default="cuda")
    p.add_argument("--profile-last", action="store_true",
                   help="wrap only the last step in cudaProfilerStart/Stop (ncu --profile-from-start off)")
    a = p.parse_args(argv)
    try:
        cfg, knobs = model_preset(a.model), run_config(a.config, training=True)
        w = Workload(cfg, knobs, (a.size,) * 3, resolve_device(a.device), a.batch)
        losses = []
        for i in range(a.steps):
            last = a.profile_last and i == a.steps - 1
            if last:
                torch.cuda.synchronize()
                torch.cuda.profiler.start()
            losses.append(float(w.step()[0]))
            if last:
                torch.cuda.synchronize()
                torch.cuda.profiler.stop()
    except (MedddpmError, ValueError) as exc:
        print(f"workload: error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({"config": a.config, "losses": losses, "settings": w.settings()}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
