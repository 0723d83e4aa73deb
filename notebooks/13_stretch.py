# ---
# jupyter:
#   jupytext:
#     text_representation:
#       extension: .py
#       format_name: percent
#       format_version: '1.3'
#       jupytext_version: 1.19.6
#   kernelspec:
#     display_name: Python 3 (ipykernel)
#     language: python
#     name: python3
# ---

# %% [markdown]
# # Past `fast`: the stretch target
#
# `fast` met the 50 ms target ({doc}`06_beyond`) on an H200. The stretch target asks for 40 ms on an H200 and 44 ms on
# an H100 (`STRETCH_TARGETS_MS`, `medddpm/report/stretch.py`).
# {doc}`07_kernels` found the convolutions at cuDNN's best for their shapes and the norms near their
# minimal bytes, so what is left changes *what* is computed or *how many bytes* move. Each lever is
# a knob and a rung (`medddpm/core/config.py`, `KERNEL_VARIANTS`), measured on its own; `fast`
# stays the default. Whole-head model, 128³, batch 1, the training step of {doc}`06_beyond`.

# %% tags=["parameters", "remove-cell"]
results_dir = None  # None: <repo>/data/results
gpus = None  # None or "all": every GPU found there; else e.g. "h200,h100-80gb-hbm3"
measure = False  # no measurement of its own (scripts/fast_measure.sh, stages fp8 and skipgrad); True says so, then renders
size = 128  # volume side when measuring
configs = "fast,fast-fp8fwd,fast-skipgrad,fast-skipgrad-up"  # not used: this chapter measures nothing

# %% tags=["remove-cell"]
from medddpm.report import stretch
from medddpm.report.measure import render_only
from medddpm.report.plots import show_table

root, G = render_only(results_dir, gpus, measure, "scripts/fast_measure.sh OUT fp8 skipgrad")


def kernel_table(rungs: tuple[str, str]) -> None:
    """One lever's kernel milliseconds per category, or where the tables would come from."""
    show_table(stretch.lever_kernels(root, G, rungs).round(2), f"torch.profiler step tables of {' and '.join(rungs)}",
               f"medddpm torch-kernels --size 128 --configs {','.join(rungs)} --out data/results/<gpu>", 2,
               {r: f"{r} (ms)" for r in rungs})


# %% [markdown]
# ## Where it stands
#
# Per GPU, `fast` against the fastest lever rung timed there, and that rung against the GPU's stretch target:

# %% tags=["hide-input"]
show_table(stretch.state(root, G), "bench rows of fast and its lever rungs",
           "scripts/fast_measure.sh data/results/<gpu> fp8 skipgrad", 1)

# %% [markdown]
# ## Every lever against `fast`
#
# The step of each rung on each GPU that timed it (`bench`, CUDA events, median of 20 steps), what
# it adds to `fast`, and its distance to the GPU's target. The rows of one GPU need not come from
# one run: `fast`'s own row moves by a few tenths of a millisecond between runs, and each store's
# `fast_path/*/provenance.json` says which run gave which row.

# %% tags=["hide-input"]
show_table(stretch.lever_steps(root, G), "bench rows of fast and its lever rungs",
           "scripts/fast_measure.sh data/results/<gpu> fp8 skipgrad", 1,
           {"step_ms": "step (ms)", "vs_fast_ms": "vs fast (ms)", "target_ms": "target (ms)",
            "above_target_ms": "above target (ms)"})

# %% [markdown]
# ## FP8 in the forward pass
#
# `fast-fp8fwd` (knob `fp8_train_convs`, `medddpm/net/fp8.py`) runs the forward of every ResBlock
# and upsampling 3³ convolution with at most 64 output channels with E4M3 operands through cuDNN's
# graph API: the weight quantized per output channel at every step, the activation unscaled,
# written in E4M3 by the Triton norm in the same pass that writes its bf16 output. The data and
# weight gradients stay bf16, from the unquantized operands: the forward half of the FP8 recipe of
# Micikevicius et al. (2022), whose gradients would be E5M2. Kernel by category (one steady step, torch.profiler),
# the convolutions give time back and the norms, writing the second copy, take more (`difference`):

