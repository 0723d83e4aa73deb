"""Triton kernels of the fast path (issue 21), each beside the PyTorch reference it must equal.

Three operations live here: GroupNorm + SiLU (below; ``group_norm_silu_cat`` also takes a decoder
ResBlock's skip concatenation and writes its two inputs' gradients), the thin 3³ convolutions
(``conv3d_thin``, after it) and the decoder's trilinear ×2 upsampling (``upsample2x``, last, its
backward a kernel too; the reference of both directions is ``ndhwc.upsample2x``). The norm and the
upsampling can write their output in E4M3 (``fp8=True``: the input of the sampler's FP8
convolutions, ``medddpm.net.fp8``), saturated and rounded to E4M3 in fp32 first (``_e4m3_rounded``), so
the cast is exact on every backend and equals ``fp8.quantize_activation`` of the reference.

``group_norm_silu`` is GroupNorm with fp32 statistics, an optional SiLU (the reference's
GroupNorm32 + SiLU, paper Fig. 3 ④) and an optional per-(sample, channel) addend folded into its
input (a ResBlock's time embedding, ``h + emb`` before ``out_layers``), over activations stored
channels-last (NDHWC, seen here as (N, S, C)). It moves the fewest bytes the operation allows:

- forward: one read of x for the statistics, one read of x and one write of y for the apply;
- backward: one read of x and dy for the reductions, one read of both and one write of dx (plus
  one read of x's gradient from its other consumers, when given, added as dx is written).

Statistics are per-channel partial sums over row chunks (shifted by the sample's first voxel, so a
large mean does not cancel the variance away). Programs arrive at counters in groups
(``_group_done``); the last of each group adds the group's partials, the last group adds those,
in a fixed order, and turns them into group statistics (law of total variance): one launch
instead of three (a sum and a finalize kernel after the statistics). A small tensor gets few
programs (``Tiles.program_bytes``), so that tail stays short. The only atomics are the counters',
so the result is deterministic, and the training run's ``--resume`` stays bit-exact.

The reference is ``reference_group_norm_silu`` (``ndhwc.group_norm_silu`` on x + addend in fp32); it
runs wherever Triton does not: on a CPU, for a tensor that is not channels-last, or without
Triton installed. With ``TRITON_INTERPRET=1`` set before import, Triton's interpreter runs the
kernels on CPU tensors (``tests/test_kernels.py`` compares them with the reference that way).
"""
from __future__ import annotations

import contextlib
import functools
import math
import os
from typing import Any, Callable

import torch
from torch import Tensor

from . import ndhwc
from .fp8 import E4M3, E4M3_MAX, quantize_activation
from .tiles import THIN, Tiles

try:  # a CPU-only install may lack Triton: the references then run everywhere
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (tests)


# The launch shapes in use (a module global, so a probe can swap it). Triton's CPU interpreter pays
# per program, so under it the upsampling runs as one program for the tests' tiny volumes (the
# kernel tests swap the GPU's shapes back in to cover several programs).
TILES = Tiles(upsample_tile=1 << 16, upsample_bwd_tile=1 << 16) if INTERPRET else Tiles()


# within ``precompile``'s dry run: its launches, one of each kind (``_specialization``: the launch, with stand-ins for
# its tensors), and how many there were
_RECORDED: dict[tuple, tuple] | None = None
_LAUNCHES = 0


def _launch(kernel, grid: tuple, *args, **meta) -> None:
    """``kernel[grid](*args, **meta)``, or (inside ``precompile``'s dry run) the launch recorded."""
    global _LAUNCHES
    if _RECORDED is not None:
        _LAUNCHES += 1
        key = _specialization(kernel, args, meta)
        if key not in _RECORDED:
            _RECORDED[key] = (kernel, grid, tuple(_stand_in(a) if isinstance(a, Tensor) else a for a in args), meta)
    else:
        kernel[grid](*args, **meta)


def _specialization(kernel, args: tuple, meta: dict) -> tuple:
    """What of a launch can make Triton compile another kernel: the kernel, each tensor's dtype,
    device and whether its address is 16-byte aligned, each integer's ``_int_key``, every other
    argument's value. Launches alike in all of it are compiled once (a chain of 12 denoiser calls:
    1,020 launches, cProfile, the triton-key-h200-host run in ``time_to_result/``): each warm-up
    otherwise computes Triton's key and looks its cache up again, and threads compiling the same
    kernel at once each compile it."""
    return (kernel, tuple((a.dtype, a.device, a.data_ptr() % 16 == 0) if isinstance(a, Tensor) else _int_key(a)
                          for a in args), tuple(sorted(meta.items())))


def _int_key(a: Any) -> Any:
    """What Triton specializes an integer argument on, as its backend does: whether it is 1 (a
    constant), a multiple of 16 (its divisibility hint) and which integer type holds it; a sizes
    argument of another value but the same key runs the same compiled kernel (a 64³ denoiser call: 34
    launches of other values, 19 kernels). Anything else (a bool, a float, None) is itself."""
    if isinstance(a, bool) or not isinstance(a, int):
        return a
    return ("int", a == 1, a % 16 == 0, -2 ** 31 <= a < 2 ** 31, a >= 2 ** 63)


def _stand_in(t: Tensor) -> Tensor:
    """A one-element tensor that Triton specializes as it does ``t`` (dtype, device, 16-byte alignment)
    and that holds none of ``t``'s memory: the dry run's tensors are freed as its real run would free
    them (recording them kept every output of a 12-call chain alive: out of memory at --batch 4, 128³)."""
    buf = torch.empty(16, dtype=t.dtype, device=t.device)  # a fresh block: aligned
    return buf[:1] if t.data_ptr() % 16 == 0 else buf[1:2]


_BODIES: dict[str, Callable[..., Any]] = {}  # the Python body of each forward custom op medddpm::NAME, by NAME


def _forward(name: str) -> Callable[[Callable[..., Any]], Any]:
    """Register the decorated function as the custom op medddpm::NAME, its body kept for ``_forward_op``."""
    def register(body: Callable[..., Any]) -> Any:
        _BODIES[name] = body
        return torch.library.custom_op(f"medddpm::{name}", mutates_args=())(body)
    return register


def _forward_op(name: str) -> Callable[..., Any]:
    """``torch.ops.medddpm.NAME`` where autograd may record it or torch.compile traces it, else its
    body itself, which launches the same kernels with the same arguments: the first call of a
    custom op through PyTorch's dispatcher imports torch._dynamo (0.9 s of a one-volume ``sample``
    on an H200 host, the triton-key-h200-host run's ``importtime-sample-1.txt``)
    and every call passes a dynamo-disabled wrapper, which eager inference (``fast-eager``) needs not."""
    if torch.is_grad_enabled() or torch.compiler.is_compiling():
        return getattr(torch.ops.medddpm, name)
    return _BODIES[name]


def precompile(run, threads: int | None = None) -> int:
    """Compile, in ``threads`` threads at once (default: one per CPU), every Triton kernel that
    ``run()`` launches, load it and build its launcher, and return how many launches it made.
    ``run`` is called once as a dry run: each launch is recorded, not run (its outputs keep whatever
    memory they got: call it on inputs whose results do not matter), one of each kind
    (``_specialization``); then each is compiled (``JITFunction.warmup``) into Triton's caches, where
    the real launches find it, and its module loaded and launcher built (``CompiledKernel.run``).
    Triton otherwise does all of it at each kernel's first launch, one kernel after another (issue
    48: 25 kernels of ``fast-eager``'s denoiser); its compiler's assembler and launcher builds are
    processes of their own, so threads overlap them (a cold 1-mask ``sample`` on an H100: 37.9 s
    without, 22.9 s with, ``time_to_result/``). Where Triton cannot run (a CPU, its interpreter)
    ``run`` runs as it is."""
    global _RECORDED, _LAUNCHES
    if triton is None or INTERPRET:
        run()
        return 0
    _RECORDED, _LAUNCHES = {}, 0
    try:
        run()
        calls, launches = list(_RECORDED.values()), _LAUNCHES
    finally:
        _RECORDED = None
    from concurrent.futures import ThreadPoolExecutor

    def ready(call: tuple) -> None:
        kernel, grid, args, meta = call
        device = next((a.device for a in args if isinstance(a, Tensor)), None)
        with torch.cuda.device(device) if device is not None and device.type == "cuda" else contextlib.nullcontext():
            compiled = kernel.warmup(*args, grid=grid, **meta)
            getattr(compiled, "run", None)  # loads the module and builds the launcher on this device

    with ThreadPoolExecutor(max(1, min(threads or os.cpu_count() or 4, len(calls)))) as pool:
        list(pool.map(ready, calls))
    return launches


def reference_group_norm_silu(x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                              silu: bool = True, add: Tensor | None = None, fp8: bool = False) -> Tensor:
    """SiLU(GroupNorm(x + add)) in fp32, returned in ``x``'s dtype and layout (in E4M3 with ``fp8``,
    ``fp8.quantize_activation``): the maths of ``group_norm_silu`` in plain tensor operations
    (``add`` is (N, C), broadcast over voxels)."""
    if add is not None:
        x32 = x.float() + ndhwc.per_channel(add.float(), x)
        y = ndhwc.group_norm_silu(x32, groups, weight, bias, eps, silu).to(x.dtype)
    else:
        y = ndhwc.group_norm_silu(x, groups, weight, bias, eps, silu)
    return quantize_activation(y) if fp8 else y


def runs_on(x: Tensor) -> bool:
    """True when the Triton kernels can run on ``x``: Triton installed and ``x`` on a CUDA device
    (or on the CPU under Triton's interpreter), stored channels-last, (N, C, *spatial)."""
    if triton is None or not (x.is_cuda or (INTERPRET and x.device.type == "cpu")):
        return False
    return x.ndim >= 3 and x.movedim(1, -1).is_contiguous()


