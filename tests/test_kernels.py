"""The Triton kernels of medddpm/kernels.py against their PyTorch references (on a CPU through
Triton's interpreter, which conftest turns on; on a GPU compiled)."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from medddpm import kernels
from medddpm.config import MODEL_PRESETS, Knobs, run_config
from medddpm.model import UNet3D

needs_triton = pytest.mark.skipif(kernels.triton is None or not (torch.cuda.is_available() or kernels.INTERPRET),
                                  reason="Triton (or its interpreter) is not available")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
NDHWC = torch.channels_last_3d


def _inputs(n, c, spatial, dtype, add, seed=0, loc=0.0, spread=1.0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(n, c, *spatial, generator=g) * spread + loc).to(DEVICE, dtype)
    x = x.movedim(1, -1).contiguous().movedim(-1, 1).requires_grad_(True)  # channels-last for any rank
    w = (1 + 0.5 * torch.randn(c, generator=g)).to(DEVICE).requires_grad_(True)
    b = (0.3 * torch.randn(c, generator=g)).to(DEVICE).requires_grad_(True)
    a = (torch.randn(n, c, generator=g)).to(DEVICE, dtype).requires_grad_(True) if add else None
    return x, w, b, a


def _grads(out, inputs, g):
    return torch.autograd.grad(out, [t for t in inputs if t is not None], g)


@needs_triton
@pytest.mark.parametrize("n,c,groups,spatial,silu,add", [
    (1, 64, 32, (8, 8, 8), True, False),     # the model's 64-channel norm, several row chunks
    (2, 48, 4, (5, 3, 7), True, True),       # odd volume: a partial last tile; the time-embedding addend
    (1, 192, 32, (4, 4, 4), False, False),   # 192 channels (not a power of two), no SiLU (attention's norm)
    (2, 40, 8, (6, 6, 6), True, True),
    (1, 64, 32, (300,), False, False),       # a (N, C, T) view, as the attention's non-sdpa path passes
])
def test_group_norm_silu_kernels_match_the_reference(n, c, groups, spatial, silu, add):
    x, w, b, a = _inputs(n, c, spatial, torch.float32, add, loc=2.0, spread=3.0)
    assert kernels.runs_on(x)
    out = kernels.group_norm_silu(x, groups, w, b, 1e-5, silu, a)
    ref = kernels.reference_group_norm_silu(x, groups, w, b, 1e-5, silu, a)
    assert out.stride() == x.stride() and out.dtype == x.dtype
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    for got, want in zip(_grads(out, (x, w, b, a), g), _grads(ref, (x, w, b, a), g)):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())


@needs_triton
def test_group_norm_silu_kernels_in_bf16_round_once():
    """bf16 in and out, fp32 inside: within one bf16 unit in the last place of the fp32 reference
    (a GPU rounds to nearest, half a unit; Triton's CPU interpreter truncates, a whole unit)."""
    x, w, b, a = _inputs(2, 64, (6, 6, 6), torch.bfloat16, add=True)
    out = kernels.group_norm_silu(x, 32, w, b, 1e-5, True, a)
    exact = kernels.reference_group_norm_silu(x.float(), 32, w, b, 1e-5, True, a.float())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), exact, rtol=2 ** -7, atol=1e-3)


@needs_triton
def test_group_norm_statistics_survive_a_large_mean():
    """Partial sums are shifted by each chunk's first row: a mean of 10⁴ and a spread of 10⁻¹ still
    normalise to unit variance (plain fp32 Σx² − (Σx)²/n would lose every digit)."""
    x, w, b, _ = _inputs(1, 8, (16, 16, 16), torch.float32, add=False, loc=1e4, spread=0.1)
    with torch.no_grad():
        out = kernels.group_norm_silu(x, 2, torch.ones_like(w), torch.zeros_like(b), 1e-5, False)
    per_group = out.float().reshape(1, 2, -1)
    torch.testing.assert_close(per_group.std(dim=-1, unbiased=False), torch.ones(1, 2, device=DEVICE), atol=2e-3, rtol=0)


@needs_triton
def test_group_norm_silu_kernels_are_deterministic():
    x, w, b, a = _inputs(2, 64, (8, 8, 8), torch.bfloat16, add=True)
    runs = []
    for _ in range(2):
        out = kernels.group_norm_silu(x, 32, w, b, 1e-5, True, a)
        runs.append((out, *_grads(out, (x, w, b, a), torch.ones_like(out))))
    assert all(torch.equal(p, q) for p, q in zip(*runs))