# %% tags=["hide-input"]
kernel_table(stretch.FP8_FORWARD)

# %% [markdown]
# ## The skip gradients in the norm's backward
#
# A decoder ResBlock reads the concatenation of the upward path and the encoder's skip twice: its
# first norm and its 1×1 skip convolution. Autograd sums the two gradients of the concatenation and
# slices the sum apart, in Inductor kernels that read both 128-channel gradients at 128³.
# `fast-skipgrad` (knob `fused_skip_grads`, `kernels.group_norm_silu_cat`) concatenates inside the
# norm's autograd: its backward's dx kernel adds the skip convolution's share as it writes, and
# writes the two inputs' gradients apart, each dense NDHWC. The same sums, one rounding fewer. The Inductor kernels
# give time back and the norms, reading the second gradient, take more:

# %% tags=["hide-input"]
kernel_table(stretch.SKIP_GRADS)

# %% [markdown]
# ## The upsampling as Triton kernels
#
# The decoder's trilinear ×2 upsampling ran as Inductor's kernels of the axis-by-axis reference in
# both directions, each writing intermediates of the output's size. `fast-skipgrad-up` (knob
# `triton_upsample`, so far the samplers' alone) runs its forward as the samplers' Triton kernel and
# its backward as one more (`kernels.upsample2x`): each input voxel gathers the 4×4×4 outputs that
# read it, from cache after the first reader, and is written once. Against `fast-skipgrad`, Inductor's kernels give
# time back and the two Triton kernels take their own:

# %% tags=["hide-input"]
kernel_table(stretch.UPSAMPLE)

# %% [markdown]
# ## Do they train the same model?
#
# The quality chapter's parity runs (1,000 Adam steps at 64³ on the MNI152 demo subjects, the
# held-out loss by the FP32 evaluator), each seed against the FP32 baseline's 95 % prediction band from its three
# seeds (the table's last column). Where the band's GPU is not the run's, the comparison is across GPUs. The rungs without FP8 compute the
# same sums as `fast` (`tests/test_kernels.py` compares the models' ε and gradients).

# %% tags=["hide-input"]
show_table(stretch.parity(root, G).drop(columns=["band_seeds"], errors="ignore"),
           "training-parity runs of the lever rungs", "scripts/fast_measure.sh data/results/<gpu> fp8", 4,
           {"loss": "held-out loss", "band_gpu": "band's GPU", "band_low": "band, low", "band_high": "band, high",
            "inside_band": "inside the band"})

# %% [markdown]
# ## What is left above the bounds
#
# Per kernel category: the roofline bound of `fast`'s kernels ({doc}`08_roofline`: each kernel's FLOPs at its pipe's
# ceiling or its DRAM bytes at the bandwidth, whichever takes longer; ncu), and the kernel time of `fast` and of the
# fastest lever rung with profiler tables (torch.profiler), the categories furthest above their bound first and their
# sum last. An FP8 rung's own bound would be lower than `fast`'s, and a category
# falls below `fast`'s bound where a lever removed kernels that the bound counts.

# %% tags=["hide-input"]
show_table(stretch.remaining(root, G), "an ncu roofline of fast and profiler tables of a lever rung",
           "scripts/fast_measure.sh data/results/<gpu> roofline skipgrad", 2,
           {"bound_ms": "bound (ms)", "fast_ms": "fast (ms)", "best_ms": "best rung (ms)",
            "above_bound_ms": "above the bound (ms)"})

# %% [markdown]
# **Where that leaves the target.** The convolutions are already at cuDNN's best per shape
# ({doc}`07_kernels`), and the norms' largest shapes move their bytes near the bandwidth: their
# remaining lever is fewer passes (statistics in the producers' epilogues, most of which are cuDNN
# convolutions), not faster ones. The levers here take the Inductor kernels around them and the
# forward convolutions' operand width; what would take more is convolution kernels of our own with
# the norm in their prologue, or FP8 in all three passes of the convolutions.
