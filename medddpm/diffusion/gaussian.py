"""Gaussian diffusion for Med-DDPM (paper §2.1): cosine schedule, q_sample, ε-prediction loss,
posterior, ancestral DDPM sampling, DDIM and the few-step solvers of ``solvers``, always
conditioned on the mask.

Equation numbers refer to Ho et al. (2020) "DDPM" and Song et al. (2021) "DDIM".
"""
from __future__ import annotations

import math
from typing import Callable, Iterator, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..core.config import DiffusionConfig
from .solvers import DEFAULT_SPACING, SOLVERS, Plan, check_sampler, denoiser_calls, make_plan

Denoiser = Callable[[Tensor, Tensor], Tensor]
Generators = torch.Generator | Sequence[torch.Generator] | None  # one for the batch, or one per volume


def randn(shape: Sequence[int], generator: Generators, device: torch.device, dtype: torch.dtype) -> Tensor:
    """N(0, I) noise of ``shape``; with one generator per volume, volume i draws from its own,
    so a volume's noise does not depend on which batch (or rank) it is sampled in."""
    if generator is None or isinstance(generator, torch.Generator):
        return torch.randn(tuple(shape), generator=generator, device=device, dtype=dtype)
    if len(generator) != shape[0]:
        raise ValueError(f"{len(generator)} generators for a batch of {shape[0]}")
    return torch.cat([torch.randn((1, *shape[1:]), generator=g, device=device, dtype=dtype) for g in generator])


def cosine_betas(timesteps: int, s: float = 0.008, max_beta: float = 0.999) -> Tensor:
    """β_t from ᾱ(t) = cos²((t/T + s)/(1 + s) · π/2) (Nichol & Dhariwal 2021, eq. 17), clipped."""
    steps = torch.arange(timesteps + 1, dtype=torch.float64) / timesteps
    alpha_bar = torch.cos((steps + s) / (1 + s) * math.pi / 2) ** 2
    betas = 1 - alpha_bar[1:] / alpha_bar[:-1]
    return betas.clamp(max=max_beta)


def _gather(values: Tensor, t: Tensor, like: Tensor) -> Tensor:
    """values[t] reshaped to broadcast over a (N, C, ...) tensor, in its dtype and device."""
    out = values.to(like.device)[t].to(like.dtype)
    return out.reshape(-1, *([1] * (like.ndim - 1)))


EpsFn = Callable[[Tensor, Tensor], Tensor]  # ε_θ(x_t, t) of one chain (the mask already bound)


def run_plan(plan: Plan, eps_fn: EpsFn, x: Tensor, abar: Sequence[float], noises: Sequence[Tensor] | Callable[[int], Tensor],
             clip: bool = True, on_step: Callable[[], object] | None = None) -> Tensor:
    """Run ``plan`` from x_T = ``x``: one denoiser call a step, then the step's linear update. The
    fresh noise is ``noises[k]`` for the k-th noisy step (or ``noises(k)`` drawn when needed). Only
    tensor operations with Python-float coefficients: no host synchronisation."""
    hist: list[Tensor] = []
    depth = max(len(s.coef_hist) for s in plan.steps)
    k = 0
    for step in plan.steps:
        a, s = math.sqrt(abar[step.t]), math.sqrt(1 - abar[step.t])
        t = torch.full((x.shape[0],), step.t, device=x.device, dtype=torch.long)
        eps = eps_fn(x, t).to(x.dtype)
        x0 = (x - s * eps) / a
        if clip:
            x0 = x0.clamp(-1, 1)
        pred = x0 if plan.predicts == "x0" else ((x - a * x0) / s if clip else eps)
        hist = [pred, *hist][:depth]
        new = x * step.coef_x if step.coef_x != 0 else None
        for w, h in zip(step.coef_hist, hist):
            new = h * w if new is None else new.add(h, alpha=w)
        assert new is not None
        if step.coef_noise != 0:
            z = noises[k] if not callable(noises) else noises(k)
            new = new.add(z, alpha=step.coef_noise)
            k += 1
        x = new
        if on_step is not None:
            on_step()
    return x


