"""The Triton kernels of medddpm/net/kernels.py against their PyTorch references (on a CPU through
Triton's interpreter, which conftest turns on; on a GPU compiled)."""
import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from medddpm.net import kernels
from medddpm.core.config import MODEL_PRESETS, Knobs, run_config
from medddpm.net.model import UNet3D

needs_triton = pytest.mark.skipif(kernels.triton is None or not (torch.cuda.is_available() or kernels.INTERPRET),
                                  reason="Triton (or its interpreter) is not available")
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")
NDHWC = torch.channels_last_3d



@pytest.fixture(autouse=True)
def two_threads():
    """The model comparisons at 2 CPU threads, as on CI's two cores: with one, oneDNN's 3D
    convolutions return some small outputs NCDHW, and those blocks take the reference path
    (``kernels.runs_on``) instead of the Triton kernels being compared."""
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    yield
    torch.set_num_threads(before)

@pytest.fixture
def gpu_tiles(monkeypatch):
    """The GPU's launch shapes, where the interpreter's defaults would run one program."""
    monkeypatch.setattr(kernels, "TILES", kernels.Tiles())


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
@pytest.mark.parametrize("partial_tile,block_p", [(None, 8), (64, 4), (16, 1)])
def test_one_launch_reductions_finalize_once_and_leave_their_counters_at_zero(monkeypatch, partial_tile, block_p):
    """The forward statistics and the backward reductions each finalize in the launch's last
    program: with 7 partial rows per sample in one group (8 rows a tile), in groups of 4 and 3, or
    one row per group, the result is the reference's, and every arrival counter is back at 0 for
    the next launch."""
    monkeypatch.setattr(kernels, "TILES", dataclasses.replace(kernels.TILES, stats_tile=256, reduce_tile=256,
                                                              program_bytes=0,
                                                              partial_tile=partial_tile or kernels.TILES.partial_tile))
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 2)  # the same partial rows on any device
    x, w, b, a = _inputs(2, 16, (7, 8, 8), torch.float32, add=True, loc=1.0, spread=2.0)
    part = kernels._reduction(x.detach(), kernels.TILES.stats_tile, 2)[-1]
    assert part.shape[1] == 7 and kernels._partial_rows(part, 16) == block_p
    for _ in range(2):  # a second launch reads counters the first one left
        ref = kernels.reference_group_norm_silu(x, 4, w, b, 1e-5, True, a)
        out = kernels.group_norm_silu(x, 4, w, b, 1e-5, True, a)
        torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
        g = torch.randn_like(ref)
        for got, want in zip(_grads(out, (x, w, b, a), g), _grads(ref, (x, w, b, a), g)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4 * want.abs().max().item())
        assert not kernels._COUNTERS[x.device].any()


@needs_triton
def test_a_small_tensor_gets_fewer_reduction_programs(monkeypatch):
    """Tiles.program_bytes: each reduction program reads at least that many bytes, so a small
    tensor's partial sums (and the tail that adds them up) are few; 0 lifts the floor."""
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 132)
    x = torch.zeros(1, 256, 16, 16, 16, dtype=torch.bfloat16).contiguous(memory_format=NDHWC)  # 2 MiB
    programs = lambda: kernels._reduction(x, kernels.TILES.stats_tile, 2)[-1].shape[1]  # noqa: E731
    assert programs() == 32  # 2 MiB / 64 KiB
    monkeypatch.setattr(kernels, "TILES", dataclasses.replace(kernels.TILES, program_bytes=0))
    assert programs() == 256  # one 16-row tile each: fewer than 8 per SM × 132 SMs


@needs_triton
def test_group_norm_addend_may_be_a_column_slice():
    """The addend may be a column slice of a wider (N, K) table (the frozen timestep table's rows):
    the kernels read it by its row stride, forward and backward, the same numbers as a dense copy."""
    x, w, b, _ = _inputs(2, 16, (4, 4, 4), torch.float32, add=False)
    table = torch.randn(2, 40, device=DEVICE)
    view = table[:, 8:24]
    assert view.stride() == (40, 1)
    with torch.no_grad():
        torch.testing.assert_close(kernels.group_norm_silu(x, 4, w, b, 1e-5, True, view),
                                   kernels.group_norm_silu(x, 4, w, b, 1e-5, True, view.contiguous()), rtol=0, atol=0)
    grads = []
    for add in (table.clone().requires_grad_(True), table.clone().requires_grad_(True)):
        a = add[:, 8:24] if not grads else add[:, 8:24].contiguous()
        out = kernels.group_norm_silu(x, 4, w, b, 1e-5, True, a)
        grads.append(_grads(out, (x, add), torch.ones_like(out)))
    for got, want in zip(*grads):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


