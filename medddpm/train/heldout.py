"""Held-out evaluation (paper §3.2's loss on subjects never trained on): fixed noised inputs of
the held-out subjects, their L1 denoising loss from the FP32 baseline forward, and the weights as
a CPU copy. The training loop (``train``) and the quality studies (``quality``) both use it.
"""
from __future__ import annotations

from typing import Sequence

import pandas as pd
import torch
from torch import Tensor

from ..core.config import DataConfig, DiffusionConfig, Knobs, ModelConfig, run_config
from ..data.nifti import Pair
from ..data.volumes import VolumeDataset
from ..run.engine import autocast, inference, to_device
from ..core.errors import InputError
from ..core.runtime import preserved_backend_flags, set_backend_flags

HELDOUT_TIMESTEPS = (1, 25, 50, 125, 200, 249)  # held-out loss: near-clean to almost pure noise


def noised(x0: Tensor, t: Tensor, seed: int, diffusion_cfg: DiffusionConfig = DiffusionConfig()) -> tuple[Tensor, Tensor]:
    """(x_t, ε): ``x0`` noised to ``t`` with ε from a CPU generator seeded ``seed`` (DDPM eq. 4)."""
    from ..diffusion.gaussian import GaussianDiffusion

    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed))
    x_t = GaussianDiffusion(lambda x, s: x, diffusion_cfg).q_sample(x0.double(), t, noise.double()).float()
    return x_t, noise


def predict_eps(model_cfg: ModelConfig, knobs: Knobs, device: torch.device, state: dict[str, Tensor],
                x_t: Tensor, mask: Tensor, t: Tensor, dtype: torch.dtype = torch.float32,
                chunk: int | None = None, diffusion_cfg: DiffusionConfig = DiffusionConfig()) -> Tensor:
    """ε_θ(x_t, mask, t) of the weights ``state`` under ``knobs`` (``Evaluator.eps``), once."""
    return Evaluator(model_cfg, state, device, diffusion_cfg, knobs, dtype).eps(x_t, mask, t, chunk)


def split_held_out(pairs: Sequence[Pair], held_out: int) -> tuple[list[Pair], list[Pair]]:
    """(train, held-out): the last ``held_out`` pairs in subject order are never trained on."""
    pairs = sorted(pairs, key=lambda p: p.subject)
    if not 1 <= held_out < len(pairs):
        raise InputError(f"--held-out must be in [1, {len(pairs) - 1}] for {len(pairs)} subjects, got {held_out}")
    return pairs[:-held_out], pairs[-held_out:]


def held_out_triples(pairs: Sequence[Pair], model_cfg: ModelConfig, size: tuple[int, int, int],
                     timesteps: Sequence[int] = HELDOUT_TIMESTEPS, seed: int = 4321,
                     diffusion_cfg: DiffusionConfig = DiffusionConfig(),
                     data_cfg: DataConfig = DataConfig()) -> tuple[pd.DataFrame, Tensor, Tensor, Tensor, Tensor]:
    """Fixed (x_t, mask, t, ε) for every (held-out subject, t): the keys as a frame (subject, t)
    and the tensors in the same order. ε is seeded, so every configuration meets the same inputs."""
    data = VolumeDataset(list(pairs), model_cfg.name, model_cfg.out_channels, size, data=data_cfg)
    keys, x0, masks = [], [], []
    for i, pair in enumerate(pairs):
        image, mask = data[i]
        for step in timesteps:
            keys.append({"subject": pair.subject, "t": int(step)})
            x0.append(image)
            masks.append(mask)
    t = torch.tensor([k["t"] for k in keys], dtype=torch.long)
    x_t, noise = noised(torch.stack(x0), t, seed, diffusion_cfg)
    return pd.DataFrame(keys), x_t, torch.stack(masks), t, noise


