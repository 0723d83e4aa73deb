"""Few-step solvers (medddpm/diffusion/solvers.py) against an exact denoiser and against DDIM."""
import dataclasses
import math

import numpy as np
import pytest
import torch

from medddpm.diffusion.gaussian import GaussianDiffusion
from test_diffusion import GaussianOracle
from medddpm.diffusion.solvers import (SOLVERS, SPACINGS, _interpolation_weights, _moments, check_sampler, log_snr, make_plan,
                             timesteps)

MU, SD = 0.2, 0.3  # the Gaussian data: x₀ ~ N(MU, SD²) per voxel


def exact_diffusion() -> GaussianDiffusion:
    """The diffusion with the exact ε of x₀ ~ N(MU, SD²) as its denoiser."""
    d = GaussianDiffusion(torch.nn.Identity())
    d.model = GaussianOracle(d.alphas_cumprod, MU, SD)
    return d


def spread(sampler, steps, spacing, clip=False, voxels=(4, 2, 24, 24, 24)):
    """(mean, std / SD) of samples from the exact denoiser, float64."""
    d = exact_diffusion()
    x = d.sample(torch.zeros(voxels, dtype=torch.float64), 1, sampler, steps, None,
                 torch.Generator().manual_seed(0), clip=clip, spacing=spacing)
    return x.mean().item(), x.std().item() / SD


# Tolerances on the spread (std / SD − 1) at log-SNR spacing. Measured on this exact denoiser
# (CPU, float64, 4 × 24³ voxels, seed 0): dpm2m 2.1 % / 1.7 %, dpm2m-sde 2.3 % / 2.9 %, dpm3m 19 % / 0.5 %,
# dpm3m-sde 62 % / 2.6 %, ipndm 1.6 % / 1.0 % at 10 / 20 steps: the third-order extrapolation is unstable
# across the schedule's uneven λ steps at 10, so its tolerance there only bounds it.
# first order: far too narrow at 10 steps, half as far off at 20 (test_first_order_converges_from_below)
SPREAD_TOL = {("dpm1", 10): 0.30, ("dpm1", 20): 0.15, ("dpm1-sde", 10): 0.45, ("dpm1-sde", 20): 0.25,
              ("dpm2m", 10): 0.04, ("dpm2m", 20): 0.04, ("dpm2m-sde", 10): 0.06, ("dpm2m-sde", 20): 0.06,
              ("dpm3m", 10): 0.30, ("dpm3m", 20): 0.03, ("dpm3m-sde", 10): 0.80, ("dpm3m-sde", 20): 0.06,
              ("ipndm", 10): 0.03, ("ipndm", 20): 0.03}


@pytest.mark.parametrize("sampler", SOLVERS)
@pytest.mark.parametrize("steps", [10, 20])
def test_solvers_reproduce_a_gaussian(sampler, steps):
    """Every solver at 10 and 20 steps (log-SNR spacing) draws the data's mean and spread from the
    exact denoiser of Gaussian data, within the stated tolerances."""
    mean, ratio = spread(sampler, steps, "logsnr")
    assert mean == pytest.approx(MU, abs=0.01)
    assert abs(ratio - 1) <= SPREAD_TOL[sampler, steps]


def test_logsnr_spacing_beats_time_spacing():
    """The spacing finding: the stochastic second-order solver at 20 steps is within 5 % of the
    spread with log-SNR spacing, and far too wide (> 20 %) with steps uniform in time."""
    _, logsnr = spread("dpm2m-sde", 20, "logsnr")
    _, time = spread("dpm2m-sde", 20, "time")
    assert abs(logsnr - 1) < 0.05
    assert time - 1 > 0.2


def test_clipped_solver_keeps_in_range_data():
    """With x̂₀ clipped to [−1, 1] (the default) the Gaussian, 2.7 SD inside the range, comes out the same."""
    mean, ratio = spread("dpm2m-sde", 10, "logsnr", clip=True)
    assert mean == pytest.approx(MU, abs=0.01) and abs(ratio - 1) < 0.1


@pytest.mark.parametrize("ode,eta", [("dpm2m", 0.0), ("dpm2m-sde", 1.0)])
def test_first_order_is_ddim(ode, eta):
    """One denoiser call per solver step at order 1: the first step of the ODE solver is DDIM's
    (η = 0) and of the SDE solver DDIM's η = 1 step, in distribution: x' = a x + b x̂₀ + c z."""
    d = GaussianDiffusion(torch.nn.Identity())
    plan = make_plan(d.abar_host, ode, 10, "time")
    t, t_next = plan.steps[0].t, plan.steps[1].t
    ab, ab_next = d.abar_host[t], d.abar_host[t_next]
    sigma = eta * math.sqrt((1 - ab_next) / (1 - ab) * (1 - ab / ab_next))
    dir_coef = math.sqrt(1 - ab_next - sigma**2)
    # DDIM: x' = √ᾱ' x̂₀ + dir · (x − √ᾱ x̂₀)/√(1 − ᾱ) + σ z
    a = dir_coef / math.sqrt(1 - ab)
    b = math.sqrt(ab_next) - dir_coef * math.sqrt(ab) / math.sqrt(1 - ab)
    step = plan.steps[0]
    assert step.coef_x == pytest.approx(a, rel=1e-9)
    assert step.coef_hist[0] == pytest.approx(b, rel=1e-9)
    assert step.coef_noise == pytest.approx(sigma, rel=1e-9)