@needs_triton
def test_group_norm_silu_op_registration_is_consistent():
    """torch.library's checks of the custom op: fake (meta) shapes and strides, autograd, schema."""
    x, w, b, a = _inputs(1, 16, (4, 4, 4), torch.float32, add=True)
    torch.library.opcheck(torch.ops.medddpm.group_norm_silu.default, (x, w, b, a, 4, 1e-5, True))
    torch.library.opcheck(torch.ops.medddpm.group_norm_silu.default, (x, w, b, None, 4, 1e-5, False))
    torch.library.opcheck(torch.ops.medddpm.group_norm_silu.default, (x, w, b, a, 4, 1e-5, True, False, True))


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
    from medddpm.core.runtime import preserved_backend_flags, set_tf32

    cfg = MODEL_PRESETS["tiny"]
    torch.manual_seed(0)
    with preserved_backend_flags():
        set_tf32(False)  # a GPU's TF32 convolutions would differ by more than the norms do
        fast = _compare_models(cfg, dict(checkpoint_attention=False, fused_ops=True, sdpa=True),
                               dict(triton_norm=True), 1e-4, 1e-3, 1e-4)
    assert sum(isinstance(m, nn.GroupNorm) and m.triton for m in fast.modules()) > 0


def _compare_models(cfg, base: dict, lever: dict, out_tol: float, grad_rtol: float, grad_atol: float,
                    side: int | None = None) -> UNet3D:
    """The model built with ``lever`` against the one without (same parameters, jittered so the
    zero-initialised output layers hide nothing), on ``side``³ inputs (default 16 on a GPU, 8 under
    Triton's CPU interpreter, which pays per program): state-dict keys, ε and every parameter gradient."""
    side = side or (16 if DEVICE.type == "cuda" else 8)
    ref = UNet3D(cfg, **base).to(DEVICE, memory_format=NDHWC)
    with torch.no_grad():
        for p in ref.parameters():
            p.add_(0.05 * torch.randn_like(p))
    fast = UNet3D(cfg, **base, **lever)
    assert fast.state_dict().keys() == ref.state_dict().keys()
    fast.load_state_dict(ref.state_dict())
    fast = fast.to(DEVICE, memory_format=NDHWC)
    x = torch.randn(2, cfg.in_channels, side, side, side, device=DEVICE).contiguous(memory_format=NDHWC)
    t = torch.tensor([3, 120], device=DEVICE)
    out_ref, out_fast = ref(x, t), fast(x, t)
    torch.testing.assert_close(out_fast, out_ref, rtol=out_tol, atol=out_tol)
    out_ref.square().sum().backward()
    out_fast.square().sum().backward()
    for (name, a), b in zip(ref.named_parameters(), fast.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=grad_rtol, atol=grad_atol * a.grad.abs().max().item(), msg=name)
    return fast


def test_folded_conv_bias_is_the_same_model():
    """fold_conv_bias: each ResBlock's first convolution without its bias, the bias added with the
    embedding inside the second norm — the same ε and the same gradients (the bias's included), the
    same parameters; on a GPU through the Triton kernels, elsewhere through their reference."""
    from medddpm.core.runtime import preserved_backend_flags, set_tf32

    torch.manual_seed(0)
    with preserved_backend_flags():
        set_tf32(False)
        _compare_models(MODEL_PRESETS["tiny"], dict(checkpoint_attention=False, fused_ops=True, sdpa=True,
                                                    triton_norm=True), dict(fold_conv_bias=True), 1e-5, 1e-4, 1e-5)
    with pytest.raises(ValueError, match="needs triton_norm"):
        Knobs(channels_last=True, fused_ops=True, fold_conv_bias=True)
    assert run_config("fast-tnorm-tconv-dense-fold").fold_conv_bias