class Evaluator:
    """A forward that judges weights: the model built once under ``knobs`` (default: the FP32
    baseline, the held-out loss's judge, ``held_out_loss``) on ``device`` from the weights ``state``,
    in ``dtype`` (float64 for a CPU reference). A call may copy other weights in first, on the device
    (a training run evaluates every ``eval_every`` steps: no rebuild, no host round trip). The
    process-wide backend flags are the knobs' during a call and as they were after it, so it can run
    inside another configuration's training."""

    def __init__(self, model_cfg: ModelConfig, state: dict[str, Tensor], device: torch.device,
                 diffusion_cfg: DiffusionConfig = DiffusionConfig(), knobs: Knobs | None = None,
                 dtype: torch.dtype = torch.float32) -> None:
        with preserved_backend_flags():
            self.model, self.diffusion, self.knobs = inference(model_cfg, knobs or run_config("baseline"), device,
                                                               diffusion_cfg, state=state)
        if dtype != torch.float32:  # the float64 reference
            self.model.to(dtype)
        self.device, self.dtype = device, dtype

    @torch.no_grad()
    def eps(self, x_t: Tensor, mask: Tensor, t: Tensor, chunk: int | None = None,
            state: dict[str, Tensor] | None = None) -> Tensor:
        """ε_θ(x_t, mask, t), ``chunk`` inputs per forward (all at once by default), as float64 on the
        CPU (a v-predicting model's output converted to ε); ``state``: other weights of the same
        model (a ``state_dict()``, any device and float dtype) copied in first. Only where the knobs
        keep the weights as loaded: bf16 copies, a frozen timestep table or FP8 weights are made
        once, from the weights the model was built with."""
        if state is not None and (self.knobs.bf16_weights or self.knobs.timestep_table or self.knobs.fp8_convs != "none"):
            raise ValueError(f"configuration {self.knobs.name!r} derives its weights at build: build an Evaluator per state")
        n = chunk or len(t)
        with preserved_backend_flags():
            set_backend_flags(self.knobs.tf32, self.knobs.cudnn_benchmark, self.knobs.cudnn_benchmark_limit)
            if state is not None:
                self.model.load_state_dict(state)
            out = []
            for k in range(0, len(t), n):
                inputs = [to_device(v[k:k + n].to(self.dtype), self.device, self.knobs) for v in (x_t, mask)]
                with autocast(self.knobs, self.device):
                    out.append(self.diffusion.eps(inputs[0], inputs[1], t[k:k + n].to(self.device)).cpu())
        return torch.cat(out).double()

    def loss(self, state: dict[str, Tensor], triples, chunk: int = 4) -> pd.DataFrame:
        """L1 between ε and ε_θ(x_t, mask, t) per held-out triple (DDPM eq. 14 with L1) of the
        weights ``state``, in ε for either parameterization."""
        keys, x_t, mask, t, noise = triples
        eps = self.eps(x_t, mask, t, chunk, state)
        return keys.assign(loss=(eps - noise.double()).abs().flatten(1).mean(1).numpy())


def held_out_loss(model_cfg: ModelConfig, state: dict[str, Tensor], triples, device: torch.device,
                  chunk: int = 4, diffusion_cfg: DiffusionConfig = DiffusionConfig()) -> pd.DataFrame:
    """L1 between ε and ε_θ(x_t, mask, t) per held-out triple (DDPM eq. 14 with L1), always from
    the FP32 baseline forward of the weights ``state`` (in ε for either parameterization): every configuration is judged by the same
    evaluator, so the loss measures the weights, not the evaluator's numerics. One evaluation;
    many of them keep an ``Evaluator``."""
    return Evaluator(model_cfg, state, device, diffusion_cfg).loss(state, triples, chunk)


def cpu_state(model: torch.nn.Module) -> dict[str, Tensor]:
    """A float32, contiguous CPU copy of ``model``'s weights (loads into any configuration)."""
    return {k: v.detach().float().cpu().contiguous() for k, v in model.state_dict().items()}