@needs_triton
def test_group_norm_silu_op_registration_is_consistent():
    """torch.library's checks of the custom op: fake (meta) shapes and strides, autograd, schema."""
    x, w, b, a = _inputs(1, 16, (4, 4, 4), torch.float32, add=True)
    torch.library.opcheck(torch.ops.medddpm.group_norm_silu.default, (x, w, b, a, 4, 1e-5, True))
    torch.library.opcheck(torch.ops.medddpm.group_norm_silu.default, (x, w, b, None, 4, 1e-5, False))


def test_other_layouts_and_devices_take_the_reference():
    x = torch.randn(1, 8, 3, 3, 3)  # NCDHW: not the kernels' layout
    assert not kernels.runs_on(x)
    w, b = torch.ones(8), torch.zeros(8)
    ref = F.silu(F.group_norm(x, 4, w, b))
    torch.testing.assert_close(kernels.group_norm_silu(x, 4, w, b), ref, rtol=1e-5, atol=1e-5)


def test_reference_adds_before_normalising():
    x = torch.randn(2, 8, 3, 4, 5).contiguous(memory_format=NDHWC)
    a = torch.randn(2, 8)
    w, b = torch.rand(8) + 0.5, torch.randn(8)
    want = F.silu(nn.functional.group_norm(x + a[:, :, None, None, None], 4, w, b))
    torch.testing.assert_close(kernels.reference_group_norm_silu(x, 4, w, b, 1e-5, True, a), want,
                               rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("bad,needle", [
    (dict(groups=3), "do not split into 3 groups"),
    (dict(add=torch.zeros(2, 8)), r"add must be \(N, C\)"),
])
def test_group_norm_silu_refuses_bad_arguments(bad, needle):
    args = dict(x=torch.randn(1, 8, 2, 2, 2).contiguous(memory_format=NDHWC), groups=4, weight=torch.ones(8),
                bias=torch.zeros(8), add=None)
    args.update(bad)
    with pytest.raises(ValueError, match=needle):
        kernels.group_norm_silu(args["x"], args["groups"], args["weight"], args["bias"], add=args["add"])


def test_triton_norm_needs_the_fused_ndhwc_path():
    with pytest.raises(ValueError, match="fused_ops"):
        Knobs(triton_norm=True)
    assert run_config("fast-tnorm").triton_norm and run_config("fast-tnorm").fused_ops


@needs_triton
def test_model_with_triton_norm_matches_the_fused_model():
    """Same parameters, same ε and gradients as the fused (Inductor-path) model: the kernels change
    no maths (the embedding add moves into the norm, in fp32)."""
    from medddpm.runtime import preserved_backend_flags, set_tf32

    cfg = MODEL_PRESETS["tiny"]
    torch.manual_seed(0)
    with preserved_backend_flags():
        set_tf32(False)  # a GPU's TF32 convolutions would differ by more than the norms do
        _compare_models(cfg)


def _compare_models(cfg):
    ref = UNet3D(cfg, checkpoint_attention=False, fused_ops=True, sdpa=True).to(DEVICE, memory_format=NDHWC)
    with torch.no_grad():
        for p in ref.parameters():  # zero-initialised output layers would hide differences
            p.add_(0.05 * torch.randn_like(p))
    fast = UNet3D(cfg, checkpoint_attention=False, fused_ops=True, sdpa=True, triton_norm=True)
    fast.load_state_dict(ref.state_dict())
    fast = fast.to(DEVICE, memory_format=NDHWC)
    assert sum(isinstance(m, nn.GroupNorm) and m.triton for m in fast.modules()) > 0
    x = torch.randn(2, cfg.in_channels, 16, 16, 16, device=DEVICE).contiguous(memory_format=NDHWC)
    t = torch.tensor([3, 120], device=DEVICE)
    out_ref, out_fast = ref(x, t), fast(x, t)
    torch.testing.assert_close(out_fast, out_ref, rtol=1e-4, atol=1e-4)
    out_ref.square().sum().backward()
    out_fast.square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-3, atol=1e-4 * a.grad.abs().max().item(), msg=name)
