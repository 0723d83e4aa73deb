"""Does a faster configuration compute the same model? Denoiser agreement on fixed inputs and
loss parity after short training, per configuration (the paper's "without degrading synthesis
quality", §5, which it never measures).

Everything returns tidy ``pandas`` frames; ``scripts/fast_path.py`` writes them to the results
store, the book draws them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from .config import DiffusionConfig, Knobs, ModelConfig, run_config
from .data import MASK_LABELS, one_hot, phantom
from .engine import Engine, autocast, inference, to_device
from .model import UNet3D

AGREEMENT_TIMESTEPS = (1, 25, 125, 249)  # early, middle and late diffusion steps of T = 250


def seeded_weights(model_cfg: ModelConfig, seed: int = 0, jitter: float = 0.02) -> dict[str, Tensor]:
    """A reproducible state dict whose zero-initialised layers are jittered, so ε is not all zero."""
    gen = torch.Generator().manual_seed(seed)
    torch.manual_seed(seed)
    model = UNet3D(model_cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(jitter * torch.randn(p.shape, generator=gen))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def phantom_batch(model_cfg: ModelConfig, size: int, n: int, seed: int = 0) -> tuple[Tensor, Tensor]:
    """``n`` seeded head phantoms as (images (n, 1, S, S, S) in [-1, 1], one-hot masks in {-1, 1})."""
    rng = np.random.default_rng(seed)
    images, masks = [], []
    for _ in range(n):
        img, labels = phantom(size, rng)
        lo, hi = img.min(), img.max()
        images.append(torch.from_numpy((img - lo) / (hi - lo) * 2 - 1)[None])
        masks.append(torch.from_numpy(one_hot(labels.astype(np.int64), MASK_LABELS[model_cfg.name])))
    return torch.stack(images).float(), torch.stack(masks).float()


def fixed_triples(model_cfg: ModelConfig, size: int, timesteps: Sequence[int], seed: int = 0,
                  diffusion_cfg: DiffusionConfig = DiffusionConfig()) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Fixed (x_t, mask, t, ε): one phantom per timestep, noised with seeded ε (DDPM eq. 4)."""
    from .diffusion import GaussianDiffusion

    x0, mask = phantom_batch(model_cfg, size, len(timesteps), seed)
    t = torch.tensor(list(timesteps), dtype=torch.long)
    noise = torch.randn(x0.shape, generator=torch.Generator().manual_seed(seed + 1))
    x_t = GaussianDiffusion(lambda x, s: x, diffusion_cfg).q_sample(x0.double(), t, noise.double()).float()
    return x_t, mask, t, noise


@torch.no_grad()
def predict_eps(model_cfg: ModelConfig, knobs: Knobs, device: torch.device, state: dict[str, Tensor],
                x_t: Tensor, mask: Tensor, t: Tensor, dtype: torch.dtype = torch.float32) -> Tensor:
    """ε_θ(x_t, mask, t) under ``knobs`` on ``device`` (``dtype`` float64 for a CPU reference),
    returned as float64 on the CPU."""
    model, diffusion, eff = inference(model_cfg, knobs, device, state=state)
    model.to(dtype)
    inputs = [to_device(v.to(dtype), device, eff) for v in (x_t, mask)]
    with autocast(eff, device):
        eps = diffusion.eps(inputs[0], inputs[1], t.to(device))
    return eps.double().cpu()


def denoiser_agreement(model_cfg: ModelConfig, configs: Sequence[str], size: int, device: torch.device,
                       reference: str = "baseline", timesteps: Sequence[int] = AGREEMENT_TIMESTEPS,
                       seed: int = 0) -> pd.DataFrame:
    """Relative L2 and max-abs error of each configuration's ε against ``reference``'s, on the same
    seeded weights and fixed inputs, one row per (config, t)."""
    state = seeded_weights(model_cfg, seed)
    x_t, mask, t, _ = fixed_triples(model_cfg, size, timesteps, seed)
    ref = predict_eps(model_cfg, run_config(reference), device, state, x_t, mask, t)
    rows = []
    for name in configs:
        eps = predict_eps(model_cfg, run_config(name), device, state, x_t, mask, t)
        for k, step in enumerate(timesteps):
            err = eps[k] - ref[k]
            rows.append({"config": name, "reference": reference, "t": int(step), "size": size,
                         "rel_l2": float(err.norm() / ref[k].norm()), "max_abs": float(err.abs().max()),
                         "ref_rms": float(ref[k].square().mean().sqrt())})
    return pd.DataFrame(rows)


def short_training(model_cfg: ModelConfig, config: str, size: int, device: torch.device, steps: int = 50,
                   seed: int = 0, lr: float = 1e-4, subjects: int = 4, eval_seed: int = 1234) -> pd.DataFrame:
    """Train ``steps`` optimizer steps (batch 1, no accumulation) on seeded phantoms under ``config``,
    then the held-out denoising loss (L1 at fixed (x0, t, ε) triples, FP32 baseline forward of the
    trained weights), so every configuration is judged by the same evaluator. Rows: one per step
    (``kind='train'``) and one ``kind='eval'``."""
    torch.manual_seed(seed)
    engine = Engine(model_cfg, run_config(config), device, lr=lr)
    images, masks = phantom_batch(model_cfg, size, subjects, seed=100)
    images, masks = engine.to_device(images), engine.to_device(masks)
    order = np.random.default_rng(seed).integers(0, subjects, steps)
    losses = []
    for i in order:
        loss, _ = engine.train_step([images[i:i + 1]], [masks[i:i + 1]])
        losses.append(loss.clone())
    train = torch.stack(losses).tolist()
    state = {k: v.detach().float().cpu().contiguous() for k, v in engine.model.state_dict().items()}
    x_t, mask, t, noise = fixed_triples(model_cfg, size, AGREEMENT_TIMESTEPS, eval_seed)
    eps = predict_eps(model_cfg, run_config("baseline"), device, state, x_t, mask, t)
    eval_loss = float((eps - noise.double()).abs().mean())
    rows = [{"config": config, "seed": seed, "size": size, "kind": "train", "step": k + 1, "loss": v}
            for k, v in enumerate(train)]
    rows.append({"config": config, "seed": seed, "size": size, "kind": "eval", "step": steps, "loss": eval_loss})
    return pd.DataFrame(rows)
