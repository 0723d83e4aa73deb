import math

import pytest
import torch

from medddpm.core.config import DiffusionConfig
from medddpm.diffusion.gaussian import GaussianDiffusion, cosine_betas


class Oracle(torch.nn.Module):
    """A 'denoiser' that returns a fixed noise tensor (lets us check the algebra exactly)."""

    def __init__(self, eps):
        super().__init__()
        self.eps = eps
        self.calls = 0

    def forward(self, x, t):
        self.calls += 1
        return self.eps.expand(x.shape[0], *self.eps.shape[1:])


def test_cosine_schedule():
    betas = cosine_betas(250)
    assert betas.shape == (250,)
    assert (betas > 0).all() and (betas <= 0.999).all()
    abar = torch.cumprod(1 - betas, 0)
    assert (abar[1:] < abar[:-1]).all()
    f = lambda t: math.cos((t / 250 + 0.008) / 1.008 * math.pi / 2) ** 2  # noqa: E731
    assert abar[0].item() == pytest.approx(f(1) / f(0), rel=1e-9)
    assert cosine_betas(10, max_beta=0.5).max() == 0.5


def test_q_sample_and_x0_roundtrip():
    d = GaussianDiffusion(Oracle(torch.zeros(1, 1, 4, 4, 4)))
    x0 = torch.rand(2, 1, 4, 4, 4) * 2 - 1
    eps = torch.randn_like(x0)
    t = torch.tensor([0, 249])
    xt = d.q_sample(x0, t, eps)
    torch.testing.assert_close(d.predict_x0(xt, t, eps), x0, rtol=1e-2, atol=2e-3)  # fp32 at t=249


def test_posterior_mean_of_known_x0_is_between():
    d = GaussianDiffusion(Oracle(torch.zeros(1, 1, 2, 2, 2)))
    x0, xt = torch.ones(1, 1, 2, 2, 2), torch.zeros(1, 1, 2, 2, 2)
    t = torch.tensor([100])
    mean, var, logvar = d.q_posterior(x0, xt, t)
    c1 = d.posterior_coef1[100].item()
    assert mean.flatten()[0].item() == pytest.approx(c1, rel=1e-6)
    assert var.flatten()[0].item() == pytest.approx(math.exp(logvar.flatten()[0].item()), rel=1e-5)
    # at t = 0 the posterior collapses onto x0
    mean0, var0, _ = d.q_posterior(x0, xt, torch.tensor([0]))
    torch.testing.assert_close(mean0, x0)
    assert var0.abs().max() == 0


def test_l1_loss_is_mean_abs_error():
    target_eps = torch.full((1, 1, 4, 4, 4), 0.5)
    d = GaussianDiffusion(Oracle(target_eps))
    x0, mask = torch.zeros(1, 1, 4, 4, 4), torch.zeros(1, 2, 4, 4, 4)
    noise = torch.zeros_like(x0)
    assert d.loss(x0, mask, torch.tensor([5]), noise).item() == pytest.approx(0.5)
    l2 = GaussianDiffusion(Oracle(target_eps), DiffusionConfig(loss="l2"))
    assert l2.loss(x0, mask, torch.tensor([5]), noise).item() == pytest.approx(0.25)


def test_model_sees_noisy_image_then_mask():
    seen = {}

    def model(x, t):
        seen["x"] = x
        return torch.zeros_like(x[:, :1])

    d = GaussianDiffusion(model)
    x0 = torch.zeros(1, 1, 2, 2, 2)
    mask = torch.full((1, 2, 2, 2, 2), 7.0)
    d.loss(x0, mask, torch.tensor([0]), torch.zeros_like(x0))
    assert seen["x"].shape[1] == 3 and (seen["x"][:, 1:] == 7).all() and (seen["x"][:, :1] == 0).all()