@pytest.mark.parametrize("c", [1.0, 2.0])
def test_multistep_weights_integrate_polynomials_exactly(c):
    """The order-k weights integrate c e^{−c(h−u)} P(u) over [0, h] exactly for every polynomial
    of degree < k through the nodes (checked against numerical quadrature)."""
    h, nodes = 0.7, [0.0, -0.4, -1.1]
    u = np.linspace(0, h, 200001)
    kernel = c * np.exp(-c * (h - u))
    for k in (1, 2, 3):
        w = _interpolation_weights(nodes[:k], _moments(h, c, k))
        for p in range(k):
            exact = np.trapezoid(kernel * u**p, u)
            assert sum(wj * n**p for wj, n in zip(w, nodes[:k])) == pytest.approx(exact, rel=1e-6, abs=1e-9)


@pytest.mark.parametrize("spacing", SPACINGS)
@pytest.mark.parametrize("steps", [1, 2, 10, 50, 250])
def test_timesteps_are_distinct_and_span_the_schedule(spacing, steps):
    abar = GaussianDiffusion(torch.nn.Identity()).abar_host
    ts = timesteps(abar, steps, spacing)
    assert len(ts) == steps and len(set(ts)) == steps
    assert ts == sorted(ts, reverse=True) and ts[0] == 249 and (steps == 1 or ts[-1] == 0)


def test_logsnr_spacing_is_uniform_in_lambda_where_the_grid_allows():
    """``logsnr``: after T − 1, uniform in λ over the unclipped schedule (to the nearest timestep);
    ``logsnr-full`` spans λ(T − 1) too and crowds its first steps at t ≥ 246."""
    abar = GaussianDiffusion(torch.nn.Identity()).abar_host
    lam = log_snr(abar)
    ts = timesteps(abar, 10, "logsnr")
    gaps = np.diff(lam[ts])
    assert ts[0] == 249 and (gaps > 0).all()
    uniform = (lam[0] - lam[248]) / 8
    assert np.abs(gaps[1:] - uniform).max() < 0.15 * uniform
    full = timesteps(abar, 10, "logsnr-full")
    assert sum(t >= 246 for t in full) == 4 and sum(t >= 246 for t in ts) == 3


def test_plan_counts_noise_only_for_sde_solvers():
    abar = GaussianDiffusion(torch.nn.Identity()).abar_host
    for sampler in SOLVERS:
        plan = make_plan(abar, sampler, 10, "logsnr")
        assert len(plan.steps) == 10
        assert plan.noises == (9 if sampler.endswith("-sde") else 0)
        assert plan.steps[-1].coef_noise == 0


def test_generators_make_a_volume_independent_of_its_batch():
    """Per-volume generators: a volume's few-step sample is the same alone or in a batch."""
    d = exact_diffusion()
    mask = torch.zeros(2, 2, 8, 8, 8, dtype=torch.float64)
    both = d.sample(mask, 1, "dpm2m-sde", 6, generator=[torch.Generator().manual_seed(s) for s in (3, 4)],
                    spacing="logsnr")
    alone = d.sample(mask[1:], 1, "dpm2m-sde", 6, generator=[torch.Generator().manual_seed(4)], spacing="logsnr")
    torch.testing.assert_close(both[1:], alone)


def test_bad_sampler_options_are_refused():
    with pytest.raises(ValueError, match="unknown sampler"):
        check_sampler("euler", 10, None, 250)
    with pytest.raises(ValueError, match="unknown spacing"):
        check_sampler("dpm2m", 10, "cosine", 250)
    with pytest.raises(ValueError, match=r"\[1, 250\]"):
        check_sampler("dpm2m", 0, None, 250)
    with pytest.raises(ValueError, match=r"\[1, 250\]"):
        check_sampler("ipndm", 251, None, 250)
    with pytest.raises(ValueError, match="all 250 steps"):
        check_sampler("ddpm", 10, None, 250)
    with pytest.raises(ValueError, match="takes no --spacing"):
        exact_diffusion().sample(torch.zeros(1, 2, 4, 4, 4), 1, "ddim", 5, spacing="logsnr")


