"""Launch shapes of the Triton kernels (``kernels``) and the widest thin side of a convolution they take: plain
numbers, read by the book's fast-path tables without loading PyTorch."""
from __future__ import annotations

import dataclasses

THIN = 8  # the most channels a thin side may have (27·8 + 1 gathered rows fit a 256-row tile)


@dataclasses.dataclass(frozen=True)
class Tiles:
    """Launch shapes of the Triton kernels; the defaults are the best on an H200 of
    ``scripts/probes/norm_tiles.py`` for the norms (``data/results/h200/fast_path/norm_tiles.csv``) and of
    ``scripts/probes/thin_conv_probe.py`` for the thin convolutions and the upsampling (``thin_convs.csv``)."""

    stats_tile: int = 4096  # elements the forward statistics program holds per loop step (rows × padded channels)
    stats_warps: int = 4  # warps of a statistics program
    reduce_tile: int = 2048  # the same for the backward reductions (three accumulators: a smaller tile)
    reduce_warps: int = 4  # warps of a backward-reduction program
    programs_per_sm: int = 8  # reduction programs per SM, over all samples: bytes in flight to fill HBM
    partial_tile: int = 4096  # most elements (partial rows × padded channels) a finalizing program sums per loop step
    program_bytes: int = 65536  # bytes of x a reduction program reads at least (0 = no floor): a small tensor gets fewer programs, so its finalizing tail (two levels of arrivals) is short
    stages: int = 3  # software-pipelining depth of the reduction loops (loads issued ahead)
    apply_tile: int = 4096  # elements a forward apply program handles
    apply_warps: int = 4  # warps of an apply program
    dx_tile: int = 2048  # elements a backward dx program handles (more live values: a smaller tile)
    dx_warps: int = 4  # warps of a dx program
    conv_tile: int = 8192  # elements of a thin convolution program's widest tile (voxels × gathered taps or channels)
    conv_warps: int = 8  # warps of a thin convolution's forward or data-gradient program
    conv_programs_per_sm: int = 8  # gathered (thin-input) convolution programs per SM, each loading the weight once and looping over tiles (0 = one program per tile; 8: the stem 0.53 → 0.30 ms in the probe)
    wgrad_tile: int = 4096  # the same for the weight-gradient programs (one more accumulator: the weight's)
    wgrad_warps: int = 4  # warps of a weight-gradient program (its accumulator is the whole weight)
    wgrad_programs_per_sm: int = 8  # weight-gradient programs per SM (each a partial weight, summed after)
    upsample_tile: int = 2048  # output elements (voxels × padded channels) of a trilinear ×2 program
    upsample_warps: int = 2  # warps of a trilinear ×2 program (forward and backward)
    upsample_bwd_tile: int = 1024  # input elements (voxels × padded channels) of a trilinear ×2 backward program (64 loads each: a smaller tile); not probed