def test_dense_skip_gradients_are_the_same_numbers_laid_out_ndhwc():
    """dense_skip_grads: the skip concatenation's backward hands each input a dense NDHWC gradient
    (torch.cat's is a strided channel slice), of the same values; the model's ε and gradients are
    bit for bit those without it."""
    from medddpm.net.model import skip_cat

    torch.manual_seed(0)
    h = torch.randn(2, 6, 4, 5, 3).contiguous(memory_format=NDHWC).requires_grad_()
    skip = torch.randn(2, 4, 4, 5, 3).contiguous(memory_format=NDHWC).requires_grad_()
    grad = torch.randn(2, 10, 4, 5, 3).contiguous(memory_format=NDHWC)
    plain = torch.autograd.grad(skip_cat(h, skip), (h, skip), grad)
    dense = torch.autograd.grad(out := skip_cat(h, skip, dense_grads=True), (h, skip), grad)
    assert torch.equal(out, torch.cat([h, skip], dim=1))
    assert not plain[0].is_contiguous(memory_format=NDHWC)  # what cuDNN would copy first
    for p, d in zip(plain, dense):
        assert torch.equal(d, p) and d.is_contiguous(memory_format=NDHWC)
    torch.manual_seed(0)
    _compare_models(MODEL_PRESETS["tiny"], dict(checkpoint_attention=False, fused_ops=True, sdpa=True),
                    dict(dense_skip_grads=True), 0, 0, 0)
    with pytest.raises(ValueError, match="needs channels_last"):
        Knobs(dense_skip_grads=True)


@needs_triton
@pytest.mark.parametrize("dual", [False, True])
def test_concatenating_norm_writes_both_inputs_gradients_with_the_other_consumers_share(dual):
    """group_norm_silu_cat: c = cat([h, skip]) and the norm of c as the reference computes them; the
    backward adds c's gradient from its other consumer (here a 1×1 convolution, as in a decoder
    ResBlock) in the norm's dx pass and hands h and skip their gradients dense NDHWC."""
    g = torch.Generator().manual_seed(3)
    h = torch.randn(2, 6, 4, 5, 3, generator=g).contiguous(memory_format=NDHWC).to(DEVICE).requires_grad_()
    skip = (2 + 3 * torch.randn(2, 10, 4, 5, 3, generator=g)).contiguous(memory_format=NDHWC).to(DEVICE)
    skip.requires_grad_()
    w = (1 + 0.3 * torch.randn(16, generator=g)).to(DEVICE).requires_grad_()
    b = torch.randn(16, generator=g).to(DEVICE).requires_grad_()
    k = torch.randn(12, 16, 1, 1, 1, generator=g).to(DEVICE)
    dy, dz = torch.randn(2, 16, 4, 5, 3, generator=g).to(DEVICE), torch.randn(2, 12, 4, 5, 3, generator=g).to(DEVICE)
    c, y, y8 = kernels.group_norm_silu_cat(h, skip, 4, w, b, dual=dual)
    c_ref = torch.cat([h, skip], dim=1)
    y_ref = kernels.reference_group_norm_silu(c_ref, 4, w, b)
    assert torch.equal(c, c_ref) and c.is_contiguous(memory_format=NDHWC)
    torch.testing.assert_close(y, y_ref, rtol=1e-5, atol=1e-5)
    if dual:
        want8 = kernels.reference_e4m3(c_ref, 4, w, b).float()
        assert y8.dtype == kernels.E4M3 and (y8.float() - want8).abs().max() <= 2 ** -3 * want8.abs().max()
    else:
        assert y8 is None
    got = torch.autograd.grad((y * dy).sum() + (F.conv3d(c, k) * dz).sum(), (h, skip, w, b))
    want = torch.autograd.grad((y_ref * dy).sum() + (F.conv3d(c_ref, k) * dz).sum(), (h, skip, w, b))
    for a, e in zip(got, want):
        torch.testing.assert_close(a, e, rtol=1e-4, atol=1e-4 * e.abs().max().item())
    assert got[0].is_contiguous(memory_format=NDHWC) and got[1].is_contiguous(memory_format=NDHWC)


def test_concatenating_norm_refuses_inputs_that_do_not_concatenate():
    h, w, b = torch.randn(1, 4, 2, 2, 2), torch.ones(8), torch.zeros(8)
    with pytest.raises(ValueError, match="differ outside the channels"):
        kernels.group_norm_silu_cat(h, torch.randn(1, 4, 2, 2, 3), 4, w, b)
    with pytest.raises(ValueError, match="9 channels do not split into 2 groups"):
        kernels.group_norm_silu_cat(h, torch.randn(1, 5, 2, 2, 2), 2, torch.ones(9), torch.zeros(9))


