"""Layout-preserving GroupNorm(+SiLU) and ×2 trilinear upsampling for the NDHWC fast path.

PyTorch 2.11's GroupNorm and trilinear upsampling have no channels-last (NDHWC) path: given a
``channels_last_3d`` tensor they convert it to NCDHW and back, and that is why the paper's OPT2
gets slower (§5.2; pytorch/pytorch#59168). The two functions here are written as plain tensor
operations on whichever view keeps memory contiguous, so the result keeps the input's layout,
autograd derives the backward, and ``torch.compile`` (Inductor) fuses each into a few Triton
kernels on a GPU. On a CPU they run as they are: this module *is* the reference implementation,
and ``tests/test_ndhwc.py`` checks it against ``nn.GroupNorm`` + ``nn.SiLU`` and
``F.interpolate``, forward and backward, in both layouts.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor


def is_channels_last(x: Tensor) -> bool:
    """True when ``x`` (N, C, D, H, W) is stored NDHWC and not also plainly contiguous."""
    return x.ndim == 5 and not x.is_contiguous() and x.is_contiguous(memory_format=torch.channels_last_3d)


def group_norm_silu(x: Tensor, groups: int, weight: Tensor, bias: Tensor, eps: float = 1e-5,
                    silu: bool = True) -> Tensor:
    """SiLU(GroupNorm(x)) with statistics, scale and shift in fp32, returned in ``x``'s dtype and
    memory layout (the reference's GroupNorm32 followed by SiLU, paper Fig. 3 ④).

    ``x`` is (N, C, *spatial); for NDHWC storage the groups are formed on the (N, S, G, C/G) view
    of the contiguous (N, D, H, W, C) permutation, so no copy to NCDHW is made.
    """
    n, c = x.shape[:2]
    if c % groups:
        raise ValueError(f"{c} channels do not split into {groups} groups")
    xf = x.float()
    if not is_channels_last(x):
        view = xf.reshape(n, groups, c // groups, -1)  # each group is one contiguous run
        var, mean = torch.var_mean(view, dim=(2, 3), unbiased=False, keepdim=True)
        y = (view - mean) * torch.rsqrt(var + eps)
        y = y * weight.float().reshape(1, groups, -1, 1) + bias.float().reshape(1, groups, -1, 1)
        return _finish(y, silu, x.dtype).reshape(x.shape)
    # NDHWC: per-channel statistics over the voxels of the (N, S, C) view (a column reduction that
    # Inductor tiles well), then combined into groups by the law of total variance (exact for
    # equal counts): var_g = mean_c(var_c + (mean_c − mean_g)²).
    view = xf.permute(0, 2, 3, 4, 1).reshape(n, -1, c)
    var_c, mean_c = torch.var_mean(view, dim=1, unbiased=False)
    mean_g = mean_c.reshape(n, groups, -1).mean(dim=2, keepdim=True)
    var_g = (var_c.reshape(n, groups, -1) + (mean_c.reshape(n, groups, -1) - mean_g).square()).mean(dim=2, keepdim=True)
    scale = (torch.rsqrt(var_g + eps) * weight.float().reshape(1, groups, -1)).reshape(n, 1, c)
    shift = bias.float().reshape(1, 1, c) - mean_g.expand(n, groups, c // groups).reshape(n, 1, c) * scale
    y = _finish(view * scale + shift, silu, x.dtype)
    d, h, w = x.shape[2:]
    return y.reshape(n, d, h, w, c).permute(0, 4, 1, 2, 3)


def per_channel(v: Tensor, like: Tensor) -> Tensor:
    """``v`` of shape (N, C) viewed to broadcast over ``like``'s (N, C, *spatial) voxels."""
    return v.reshape(*v.shape, *(1,) * (like.ndim - 2))


def _finish(y: Tensor, silu: bool, dtype: torch.dtype) -> Tensor:
    return (F.silu(y) if silu else y).to(dtype)


def _double(x: Tensor, dim: int) -> Tensor:
    """Linear ×2 along ``dim`` with align_corners=False: out[2i] = ¼x[i−1] + ¾x[i],
    out[2i+1] = ¾x[i] + ¼x[i+1], the neighbours clamped at the edges."""
    n = x.shape[dim]
    prev = torch.cat([x.narrow(dim, 0, 1), x.narrow(dim, 0, n - 1)], dim)
    nxt = torch.cat([x.narrow(dim, 1, n - 1), x.narrow(dim, n - 1, 1)], dim)
    even = 0.25 * prev + 0.75 * x
    odd = 0.75 * x + 0.25 * nxt
    return torch.stack([even, odd], dim + 1).flatten(dim, dim + 1)


def upsample2x(x: Tensor) -> Tensor:
    """``F.interpolate(x, scale_factor=2, mode="trilinear")`` for (N, C, D, H, W), keeping the
    input's memory layout; computed in fp32 and rounded once to ``x``'s dtype."""
    if x.ndim != 5:
        raise ValueError(f"expected (N, C, D, H, W), got shape {tuple(x.shape)}")
    last = is_channels_last(x)
    y = x.float()
    if last:
        y = y.permute(0, 2, 3, 4, 1)  # contiguous (N, D, H, W, C); spatial dims 1..3
        spatial = (1, 2, 3)
    else:
        spatial = (2, 3, 4)
    for dim in spatial:
        y = _double(y, dim)
    y = y.to(x.dtype)
    return y.permute(0, 4, 1, 2, 3) if last else y
