"""net/residual.py: a ResBlock's output (convolution + bias + skip term + its bias) in one Triton
kernel against its PyTorch reference (on a CPU through Triton's interpreter, which conftest turns
on; on a GPU compiled), and the model with ``fused_residual`` against the model without."""
import pytest
import torch

from medddpm.core.config import MODEL_PRESETS, Knobs, run_config
from medddpm.net import kernels, residual
from medddpm.net.model import UNet3D

needs_triton = pytest.mark.skipif(kernels.triton is None or not (torch.cuda.is_available() or kernels.INTERPRET),
                                  reason="Triton (or its interpreter) is not available")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
NDHWC = torch.channels_last_3d


@pytest.fixture
def launched(monkeypatch) -> list:
    """Every kernel launched through ``kernels._launch`` from now on (each still runs)."""
    kernels_seen: list = []
    real = kernels._launch
    monkeypatch.setattr(kernels, "_launch", lambda *a, **k: (kernels_seen.append(a[0]), real(*a, **k)))
    return kernels_seen


def _tensors(c: int, dtype: torch.dtype, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    h, s = (torch.randn(2, c, 3, 4, 5, generator=g).to(DEVICE, dtype).contiguous(memory_format=NDHWC) for _ in "hs")
    b, sb = (torch.randn(c, generator=g).to(DEVICE, dtype) for _ in "bs")
    return h, b, s, sb


@needs_triton
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("biases", ["both", "conv", "none"])
def test_the_kernel_writes_the_reference_into_h(monkeypatch, launched, dtype, biases):
    """The same fp32 sums in the same order, rounded once, over several programs and a channel count
    that is no power of two; the output is h itself. Bit for bit in fp32; in bf16 within the one
    rounding (Triton's interpreter casts to bf16 by truncating, a GPU to nearest)."""
    monkeypatch.setattr(residual, "BLOCK", 64)  # 360 elements: six programs, the last one partial
    h, b, s, sb = _tensors(3, dtype)
    b, sb = {"both": (b, sb), "conv": (b, None), "none": (None, None)}[biases]
    want = residual.reference_residual_add(h, b, s, sb)
    with torch.no_grad():
        got = residual.residual_add(h, b, s, sb)
    assert launched and got.data_ptr() == h.data_ptr()
    if dtype == torch.float32 or DEVICE.type == "cuda":
        assert torch.equal(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=2 ** -7, atol=0)


def test_the_reference_runs_where_the_kernel_cannot_and_bad_shapes_are_refused():
    h, b, s, sb = _tensors(4, torch.float32)
    before = h.clone()
    out = residual.residual_add(h, b, s, sb)  # autograd on: out of place
    assert out.data_ptr() != h.data_ptr() and torch.equal(h, before)
    torch.testing.assert_close(out, h + b.view(1, -1, 1, 1, 1) + s + sb.view(1, -1, 1, 1, 1))
    with torch.no_grad():  # NCDHW: not the kernel's layout
        flat = residual.residual_add(h.contiguous(), b, s.contiguous(), sb)
    torch.testing.assert_close(flat, out)
    with pytest.raises(ValueError, match="differ"):
        residual.residual_add(h, b, s[:1], sb)
    with pytest.raises(ValueError, match=r"bias must be \(4,\)"):
        residual.residual_add(h, b[:3], s, sb)


@needs_triton
def test_a_model_with_fused_residual_samples_the_same_eps(launched):
    """fused_residual: the ResBlocks' output convolutions and 1×1 skip convolutions without their
    biases, added by the kernel — the same ε in fp32 (other rounding only), the same parameters."""
    torch.set_num_threads(2)  # as on CI: oneDNN then returns the small convolutions' outputs NDHWC
    cfg = MODEL_PRESETS["tiny"]
    base = dict(checkpoint_attention=False, fused_ops=True, sdpa=True, triton_norm=True)
    ref = UNet3D(cfg, **base).to(DEVICE, memory_format=NDHWC).eval()
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fused = UNet3D(cfg, **base, fused_residual=True)
    assert fused.state_dict().keys() == ref.state_dict().keys()
    fused.load_state_dict(ref.state_dict())
    fused = fused.to(DEVICE, memory_format=NDHWC).eval()
    x = torch.randn(2, cfg.in_channels, 8, 8, 8, device=DEVICE).contiguous(memory_format=NDHWC)
    t = torch.tensor([3, 120], device=DEVICE)
    # fp32 on a GPU: cuDNN's convolutions default to TF32 in PyTorch 2.11, whose rounding (1e-3) would swamp the
    # kernel's; the comparison is of the kernel's fp32 sums
    with torch.no_grad(), torch.backends.cudnn.flags(enabled=True, allow_tf32=False):
        want = ref(x, t)
        launched.clear()
        got = fused(x, t)
    assert sum(k is residual._residual_kernel for k in launched) > 0
    tol = 5e-5 if DEVICE.type == "cuda" else 1e-5  # cuDNN's fp32 algorithms differ with and without a bias: 1.2e-5 on an H200
    torch.testing.assert_close(got, want, rtol=tol, atol=tol)


def test_fused_residual_is_for_sampling_in_ndhwc():
    with pytest.raises(ValueError, match="fused_residual.*needs channels_last"):
        Knobs(fused_residual=True)
    with pytest.raises(ValueError, match="sampling only"):
        run_config("fast-eager", training=True)
    assert run_config("fast-eager").fused_residual and not run_config("fast-eager-unfused").fused_residual