@needs_triton
def test_norm_backward_op_with_an_extra_gradient_and_a_split_is_consistent():
    """opcheck of the backward op's concatenation form (fake shapes and strides of the two dense
    gradients), and its values against the plain form plus the extra gradient, sliced."""
    x, w, b, _ = _inputs(1, 16, (3, 4, 2), torch.float32, add=False)
    x = x.detach()
    _, mean, rstd, _ = torch.ops.medddpm.group_norm_silu(x, w, b, None, 4, 1e-5, True)
    dy, extra = torch.randn_like(x), torch.randn_like(x)
    op = torch.ops.medddpm.group_norm_silu_backward.default
    torch.library.opcheck(op, (dy, x, w.detach(), b.detach(), None, mean, rstd, 4, True, extra, 6))
    plain = op(dy, x, w, b, None, mean, rstd, 4, True)
    split = op(dy, x, w, b, None, mean, rstd, 4, True, extra, 6)
    whole = plain[0] + extra
    torch.testing.assert_close(split[0], whole[:, :6], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(split[4], whole[:, 6:], rtol=1e-5, atol=1e-5)
    assert plain[4].numel() == 0 and split[0].is_contiguous(memory_format=NDHWC)
    with pytest.raises(ValueError, match="split must lie between 0 and the 16 channels"):
        op(dy, x, w, b, None, mean, rstd, 4, True, None, 16)


@needs_triton
def test_fused_skip_gradients_are_the_same_model(monkeypatch):
    """fused_skip_grads: every decoder ResBlock concatenates through the Triton norm (counted), and
    the model's ε and gradients are those of the dense-skip-gradient model it replaces."""
    from medddpm.core.runtime import preserved_backend_flags, set_tf32

    calls = []
    apply = kernels._CatNorm.apply
    monkeypatch.setattr(kernels._CatNorm, "apply", lambda *a: (calls.append(a[0].shape), apply(*a))[1])
    torch.manual_seed(0)
    cfg = MODEL_PRESETS["tiny"]
    with preserved_backend_flags():
        set_tf32(False)
        _compare_models(cfg, dict(checkpoint_attention=False, fused_ops=True, sdpa=True, triton_norm=True,
                                  dense_skip_grads=True), dict(fused_skip_grads=True), 1e-5, 1e-4, 1e-5, side=8)
    assert len(calls) == cfg.levels * (cfg.num_res_blocks + 1)
    with pytest.raises(ValueError, match="needs triton_norm=True and channels_last=True"):
        Knobs(channels_last=True, fused_skip_grads=True)
    with pytest.raises(ValueError, match="it needs triton_norm"):
        UNet3D(cfg, fused_skip_grads=True)
    assert run_config("fast-skipgrad", training=True).fused_skip_grads


# --- thin 3³ convolutions (kernels.conv3d_thin) ------------------------------------------------

@pytest.fixture
def exact_fp32():
    """fp32 convolutions without TF32 (PyTorch's cuDNN default on a GPU): the references are exact."""
    from medddpm.core.runtime import preserved_backend_flags, set_tf32

    with preserved_backend_flags():
        set_tf32(False)
        yield


def _conv_inputs(n, cin, cout, spatial, dtype=torch.float32, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, cin, *spatial, generator=g).to(DEVICE, dtype).contiguous(memory_format=NDHWC)
    w = (0.2 * torch.randn(cout, cin, 3, 3, 3, generator=g)).to(DEVICE, dtype)
    b = torch.randn(cout, generator=g).to(DEVICE, dtype)
    return x.requires_grad_(True), w.requires_grad_(True), b.requires_grad_(True)


@needs_triton
@pytest.mark.parametrize("n,cin,cout,spatial", [
    (1, 3, 16, (5, 6, 7)),    # the stem's shape: a thin input (gathered taps), odd volume, partial tile
    (2, 16, 1, (4, 5, 6)),    # the output convolution's: a thin output (27 shifted loads), two samples
    (1, 2, 24, (3, 3, 3)),    # channels that are no power of two; every voxel on the border
    (2, 20, 3, (4, 4, 5)),
    (1, 8, 8, (4, 4, 4)),     # THIN on both sides
])
def test_thin_convolution_matches_conv3d_and_its_gradients(n, cin, cout, spatial, exact_fp32):
    x, w, b = _conv_inputs(n, cin, cout, spatial)
    assert kernels.runs_on(x)
    out = kernels.conv3d_thin(x, w, b)
    ref = F.conv3d(x, w, b, padding=1)
    assert out.shape == ref.shape and out.is_contiguous(memory_format=NDHWC)
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    for name, got, want in zip("xwb", _grads(out, (x, w, b), g), _grads(ref, (x, w, b), g)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5 * want.abs().max().item(), msg=name)


@needs_triton
def test_thin_convolution_without_bias_and_without_an_input_gradient(exact_fp32):
    x, w, _ = _conv_inputs(1, 16, 1, (4, 4, 4))
    x = x.detach()
    out = kernels.conv3d_thin(x, w)
    (dw,) = torch.autograd.grad(out.square().sum(), w)
    (want,) = torch.autograd.grad(F.conv3d(x, w, padding=1).square().sum(), w)
    torch.testing.assert_close(dw, want, rtol=1e-4, atol=1e-5 * want.abs().max().item())


@needs_triton
def test_thin_convolution_in_bf16_accumulates_in_fp32(exact_fp32):
    """bf16 in and out: within a few bf16 units of the fp32 convolution of the same bf16 numbers."""
    x, w, b = _conv_inputs(2, 16, 1, (6, 6, 6), torch.bfloat16)
    out = kernels.conv3d_thin(x, w, b)
    exact = F.conv3d(x.float(), w.float(), b.float(), padding=1)
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), exact, rtol=2 ** -6, atol=2e-2)
    gw = torch.autograd.grad(out.float().sum(), w)[0].float()
    gw_exact = torch.autograd.grad(F.conv3d(x.float(), w.float(), b.float(), padding=1).sum(), w)[0].float()
    torch.testing.assert_close(gw, gw_exact, rtol=2 ** -6, atol=2e-2 * gw_exact.abs().max().item())