@pytest.mark.parametrize("sampler,steps,calls", [("ddpm", None, 250), ("ddim", 10, 10), ("ddim", 1, 1)])
def test_samplers_run_the_right_number_of_steps(sampler, steps, calls):
    oracle = Oracle(torch.zeros(1, 1, 4, 4, 4))
    d = GaussianDiffusion(oracle)
    g = torch.Generator().manual_seed(0)
    x = d.sample(torch.zeros(1, 2, 4, 4, 4), 1, sampler, steps, generator=g)
    assert oracle.calls == calls
    assert x.shape == (1, 1, 4, 4, 4) and torch.isfinite(x).all()


def test_ddim_is_seeded_and_clipped():
    d = GaussianDiffusion(Oracle(torch.full((1, 1, 4, 4, 4), 0.3)))
    mask = torch.zeros(1, 2, 4, 4, 4)
    run = lambda seed, eta=0.0: d.sample(mask, 1, "ddim", 5, eta, torch.Generator().manual_seed(seed))  # noqa: E731
    torch.testing.assert_close(run(3), run(3))
    assert not torch.equal(run(3), run(4))
    assert not torch.equal(run(3), run(3, eta=1.0))
    assert run(3).abs().max() <= 1.0 + 1e-5  # last step returns the clipped x0 estimate


def test_sampler_options_are_validated():
    d = GaussianDiffusion(Oracle(torch.zeros(1, 1, 2, 2, 2)))
    mask = torch.zeros(1, 2, 2, 2, 2)
    with pytest.raises(ValueError, match="ddpm sampler runs all 250"):
        d.sample(mask, 1, "ddpm", 10)
    with pytest.raises(ValueError, match=r"steps must be in \[1, 250\]"):
        d.sample(mask, 1, "ddim", 0)
    with pytest.raises(ValueError, match="unknown sampler"):
        d.sample(mask, 1, "euler")
    with pytest.raises(ValueError, match="timesteps must be"):
        DiffusionConfig(timesteps=0)


class GaussianOracle(torch.nn.Module):
    """The optimal ε predictor when every voxel of x₀ is N(μ, σ²) (paper §2.1's denoiser, exactly):
    x_t ~ N(√ᾱ μ, ᾱσ² + 1 − ᾱ), so E[ε | x_t] = √(1 − ᾱ) (x_t − √ᾱ μ) / (ᾱσ² + 1 − ᾱ)."""

    def __init__(self, alphas_cumprod, mu, sigma):
        super().__init__()
        self.abar, self.mu, self.sigma = alphas_cumprod, mu, sigma

    def forward(self, x_and_mask, t):
        x = x_and_mask[:, :1]
        a = self.abar[t].to(x.dtype).reshape(-1, 1, 1, 1, 1)
        return (1 - a).sqrt() * (x - a.sqrt() * self.mu) / (a * self.sigma**2 + 1 - a)


def _linear_prediction(sampler, steps, eta, mu, sigma, T=250):
    """Mean and standard deviation of x₀ that a sampler must produce with ``GaussianOracle``: every
    step is then affine in x_t (x_t ← A x_t + B + s·z), so mean and variance follow in closed form
    from DDPM eqs. 6–7 and DDIM eq. 12, re-derived here in NumPy from the schedule alone."""
    import numpy as np

    b = cosine_betas(T).numpy()
    ab = np.cumprod(1 - b)
    abp = np.concatenate([[1.0], ab[:-1]])

    def x0_hat(a):  # E[x₀ | x_t] = p·x_t + q
        k = np.sqrt(1 - a) / (a * sigma**2 + 1 - a)
        return (1 - np.sqrt(1 - a) * k) / np.sqrt(a), k * np.sqrt(1 - a) * mu

    m, v = 0.0, 1.0  # x_T ~ N(0, 1)
    if sampler == "ddpm":
        for i in reversed(range(T)):
            p, q = x0_hat(ab[i])
            c1, c2 = b[i] * np.sqrt(abp[i]) / (1 - ab[i]), (1 - abp[i]) * np.sqrt(1 - b[i]) / (1 - ab[i])
            var = b[i] * (1 - abp[i]) / (1 - ab[i]) if i > 0 else 0.0
            m, v = (c1 * p + c2) * m + c1 * q, (c1 * p + c2) ** 2 * v + var
        return m, np.sqrt(v)
    seq = sorted(set(np.round(np.linspace(0, T - 1, steps)).astype(int).tolist()))
    for i, prev in zip(reversed(seq), reversed([-1] + seq[:-1])):
        a, ap = ab[i], ab[prev] if prev >= 0 else 1.0
        p, q = x0_hat(a)
        ep, eq = (1 - np.sqrt(a) * p) / np.sqrt(1 - a), -np.sqrt(a) * q / np.sqrt(1 - a)  # ε̂ from x̂₀
        s2 = eta**2 * (1 - ap) / (1 - a) * (1 - a / ap)
        d = np.sqrt(max(1 - ap - s2, 0.0))
        A, B = np.sqrt(ap) * p + d * ep, np.sqrt(ap) * q + d * eq
        m, v = A * m + B, A**2 * v + s2
    return m, np.sqrt(v)


