"""A ResBlock's last step, out = conv(h) + bias + skip term, as one Triton kernel (issue 64).

Eager PyTorch writes a ResBlock's output in three passes: cuDNN's convolution, then PyTorch's bias
add (a broadcast over channels-last voxels: its generic strided kernel), then the residual add.
Those two adds were 2.9 + 1.0 ms of ``fast-eager``'s 22.4 ms denoiser call at 128³ on an H100
(the eager-kernels run in ``time_to_result/``, the ops in its fused-residual run).
``residual_add`` adds the bias, the skip term and that term's own bias in fp32 as it rewrites the
convolution's output in place: one read of each tensor, one write, one rounding.

The reference is ``reference_residual_add``; it runs wherever the kernel does not (a CPU, a tensor
not channels-last, autograd recording).
"""
from __future__ import annotations

import torch
from torch import Tensor

from . import kernels
from .ndhwc import per_channel

BLOCK = 4096  # elements a program handles


def reference_residual_add(h: Tensor, bias: Tensor | None, skip: Tensor, skip_bias: Tensor | None = None) -> Tensor:
    """((h + bias) + skip) + skip_bias in fp32, in ``h``'s dtype and layout (biases per channel, (C,))."""
    out = h.float()
    if bias is not None:
        out = out + per_channel(bias.float()[None], h)
    out = out + skip.float()
    if skip_bias is not None:
        out = out + per_channel(skip_bias.float()[None], h)
    return out.to(h.dtype)


def residual_add(h: Tensor, bias: Tensor | None, skip: Tensor, skip_bias: Tensor | None = None) -> Tensor:
    """``reference_residual_add(h, bias, skip, skip_bias)``, written into ``h`` by the Triton kernel
    where it runs (``kernels.runs_on`` both, the same strides, no autograd), else the reference."""
    if h.shape != skip.shape:
        raise ValueError(f"h {tuple(h.shape)} and skip {tuple(skip.shape)} differ")
    c = h.shape[1]
    for name, b in (("bias", bias), ("skip_bias", skip_bias)):
        if b is not None and b.shape != (c,):
            raise ValueError(f"{name} must be ({c},), got {tuple(b.shape)}")
    if torch.is_grad_enabled() or not (kernels.runs_on(h) and kernels.runs_on(skip)) or h.stride() != skip.stride():
        return reference_residual_add(h, bias, skip, skip_bias)
    n = h.numel()
    none = h  # a pointer for an absent bias; the kernel never reads it
    kernels._launch(_residual_kernel, (kernels.triton.cdiv(n, BLOCK),), h, none if bias is None else bias, skip,
                    none if skip_bias is None else skip_bias, n, c, HAS_BIAS=bias is not None,
                    HAS_SKIP_BIAS=skip_bias is not None, BLOCK=BLOCK)
    return h


if kernels.triton is not None:
    tl = kernels.tl

    @kernels.triton.jit
    def _residual_kernel(h_ptr, b_ptr, s_ptr, sb_ptr, n, c, HAS_BIAS: tl.constexpr, HAS_SKIP_BIAS: tl.constexpr,
                         BLOCK: tl.constexpr):
        """h[i] = ((h[i] + b[i mod c]) + s[i]) + sb[i mod c] in fp32 over channels-last elements."""
        offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
        m = offs < n
        ch = offs % c
        v = tl.load(h_ptr + offs, mask=m).to(tl.float32)
        if HAS_BIAS:
            v += tl.load(b_ptr + ch, mask=m).to(tl.float32)
        v += tl.load(s_ptr + offs, mask=m).to(tl.float32)
        if HAS_SKIP_BIAS:
            v += tl.load(sb_ptr + ch, mask=m).to(tl.float32)
        tl.store(h_ptr + offs, v.to(h_ptr.dtype.element_ty), mask=m)
