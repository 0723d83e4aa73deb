"""Kernel names → short names, categories and the paper's Table 2 abbreviations."""
from __future__ import annotations

import functools
import hashlib
import re

# Ordered: the first matching pattern wins (layout before convolution: cuDNN's layout kernels
# live in the cudnn namespace too).
CATEGORY_PATTERNS: list[tuple[str, str]] = [
    # torch.compile's generated kernels first: their names list the fused ops ("…convolution_permute…")
    ("Triton reduction", r"^triton_(red|per)_"),
    ("Triton pointwise", r"^triton_poi_"),
    ("layout transform", r"nchwToNhwc|nhwcToNchw|nhwcAddPadding|transpose|permute|_to_nhwc|_to_nchw|pad|"
                         r"convertTensor"),
    ("attention/softmax", r"softmax|attention|fmha|flash"),
    ("convolution/GEMM", r"xmma|implicit|conv(?!ert)|gemm|cudnn|cutlass|wgrad|dgrad|fprop|sm\d\d_|scudnn|winograd"),
    ("normalization", r"Moments|group_norm|GroupNorm|batch_norm|layer_norm|ComputeFusedParams|"
                      r"GammaBeta|norm_backward|NormBackward|ComputeInternalGradi|ComputeBackwardFused|"
                      r"^_(stats|stats_finalize|apply|bwd_reduce|bwd_finalize|bwd_dx)_kernel$"),  # medddpm/net/kernels.py
    ("optimizer", r"adam|multi_tensor_apply|foreach|fused_sgd|lerp"),
    ("upsample", r"upsample|interp|trilinear"),
    ("reduction", r"reduce_kernel|reduction|Reduce"),
    ("copy", r"CatArrayBatchedCopy|copy_kernel|Memcpy|direct_copy|memcpy|cat_"),
    ("elementwise", r"elementwise|vectorized|unrolled|pointwise|distribution|index_|setTensor"),
]

# Paper Table 2 (§4): abbreviation → name fragment. KN4 matches the exact function name only.
PAPER_ABBREVIATIONS: dict[str, str] = {
    "KN1": "sm80_xmma_fprop_implicit",
    "KN2": "sm90_xmma_fprop_implicit",
    "KN3": "RowwiseMomentsCUDAKernel",
    "KN4": "elementwise_kernel",
    "KN5": "nhwcToNchwKernel",
    "KN6": "implicit_convolveNd",
    "KN7": "_5x_cudnn_volta_scudnn",
    "KN8": "nhwcAddPaddingKernel",
}


# cuDNN's implicit-GEMM kernels name the pass of a convolution they compute.
CONV_PASSES = {"fprop": "forward convolution", "dgrad": "data gradient", "wgrad": "weight gradient"}


def conv_pass(kernel: str) -> str | None:
    """'weight gradient', 'data gradient' or 'forward convolution' for a cuDNN convolution kernel
    whose name says so (``…_xmma_wgrad_…``), else None."""
    return next((what for part, what in CONV_PASSES.items() if part in kernel), None)


@functools.cache  # pure, and a results table names the same few hundred kernels thousands of times
def short_name(kernel: str) -> str:
    """The kernel's function name without return type, namespaces, template and call arguments:
    'void at::native::vectorized_elementwise_kernel<4, …>(int, …)' → 'vectorized_elementwise_kernel'."""
    name = kernel.strip().replace("(anonymous namespace)", "anonymous")
    if name.startswith("void "):
        name = name[5:]
    out, depth = [], 0
    for ch in name:
        if ch == "<":
            depth += 1
        elif ch == ">":
            depth = max(0, depth - 1)
        elif ch == "(" and depth == 0:
            break
        elif depth == 0:
            out.append(ch)
    base = "".join(out).strip()
    base = base.split("::")[-1].strip()
    return base.split()[-1] if base.split() else kernel[:60]


def _match(text: str) -> str:
    for name, pattern in CATEGORY_PATTERNS:
        if re.search(pattern, text, flags=re.IGNORECASE):
            return name
    return "other"


# What a generic PyTorch elementwise kernel is for shows only in its template arguments.
_FUNCTOR_CATEGORIES = {"copy", "optimizer", "upsample", "normalization"}


@functools.cache
def category(kernel: str) -> str:
    """Category of a kernel: CATEGORY_PATTERNS on its short name, first match wins; a generic
    elementwise kernel whose full name shows a copy, optimizer, upsample or normalization functor
    takes that category instead; 'other' when nothing matches."""
    cat = _match(short_name(kernel))
    if cat in ("elementwise", "other"):
        functor = _match(kernel)
        if functor in _FUNCTOR_CATEGORIES:
            return functor
    return cat


def abbreviation(kernel: str) -> str:
    """Paper abbreviation (KN1–KN8) or a stable new one, 'KX-' + 4 hex digits of the short name."""
    short = short_name(kernel)
    for abbr, fragment in PAPER_ABBREVIATIONS.items():
        if abbr == "KN4":
            if short == fragment:
                return abbr
        elif fragment.lower() in kernel.lower():
            return abbr
    return "KX-" + hashlib.sha1(short.encode()).hexdigest()[:4]