def group_norm_silu(x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                    silu: bool = True, add: Tensor | None = None, fp8: bool = False) -> Tensor:
    """SiLU(GroupNorm(x + add)) through the Triton kernels where they run (``runs_on``), else the
    reference. ``x`` is (N, C, *spatial); ``add``, if given, is (N, C). Autograd reaches x,
    weight, bias and add. ``fp8``: the output in E4M3 (saturated at ±448) for an FP8 convolution
    (``medddpm.net.fp8``; the sampler's, no backward)."""
    _no_fp8_grad(fp8, x, weight, bias, *([] if add is None else [add]))
    _check_norm_args(x.shape, groups, add)
    if not runs_on(x):
        return reference_group_norm_silu(x, groups, weight, bias, eps, silu, add, fp8)
    return _forward_op("group_norm_silu")(x, weight, bias, add, groups, eps, silu, fp8)[0]


def group_norm_silu_dual(x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                         silu: bool = True, add: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """(y, y in E4M3) of ``group_norm_silu``, both from the same fp32 values, for a training
    convolution whose forward is FP8 (``fp8.Fp8ForwardConv3d``): the E4M3 copy is written by the
    same pass that writes y (no kernel reads y again to quantize it) and has no gradient; autograd
    reaches x, weight, bias and add through y."""
    _check_norm_args(x.shape, groups, add)
    if not runs_on(x):
        y = reference_group_norm_silu(x, groups, weight, bias, eps, silu, add)
        return y, reference_e4m3(x, groups, weight, bias, eps, silu, add)
    y, _, _, y8 = _forward_op("group_norm_silu")(x, weight, bias, add, groups, eps, silu, False, True)
    return y, y8.view(E4M3)


def group_norm_silu_cat(h: Tensor, skip: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                        silu: bool = True, dual: bool = False) -> tuple[Tensor, Tensor, Tensor | None]:
    """(c, y, y8) for a decoder ResBlock's input: c = cat([h, skip]) along the channels (for its 1×1
    skip convolution), y = ``group_norm_silu(c)`` and, with ``dual``, y's E4M3 copy
    (``group_norm_silu_dual``; else None). Where the kernels run, c's gradient from its other
    consumers is added by the norm's dx kernel, which writes h's and skip's gradients apart, each
    dense channels-last (``Knobs.fused_skip_grads``): no kernel of its own sums c's two gradients
    and slices them (paper Fig. 3's decoder concatenation; the same values)."""
    if h.shape[0] != skip.shape[0] or h.shape[2:] != skip.shape[2:]:
        raise ValueError(f"h {tuple(h.shape)} and skip {tuple(skip.shape)} differ outside the channels")
    _check_norm_args((h.shape[0], h.shape[1] + skip.shape[1]), groups, None)
    if not (runs_on(h) and runs_on(skip)):  # the plain concatenation, then the norm's own entries
        c = torch.cat([h, skip], dim=1)
        if dual:
            return c, *group_norm_silu_dual(c, groups, weight, bias, eps, silu)
        return c, group_norm_silu(c, groups, weight, bias, eps, silu), None
    c, y, y8 = _CatNorm.apply(h, skip, weight, bias, groups, eps, silu, dual)
    return c, y, y8.view(E4M3) if dual else None


class _CatNorm(torch.autograd.Function):
    """c = cat([h, skip]) and y = SiLU(GroupNorm(c)) through the Triton kernels; the backward takes
    c's gradient (dc, from the skip convolution) into the norm's dx pass and splits the sum at h's
    channels (``group_norm_silu_cat``)."""

    @staticmethod
    def forward(ctx, h: Tensor, skip: Tensor, weight: Tensor, bias: Tensor, groups: int, eps: float,  # type: ignore[override]
                silu: bool, dual: bool) -> tuple[Tensor, Tensor, Tensor]:
        c = _as_nsc(torch.cat([h, skip], dim=1))
        y, mean, rstd, y8 = _forward_op("group_norm_silu")(c, weight, bias, None, groups, eps, silu, False, dual)
        ctx.save_for_backward(c, weight, bias, mean, rstd)
        ctx.groups, ctx.silu, ctx.split = groups, silu, h.shape[1]
        ctx.mark_non_differentiable(y8)
        return c, y, y8

    @staticmethod
    def backward(ctx, dc: Tensor | None, dy: Tensor, _dy8: Tensor) -> tuple[Tensor | None, ...]:  # type: ignore[override]
        c, weight, bias, mean, rstd = ctx.saved_tensors
        dh, dw, db, _, dskip = torch.ops.medddpm.group_norm_silu_backward(dy, c, weight, bias, None, mean, rstd,
                                                                          ctx.groups, ctx.silu, dc, ctx.split)
        return dh, dskip, dw, db, None, None, None, None


def _check_norm_args(shape: tuple[int, ...], groups: int, add: Tensor | None) -> None:
    """One clear error for channels (``shape`` is (N, C, …)) that do not split into ``groups`` or an
    ``add`` that is not (N, C)."""
    n, c = shape[:2]
    if c % groups:
        raise ValueError(f"{c} channels do not split into {groups} groups")
    if add is not None and tuple(add.shape) != (n, c):
        raise ValueError(f"add must be (N, C) = {(n, c)}, got {tuple(add.shape)}")


def reference_e4m3(x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                   silu: bool = True, add: Tensor | None = None) -> Tensor:
    """The E4M3 copy ``group_norm_silu_dual`` writes: SiLU(GroupNorm(x + add)) in fp32, quantized
    without passing through x's dtype, no gradient."""
    with torch.no_grad():
        return reference_group_norm_silu(x.float(), groups, weight.float(), bias.float(), eps, silu,
                                         None if add is None else add.float(), fp8=True)


def _out_dtype(x: Tensor, fp8: bool) -> torch.dtype:
    """The dtype of a kernel's output: ``x``'s, or E4M3 for an FP8 convolution after it."""
    return E4M3 if fp8 else x.dtype


def _no_fp8_grad(fp8: bool, *inputs: Tensor) -> None:
    """An E4M3 output is the sampler's: refuse it where autograd would need its backward."""
    if fp8 and torch.is_grad_enabled() and any(t.requires_grad for t in inputs):
        raise ValueError("an E4M3 (fp8) output has no backward: it is for sampling, under torch.no_grad or "
                         "inference_mode")


def _as_nsc(t: Tensor) -> Tensor:
    """``t`` (N, C, *spatial) stored channels-last (a copy only if it is not already)."""
    return t if t.movedim(1, -1).is_contiguous() else t.movedim(1, -1).contiguous().movedim(-1, 1)


@functools.lru_cache(maxsize=None)
def _sm_count(device: torch.device) -> int:
    return torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 2


def _shape(x: Tensor) -> tuple[int, int, int, int]:
    """(N, S, C, BLOCK_C) of ``x`` seen as (N, S, C), BLOCK_C the channels padded to a power of two."""
    n, c = x.shape[:2]
    return n, x.numel() // max(n * c, 1), c, triton.next_power_of_2(c)


def _rows(tile: int, *widths: int, least: int = 1) -> int:
    """Rows (voxels) of a ``tile``-element block as wide as the widest of ``widths``, at least ``least``."""
    return max(least, tile // max(widths))


def _reduction(x: Tensor, tile: int, sums: int) -> tuple[int, int, int, int, int, int, Tensor]:
    """(N, S, C, BLOCK_C, BLOCK_S, rows per program, partials) of a reduction kernel over ``x``'s
    rows, ``tile`` elements per loop step; partials is the (N, P, ``sums``, C) fp32 buffer it fills."""
    n, s, c, block_c = _shape(x)
    block_s = _rows(tile, block_c)
    enough = triton.cdiv(s * c * x.element_size(), TILES.program_bytes) if TILES.program_bytes else s
    p, rows = _chunks(s, block_s, min(TILES.programs_per_sm * _sm_count(x.device) // n, enough))
    return n, s, c, block_c, block_s, rows, torch.empty(n, p, sums, c, device=x.device, dtype=torch.float32)


def _chunks(s: int, block_s: int, programs: int) -> tuple[int, int]:
    """(programs P, rows per program) of a reduction over ``s`` rows split among about ``programs``
    programs (at least one), each a whole number of ``block_s`` row tiles."""
    rows = triton.cdiv(triton.cdiv(s, max(1, programs)), block_s) * block_s
    return triton.cdiv(s, rows), rows



_COUNTERS: dict[torch.device, Tensor] = {}  # per device: int32 arrival counters, zero between launches
_MIN_COUNTERS = 64  # the smallest counter buffer allocated
_OUTGROWN: list[Tensor] = []  # counter buffers a larger launch replaced, kept alive: a CUDA graph captured before
# holds their address, and replaying it against freed memory would race whatever took it over


def _partial_rows(part: Tensor, block_c: int) -> int:
    """BLOCK_P of a two-level reduction over ``part``'s P rows per sample ((N, P, sums, C)): the
    group size, a power of two within ``Tiles.partial_tile``: all P rows when they fit one tile
    (one group), else about √P (each level then sums one tile of rows)."""
    fits = 1 << (max(1, TILES.partial_tile // block_c).bit_length() - 1)
    p = part.shape[1]
    return triton.next_power_of_2(p) if p <= fits else min(fits, triton.next_power_of_2(math.isqrt(p - 1) + 1))


def _arrival_counters(part: Tensor, block_p: int) -> Tensor:
    """The counters of a two-level reduction over ``part`` (N samples × groups, then the tops;
    ``_last_to_arrive``): zero before every launch, because each launch's last programs store 0
    back; launches of one stream run one after another, so they share them. Allocated on first
    use (a warm-up, before a CUDA graph captures the launches that then read them)."""
    n, p = part.shape[:2]
    need = n * triton.cdiv(p, block_p) + n
    c = _COUNTERS.get(part.device)
    if c is None or c.numel() < need:
        if c is not None:
            _OUTGROWN.append(c)
        c = _COUNTERS[part.device] = torch.zeros(max(need, _MIN_COUNTERS), dtype=torch.int32, device=part.device)
    return c


def _dense_like(t: Tensor) -> Tensor:
    """An empty tensor of ``t``'s shape and dtype, row-major (the addend's gradient, whatever its layout)."""
    return t.new_empty(t.shape)


def _split_grads(x: Tensor, split: int) -> tuple[Tensor, Tensor]:
    """(dx, dx2) of the norm's backward: x's shape and layout (dx2 empty), or with ``split`` > 0 the
    gradients of a concatenation's inputs, its first ``split`` channels and the rest, each dense
    channels-last."""
    n, c = x.shape[:2]
    if not split:
        return torch.empty_like(x), x.new_empty(0)
    if not 0 < split < c:
        raise ValueError(f"split must lie between 0 and the {c} channels, got {split}")
    return tuple(x.new_empty((n, *x.shape[2:], k)).movedim(-1, 1) for k in (split, c - split))


def _addend(add: Tensor | None, x: Tensor) -> tuple[Tensor, int]:
    """(tensor, row stride) the kernels read a (N, C) addend from: ``add`` itself when its channels
    are adjacent (a column slice of a wider table too), else a copy; ``x`` and 0 without one."""
    if add is None:
        return x, 0
    add = add if add.stride(1) == 1 else add.contiguous()
    return add, add.stride(0)

if triton is not None:

    @triton.jit
    def _xhat_coeffs(mean_ptr, rstd_ptr, add_ptr, w_ptr, b_ptr, n, cols, cmask, C, G, add_stride,
                     HAS_ADD: tl.constexpr):
        """Per channel (r, o, w, b) with x̂ = x·r + o and z = x̂·w + b: r = rstd of the channel's
        group, o = (add − mean)·r (the addend's row n at ``add_stride``)."""
        g = cols // (C // G)
        r = tl.load(rstd_ptr + n * G + g, mask=cmask, other=0.0)
        o = -tl.load(mean_ptr + n * G + g, mask=cmask, other=0.0) * r
        if HAS_ADD:
            o += tl.load(add_ptr + n * add_stride + cols, mask=cmask, other=0.0).to(tl.float32) * r
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        b = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        return r, o, w, b

    @triton.jit
    def _dz(dy, xh, w, b, SILU: tl.constexpr):
        """∂L/∂z for z = x̂·w + b from ∂L/∂y, y = SiLU(z) (or y = z)."""
        if SILU:
            z = xh * w + b
            sig = tl.sigmoid(z)
            return dy * sig * (1.0 + z * (1.0 - sig))
        return dy

    @triton.jit
    def _group_onehot(cols, cmask, C, G, BLOCK_G: tl.constexpr):
        """[BLOCK_G, BLOCK_C] float matrix: 1 where channel c belongs to group g."""
        gs = tl.arange(0, BLOCK_G)
        return tl.where(((cols[None, :] // (C // G)) == gs[:, None]) & cmask[None, :], 1.0, 0.0)

    @triton.jit
    def _last_to_arrive(count_ptr, total):
        """True in the one program of ``total`` that arrives last at ``*count_ptr`` (int32, zero
        before the launch), after every program's stores: each arrives once its threads have
        stored (barrier, then a release/acquire add at GPU scope, so the last one sees them all).
        That program must store 0 back for the next launch."""
        tl.debug_barrier()
        return tl.atomic_add(count_ptr, 1, sem="acq_rel", scope="gpu") == total - 1

    @triton.jit
    def _sum_rows(ptr, first, step, count, C, cols, cmask, BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr):
        """Σ_i ptr[first + i·step, :C] over i < ``count``: other programs' partial sums, read from L2
        (``.cg``, never a stale L1 line) and added in a fixed order (deterministic)."""
        ps = tl.arange(0, BLOCK_P)
        acc = tl.zeros([BLOCK_P, BLOCK_C], tl.float32)
        for i in range(0, count, BLOCK_P):
            rows = i + ps
            m = (rows < count)[:, None] & cmask[None, :]
            acc += tl.load(ptr + (first + rows * step)[:, None] * C + cols[None, :], mask=m, other=0.0,
                           cache_modifier=".cg")
        return tl.sum(acc, 0)

    @triton.jit
    def _group_done(part_ptr, count_ptr, n, p, P, SUMS: tl.constexpr, C, cols, cmask, BLOCK_P: tl.constexpr,
                    BLOCK_C: tl.constexpr):
        """First level of a two-level arrival: programs p of sample n arrive in groups of BLOCK_P
        (counter n·NG + g); the last of a group adds the group's partial rows (n, p, SUMS, C) into
        its first row and returns True (then arrives at the second level). With BLOCK_P ≈ √P each
        level sums one tile of rows, where one program summing all P rows waits on L2 P/BLOCK_P times
        (3.5 ms of norm kernels a denoising step instead of 2.7 on an H200)."""
        g = p // BLOCK_P
        members = tl.minimum(BLOCK_P, P - g * BLOCK_P)
        counter = count_ptr + n * tl.cdiv(P, BLOCK_P) + g
        done = _last_to_arrive(counter, members)
        if done:
            first = (n * P + g * BLOCK_P) * SUMS
            for j in tl.static_range(SUMS):
                total = _sum_rows(part_ptr, first + j, SUMS, members, C, cols, cmask, BLOCK_P, BLOCK_C)
                tl.store(part_ptr + (first + j) * C + cols, total, mask=cmask)
            tl.store(counter, 0)
        return done

    @triton.jit
    def _stats_kernel(x_ptr, part_ptr, count_ptr, add_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, scale_ptr, shift_ptr,
                      S, C, G, rows_per_prog, add_stride, eps, HAS_ADD: tl.constexpr, BLOCK_S: tl.constexpr,
                      BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr, STAGES: tl.constexpr):
        """Per (row chunk p, sample n): each channel's Σ (x − ref) and Σ (x − ref)², ref = the
        sample's first voxel (one shift for every chunk, so the partial sums simply add up; a shift
        inside the data's range keeps Σd² − (Σd)²/S from cancelling). One read of x. The sample's
        last program to finish (two levels: ``_group_done``) finalizes (``_finalize_stats``): one launch."""
        p = tl.program_id(0)
        n = tl.program_id(1)
        P = tl.num_programs(0)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        base = x_ptr + n.to(tl.int64) * S * C
        ref = tl.load(base + cols, mask=cmask, other=0.0).to(tl.float32)
        start = p * rows_per_prog
        acc = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
        acc2 = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
        for i in tl.range(0, rows_per_prog, BLOCK_S, num_stages=STAGES):
            rows = start + i + tl.arange(0, BLOCK_S)
            m = (rows < S)[:, None] & cmask[None, :]
            v = tl.load(base + rows.to(tl.int64)[:, None] * C + cols[None, :], mask=m, other=0.0).to(tl.float32)
            d = tl.where(m, v - ref[None, :], 0.0)
            acc += d
            acc2 += d * d
        out = part_ptr + ((n * P + p) * 2) * C + cols
        tl.store(out, tl.sum(acc, 0), mask=cmask)
        tl.store(out + C, tl.sum(acc2, 0), mask=cmask)
        ng = tl.cdiv(P, BLOCK_P)
        if _group_done(part_ptr, count_ptr, n, p, P, 2, C, cols, cmask, BLOCK_P, BLOCK_C):
            top = count_ptr + tl.num_programs(1) * ng + n
            if _last_to_arrive(top, ng):
                s = _sum_rows(part_ptr, n * P * 2, 2 * BLOCK_P, ng, C, cols, cmask, BLOCK_P, BLOCK_C)
                q = _sum_rows(part_ptr, n * P * 2 + 1, 2 * BLOCK_P, ng, C, cols, cmask, BLOCK_P, BLOCK_C)
                _finalize_stats(s, q, ref, n, cols, cmask, add_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, scale_ptr,
                                shift_ptr, S, C, G, add_stride, eps, HAS_ADD, BLOCK_G)
                tl.store(top, 0)

    @triton.jit
    def _finalize_stats(s, q, ref, n, cols, cmask, add_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, scale_ptr, shift_ptr,
                        S, C, G, add_stride, eps, HAS_ADD: tl.constexpr, BLOCK_G: tl.constexpr):
        """Sample n's statistics from its summed partials ``s`` = Σ(x − ref), ``q`` = Σ(x − ref)²
        per channel: channel means and squared deviations, group mean and rstd (law of total
        variance, equal counts per channel), and the apply's per-channel scale and shift (the
        addend, row ``n`` of a (N, C) tensor with row stride ``add_stride``, folded into the shift)."""
        d = s / S
        mean_c = ref + d  # of x, without the addend
        var_c = tl.maximum(q / S - d * d, 0.0)
        if HAS_ADD:
            a = tl.load(add_ptr + n * add_stride + cols, mask=cmask, other=0.0).to(tl.float32)
            mean_c += a
        onehot = _group_onehot(cols, cmask, C, G, BLOCK_G)
        cpg = C // G
        mean_g = tl.sum(onehot * mean_c[None, :], 1) / cpg
        mean_gc = tl.sum(onehot * mean_g[:, None], 0)
        dev = mean_c - mean_gc
        var_g = tl.sum(onehot * (var_c + dev * dev)[None, :], 1) / cpg
        rstd_g = 1.0 / tl.sqrt(var_g + eps)
        gs = tl.arange(0, BLOCK_G)
        tl.store(mean_ptr + n * G + gs, mean_g, mask=gs < G)
        tl.store(rstd_ptr + n * G + gs, rstd_g, mask=gs < G)
        scale = tl.sum(onehot * rstd_g[:, None], 0) * tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        shift = tl.load(b_ptr + cols, mask=cmask, other=0.0).to(tl.float32) - mean_gc * scale
        if HAS_ADD:
            shift += a * scale
        tl.store(scale_ptr + n * C + cols, scale, mask=cmask)
        tl.store(shift_ptr + n * C + cols, shift, mask=cmask)

    _E4M3_MAX = tl.constexpr(E4M3_MAX)  # a global a kernel reads must be a constexpr

    @triton.jit
    def _e4m3_rounded(z):
        """``z`` saturated at ±448 and rounded to the nearest E4M3 value (ties to even) in fp32, so
        that the cast after it is exact on any backend (Triton's CPU interpreter rounds 7.99 to 4):
        20 of fp32's 23 mantissa bits rounded away in the integer view (a carry moves into the
        exponent), and below 2⁻⁶, E4M3's subnormals, multiples of 2⁻⁹ (1.5·2²³ added and taken
        away rounds to an integer)."""
        z = tl.minimum(tl.maximum(z, -_E4M3_MAX), _E4M3_MAX)
        bits = z.to(tl.int32, bitcast=True)
        bits = (bits + 0x7FFFF + ((bits >> 20) & 1)) & -0x100000
        sub = ((z * 512.0 + 12582912.0) - 12582912.0) * 0.001953125
        return tl.where(tl.abs(z) < 0.015625, sub, bits.to(tl.float32, bitcast=True))

    @triton.jit
    def _apply_kernel(x_ptr, y_ptr, y8_ptr, scale_ptr, shift_ptr, S, C, SILU: tl.constexpr,
                      BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr, FP8: tl.constexpr, DUAL: tl.constexpr):
        """y = SiLU(x·scale + shift) per channel (one read of x, one write of y); FP8: y is E4M3,
        saturated at ±448; DUAL: y8 is an E4M3 copy of the same values, written beside y."""
        t = tl.program_id(0)
        n = tl.program_id(1)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        rows = t * BLOCK_S + tl.arange(0, BLOCK_S)
        m = (rows < S)[:, None] & cmask[None, :]
        off = n.to(tl.int64) * S * C + rows.to(tl.int64)[:, None] * C + cols[None, :]
        z = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32)
        z = z * tl.load(scale_ptr + n * C + cols, mask=cmask, other=0.0)[None, :] \
            + tl.load(shift_ptr + n * C + cols, mask=cmask, other=0.0)[None, :]
        if SILU:
            z = z * tl.sigmoid(z)
        if DUAL:
            tl.store(y8_ptr + off, _e4m3_rounded(z).to(y8_ptr.dtype.element_ty), mask=m)
        if FP8:
            z = _e4m3_rounded(z)
        tl.store(y_ptr + off, z.to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _bwd_reduce_kernel(dy_ptr, x_ptr, add_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, part_ptr, count_ptr, k1_ptr,
                           k2_ptr, k3_ptr, dw_ptr, db_ptr, dadd_ptr, S, C, G, rows_per_prog, add_stride,
                           SILU: tl.constexpr,
                           HAS_ADD: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                           BLOCK_G: tl.constexpr, BLOCK_P: tl.constexpr, STAGES: tl.constexpr):
        """Per (row chunk, sample): each channel's Σ dz, Σ dz·x̂ and Σ x̂ (one read of dy and x); the
        launch's last program to finish (two levels: ``_group_done``) finalizes (``_bwd_finalize``)."""
        p = tl.program_id(0)
        n = tl.program_id(1)
        P = tl.num_programs(0)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        r, o, w, b = _xhat_coeffs(mean_ptr, rstd_ptr, add_ptr, w_ptr, b_ptr, n, cols, cmask, C, G, add_stride, HAS_ADD)
        base = n.to(tl.int64) * S * C
        start = p * rows_per_prog
        acc_dz = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
        acc_dzx = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
        acc_xh = tl.zeros([BLOCK_S, BLOCK_C], tl.float32)
        for i in tl.range(0, rows_per_prog, BLOCK_S, num_stages=STAGES):
            rows = start + i + tl.arange(0, BLOCK_S)
            m = (rows < S)[:, None] & cmask[None, :]
            off = base + rows.to(tl.int64)[:, None] * C + cols[None, :]
            xh = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32) * r[None, :] + o[None, :]
            dz = _dz(tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32), xh, w[None, :], b[None, :], SILU)
            xh = tl.where(m, xh, 0.0)
            dz = tl.where(m, dz, 0.0)
            acc_dz += dz
            acc_dzx += dz * xh
            acc_xh += xh
        out = part_ptr + ((n * P + p) * 3) * C + cols
        tl.store(out, tl.sum(acc_dz, 0), mask=cmask)
        tl.store(out + C, tl.sum(acc_dzx, 0), mask=cmask)
        tl.store(out + 2 * C, tl.sum(acc_xh, 0), mask=cmask)
        N = tl.num_programs(1)
        if _group_done(part_ptr, count_ptr, n, p, P, 3, C, cols, cmask, BLOCK_P, BLOCK_C):
            top = count_ptr + N * tl.cdiv(P, BLOCK_P)
            if _last_to_arrive(top, N * tl.cdiv(P, BLOCK_P)):
                _bwd_finalize(part_ptr, P, w, rstd_ptr, k1_ptr, k2_ptr, k3_ptr, dw_ptr, db_ptr, dadd_ptr, N, S, C, G,
                              cols, cmask, HAS_ADD, BLOCK_C, BLOCK_G, BLOCK_P)
                tl.store(top, 0)

    @triton.jit
    def _bwd_finalize(part_ptr, P, w, rstd_ptr, k1_ptr, k2_ptr, k3_ptr, dw_ptr, db_ptr, dadd_ptr, N, S, C, G, cols,
                      cmask, HAS_ADD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr,
                      BLOCK_P: tl.constexpr):
        """From the (N, P, 3, C) partials (each group of BLOCK_P rows already summed into its first):
        per sample, dx = k1·dz + k2·x̂ + k3 with k1 = rstd·w, k2 = −rstd·mean_g(w·dz·x̂),
        k3 = −rstd·mean_g(w·dz); dw = Σ dz·x̂ and db = Σ dz over samples; d(add) = Σ_voxels dx =
        k1·Σdz + k2·Σx̂ + k3·S."""
        onehot = _group_onehot(cols, cmask, C, G, BLOCK_G)
        count = S * (C // G) * 1.0
        dw = tl.zeros([BLOCK_C], tl.float32)
        db = tl.zeros([BLOCK_C], tl.float32)
        ng = tl.cdiv(P, BLOCK_P)
        for n in range(0, N):  # each group's sums are in its first row (``_group_done``)
            a = _sum_rows(part_ptr, n * P * 3, 3 * BLOCK_P, ng, C, cols, cmask, BLOCK_P, BLOCK_C)
            bsum = _sum_rows(part_ptr, n * P * 3 + 1, 3 * BLOCK_P, ng, C, cols, cmask, BLOCK_P, BLOCK_C)
            xs = _sum_rows(part_ptr, n * P * 3 + 2, 3 * BLOCK_P, ng, C, cols, cmask, BLOCK_P, BLOCK_C)
            dw += bsum
            db += a
            c1 = tl.sum(onehot * tl.sum(onehot * (w * a)[None, :], 1)[:, None], 0) / count
            c2 = tl.sum(onehot * tl.sum(onehot * (w * bsum)[None, :], 1)[:, None], 0) / count
            r = tl.load(rstd_ptr + n * G + cols // (C // G), mask=cmask, other=0.0)
            k1 = r * w
            k2 = -r * c2
            k3 = -r * c1
            tl.store(k1_ptr + n * C + cols, k1, mask=cmask)
            tl.store(k2_ptr + n * C + cols, k2, mask=cmask)
            tl.store(k3_ptr + n * C + cols, k3, mask=cmask)
            if HAS_ADD:
                dadd = k1 * a + k2 * xs + k3 * S
                tl.store(dadd_ptr + n * C + cols, dadd.to(dadd_ptr.dtype.element_ty), mask=cmask)
        tl.store(dw_ptr + cols, dw.to(dw_ptr.dtype.element_ty), mask=cmask)
        tl.store(db_ptr + cols, db.to(db_ptr.dtype.element_ty), mask=cmask)

    @triton.jit
    def _bwd_dx_kernel(dy_ptr, x_ptr, dx_ptr, add_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, k1_ptr, k2_ptr, k3_ptr,
                       extra_ptr, dx2_ptr, S, C, G, add_stride, split, SILU: tl.constexpr, HAS_ADD: tl.constexpr,
                       HAS_EXTRA: tl.constexpr, SPLIT: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
        """dx = k1·dz + k2·x̂ + k3 (one read of dy and x, one write of dx); HAS_EXTRA: + extra, x's
        gradient from its other consumers (one more read); SPLIT: channels < ``split`` written to
        dx (N, S, split) and the rest to dx2 (N, S, C − split), the gradients of a concatenation's
        two inputs, each dense."""
        t = tl.program_id(0)
        n = tl.program_id(1)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        r, o, w, b = _xhat_coeffs(mean_ptr, rstd_ptr, add_ptr, w_ptr, b_ptr, n, cols, cmask, C, G, add_stride, HAS_ADD)
        rows = t * BLOCK_S + tl.arange(0, BLOCK_S)
        m = (rows < S)[:, None] & cmask[None, :]
        off = n.to(tl.int64) * S * C + rows.to(tl.int64)[:, None] * C + cols[None, :]
        xh = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32) * r[None, :] + o[None, :]
        dz = _dz(tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32), xh, w[None, :], b[None, :], SILU)
        dx = dz * tl.load(k1_ptr + n * C + cols, mask=cmask, other=0.0)[None, :] \
            + xh * tl.load(k2_ptr + n * C + cols, mask=cmask, other=0.0)[None, :] \
            + tl.load(k3_ptr + n * C + cols, mask=cmask, other=0.0)[None, :]
        if HAS_EXTRA:
            dx += tl.load(extra_ptr + off, mask=m, other=0.0).to(tl.float32)
        if SPLIT:
            left = cols < split
            r64 = rows.to(tl.int64)[:, None]
            off1 = n.to(tl.int64) * S * split + r64 * split + cols[None, :]
            tl.store(dx_ptr + off1, dx.to(dx_ptr.dtype.element_ty), mask=m & left[None, :])
            off2 = n.to(tl.int64) * S * (C - split) + r64 * (C - split) + (cols - split)[None, :]
            tl.store(dx2_ptr + off2, dx.to(dx2_ptr.dtype.element_ty), mask=m & (cols >= split)[None, :])
        else:
            tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)

    @_forward("group_norm_silu")
    def _gn_forward(x: Tensor, weight: Tensor, bias: Tensor, add: Tensor | None, groups: int, eps: float,
                    silu: bool, fp8: bool = False, dual: bool = False) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(y, group mean, group rstd, y8) of SiLU(GroupNorm(x + add)); x channels-last; y in E4M3 with
        ``fp8``; y8 the bytes of an E4M3 copy of y with ``dual`` (uint8, so that no float output has a
        dtype autograd cannot promote; ``.view(E4M3)`` reads it), else empty."""
        x = _as_nsc(x)
        tiles = TILES
        n, s, c, block_c, block_s, rows, part = _reduction(x, tiles.stats_tile, 2)
        f32 = dict(device=x.device, dtype=torch.float32)
        mean, rstd = torch.empty(n, groups, **f32), torch.empty(n, groups, **f32)
        scale, shift = torch.empty(n, c, **f32), torch.empty(n, c, **f32)
        addend, add_stride = _addend(add, x)
        block_p = _partial_rows(part, block_c)
        _launch(_stats_kernel, (part.shape[1], n), x, part, _arrival_counters(part, block_p), addend, weight, bias, mean, rstd,
                scale, shift, s, c, groups, rows, add_stride, eps, HAS_ADD=add is not None,
                BLOCK_S=block_s, BLOCK_C=block_c, BLOCK_G=triton.next_power_of_2(groups),
                BLOCK_P=block_p, STAGES=tiles.stages, num_warps=tiles.stats_warps)
        y = torch.empty_like(x, dtype=_out_dtype(x, fp8))
        y8 = torch.empty_like(x, dtype=E4M3) if dual else x.new_empty(0, dtype=E4M3)  # returned as its bytes
        apply_s = _rows(tiles.apply_tile, block_c)
        _launch(_apply_kernel, (triton.cdiv(s, apply_s), n), x, y, y8 if dual else y, scale, shift, s, c, SILU=silu,
                BLOCK_S=apply_s, BLOCK_C=block_c, FP8=fp8, DUAL=dual,
                num_warps=tiles.apply_warps)
        return y, mean, rstd, y8.view(torch.uint8)

    @_gn_forward.register_fake
    def _(x, weight, bias, add, groups, eps, silu, fp8=False, dual=False):
        n = x.shape[0]
        return (torch.empty_like(x, dtype=_out_dtype(x, fp8)), x.new_empty((n, groups), dtype=torch.float32),
                x.new_empty((n, groups), dtype=torch.float32),
                torch.empty_like(x, dtype=torch.uint8) if dual else x.new_empty(0, dtype=torch.uint8))

    @torch.library.custom_op("medddpm::group_norm_silu_backward", mutates_args=())
    def _gn_backward(dy: Tensor, x: Tensor, weight: Tensor, bias: Tensor, add: Tensor | None, mean: Tensor,
                     rstd: Tensor, groups: int, silu: bool, extra: Tensor | None = None,
                     split: int = 0) -> tuple[Tensor, Tensor, Tensor, Tensor, Tensor]:
        """(dx, dweight, dbias, dadd, dx2) of ``group_norm_silu``; dadd is empty when there is no
        addend. ``extra``: a gradient of x from its other consumers, added in the dx pass. ``split``
        > 0: x is a concatenation along the channels and dx holds the gradient of its first
        ``split`` channels, dx2 of the rest, each dense channels-last (else dx2 is empty)."""
        x, dy = _as_nsc(x), _as_nsc(dy)
        tiles = TILES
        n, s, c, block_c, block_s, rows, part = _reduction(x, tiles.reduce_tile, 3)
        f32 = dict(device=x.device, dtype=torch.float32)
        has_add = add is not None
        addend, add_stride = _addend(add, x)
        k1, k2, k3 = (torch.empty(n, c, **f32) for _ in range(3))
        dw, db = torch.empty_like(weight), torch.empty_like(bias)
        dadd = _dense_like(add) if has_add else x.new_empty(0)
        block_p = _partial_rows(part, block_c)
        _launch(_bwd_reduce_kernel, (part.shape[1], n), dy, x, addend, weight, bias, mean, rstd, part,
                _arrival_counters(part, block_p), k1, k2, k3, dw, db,
                dadd if has_add else k1, s, c, groups, rows, add_stride, SILU=silu,
                HAS_ADD=has_add, BLOCK_S=block_s, BLOCK_C=block_c,
                BLOCK_G=triton.next_power_of_2(groups), BLOCK_P=block_p,
                STAGES=tiles.stages, num_warps=tiles.reduce_warps)
        dx, dx2 = _split_grads(x, split)
        dx_s = _rows(tiles.dx_tile, block_c)
        _launch(_bwd_dx_kernel, (triton.cdiv(s, dx_s), n), dy, x, dx, addend, weight, bias, mean, rstd, k1, k2, k3,
                x if extra is None else _as_nsc(extra), dx2, s, c, groups,
                add_stride, split, SILU=silu, HAS_ADD=has_add,
                HAS_EXTRA=extra is not None, SPLIT=split > 0, BLOCK_S=dx_s,
                BLOCK_C=block_c, num_warps=tiles.dx_warps)
        return dx, dw, db, dadd, dx2

    @_gn_backward.register_fake
    def _(dy, x, weight, bias, add, mean, rstd, groups, silu, extra=None, split=0):
        dx, dx2 = _split_grads(x, split)
        dadd = _dense_like(add) if add is not None else x.new_empty(0)
        return dx, torch.empty_like(weight), torch.empty_like(bias), dadd, dx2

    def _setup_context(ctx, inputs, output) -> None:
        x, weight, bias, add, groups, eps, silu, _fp8, _dual = inputs
        _, mean, rstd, y8 = output
        ctx.save_for_backward(x, weight, bias, add, mean, rstd)
        ctx.groups, ctx.silu = groups, silu
        ctx.mark_non_differentiable(mean, rstd, y8)

    def _backward(ctx, dy, _dmean, _drstd, _dy8):
        x, weight, bias, add, mean, rstd = ctx.saved_tensors
        dx, dw, db, dadd, _ = torch.ops.medddpm.group_norm_silu_backward(dy, x, weight, bias, add, mean, rstd,
                                                                         ctx.groups, ctx.silu)
        return dx, dw, db, (None if add is None else dadd), None, None, None, None, None

    _gn_forward.register_autograd(_backward, setup_context=_setup_context)


# ---------------------------------------------------------------------------------------------
# Thin 3³ convolutions: the stem (3 channels in) and the output convolution (1 channel out).
#
# cuDNN runs these at 4–35 TFLOP/s (its small-channel kernels: a weight gradient of 1.8 ms for the
# output convolution at 128³, ``fast_path/layers.csv``), though each pass only has to stream its
# wide side (64 channels) once. Here each pass is matrix products over tiles of voxels:
#
# - a thin *input* (≤ THIN channels): its 27 neighbours are gathered into one row per voxel,
#   column tap·T + t (plus a column of ones for the bias), from a copy of the input with a zero
#   border and its channels padded to T, a power of two (each tap one aligned vector, no bounds
#   test), so the pass is (voxels × 27T+1) @ (27T+1 × C_out) — the wide output is written once;
# - a thin *output*: every voxel's products with all 27 taps at once, (voxels × C_in) @ (C_in ×
#   27·C_out), written tap-major in fp32, then y(v) = Σ_tap z_tap(v + offset(tap)) — the wide
#   input is read once, and the 27 shifted reads are of the 27·C_out-wide products;
# - the weight gradient: gather(thin side) @ (wide side), summed over voxels in per-program
#   partials (then ``torch.sum``: deterministic); the ones row gives the bias gradient.
#
# The data gradient of a convolution is a convolution of dy with the weight's taps mirrored and its
# channels swapped: the same forward kernels with the offsets negated (SIGN = −1).
# The reference is ``F.conv3d`` (and autograd's own convolution backward).
# ---------------------------------------------------------------------------------------------

TAPS = 27  # a 3×3×3 kernel


def thin_conv_supported(conv: torch.nn.Conv3d) -> bool:
    """True when ``conv`` is a convolution ``conv3d_thin`` computes: 3³ kernel, stride 1, zero
    padding 1, no dilation or groups, and at most ``THIN`` channels on one side."""
    return (tuple(conv.kernel_size) == (3, 3, 3) and tuple(conv.stride) == (1, 1, 1)
            and tuple(conv.padding) == (1, 1, 1) and tuple(conv.dilation) == (1, 1, 1) and conv.groups == 1
            and conv.padding_mode == "zeros" and min(conv.in_channels, conv.out_channels) <= THIN)


def conv3d_thin(x: Tensor, weight: Tensor, bias: Tensor | None = None) -> Tensor:
    """``F.conv3d(x, weight, bias, padding=1)`` for a 3³ kernel with at most ``THIN`` channels on
    one side, through the Triton kernels where they run (``runs_on``; x, weight and bias of one
    dtype), else through ``F.conv3d`` itself. The output is channels-last."""
    cout, cin = weight.shape[:2]
    if x.ndim != 5 or tuple(weight.shape[2:]) != (3, 3, 3) or x.shape[1] != cin:
        raise ValueError(f"conv3d_thin needs x (N, {cin}, D, H, W) and a 3³ weight, got x {tuple(x.shape)} "
                         f"and weight {tuple(weight.shape)}")
    if min(cin, cout) > THIN:
        raise ValueError(f"conv3d_thin needs at most {THIN} channels on one side, got {cin}→{cout}")
    if not runs_on(x) or weight.dtype != x.dtype or (bias is not None and bias.dtype != x.dtype):
        return torch.nn.functional.conv3d(x, weight, bias, padding=1)
    return _forward_op("conv3d_thin")(x, weight, bias)


def _per_tap(weight: Tensor, dgrad: bool) -> Tensor:
    """The weight as (27, K, M): the forward pass multiplies input channels K into output channels
    M per tap; the data gradient swaps them (K = C_out, M = C_in), dy being its input."""
    w = weight.flatten(2)  # (C_out, C_in, 27)
    return w.permute(2, 0, 1) if dgrad else w.permute(2, 1, 0)


def _exact_dot(t: Tensor) -> bool:
    """Products in fp32: for fp32 tensors (no TF32), and under Triton's interpreter, whose bf16
    ``tl.dot`` is wrong (Triton 3.9)."""
    return t.dtype == torch.float32 or INTERPRET


DOT_MIN = 16  # the smallest side of a tl.dot operand


def _pow2(n: int) -> int:
    """``n`` rounded up to a power of two, at least ``DOT_MIN``."""
    return max(DOT_MIN, triton.next_power_of_2(n))


def _zero_border(x: Tensor, channels: int | None = None) -> Tensor:
    """A channels-last (N, C, D, H, W) tensor as a contiguous (N, D+2, H+2, W+2, ``channels``) copy
    with a zero border one voxel wide (the 3³ convolution's zero padding, stored) and zero channels
    appended up to ``channels`` (default C): a thin tensor, few bytes."""
    extra = 0 if channels is None else channels - x.shape[1]
    return torch.nn.functional.pad(x.permute(0, 2, 3, 4, 1), (0, extra, 1, 1, 1, 1, 1, 1))


def _thin_pass(inp: Tensor, weight: Tensor, bias: Tensor | None, dgrad: bool) -> Tensor:
    """One forward-shaped pass: y = conv(inp) (``dgrad`` False) or dx = conv(dy) with the mirrored
    taps and swapped channels (``dgrad`` True); NDHWC out."""
    inp = _as_nsc(inp)
    taps = _per_tap(weight, dgrad)
    k, m = taps.shape[1:]
    n, _, d, h, w = inp.shape
    nv = n * d * h * w
    out = torch.empty((n, m, d, h, w), device=inp.device, dtype=inp.dtype, memory_format=torch.channels_last_3d)
    exact, warps = _exact_dot(inp), TILES.conv_warps
    if k <= THIN:  # thin input: one gathered product
        tp = triton.next_power_of_2(k)  # the gathered copy's channels: a tap's channels one aligned vector
        block_k, block_o = _pow2(TAPS * tp + 1), _pow2(m)
        mat = torch.zeros(block_k, block_o, device=inp.device, dtype=inp.dtype)
        mat[:TAPS * tp, :m].view(TAPS, tp, m)[:, :k] = taps
        if bias is not None:
            mat[TAPS * tp, :m] = bias
        rows = _rows(TILES.conv_tile, block_k, block_o, least=DOT_MIN)
        kernel = _tconv_dgrad_gather_kernel if dgrad else _tconv_fprop_gather_kernel
        padded = _zero_border(inp, tp)
        programs = triton.cdiv(nv, rows)  # one per tile of voxels, or fewer that loop over them
        if TILES.conv_programs_per_sm:
            programs = min(programs, TILES.conv_programs_per_sm * _sm_count(inp.device))
        _launch(kernel, (programs,), padded, mat, out, nv, d, h, w, tp, m, BLOCK_V=rows, BLOCK_K=block_k,
                BLOCK_O=block_o, IEEE=exact, WIDE=padded.numel() >= 2**31, num_warps=warps)
        return out
    # thin output: every voxel times every tap, then the shifted sum
    block_c, block_z = _pow2(k), _pow2(TAPS * m)
    mat = torch.zeros(block_c, block_z, device=inp.device, dtype=inp.dtype)
    mat[:k, :TAPS * m] = taps.permute(1, 0, 2).reshape(k, TAPS * m)
    z = torch.empty(TAPS * m, nv, device=inp.device, dtype=torch.float32)
    rows = _rows(TILES.conv_tile, block_c, block_z, least=DOT_MIN)
    kernel = _tconv_dgrad_products_kernel if dgrad else _tconv_fprop_products_kernel
    _launch(kernel, (triton.cdiv(nv, rows),), inp, mat, z, nv, k, TAPS * m, BLOCK_V=rows, BLOCK_C=block_c, BLOCK_Z=block_z,
            IEEE=exact, num_warps=warps)
    block_o = triton.next_power_of_2(m)
    rows = _rows(TILES.conv_tile, block_o)
    kernel = _tconv_dgrad_sum_kernel if dgrad else _tconv_fprop_sum_kernel
    _launch(kernel, (triton.cdiv(nv, rows),), z, z if bias is None else bias, out, nv, d, h, w, m, HAS_BIAS=bias is not None,
            BLOCK_V=rows, BLOCK_O=block_o, num_warps=warps)
    return out


def _thin_wgrad(dy: Tensor, x: Tensor, weight: Tensor, has_bias: bool) -> tuple[Tensor, Tensor]:
    """(dweight, dbias) of the thin convolution: Σ over voxels of gather(thin side) · (wide side),
    per-program partials summed by ``torch.sum``; dbias is empty without a bias."""
    dy, x = _as_nsc(dy), _as_nsc(x)
    cout, cin = weight.shape[:2]
    thin_is_input = cin <= cout
    thin, wide = (x, dy) if thin_is_input else (dy, x)
    t, cw = thin.shape[1], wide.shape[1]
    n, _, d, h, w = x.shape
    nv = n * d * h * w
    block_k, block_w = _pow2(TAPS * t + 1), _pow2(cw)
    rows = _rows(TILES.wgrad_tile, block_k, block_w, least=DOT_MIN)
    programs, per_prog = _chunks(nv, rows, TILES.wgrad_programs_per_sm * _sm_count(x.device))
    part = torch.empty(programs, block_k, block_w, device=x.device, dtype=torch.float32)
    padded = _zero_border(thin)
    _launch(_tconv_wgrad_kernel, (programs,), padded, wide, part, nv, d, h, w, t, cw, per_prog, SIGN=1 if thin_is_input else -1,
            BLOCK_V=rows, BLOCK_K=block_k, BLOCK_W=block_w, STAGES=TILES.stages,
            IEEE=_exact_dot(x), WIDE=padded.numel() >= 2**31, num_warps=TILES.wgrad_warps)
    acc = part.sum(0)  # [tap·T + thin channel, wide channel]; row 27·T sums the wide side
    dw = acc[:TAPS * t, :cw].reshape(TAPS, t, cw).permute(*((2, 1, 0) if thin_is_input else (1, 2, 0)))
    db = acc[TAPS * t, :cw] if thin_is_input else dy.sum(dim=(0, 2, 3, 4), dtype=torch.float32)
    dweight = torch.empty_like(weight)
    dweight.copy_(dw.reshape(weight.shape))
    return dweight, db.to(weight.dtype) if has_bias else weight.new_empty(0)


if triton is not None:

    @triton.jit
    def _voxel_coords(v, D, H, W):
        """(d, h, w) of flat voxel indices over (N, D, H, W)."""
        return (v // (H * W)) % D, (v // W) % H, v % W

    @triton.jit
    def _tap_offsets(tap, SIGN: tl.constexpr):
        """(dd, dh, dw) of tap index ``tap`` = 9·(dd+1) + 3·(dh+1) + (dw+1), times SIGN."""
        return SIGN * (tap // 9 - 1), SIGN * ((tap // 3) % 3 - 1), SIGN * (tap % 3 - 1)

    @triton.jit
    def _inside(d, h, w, dd, dh, dw, D, H, W):
        return (d + dd >= 0) & (d + dd < D) & (h + dh >= 0) & (h + dh < H) & (w + dw >= 0) & (w + dw < W)

    @triton.jit
    def _dot(a, b, IEEE: tl.constexpr):
        """a @ b accumulated in fp32; with IEEE the operands are multiplied in fp32 (no TF32 for fp32
        operands; bf16 products are exact in fp32 either way)."""
        if IEEE:
            return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision="ieee")
        return tl.dot(a, b)

    @triton.jit
    def _bordered_offsets(v, D, H, W, T, SIGN: tl.constexpr, BLOCK_K: tl.constexpr, WIDE: tl.constexpr):
        """(j, centre, tap) of a gather from a T-channel copy with a zero border one voxel wide,
        (N, D+2, H+2, W+2, T): gathered column j = tap·T + t of voxel v lies at centre[v] + tap[j]
        (SIGN·the tap's offset; every neighbour lies inside the copy). WIDE: int64 offsets."""
        j = tl.arange(0, BLOCK_K)
        dd, dh, dw = _tap_offsets(j // T, SIGN)
        tap = ((dd * (H + 2) + dh) * (W + 2) + dw) * T + j % T
        d, h, w = _voxel_coords(v, D, H, W)
        b = v // (D * H * W)
        if WIDE:
            b = b.to(tl.int64)
        return j, (((b * (D + 2) + d + 1) * (H + 2) + h + 1) * (W + 2) + w + 1) * T, tap

    @triton.jit
    def _padded_tap_gather(xp_ptr, v, valid, D, H, W, T, SIGN: tl.constexpr, BLOCK_K: tl.constexpr,
                           WIDE: tl.constexpr):
        """[BLOCK_K, BLOCK_V] of a T-channel NDHWC tensor: row tap·T + t holds channel t of the voxel
        SIGN·(tap's offset) away, row 27·T holds 1, the rest 0. Read from the tensor's copy with a
        zero border one voxel wide, (N, D+2, H+2, W+2, T): every neighbour lies inside it (the zero
        padding is stored), so a tap's offset is one number per row, a voxel's one per column, and
        the load needs no bounds test. Voxels run along the tile's fast axis, so neighbouring lanes
        load neighbouring voxels. WIDE: int64 offsets (a copy of 2³¹ elements or more)."""
        j, centre, tap = _bordered_offsets(v, D, H, W, T, SIGN, BLOCK_K, WIDE)
        a = tl.load(xp_ptr + (centre[None, :] + tap[:, None]), mask=valid[None, :] & (j < 27 * T)[:, None], other=0.0)
        return tl.where(valid[None, :] & (j == 27 * T)[:, None], 1.0, a).to(a.dtype)

    @triton.jit
    def _gather_conv(xp_ptr, m_ptr, y_ptr, NV, D, H, W, T: tl.constexpr, CO, SIGN: tl.constexpr,
                     BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_O: tl.constexpr, IEEE: tl.constexpr,
                     WIDE: tl.constexpr):
        """y[v, :CO] = gather(x)[v, :] · M over tiles of voxels (M: [BLOCK_K, BLOCK_O], bias in row
        27·T, loaded once per program, which then takes every num_programs-th tile), x read from its
        zero-bordered copy ``xp`` of T (a power of two) channels. The tile is voxels × taps with the
        taps along the fast axis: a tap's T channels are one aligned vector, and the three taps along
        W are neighbours in memory."""
        o = tl.arange(0, BLOCK_O)
        mat = tl.load(m_ptr + tl.arange(0, BLOCK_K)[:, None] * BLOCK_O + o[None, :])  # once per program
        for t in range(tl.program_id(0), tl.cdiv(NV, BLOCK_V), tl.num_programs(0)):  # tiles of voxels
            v = t * BLOCK_V + tl.arange(0, BLOCK_V)
            valid = v < NV
            j, centre, tap = _bordered_offsets(v, D, H, W, T, SIGN, BLOCK_K, WIDE)
            a = tl.load(xp_ptr + (centre[:, None] + tap[None, :]), mask=valid[:, None] & (j < 27 * T)[None, :],
                        other=0.0)
            a = tl.where(valid[:, None] & (j == 27 * T)[None, :], 1.0, a).to(a.dtype)
            y = _dot(a, mat, IEEE)
            tl.store(y_ptr + v.to(tl.int64)[:, None] * CO + o[None, :], y.to(y_ptr.dtype.element_ty),
                     mask=valid[:, None] & (o < CO)[None, :])

    @triton.jit
    def _tap_products(x_ptr, m_ptr, z_ptr, NV, CI, NZ, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
                      BLOCK_Z: tl.constexpr, IEEE: tl.constexpr):
        """z[tap·CO + o, v] = Σ_c x[v, c] · M[c, tap·CO + o] for one tile of voxels (fp32, tap-major)."""
        v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        valid = v < NV
        c = tl.arange(0, BLOCK_C)
        zc = tl.arange(0, BLOCK_Z)
        xs = tl.load(x_ptr + v.to(tl.int64)[:, None] * CI + c[None, :], mask=valid[:, None] & (c < CI)[None, :],
                     other=0.0)
        z = _dot(xs, tl.load(m_ptr + c[:, None] * BLOCK_Z + zc[None, :]), IEEE)
        tl.store(z_ptr + zc.to(tl.int64)[None, :] * NV + v[:, None], z, mask=valid[:, None] & (zc < NZ)[None, :])

    @triton.jit
    def _tap_sum(z_ptr, b_ptr, y_ptr, NV, D, H, W, CO, SIGN: tl.constexpr, HAS_BIAS: tl.constexpr,
                 BLOCK_V: tl.constexpr, BLOCK_O: tl.constexpr):
        """y[v, o] = Σ_tap z[tap·CO + o, v + SIGN·offset(tap)] (+ bias[o]) for one tile of voxels."""
        v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        valid = v < NV
        d, h, w = _voxel_coords(v, D, H, W)
        o = tl.arange(0, BLOCK_O)
        acc = tl.zeros([BLOCK_V, BLOCK_O], tl.float32)
        for tap in tl.static_range(27):
            dd, dh, dw = _tap_offsets(tap, SIGN)
            m = valid & _inside(d, h, w, dd, dh, dw, D, H, W)
            row = (tap * CO + o).to(tl.int64) * NV
            acc += tl.load(z_ptr + row[None, :] + (v + (dd * H * W + dh * W + dw))[:, None],
                           mask=m[:, None] & (o < CO)[None, :], other=0.0)
        if HAS_BIAS:
            acc += tl.load(b_ptr + o, mask=o < CO, other=0.0).to(tl.float32)[None, :]
        tl.store(y_ptr + v.to(tl.int64)[:, None] * CO + o[None, :], acc.to(y_ptr.dtype.element_ty),
                 mask=valid[:, None] & (o < CO)[None, :])

    # One kernel per pass, so that profiles (and ``medddpm.profiling.layers``) can tell the passes apart.
    @triton.jit
    def _tconv_fprop_gather_kernel(xp_ptr, m_ptr, y_ptr, NV, D, H, W, T: tl.constexpr, CO, BLOCK_V: tl.constexpr,
                                   BLOCK_K: tl.constexpr, BLOCK_O: tl.constexpr, IEEE: tl.constexpr,
                                   WIDE: tl.constexpr):
        _gather_conv(xp_ptr, m_ptr, y_ptr, NV, D, H, W, T, CO, 1, BLOCK_V, BLOCK_K, BLOCK_O, IEEE, WIDE)

    @triton.jit
    def _tconv_dgrad_gather_kernel(xp_ptr, m_ptr, y_ptr, NV, D, H, W, T: tl.constexpr, CO, BLOCK_V: tl.constexpr,
                                   BLOCK_K: tl.constexpr, BLOCK_O: tl.constexpr, IEEE: tl.constexpr,
                                   WIDE: tl.constexpr):
        _gather_conv(xp_ptr, m_ptr, y_ptr, NV, D, H, W, T, CO, -1, BLOCK_V, BLOCK_K, BLOCK_O, IEEE, WIDE)

    @triton.jit
    def _tconv_fprop_products_kernel(x_ptr, m_ptr, z_ptr, NV, CI, NZ, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
                                     BLOCK_Z: tl.constexpr, IEEE: tl.constexpr):
        _tap_products(x_ptr, m_ptr, z_ptr, NV, CI, NZ, BLOCK_V, BLOCK_C, BLOCK_Z, IEEE)

    @triton.jit
    def _tconv_dgrad_products_kernel(x_ptr, m_ptr, z_ptr, NV, CI, NZ, BLOCK_V: tl.constexpr, BLOCK_C: tl.constexpr,
                                     BLOCK_Z: tl.constexpr, IEEE: tl.constexpr):
        _tap_products(x_ptr, m_ptr, z_ptr, NV, CI, NZ, BLOCK_V, BLOCK_C, BLOCK_Z, IEEE)

    @triton.jit
    def _tconv_fprop_sum_kernel(z_ptr, b_ptr, y_ptr, NV, D, H, W, CO, HAS_BIAS: tl.constexpr, BLOCK_V: tl.constexpr,
                                BLOCK_O: tl.constexpr):
        _tap_sum(z_ptr, b_ptr, y_ptr, NV, D, H, W, CO, 1, HAS_BIAS, BLOCK_V, BLOCK_O)

    @triton.jit
    def _tconv_dgrad_sum_kernel(z_ptr, b_ptr, y_ptr, NV, D, H, W, CO, HAS_BIAS: tl.constexpr, BLOCK_V: tl.constexpr,
                                BLOCK_O: tl.constexpr):
        _tap_sum(z_ptr, b_ptr, y_ptr, NV, D, H, W, CO, -1, HAS_BIAS, BLOCK_V, BLOCK_O)

    @triton.jit
    def _tconv_wgrad_kernel(thin_ptr, wide_ptr, part_ptr, NV, D, H, W, T, CW, rows_per_prog, SIGN: tl.constexpr,
                            BLOCK_V: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_W: tl.constexpr,
                            STAGES: tl.constexpr, IEEE: tl.constexpr, WIDE: tl.constexpr):
        """One program's share of Σ_v gather(thin)[:, v] · wide[v, :] ([BLOCK_K, BLOCK_W]): the thin
        input x gathered forward against dy (SIGN 1; the ones row sums dy), or the thin dy gathered
        mirrored against x (SIGN −1)."""
        p = tl.program_id(0)
        cw = tl.arange(0, BLOCK_W)
        acc = tl.zeros([BLOCK_K, BLOCK_W], tl.float32)
        for i in tl.range(0, rows_per_prog, BLOCK_V, num_stages=STAGES):
            v = p * rows_per_prog + i + tl.arange(0, BLOCK_V)
            valid = v < NV
            wide = tl.load(wide_ptr + v.to(tl.int64)[:, None] * CW + cw[None, :],
                           mask=valid[:, None] & (cw < CW)[None, :], other=0.0)
            acc += _dot(_padded_tap_gather(thin_ptr, v, valid, D, H, W, T, SIGN, BLOCK_K, WIDE), wide, IEEE)
        r = tl.arange(0, BLOCK_K)[:, None] * BLOCK_W + cw[None, :]
        tl.store(part_ptr + p * BLOCK_K * BLOCK_W + r, acc)

    @_forward("conv3d_thin")
    def _tc_forward(x: Tensor, weight: Tensor, bias: Tensor | None) -> Tensor:
        """conv3d(x, weight, bias, padding=1), 3³, a thin side (``conv3d_thin``)."""
        return _thin_pass(x, weight, bias, dgrad=False)

    @_tc_forward.register_fake
    def _(x, weight, bias):
        n, _, d, h, w = x.shape
        return torch.empty((n, weight.shape[0], d, h, w), device=x.device, dtype=x.dtype,
                           memory_format=torch.channels_last_3d)

    @torch.library.custom_op("medddpm::conv3d_thin_backward", mutates_args=())
    def _tc_backward(dy: Tensor, x: Tensor, weight: Tensor, has_bias: bool, needs_dx: bool) -> tuple[Tensor, Tensor, Tensor]:
        """(dx, dweight, dbias) of ``conv3d_thin``; dx is empty unless ``needs_dx``, dbias unless ``has_bias``."""
        dx = _thin_pass(dy, weight, None, dgrad=True) if needs_dx else x.new_empty(0)
        return (dx, *_thin_wgrad(dy, x, weight, has_bias))

    @_tc_backward.register_fake
    def _(dy, x, weight, has_bias, needs_dx):
        dx = torch.empty(x.shape, device=x.device, dtype=x.dtype, memory_format=torch.channels_last_3d) \
            if needs_dx else x.new_empty(0)
        return dx, torch.empty_like(weight), weight.new_empty(weight.shape[0] if has_bias else 0)

    def _tc_setup_context(ctx, inputs, output) -> None:
        x, weight, bias = inputs
        ctx.save_for_backward(x, weight)
        ctx.has_bias = bias is not None

    def _tc_backward_rule(ctx, dy):
        x, weight = ctx.saved_tensors
        needs_dx = ctx.needs_input_grad[0]
        dx, dw, db = torch.ops.medddpm.conv3d_thin_backward(dy, x, weight, ctx.has_bias, needs_dx)
        return (dx if needs_dx else None), dw, (db if ctx.has_bias else None)

    _tc_forward.register_autograd(_tc_backward_rule, setup_context=_tc_setup_context)


# ---------------------------------------------------------------------------------------------
# Trilinear ×2 upsampling of NDHWC activations (the decoder's Upsample, paper Fig. 3).
#
# The reference, ``ndhwc.upsample2x``, doubles one axis after the other; Inductor turns that chain
# into kernels that write intermediates of the output's size (0.55 ms for 64³ → 128³ × 64 channels
# on an H200, ``fast_path/thin_convs.csv``, against the 0.06 ms that reading the input and writing
# the output once take). Here one program computes a tile of output voxels × channels from their 8
# input neighbours, in the reference's order (D, then H, then W, in fp32, rounded once), so the
# output is written once and the input, an eighth of its size, is read through the cache. The
# backward is aten's trilinear backward.
# ---------------------------------------------------------------------------------------------


def upsample2x(x: Tensor, fp8: bool = False) -> Tensor:
    """``ndhwc.upsample2x(x)`` (trilinear ×2, align_corners=False) through the Triton kernel where
    it runs (``runs_on``: a channels-last (N, C, D, H, W) tensor), else the reference itself.
    Autograd reaches x. ``fp8``: the output in E4M3, saturated (the sampler's, no backward)."""
    if x.ndim != 5:
        raise ValueError(f"expected (N, C, D, H, W), got shape {tuple(x.shape)}")
    _no_fp8_grad(fp8, x)
    if not runs_on(x):
        y = ndhwc.upsample2x(x)
        return quantize_activation(y) if fp8 else y
    return _forward_op("upsample2x")(x, fp8)


def _doubled(x: Tensor, fp8: bool = False) -> Tensor:
    """An empty channels-last tensor of ``x``'s (N, C) and twice its (D, H, W): the upsampling's
    output, in ``x``'s dtype or E4M3."""
    n, c, d, h, w = x.shape
    return torch.empty((n, c, 2 * d, 2 * h, 2 * w), device=x.device, dtype=_out_dtype(x, fp8),
                       memory_format=torch.channels_last_3d)


def _halved(dy: Tensor, d: int, h: int, w: int) -> Tensor:
    """An empty channels-last (N, C, d, h, w) tensor in ``dy``'s dtype: the upsampling's input gradient."""
    return torch.empty((*dy.shape[:2], d, h, w), device=dy.device, dtype=dy.dtype, memory_format=torch.channels_last_3d)


if triton is not None:

    @triton.jit
    def _lerp_pair(o, n):
        """The two input indices and their weights behind output index ``o`` of a linear ×2 along
        an axis of length n: out[2i] = ¼x[i−1] + ¾x[i], out[2i+1] = ¾x[i] + ¼x[i+1], clamped."""
        i = o // 2
        odd = (o % 2) == 1
        lo = tl.where(odd, i, tl.maximum(i - 1, 0))
        hi = tl.where(odd, tl.minimum(i + 1, n - 1), i)
        w_lo = tl.where(odd, 0.75, 0.25)
        return lo, hi, w_lo, 1.0 - w_lo

    @triton.jit
    def _along_d(x_ptr, b, d0, d1, wd0, wd1, hi, wi, D, H, W, C: tl.constexpr, cols, m):
        """[BLOCK_V, BLOCK_C]: the input at (d0, hi, wi) and (d1, hi, wi), weighted, in fp32 (the
        voxels' offsets computed once per voxel, one add per element)."""
        row0 = (((b * D + d0) * H + hi) * W + wi) * C
        row1 = (((b * D + d1) * H + hi) * W + wi) * C
        a0 = tl.load(x_ptr + (row0[:, None] + cols[None, :]), mask=m, other=0.0).to(tl.float32)
        a1 = tl.load(x_ptr + (row1[:, None] + cols[None, :]), mask=m, other=0.0).to(tl.float32)
        return wd0[:, None] * a0 + wd1[:, None] * a1

    @triton.jit
    def _upsample2x_kernel(x_ptr, y_ptr, NV, D, H, W, C: tl.constexpr, BLOCK_V: tl.constexpr,
                           BLOCK_C: tl.constexpr, WIDE: tl.constexpr, FP8: tl.constexpr):
        """y[v, :] for one tile of output voxels v of (N, 2D, 2H, 2W) and every channel; C a
        constant, so the channel mask folds away where C is a power of two; WIDE: int64 offsets
        (an output of 2³¹ elements or more)."""
        v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        valid = v < NV
        cols = tl.arange(0, BLOCK_C)
        m = valid[:, None] & (cols < C)[None, :]
        od, oh, ow = _voxel_coords(v, 2 * D, 2 * H, 2 * W)
        b = v // (8 * D * H * W)
        if WIDE:
            b = b.to(tl.int64)
        d0, d1, wd0, wd1 = _lerp_pair(od, D)
        h0, h1, wh0, wh1 = _lerp_pair(oh, H)
        x0, x1, ww0, ww1 = _lerp_pair(ow, W)
        # along D at the 4 (H, W) neighbours, then along H at the 2 W neighbours, then along W
        h00 = _along_d(x_ptr, b, d0, d1, wd0, wd1, h0, x0, D, H, W, C, cols, m)
        h10 = _along_d(x_ptr, b, d0, d1, wd0, wd1, h1, x0, D, H, W, C, cols, m)
        h01 = _along_d(x_ptr, b, d0, d1, wd0, wd1, h0, x1, D, H, W, C, cols, m)
        h11 = _along_d(x_ptr, b, d0, d1, wd0, wd1, h1, x1, D, H, W, C, cols, m)
        w0 = wh0[:, None] * h00 + wh1[:, None] * h10
        w1 = wh0[:, None] * h01 + wh1[:, None] * h11
        out = ww0[:, None] * w0 + ww1[:, None] * w1
        if FP8:
            out = _e4m3_rounded(out)
        if WIDE:
            vo = v.to(tl.int64) * C
        else:
            vo = v * C
        tl.store(y_ptr + (vo[:, None] + cols[None, :]), out.to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _adjoint_tap(i, n, k: tl.constexpr):
        """Output index and weight of tap ``k`` (0–3) of the 4 outputs 2i−1 … 2i+2 of a linear ×2 along
        an axis of length n that read input index i (the adjoint of ``_lerp_pair``): ¼ from each
        outer one, ¾ from each inner one, and the inner one at a border also takes the clamped ¼;
        an outer one outside the axis weighs 0 (its index clamped inside)."""
        o = 2 * i - 1 + k
        if k == 0:
            w = tl.where(i >= 1, 0.25, 0.0)
        elif k == 1:
            w = tl.where(i == 0, 1.0, 0.75)
        elif k == 2:
            w = tl.where(i == n - 1, 1.0, 0.75)
        else:
            w = tl.where(i <= n - 2, 0.25, 0.0)
        return tl.minimum(tl.maximum(o, 0), 2 * n - 1), w

    @triton.jit
    def _upsample2x_bwd_kernel(dy_ptr, dx_ptr, NV, D, H, W, C: tl.constexpr, BLOCK_V: tl.constexpr,
                               BLOCK_C: tl.constexpr, WIDE: tl.constexpr):
        """dx[v, :] for one tile of input voxels v of (N, D, H, W): the 4×4×4 outputs that read v,
        weighted (separable: along W, then H, then D), summed in fp32; one write of dx, each
        output read by the 8 inputs around it (from cache after the first)."""
        v = tl.program_id(0) * BLOCK_V + tl.arange(0, BLOCK_V)
        valid = v < NV
        cols = tl.arange(0, BLOCK_C)
        m = valid[:, None] & (cols < C)[None, :]
        d, h, w = _voxel_coords(v, D, H, W)
        b = v // (D * H * W)
        if WIDE:
            b = b.to(tl.int64)
        acc = tl.zeros([BLOCK_V, BLOCK_C], tl.float32)
        for kd in tl.static_range(4):
            od, wd = _adjoint_tap(d, D, kd)
            acc_h = tl.zeros([BLOCK_V, BLOCK_C], tl.float32)
            for kh in tl.static_range(4):
                oh, wh = _adjoint_tap(h, H, kh)
                row = ((b * 2 * D + od) * 2 * H + oh) * 2 * W
                acc_w = tl.zeros([BLOCK_V, BLOCK_C], tl.float32)
                for kw in tl.static_range(4):
                    ow, ww = _adjoint_tap(w, W, kw)
                    g = tl.load(dy_ptr + ((row + ow) * C)[:, None] + cols[None, :], mask=m, other=0.0)
                    acc_w += ww[:, None] * g.to(tl.float32)
                acc_h += wh[:, None] * acc_w
            acc += wd[:, None] * acc_h
        if WIDE:
            vo = v.to(tl.int64) * C
        else:
            vo = v * C
        tl.store(dx_ptr + (vo[:, None] + cols[None, :]), acc.to(dx_ptr.dtype.element_ty), mask=m)

    @torch.library.custom_op("medddpm::upsample2x_backward", mutates_args=())
    def _up_backward_op(dy: Tensor, d: int, h: int, w: int) -> Tensor:
        """The gradient of ``upsample2x``'s channels-last input (N, C, d, h, w) from its output's ``dy``."""
        dy = _as_nsc(dy)
        n, c = dy.shape[:2]
        dx = _halved(dy, d, h, w)
        block_c = triton.next_power_of_2(c)
        rows = _rows(TILES.upsample_bwd_tile, block_c)
        nv = n * d * h * w
        _launch(_upsample2x_bwd_kernel, (triton.cdiv(nv, rows),), dy, dx, nv, d, h, w, C=c, BLOCK_V=rows, BLOCK_C=block_c,
                WIDE=dy.numel() >= 2**31, num_warps=TILES.upsample_warps)
        return dx

    @_up_backward_op.register_fake
    def _(dy, d, h, w):
        return _halved(dy, d, h, w)

    @_forward("upsample2x")
    def _up_forward(x: Tensor, fp8: bool = False) -> Tensor:
        """Trilinear ×2 of a channels-last (N, C, D, H, W) tensor (``upsample2x``), E4M3 with ``fp8``."""
        x = _as_nsc(x)
        n, c, d, h, w = x.shape
        y = _doubled(x, fp8)
        block_c = triton.next_power_of_2(c)
        rows = _rows(TILES.upsample_tile, block_c)
        nv = n * 8 * d * h * w
        _launch(_upsample2x_kernel, (triton.cdiv(nv, rows),), x, y, nv, d, h, w, C=c, BLOCK_V=rows, BLOCK_C=block_c,
                WIDE=y.numel() >= 2**31, FP8=fp8, num_warps=TILES.upsample_warps)
        return y

    @_up_forward.register_fake
    def _(x, fp8=False):
        return _doubled(x, fp8)

    def _up_setup_context(ctx, inputs, output) -> None:
        ctx.shape = tuple(inputs[0].shape)

    def _up_backward(ctx, dy):
        n, c, d, h, w = ctx.shape
        return torch.ops.medddpm.upsample2x_backward(dy, d, h, w), None

    _up_forward.register_autograd(_up_backward, setup_context=_up_setup_context)