class _Counting(torch.nn.Module):
    def __init__(self, inner):
        super().__init__()
        self.inner, self.calls = inner, 0

    def forward(self, x, t):
        self.calls += 1
        return self.inner(x, t)


@pytest.mark.parametrize("sampler", SOLVERS)
def test_a_chain_calls_the_denoiser_once_a_step(sampler):
    d = exact_diffusion()
    d.model = _Counting(d.model)
    d.sample(torch.zeros(1, 2, 4, 4, 4, dtype=torch.float64), 1, sampler, 7, spacing="quadratic")
    assert d.model.calls == 7


@pytest.mark.skipif(not torch.cuda.is_available(), reason="CUDA graphs need a GPU")
@pytest.mark.parametrize("sampler", ["dpm2m-sde", "ipndm"])
def test_chain_graph_replays_the_eager_chain(tiny, sampler):
    """Knobs.chain_graph: the whole chain as one CUDA graph gives the eager chain's samples for
    the same generators (the graph's noise drawn first, in the same order), on its capture and on
    replays with other masks and seeds."""
    from medddpm.core.config import run_config
    from medddpm.run.engine import autocast, inference

    cuda = torch.device("cuda")
    base = dataclasses.replace(run_config("bf16-graphs"), compile=False, cudnn_benchmark=False)
    state = inference(tiny, base, cuda)[0].state_dict()
    runs = {}
    for chain in (False, True):
        _, diff, knobs = inference(tiny, dataclasses.replace(base, chain_graph=chain), cuda, state=state)
        assert (diff.chain is not None) == chain
        outs = []
        for seed in (0, 1, 2):
            mask = (torch.rand(2, 2, 16, 16, 16, generator=torch.Generator().manual_seed(seed)) > 0.5).float().to(cuda)
            with torch.inference_mode(), autocast(knobs, cuda):
                outs.append(diff.sample(mask, 1, sampler, 8, generator=[torch.Generator(cuda).manual_seed(seed + k)
                                                                         for k in range(2)], spacing="logsnr"))
        runs[chain] = outs
    for a, b in zip(runs[False], runs[True]):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4)


def test_chain_graph_plumbing_on_cpu(monkeypatch):
    """engine.GraphedChain hands the graph a function of (mask, x_T, noise…) that computes the eager
    chain: with the capture replaced by a direct call, its samples equal the eager ones from the
    same generators, and the oldest plan is released past KEEP."""
    from medddpm.run import engine

    class Direct:
        released = []

        def __init__(self, fn, device, precompile=False, capture_after=0, marks=None):
            self.fn, self.precompile, self.capture_after, self.marks = fn, precompile, capture_after, marks

        def __call__(self, *inputs):
            return self.fn(*inputs)

        def release(self):
            Direct.released.append(self)

    monkeypatch.setattr(engine, "GraphedDenoiser", Direct)
    mask = torch.zeros(2, 2, 6, 6, 6, dtype=torch.float64)
    gens = lambda: [torch.Generator().manual_seed(s) for s in (5, 6)]  # noqa: E731
    eager = exact_diffusion().sample(mask, 1, "dpm2m-sde", 5, generator=gens(), spacing="logsnr")
    d = exact_diffusion()
    d.chain = engine.GraphedChain(d, d.model, torch.device("cpu"))
    torch.testing.assert_close(d.sample(mask, 1, "dpm2m-sde", 5, generator=gens(), spacing="logsnr"), eager)
    for steps in range(2, 2 + engine.GraphedChain.KEEP):
        d.sample(mask, 1, "ipndm", steps, spacing="time")
    assert len(d.chain.chains) == engine.GraphedChain.KEEP and len(Direct.released) == 1
    assert not any(g.precompile for g in d.chain.chains.values())  # each chain's graph takes the chain's precompile
    d.chain = engine.GraphedChain(d, d.model, torch.device("cpu"), precompile=True, capture_after=3)
    d.sample(mask, 1, "ipndm", 2, spacing="time")
    assert all(g.precompile and g.capture_after == 3 for g in d.chain.chains.values())


