"""Does a faster configuration compute the same model? Denoiser agreement on fixed inputs
(against an FP64 CPU forward), loss parity after short training on phantoms, and training parity
on real data with a held-out denoising loss, per configuration (the paper's "without degrading
synthesis quality", §5, which it never measures). Sample agreement lives in ``sample_quality``.

Everything returns tidy ``pandas`` frames; ``scripts/quality.py`` and ``scripts/fast_path.py``
write them to the results store, the book draws them.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import pandas as pd
import torch
from torch import Tensor

from ..core.config import DiffusionConfig, ModelConfig, TrainConfig, run_config
from ..data.labels import MASK_LABELS
from ..data.nifti import Pair, one_hot, phantom
from ..data.volumes import VolumeDataset
from ..run.engine import Engine
from ..core.errors import InputError
from ..net.model import UNet3D
from .heldout import (HELDOUT_TIMESTEPS, cpu_state, held_out_loss, held_out_triples, noised,  # noqa: F401 (re-exported)
                      predict_eps, split_held_out)

AGREEMENT_TIMESTEPS = (1, 25, 125, 249)  # early, middle and late diffusion steps of T = 250
FP64 = "fp64-cpu"  # the reference name of a float64 forward on the CPU


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
    x0, mask = phantom_batch(model_cfg, size, len(timesteps), seed)
    t = torch.tensor(list(timesteps), dtype=torch.long)
    x_t, noise = noised(x0, t, seed + 1, diffusion_cfg)
    return x_t, mask, t, noise


def denoiser_agreement(model_cfg: ModelConfig, configs: Sequence[str], size: int, device: torch.device,
                       reference: str = "baseline", timesteps: Sequence[int] = AGREEMENT_TIMESTEPS,
                       seed: int = 0) -> pd.DataFrame:
    """Relative L2 and max-abs error of each configuration's ε against ``reference``'s (a
    configuration on ``device``, or ``FP64``: the baseline network in float64 on the CPU), on the
    same seeded weights and fixed inputs, one row per (config, t)."""
    x_t, mask, t, _ = fixed_triples(model_cfg, size, timesteps, seed)
    keys = pd.DataFrame({"t": [int(s) for s in timesteps], "size": size})
    return eps_agreement(model_cfg, seeded_weights(model_cfg, seed), configs, (keys, x_t, mask, t), device, reference)


def eps_agreement(model_cfg: ModelConfig, state: dict[str, Tensor], configs: Sequence[str], inputs,
                  device: torch.device, reference: str = "baseline", chunk: int | None = None) -> pd.DataFrame:
    """ε of each configuration against ``reference``'s (a configuration on ``device``, or ``FP64``)
    for the weights ``state`` on ``inputs`` = (keys, x_t, mask, t), one row per (config, input):
    the keys' columns, relative L2, max-abs error, the error's signed mean (a bias that relative L2
    hides at its size but that a sampler sums over its steps) and the reference's RMS."""
    keys, x_t, mask, t = inputs
    if reference == FP64:
        ref = predict_eps(model_cfg, run_config("baseline"), torch.device("cpu"), state, x_t, mask, t,
                          torch.float64, chunk)
    else:
        ref = predict_eps(model_cfg, run_config(reference), device, state, x_t, mask, t, chunk=chunk)
    rows = []
    for name in configs:
        eps = predict_eps(model_cfg, run_config(name), device, state, x_t, mask, t, chunk=chunk)
        for k, key in enumerate(keys.to_dict("records")):
            err = eps[k] - ref[k]
            rows.append({"config": name, "reference": reference, **key,
                         "rel_l2": float(err.norm() / ref[k].norm()), "max_abs": float(err.abs().max()),
                         "mean_err": float(err.mean()), "ref_rms": float(ref[k].square().mean().sqrt())})
    return pd.DataFrame(rows)


def short_training(model_cfg: ModelConfig, config: str, size: int, device: torch.device, steps: int = 50,
                   seed: int = 0, lr: float = 1e-4, subjects: int = 4, eval_seed: int = 1234) -> pd.DataFrame:
    """Train ``steps`` optimizer steps (batch 1, no accumulation) on seeded phantoms under ``config``,
    then the held-out denoising loss (L1 at fixed (x0, t, ε) triples, FP32 baseline forward of the
    trained weights), so every configuration is judged by the same evaluator. Rows: one per step
    (``kind='train'``) and one ``kind='eval'``."""
    torch.manual_seed(seed)
    engine = Engine(model_cfg, run_config(config, training=True), device, lr=lr)
    images, masks = phantom_batch(model_cfg, size, subjects, seed=100)
    images, masks = engine.to_device(images), engine.to_device(masks)
    order = np.random.default_rng(seed).integers(0, subjects, steps)
    losses = []
    for i in order:
        loss, _ = engine.train_step([images[i:i + 1]], [masks[i:i + 1]])
        losses.append(loss.clone())
    train = torch.stack(losses).tolist()
    state = cpu_state(engine.model)
    x_t, mask, t, noise = fixed_triples(model_cfg, size, AGREEMENT_TIMESTEPS, eval_seed)
    eps = predict_eps(model_cfg, run_config("baseline"), device, state, x_t, mask, t)
    eval_loss = float((eps - noise.double()).abs().mean())
    rows = [{"config": config, "seed": seed, "size": size, "kind": "train", "step": k + 1, "loss": v}
            for k, v in enumerate(train)]
    rows.append({"config": config, "seed": seed, "size": size, "kind": "eval", "step": steps, "loss": eval_loss})
    return pd.DataFrame(rows)


# ---- training parity on real data (issue "quality parity", §2) -------------------------------

def training_parity(pairs: Sequence[Pair], model_cfg: ModelConfig, config: str, size: tuple[int, int, int],
                    device: torch.device, steps: int = 1000, seed: int = 0, lr: float = 1e-4, held_out: int = 2,
                    eval_every: int = 100, out: str | None = None) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Train ``steps`` optimizer steps (micro-batch 1, no accumulation) under ``config`` with the
    real training loop on all but ``held_out`` subjects; every ``eval_every`` steps (and at step 0)
    the held-out loss (``held_out_loss``). Returns (train losses per step, held-out losses per
    (step, subject, t)). With ``out`` the final checkpoint is written there (for sampling)."""
    from .trainer import Trainer

    if steps < 1 or eval_every < 1:
        raise InputError(f"steps and eval_every must be >= 1, got {steps} and {eval_every}")
    train_pairs, test_pairs = split_held_out(pairs, held_out)
    dataset = VolumeDataset(train_pairs, model_cfg.name, model_cfg.out_channels, size, keep=True)
    dataset.validate()
    train_cfg = TrainConfig(lr=lr, grad_accum=1, seed=seed, log_every=eval_every, save_every=steps,
                            held_out=held_out, eval_every=eval_every)
    trainer = Trainer(dataset, model_cfg, train_cfg, run_config(config, training=True), device, out or ".", size,
                      held_out=tuple(test_pairs))
    tag = {"config": config, "seed": seed, "size": size[0]}
    evals = []
    while True:
        if trainer.step % eval_every == 0 or trainer.step == steps:
            trainer.flush()
            evals.append(trainer.evaluate(("model",)).drop(columns="weights"))
        if trainer.step == steps:
            break
        trainer.train_step()
    if out is not None:
        trainer.save()
    train = pd.DataFrame({**tag, "step": np.arange(1, steps + 1), "loss": trainer.losses})
    return train, pd.concat(evals, ignore_index=True).assign(**tag)[[*tag, "step", "subject", "t", "loss"]]
