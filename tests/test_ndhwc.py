"""The layout-preserving operators of the fast path against PyTorch's own, forward and backward."""
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from medddpm.core.config import MODEL_PRESETS
from medddpm.net.model import UNet3D
from medddpm.net.ndhwc import group_norm_silu, is_channels_last, upsample2x

LAYOUTS = [torch.contiguous_format, torch.channels_last_3d]


def _pair(shape, layout, seed=0):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    return (x.clone().contiguous(memory_format=layout).requires_grad_(True),
            x.clone().requires_grad_(True))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("silu", [True, False])
def test_group_norm_silu_matches_groupnorm_then_silu(layout, silu):
    x, ref_x = _pair((2, 8, 3, 4, 5), layout)
    norm = nn.GroupNorm(4, 8).double()
    with torch.no_grad():
        norm.weight.uniform_(0.5, 1.5)
        norm.bias.uniform_(-0.5, 0.5)
    w = norm.weight.detach().clone().requires_grad_(True)
    b = norm.bias.detach().clone().requires_grad_(True)
    out = group_norm_silu(x, 4, w, b, norm.eps, silu)
    ref = norm(ref_x)
    ref = F.silu(ref) if silu else ref
    # fp32 statistics: the op computes in fp32 whatever the input (float64 here), so compare at fp32 precision
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    assert out.dtype == x.dtype and is_channels_last(out) == (layout == torch.channels_last_3d)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(w.grad, norm.weight.grad, rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(b.grad, norm.bias.grad, rtol=1e-4, atol=1e-4)


def test_group_norm_silu_keeps_bf16_and_uses_fp32_statistics():
    x = (torch.randn(1, 8, 4, 4, 4) * 3 + 100).to(torch.bfloat16).contiguous(memory_format=torch.channels_last_3d)
    w, b = torch.ones(8), torch.zeros(8)
    out = group_norm_silu(x, 2, w, b)
    ref = F.silu(F.group_norm(x.float(), 2, w, b)).to(torch.bfloat16)  # the reference's GroupNorm32 + SiLU
    assert out.dtype == torch.bfloat16 and is_channels_last(out)
    torch.testing.assert_close(out.float(), ref.float(), rtol=0, atol=0.02)


def test_group_norm_silu_refuses_uneven_groups():
    with pytest.raises(ValueError, match="groups"):
        group_norm_silu(torch.randn(1, 6, 2, 2, 2), 4, torch.ones(6), torch.zeros(6))


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("shape", [(2, 3, 4, 5, 6), (1, 2, 1, 3, 2)])
def test_upsample2x_matches_trilinear_interpolate(layout, shape):
    x, ref_x = _pair(shape, layout, seed=1)
    out = upsample2x(x)
    ref = F.interpolate(ref_x, scale_factor=2, mode="trilinear", align_corners=False)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    assert is_channels_last(out) == (layout == torch.channels_last_3d and out.shape[1] > 1)
    g = torch.randn_like(ref)
    out.backward(g)
    ref.backward(g)
    torch.testing.assert_close(x.grad, ref_x.grad, rtol=1e-5, atol=1e-5)


def test_upsample2x_refuses_other_ranks():
    with pytest.raises(ValueError, match="N, C, D, H, W"):
        upsample2x(torch.randn(1, 2, 4, 4))


@pytest.mark.parametrize("layout", LAYOUTS)
def test_fast_path_model_matches_reference_model(layout):
    """fused_ops + sdpa change no parameter and no result: same state dict, same ε and gradients."""
    cfg = MODEL_PRESETS["tiny"]
    torch.manual_seed(0)
    ref = UNet3D(cfg, checkpoint_attention=False).double()
    for p in ref.parameters():  # zero-initialised output layers would hide differences
        with torch.no_grad():
            p.add_(0.05 * torch.randn_like(p))
    fast = UNet3D(cfg, checkpoint_attention=False, fused_ops=True, sdpa=True).double()
    fast.load_state_dict(ref.state_dict())
    fast = fast.to(memory_format=layout)
    x = torch.randn(2, cfg.in_channels, 16, 16, 16, dtype=torch.float64)
    t = torch.tensor([3, 120])
    out_ref = ref(x, t)
    out_fast = fast(x.contiguous(memory_format=layout), t)
    torch.testing.assert_close(out_fast, out_ref, rtol=1e-5, atol=1e-5)
    out_ref.square().sum().backward()
    out_fast.square().sum().backward()
    # both norms compute in fp32, so errors are fp32 rounding: judged against each gradient's scale
    for (name, a), b in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-5 * a.grad.abs().max().item(), msg=name)