def test_the_first_order_sde_solver_on_every_timestep_is_ddpm():
    """``dpm1-sde`` at all T timesteps takes DDPM's ancestral step (DDPM eqs. 6-7): its coefficients are
    the posterior's, and from the same generator it draws the same samples."""
    d = exact_diffusion()
    plan = make_plan(d.abar_host, "dpm1-sde", d.num_timesteps, "time")
    assert [s.t for s in plan.steps] == list(reversed(range(d.num_timesteps)))
    for s in plan.steps[:-1]:
        assert s.coef_x == pytest.approx(d.posterior_coef2[s.t].item(), rel=1e-9, abs=1e-12)
        assert s.coef_hist[0] == pytest.approx(d.posterior_coef1[s.t].item(), rel=1e-9, abs=1e-12)
        assert s.coef_noise == pytest.approx(d.posterior_variance[s.t].sqrt().item(), rel=1e-9)
    mask = torch.zeros(2, 2, 6, 6, 6, dtype=torch.float64)
    ddpm = d.sample(mask, 1, "ddpm", generator=torch.Generator().manual_seed(5))
    sde1 = d.sample(mask, 1, "dpm1-sde", d.num_timesteps, generator=torch.Generator().manual_seed(5), spacing="time")
    torch.testing.assert_close(sde1, ddpm)


def test_eta_moves_an_sde_solver_between_the_ode_and_more_noise():
    """η (SA-Solver's τ): 0 gives the ODE solver's plan, 1 the SDE solver's, and the noise grows with η."""
    abar = GaussianDiffusion(torch.nn.Identity()).abar_host
    ode, sde0 = make_plan(abar, "dpm2m", 12, "logsnr"), make_plan(abar, "dpm2m-sde", 12, "logsnr", eta=0.0)
    for a, b in zip(ode.steps, sde0.steps):
        assert a.coef_x == pytest.approx(b.coef_x) and a.coef_hist == pytest.approx(b.coef_hist) and b.coef_noise == 0
    noise = [make_plan(abar, "dpm2m-sde", 12, "logsnr", eta=e).steps[3].coef_noise for e in (0.5, 1.0, 1.5)]
    assert noise[0] < noise[1] < noise[2]
    _, wide = spread("dpm2m-sde", 20, "logsnr")  # η = 1 keeps the data's spread (within 6 %, above) ...
    d = exact_diffusion()
    x = d.sample(torch.zeros((4, 2, 24, 24, 24), dtype=torch.float64), 1, "dpm2m-sde", 20, 1.5,
                 torch.Generator().manual_seed(0), clip=False, spacing="logsnr")
    assert abs(x.std().item() / SD - 1) < 0.1 and abs(wide - 1) < 0.06  # ... and so does η = 1.5 (the SDE is exact for any τ)


def test_eta_is_refused_where_a_sampler_has_none():
    with pytest.raises(ValueError, match="--eta applies to ddim and the stochastic solvers"):
        check_sampler("dpm2m", 10, None, 250, eta=0.5)
    with pytest.raises(ValueError, match="not to ddpm"):
        exact_diffusion().sample(torch.zeros(1, 2, 4, 4, 4), 1, "ddpm", eta=0.0)
    with pytest.raises(ValueError, match=">= 0"):
        check_sampler("dpm2m-sde", 10, None, 250, eta=-0.1)
    check_sampler("dpm1-sde", 10, "logsnr", 250, eta=1.3)  # accepted


@pytest.mark.parametrize("sampler", ["dpm1", "dpm1-sde"])
def test_first_order_converges_from_below(sampler):
    """The first-order solvers draw too narrow a spread (samples too alike), and its error falls by
    about half when the steps double: an O(1/steps) bias, as on IXI (book chapter 16)."""
    err10, err20 = (spread(sampler, n, "logsnr")[1] - 1 for n in (10, 20))
    assert err10 < err20 < 0
    assert 0.35 < err20 / err10 < 0.65


def test_the_default_sampler_is_ddpm_250_on_either_prediction_unless_one_is_given():
    from medddpm.diffusion.solvers import CANDIDATE, REFERENCE, recommended, resolve

    assert recommended("v") is REFERENCE and recommended("eps") is REFERENCE
    assert resolve(None, None, None, None, "v") == (REFERENCE, "ddpm", None, None, 1.0)
    assert resolve(None, None, None, None, "eps") == (REFERENCE, "ddpm", None, None, 1.0)
    assert resolve("dpm2m-sde", None, None, None, "v") == (None, "dpm2m-sde", None, None, 1.0)  # named: its own η
    assert resolve("dpm2m-sde", 12, "logsnr", 1.3, "v") == (None, "dpm2m-sde", 12, "logsnr", 1.3)  # given options win
    with pytest.raises(ValueError, match="prediction"):
        recommended("x0")
    assert CANDIDATE.describe() == "dpm2m-sde 12 logsnr η 1.3" and REFERENCE.describe() == "ddpm 250"
    # before the checkpoint picks (no sampler yet): only what holds for any sampler is checked
    from medddpm.diffusion.solvers import check_sampler

    check_sampler(None, None, "logsnr", eta=1.3)
    for bad in ((0, None, None), (None, "cosine", None), (None, None, -1.0)):
        with pytest.raises(ValueError):
            check_sampler(None, bad[0], bad[1], eta=bad[2])