@needs_triton
def test_gathered_convolution_programs_may_loop_over_tiles(monkeypatch, exact_fp32):
    """Tiles.conv_programs_per_sm: fewer programs than voxel tiles, each loading the weight once
    and taking every num_programs-th tile: the same convolution (forward and data gradient)."""
    monkeypatch.setattr(kernels, "TILES", dataclasses.replace(kernels.TILES, conv_programs_per_sm=1, conv_tile=512))
    monkeypatch.setattr(kernels, "_sm_count", lambda device: 2)
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, 3, 5, 6, 7, generator=g).to(DEVICE).contiguous(memory_format=NDHWC)
    w, b = torch.randn(16, 3, 3, 3, 3, generator=g).to(DEVICE), torch.randn(16, generator=g).to(DEVICE)
    dy = torch.randn(2, 1, 5, 6, 7, generator=g).to(DEVICE).contiguous(memory_format=NDHWC)
    w1 = torch.randn(1, 16, 3, 3, 3, generator=g).to(DEVICE)
    with torch.no_grad():
        torch.testing.assert_close(kernels.conv3d_thin(x, w, b), F.conv3d(x, w, b, padding=1), rtol=1e-4, atol=1e-4)
        torch.testing.assert_close(kernels._thin_pass(dy, w1, None, dgrad=True),
                                   torch.nn.grad.conv3d_input((2, 16, 5, 6, 7), w1, dy, padding=1), rtol=1e-4, atol=1e-4)


@needs_triton
def test_thin_convolution_is_deterministic():
    x, w, b = _conv_inputs(1, 3, 16, (8, 8, 8), torch.bfloat16)
    runs = []
    for _ in range(2):
        out = kernels.conv3d_thin(x, w, b)
        runs.append((out, *_grads(out, (x, w, b), torch.ones_like(out))))
    assert all(torch.equal(p, q) for p, q in zip(*runs))


@needs_triton
def test_thin_convolution_op_registration_is_consistent():
    x, w, b = _conv_inputs(1, 3, 16, (3, 4, 3))
    torch.library.opcheck(torch.ops.medddpm.conv3d_thin.default, (x, w, b))
    x, w, _ = _conv_inputs(1, 16, 1, (3, 3, 4))
    torch.library.opcheck(torch.ops.medddpm.conv3d_thin.default, (x, w, None))