SAMPLERS = [("ddpm", None, 1.0), ("ddim", 250, 1.0), ("ddim", 250, 0.0), ("ddim", 50, 0.0), ("ddim", 50, 1.0),
            ("ddim", 10, 0.0)]


@pytest.mark.parametrize("sampler,steps,eta", SAMPLERS)
def test_samplers_with_the_exact_denoiser_draw_what_their_equations_predict(sampler, steps, eta):
    """Gaussian data N(μ, σ²) and its exact denoiser: the sampled mean and standard deviation of 10⁵
    independent voxels match the closed-form prediction of the sampler's own equations within
    five standard errors (the code is the maths), and the fine samplers (DDPM, DDIM with all 250
    steps) reproduce the data distribution itself within 3 % of σ."""
    mu, sigma = 0.2, 0.25
    d = GaussianDiffusion(torch.nn.Identity())
    d.model = GaussianOracle(d.alphas_cumprod, mu, sigma)
    mask = torch.zeros(100, 2, 10, 10, 10, dtype=torch.float64)
    x = d.sample(mask, 1, sampler, steps, eta, generator=torch.Generator().manual_seed(0), clip=False)
    n = x.numel()
    m, s = _linear_prediction(sampler, steps or 250, eta, mu, sigma)
    assert abs(x.mean().item() - m) < 5 * s / math.sqrt(n)
    assert abs(x.std().item() - s) < 5 * s / math.sqrt(2 * n)
    assert abs(m - mu) < 1e-4
    if steps in (None, 250):
        assert abs(s - sigma) < 0.03 * sigma


def test_fewer_ddim_steps_shrink_the_spread():
    """DDIM's deterministic steps are a first-order discretisation: with the exact denoiser the
    spread of Gaussian data shrinks as the steps get fewer (a fact of the sampler, not of a model)."""
    spread = [_linear_prediction("ddim", k, 0.0, 0.2, 0.25)[1] for k in (250, 50, 10)]
    assert spread[0] > spread[1] > spread[2] and spread[2] < 0.8 * 0.25


def test_ddpm_update_is_algorithm_2_line_4():
    """x_{t−1} = 1/√α_t (x_t − β_t/√(1−ᾱ_t) ε) + σ_t z with σ_t² = β̃_t, no noise at t = 0 (no clip:
    the posterior mean of x̂_0 is the same line in DDPM's eq. 11 form)."""
    d = GaussianDiffusion(Oracle(torch.zeros(1, 1, 2, 2, 2))).double()
    g = torch.Generator().manual_seed(0)
    x, eps, z = (torch.randn(2, 1, 2, 2, 2, generator=g, dtype=torch.float64) for _ in range(3))
    t = torch.tensor([0, 137])
    got = d.ddpm_update(x, t, eps, z, clip=False)
    for k, s in enumerate(t.tolist()):
        beta, abar = d.betas[s], d.alphas_cumprod[s]
        mean = (x[k] - beta / (1 - abar).sqrt() * eps[k]) / (1 - beta).sqrt()
        want = mean + (s > 0) * d.posterior_variance[s].sqrt() * z[k]
        torch.testing.assert_close(got[k], want, rtol=1e-10, atol=1e-10)