class GaussianDiffusion(nn.Module):
    """Wraps a denoiser ε_θ(cat[x_t, mask], t); the schedule lives in float64 buffers. With
    ``input_format`` (the model's memory layout) the denoiser gets its input in that layout;
    without, as the caller's tensors make it."""

    def __init__(self, model: nn.Module | Denoiser, cfg: DiffusionConfig = DiffusionConfig(),
                 input_format: torch.memory_format | None = None, compile_update: bool = False) -> None:
        super().__init__()
        self.model = model
        self.cfg = cfg
        self.input_format = input_format
        # DDPM's step x_t → x_{t−1} as one compiled kernel (Knobs.compiled_update), else ~30 eager ones
        self.update = torch.compile(self.ddpm_update, dynamic=False) if compile_update else self.ddpm_update
        betas = cosine_betas(cfg.timesteps, cfg.cosine_s, cfg.max_beta)
        alphas = 1 - betas
        abar = torch.cumprod(alphas, 0)
        abar_prev = torch.cat([torch.ones(1, dtype=torch.float64), abar[:-1]])
        var = betas * (1 - abar_prev) / (1 - abar)  # β̃_t, DDPM eq. 7
        buffers = {
            "betas": betas,
            "alphas_cumprod": abar,
            "alphas_cumprod_prev": abar_prev,
            "sqrt_abar": abar.sqrt(),
            "sqrt_one_minus_abar": (1 - abar).sqrt(),
            "sqrt_recip_abar": (1 / abar).sqrt(),
            "sqrt_recipm1_abar": (1 / abar - 1).sqrt(),
            "posterior_variance": var,
            # β̃_0 = 0: use β̃_1 in the log, as is standard
            "posterior_log_variance": torch.log(torch.cat([var[1:2], var[1:]])),
            "posterior_coef1": betas * abar_prev.sqrt() / (1 - abar),
            "posterior_coef2": (1 - abar_prev) * alphas.sqrt() / (1 - abar),
        }
        for name, value in buffers.items():
            self.register_buffer(name, value, persistent=False)
        self.abar_host = abar.tolist()  # ᾱ_t as Python floats: a solver's coefficients need no device read
        self.plans: dict[tuple[str, int, str, float], Plan] = {}
        # a solver's whole chain as one CUDA graph (engine.GraphedChain, Knobs.chain_graph), else eager
        self.chain: Callable[..., Tensor] | None = None

    @property
    def num_timesteps(self) -> int:
        return self.cfg.timesteps

    # ---- forward process -------------------------------------------------------------------
    def q_sample(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """x_t = √ᾱ_t x_0 + √(1−ᾱ_t) ε (DDPM eq. 4)."""
        return _gather(self.sqrt_abar, t, x0) * x0 + _gather(self.sqrt_one_minus_abar, t, x0) * noise

    def predict_x0(self, x_t: Tensor, t: Tensor, eps: Tensor) -> Tensor:
        return _gather(self.sqrt_recip_abar, t, x_t) * x_t - _gather(self.sqrt_recipm1_abar, t, x_t) * eps

    def q_posterior(self, x0: Tensor, x_t: Tensor, t: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Mean, variance and log-variance of q(x_{t−1} | x_t, x_0) (DDPM eqs. 6–7)."""
        mean = _gather(self.posterior_coef1, t, x_t) * x0 + _gather(self.posterior_coef2, t, x_t) * x_t
        return mean, _gather(self.posterior_variance, t, x_t), _gather(self.posterior_log_variance, t, x_t)

    def net(self, x_t: Tensor, mask: Tensor, t: Tensor) -> Tensor:
        """The network's own output on cat[x_t, mask]: ε, or v (``DiffusionConfig.prediction``)."""
        x = torch.cat([x_t, mask], dim=1)
        return self.model(x if self.input_format is None else x.contiguous(memory_format=self.input_format), t)

    def as_eps(self, out: Tensor, x_t: Tensor, t: Tensor) -> Tensor:
        """ε from the network's output: itself, or from v as ε = √ᾱ_t v + √(1−ᾱ_t) x_t
        (Salimans & Ho 2022, v = √ᾱ ε − √(1−ᾱ) x₀), so every sampler runs on either."""
        if self.cfg.prediction == "eps":
            return out
        return _gather(self.sqrt_abar, t, x_t) * out + _gather(self.sqrt_one_minus_abar, t, x_t) * x_t

    def eps(self, x_t: Tensor, mask: Tensor, t: Tensor) -> Tensor:
        """ε_θ(x_t, mask, t)."""
        return self.as_eps(self.net(x_t, mask, t), x_t, t)

    def target(self, x0: Tensor, t: Tensor, noise: Tensor) -> Tensor:
        """What the network is trained to output for x_t = q_sample(x0, t, noise): ε, or v."""
        if self.cfg.prediction == "eps":
            return noise
        return _gather(self.sqrt_abar, t, x0) * noise - _gather(self.sqrt_one_minus_abar, t, x0) * x0

    def draw_noise(self, like: Tensor, generator: torch.Generator | None = None) -> Tensor:
        """Training noise ε ~ N(0, I) in ``like``'s shape and layout, plus the offset noise
        s·ε' with one ε' per volume and channel (``DiffusionConfig.offset_noise``; Guttenberg 2023)."""
        noise = torch.randn(like.shape, generator=generator, device=like.device, dtype=like.dtype)
        if self.cfg.offset_noise:
            offset = torch.randn((*like.shape[:2], *([1] * (like.ndim - 2))), generator=generator,
                                 device=like.device, dtype=like.dtype)
            noise = noise + self.cfg.offset_noise * offset
        return noise

    def conditioned(self, mask: Tensor, channels: int, net: Denoiser | None = None) -> Callable[[Tensor, Tensor], Tensor]:
        """ε_θ(x_t, t) of one sampling chain on ``mask``: the mask is written once into the
        denoiser's input buffer, in ``input_format``, and each step copies only x_t into the
        buffer's first ``channels`` channels (no concatenation, no layout copy per step). ``net``:
        another denoiser than ``self.model`` (the un-graphed one, inside a chain's graph)."""
        buf = torch.empty((mask.shape[0], channels + mask.shape[1], *mask.shape[2:]), device=mask.device,
                          dtype=mask.dtype, memory_format=self.input_format or torch.contiguous_format)
        buf[:, channels:] = mask
        model = self.model if net is None else net

        def eps(x_t: Tensor, t: Tensor) -> Tensor:
            buf[:, :channels] = x_t
            return self.as_eps(model(buf, t), x_t, t)
        return eps

    # ---- training ---------------------------------------------------------------------------
    def loss(self, x0: Tensor, mask: Tensor, t: Tensor | None = None, noise: Tensor | None = None,
             weights: Tensor | None = None) -> Tensor:
        """‖ε − ε_θ(x_t, mask, t)‖ with t ~ U{0..T−1}: L1 in the reference (DDPM eq. 14 with L1);
        with v-prediction the same norm of v − v_θ. ``weights`` (one per timestep, ``min_snr_weights``)
        scales each volume's loss by its t's weight; None = unweighted (the reference)."""
        if t is None:
            t = torch.randint(0, self.num_timesteps, (x0.shape[0],), device=x0.device)
        if noise is None:
            noise = self.draw_noise(x0)
        pred = self.net(self.q_sample(x0, t, noise), mask, t)
        target = self.target(x0, t, noise)
        norm = F.l1_loss if self.cfg.loss == "l1" else F.mse_loss
        if weights is None:
            return norm(pred.float(), target.float())
        per_volume = norm(pred.float(), target.float(), reduction="none").flatten(1).mean(1)
        return (per_volume * weights[t]).mean()

    def min_snr_weights(self, gamma: float) -> Tensor:
        """Min-SNR-γ weights per timestep (Hang et al. 2023, eq. 6 and §3.4): min(SNR, γ)/SNR for an ε target,
        min(SNR, γ)/(SNR + 1) for v, with SNR(t) = ᾱ_t/(1 − ᾱ_t); scaled to mean 1 over t so the rate means what it
        means unweighted."""
        abar = self.alphas_cumprod.double()
        snr = abar / (1 - abar)
        w = snr.clamp(max=gamma) / (snr + 1 if self.cfg.prediction == "v" else snr)
        return (w / w.mean()).float()

    # ---- sampling ---------------------------------------------------------------------------
    def p_mean_variance(self, x_t: Tensor, t: Tensor, eps: Tensor, clip: bool = True) -> tuple[Tensor, Tensor]:
        """Mean and log-variance of p_θ(x_{t−1} | x_t) from the predicted noise ``eps`` (DDPM eqs. 6–7, 11)."""
        x0 = self.predict_x0(x_t, t, eps)
        if clip:
            x0 = x0.clamp(-1, 1)
        mean, _, log_var = self.q_posterior(x0, x_t, t)
        return mean, log_var

    def ddpm_update(self, x_t: Tensor, t: Tensor, eps: Tensor, noise: Tensor, clip: bool = True) -> Tensor:
        """x_{t−1} = μ_θ(x_t, t) + σ_t z, z = ``noise``, and no noise at t = 0 (DDPM Alg. 2, line 4)."""
        mean, log_var = self.p_mean_variance(x_t, t, eps, clip)
        return mean + (t > 0).to(mean.dtype).reshape(-1, *([1] * (mean.ndim - 1))) * (0.5 * log_var).exp() * noise

    def _check_mask(self, mask: Tensor, channels: int) -> None:
        if mask.ndim != 5:
            raise ValueError(f"mask must be (N, C, D, H, W), got shape {tuple(mask.shape)}")
        if channels < 1:
            raise ValueError(f"image channels must be >= 1, got {channels}")

    @torch.no_grad()
    def ddpm_steps(
        self, mask: Tensor, channels: int, generator: Generators = None, clip: bool = True
    ) -> Iterator[tuple[int, Tensor]]:
        """Ancestral sampling x_T → x_0 (DDPM Alg. 2), yielding (t, x_{t}) after each step."""
        self._check_mask(mask, channels)
        shape = (mask.shape[0], channels, *mask.shape[2:])
        x = randn(shape, generator, mask.device, mask.dtype)
        denoise = self.conditioned(mask, channels)
        for i in reversed(range(self.num_timesteps)):
            t = torch.full((shape[0],), i, device=mask.device, dtype=torch.long)
            eps = denoise(x, t)
            x = self.update(x, t, eps, randn(shape, generator, mask.device, mask.dtype), clip)
            yield i, x

    @torch.no_grad()
    def ddim_steps(
        self,
        mask: Tensor,
        channels: int,
        steps: int,
        eta: float = 0.0,
        generator: Generators = None,
        clip: bool = True,
    ) -> Iterator[tuple[int, Tensor]]:
        """DDIM (Song et al. 2021, eq. 12) over ``steps`` evenly spaced timesteps; η=1 ≈ DDPM."""
        self._check_mask(mask, channels)
        if not 1 <= steps <= self.num_timesteps:
            raise ValueError(f"DDIM steps must be in [1, {self.num_timesteps}], got {steps}")
        if eta < 0:
            raise ValueError(f"eta must be >= 0, got {eta}")
        seq = torch.linspace(0, self.num_timesteps - 1, steps).round().long().unique().tolist()
        shape = (mask.shape[0], channels, *mask.shape[2:])
        x = randn(shape, generator, mask.device, mask.dtype)
        abars = self.alphas_cumprod.tolist()  # host copies: no synchronisation inside the loop
        denoise = self.conditioned(mask, channels)
        for i, prev in zip(reversed(seq), reversed([-1] + seq[:-1])):
            t = torch.full((shape[0],), i, device=mask.device, dtype=torch.long)
            eps = denoise(x, t)
            x0 = self.predict_x0(x, t, eps)
            if clip:
                x0 = x0.clamp(-1, 1)
                eps = (_gather(self.sqrt_recip_abar, t, x) * x - x0) / _gather(self.sqrt_recipm1_abar, t, x)
            abar = abars[i]
            abar_prev = abars[prev] if prev >= 0 else 1.0
            sigma = eta * math.sqrt((1 - abar_prev) / (1 - abar) * (1 - abar / abar_prev))
            dir_coef = math.sqrt(max(1 - abar_prev - sigma**2, 0.0))
            x = math.sqrt(abar_prev) * x0 + dir_coef * eps
            if sigma > 0:  # η = 0 is deterministic: no noise drawn
                x = x + sigma * randn(shape, generator, mask.device, mask.dtype)
            yield i, x

    def plan(self, sampler: str, steps: int, spacing: str, eta: float = 1.0) -> Plan:
        """The few-step ``sampler``'s chain on this schedule (``solvers.make_plan``), made once."""
        key = (sampler, steps, spacing, eta)
        if key not in self.plans:
            self.plans[key] = make_plan(self.abar_host, sampler, steps, spacing, eta)
        return self.plans[key]

    @torch.no_grad()
    def solve(self, mask: Tensor, channels: int, sampler: str, steps: int, spacing: str,
              generator: Generators = None, clip: bool = True, on_step: Callable[[], object] | None = None,
              eta: float = 1.0) -> Tensor:
        """A few-step solver's chain (``solvers``) from x_T drawn from ``generator``; the SDE
        solvers' fresh noise (scaled by ``eta``) comes from the same generator(s), in step order. With
        ``self.chain`` the whole chain replays as one CUDA graph, its noise drawn first (the same numbers)."""
        self._check_mask(mask, channels)
        plan = self.plan(sampler, steps, spacing, eta)
        shape = (mask.shape[0], channels, *mask.shape[2:])
        x = randn(shape, generator, mask.device, mask.dtype)
        if self.chain is None:
            return run_plan(plan, self.conditioned(mask, channels), x, self.abar_host,
                            lambda _: randn(shape, generator, mask.device, mask.dtype), clip, on_step)
        noises = [randn(shape, generator, mask.device, mask.dtype) for _ in range(plan.noises)]
        out = self.chain(plan, mask, channels, x, noises, clip)
        for _ in plan.steps if on_step is not None else ():
            on_step()
        return out

    def sample(
        self,
        mask: Tensor,
        channels: int,
        sampler: str = "ddpm",
        steps: int | None = None,
        eta: float | None = None,
        generator: Generators = None,
        clip: bool = True,
        on_step: Callable[[], object] | None = None,
        spacing: str | None = None,
    ) -> Tensor:
        """Generate images for ``mask`` (N, mask_channels, ...) in [-1, 1] with ``sampler`` (one of
        ``solvers.SAMPLERS``); ``on_step()`` is called after every denoising step (a progress bar).
        ``steps`` and ``spacing`` apply to the few-step solvers (default ``solvers.DEFAULT_STEPS``
        and ``DEFAULT_SPACING``); DDIM takes ``steps`` (default all T) uniformly in time; ``eta``
        scales the noise of DDIM (default 0) and of the SDE solvers (default 1; ``solvers.takes_eta``),
        and may only be 1 for the others."""
        eta = (0.0 if sampler == "ddim" else 1.0) if eta is None else eta
        check_sampler(sampler, steps, spacing, self.num_timesteps, eta)
        n = denoiser_calls(sampler, steps, self.num_timesteps)
        if sampler in SOLVERS:
            return self.solve(mask, channels, sampler, n, spacing or DEFAULT_SPACING, generator, clip, on_step, eta)
        if sampler == "ddpm":
            it = self.ddpm_steps(mask, channels, generator, clip)
        else:
            it = self.ddim_steps(mask, channels, n, eta, generator, clip)
        x = None
        for _, x in it:
            if on_step is not None:
                on_step()
        assert x is not None
        return x