def test_thin_convolution_refuses_shapes_it_does_not_compute_and_falls_back_elsewhere():
    with pytest.raises(ValueError, match="at most 8 channels on one side"):
        kernels.conv3d_thin(torch.randn(1, 16, 4, 4, 4), torch.randn(16, 16, 3, 3, 3))
    with pytest.raises(ValueError, match="3³ weight"):
        kernels.conv3d_thin(torch.randn(1, 3, 4, 4, 4), torch.randn(16, 3, 1, 1, 1))
    x, w = torch.randn(1, 3, 4, 4, 4), torch.randn(16, 3, 3, 3, 3)  # NCDHW: the reference path
    assert not kernels.runs_on(x)
    torch.testing.assert_close(kernels.conv3d_thin(x, w), F.conv3d(x, w, padding=1))
    assert kernels.thin_conv_supported(nn.Conv3d(64, 1, 3, padding=1))
    assert not kernels.thin_conv_supported(nn.Conv3d(64, 1, 3, padding=1, stride=2))
    assert not kernels.thin_conv_supported(nn.Conv3d(64, 64, 3, padding=1))


def test_triton_conv_knob_is_validated():
    with pytest.raises(ValueError, match="channels_last"):
        Knobs(triton_conv=True)
    with pytest.raises(ValueError, match="pad_channels must be 0"):
        Knobs(triton_conv=True, channels_last=True, pad_channels=8)
    assert run_config("fast-tconv").triton_conv and run_config("fast-tnorm-tconv").triton_norm


@needs_triton
def test_model_with_triton_convolutions_matches_the_model():
    """The stem and output convolutions through the Triton kernels: same parameters and state-dict
    keys, same ε and parameter gradients as the model through F.conv3d."""
    from medddpm.core.runtime import preserved_backend_flags, set_tf32

    torch.manual_seed(0)
    with preserved_backend_flags():
        set_tf32(False)
        fast = _compare_models(MODEL_PRESETS["tiny"], {}, dict(triton_conv=True), 1e-5, 1e-4, 1e-5)
    assert fast.out[-1].triton and fast.input_blocks[0][0].conv.triton


# --- trilinear ×2 upsampling (kernels.upsample2x) ----------------------------------------------

