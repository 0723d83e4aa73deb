"""Triton kernels of the fast path (issue 21), each beside the PyTorch reference it must equal.

``group_norm_silu`` is GroupNorm with fp32 statistics, an optional SiLU (the reference's
GroupNorm32 + SiLU, paper Fig. 3 ④) and an optional per-(sample, channel) addend folded into its
input (a ResBlock's time embedding, ``h + emb`` before ``out_layers``), over activations stored
channels-last (NDHWC, seen here as (N, S, C)). It moves the fewest bytes the operation allows:

- forward: one read of x for the statistics, one read of x and one write of y for the apply;
- backward: one read of x and dy for the reductions, one read of both and one write of dx.

Statistics are per-channel partial sums over row chunks (shifted by the sample's first voxel, so a
large mean does not cancel the variance away), summed over chunks by ``torch.sum`` and turned into
group statistics by a one-program finalize kernel (law of total variance). No atomics: the result
is deterministic, and the training run's ``--resume`` stays bit-exact.

The reference is ``reference_group_norm_silu`` (``ndhwc.group_norm_silu`` on x + addend in fp32); it
runs wherever Triton does not: on a CPU, for a tensor that is not channels-last, or without
Triton installed. With ``TRITON_INTERPRET=1`` set before import, Triton's interpreter runs the
kernels on CPU tensors (``tests/test_kernels.py`` compares them with the reference that way).
"""
from __future__ import annotations

import dataclasses
import functools
import os

import torch
from torch import Tensor

from . import ndhwc

try:  # a CPU-only install may lack Triton: the references then run everywhere
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - depends on the install
    triton = None

INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"  # Triton's CPU interpreter (tests)


@dataclasses.dataclass(frozen=True)
class Tiles:
    """Launch shapes of the GroupNorm kernels; the defaults are the best of ``scripts/norm_tiles.py``
    on an H200 (``data/results/h200/fast_path/norm_tiles.csv``)."""

    stats_tile: int = 4096  # elements the forward statistics program holds per loop step (rows × padded channels)
    stats_warps: int = 4  # warps of a statistics program
    reduce_tile: int = 2048  # the same for the backward reductions (three accumulators: a smaller tile)
    reduce_warps: int = 4  # warps of a backward-reduction program
    programs_per_sm: int = 8  # reduction programs per SM, over all samples: bytes in flight to fill HBM
    stages: int = 3  # software-pipelining depth of the reduction loops (loads issued ahead)
    apply_tile: int = 4096  # elements a forward apply program handles
    apply_warps: int = 4  # warps of an apply program
    dx_tile: int = 2048  # elements a backward dx program handles (more live values: a smaller tile)
    dx_warps: int = 4  # warps of a dx program


TILES = Tiles()  # the launch shapes in use (a module global, so a probe can swap it)


def reference_group_norm_silu(x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                              silu: bool = True, add: Tensor | None = None) -> Tensor:
    """SiLU(GroupNorm(x + add)) in fp32, returned in ``x``'s dtype and layout: the maths of
    ``group_norm_silu`` in plain tensor operations (``add`` is (N, C), broadcast over voxels)."""
    if add is not None:
        x32 = x.float() + ndhwc.per_channel(add.float(), x)
        return ndhwc.group_norm_silu(x32, groups, weight, bias, eps, silu).to(x.dtype)
    return ndhwc.group_norm_silu(x, groups, weight, bias, eps, silu)


def runs_on(x: Tensor) -> bool:
    """True when the Triton kernels can run on ``x``: Triton installed and ``x`` on a CUDA device
    (or on the CPU under Triton's interpreter), stored channels-last, (N, C, *spatial)."""
    if triton is None or not (x.is_cuda or (INTERPRET and x.device.type == "cpu")):
        return False
    return x.ndim >= 3 and x.movedim(1, -1).is_contiguous()


def group_norm_silu(x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                    silu: bool = True, add: Tensor | None = None) -> Tensor:
    """SiLU(GroupNorm(x + add)) through the Triton kernels where they run (``runs_on``), else the
    reference. ``x`` is (N, C, *spatial); ``add``, if given, is (N, C). Autograd reaches x,
    weight, bias and add."""
    n, c = x.shape[:2]
    if c % groups:
        raise ValueError(f"{c} channels do not split into {groups} groups")
    if add is not None and tuple(add.shape) != (n, c):
        raise ValueError(f"add must be (N, C) = {(n, c)}, got {tuple(add.shape)}")
    if not runs_on(x):
        return reference_group_norm_silu(x, groups, weight, bias, eps, silu, add)
    return torch.ops.medddpm.group_norm_silu(x, weight, bias, add, groups, eps, silu)[0]


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