@pytest.mark.skipif(not torch.cuda.is_available(), reason="Inductor's kernels of the update are checked on a GPU")
def test_compiled_ddpm_update_draws_the_same_chain():
    """compile_update: the sampler's update through one compiled kernel gives the eager chain's
    samples (fp32, within rounding) for the same generator."""
    eps = torch.randn(1, 1, 8, 8, 8, device="cuda")
    mask = torch.zeros(2, 2, 8, 8, 8, device="cuda")
    runs = [GaussianDiffusion(Oracle(eps), compile_update=c).cuda().sample(
        mask, 1, "ddpm", generator=torch.Generator("cuda").manual_seed(1)) for c in (False, True)]
    torch.testing.assert_close(runs[1], runs[0], rtol=1e-5, atol=1e-5)


def test_v_prediction_trains_on_v_and_samples_through_its_eps():
    """v = √ᾱ ε − √(1−ᾱ) x₀ (Salimans & Ho 2022): a network that outputs the true v has zero loss,
    and ``eps`` turns its v back into the true ε, so every sampler runs on it unchanged."""
    g = torch.Generator().manual_seed(0)
    x0, eps = torch.rand(2, 1, 4, 4, 4, generator=g, dtype=torch.float64) * 2 - 1, torch.randn(2, 1, 4, 4, 4, generator=g, dtype=torch.float64)
    t = torch.tensor([3, 249])
    cfg = DiffusionConfig(prediction="v")
    probe = GaussianDiffusion(lambda x, s: x, cfg)
    v = probe.target(x0, t, eps)
    assert torch.allclose(v, probe.sqrt_abar[t].view(-1, 1, 1, 1, 1) * eps
                          - probe.sqrt_one_minus_abar[t].view(-1, 1, 1, 1, 1) * x0)
    truth = GaussianDiffusion(Oracle(v), cfg)
    x_t = truth.q_sample(x0, t, eps)
    mask = torch.zeros(2, 2, 4, 4, 4, dtype=torch.float64)
    assert truth.loss(x0, mask, t, eps).item() < 1e-12
    assert torch.allclose(truth.eps(x_t, mask, t), eps, atol=1e-9)
    assert torch.allclose(truth.predict_x0(x_t, t, truth.eps(x_t, mask, t)), x0, atol=1e-6)
    # ε-prediction keeps the reference: target and network output are the noise itself
    assert torch.equal(GaussianDiffusion(Oracle(eps), DiffusionConfig()).target(x0, t, eps), eps)
    with pytest.raises(ValueError, match="prediction"):
        DiffusionConfig(prediction="x0")


def test_offset_noise_adds_one_shift_per_volume_and_zero_keeps_the_reference_draw():
    like = torch.zeros(3, 1, 8, 8, 8)
    plain = GaussianDiffusion(lambda x, s: x, DiffusionConfig())
    base = plain.draw_noise(like, torch.Generator().manual_seed(7))
    assert torch.equal(base, torch.randn(like.shape, generator=torch.Generator().manual_seed(7)))
    shifted = GaussianDiffusion(lambda x, s: x, DiffusionConfig(offset_noise=0.5)).draw_noise(
        like, torch.Generator().manual_seed(7))
    diff = shifted - base  # the same i.i.d. draw first, then one number per volume and channel
    assert torch.allclose(diff, diff[:, :, :1, :1, :1].expand_as(diff)) and diff.abs().max() > 0
    with pytest.raises(ValueError, match="offset_noise"):
        DiffusionConfig(offset_noise=-0.1)