@needs_triton
@pytest.mark.parametrize("n,c,spatial", [
    (1, 64, (4, 4, 4)),      # the decoder's width, a cube
    (2, 24, (3, 5, 2)),      # two samples, channels no power of two, odd sides, a side of 2
    (1, 3, (1, 2, 3)),       # a side of 1: both neighbours clamp to the only voxel
])
def test_upsample_kernel_matches_the_reference_and_its_gradient(n, c, spatial, gpu_tiles):
    from medddpm.net import ndhwc

    x = torch.randn(n, c, *spatial, device=DEVICE).contiguous(memory_format=NDHWC).requires_grad_(True)
    assert kernels.runs_on(x)
    out = kernels.upsample2x(x)
    ref = ndhwc.upsample2x(x)
    assert out.shape == (n, c, *(2 * s for s in spatial)) and out.is_contiguous(memory_format=NDHWC)
    torch.testing.assert_close(out, ref, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(out, F.interpolate(x, scale_factor=2, mode="trilinear"), rtol=1e-5, atol=1e-5)
    g = torch.randn_like(ref)
    got = _grads(out, (x,), g)[0]
    torch.testing.assert_close(got, _grads(ref, (x,), g)[0], rtol=1e-5, atol=1e-5)
    assert got.is_contiguous(memory_format=NDHWC)  # the Triton backward's layout, as the convolution before it reads


@needs_triton
def test_upsample_kernel_in_bf16_rounds_once(gpu_tiles):
    """bf16 in and out, fp32 inside: within one bf16 unit of the fp32 interpolation of the same numbers."""
    x = torch.randn(1, 16, 3, 4, 5, device=DEVICE).to(torch.bfloat16).contiguous(memory_format=NDHWC)
    out = kernels.upsample2x(x.requires_grad_())
    assert out.dtype == torch.bfloat16
    torch.testing.assert_close(out.float(), F.interpolate(x.float(), scale_factor=2, mode="trilinear"),
                               rtol=2 ** -7, atol=1e-2)
    dy = torch.randn_like(out)  # the backward too: 64 bf16 terms summed in fp32, rounded once
    want = torch.autograd.grad(F.interpolate(x.float(), scale_factor=2, mode="trilinear"), x, dy.float())[0]
    got = torch.autograd.grad(out, x, dy)[0]
    assert got.dtype == torch.bfloat16
    torch.testing.assert_close(got.float(), want.float(), rtol=2 ** -7, atol=2e-2)


@needs_triton
def test_upsample_op_registration_is_consistent():
    x = torch.randn(1, 8, 2, 3, 2, device=DEVICE).contiguous(memory_format=NDHWC)
    torch.library.opcheck(torch.ops.medddpm.upsample2x.default, (x,))
    dy = torch.randn(1, 8, 4, 6, 4, device=DEVICE).contiguous(memory_format=NDHWC)
    torch.library.opcheck(torch.ops.medddpm.upsample2x_backward.default, (dy, 2, 3, 2))


def test_upsample_falls_back_to_the_reference_and_refuses_other_ranks():
    from medddpm.net import ndhwc

    x = torch.randn(1, 4, 2, 3, 4)  # NCDHW: the reference path
    assert not kernels.runs_on(x)
    torch.testing.assert_close(kernels.upsample2x(x), ndhwc.upsample2x(x))
    with pytest.raises(ValueError, match="expected"):
        kernels.upsample2x(torch.randn(1, 4, 2, 3).contiguous(memory_format=torch.channels_last))


def test_triton_upsample_knob_is_validated_and_trains():
    with pytest.raises(ValueError, match="fused_ops"):
        Knobs(triton_upsample=True)
    knobs = run_config("fast-w16-tnorm-tconv-fold-up")
    assert knobs.triton_upsample and knobs.fold_conv_bias and knobs.bf16_weights
    with pytest.raises(ValueError, match="sampling only.*bf16_weights"):
        run_config("fast-w16-tnorm-tconv-fold-up", training=True)
    assert run_config("fast-skipgrad-up", training=True).triton_upsample  # its backward is a Triton kernel too
    with pytest.raises(ValueError, match="needs fused"):
        from medddpm.net.model import Upsample
        Upsample(8, fused=False, triton=True)


@needs_triton
def test_model_with_triton_upsampling_matches_the_model():
    """The decoder's upsampling through the Triton kernel: same state-dict keys, ε and gradients."""
    from medddpm.core.runtime import preserved_backend_flags, set_tf32

    torch.manual_seed(0)
    with preserved_backend_flags():
        set_tf32(False)
        fast = _compare_models(MODEL_PRESETS["tiny"], dict(fused_ops=True), dict(triton_upsample=True), 1e-5, 1e-4, 1e-5)
    from medddpm.net.model import Upsample
    assert any(isinstance(m, Upsample) and m.triton for m in fast.modules())


def test_precompile_records_each_launch_of_a_dry_run_and_compiles_them_all(monkeypatch):
    """kernels.precompile: the dry run launches nothing; every launch it made is compiled once
    (``warmup`` with its grid and arguments); outside it a launch runs; where Triton cannot run
    the function just runs."""
    if kernels.triton is None:
        pytest.skip("Triton is not installed")

    class Kernel:
        def __init__(self):
            self.launched, self.compiled = [], []

        def __getitem__(self, grid):
            return lambda *args, **meta: self.launched.append((grid, args, meta))

        def warmup(self, *args, grid, **meta):
            self.compiled.append((grid, args, meta))

    a, b = Kernel(), Kernel()

    def net():
        kernels._launch(a, (4, 1), "x", 3, BLOCK=8)
        kernels._launch(b, (2,), "y", SILU=True)
        kernels._launch(a, (1, 1), "z", 5, BLOCK=16)

    monkeypatch.setattr(kernels, "INTERPRET", False)
    assert kernels.precompile(net, threads=2) == 3
    assert a.launched == b.launched == [] and kernels._RECORDED is None
    assert sorted(a.compiled) == [((1, 1), ("z", 5), {"BLOCK": 16}), ((4, 1), ("x", 3), {"BLOCK": 8})]
    assert b.compiled == [((2,), ("y",), {"SILU": True})]
    net()  # not inside precompile: launched
    assert len(a.launched) == 2 and len(b.launched) == 1
    monkeypatch.setattr(kernels, "INTERPRET", True)
    assert kernels.precompile(net) == 0 and len(a.launched) == 4 and len(a.compiled) == 2
    # launches alike in kernel, dtypes, 16-byte alignment and what Triton sees of each integer (1, a multiple of
    # 16, its type) are compiled once; a tensor of another dtype or alignment, an integer Triton tells apart or
    # another float is a launch of its own
    monkeypatch.setattr(kernels, "INTERPRET", False)
    t = torch.zeros(8)
    calls = [(t, 3), (t.clone(), 5), (t[1:], 3), (t.half(), 3), (t, 32), (t.clone(), 48), (t, 1), (t, 2 ** 40),
             (t, 0.5), (t, 0.5), (t, True)]

    def many():
        for args in calls:
            kernels._launch(b, (2,), *args, SILU=True)
    b.compiled.clear()
    assert kernels.precompile(many) == 11 and len(b.compiled) == 8 and len(b.launched) == 2  # none launched by it


@needs_triton
def test_inference_calls_the_kernels_without_the_dispatcher_and_without_dynamo():
    """Outside autograd and torch.compile (a sampler in inference mode) the forward kernels run from
    their Python bodies (``kernels._forward_op``): the same numbers as through the custom ops, and no
    import of torch._dynamo, which a first custom-op call pulls in. A fresh process, so nothing
    else has imported it."""
    import subprocess
    import sys

    code = """
import sys, torch
from medddpm.net import kernels as k
x = torch.randn(1, 16, 4, 4, 4).to(memory_format=torch.channels_last_3d)
w, b, add = torch.rand(16), torch.rand(16), torch.randn(1, 16)
thin = torch.randn(1, 3, 4, 4, 4).to(memory_format=torch.channels_last_3d)
tw, cw, cb = torch.randn(8, 3, 3, 3, 3), torch.rand(32), torch.rand(32)
with torch.inference_mode():
    outs = [k.group_norm_silu(x, 4, w, b, add=add), k.upsample2x(x), k.conv3d_thin(thin, tw)]
    c, cat, _ = k.group_norm_silu_cat(x, x, 4, cw, cb)
assert "torch._dynamo" not in sys.modules, "inference imported torch._dynamo"
with torch.inference_mode():  # every bypassed kernel against its custom op (issue 77 item 9)
    assert torch.equal(outs[0], torch.ops.medddpm.group_norm_silu(x, w, b, add, 4, 1e-5, True, False)[0])
    assert torch.equal(outs[1], torch.ops.medddpm.upsample2x(x, False))
    assert torch.equal(outs[2], torch.ops.medddpm.conv3d_thin(thin, tw, None))
    assert torch.equal(c, torch.cat([x, x], 1))
    assert torch.equal(cat, torch.ops.medddpm.group_norm_silu(c, cw, cb, None, 4, 1e-5, True, False)[0])
y = k.group_norm_silu(x.requires_grad_(), 4, w, b, add=add)  # autograd: through the op, which records its backward
assert y.grad_fn is not None and "torch._dynamo" in sys.modules
print("ok")
"""
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**__import__("os").environ, "TRITON_INTERPRET": "1"})
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stderr[-2000:]


def test_a_larger_launch_keeps_the_counters_earlier_graphs_captured(monkeypatch):
    """A launch that needs more arrival counters than the buffer holds gets a new buffer; the old one stays alive,
    since a CUDA graph captured before holds its address (issue 77 item 9), and is never handed out again."""
    monkeypatch.setattr(kernels, "_COUNTERS", {})
    monkeypatch.setattr(kernels, "_OUTGROWN", [])
    monkeypatch.setattr(kernels, "_MIN_COUNTERS", 1)
    small = kernels._arrival_counters(torch.zeros(1, 4, 2, 8), 4)
    assert kernels._arrival_counters(torch.zeros(1, 4, 2, 8), 4) is small  # the same need: the same buffer
    large = kernels._arrival_counters(torch.zeros(8, 4, 2, 8), 4)
    assert large.numel() > small.numel() and kernels._OUTGROWN == [small]
    assert kernels._arrival_counters(torch.zeros(1, 4, 2, 8), 4) is large  # a smaller launch reads the larger one
