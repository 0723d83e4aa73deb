import math

import pytest
import torch

from medddpm.core.config import model_preset, run_config
from medddpm.net.model import UNet3D
from medddpm.run.optim import (MUON_MOMENTUM, RMS_SCALE, Hybrid, Muon, make_optimizer, orthogonalize,
                               set_lr)

CPU = torch.device("cpu")


@pytest.mark.parametrize("shape", [(3, 16, 54), (54, 16), (8, 8)])
def test_orthogonalize_flattens_the_spectrum_and_keeps_the_directions(shape):
    """Newton–Schulz ≈ U Vᵀ: every singular value near 1 (0.68–1.13 for the quintic's coefficients), and the result
    points where the exact polar factor does."""
    torch.manual_seed(0)
    m = torch.randn(shape) * 5
    o = orthogonalize(m)
    s = torch.linalg.svdvals(o)
    assert o.shape == m.shape and 0.6 < s.min() and s.max() < 1.25
    u, _, vh = torch.linalg.svd(m, full_matrices=False)
    polar = u @ vh
    cos = (o * polar).sum((-2, -1)) / (o.norm(dim=(-2, -1)) * polar.norm(dim=(-2, -1)))
    assert (cos > 0.95).all()


def test_muon_step_is_nesterov_momentum_orthogonalized_at_adams_rms():
    """Two steps on a convolution kernel, plain and channels-last, against the update written out."""
    torch.manual_seed(0)
    w0, g1, g2 = torch.randn(4, 3, 3, 3, 3), torch.randn(4, 3, 3, 3, 3), torch.randn(4, 3, 3, 3, 3)
    lr, rows, cols = 0.01, 4, 81
    expected, buf = w0.clone(), torch.zeros_like(w0)
    for g in (g1, g2):
        buf = MUON_MOMENTUM * buf + g
        step = orthogonalize((g + MUON_MOMENTUM * buf).reshape(rows, cols)).view_as(w0)
        expected -= lr * RMS_SCALE * math.sqrt(max(rows, cols)) * step
    for layout in (torch.contiguous_format, torch.channels_last_3d):
        for grad_layout in (torch.contiguous_format, torch.channels_last_3d):  # a gradient in another layout too
            p = torch.nn.Parameter(w0.clone().to(memory_format=layout))
            opt = Muon([p], lr)
            for g in (g1, g2):
                p.grad = g.clone().to(memory_format=grad_layout)
                opt.step()
            torch.testing.assert_close(p.detach(), expected)
    # the update's RMS is Adam's order (≈ lr·0.2·sqrt(max)/sqrt(min)·…), not the gradient's
    assert (expected - w0).pow(2).mean().sqrt() < 10 * lr


def test_muon_takes_the_hidden_matrices_and_adam_the_rest():
    model = UNet3D(model_preset("tiny"))
    opt = make_optimizer(model, 1e-3, run_config("baseline"), CPU, kind="muon")
    assert isinstance(opt, Hybrid)
    muon = {id(p) for g in opt.parts["muon"].param_groups for p in g["params"]}
    adam = {id(p) for g in opt.parts["adam"].param_groups for p in g["params"]}
    assert not muon & adam and muon | adam == {id(p) for p in model.parameters()}
    assert all(p.ndim >= 2 for p in model.parameters() if id(p) in muon)
    ends = [*model.input_blocks[0].parameters(), *model.out.parameters()]
    assert any(p.ndim >= 2 for p in ends) and not {id(p) for p in ends} & muon
    set_lr(opt, 5e-4)
    assert all(g["lr"] == 5e-4 for g in opt.param_groups)
    with pytest.raises(ValueError, match="optimizer must be one of"):
        make_optimizer(model, 1e-3, run_config("baseline"), CPU, kind="sgd")


def test_a_hybrid_state_round_trips_and_refuses_another_optimizers():
    torch.manual_seed(0)
    model = UNet3D(model_preset("tiny"))
    opt = make_optimizer(model, 1e-3, run_config("baseline"), CPU, kind="muon")
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    opt.step()
    state = opt.state_dict()
    twin = make_optimizer(UNet3D(model_preset("tiny")), 1e-3, run_config("baseline"), CPU, kind="muon")
    twin.load_state_dict(state)
    a, b = state["muon"]["state"], twin.state_dict()["muon"]["state"]
    assert a.keys() == b.keys() and all(torch.equal(a[k]["momentum"], b[k]["momentum"]) for k in a)
    with pytest.raises(ValueError, match="optimizer state"):
        twin.load_state_dict(make_optimizer(model, 1e-3, run_config("baseline"), CPU).state_dict())


def test_orthogonalize_is_the_textbook_newton_schulz_iteration():
    """The batched, folded iteration against X ← aX + (b·XXᵀ + c·(XXᵀ)²)·X written out, matrix by matrix."""
    from medddpm.run.optim import NS_COEFFICIENTS

    torch.manual_seed(1)
    m = torch.randn(4, 12, 40)
    a, b, c = NS_COEFFICIENTS
    for k in range(4):
        x = m[k] / (m[k].norm() + 1e-7)
        for _ in range(5):
            s = x @ x.T
            x = a * x + (b * s + c * s @ s) @ x
        torch.testing.assert_close(orthogonalize(m)[k], x, atol=1e-5, rtol=1e-4)
        torch.testing.assert_close(orthogonalize(m.mT)[k], x.T, atol=1e-5, rtol=1e-4)