def _rows(block_c: int, tile: int) -> int:
    """Rows of a ``tile``-element block of ``block_c`` channels."""
    return max(1, tile // block_c)


def _reduction(x: Tensor, tile: int, sums: int) -> tuple[int, int, int, int, int, int, Tensor]:
    """(N, S, C, BLOCK_C, BLOCK_S, rows per program, partials) of a reduction kernel over ``x``'s
    rows, ``tile`` elements per loop step; partials is the (N, P, ``sums``, C) fp32 buffer it fills."""
    n, s, c, block_c = _shape(x)
    block_s = _rows(block_c, tile)
    p, rows = _chunks(n, s, block_s, x.device)
    return n, s, c, block_c, block_s, rows, torch.empty(n, p, sums, c, device=x.device, dtype=torch.float32)


def _chunks(n: int, s: int, block_s: int, device: torch.device) -> tuple[int, int]:
    """(programs per sample P, rows per program) for the reduction kernels: about
    ``TILES.programs_per_sm`` programs per SM in all, each a whole number of ``block_s`` row tiles."""
    target = max(1, TILES.programs_per_sm * _sm_count(device) // n)
    rows = triton.cdiv(triton.cdiv(s, target), block_s) * block_s
    return triton.cdiv(s, rows), rows


if triton is not None:

    @triton.jit
    def _xhat_coeffs(mean_ptr, rstd_ptr, add_ptr, w_ptr, b_ptr, n, cols, cmask, C, G, HAS_ADD: tl.constexpr):
        """Per channel (r, o, w, b) with x̂ = x·r + o and z = x̂·w + b: r = rstd of the channel's
        group, o = (add − mean)·r."""
        g = cols // (C // G)
        r = tl.load(rstd_ptr + n * G + g, mask=cmask, other=0.0)
        o = -tl.load(mean_ptr + n * G + g, mask=cmask, other=0.0) * r
        if HAS_ADD:
            o += tl.load(add_ptr + n * C + cols, mask=cmask, other=0.0).to(tl.float32) * r
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
    def _stats_kernel(x_ptr, part_ptr, S, C, rows_per_prog, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                      STAGES: tl.constexpr):
        """Per (row chunk p, sample n): each channel's Σ (x − ref) and Σ (x − ref)², ref = the
        sample's first voxel (one shift for every chunk, so the partial sums simply add up; a shift
        inside the data's range keeps Σd² − (Σd)²/S from cancelling). One read of x."""
        p = tl.program_id(0)
        n = tl.program_id(1)
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
        out = part_ptr + ((n * tl.num_programs(0) + p) * 2) * C + cols
        tl.store(out, tl.sum(acc, 0), mask=cmask)
        tl.store(out + C, tl.sum(acc2, 0), mask=cmask)

    @triton.jit
    def _stats_finalize_kernel(sums_ptr, x_ptr, add_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, scale_ptr, shift_ptr,
                               S, C, G, eps, HAS_ADD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr):
        """Per sample, from the summed partials (2, C): channel means and squared deviations, group
        mean and rstd (law of total variance, equal counts per channel), and the apply's
        per-channel scale and shift (the addend folded into the shift)."""
        n = tl.program_id(0)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        ref = tl.load(x_ptr + n.to(tl.int64) * S * C + cols, mask=cmask, other=0.0).to(tl.float32)
        s = tl.load(sums_ptr + n * 2 * C + cols, mask=cmask, other=0.0)
        q = tl.load(sums_ptr + n * 2 * C + C + cols, mask=cmask, other=0.0)
        d = s / S
        mean_c = ref + d  # of x, without the addend
        var_c = tl.maximum(q / S - d * d, 0.0)
        if HAS_ADD:
            a = tl.load(add_ptr + n * C + cols, mask=cmask, other=0.0).to(tl.float32)
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

    @triton.jit
    def _apply_kernel(x_ptr, y_ptr, scale_ptr, shift_ptr, S, C, SILU: tl.constexpr,
                      BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
        """y = SiLU(x·scale + shift) per channel (one read of x, one write of y)."""
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
        tl.store(y_ptr + off, z.to(y_ptr.dtype.element_ty), mask=m)

    @triton.jit
    def _bwd_reduce_kernel(dy_ptr, x_ptr, add_ptr, w_ptr, b_ptr, mean_ptr, rstd_ptr, part_ptr, S, C, G, rows_per_prog,
                           SILU: tl.constexpr, HAS_ADD: tl.constexpr, BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr,
                           STAGES: tl.constexpr):
        """Per (row chunk, sample): each channel's Σ dz, Σ dz·x̂ and Σ x̂ (one read of dy and x)."""
        p = tl.program_id(0)
        n = tl.program_id(1)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        r, o, w, b = _xhat_coeffs(mean_ptr, rstd_ptr, add_ptr, w_ptr, b_ptr, n, cols, cmask, C, G, HAS_ADD)
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
        out = part_ptr + ((n * tl.num_programs(0) + p) * 3) * C + cols
        tl.store(out, tl.sum(acc_dz, 0), mask=cmask)
        tl.store(out + C, tl.sum(acc_dzx, 0), mask=cmask)
        tl.store(out + 2 * C, tl.sum(acc_xh, 0), mask=cmask)

    @triton.jit
    def _bwd_finalize_kernel(sums_ptr, w_ptr, rstd_ptr, k1_ptr, k2_ptr, k3_ptr, dw_ptr, db_ptr, dadd_ptr, N, S, C, G,
                             HAS_ADD: tl.constexpr, BLOCK_C: tl.constexpr, BLOCK_G: tl.constexpr):
        """One program, from the summed partials (N, 3, C): per sample, dx = k1·dz + k2·x̂ + k3 with
        k1 = rstd·w, k2 = −rstd·mean_g(w·dz·x̂), k3 = −rstd·mean_g(w·dz); dw = Σ dz·x̂ and db = Σ dz
        over samples; d(add) = Σ_voxels dx = k1·Σdz + k2·Σx̂ + k3·S."""
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        w = tl.load(w_ptr + cols, mask=cmask, other=0.0).to(tl.float32)
        onehot = _group_onehot(cols, cmask, C, G, BLOCK_G)
        count = S * (C // G) * 1.0
        dw = tl.zeros([BLOCK_C], tl.float32)
        db = tl.zeros([BLOCK_C], tl.float32)
        for n in range(0, N):
            a = tl.load(sums_ptr + n * 3 * C + cols, mask=cmask, other=0.0)
            bsum = tl.load(sums_ptr + n * 3 * C + C + cols, mask=cmask, other=0.0)
            xs = tl.load(sums_ptr + n * 3 * C + 2 * C + cols, mask=cmask, other=0.0)
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
                       S, C, G, SILU: tl.constexpr, HAS_ADD: tl.constexpr,
                       BLOCK_S: tl.constexpr, BLOCK_C: tl.constexpr):
        """dx = k1·dz + k2·x̂ + k3 (one read of dy and x, one write of dx)."""
        t = tl.program_id(0)
        n = tl.program_id(1)
        cols = tl.arange(0, BLOCK_C)
        cmask = cols < C
        r, o, w, b = _xhat_coeffs(mean_ptr, rstd_ptr, add_ptr, w_ptr, b_ptr, n, cols, cmask, C, G, HAS_ADD)
        rows = t * BLOCK_S + tl.arange(0, BLOCK_S)
        m = (rows < S)[:, None] & cmask[None, :]
        off = n.to(tl.int64) * S * C + rows.to(tl.int64)[:, None] * C + cols[None, :]
        xh = tl.load(x_ptr + off, mask=m, other=0.0).to(tl.float32) * r[None, :] + o[None, :]
        dz = _dz(tl.load(dy_ptr + off, mask=m, other=0.0).to(tl.float32), xh, w[None, :], b[None, :], SILU)
        dx = dz * tl.load(k1_ptr + n * C + cols, mask=cmask, other=0.0)[None, :] \
            + xh * tl.load(k2_ptr + n * C + cols, mask=cmask, other=0.0)[None, :] \
            + tl.load(k3_ptr + n * C + cols, mask=cmask, other=0.0)[None, :]
        tl.store(dx_ptr + off, dx.to(dx_ptr.dtype.element_ty), mask=m)

    @torch.library.custom_op("medddpm::group_norm_silu", mutates_args=())
    def _gn_forward(x: Tensor, weight: Tensor, bias: Tensor, add: Tensor | None, groups: int, eps: float,
                    silu: bool) -> tuple[Tensor, Tensor, Tensor]:
        """(y, group mean, group rstd) of SiLU(GroupNorm(x + add)); x channels-last."""
        x = _as_nsc(x)
        tiles = TILES
        n, s, c, block_c, block_s, rows, part = _reduction(x, tiles.stats_tile, 2)
        f32 = dict(device=x.device, dtype=torch.float32)
        _stats_kernel[(part.shape[1], n)](x, part, s, c, rows, BLOCK_S=block_s, BLOCK_C=block_c, STAGES=tiles.stages,
                              num_warps=tiles.stats_warps)
        mean, rstd = torch.empty(n, groups, **f32), torch.empty(n, groups, **f32)
        scale, shift = torch.empty(n, c, **f32), torch.empty(n, c, **f32)
        _stats_finalize_kernel[(n,)](part.sum(1), x, part if add is None else add, weight, bias, mean, rstd, scale,
                                     shift, s, c, groups, eps, HAS_ADD=add is not None, BLOCK_C=block_c,
                                     BLOCK_G=triton.next_power_of_2(groups), num_warps=4)
        y = torch.empty_like(x)
        apply_s = _rows(block_c, tiles.apply_tile)
        _apply_kernel[(triton.cdiv(s, apply_s), n)](x, y, scale, shift, s, c, SILU=silu, BLOCK_S=apply_s,
                                                    BLOCK_C=block_c, num_warps=tiles.apply_warps)
        return y, mean, rstd

    @_gn_forward.register_fake
    def _(x, weight, bias, add, groups, eps, silu):
        n = x.shape[0]
        return (torch.empty_like(x), x.new_empty((n, groups), dtype=torch.float32),
                x.new_empty((n, groups), dtype=torch.float32))

    @torch.library.custom_op("medddpm::group_norm_silu_backward", mutates_args=())
    def _gn_backward(dy: Tensor, x: Tensor, weight: Tensor, bias: Tensor, add: Tensor | None, mean: Tensor,
                     rstd: Tensor, groups: int, silu: bool) -> tuple[Tensor, Tensor, Tensor, Tensor]:
        """(dx, dweight, dbias, dadd) of ``group_norm_silu``; dadd is empty when there is no addend."""
        x, dy = _as_nsc(x), _as_nsc(dy)
        tiles = TILES
        n, s, c, block_c, block_s, rows, part = _reduction(x, tiles.reduce_tile, 3)
        f32 = dict(device=x.device, dtype=torch.float32)
        has_add = add is not None
        _bwd_reduce_kernel[(part.shape[1], n)](dy, x, add if has_add else x, weight, bias, mean, rstd, part, s, c, groups, rows,
                                   SILU=silu, HAS_ADD=has_add, BLOCK_S=block_s, BLOCK_C=block_c, STAGES=tiles.stages,
                                   num_warps=tiles.reduce_warps)
        k1, k2, k3 = (torch.empty(n, c, **f32) for _ in range(3))
        dw, db = torch.empty_like(weight), torch.empty_like(bias)
        dadd = torch.empty_like(add) if has_add else x.new_empty(0)
        _bwd_finalize_kernel[(1,)](part.sum(1), weight, rstd, k1, k2, k3, dw, db, dadd if has_add else k1, n, s, c,
                                   groups, HAS_ADD=has_add, BLOCK_C=block_c, BLOCK_G=triton.next_power_of_2(groups),
                                   num_warps=4)
        dx = torch.empty_like(x)
        dx_s = _rows(block_c, tiles.dx_tile)
        _bwd_dx_kernel[(triton.cdiv(s, dx_s), n)](dy, x, dx, add if has_add else x, weight, bias, mean, rstd, k1, k2,
                                                  k3, s, c, groups, SILU=silu, HAS_ADD=has_add, BLOCK_S=dx_s,
                                                  BLOCK_C=block_c, num_warps=tiles.dx_warps)
        return dx, dw, db, dadd

    @_gn_backward.register_fake
    def _(dy, x, weight, bias, add, mean, rstd, groups, silu):
        return (torch.empty_like(x), torch.empty_like(weight), torch.empty_like(bias),
                torch.empty_like(add) if add is not None else x.new_empty(0))

    def _setup_context(ctx, inputs, output) -> None:
        x, weight, bias, add, groups, eps, silu = inputs
        _, mean, rstd = output
        ctx.save_for_backward(x, weight, bias, add, mean, rstd)
        ctx.groups, ctx.silu = groups, silu
        ctx.mark_non_differentiable(mean, rstd)

    def _backward(ctx, dy, _dmean, _drstd):
        x, weight, bias, add, mean, rstd = ctx.saved_tensors
        dx, dw, db, dadd = torch.ops.medddpm.group_norm_silu_backward(dy, x, weight, bias, add, mean, rstd,
                                                                      ctx.groups, ctx.silu)
        return dx, dw, db, (None if add is None else dadd), None, None, None

    _gn_forward.register_autograd(_backward, setup_context=_setup_context)
