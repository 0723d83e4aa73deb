import math

import pytest
import torch

from medddpm.config import DiffusionConfig
from medddpm.diffusion import GaussianDiffusion, cosine_betas


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
    with pytest.raises(ValueError, match=r"DDIM steps must be in \[1, 250\]"):
        d.sample(mask, 1, "ddim", 0)
    with pytest.raises(ValueError, match="sampler must be"):
        d.sample(mask, 1, "euler")
    with pytest.raises(ValueError, match="timesteps must be"):
        DiffusionConfig(timesteps=0)
